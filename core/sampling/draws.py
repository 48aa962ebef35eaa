"""Replaying a recorded draw: which token a uniform u selects from a distribution.

specscope's decoder (and the trace format) samples by inverse CDF in token-id order:
token t is selected when CDF(t - 1) <= u * total < CDF(t), CDF summing the entries of ids
0..t (`core.sampling.sample_from`). Given a recorded draw, the emitted token must be the
one it selects.

With the full vector the replay is exact (up to a tolerance for float32 storage). With a
top-N save only the N largest entries and the missing mass m = total - sum(known) are
known, so the replay proves less: the tokens before t hold at least the known entries with
smaller ids (`below`) and at most below + m, so the draw can select t only if
below <= u * total < below + m + p(t). A draw outside that interval is proved wrong; one
inside it is consistent with the stored facts but not proved right.
"""

from __future__ import annotations

import numpy as np

from specscope.core.sampling.partial import known_ids, vector_stats
from specscope.core.sampling.reference import sample_from


def draw_mismatch(dist: np.ndarray, token: int, u: float, tol: float) -> str | None:
    """Why `token` cannot be what draw `u` selects from `dist`; None when it can (or when
    the stored facts cannot tell)."""
    ids = known_ids(dist)
    if ids is None:
        return _full_mismatch(np.asarray(dist, dtype=np.float64), token, u, tol)
    return _partial_mismatch(dist, ids, token, u, tol)


def _full_mismatch(values: np.ndarray, token: int, u: float, tol: float) -> str | None:
    total = float(values.sum())
    if not total > 0 or not 0 <= token < values.shape[-1]:
        return None  # the distribution rules report a vector that is not one
    if values[token] <= 0:
        return f"token {token} has no mass in the distribution the draw u={u:.6g} was taken from"
    x = u * total
    below = float(values[:token].sum())
    slack = tol * max(1.0, total)
    if below - slack <= x < below + float(values[token]) + slack:
        return None
    chosen = sample_from(values, u)
    return (
        f"the recorded draw u={u:.6g} selects token {chosen} (inverse CDF in token-id order), not {token}: "
        f"token {token} covers [{below:.6g}, {below + float(values[token]):.6g}) and u * total = {x:.6g}"
    )


def _partial_mismatch(dist: np.ndarray, ids: np.ndarray, token: int, u: float, tol: float) -> str | None:
    values = np.asarray(dist, dtype=np.float64)[ids]
    stats = vector_stats(dist)
    total = stats.total if stats is not None else 1.0
    missing = max(total - float(values.sum()), 0.0)
    x = u * total
    below = float(values[ids < token].sum())
    own = float(values[ids == token].sum())
    slack = tol * max(1.0, total)
    if x < below - slack:
        return (
            f"the recorded draw u={u:.6g} cannot select token {token}: the stored entries before it already hold "
            f"{below:.6g} > u * total = {x:.6g} (an earlier token is selected)"
        )
    upper = below + missing + own
    if x >= upper + slack:
        return (
            f"the recorded draw u={u:.6g} cannot select token {token}: tokens up to it hold at most {upper:.6g} "
            f"<= u * total = {x:.6g} (a later token is selected)"
        )
    return None
