"""The sampling transforms and draws of core.sampling, on the model's device.

The decoder's hot path: the same transforms, tie rules and draws as the float64 numpy
reference in core.sampling, in float64 torch on the tensor's own device, so full-vocabulary
rows never cross to the host unless a trace keeps them. float64 because the acceptance
ratio p(x)/q(x), the residual max(p - q, 0) and its mass are differences of probabilities
that float32 would round at about 1e-7 relative, far above the checker's tolerance
(docs/scale.md). A module of its own so that the store's writer process, which reads
core.sampling's SamplingConfig, never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specscope.core.sampling.dists import RowFacts
from specscope.core.sampling.kept_rows import applies, dense_rows, kept_rows
from specscope.core.sampling.reference import SamplingConfig
from specscope.core.sampling.row_ops import CHUNK, chunked, fast_rows, row_argmax, row_topk


def _topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """row_topk over the last dimension of a tensor of any rank."""
    values, ids = row_topk(x.reshape(-1, x.shape[-1]), k)
    return values.reshape(*x.shape[:-1], k), ids.reshape(*x.shape[:-1], k)


def check_finite_torch(logits: torch.Tensor, who: str) -> None:
    if bool(torch.isfinite(logits.sum())):  # one read: any NaN or inf makes the sum non-finite
        return
    finite = torch.isfinite(logits)  # (a sum can also overflow with every entry finite)
    if not bool(finite.all()):
        raise ValueError(f"{who} produced {int((~finite).sum())} non-finite logits (NaN or inf); refusing to sample")


def process_logits_torch(
    logits: torch.Tensor, config: SamplingConfig, checked: bool = False, out: torch.Tensor | None = None
) -> torch.Tensor:
    """`process_logits` for a (..., V) tensor: the float64 distribution on the same device
    (written into `out` when given)."""
    if not checked:
        check_finite_torch(logits, "the model")  # before the float64 copy: half the bytes to read
    if config.greedy:
        return _into(torch.softmax(logits.to(torch.float64), dim=-1), out)
    vocab = logits.shape[-1]
    if config.top_k and config.top_k < vocab and _cannot_overflow(logits.dtype, config.temperature):
        sparse = _top_k_sparse(logits, config, out)
        if sparse is not None:
            return sparse
    x = logits.to(torch.float64)
    if config.temperature != 1:
        x = x / config.temperature
        if config.temperature < 1 and not bool(torch.isfinite(x).all()):
            raise ValueError(f"temperature {config.temperature:g} overflows the logits")
    if config.top_k and config.top_k < vocab:
        # Ties at the k-th largest logit stay, as in transformers' TopKLogitsWarper.
        kth = _topk(x, config.top_k)[0][..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    return _into(_top_p(torch.softmax(x, dim=-1), config.top_p), out)


@dataclass(frozen=True, eq=False)
class TargetRows:
    """The target's processed rows for the verifier and the record."""

    p: torch.Tensor  # (m, V) float64, on the logits' device
    argmax: np.ndarray  # (m,) int64: each row's first maximal logit
    facts: RowFacts | None  # p's nonzero ids, where core.sampling.kept_rows made p; else None


def target_rows(logits: torch.Tensor, config: SamplingConfig, who: str = "the target model") -> TargetRows:
    """p and the argmax of (m, V) logits, after checking they are finite (a ValueError
    naming `who` otherwise): from the kept entries on a CPU top-k row (core.sampling.kept_rows,
    which also gives p's nonzeros to the record), else by process_logits_torch."""
    kept = kept_rows(logits, config) if applies(logits, config) else None
    if kept is not None:
        facts = RowFacts.stack([RowFacts.of_nonzero(row.ids) for row in kept])
        return TargetRows(dense_rows(kept), np.array([row.argmax for row in kept], dtype=np.int64), facts)
    check_finite_torch(logits, who)
    return TargetRows(process_logits_torch(logits, config, checked=True), row_argmax(logits).cpu().numpy(), None)


