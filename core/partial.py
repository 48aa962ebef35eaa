"""Distributions that may have been rebuilt from a top-N save.

The storage layer returns such arrays with a `partial` attribute and the `known_ids` whose
entries are real; core only duck-types them (it never imports storage). Plain arrays are
full.
"""

from __future__ import annotations

import numpy as np


def is_full(dist: np.ndarray | None) -> bool:
    return dist is not None and not getattr(dist, "partial", False)


def known_ids(dist: np.ndarray) -> np.ndarray | None:
    """Ids of the real entries of a partial distribution; None for a full one."""
    return np.asarray(getattr(dist, "known_ids")) if getattr(dist, "partial", False) else None


def entry_known(dist: np.ndarray | None, token: int) -> bool:
    """Whether dist[token] is a real value."""
    if dist is None:
        return False
    ids = known_ids(dist)
    return True if ids is None else bool(np.isin(token, ids))


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
