"""A zoo of deliberate, documented speculative-decoding bugs.

Each fault is a real bug class seen in implementations, injected by wrapping one of the
decoder's public seams: the verifier (core.verify), the layout (core.decode.layout), the
target's cache policy (core.decode.kv), or the draft model's cache policy / sampling step
(core.draft.proposers). Chain, tree and coupled faults alike are one list, FAULTS; `needs`
says which runs a fault can be injected into. `faulty_decoder(name,
...)` builds a decoder with exactly that bug, so people can see what it looks like in a
trace and the checker can be tested against it. The decoder notes the rounds in which the
bug actually changed something (`fault_rounds`): a fault that never fires in a run leaves
a correct trace, and nothing can (or should) flag it.

Adding a fault: write its `inject` function below and add one Fault entry to FAULTS.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specscope.core.decode.decoder import SpeculativeDecoder
from specscope.core.decode.kv import CachedLM, CachePolicy
from specscope.core.decode.layout import Layout, layout_for
from specscope.core.decode.run import RunHandle
from specscope.core.draft.proposers import DraftModelProposer, Proposer, SampleStep
from specscope.core.faults import layouts
from specscope.core.faults.firing import (
    FireScan,
    Suggestion,
    budget_and_stop_to_fire,
    budget_to_fire,
    eos_to_fire,
    filters_to_fire,
    sampling_to_fire,
    stop_ids_to_fire,
    stop_string_to_fire,
)
from specscope.core.records import GenerationResult, Round, RunConfig
from specscope.core.sampling.device import draft_distribution
from specscope.core.sampling.reference import SamplingConfig
from specscope.core.verify.chain import Verdict, Verifier, VerifyTask, residual_distribution, stale_residual
from specscope.core.verify.coupling import CoupledVerifier, Coupling
from specscope.core.verify.tree import TreeVerifier

Fire = Callable[[], None]


@dataclass(frozen=True)
class Seams:
    """The replaceable parts of a decoder: what a fault may wrap."""

    verifier: Verifier
    layout: Layout
    target_cache: CachePolicy
    proposer: Proposer


@dataclass(frozen=True)
class Fault:
    name: str
    summary: str
    applies: str  # when it can fire
    inject: Callable[[Seams, Fire], Seams]  # returns the seams with the bug; calls fire() when it changes something
    # False: firing in the last round of a finished run changes nothing (no round reads the
    # state it spoiled), so such a fire is not counted
    final_round_matters: bool = True
    # "tree": a tree proposer; "coupled": a coupled run; "stops": a run with stops; "head": a draft
    # head; "": any run
    needs: str = ""
    # a setting that makes a run like the one scanned meet `applies` (core.faults.firing)
    to_fire: Callable[[FireScan], Suggestion | None] | None = None
    # a fault no checker rule can see from the record (its rounds are correct rounds: wasted
    # work, not wrong output): where it shows instead; "" = the checker flags it when it fires
    shows_in: str = ""


# ---------------------------------------------------------------------------- verifier faults


@dataclass(frozen=True)
class _EosBlindVerifier:
    """Verifies as if there were no EOS, then marks the round as ending in EOS."""

    inner: Verifier
    fire: Fire

    def verify(self, task: VerifyTask, rng: np.random.Generator) -> Verdict:
        verdict = self.inner.verify(dataclasses.replace(task, eos_token_id=None, more_eos=frozenset()), rng)
        tokens = [e.token for e in verdict.emitted]
        at = next((i for i, t in enumerate(tokens) if task.is_eos(t)), None)
        if at is not None:
            verdict.eos = True  # the run still stops after this round...
            verdict.stop = None
            verdict.bonus_withheld = False  # (EOS ended it: nothing was withheld)
            if at < len(tokens) - 1:
                self.fire()  # ...but the tokens after EOS were kept
        return verdict


@dataclass(frozen=True)
class _OneMoreTokenVerifier:
    """Believes the budget allows one more token than it does."""

    inner: Verifier
    fire: Fire

    def verify(self, task: VerifyTask, rng: np.random.Generator) -> Verdict:
        verdict = self.inner.verify(dataclasses.replace(task, remaining=task.remaining + 1), rng)
        if len(verdict.emitted) > task.remaining:
            self.fire()
        return verdict


def _first_stop(task: VerifyTask, tokens: list[int]) -> int | None:
    """Where the run's stop rule (core.decode.stops) ends these round tokens: the index of
    the first token that is an EOS or completes a stop, None when none does."""
    for j, token in enumerate(tokens):
        if task.is_eos(token) or (task.stops is not None and task.stops.check(tokens[: j + 1]) is not None):
            return j
    return None


@dataclass(frozen=True)
class _LastTokenStopVerifier:
    """Checks the stops only on the round's last emitted token (transformers #47912's bug
    class): a stop completed inside the accepted block goes by, and the tokens after it stay."""

    inner: Verifier
    fire: Fire

    def verify(self, task: VerifyTask, rng: np.random.Generator) -> Verdict:
        verdict = self.inner.verify(dataclasses.replace(task, stops=None), rng)
        tokens = [e.token for e in verdict.emitted]
        if task.stops is None or not tokens or verdict.eos:
            return verdict
        verdict.stop = task.stops.check(tokens)
        if verdict.stop is not None:
            verdict.bonus_withheld = False
        honest = _first_stop(task, tokens)
        if honest is not None and honest < len(tokens) - 1:
            self.fire()
        return verdict


@dataclass(frozen=True)
class _BudgetFirstVerifier:
    """Checks the budget before the stops (SGLang #31599): in the round that reaches
    max_new_tokens the stop check is skipped, so the tokens after a stop stay and the run
    ends as if by the budget."""

    inner: Verifier
    fire: Fire

    def verify(self, task: VerifyTask, rng: np.random.Generator) -> Verdict:
        state = rng.bit_generator.state
        blind = self.inner.verify(dataclasses.replace(task, stops=None), rng)
        if task.stops is None or len(blind.emitted) < task.remaining:
            rng.bit_generator.state = state  # the same draws again, the stops on
            return self.inner.verify(task, rng)
        honest = _first_stop(task, [e.token for e in blind.emitted])
        if honest is not None and honest < len(blind.emitted) - 1:
            self.fire()
        return blind


class _PerTokenStops:
    """A stop tracker that looks for each stop string inside the newest token's own text,
    not in the output's text: a string spread over two tokens is never found."""

    def __init__(self, inner: Any, fire: Fire):
        self.inner, self.fire = inner, fire
        self.stops = inner.stops

    def check(self, round_tokens: list[int]) -> Any:
        from specscope.core.decode.stops import StopMatch, Stops

        honest = self.inner.check(round_tokens)
        piece = self.inner.piece(round_tokens[-1]) if self.stops.strings else ""
        found = next((i for i, s in enumerate(self.stops.strings) if s in piece), None)
        mine: StopMatch | None
        if found is not None:
            mine = StopMatch("text", found, len(round_tokens) - 1)
        else:
            ids = Stops((), self.stops.sequences)
            hit = ids.match(self.inner.tokens + list(round_tokens), None, "")
            mine = None if hit is None else StopMatch(hit[0], hit[1], len(round_tokens) - 1)
        if mine != honest:
            self.fire()
        return mine


@dataclass(frozen=True)
class _PerTokenStopVerifier:
    inner: Verifier
    fire: Fire

    def verify(self, task: VerifyTask, rng: np.random.Generator) -> Verdict:
        if task.stops is None:
            return self.inner.verify(task, rng)
        return self.inner.verify(dataclasses.replace(task, stops=_PerTokenStops(task.stops, self.fire)), rng)


def _stop_fault(kind: type) -> Callable[[Seams, Fire], Seams]:
    return lambda seams, fire: dataclasses.replace(seams, verifier=kind(seams.verifier, fire))


def _eos_leak(seams: Seams, fire: Fire) -> Seams:
    return dataclasses.replace(seams, verifier=_EosBlindVerifier(seams.verifier, fire))


def _budget_overshoot(seams: Seams, fire: Fire) -> Seams:
    return dataclasses.replace(seams, verifier=_OneMoreTokenVerifier(seams.verifier, fire))


def _stale_residual(seams: Seams, fire: Fire) -> Seams:
    """The residual is not taken after a rejection (core.verify.chain.stale_residual): a
    chain's repair, and a tree's next sibling and repair, see p itself."""
    if not isinstance(seams.verifier, TreeVerifier) or isinstance(seams.verifier, CoupledVerifier):
        raise ValueError("the stale-residual faults replace the residual rule of a TreeVerifier")

    def stale(p: Any, q: Any) -> tuple[Any, Any]:
        right, _ = residual_distribution(p, q)
        if float(abs(right - p).max()) > 1e-9:  # disjoint p and q: the residual is p, nothing goes wrong
            fire()
        return stale_residual(p, q)

    return dataclasses.replace(seams, verifier=dataclasses.replace(seams.verifier, residual=stale))


def _layout_fault(wrong: Callable[[Any, Fire], Layout]) -> Callable[[Seams, Fire], Seams]:
    return lambda seams, fire: dataclasses.replace(seams, layout=wrong(seams.layout, fire))


# ---------------------------------------------------------------------------- cache faults


class _TrustsItsCache(CachePolicy):
    """A cache that is not cropped right, and a decoder that trusts whatever it holds: when
    the cache already covers the context, only the newest token is fed again, on top of the
    stale entries (every later position is shifted)."""

    def __init__(self, inner: CachePolicy, fire: Fire, keep_extra: int | None):
        self.inner, self.fire = inner, fire
        self.keep_extra = keep_extra  # crop to committed + keep_extra; None = never crop

    def pending(self, lm: CachedLM, context: Sequence[int]) -> list[int]:
        if lm.use_cache and lm.processed >= len(context):
            return [context[-1]]
        return self.inner.pending(lm, context)

    def crop(self, lm: CachedLM, committed: int) -> None:
        if lm.processed > committed:
            self.fire()
        if self.keep_extra is not None:
            self.inner.crop(lm, committed + self.keep_extra)


def _target_crop_off_by_one(seams: Seams, fire: Fire) -> Seams:
    return dataclasses.replace(seams, target_cache=_TrustsItsCache(seams.target_cache, fire, keep_extra=1))


def _draft_model(seams: Seams, fault: str) -> DraftModelProposer:
    if not isinstance(seams.proposer, DraftModelProposer):
        raise ValueError(f"fault {fault!r} needs a draft-model proposer")
    return seams.proposer


def _with_draft(seams: Seams, base: DraftModelProposer, **changes: Any) -> Seams:
    """A new draft proposer on the same model with one seam replaced (the caller's is untouched)."""
    parts = {"cache": base.cache, "sample_step": base.sample_step, **changes}
    proposer = DraftModelProposer(base.model, label=base.label, tree=base.tree, children=base.children, **parts)
    proposer.spec = base.spec
    return dataclasses.replace(seams, proposer=proposer)


def _stale_draft_cache(seams: Seams, fire: Fire) -> Seams:
    base = _draft_model(seams, "stale-draft-cache")
    return _with_draft(seams, base, cache=_TrustsItsCache(base.cache, fire, keep_extra=None))


def _raw_q(seams: Seams, fire: Fire) -> Seams:
    base = _draft_model(seams, "raw-q")
    step: SampleStep = base.sample_step

    def samples_filtered_records_raw(
        logits: torch.Tensor, sampling: SamplingConfig, rng: np.random.Generator, out: torch.Tensor | None = None
    ) -> tuple[Any, ...]:
        token, q, u, *_ = step(logits, sampling, rng, out)  # the record gets the raw q, not the kept entries
        if q is None:
            return token, q, u
        raw = draft_distribution(logits, SamplingConfig(temperature=sampling.temperature))
        if not torch.equal(raw, q):
            fire()
        return token, raw, u

    return _with_draft(seams, base, sample_step=samples_filtered_records_raw)


@dataclass(frozen=True)
class _DraftPickVerifier:
    """A coupled verifier that emits the draft's own Gumbel pick at a mismatch, not the target's y_j."""

    inner: CoupledVerifier
    fire: Fire

    def verify(self, task: VerifyTask, rng: np.random.Generator) -> Verdict:
        honest = self.inner.verify(task, rng)  # the coupled verifier reads no stream: both see the same task
        faulty = dataclasses.replace(self.inner, emit="draft").verify(task, rng)
        if [e.token for e in faulty.emitted] != [e.token for e in honest.emitted]:
            self.fire()
        return faulty


def _coupled_draft_pick(seams: Seams, fire: Fire) -> Seams:
    if not isinstance(seams.verifier, CoupledVerifier):
        raise ValueError("fault 'coupled-draft-pick' needs a coupled run (coupling_seed / --coupled SEED)")
    return dataclasses.replace(seams, verifier=_DraftPickVerifier(seams.verifier, fire))


class _ShiftedFeatures:
    """A draft head fed the target's feature of the position before the one it belongs to
    (f_{j-1} where f_j belongs: an off-by-one in slicing the verify forward's hidden states).
    Everything else is the head's own (attribute reads go to it). The prefill's position 0
    has no predecessor and gets its own feature."""

    def __init__(self, inner: Proposer, fire: Fire):
        self._inner, self._fire = inner, fire
        self._previous: torch.Tensor | None = None  # the last position's feature handed over

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def reset(self) -> None:
        self._previous = None
        self._inner.reset()

    def take_features(self, first_position: int, features: torch.Tensor) -> None:
        if features.shape[0]:
            before = self._previous if self._previous is not None and first_position > 0 else features[:1]
            self._previous = features[-1:]
            features = torch.cat([before, features[:-1]])
            self._fire()
        self._inner.take_features(first_position, features)


def _head_feature_shift(seams: Seams, fire: Fire) -> Seams:
    from specscope.core.draft.heads.base import HeadDrafting  # torch + the heads' layers: only when asked for

    if not isinstance(seams.proposer, HeadDrafting):
        raise ValueError("fault 'head-feature-shift' needs a draft-head proposer (eagle, eagle3, mtp or medusa)")
    return dataclasses.replace(seams, proposer=_ShiftedFeatures(seams.proposer, fire))


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in [
        Fault(
            "eos-leak",
            "tokens after an accepted EOS are kept (the round goes on past EOS)",
            "an EOS id is set and a draft EOS is accepted",
            _eos_leak,
            to_fire=eos_to_fire,
        ),
        Fault(
            "budget-overshoot",
            "the bonus token is emitted even when it exceeds max_new_tokens",
            "a last round whose drafts are all accepted",
            _budget_overshoot,
            to_fire=budget_to_fire,
        ),
        Fault(
            "resample-p",
            "the repair token is sampled from p instead of the residual max(p - q, 0)",
            "sampling (temperature > 0), at a rejection",
            _stale_residual,
            to_fire=sampling_to_fire,
        ),
        Fault(
            "raw-q",
            "the draft samples from filtered q but records and verifies with q before top-k/top-p",
            "draft model, sampling with top-k or top-p",
            _raw_q,
            to_fire=filters_to_fire,
        ),
        Fault(
            "stale-draft-cache",
            "the draft cache is not cropped after a rejection",
            "draft model, a rejection before the last round",
            _stale_draft_cache,
            final_round_matters=False,
        ),
        Fault(
            "target-crop-off-by-one",
            "the target cache keeps one entry too many after a crop",
            "a rejection",
            _target_crop_off_by_one,
        ),
        # the stale residual again, in the tree walk: a sibling is judged against p, not p'
        Fault(
            "tree-stale-residual",
            "a sibling's residual is not updated after a rejection (p' stays p)",
            "a tree draft, sampling, a rejected child",
            _stale_residual,
            needs="tree",
            to_fire=sampling_to_fire,
        ),
        Fault(
            "tree-sibling-mask",
            "the tree mask lets a node see its elder siblings",
            "a tree draft with two children at one node",
            _layout_fault(layouts.sibling_mask),
            needs="tree",
        ),
        Fault(
            "tree-wrong-branch-kv",
            "the target cache keeps the first branch's rows instead of the accepted path's",
            "a tree draft whose accepted path leaves the first child",
            _layout_fault(layouts.wrong_branch_kv),
            needs="tree",
        ),
        Fault(
            "tree-positions-by-index",
            "tree nodes get position prefix + node index instead of prefix + depth - 1",
            "a tree draft with two nodes at one depth",
            _layout_fault(layouts.positions_by_index),
            needs="tree",
        ),
        Fault(
            "coupled-draft-pick",
            "a coupled round emits the draft's Gumbel pick at a mismatch instead of the "
            "target's y_j (the output follows q, not p)",
            "a coupled sampled run, at a rejection",
            _coupled_draft_pick,
            needs="coupled",
            to_fire=sampling_to_fire,
        ),
        # stops (core.decode.stops): needs "stops" = a run with stop strings or token sequences
        Fault(
            "stop-last-token",
            "the stop is checked only on a round's last token: a stop completed inside the "
            "accepted block is missed and the tokens after it kept",
            "a stop completed before a round's last token",
            _stop_fault(_LastTokenStopVerifier),
            needs="stops",
            to_fire=stop_ids_to_fire,
        ),
        Fault(
            "budget-before-stop",
            "the budget is checked before the stop: in the round that reaches "
            "max_new_tokens the tokens after a stop are kept and the run ends as if by the budget",
            "a stop completed inside the round that reaches the budget",
            _stop_fault(_BudgetFirstVerifier),
            needs="stops",
            to_fire=budget_and_stop_to_fire,
        ),
        Fault(
            "stop-per-token",
            "a stop string is looked for in each token's own text, not in the output's text: "
            "a string spread over two tokens is missed",
            "a stop string completed across tokens",
            _stop_fault(_PerTokenStopVerifier),
            needs="stops",
            to_fire=stop_string_to_fire,
        ),
        # heads (core.draft.heads): needs "head" = a draft-head proposer. The verifier is
        # untouched, so the output stays exact: only acceptance falls. No checker rule can see
        # it from the record (every round is a correct round of a poor draft); the inspector's
        # calibration view shows it, acceptance by depth far below the head's training accuracy.
        Fault(
            "head-feature-shift",
            "the head reads the target's feature of the position before the one it belongs "
            "to (off by one): the output stays exact but acceptance collapses. Wasted work, not wrong output: "
            "no checker rule can see it from the record; the calibration view shows acceptance by depth far "
            "below the head's training accuracy",
            "a draft-head proposer (eagle, eagle3, mtp, medusa), every round",
            _head_feature_shift,
            final_round_matters=False,
            needs="head",
            shows_in="the Calibration tab: acceptance by depth far below the head's training accuracy",
        ),
    ]
}


