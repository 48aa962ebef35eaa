"""The checker's rule for coupled rounds (core.verify.coupling): the decisions of core.check.walk for
a sampled run whose proposer_params say it was coupled.

The Gumbel keys G_j are regenerated from the recorded coupling seed and each token's output
position, so the round is replayed from the trace alone: node i (output position j =
emitted_before + i) is accepted iff its token is y_j = argmax log p_j + G_j; the repair at
the first rejection is y_j of that node's p (not a residual draw); the bonus is y_{j+n} of
the target's last row. With full vectors every decision is proved (ties within the
tolerance allowed, for float32 storage). With a top-N record the argmax is proved only when
a stored entry beats every unstored one (each unstored entry holds at most the missing
mass); otherwise the rule says what it could not prove.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specscope.core.sampling.partial import known_ids, vector_stats
from specscope.core.verify.coupling import Coupling, coupling_seed_of

_COUPLINGS: dict[int, Coupling] = {}  # one per seed, so that its position cache serves consecutive rounds


def _coupling(seed: int) -> Coupling:
    coupling = _COUPLINGS.get(seed)
    if coupling is None:
        if len(_COUPLINGS) >= 4:
            _COUPLINGS.pop(next(iter(_COUPLINGS)))
        coupling = _COUPLINGS[seed] = Coupling(seed)
    return coupling


def coupled_candidates(dist: Any, gumbel: np.ndarray, tol: float) -> tuple[set[int], bool]:
    """(tokens whose score log p + G is within `tol` of the best known score, whether that
    set is proved to hold the argmax). A full vector always decides; a top-N record decides
    when the best stored score beats log(missing mass) + the largest G of the unstored ids."""
    values = np.asarray(dist, dtype=np.float64)
    ids = known_ids(dist)
    if ids is None:
        ids = np.arange(values.shape[-1])
        unknown_bound = -np.inf
    else:
        stats = vector_stats(dist)
        total = stats.total if stats is not None else 1.0
        missing = max(total - float(values[ids].sum()), 0.0)
        rest = np.ones(values.shape[-1], dtype=bool)
        rest[ids] = False
        unknown_bound = np.log(missing) + float(gumbel[rest].max()) if missing > 0 and rest.any() else -np.inf
    kept = ids[values[ids] > 0]
    if not kept.size:
        return set(), False
    scores = np.log(values[kept]) + gumbel[kept]
    best = float(scores.max())
    candidates = {int(t) for t in kept[scores >= best - tol]}
    return candidates, bool(unknown_bound < best - tol)


def coupling_of(config: Any) -> Coupling | None:
    """The coupling (its Gumbel keys) of a coupled run, for core.check.walk; None for another run."""
    seed = coupling_seed_of(config)
    return None if seed is None or config.sampling.greedy else _coupling(seed)


def coupled_verdict(chk: Any, coupling: Coupling, dist: Any, token: int, position: int) -> bool | None:
    """True: `token` is proved to be the coupled pick; False: proved not to be; None: the
    record cannot tell (noted once in not_checked)."""
    if dist is None:
        chk.not_checked.setdefault("coupled", "a coupled decision has no recorded p")
        return None
    candidates, proved = coupled_candidates(dist, coupling.gumbel(position, len(dist)), chk.tol)
    if proved:
        if token not in candidates:
            return False
        return True if len(candidates) == 1 else None  # a tie within the tolerance decides nothing
    ids = known_ids(dist)
    if ids is not None and token in set(ids.tolist()) and token not in candidates:
        return False
    chk.not_checked.setdefault(
        "coupled",
        "top-N records: a coupled pick y_j is proved only where the stored "
        "entries decide argmax log p + G; some could not be",
    )
    return None


def coupled_pick_text(chk: Any, coupling: Coupling, dist: Any, position: int) -> str:
    gumbel = coupling.gumbel(position, len(dist))
    candidates, proved = coupled_candidates(dist, gumbel, chk.tol)
    picks = ", ".join(str(t) for t in sorted(candidates)) or "none"
    return f"token {picks}" if proved else f"among the stored entries, token {picks}"
