"""Turns what transformers' assisted-generation loop does in one round into a specscope Round.

The loop (`_assisted_decoding`) is not copied and not changed. The recorder observes it at
the points the loop itself offers:

- `get_candidates(input_ids)` returns the candidate tokens and (draft model) the candidate
  logits the assistant produced, already processed by the loop's logits processors;
- the target model's forward (a forward hook) gives the target cache object and its length
  after the verify forward (the peak);
- `update_candidate_strategy(input_ids, scores, num_matches)` gives the sequence after the
  round, the target's processed logits for every candidate position plus the bonus position,
  and the number of accepted candidates; the target cache is already cropped then;
- the assistant model's forward (pre-hook and hook) gives the draft cache lengths.

transformers crops the assistant's cache lazily, at the start of the next round's
get_candidates. The recorder gives that crop to the round whose suffix it removes: a round is
finished (and handed on) when the next round's drafting has started, or when generate() ends.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from specscope.core.decode.kv import Stopwatch
from specscope.core.decode.stops import StopTracker
from specscope.core.engines.hf_private import cache_length, output_cache
from specscope.core.engines.hf_vectors import RoundVectors, q_rows, read_vectors
from specscope.core.records import CacheState, DraftNode, EmittedToken, NodeStatus, Round, RoundTimings, RunConfig


@dataclass
class _Observed:
    """One round as the loop showed it, before it becomes a Round."""

    index: int
    prefix_len: int
    emitted_before: int
    requested: int | None
    t_start: float
    target_before: int
    draft_before: int | None = None
    candidates: list[int] = field(default_factory=list)
    candidate_logits: torch.Tensor | None = None
    draft_peak: int | None = None
    draft_forwards: int = 0
    t_drafted: float = 0.0
    t_verify_start: float = 0.0
    target_peak: int | None = None
    target_forwards: int = 0


class RoundRecorder:
    """Observes one generate() call, in the thread that runs it, and hands each finished
    Round to `emit` (called in that thread). `draft_model` is None for proposers without a
    model (prompt lookup). `full_vectors`/`top_n`: what a Round keeps of its rows (core.sampling.dists)."""

    def __init__(
        self,
        config: RunConfig,
        target: torch.nn.Module,
        draft_model: torch.nn.Module | None,
        emit: Callable[[Round], None],
        greedy: bool,
        lookup: bool,
        full_vectors: bool = True,
        top_n: int = 20,
        stops: StopTracker | None = None,
    ):
        self.config, self.target, self.draft_model = config, target, draft_model
        self.stops = stops  # the run's stop strings and sequences (core.decode.stops)
        self.stopped = False  # a round's tokens completed a stop: generate() must end after it
        self.emit, self.greedy, self.lookup = emit, greedy, lookup
        self.full_vectors, self.top_n = full_vectors, top_n
        self.stopwatch = Stopwatch(next(target.parameters()).device)
        self.thread: int | None = None
        self.rounds = 0
        self.emitted = 0
        self.context = list(config.prompt_ids)  # prompt + every token emitted so far
        self.target_cache: Any = None
        self.draft_cache: Any = None
        self.current: _Observed | None = None
        self.pending: tuple[_Observed, dict[str, Any]] | None = None  # a round waiting for its draft-cache crop
        self.first_draft_len: int | None = None  # draft cache length at this round's first assistant forward
        self._handles: list[Any] = []

    # ------------------------------------------------------------------ wiring

    def attach(self) -> None:
        """Register the forward hooks (they act only in the calling thread)."""
        self.thread = threading.get_ident()
        self._handles.append(self.target.register_forward_hook(self._target_forward, with_kwargs=True))
        if self.draft_model is not None:
            self._handles.append(self.draft_model.register_forward_pre_hook(self._draft_pre, with_kwargs=True))
            self._handles.append(self.draft_model.register_forward_hook(self._draft_forward, with_kwargs=True))

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def wrap(self, generator: Any) -> Any:
        """Observe the candidate generator's two per-round calls (instance attributes: the
        object, its type and its other attributes stay as transformers made them)."""
        get_candidates, update = generator.get_candidates, generator.update_candidate_strategy

        def observed_get_candidates(input_ids: torch.LongTensor, *args: Any, **kwargs: Any) -> Any:
            self._before_candidates(generator, input_ids)
            out = get_candidates(input_ids, *args, **kwargs)
            self._after_candidates(input_ids, out)
            return out

        def observed_update(input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int) -> Any:
            t_verified = self.stopwatch.now()
            facts = self._read_round(input_ids, scores, num_matches)
            result = update(input_ids, scores, num_matches)
            self._round_done(facts, t_verified)
            return result

        generator.get_candidates = observed_get_candidates
        generator.update_candidate_strategy = observed_update
        return generator

    def stop_criterion(self) -> Any:
        """A stopping criterion that turns true once a round completed a stop. transformers
        cuts a round's tokens at EOS and the length only; the recorder cuts them at the stop
        (`_cut_at_stop`), and this ends the loop after that round."""
        from specscope.core.engines.hf_handover import FlagCriterion

        return FlagCriterion(lambda: self.stopped)

    def _cut_at_stop(self, emitted: list[int]) -> tuple[list[int], Any]:
        """The round's tokens up to the one that completes a stop (checked on every token in
        order, EOS first), and the StopMatch (None: no stop)."""
        if self.stops is None or not self.stops.stops:
            return emitted, None
        for j, token in enumerate(emitted):
            if token in self.config.eos_ids:
                break
            match = self.stops.check(emitted[: j + 1])
            if match is not None:
                self.stopped = True
                return emitted[: j + 1], match
        return emitted, None

    def _mine(self) -> bool:
        return threading.get_ident() == self.thread

    def _target_forward(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        if not self._mine() or self.current is None:
            return
        cache = output_cache(output)
        if cache is not None:  # not `or`: an empty cache object is falsy
            self.target_cache = cache
        self.current.target_peak = cache_length(self.target_cache)
        self.current.target_forwards += 1

    def _draft_pre(self, module: Any, args: Any, kwargs: Any) -> None:
        if not self._mine() or self.current is None:
            return
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if cache is not None:
            self.draft_cache = cache
        if self.first_draft_len is None:
            self.first_draft_len = cache_length(self.draft_cache) or 0

    def _draft_forward(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        if not self._mine() or self.current is None:
            return
        cache = output_cache(output)
        if cache is not None:
            self.draft_cache = cache
        self.current.draft_forwards += 1

    # ------------------------------------------------------------------ one round

    def _before_candidates(self, generator: Any, input_ids: torch.LongTensor) -> None:
        requested = getattr(generator, "num_assistant_tokens", getattr(generator, "num_output_tokens", None))
        self.first_draft_len = None
        self.current = _Observed(
            index=self.rounds,
            prefix_len=int(input_ids.shape[-1]),
            emitted_before=self.emitted,
            requested=None if requested is None else int(requested),
            t_start=self.stopwatch.now(),
            target_before=cache_length(self.target_cache) or 0,
        )

    def _observed(self) -> _Observed:
        """The round whose candidates are being verified (set before its candidates are drawn)."""
        if self.current is None:
            raise RuntimeError("transformers' assistant ran a step outside a round")
        return self.current

    def _after_candidates(self, input_ids: torch.LongTensor, out: Any) -> None:
        obs = self._observed()
        obs.t_drafted = self.stopwatch.now()
        candidate_ids, candidate_logits = out
        obs.candidates = [int(t) for t in candidate_ids[0, obs.prefix_len :].tolist()]
        obs.candidate_logits = candidate_logits
        if self.draft_model is not None:
            now_len = cache_length(self.draft_cache) or 0
            obs.draft_before = self.first_draft_len if self.first_draft_len is not None else now_len
            obs.draft_peak = now_len
        if self.pending is not None:  # the previous round's draft cache was cropped now (or not at all)
            self._finish_pending(obs.draft_before)
        obs.t_verify_start = self.stopwatch.now()

    def _read_round(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int) -> dict[str, Any]:
        """Everything the round keeps, read now (the rows are computed on their device)."""
        obs = self._observed()
        emitted, stop = self._cut_at_stop([int(t) for t in input_ids[0, obs.prefix_len :].tolist()])
        if stop is not None and len(emitted) <= int(num_matches):  # cut inside the accepted block
            n = len(obs.candidates)
            statuses, kinds = (
                ["accepted"] * len(emitted) + ["unvisited"] * (n - len(emitted)),
                ["accepted"] * len(emitted),
            )
        else:
            statuses, kinds = _statuses(obs, emitted, int(num_matches))
        rejected = next((i for i, s in enumerate(statuses) if s == "rejected"), None)
        drawn = emitted[-1] if kinds and kinds[-1] in ("bonus", "repaired") else None
        q = q_rows(
            obs.candidate_logits,
            obs.candidates,
            self.config.vocab_size,
            greedy=self.greedy,
            lookup=self.lookup,
            device=scores.device,
        )
        obs.candidate_logits = None  # not kept past the round
        sampling = self.config.sampling
        vectors = read_vectors(
            scores,
            q,
            obs.candidates,
            rejected,
            drawn,
            full=self.full_vectors,
            top_n=self.top_n,
            sparse=sampling.sparse_rows,
        )  # as the decoder's records
        pieces = self.stops.pieces(emitted) if self.stops is not None else None
        if self.stops is not None:
            self.stops.commit(emitted)
        return dict(
            emitted=emitted,
            statuses=statuses,
            kinds=kinds,
            rejected=rejected,
            vectors=vectors,
            target_after=cache_length(self.target_cache) or 0,
            stop=stop,
            pieces=pieces,
        )

    def _round_done(self, facts: dict[str, Any], t_verified: float) -> None:
        obs = self._observed()
        facts["timings"] = (
            obs.t_drafted - obs.t_start,
            t_verified - obs.t_verify_start,
            self.stopwatch.now() - t_verified,
        )
        self.rounds += 1
        self.emitted += len(facts["emitted"])
        self.context.extend(facts["emitted"])
        facts["context"] = self.context  # read (sliced) when the round is built, before it grows again
        self.current = None
        self.pending = (obs, facts)
        if self.draft_model is None:
            self._finish_pending(None)

    def _finish_pending(self, draft_after: int | None) -> None:
        if self.pending is None:
            return
        obs, facts = self.pending
        self.pending = None
        self.emit(build_round(self.config, obs, facts, draft_after, self.greedy))

    def finish(self) -> None:
        """generate() has returned: the last round keeps the draft cache as it was left."""
        if self.pending is not None:
            self._finish_pending(cache_length(self.draft_cache) if self.draft_model is not None else None)


def _statuses(obs: _Observed, emitted: list[int], matches: int) -> tuple[list[str], list[str]]:
    """Node statuses and emitted kinds. transformers reports `num_matches` after cutting the
    round's tokens at EOS or the length budget; a token it cut there that is the candidate
    itself was accepted (a rejected candidate cannot come back as its own repair: rejection
    needs q(x) > p(x), so the residual has no mass at x)."""
    n = len(obs.candidates)
    statuses = ["accepted"] * min(matches, n) + ["unvisited"] * (n - min(matches, n))
    kinds = ["accepted"] * min(matches, n)
    if matches < n:
        if len(emitted) > matches and emitted[matches] == obs.candidates[matches]:
            statuses[matches] = "accepted"
            kinds.append("accepted")
        else:
            statuses[matches] = "rejected"
            kinds.append("repaired")
    elif len(emitted) > n:
        kinds.append("bonus")
    return statuses, kinds[: len(emitted)]


def build_round(
    config: RunConfig, obs: _Observed, facts: dict[str, Any], draft_after: int | None, greedy: bool
) -> Round:
    emitted, statuses, kinds, rejected = facts["emitted"], facts["statuses"], facts["kinds"], facts["rejected"]
    vec: RoundVectors = facts["vectors"]
    context, end = facts["context"], obs.prefix_len + len(emitted)  # not copied: a run's context grows long
    nodes = tuple(_node(i, token, vec, statuses[i]) for i, token in enumerate(obs.candidates))
    out = tuple(
        EmittedToken(t, kind, None if kind == "bonus" else i) for i, (t, kind) in enumerate(zip(emitted, kinds))
    )
    eos = any(t in config.eos_ids for t in emitted)
    stop = facts.get("stop")
    remaining = config.max_new_tokens - obs.emitted_before
    all_accepted = all(s == "accepted" for s in statuses)
    n = len(obs.candidates)
    draft_cache = None
    if obs.draft_before is not None:
        peak = obs.draft_peak if obs.draft_peak is not None else obs.draft_before  # set together
        after = peak if draft_after is None else draft_after
        draft_cache = _cache(obs.draft_before, peak, after, context, end)
    draft_s, verify_s, book_s = facts["timings"]
    return Round(
        run_id=config.run_id,
        index=obs.index,
        prefix_len=obs.prefix_len,
        emitted_before=obs.emitted_before,
        remaining_budget=remaining,
        k=max(n, min(obs.requested if obs.requested is not None else n, remaining)),
        greedy=greedy,
        nodes=nodes,
        bonus_p=vec.p_rows[n] if all_accepted and len(vec.p_rows) > n else None,
        rejected_node=rejected,
        residual=vec.residual,
        residual_mass=vec.residual_mass,
        emitted=out,
        eos=eos,
        budget_stop=obs.emitted_before + len(emitted) >= config.max_new_tokens,
        bonus_withheld=all_accepted and "bonus" not in kinds and not eos and stop is None and len(emitted) >= remaining,
        target_cache=_cache(
            obs.target_before,
            obs.target_peak if obs.target_peak is not None else obs.target_before,
            facts["target_after"],
            context,
            end,
        ),
        draft_cache=draft_cache,
        timings=RoundTimings(draft_s=draft_s, verify_s=verify_s, bookkeeping_s=book_s),
        draft_forwards=obs.draft_forwards,
        target_forwards=obs.target_forwards,
        stop=stop,
        pieces=facts.get("pieces"),
    )


def _cache(before: int, peak: int, after: int, context: list[int], end: int) -> CacheState:
    """Cache lengths; pending = the committed tokens (context up to `end`) past `after`."""
    return CacheState(before=before, peak=peak, after=after, pending=tuple(context[after:end]))


def _node(i: int, token: int, vec: RoundVectors, status: str) -> DraftNode:
    p_token, q_token, overlap = (float(x) for x in vec.scalars[i])
    has_q = vec.q_rows is not None
    return DraftNode(
        index=i,
        token=token,
        parent=i - 1,
        depth=i + 1,
        p=vec.p_rows[i],
        q=vec.q_rows[i] if vec.q_rows is not None else None,
        status=cast(NodeStatus, status),
        u=None,
        p_token=p_token,
        q_token=q_token if has_q else None,
        ratio=(p_token / q_token) if has_q and q_token else None,
        overlap=overlap if has_q else None,
        target_argmax=vec.argmax[i],
    )
