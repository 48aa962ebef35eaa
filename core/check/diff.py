"""Diff two runs of the same prompt: the first divergence in tokens, in p and in caches.

Runs are aligned token by token on the output: the distribution behind output position i
is the p of the node it was accepted or repaired at, or the bonus distribution. Cache
lengths are compared round by round, and only when both runs used caches and proposed
the same way (otherwise their rounds do not correspond).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specscope.core.records import CacheState, Round, RunConfig
from specscope.core.sampling.partial import max_abs_diff


@dataclass(frozen=True)
class Divergence:
    kind: str  # "token" | "p" | "cache" | "length" | "prompt"
    position: int | None  # output position
    round_a: int | None
    round_b: int | None
    message: str

    def __str__(self) -> str:
        where = f"position {self.position}" if self.position is not None else f"round {self.round_a}"
        return f"[{self.kind}] {where}: {self.message}"


@dataclass(frozen=True)
class RunDiff:
    run_a: str
    run_b: str
    compared_tokens: int
    compared_cache_rounds: int
    divergences: tuple[Divergence, ...]

    @property
    def identical(self) -> bool:
        return not self.divergences

    def first(self, kind: str) -> Divergence | None:
        return next((d for d in self.divergences if d.kind == kind), None)


def token_distributions(rounds: Sequence[Round]) -> list[tuple[int, int, np.ndarray | None]]:
    """(round index, token, p behind it) for every output token in order."""
    out = []
    for rnd in rounds:
        for e in rnd.emitted:
            if e.kind == "bonus":
                p = rnd.bonus_p
            elif e.node is not None and 0 <= e.node < len(rnd.nodes):
                p = rnd.nodes[e.node].p
            else:
                p = None
            out.append((rnd.index, e.token, p))
    return out


def _cache_mismatch(which: str, a: CacheState | None, b: CacheState | None) -> str | None:
    if a is None or b is None or (a.before, a.after) == (b.before, b.after):
        return None
    return f"{which} cache {a.before}->{a.after} in A, {b.before}->{b.after} in B"


def diff_runs(
    config_a: RunConfig,
    rounds_a: Sequence[Round],
    config_b: RunConfig,
    rounds_b: Sequence[Round],
    p_tol: float = 1e-4,
) -> RunDiff:
    divergences: list[Divergence] = []
    if tuple(config_a.prompt_ids) != tuple(config_b.prompt_ids):
        divergences.append(Divergence("prompt", None, None, None, "the runs start from different prompts"))
    ta, tb = token_distributions(rounds_a), token_distributions(rounds_b)
    compared = min(len(ta), len(tb))
    p_reported = False
    for i in range(compared):
        (ra, xa, pa), (rb, xb, pb) = ta[i], tb[i]
        if not p_reported and pa is not None and pb is not None and pa.shape == pb.shape:
            d = max_abs_diff(pa, pb)
            if d > p_tol:
                divergences.append(Divergence("p", i, ra, rb, f"target distributions differ by {d:.3g} (> {p_tol:g})"))
                p_reported = True
        if xa != xb:
            divergences.append(Divergence("token", i, ra, rb, f"token {xa} in A, {xb} in B"))
            compared = i
            break
    else:
        if len(ta) != len(tb):
            divergences.append(
                Divergence("length", compared, None, None, f"A emitted {len(ta)} tokens, B emitted {len(tb)}")
            )
    cache_rounds = 0
    same_shape = config_a.proposer == config_b.proposer and config_a.k == config_b.k
    if config_a.use_cache and config_b.use_cache and same_shape:
        for a, b in zip(rounds_a, rounds_b):
            if a.tokens != b.tokens:
                break
            cache_rounds += 1
            mismatch = _cache_mismatch("target", a.target_cache, b.target_cache) or _cache_mismatch(
                "draft", a.draft_cache, b.draft_cache
            )
            if mismatch:
                divergences.append(Divergence("cache", a.emitted_before, a.index, b.index, mismatch))
                break
    return RunDiff(config_a.run_id, config_b.run_id, compared, cache_rounds, tuple(divergences))
