"""A zoo of deliberate, documented speculative-decoding bugs.

Each fault is a real bug class seen in implementations. `faulty_decoder(name, ...)` builds
a SpeculativeDecoder that has exactly that bug, so people can see what it looks like in a
trace and the checker can be tested against it. The decoder notes the rounds in which the
bug actually changed something (`fault_rounds`): a fault that never fires in a run leaves
a correct trace, and nothing can (or should) flag it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from .decoder import SpeculativeDecoder, _Verdict
from .proposers import DraftModelProposer, Proposer
from .sampling import SamplingConfig, check_finite, process_logits


@dataclass(frozen=True)
class Fault:
    name: str
    summary: str
    applies: str  # when it can fire


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in [
        Fault("eos-leak", "tokens after an accepted EOS are kept (the round goes on past EOS)", "an EOS id is set and a draft EOS is accepted"),
        Fault("budget-overshoot", "the bonus token is emitted even when it exceeds max_new_tokens", "a last round whose drafts are all accepted"),
        Fault("resample-p", "the repair token is sampled from p instead of the residual max(p - q, 0)", "sampling (temperature > 0), at a rejection"),
        Fault("raw-q", "the draft samples from filtered q but records and verifies with q before top-k/top-p", "draft model, sampling with top-k or top-p"),
        Fault("stale-draft-cache", "the draft cache is not cropped after a rejection", "draft model, a rejection"),
        Fault("target-crop-off-by-one", "the target cache keeps one entry too many after a crop", "a rejection"),
    ]
}


class _FaultMixin:
    fault_rounds: list[int]

    def rounds(self, *args: Any, **kwargs: Any):
        self.fault_rounds = []
        return (yield from super().rounds(*args, **kwargs))

    def _fired(self) -> None:
        if not self.fault_rounds or self.fault_rounds[-1] != self.round_index:
            self.fault_rounds.append(self.round_index)


class EosLeakDecoder(_FaultMixin, SpeculativeDecoder):
    def _decide(self, draft, p_rows, argmax, remaining, rng) -> _Verdict:
        eos, self.eos_token_id = self.eos_token_id, None
        try:
            verdict = super()._decide(draft, p_rows, argmax, remaining, rng)
        finally:
            self.eos_token_id = eos
        tokens = [e.token for e in verdict.emitted]
        if eos is not None and eos in tokens:
            verdict.eos = True  # the run still stops after this round...
            if tokens.index(eos) < len(tokens) - 1:
                self._fired()  # ...but the tokens after EOS were kept
        return verdict


class BudgetOvershootDecoder(_FaultMixin, SpeculativeDecoder):
    def _decide(self, draft, p_rows, argmax, remaining, rng) -> _Verdict:
        verdict = super()._decide(draft, p_rows, argmax, remaining + 1, rng)
        if len(verdict.emitted) > remaining:
            self._fired()
        return verdict


class ResamplePDecoder(_FaultMixin, SpeculativeDecoder):
    def _residual(self, p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, float]:
        self._fired()
        return p, 1.0


class TargetCropOffByOneDecoder(_FaultMixin, SpeculativeDecoder):
    def _crop_target(self, committed: int) -> None:
        if self.target_lm.processed > committed:
            self._fired()
        self.target_lm.crop(committed + 1)

    def _verify_forward(self, context, draft):
        if self.target_lm.processed < len(context):
            return super()._verify_forward(context, draft)
        # Believes the newest token is still pending and feeds it again, on top of the
        # stale entry: every later position is shifted by one.
        fed = [context[-1], *draft.tokens]
        logits = self.target_lm.feed(fed, keep=len(fed)).cpu().numpy()
        check_finite(logits, "the target model")
        return logits


class RawQDraftProposer(DraftModelProposer):
    """Samples from the filtered q, but hands the unfiltered q to the verifier."""

    on_fire: Callable[[], None] = staticmethod(lambda: None)

    def _sample_step(self, logits: torch.Tensor, sampling: SamplingConfig, rng: np.random.Generator):
        token, q, u = super()._sample_step(logits, sampling, rng)
        if q is None:
            return token, q, u
        raw = process_logits(logits.cpu().numpy(), SamplingConfig(temperature=sampling.temperature))
        if not np.array_equal(raw, q):
            self.on_fire()
        return token, raw, u


class StaleDraftCacheProposer(DraftModelProposer):
    """Forgets to crop its cache after a rejection."""

    on_fire: Callable[[], None] = staticmethod(lambda: None)

    def observe(self, committed_len: int) -> int | None:
        if self.lm.processed > committed_len:
            self.on_fire()
        return self.lm.processed

    def _pending(self, context):
        # Trusts its cache: whatever it holds counts as context, so only the newest
        # committed token is fed, on top of the stale entries.
        if self.lm.processed >= len(context):
            return [context[-1]]
        return super()._pending(context)


class _ProposerFaultDecoder(_FaultMixin, SpeculativeDecoder):
    pass


_DECODERS = {
    "eos-leak": EosLeakDecoder,
    "budget-overshoot": BudgetOvershootDecoder,
    "resample-p": ResamplePDecoder,
    "target-crop-off-by-one": TargetCropOffByOneDecoder,
}
_PROPOSERS = {"raw-q": RawQDraftProposer, "stale-draft-cache": StaleDraftCacheProposer}


def faulty_decoder(name: str, target: torch.nn.Module, proposer: Proposer, **kwargs: Any) -> SpeculativeDecoder:
    """A SpeculativeDecoder with the named bug (see FAULTS); kwargs as SpeculativeDecoder."""
    if name not in FAULTS:
        raise ValueError(f"unknown fault {name!r}; known faults: {', '.join(FAULTS)}")
    if name in _PROPOSERS:
        if not isinstance(proposer, DraftModelProposer):
            raise ValueError(f"fault {name!r} needs a draft-model proposer")
        faulty = _PROPOSERS[name](proposer.model, label=proposer.label)
        decoder = _ProposerFaultDecoder(target, faulty, **kwargs)
        faulty.on_fire = decoder._fired
    else:
        decoder = _DECODERS[name](target, proposer, **kwargs)
    decoder.fault = name
    decoder.fault_rounds = []
    return decoder
