"""What a round record keeps of a full-vocabulary distribution computed on the device.

At 128k-256k tokens a float64 row is 1-2 MB; a round has 2k + 2 of them. The decoder
keeps them on the model's device while it decides, and the record carries either the
whole rows (`vectors="full"`) or a `TopDistribution`: the N most probable entries, the
entries of the tokens that were drawn or proposed, and the whole vector's exact facts
(support, smallest entry, sum), all computed on the device in one batched pass and moved
to the host in one transfer. That is what the store keeps of a vector anyway (top-N with
the facts), and what every checker rule reads.

A TopDistribution duck-types the arrays the store reads back from a top-N save (see
core.sampling.partial): `partial`, `known_ids`, `stats`, `top`, `missing_mass`; `d[token]` is the
exact value of a known entry and 0.0 otherwise; `np.asarray(d)` builds the dense vector
(known entries, zeros elsewhere) on demand, for a view that plots one round.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from specscope.core.sampling.partial import VectorStats

if TYPE_CHECKING:
    import torch

DEFAULT_TOP_N = 20
TOP_K_COVER_MAX = 256  # runs with a top-k filter below this keep at least top-k + 1 entries
# "auto" keeps full vectors in the record up to this vocabulary (the bundled models' 4096:
# 330 KB a round at k=4); above it a record keeps top-N and the facts.
FULL_VECTORS_MAX_VOCAB = 4096
from specscope.core.settings.vocab import VECTOR_POLICIES as VECTOR_MODES  # noqa: E402 (the words, defined once)


def covering_top_n(top_n: int, top_k: int) -> int:
    """The N to keep for a run with a top-k filter: at least top-k + 1 (for top-k below
    TOP_K_COVER_MAX), so that a top-N record still shows whether q and p were filtered (the
    checker's sampler rule needs the entry ranked top-k + 1)."""
    return max(top_n, top_k + 1) if 0 < top_k < TOP_K_COVER_MAX else top_n


def keeps_full_vectors(mode: str, vocab_size: int) -> bool:
    if mode not in VECTOR_MODES:
        raise ValueError(f"vectors must be one of {', '.join(VECTOR_MODES)}, got {mode!r}")
    return mode == "full" or (mode == "auto" and vocab_size <= FULL_VECTORS_MAX_VOCAB)


class TopDistribution:
    """A distribution over `vocab_size` tokens of which the top-N and a few drawn tokens'
    entries are kept exactly, with the whole vector's VectorStats."""

    partial = True
    ndim = 1
    dtype = np.dtype(np.float64)
    __slots__ = ("_values", "known_ids", "stats", "top", "vocab_size")

    def __init__(
        self,
        vocab_size: int,
        top: tuple[np.ndarray, np.ndarray],
        stats: VectorStats,
        extra: dict[int, float] | None = None,
    ):
        self.vocab_size = int(vocab_size)
        self.top = top  # (ids, probabilities): desc probability, ties by ascending id; p > 0 only
        self.stats = stats
        values = dict(zip(top[0].tolist(), top[1].tolist()))
        for token, value in (extra or {}).items():
            values.setdefault(int(token), float(value))
        self._values = values
        self.known_ids = np.array(sorted(values), dtype=np.int64)

    @property
    def shape(self) -> tuple[int]:
        return (self.vocab_size,)

    def __len__(self) -> int:
        return self.vocab_size

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, (int, np.integer)):
            if not -self.vocab_size <= index < self.vocab_size:
                raise IndexError(f"token {index} is outside the vocabulary [0, {self.vocab_size})")
            return self._values.get(int(index) % self.vocab_size, 0.0)
        return np.asarray(self)[index]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        dense = np.zeros(self.vocab_size, dtype=np.float64)
        if self._values:
            dense[self.known_ids] = [self._values[i] for i in self.known_ids.tolist()]
        return dense if dtype is None else dense.astype(dtype)

    @property
    def missing_mass(self) -> float:
        """Probability mass not accounted for by the known entries (>= 0)."""
        return max(0.0, self.stats.total - sum(self._values.values()))

    def sum(self) -> float:
        return self.stats.total

    def __reduce__(self) -> tuple[Any, ...]:
        extra = {i: v for i, v in self._values.items()}
        return (TopDistribution, (self.vocab_size, self.top, self.stats, extra))

    def __repr__(self) -> str:
        return f"TopDistribution(V={self.vocab_size}, top={len(self.top[0])}, known={len(self.known_ids)})"


