"""Distributions that may have been rebuilt from a top-N save.

The storage layer returns such arrays with a `partial` attribute, the `known_ids` whose
entries are real and, when the save kept them, the `stats` of the whole vector (support,
smallest entry, sum), which is what the sampler rules of the checker need. Full vectors read
back from a store may carry the same exact `stats` (with `partial` False). core only
duck-types them (it never imports storage). Plain arrays are full.
"""

from __future__ import annotations

from typing import Any, NamedTuple, cast

import numpy as np


class VectorStats(NamedTuple):
    """Facts about a whole distribution vector that a top-N save keeps exactly."""

    support: int  # entries > 0
    minimum: float  # the smallest entry (0 unless every entry is positive; < 0 for a broken vector)
    total: float  # the sum of all entries

    @classmethod
    def of(cls, dist: np.ndarray) -> VectorStats:
        values = np.asarray(dist, dtype=np.float64)
        return cls(int(np.count_nonzero(values > 0)), float(values.min()), float(values.sum()))


def vector_stats(dist: np.ndarray | None) -> VectorStats | None:
    """The whole-vector stats of a distribution: as saved when a store kept them (a partial
    one: None when the save did not; a full vector read back with exact stats, which float32
    storage can differ from), otherwise computed from the values."""
    if dist is None:
        return None
    saved = getattr(dist, "stats", None)
    if saved is not None or getattr(dist, "partial", False):
        return saved
    return VectorStats.of(dist)


def is_full(dist: np.ndarray | None) -> bool:
    return dist is not None and not getattr(dist, "partial", False)


def known_ids(dist: np.ndarray) -> np.ndarray | None:
    """Ids of the real entries of a partial distribution; None for a full one."""
    # a partial one is an ndarray subclass with known_ids (TopDistribution, storage's PartialDistribution)
    return np.asarray(cast(Any, dist).known_ids) if getattr(dist, "partial", False) else None


def entry_known(dist: np.ndarray | None, token: int) -> bool:
    """Whether dist[token] is a real value."""
    if dist is None:
        return False
    ids = known_ids(dist)
    return True if ids is None else bool((ids == token).any())  # np.isin costs ~10x more on these few ids


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    """Largest |a - b| over the entries known in both (0.0 when none are)."""
    ids = None
    for d in (a, b):
        known = known_ids(d)
        if known is not None:
            ids = known if ids is None else np.intersect1d(ids, known)
    a, b = np.asarray(a), np.asarray(b)
    if ids is not None:
        return float(np.abs(a[ids] - b[ids]).max()) if ids.size else 0.0
    return float(np.abs(a - b).max()) if a.size else 0.0