def _into(rows: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    return rows if out is None or rows is out else out.copy_(rows)


def draft_distribution(logits: torch.Tensor, config: SamplingConfig, out: torch.Tensor | None = None) -> torch.Tensor:
    """The draft's q for a (..., V) row of sampled-mode logits: `process_logits_torch`'s
    distribution, except that an unfiltered (or top-p only) row takes its exponentials in
    float32 and is normalised in float64. Speculative sampling is exact for any q that the
    draft token is drawn from and that the accept ratio and the residual then use; this q is
    all three (the decoder draws from, records and verifies with these float64 values), so
    the output stays the target's distribution, and q differs from the float64 softmax by
    about 1e-7 relative: an acceptance-rate effect of that size. It saves the float64
    exponentials (about 0.2 ms a row at 152k tokens on a CPU). A top-k row is computed on
    its k kept logits in float64 as before; a row that overflows float32 or has an entry
    that underflows to zero there (a low temperature) takes the float64 path, so q's
    support is always the float64 one. Written into `out` when given (the proposer's row
    of q, so the float64 row is made once)."""
    if config.greedy or (config.top_k and config.top_k < logits.shape[-1]):
        return process_logits_torch(logits, config, out=out)
    x = logits if config.temperature == 1 else logits / config.temperature
    single = torch.softmax(x, dim=-1)
    # One look checks the logits too: a NaN or inf logit makes the softmax NaN (amin
    # propagates it), a -inf logit or an entry that underflowed float32 makes it 0. Either
    # way the float64 path decides, with its finite check.
    if not bool(torch.amin(single) > 0):
        return process_logits_torch(logits, config, out=out)
    probs = single.to(torch.float64) if out is None else out.copy_(single)
    return _into(_top_p(probs.div_(probs.sum(dim=-1, keepdim=True)), config.top_p), out)


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The top-p filter of (..., V) probability rows, renormalised (the rows as they are at 1)."""
    if top_p >= 1.0:
        return probs
    vocab = probs.shape[-1]
    keep = torch.stack([_top_p_keep(row, top_p) for row in probs.reshape(-1, vocab)])
    probs = torch.where(keep.reshape(probs.shape), probs, torch.zeros((), dtype=probs.dtype, device=probs.device))
    return probs / probs.sum(dim=-1, keepdim=True)


def _cannot_overflow(dtype: torch.dtype, temperature: float) -> bool:
    """Whether logits of `dtype` divided by the temperature stay finite in float64 (for
    float32 logits: any temperature above 2e-270)."""
    return torch.finfo(dtype).max / temperature < torch.finfo(torch.float64).max


def _top_k_sparse(logits: torch.Tensor, config: SamplingConfig, out: torch.Tensor | None = None) -> torch.Tensor | None:
    """The top-k (then top-p) distribution computed on the k kept logits only, scattered
    into zeros: the full row is read once (topk, on the logits as they are: dividing by a
    positive temperature keeps their order and their ties) instead of five times. None when
    the k-th largest logit is tied with the next one (then every tied token stays: the
    masked path)."""
    k = config.top_k
    vals, ids = _topk(logits, k + 1)  # (..., k + 1) descending
    # one sync: is the k-th value tied with the next (then the masked path), and are any
    # two kept values tied (then top-p needs the tie order by id)
    tied = vals[..., 1:] == vals[..., :-1]
    cut_tied, kept_tied = torch.stack([tied[..., k - 1].any(), tied[..., : k - 1].any()]).tolist()
    if cut_tied:
        return None
    scaled = vals[..., :k].to(torch.float64)
    if config.temperature != 1:
        scaled = scaled / config.temperature
    kept, ids = torch.softmax(scaled, dim=-1), ids[..., :k]
    if config.top_p < 1.0 and kept_tied:
        kept = _top_p_of_kept(kept.reshape(-1, k), ids.reshape(-1, k), config.top_p).reshape(kept.shape)
    elif config.top_p < 1.0:  # distinct values, already in descending order: the rule's order
        kept = _top_p_of_descending(kept, config.top_p)
    out = torch.zeros(logits.shape, dtype=torch.float64, device=logits.device) if out is None else out.zero_()
    return out.scatter_(-1, ids.reshape(out.shape[:-1] + (k,)), kept.reshape(out.shape[:-1] + (k,)))


def _top_p_of_descending(values: torch.Tensor, top_p: float) -> torch.Tensor:
    """Top-p over rows already in descending order without ties (`_top_p_of_kept`'s rule,
    whose order this is): up to the first entry whose cumulative mass reaches top_p."""
    below = (torch.cumsum(values, dim=-1) < top_p).sum(dim=-1, keepdim=True)
    values = values.masked_fill(torch.arange(values.shape[-1], device=values.device) > below, 0.0)
    return values / values.sum(dim=-1, keepdim=True)


def _top_p_of_kept(values: torch.Tensor, ids: torch.Tensor, top_p: float) -> torch.Tensor:
    """Top-p over each row's kept entries, (m, k) (`_top_p_mask`'s rule: descending
    probability, equal ones by ascending id, up to the first whose cumulative mass reaches
    top_p), renormalised. All rows at once: the order is a stable sort by id, then a stable
    sort by descending probability."""
    by_id = torch.argsort(ids, dim=-1, stable=True)
    by_value = torch.sort(-torch.gather(values, -1, by_id), dim=-1, stable=True).indices
    order = torch.gather(by_id, -1, by_value)  # (m, k): positions in descending-probability order
    cumulative = torch.cumsum(torch.gather(values, -1, order), dim=-1)
    count = ((cumulative < top_p).sum(dim=-1, keepdim=True) + 1).clamp(max=values.shape[-1])
    ranks = torch.arange(values.shape[-1], device=values.device).expand_as(values)
    keep = torch.zeros_like(values, dtype=torch.bool).scatter_(-1, order, ranks < count)
    out = torch.where(keep, values, torch.zeros((), dtype=values.dtype, device=values.device))
    return out / out.sum(dim=-1, keepdim=True)


def _top_p_keep(row: torch.Tensor, top_p: float) -> torch.Tensor:
    """The top-p mask of one row, as `_top_p_mask` defines it: the most probable tokens
    (equal probabilities by ascending id) up to and including the first whose cumulative
    mass reaches top_p. Sorts only what the rule needs: the 256 largest entries, then the
    1,024 largest (top-k style filters and peaked rows stop there); when their mass stays below top_p
    (a flat row: a random model's keeps most of the vocabulary), one full sort of the
    values, numpy's on the CPU (about 1.7 ms at 152k tokens against 14 ms for torch's
    sort, and against the 7-14 ms of each larger topk the old growing head took). Either
    way the cumulative sums are those of the descending values in sequence, the numpy
    reference's, so the cut is the same bit for bit."""
    vocab = row.shape[0]
    for m in (min(256, vocab), min(1024, vocab)):
        head = row_topk(row, m)[0]  # descending
        below = int((torch.cumsum(head, dim=0) < top_p).sum())
        if below < m or m == vocab:
            break
    if below >= m and m < vocab:  # the head does not reach top_p: the whole row, sorted once
        if row.device.type == "cpu":
            values = np.sort(row.numpy())[::-1]
            below = int((np.cumsum(values) < top_p).sum())
            head = torch.from_numpy(values[: min(below + 1, vocab)].copy())
        else:
            head = torch.sort(row, descending=True).values
            below = int((torch.cumsum(head, dim=0) < top_p).sum())
    count = min(below + 1, vocab)
    cut = head[count - 1]
    keep = row > cut
    need = count - int(keep.sum())
    if need > 0:  # tokens equal to the cut value: the lowest ids first (a stable sort)
        tied = torch.nonzero(row == cut).flatten()[:need]
        keep[tied] = True
    return keep


