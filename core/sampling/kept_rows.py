"""Top-k rows on the CPU at a real vocabulary, as the few entries the filter keeps.

With a top-k filter a processed row has at most top_k nonzero entries, and a round needs
little else: a draft step draws its token from them, the record keeps them, sum min(p, q)
runs over them, and the target's rows give the verifier its p and argmax. On the CPU
every torch operation right after a forward costs several times what it costs in a
loop (the forward has streamed the weights through the caches; docs/scale.md), so the
general path's forty-odd operations per 152k-token row were most of a top-k round's
bookkeeping. Here two fast torch reductions read the logits (a sum per row, the finite
check; each 64-logit chunk's maximum, core.sampling.row_ops' chunked top-k), two small topk calls
pick the k + 1 largest logits, and the rest runs in numpy on those, batched over the
rows.

The rules are core.sampling's: temperature, then the k largest logits (a tie at the k-th
hands the rows back to the general path, which keeps every tied token), softmax in
float64, then top-p in descending order with equal probabilities by ascending id. The
draw is sample_from's inverse CDF in token-id order over the nonzero entries; adding the
zeros in between is exact, so its cumulative sums are those of the dense row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from specscope.core.sampling.reference import SamplingConfig
from specscope.core.sampling.row_ops import CHUNK, chunks_take, fast_rows, top_candidates


@dataclass(frozen=True, eq=False)
class KeptRow:
    """A processed distribution over `vocab_size` tokens as its nonzero entries."""

    ids: np.ndarray  # int64, ascending token ids
    probs: np.ndarray  # float64, each > 0, summing to 1 (to rounding)
    vocab_size: int
    argmax: int  # the row's first maximal logit (what row_argmax gives)

    def dense(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The float64 row (written into `out`, a CPU row of vocab_size entries, when given)."""
        if out is None:
            out = torch.zeros(self.vocab_size, dtype=torch.float64)
        else:
            out.zero_()
        out.numpy()[self.ids] = self.probs
        return out


def dense_rows(rows: list[KeptRow]) -> torch.Tensor:
    """(m, V) float64 CPU rows holding the kept entries, zeros elsewhere."""
    out = torch.zeros((len(rows), rows[0].vocab_size), dtype=torch.float64)
    host = out.numpy()
    for r, row in enumerate(rows):
        host[r, row.ids] = row.probs
    return out


def applies(logits: torch.Tensor, config: SamplingConfig) -> bool:
    """Whether kept_rows may take these (V,) or (m, V) logits: float32 CPU rows where the
    chunked reductions pay (core.sampling.row_ops.fast_rows), a top-k filter narrow enough for
    them (as row_topk's), and a temperature that keeps every float32 logit finite in
    float64 (above ~2e-270)."""
    return (
        config.sparse_rows
        and logits.ndim in (1, 2)
        and logits.dtype == torch.float32
        and fast_rows(logits)
        and chunks_take(config.top_k + 1, logits.shape[-1])
        and torch.finfo(torch.float32).max / config.temperature < torch.finfo(torch.float64).max
    )


def kept_rows(logits: torch.Tensor, config: SamplingConfig) -> list[KeptRow] | None:
    """The processed distribution of each row of (m, V) (or (V,)) logits as its kept
    entries (see `applies`); None where the general path must decide instead: non-finite
    logits (it raises) or, in any row, the k-th largest logit tied with the next (it keeps
    every tied token)."""
    rows = logits.reshape(1, -1) if logits.ndim == 1 else logits
    m, vocab = rows.shape
    k = config.top_k
    # A NaN or inf anywhere makes the sum non-finite (so can an overflowing sum of finite
    # logits: the general path then looks closer). Two fast reductions read the logits:
    # torch.aminmax, which would read them once for both, is ten times slower than amax.
    if not math.isfinite(float(rows.sum())):
        return None
    values, at, chunk_ids = top_candidates(rows, k + 1)  # descending, ties in no set order
    top, (chunk, offset) = values.numpy(), np.divmod(at.numpy(), CHUNK)  # the token ids in numpy
    ids = chunk_ids.numpy()[np.arange(m)[:, None], chunk] * CHUNK + offset
    if (top[:, k - 1] == top[:, k]).any() or ids.max() >= vocab:
        return None
    ids, scaled = ids[:, :k], top[:, :k].astype(np.float64)
    if config.temperature != 1:
        scaled /= config.temperature
    probs = np.exp(scaled - scaled[:, :1])  # non-increasing along each row, as the values are
    probs /= probs.sum(axis=1, keepdims=True)
    if (probs[:, 1:] == probs[:, :-1]).any():  # equal probabilities: the rule orders them by ascending id
        order = np.lexsort((ids, -probs), axis=-1)
        ids, probs = np.take_along_axis(ids, order, axis=1), np.take_along_axis(probs, order, axis=1)
    counts = [k] * m
    if config.top_p < 1.0:
        counts = np.minimum((np.cumsum(probs, axis=1) < config.top_p).sum(axis=1) + 1, k).tolist()
    return [_kept(ids[r], probs[r], counts[r], vocab, config.top_p < 1.0) for r in range(m)]


def _kept(ids: np.ndarray, probs: np.ndarray, count: int, vocab: int, renormalise: bool) -> KeptRow:
    """One row's first `count` entries (in descending order), by ascending id."""
    head_ids, head = ids[:count], probs[:count]
    if renormalise:
        head = head / head.sum()
    if not head[-1] > 0:  # entries far below the largest underflow at a low temperature (the last ones)
        positive = head > 0
        head_ids, head = head_ids[positive], head[positive]
    by_id = np.argsort(head_ids)
    return KeptRow(head_ids[by_id], head[by_id], vocab, int(ids[0]))


def kept_row(logits: torch.Tensor, config: SamplingConfig) -> KeptRow | None:
    """kept_rows for one (V,) row."""
    rows = kept_rows(logits, config)
    return None if rows is None else rows[0]


def draw_kept(row: KeptRow, u: float) -> int:
    """`sample_from(dense row, u)`: the first token whose cumulative mass exceeds u * total."""
    cdf = np.cumsum(row.probs)
    index = min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), cdf.shape[0] - 1)
    return int(row.ids[index])