@dataclass(frozen=True)
class RowFacts:
    """Whole-row reductions of (m, V) rows taken while the rows were in cache (the draft's q
    rows, one per draft step), so that compact_rows, which runs after the target's forward
    has evicted them, need not read the rows again for them."""

    maxima: torch.Tensor | None  # (m, C): core.sampling.row_ops.chunk_maxima; None where `nonzero` is known
    minimum: torch.Tensor | None  # (m,); None for sparse rows (compact_rows takes it from their entries)
    total: torch.Tensor | None  # (m,); likewise
    nonzero: tuple[np.ndarray, ...] | None = None  # sparse rows: each row's nonzero token ids, ascending

    @staticmethod
    def of(rows: torch.Tensor, sparse: bool = False) -> RowFacts | None:
        """The facts of the rows, where compact_rows would use them (core.sampling.row_ops.fast_rows:
        CPU rows of 32k tokens and more); None elsewhere. `sparse` rows (a top-k filter) need
        only their chunk maxima, which find their nonzero entries."""
        import torch

        from specscope.core.sampling.row_ops import chunk_maxima, fast_rows

        if not fast_rows(rows):
            return None
        if sparse:
            return RowFacts(chunk_maxima(rows), None, None)
        return RowFacts(chunk_maxima(rows), torch.amin(rows, dim=-1), rows.sum(dim=-1))

    @staticmethod
    def of_nonzero(ids: np.ndarray) -> RowFacts:
        """The facts of one sparse row whose nonzero token ids (ascending) are known (a
        core.sampling.kept_rows row): nothing to read."""
        return RowFacts(None, None, None, (ids,))

    @staticmethod
    def stack(facts: Sequence[RowFacts | None]) -> RowFacts | None:
        """The facts of rows stacked in this order; None unless every part has facts."""
        import torch

        if not facts or any(f is None for f in facts):
            return None
        known = [f for f in facts if f is not None]  # every one (checked above)
        parts = [[getattr(f, name) for f in known] for name in ("maxima", "minimum", "total")]
        maxima, minimum, total = (None if any(t is None for t in ts) else torch.cat(ts) for ts in parts)
        nonzeros = [f.nonzero for f in known]
        nonzero = None if any(n is None for n in nonzeros) else tuple(i for n in nonzeros if n is not None for i in n)
        return RowFacts(maxima, minimum, total, nonzero)

    def entries(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(row, token id) of every nonzero entry, as core.sampling.row_ops.nonzero_entries gives them
        (CPU tensors); None unless `nonzero` is known."""
        import torch

        if self.nonzero is None:
            return None
        rows = np.repeat(np.arange(len(self.nonzero)), [ids.shape[0] for ids in self.nonzero])
        return torch.from_numpy(rows), torch.from_numpy(np.concatenate(self.nonzero))


def sparse_entries(rows: torch.Tensor, facts: RowFacts | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, token id) of every nonzero entry of sparse rows: from their facts when these
    know them, else by core.sampling.row_ops.nonzero_entries (guided by the facts' chunk maxima)."""
    from specscope.core.sampling.row_ops import nonzero_entries

    known = None if facts is None else facts.entries()
    if known is not None:
        return known
    return nonzero_entries(rows, None if facts is None else facts.maxima)


def compact_rows(
    rows: torch.Tensor,
    top_n: int,
    extra_ids: Sequence[Sequence[int]],
    sparse: bool = False,
    facts: RowFacts | None = None,
    entries: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> list[TopDistribution]:
    """TopDistributions of the (m, V) float64 rows, with each row's `extra_ids` entries kept
    too. One batched pass on the rows' device, one transfer to the host. `sparse`: the rows
    have few nonzero entries (a top-k filter): they are read once, for their nonzeros, and
    everything else comes from those (`entries`: core.sampling.row_ops.nonzero_entries of the rows,
    if already found). `facts`: the rows' RowFacts, if already taken."""
    import torch  # here, not at the top: the store's writer process reads this module without torch

    from specscope.core.sampling.row_ops import row_topk

    if sparse:
        return _compact_sparse(rows, top_n, extra_ids, entries if entries is not None else sparse_entries(rows, facts))
    m, vocab = rows.shape
    n = min(top_n, vocab)
    # One entry more than kept: where it equals the n-th, the n-th is tied with entries
    # outside the top n and the tie rule (lowest ids first) decides which are kept.
    values, ids = row_topk(rows, min(n + 1, vocab), None if facts is None else facts.maxima)  # ties in no set order
    if facts is None or facts.minimum is None:
        minimum, total = torch.amin(rows, dim=-1), rows.sum(dim=-1)
    else:
        minimum, total = facts.minimum, cast("torch.Tensor", facts.total)  # given with the minimum
    # Support: the whole vocabulary where the minimum is positive (unfiltered rows); counted
    # only in the rows that have zeros.
    support = torch.full_like(total, vocab, dtype=torch.long)
    zeros = torch.nonzero(minimum <= 0).flatten()
    if zeros.numel():
        support[zeros] = (rows[zeros] > 0).sum(dim=-1)
    width = max((len(e) for e in extra_ids), default=0)
    extra_index = torch.zeros((m, max(width, 1)), dtype=torch.long)
    for r, tokens in enumerate(extra_ids):
        extra_index[r, : len(tokens)] = torch.as_tensor(list(tokens), dtype=torch.long)
    extra_index = extra_index.to(rows.device)
    extra_values = torch.gather(rows, 1, extra_index)
    host = [t.cpu().numpy() for t in (values, ids, support, minimum, total, extra_values)]
    values_h, ids_h, support_h, minimum_h, total_h, extra_h = host
    out = []
    for r in range(m):
        top_ids, top_vals = ids_h[r][:n], values_h[r][:n]
        if values_h.shape[1] > n and values_h[r][n] == values_h[r][n - 1] > 0:
            top_ids, top_vals = _tied_top(rows[r], n)
        top_ids, top_vals = _ordered_positive(top_ids.astype(np.int64), top_vals.astype(np.float64))
        stats = VectorStats(int(support_h[r]), float(minimum_h[r]), float(total_h[r]))
        extra = {int(t): float(v) for t, v in zip(extra_ids[r], extra_h[r][: len(extra_ids[r])])}
        out.append(TopDistribution(vocab, (top_ids, top_vals), stats, extra))
    return out


def _compact_sparse(
    rows: torch.Tensor, top_n: int, extra_ids: Sequence[Sequence[int]], entries: tuple[torch.Tensor, torch.Tensor]
) -> list[TopDistribution]:
    """compact_rows from the rows' nonzero entries (row-major, ascending ids per row, as
    nonzero returns them): the top-N by a stable sort (ties stay by ascending id), support =
    their count, minimum = 0 unless every entry is positive, sum = theirs. Rows are
    nonnegative (probabilities)."""
    m, vocab = rows.shape
    row_t, ids_t = entries
    values = rows[row_t, ids_t].cpu().numpy()
    row_of, ids = row_t.cpu().numpy(), ids_t.cpu().numpy().astype(np.int64)
    bounds = np.searchsorted(row_of, np.arange(m + 1))
    out = []
    for r in range(m):
        lo, hi = bounds[r], bounds[r + 1]
        r_ids, r_vals = ids[lo:hi], values[lo:hi]
        order = np.argsort(-r_vals, kind="stable")[:top_n]
        count = hi - lo
        minimum = float(r_vals.min()) if count == vocab else min(0.0, float(r_vals.min(initial=0.0)))
        stats = VectorStats(int(np.count_nonzero(r_vals > 0)), minimum, float(r_vals.sum()))
        known = dict(zip(r_ids.tolist(), r_vals.tolist()))
        extra = {int(t): known.get(int(t), 0.0) for t in extra_ids[r]}
        top_ids, top_vals = r_ids[order], r_vals[order]
        positive = top_vals > 0
        out.append(TopDistribution(vocab, (top_ids[positive], top_vals[positive]), stats, extra))
    return out


def _tied_top(row: torch.Tensor, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The top n of a row whose n-th value is tied beyond n: every entry above the tied
    value, then the tied entries by ascending id."""
    import torch

    from specscope.core.sampling.row_ops import row_topk

    cut = row_topk(row, n)[0][-1]
    above = torch.nonzero(row > cut).flatten()
    tied = torch.nonzero(row == cut).flatten()[: n - above.numel()]
    ids = torch.cat([above, tied])
    return ids.cpu().numpy(), row[ids].cpu().numpy()


def _ordered_positive(ids: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Descending probability, ties by ascending id, zero entries dropped (the store's order)."""
    order = np.lexsort((ids, -values))
    ids, values = ids[order], values[order]
    positive = values > 0
    return ids[positive], values[positive]


def host_rows(rows: torch.Tensor) -> list[np.ndarray]:
    """The rows as float64 numpy vectors on the host (one transfer)."""
    return list(rows.cpu().numpy())