def row_confidence(logits: torch.Tensor, token: int | torch.Tensor) -> torch.Tensor:
    """softmax(logits)[token] of one row of logits at temperature 1, as a float64 device
    scalar: exp(x - max) in float32 summed in float64, then exp(x[token] - max) / sum in
    float64. One float32 pass instead of a float64 copy and a float64 logsumexp (about half
    the time at 152k tokens); each term carries float32's 6e-8 relative rounding, so the
    value is within about 1e-7 relative of the float64 softmax, and a confident draft's
    1 - 1e-9 stays below 1 (the largest term is exp(0) = 1 exactly, the rest add in float64)."""
    row = logits.reshape(-1)
    top = torch.amax(row)
    total = torch.exp(row - top).sum(dtype=torch.float64)
    return (row[token].reshape(()).double() - top.double()).exp() / total


def sample_from_torch(probs: torch.Tensor, u: float) -> int:
    """`sample_from` for a 1-D tensor: the inverse-CDF draw in token-id order (one sync; two
    on the CPU at large vocabularies, where the row is summed by chunks first)."""
    if fast_rows(probs):
        return _sample_by_chunks(probs, u)
    cdf = torch.cumsum(probs, dim=0)
    total = cdf[-1]
    at = torch.searchsorted(cdf, (u * total).reshape(1), right=True)
    at_value, total_value = torch.stack([at[0].to(cdf.dtype), total]).tolist()
    if not total_value > 0:
        raise ValueError("cannot sample from a distribution with zero total mass")
    index = int(at_value)
    if index >= probs.shape[0]:  # only reachable through rounding at u -> 1
        index = int(torch.nonzero(probs).flatten()[-1])
    return index


def _sample_by_chunks(probs: torch.Tensor, u: float) -> int:
    """The same inverse-CDF draw with the cumulative sum taken over chunk sums, then inside
    the chunk the draw lands in: two short scans instead of one over the vocabulary. Still
    in token-id order; only the association of the additions differs (docs/scale.md). CPU
    rows only (`fast_rows`): the chunk sums are one torch pass, and the two short scans run
    on numpy views of the same memory (a few microseconds each, against ~10 for a torch op
    on a 64-entry tensor)."""
    chunks = chunked(probs.reshape(1, -1), fill=0.0)[0]  # (C, CHUNK)
    chunk_cdf = np.cumsum(chunks.sum(dim=-1).numpy())  # sequential, as torch's CPU cumsum
    total = float(chunk_cdf[-1])
    if not total > 0:
        raise ValueError("cannot sample from a distribution with zero total mass")
    x = u * total
    c = min(int(np.searchsorted(chunk_cdf, x, side="right")), chunk_cdf.shape[0] - 1)
    below = float(chunk_cdf[c - 1]) if c > 0 else 0.0
    row = probs.reshape(-1).numpy()
    inside = below + np.cumsum(row[c * CHUNK : c * CHUNK + CHUNK])
    offset = int(np.searchsorted(inside, x, side="right"))
    index: int = c * CHUNK + offset
    if offset >= inside.shape[0] or index >= row.shape[0] or not row[index] > 0:
        # x fell in the rounding gap at a chunk's end (or at u -> 1): the last token with
        # mass up to there, as the scan over the whole row would pick
        index = int(np.flatnonzero(row[: min(c * CHUNK + CHUNK, row.shape[0])])[-1])
    return index
