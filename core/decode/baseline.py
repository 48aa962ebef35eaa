"""Plain autoregressive decoding with a KV cache: the baseline speculative decoding is
measured against. Same sampler, same EOS, stop and budget semantics (core.decode.stops),
same random stream layout (one uniform per token), so greedy outputs must match the
speculative decoder's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch

from specscope.core.decode.allocator import tune_allocator
from specscope.core.decode.decoder import normalize_prompt
from specscope.core.decode.kv import CachedLM, Stopwatch
from specscope.core.decode.stops import Stops, StopTracker
from specscope.core.sampling.reference import SamplingConfig, check_finite, process_logits, sample_from
from specscope.core.sampling.row_ops import row_argmax


@dataclass(frozen=True)
class PlainResult:
    new_tokens: list[int]
    wall_s: float
    forward_s: float  # time inside target forwards (synchronised on CUDA)
    forwards: int
    stop_reason: str

    @property
    def per_token_s(self) -> float:
        return self.forward_s / max(self.forwards, 1)


def plain_generate(
    target: torch.nn.Module,
    prompt_ids: Sequence[int] | torch.Tensor,
    max_new_tokens: int,
    sampling: SamplingConfig | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    seed: int = 0,
    on_logits: Callable[[int, torch.Tensor], None] | None = None,
    stops: Stops | None = None,
    token_piece: Callable[[int], str] | None = None,
) -> PlainResult:
    """`eos_token_id`: one EOS id or several; `stops` end the output as they end a
    speculative run's (stop strings need `token_piece`: core.decode.stops.token_piece_function).
    `on_logits(position, row)`, when given, sees each output position's (V,) float32 logits
    row from its one-token forward (core.check.diverge compares it with a verify forward's)."""
    sampling = sampling or SamplingConfig()
    eos_ids = _eos_set(eos_token_id)
    tracker = StopTracker(stops, token_piece) if stops else None
    lm = CachedLM(target)
    context = normalize_prompt(prompt_ids, lm.vocab_size)
    tune_allocator()  # as the speculative decoder does: the same malloc for both
    rng = np.random.default_rng(seed)
    clock = Stopwatch(lm.device)
    new: list[int] = []
    forward_s = 0.0
    stop = "budget"
    start = clock.now()
    while len(new) < max_new_tokens:
        t0 = clock.now()
        logits = lm.forward(context, keep=1)[0]
        if on_logits is not None:
            on_logits(len(new), logits)
        if sampling.greedy:
            if not bool(torch.isfinite(logits).all()):
                raise ValueError("the target model produced non-finite logits")
            token = int(row_argmax(logits))
            forward_s += clock.now() - t0
        else:
            row = logits.cpu().numpy()
            forward_s += clock.now() - t0
            check_finite(row, "the target model")
            token = sample_from(process_logits(row, sampling), float(rng.random()))
        new.append(token)
        context.append(token)
        if token in eos_ids:
            stop = "eos"
            break
        if tracker is not None:
            if tracker.check([token]) is not None:
                stop = "stop"
                break
            tracker.commit([token])
    return PlainResult(new, clock.now() - start, forward_s, lm.forwards, stop)


def _eos_set(eos: int | Sequence[int] | None) -> frozenset[int]:
    if eos is None:
        return frozenset()
    if isinstance(eos, (list, tuple, set, frozenset)):
        return frozenset(int(t) for t in eos)
    return frozenset({int(cast(int, eos))})  # one id (an int, or a numpy integer)
