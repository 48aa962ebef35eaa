"""The full-vocabulary part of a transformers round: what the record keeps of its rows.

transformers hands the recorder the target's processed logits (n + 1 rows) and, for a
draft model, the candidate logits (n rows), on the model's device. The softmax in float64
runs there. Then, as the trace policy says (core.sampling.dists, as specscope's own decoder):
whole rows go to the host in one transfer and the per-node facts (p(x), q(x),
sum min(p, q), the residual at the rejected node) are read there with numpy, a few
microseconds a call where each small torch op costs about ten; or, for top-N records
(large vocabularies), every whole-row fact is computed on the device in one batched pass and
only the scalars and the top-N entries come to the host. No whole row goes to the host that
the record does not keep.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specscope.core.sampling.dists import compact_rows


@dataclass
class RoundVectors:
    """What a Round keeps of the round's rows, on the host."""

    p_rows: list[Any]  # one per scored position (n + 1: the candidates and the bonus position)
    q_rows: list[Any] | None  # one per candidate; None in greedy runs
    residual: Any | None  # normalise(max(p - q, 0)) at the rejected node
    residual_mass: float | None
    argmax: list[int]  # target argmax per scored position
    scalars: np.ndarray  # (n, 3): p(x), q(x), sum min(p, q); NaN where there is no q


def q_rows(
    candidate_logits: torch.Tensor | None,
    candidates: list[int],
    vocab: int,
    *,
    greedy: bool,
    lookup: bool,
    device: torch.device,
) -> torch.Tensor | None:
    """q as the candidate generator returned it, (n, V) float64 on the device: softmax of the
    candidate logits (draft model), a point mass on each candidate (prompt lookup); None in
    greedy runs (transformers' greedy path does not use q)."""
    if greedy or not candidates:
        return None
    if candidate_logits is not None:
        return torch.softmax(candidate_logits[0].detach().double(), dim=-1)
    if lookup:
        index = torch.as_tensor(candidates, dtype=torch.long, device=device).view(-1, 1)
        return torch.zeros((len(candidates), vocab), dtype=torch.float64, device=device).scatter_(1, index, 1.0)
    return None


def read_vectors(
    scores: torch.Tensor,
    q: torch.Tensor | None,
    candidates: list[int],
    rejected: int | None,
    drawn: int | None,
    *,
    full: bool,
    top_n: int,
    sparse: bool = False,
) -> RoundVectors:
    """The round's vectors from transformers' processed `scores` (1, m, V) and q (n, V);
    `drawn` is the round's bonus or repair token (a top-N record keeps its entry); `sparse`:
    the rows have few nonzero entries (a top-k filter), compacted from those (core.sampling.dists)."""
    p = torch.softmax(scores[0].detach().double(), dim=-1)
    if full:
        return _full_vectors(p, q, candidates, rejected)
    return _top_vectors(p, q, candidates, rejected, drawn, top_n, sparse)


def _full_vectors(p: torch.Tensor, q: torch.Tensor | None, candidates: list[int], rejected: int | None) -> RoundVectors:
    """Whole rows kept: they go to the host in one transfer each, and the scalars are read
    there with numpy (a few microseconds a call, where each small torch op costs ~10)."""
    p_all = p.cpu().numpy()
    q_all = q.cpu().numpy() if q is not None else None
    p_host, q_host = list(p_all), list(q_all) if q_all is not None else None
    n = len(candidates)
    rows = np.arange(n)
    p_tok = p_all[rows, candidates]
    nan = np.full(n, np.nan)
    q_tok, overlap = nan, nan
    residual, mass = None, None
    if q_all is not None:
        q_tok, overlap = q_all[rows, candidates], np.minimum(p_all[:n], q_all).sum(axis=1)
        if rejected is not None:
            positive = np.maximum(p_host[rejected] - q_all[rejected], 0.0)
            mass = float(positive.sum())
            residual = positive / mass if mass > 0 else None  # never divide a zero residual
    return RoundVectors(
        p_rows=p_host,
        q_rows=q_host,
        residual=residual,
        residual_mass=mass,
        argmax=[int(a) for a in p_all.argmax(axis=1)],
        scalars=np.stack([p_tok, q_tok, overlap], axis=1),
    )


def _top_vectors(
    p: torch.Tensor,
    q: torch.Tensor | None,
    candidates: list[int],
    rejected: int | None,
    drawn: int | None,
    top_n: int,
    sparse: bool,
) -> RoundVectors:
    """Top-N rows: every whole-row fact is computed on the rows' device, in one batched pass;
    the scalars come to the host in one transfer and the rows as TopDistributions."""
    n, m = len(candidates), p.shape[0]
    index = torch.as_tensor(candidates, dtype=torch.long, device=p.device).view(-1, 1)
    p_tok = torch.gather(p[:n], 1, index).flatten()
    nan = torch.full_like(p_tok, float("nan"))
    q_tok, overlap = (
        (nan, nan) if q is None else (torch.gather(q, 1, index).flatten(), torch.minimum(p[:n], q).sum(dim=-1))
    )
    rows = [p] + ([q] if q is not None else [])
    mass = torch.zeros(1, dtype=torch.float64, device=p.device)
    if rejected is not None and q is not None:
        positive = torch.clamp_min(p[rejected] - q[rejected], 0)
        mass = positive.sum().reshape(1)
        # never divide a zero residual: the row is then dropped below (mass 0 on the host)
        rows.append((positive / torch.where(mass > 0, mass, torch.ones_like(mass))).reshape(1, -1))
    small = torch.cat([p.argmax(dim=-1).double(), p_tok, q_tok, overlap, mass]).cpu().numpy()  # one transfer
    has_residual = len(rows) > (2 if q is not None else 1)
    extra = _extra_ids(candidates, m, q is not None, has_residual, rejected, drawn)
    kept = compact_rows(torch.cat(rows), top_n, extra, sparse=sparse)
    residual_mass = float(small[-1]) if has_residual else None
    return RoundVectors(
        p_rows=kept[:m],
        q_rows=kept[m : m + n] if q is not None else None,
        residual=kept[-1] if residual_mass is not None and residual_mass > 0 else None,
        residual_mass=residual_mass,
        argmax=[int(a) for a in small[:m]],
        scalars=small[m : m + 3 * n].reshape(3, n).T,
    )


def _extra_ids(
    candidates: list[int], m: int, has_q: bool, has_residual: bool, rejected: int | None, drawn: int | None
) -> list[list[int]]:
    """Entries each row keeps besides its top-N, as the decoder's records do: the candidate
    (p and q rows), the bonus drawn from the last p row, the repair drawn from the residual.
    The target's argmax is the top entry of its p row (torch's argmax takes the lowest id of
    a tie, as the top-N order does), so it needs no extra entry."""
    n = len(candidates)
    p_extra = [[candidates[i]] if i < n else [] for i in range(m)]
    if m > n and drawn is not None and rejected is None:
        p_extra[n] = [drawn]
    q_extra = [[t] for t in candidates] if has_q else []
    return p_extra + q_extra + ([[drawn if drawn is not None else 0]] if has_residual else [])