def fault_named(name: str) -> Fault:
    fault = FAULTS.get(name)
    if fault is None:
        known = ", ".join(FAULTS)
        raise ValueError(f"unknown fault {name!r}; known faults: {known}")
    return fault


@dataclass(frozen=True)
class FireReport:
    """Where a fault run's fault fired; when it never did, what would make it fire."""

    fault: str
    fired_rounds: tuple[int, ...]
    applies: str  # the fault's condition, in words
    suggestion: Suggestion | None  # only when it never fired

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.fault,
            "fired": bool(self.fired_rounds),
            "fired_rounds": list(self.fired_rounds),
            "fires_when": self.applies,
            "to_fire": None
            if self.suggestion is None
            else {"settings": self.suggestion.settings, "why": self.suggestion.why},
        }


def fire_report(fault: str, fired_rounds: Sequence[int], scan: FireScan) -> FireReport:
    spec = fault_named(fault)
    suggestion = None if fired_rounds or spec.to_fire is None else spec.to_fire(scan)
    return FireReport(fault, tuple(fired_rounds), spec.applies, suggestion)


class FaultyDecoder(SpeculativeDecoder):
    """A SpeculativeDecoder built on faulty seams; it records its fault in the RunConfig and
    the rounds in which the fault fired in `fault_rounds`."""

    def __init__(self, fault: str, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fault = fault
        self.fault_rounds: list[int] = []
        self.fired = False  # set by the faulty seams during a round

    def fire(self) -> None:
        self.fired = True

    def run_config(self, *args: Any, **kwargs: Any) -> RunConfig:
        return dataclasses.replace(super().run_config(*args, **kwargs), fault=self.fault)

    def rounds(self, *args: Any, **kwargs: Any) -> Generator[Round, None, GenerationResult]:
        self.fault_rounds = []
        self.fired = False
        run = RunHandle(super().rounds(*args, **kwargs))
        try:
            for rnd in run:
                if self.fired:
                    self.fault_rounds.append(rnd.index)
                    self.fired = False
                yield rnd
        finally:
            run.close()
        assert run.result is not None
        finished = run.result.stop_reason in ("eos", "stop", "budget") and run.result.summary.rounds
        if finished and not fault_named(self.fault).final_round_matters and self.fault_rounds[-1:] == [rnd.index]:
            self.fault_rounds.pop()
        return run.result


def faulty_decoder(name: str, target: torch.nn.Module, proposer: Proposer, **kwargs: Any) -> FaultyDecoder:
    """A SpeculativeDecoder with the named bug (see FAULTS); kwargs as SpeculativeDecoder."""
    fault = fault_named(name)
    fired: list[Fire] = []
    layout = kwargs.pop("layout", None) or layout_for(proposer)
    seed = kwargs.get("coupling_seed")
    seams = Seams(
        verifier=kwargs.pop("verifier", None) or layout.verifier(None if seed is None else Coupling(seed)),
        layout=layout,
        target_cache=kwargs.pop("target_cache", None) or CachePolicy(),
        proposer=proposer,
    )
    seams = fault.inject(seams, lambda: fired[0]())
    decoder = FaultyDecoder(
        name,
        target,
        seams.proposer,
        verifier=seams.verifier,
        target_cache=seams.target_cache,
        layout=seams.layout,
        **kwargs,
    )
    fired.append(decoder.fire)
    return decoder
