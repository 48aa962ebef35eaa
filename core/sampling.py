"""Sampling transforms and categorical draws, in float64 numpy.

p and q are always the distributions *after* temperature -> top-k -> top-p, the order
transformers applies its logits warpers. Both sides of the verifier go through the same
function, so the q a token was sampled from is exactly the q the verifier divides by.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class SamplingConfig:
    """temperature=0 means greedy; top_k=0 and top_p=1.0 switch those filters off."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        tp = self.top_p
        if isinstance(tp, bool) or not isinstance(tp, (int, float)) or not (0.0 < tp <= 1.0):
            raise ValueError(f"top_p must lie in (0, 1] (1 = off), got {tp!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def describe(self) -> str:
        if self.greedy:
            return "greedy"
        parts = [f"T={self.temperature:g}"]
        if self.top_k:
            parts.append(f"top-k={self.top_k}")
        if self.top_p < 1.0:
            parts.append(f"top-p={self.top_p:g}")
        return " ".join(parts)


def check_finite(logits: np.ndarray, who: str) -> None:
    if not np.isfinite(logits).all():
        bad = int((~np.isfinite(logits)).sum())
        raise ValueError(f"{who} produced {bad} non-finite logits (NaN or inf); refusing to sample")


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64 (logits must be finite)."""
    z = np.asarray(logits, dtype=np.float64)
    e = z - z.max(axis=-1, keepdims=True)  # a new array: the in-place steps below are safe
    np.exp(e, out=e)
    e /= e.sum(axis=-1, keepdims=True)
    return e


def _top_k_mask(scaled: np.ndarray, top_k: int) -> np.ndarray:
    # Keep every token whose logit reaches the k-th largest (ties at the threshold stay,
    # as in transformers' TopKLogitsWarper).
    vocab = scaled.shape[-1]
    if top_k >= vocab:
        return np.ones_like(scaled, dtype=bool)
    kth = np.partition(scaled, vocab - top_k, axis=-1)[..., vocab - top_k, None]
    return scaled >= kth


def _top_p_mask(probs: np.ndarray, top_p: float) -> np.ndarray:
    # Smallest set of most probable tokens whose mass reaches top_p.
    order = np.argsort(-probs, axis=-1, kind="stable")
    sorted_probs = np.take_along_axis(probs, order, axis=-1)
    cumulative = np.cumsum(sorted_probs, axis=-1)
    # Number of tokens kept = 1 + number of prefixes whose mass is still below top_p.
    keep_count = 1 + (cumulative < top_p).sum(axis=-1, keepdims=True)
    keep_sorted = np.arange(probs.shape[-1]) < keep_count
    mask = np.zeros_like(keep_sorted)
    np.put_along_axis(mask, order, keep_sorted, axis=-1)
    return mask


def process_logits(logits: np.ndarray, config: SamplingConfig, checked: bool = False) -> np.ndarray:
    """Logits (..., V) -> the sampling distribution (..., V) in float64.

    In greedy mode this is the plain softmax (temperature 1, no filters): the decision uses
    its argmax, and the distribution itself is kept only so people can see it.
    `checked=True` skips the finite check for logits the caller has already checked.
    """
    logits = np.asarray(logits, dtype=np.float64)
    if not checked:
        check_finite(logits, "the model")
    if config.greedy:
        return softmax(logits)
    if config.temperature == 1:
        scaled = logits  # x / 1.0 == x exactly; finite logits stay finite
    else:
        scaled = logits / config.temperature
        if config.temperature < 1 and not np.isfinite(scaled).all():  # T >= 1 cannot overflow
            raise ValueError(f"temperature {config.temperature:g} overflows the logits")
    if config.top_k:
        scaled = np.where(_top_k_mask(scaled, config.top_k), scaled, -np.inf)
    probs = softmax(scaled)
    if config.top_p < 1.0:
        probs = np.where(_top_p_mask(probs, config.top_p), probs, 0.0)
        probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def sample_from(probs: np.ndarray, u: float) -> int:
    """Inverse-CDF draw from a 1-D distribution with a given uniform u in [0, 1).

    Deterministic in u, and never returns a zero-probability token: the first index whose
    cumulative mass exceeds u * total has strictly positive mass.
    """
    if isinstance(probs, torch.Tensor):
        return sample_from_torch(probs, u)
    cdf = np.cumsum(probs)
    total = cdf[-1]
    if not total > 0:
        raise ValueError("cannot sample from a distribution with zero total mass")
    index = int(np.searchsorted(cdf, u * total, side="right"))
    if index >= len(cdf):  # only reachable through rounding at u -> 1
        index = int(np.flatnonzero(probs)[-1])
    return index


# ---------------------------------------------------------------------------- on the device
#
# The decoder's hot path: the same transforms, tie rules and draws as the float64 numpy
# functions above, in float64 torch on the tensor's own device, so full-vocabulary rows
# never cross to the host unless a trace keeps them. float64 because the acceptance ratio
# p(x)/q(x), the residual max(p - q, 0) and its mass are differences of probabilities that
# float32 would round at about 1e-7 relative, far above the checker's tolerance.


def check_finite_torch(logits: torch.Tensor, who: str) -> None:
    finite = torch.isfinite(logits)
    if not bool(finite.all()):
        raise ValueError(f"{who} produced {int((~finite).sum())} non-finite logits (NaN or inf); refusing to sample")


def process_logits_torch(logits: torch.Tensor, config: SamplingConfig, checked: bool = False) -> torch.Tensor:
    """`process_logits` for a (..., V) tensor: the float64 distribution on the same device."""
    x = logits.to(torch.float64)
    if not checked:
        check_finite_torch(x, "the model")
    if config.greedy:
        return torch.softmax(x, dim=-1)
    if config.temperature != 1:
        x = x / config.temperature
        if config.temperature < 1 and not bool(torch.isfinite(x).all()):
            raise ValueError(f"temperature {config.temperature:g} overflows the logits")
    vocab = x.shape[-1]
    if config.top_k and config.top_k < vocab:
        sparse = _top_k_sparse(x, config)
        if sparse is not None:
            return sparse
        # Ties at the k-th largest logit stay, as in transformers' TopKLogitsWarper.
        kth = torch.topk(x, config.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if config.top_p < 1.0:
        flat = probs.reshape(-1, vocab)
        keep = torch.stack([_top_p_keep(row, config.top_p) for row in flat])
        probs = torch.where(keep.reshape(probs.shape), probs, torch.zeros((), dtype=probs.dtype, device=probs.device))
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def _top_k_sparse(x: torch.Tensor, config: SamplingConfig) -> torch.Tensor | None:
    """The top-k (then top-p) distribution computed on the k kept logits only, scattered
    into zeros: the full row is read once (topk) instead of five times. None when the k-th
    largest logit is tied with the next one (then every tied token stays: the masked path)."""
    k = config.top_k
    vals, ids = torch.topk(x, k + 1, dim=-1)  # (..., k + 1) descending
    if bool((vals[..., k] == vals[..., k - 1]).any()):
        return None
    kept, ids = torch.softmax(vals[..., :k], dim=-1), ids[..., :k]
    if config.top_p < 1.0:
        flat_kept, flat_ids = kept.reshape(-1, k), ids.reshape(-1, k)
        kept = torch.stack([_top_p_of_kept(v, i, config.top_p) for v, i in zip(flat_kept, flat_ids)]).reshape(kept.shape)
    out = torch.zeros_like(x)
    out.scatter_(-1, ids, kept)
    return out


def _top_p_of_kept(values: torch.Tensor, ids: torch.Tensor, top_p: float) -> torch.Tensor:
    """Top-p over a row's kept entries (`_top_p_mask`'s rule: descending probability, equal
    ones by ascending id, up to the first whose cumulative mass reaches top_p), renormalised."""
    by_id = torch.argsort(ids)
    order = by_id[torch.sort(-values[by_id], stable=True).indices]
    cumulative = torch.cumsum(values[order], dim=0)
    count = min(1 + int((cumulative < top_p).sum()), len(values))
    out = torch.zeros_like(values)
    out[order[:count]] = values[order[:count]]
    return out / out.sum()


def _top_p_keep(row: torch.Tensor, top_p: float) -> torch.Tensor:
    """The top-p mask of one row, as `_top_p_mask` defines it: the most probable tokens
    (equal probabilities by ascending id) up to and including the first whose cumulative
    mass reaches top_p. Sorts only a growing head of the row (top-k style filters and
    peaked rows need a few hundred entries, not the vocabulary)."""
    vocab = row.shape[0]
    m = min(256, vocab)
    while True:
        head = torch.topk(row, m).values  # descending
        cumulative = torch.cumsum(head, dim=0)
        below = int((cumulative < top_p).sum())
        if below < m or m == vocab:
            break
        m = min(4 * m, vocab)
    count = min(below + 1, vocab)
    cut = head[count - 1]
    keep = row > cut
    need = count - int(keep.sum())
    if need > 0:  # tokens equal to the cut value: the lowest ids first (a stable sort)
        tied = torch.nonzero(row == cut).flatten()[:need]
        keep[tied] = True
    return keep


def sample_from_torch(probs: torch.Tensor, u: float) -> int:
    """`sample_from` for a 1-D tensor: the inverse-CDF draw in token-id order (one sync)."""
    cdf = torch.cumsum(probs, dim=0)
    total = cdf[-1]
    index = torch.searchsorted(cdf, (u * total).reshape(1), right=True)
    index, total = torch.stack([index[0].to(cdf.dtype), total]).tolist()
    if not total > 0:
        raise ValueError("cannot sample from a distribution with zero total mass")
    index = int(index)
    if index >= probs.shape[0]:  # only reachable through rounding at u -> 1
        index = int(torch.nonzero(probs).flatten()[-1])
    return index
