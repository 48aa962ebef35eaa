"""Per-row reductions over a full vocabulary that torch's CPU kernels do slowly.

On CPU at 152k tokens, `torch.topk(row, 21)` and `row.argmax()` each cost about 0.2 ms a row
(`row.min(dim)` too), while a values-only reduction (`amax`) costs 0.01 ms: they dominate
the decoder's bookkeeping at real vocabularies. Here the row is viewed as chunks of
CHUNK entries: the chunk maxima (one vectorised pass) name the few chunks that can hold
the largest entries, and the exact topk / argmax runs on those chunks only. The results
equal torch's: the same values, and for argmax the same index (the first maximal entry).
Other devices (CUDA) keep torch's own kernels, which are fast there.
"""

from __future__ import annotations

import torch

CHUNK = 64
# Below this many tokens torch's kernels win: the chunked path's extra dispatches cost more
# than they save (measured: a single-row argmax and a draw break even near 32k tokens).
MIN_VOCAB = 32_768


def chunked(rows: torch.Tensor, fill: float = float("-inf")) -> torch.Tensor:
    """(m, V) -> (m, ceil(V / CHUNK), CHUNK), the tail padded with `fill`."""
    m, vocab = rows.shape
    pad = (-vocab) % CHUNK
    if pad:
        rows = torch.nn.functional.pad(rows, (0, pad), value=fill)
    return rows.reshape(m, -1, CHUNK)


def fast_rows(rows: torch.Tensor) -> bool:
    """Whether the chunked reductions pay: float rows on the CPU, at least MIN_VOCAB long."""
    return rows.device.type == "cpu" and rows.shape[-1] >= MIN_VOCAB and rows.dtype.is_floating_point


def chunk_maxima(rows: torch.Tensor) -> torch.Tensor:
    """(m, V) -> (m, ceil(V / CHUNK)): each chunk's largest entry (what row_topk and
    nonzero_entries search by; a caller that computes it while the rows are in cache
    passes it in)."""
    return torch.amax(chunked(rows), dim=-1)


def row_topk(rows: torch.Tensor, k: int, maxima: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch.topk(rows, k, dim=-1)` for a 1-D or 2-D float tensor: the k largest values of
    each row in descending order and their ids (ties in no set order, as torch's). NaN-free
    rows only (the decoder checks logits are finite first). `maxima`: the rows'
    chunk_maxima, if already known."""
    if rows.ndim == 1:
        values, ids = row_topk(rows.reshape(1, -1), k, None if maxima is None else maxima.reshape(1, -1))
        return values[0], ids[0]
    if not fast_rows(rows) or not chunks_take(k, rows.shape[-1]):
        return torch.topk(rows, k, dim=-1)
    values, at, chunk_ids = top_candidates(rows, k, maxima)
    ids = torch.gather(chunk_ids, 1, at // CHUNK) * CHUNK + at % CHUNK
    return values, ids


def chunks_take(k: int, vocab: int) -> bool:
    """Whether the chunked search pays for the k largest of `vocab` entries (a few chunks
    out of many; wider, torch's own topk)."""
    return k <= vocab // (4 * CHUNK)


def top_candidates(
    rows: torch.Tensor, k: int, maxima: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chunked search of row_topk for (m, V) rows: the k largest values of each row
    (descending, ties in no set order), their positions `at` among the gathered chunks,
    and those chunks' ids, so that a value's token id is
    chunk_ids[at // CHUNK] * CHUNK + at % CHUNK (row_topk computes it in torch, a caller
    on the host may in numpy)."""
    chunks = chunked(rows)
    # The k largest entries lie in at most k chunks, each with a maximum at least as large
    # as the k-th largest entry: the k chunks with the largest maxima hold them.
    _, chunk_ids = torch.topk(torch.amax(chunks, dim=-1) if maxima is None else maxima, k, dim=-1)  # (m, k)
    gathered = torch.gather(chunks, 1, chunk_ids.unsqueeze(-1).expand(-1, -1, CHUNK)).reshape(rows.shape[0], -1)
    values, at = torch.topk(gathered, k, dim=-1)
    return values, at, chunk_ids


def row_argmax(rows: torch.Tensor) -> torch.Tensor:
    """`rows.argmax(dim=-1)`: per row, the index of the first maximal entry."""
    if rows.ndim == 1:
        return row_argmax(rows.reshape(1, -1))[0]
    if not fast_rows(rows):
        return rows.argmax(dim=-1)
    chunks = chunked(rows)
    first_chunk = torch.amax(chunks, dim=-1).argmax(dim=-1)  # the first chunk holding the maximum
    inside = chunks[torch.arange(rows.shape[0], device=rows.device), first_chunk].argmax(dim=-1)
    return first_chunk * CHUNK + inside


def nonzero_entries(rows: torch.Tensor, maxima: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(row index, token id) of every nonzero entry of nonnegative (m, V) rows, row-major and
    by ascending id within a row, as `torch.nonzero(rows).T` gives them. For sparse rows (a
    top-k filter) only the chunks whose maximum is positive are searched (`maxima`: the
    rows' chunk_maxima, if already known)."""
    if not fast_rows(rows):
        at = torch.nonzero(rows)
        return at[:, 0], at[:, 1]
    chunks = chunked(rows, fill=0.0)  # zeros: never nonzero
    hot = torch.nonzero((chunk_maxima(rows) if maxima is None else maxima) > 0)  # (h, 2): row, chunk
    inside = torch.nonzero(chunks[hot[:, 0], hot[:, 1]] > 0)  # (nnz, 2): hot chunk, offset
    return hot[inside[:, 0], 0], hot[inside[:, 0], 1] * CHUNK + inside[:, 1]
