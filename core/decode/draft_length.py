"""`k = "auto"`: the draft length (a chain) or the tree depth (a tree) chosen each round by cost.

Each round the policy picks the length d in 1..k_max that maximises the expected tokens per
second of the round,

    rate(d) = E[accepted + 1](d) / (draft_cost(d) + verify_cost(positions(d)))

(core.cost: E from the per-position survival), from three running estimates:

- verify cost: the time of a target forward over n positions, measured at the start of the run
  (`measure_verify_cost`: a few warm forwards over 1..N positions after the prompt, the same
  `CachedLM.feed` the verify forward runs) and rescaled as the run goes by the ratio of each
  round's measured verify time to the table's (an EMA), so the table keeps its shape and follows
  the context growing, the machine getting busier or a slower device;
- draft cost: the proposer's measured seconds per drafted depth (one draft forward per depth for
  a draft model or head; near zero for prompt lookup), an EMA of draft time / depth;
- acceptance: per depth i the conditional rate P(node i accepted | the first i - 1 were), a Beta
  prior whose mean is the pooled rate over all depths, with counts decayed each round so the
  estimate follows the text (code accepts more than prose). A depth never drafted takes the
  pooled rate, so a policy at short drafts still moves up when acceptance is high.

positions(d) is d + 1 for a chain; for a tree it is the measured mean node count within depth d
plus one (the tree's drafts at full depth tell it; capped drafts refresh the shallower counts).

A dynamic tree with `nodes=auto` also has its width chosen by cost, after it is grown
(`CostPolicy.tree_budget`): the candidates ranked by cumulative draft probability v (EAGLE-2's
order, which keeps every parent before its children), it keeps the first N, N maximising

    rate(N) = (1 + sum of a(v) over the first N) / (draft_cost + verify_cost(N + 1))

where a(v) is the probability that a kept node with value v ends on the accepted path
(`NodeCalibration`: learned from the run's own rounds, starting from EAGLE-2's premise a(v) = v,
which a head's confidence need not meet). The sum is the expected accepted length of the kept
tree, so a sure draft keeps a chain and an unsure one adds the siblings that pay for their
positions.

The length a round drafts is the policy's choice: whatever it is, the round is verified by the
same exact rules, so the output keeps the target's distribution (greedy: equals plain greedy)
for any sequence of lengths chosen from past rounds (tests/core/decode/test_auto_k.py).

Pure apart from `measure_verify_cost` (which runs the target); no Qt, no SQL.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from specscope.core.cost import expected_tokens_from_survival

AUTO = "auto"
AUTO_K_MAX = 8  # the longest chain (deepest tree) `auto` drafts
START_K = 4  # the first rounds' length, before any cost is measured (capped by k_max)
# positions at which the warm forwards time the target (interpolated between, extrapolated past)
MEASURE_POSITIONS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 17, 25, 33, 49, 65)


def is_auto(k: object) -> bool:
    return isinstance(k, str) and k.strip().lower() == AUTO


class VerifyCost:
    """Seconds of one target forward over n positions: a measured table (n -> s) made
    non-decreasing in n (a forward over more positions never costs less: a timing spike at one
    n is averaged with its neighbours, not taken as the shape), linear between its points and
    past its ends, times a scale re-estimated from each round (an EMA of log(measured / table),
    one round's ratio clipped to [1/4, 4] so a single stall does not swing it)."""

    def __init__(self, table: Mapping[int, float], weight: float = 0.2):
        points = sorted((int(n), float(s)) for n, s in table.items())
        if not points or any(n < 1 or not s > 0 or not math.isfinite(s) for n, s in points):
            raise ValueError(f"a verify cost table needs positive times at n >= 1, got {dict(table)!r}")
        self.points = list(zip([n for n, _ in points], _non_decreasing([s for _, s in points]), strict=True))
        self.weight = weight
        self.log_scale = 0.0

    @property
    def scale(self) -> float:
        return math.exp(self.log_scale)

    def base(self, n: float) -> float:
        pts = self.points
        if len(pts) == 1:
            return pts[0][1] * max(n, 1) / pts[0][0] if n > pts[0][0] else pts[0][1]
        if n <= pts[0][0]:
            return pts[0][1]
        for (n0, s0), (n1, s1) in itertools.pairwise(pts):
            if n <= n1:
                return s0 + (s1 - s0) * (n - n0) / (n1 - n0)
        (n0, s0), (n1, s1) = pts[-2], pts[-1]
        return max(s1, s1 + (s1 - s0) * (n - n1) / (n1 - n0))

    def __call__(self, n: float) -> float:
        return self.scale * self.base(n)

    def observe(self, n: int, seconds: float) -> None:
        if seconds > 0 and math.isfinite(seconds):
            step = math.log(seconds / self.base(n)) - self.log_scale
            self.log_scale += self.weight * max(-CLIP, min(CLIP, step))


CLIP = math.log(4.0)  # the most one round moves the verify scale's log, before weighting


def _non_decreasing(values: Sequence[float], weights: Sequence[float] | None = None) -> list[float]:
    """The (weighted) least-squares non-decreasing fit (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, entries]
    for v, w in zip(values, weights if weights is not None else [1.0] * len(values), strict=True):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, w1, n1), (m2, w2, n2) = blocks[-2], blocks[-1]
            blocks[-2:] = [[(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2]]
    return [m for m, _, n in blocks for _ in range(int(n))]


class Acceptance:
    """Per-depth conditional acceptance rates: decayed counts under a Beta prior whose mean is
    the pooled rate (itself under a Beta(prior_mean, prior_strength) prior)."""

    def __init__(self, depth: int, prior_mean: float = 0.6, prior_strength: float = 2.0, decay: float = 0.95):
        self.depth = depth
        self.prior_mean, self.prior_strength, self.decay = prior_mean, prior_strength, decay
        self.tried = [0.0] * depth
        self.accepted = [0.0] * depth

    def pooled(self) -> float:
        tried, accepted = sum(self.tried), sum(self.accepted)
        return (accepted + self.prior_mean * self.prior_strength) / (tried + self.prior_strength)

    def rates(self) -> list[float]:
        pooled = self.pooled()
        return [
            (a + pooled * self.prior_strength) / (t + self.prior_strength)
            for t, a in zip(self.tried, self.accepted, strict=True)
        ]

    def observe(self, drafted_depth: int, accepted: int) -> None:
        """One round: `drafted_depth` depths drafted, the first `accepted` of them accepted."""
        self.tried = [t * self.decay for t in self.tried]
        self.accepted = [a * self.decay for a in self.accepted]
        for i in range(min(drafted_depth, accepted + 1, self.depth)):  # depth i was tried
            self.tried[i] += 1.0
            if i < accepted:
                self.accepted[i] += 1.0


# the bins of a node's cumulative draft probability v that NodeCalibration counts in
CALIBRATION_EDGES = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)


STALE_HOPE = 0.05  # nodes=auto: how fast a depth not grown lately drifts back up to be tried again


class NodeCalibration:
    """a(v): the probability that a kept tree node whose cumulative draft probability is v ends
    on the accepted path. Decayed counts per bin of v (CALIBRATION_EDGES) under a prior at the
    bin's middle, made non-decreasing in v (weighted pool-adjacent-violators), so that ranking
    by v and by a(v) agree."""

    def __init__(self, prior_strength: float = 3.0, decay: float = 0.98):
        self.prior_strength, self.decay = prior_strength, decay
        bins = len(CALIBRATION_EDGES) - 1
        self.prior = [(lo + hi) / 2 for lo, hi in itertools.pairwise(CALIBRATION_EDGES)]
        self.tried = [0.0] * bins
        self.hits = [0.0] * bins
        self._rates: list[float] | None = None

    @staticmethod
    def bin(v: float) -> int:
        return min(max(bisect.bisect_right(CALIBRATION_EDGES, v) - 1, 0), len(CALIBRATION_EDGES) - 2)

    def rates(self) -> list[float]:
        if self._rates is None:
            weights = [t + self.prior_strength for t in self.tried]
            raw = [(h + m * self.prior_strength) / w for h, m, w in zip(self.hits, self.prior, weights, strict=True)]
            self._rates = _non_decreasing(raw, weights)
        return self._rates

    def value(self, v: float) -> float:
        return self.rates()[self.bin(v)] if v > 0 else 0.0

    def observe(self, values: Sequence[float], on_path: Sequence[bool]) -> None:
        """One round's kept nodes: their v and whether each ended on the accepted path."""
        self.tried = [t * self.decay for t in self.tried]
        self.hits = [h * self.decay for h in self.hits]
        for v, hit in zip(values, on_path, strict=True):
            b = self.bin(v)
            self.tried[b] += 1.0
            self.hits[b] += float(hit)
        self._rates = None


@dataclass
class CostPolicy:
    """The `auto` length policy of one run (module docstring)."""

    k_max: int
    verify: VerifyCost
    tree: bool = False
    draft_weight: float = 0.2
    start: int = START_K

    def __post_init__(self) -> None:
        if self.k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {self.k_max}")
        self.acceptance = Acceptance(self.k_max)
        self.draft_s: float | None = None  # seconds per drafted depth
        self.nodes: list[float | None] = [None] * self.k_max  # a tree's mean node count within depth d + 1
        self.chosen: list[int] = []
        self.calibration = NodeCalibration()  # nodes=auto: a(v) of a kept node
        self.budgets: list[int] = []  # nodes=auto: each round's kept node count
        self._kept_values: list[float] | None = None  # the last tree_budget's kept nodes' v, in node order
        self._grown: int | None = None  # the last tree_budget's grown depth (its draft steps)
        self.depth_rates: list[float | None] = [None] * self.k_max  # nodes=auto: best rate by grown depth

    def positions(self, d: int) -> float:
        """Target positions a round of length d verifies: its nodes plus the pending token."""
        if not self.tree:
            return d + 1
        known = self.nodes[d - 1]
        return (known if known is not None else d) + 1

    def expected(self, d: int) -> float:
        return expected_tokens_from_survival(self.acceptance.rates()[:d])

    def rate(self, d: int) -> float:
        """Expected tokens per second of a round of length d."""
        draft = 0.0 if self.draft_s is None else self.draft_s * d
        return self.expected(d) / (draft + self.verify(self.positions(d)))

    def choose(self) -> int:
        """The length to draft this round."""
        if self.draft_s is None:  # nothing measured yet: the first rounds draft `start` deep
            k = min(self.start, self.k_max) if not self.tree else self.k_max
        else:
            k = max(range(1, self.k_max + 1), key=self.rate)
        self.chosen.append(k)
        return k

    def tree_budget(self, scores: Sequence[float], parents: Sequence[int]) -> int:
        """nodes=auto: how many of a grown dynamic tree's candidates to keep (module docstring).
        `scores`: each candidate's cumulative draft log-probability; `parents`: its parent's
        candidate index (-1: the prefix). core.draft.trees.select_dynamic keeps that many.
        The same candidates cut at each shallower depth d tell what a tree grown d deep would
        have given (its draft cost d steps): the rates `tree_depth` chooses the next depth by."""
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))  # select_dynamic's ranking
        if not order:
            return 0
        depths = _depths(parents)
        grown = max(depths)
        step = 0.0 if self.draft_s is None else self.draft_s
        values = [math.exp(scores[i]) if scores[i] > -math.inf else 0.0 for i in order]
        gains = [self.calibration.value(v) for v in values]
        verify = [self.verify(n + 1) for n in range(len(order) + 1)]
        budget = 1
        for d in range(1, grown + 1):
            best, best_rate, expected, n = 0, 0.0, 1.0, 0
            for i, gain in zip(order, gains, strict=True):
                if depths[i] > d:
                    continue
                n += 1
                expected += gain
                rate = expected / (step * d + verify[n])
                if rate > best_rate:
                    best, best_rate = n, rate
            if d <= len(self.depth_rates):
                old = self.depth_rates[d - 1]
                self.depth_rates[d - 1] = best_rate if old is None else old + 0.3 * (best_rate - old)
            budget = max(best, 1)  # at the depth grown: this round's
        # a depth deeper than this round's keeps an old rate: nudge it a little above the best,
        # so that a depth measured badly once (cold timings, an early calibration) is tried again
        known = [r for r in self.depth_rates[:grown] if r is not None]
        if known:
            hope = max(known) * (1 + STALE_HOPE)
            for d in range(grown + 1, len(self.depth_rates) + 1):
                old = self.depth_rates[d - 1]
                if old is not None and old < hope:
                    self.depth_rates[d - 1] = old + STALE_HOPE * (hope - old)
        value_of = dict(zip(order[:budget], values, strict=False))
        self._kept_values = [value_of[i] for i in sorted(order[:budget])]  # in node order, as kept
        self._grown = grown
        self.budgets.append(budget)
        return budget

    def tree_depth(self) -> int:
        """nodes=auto: the depth to grow this round: the best of the depths the past rounds'
        trees measured (an EMA of each depth's best rate), one deeper when the deepest measured
        is the best (so a tree that pays grows until it stops paying); k_max before any."""
        known = [d for d in range(1, self.k_max + 1) if self.depth_rates[d - 1] is not None]
        if not known:
            depth = self.k_max
        else:
            depth = max(known, key=lambda d: (cast(float, self.depth_rates[d - 1]), -d))
            if depth == known[-1] and depth < self.k_max:
                depth += 1
        self.chosen.append(depth)
        return depth

    def observe(
        self,
        parents: Sequence[int],
        accepted: int,
        draft_s: float,
        verify_s: float,
        positions: int,
        costs: bool = True,
        path: Sequence[int] = (),
    ) -> None:
        """One finished round: the draft's parents (its shape), the accepted node count, the
        draft and verify times and the verify forward's positions, and the accepted nodes
        (`path`: what calibrates a nodes=auto tree). `costs=False` (a round whose forwards also
        read the prompt) updates the acceptance only."""
        depths = _depths(parents)
        drafted = max(depths, default=0)
        kept_values, self._kept_values = self._kept_values, None
        grown, self._grown = self._grown, None
        if drafted == 0:
            return  # nothing drafted (a head's prefill round, prompt lookup without a match)
        if kept_values is not None and len(kept_values) == len(parents):
            on_path = set(path)
            self.calibration.observe(kept_values, [i in on_path for i in range(len(parents))])
        self.acceptance.observe(drafted, accepted)
        if self.tree:
            for d in range(1, min(drafted, self.k_max) + 1):
                count = float(sum(1 for x in depths if x <= d))
                old = self.nodes[d - 1]
                self.nodes[d - 1] = count if old is None else old + 0.3 * (count - old)
        if not costs:
            return
        per_depth = max(draft_s, 0.0) / max(drafted, grown or 0)  # a tree's steps: the depth it grew
        self.draft_s = (
            per_depth if self.draft_s is None else self.draft_s + self.draft_weight * (per_depth - self.draft_s)
        )
        self.verify.observe(positions, verify_s)

    def estimates(self) -> dict[str, Any]:
        """What the policy believes now (JSON-friendly)."""
        return {
            "acceptance": [round(r, 4) for r in self.acceptance.rates()],
            "draft_s_per_depth": self.draft_s,
            "verify_scale": round(self.verify.scale, 4),
            "verify_s": {n: self.verify(n) for n in range(1, int(self.positions(self.k_max)) + 1)},
            "chosen": self.chosen[-1] if self.chosen else None,
            "tree_nodes": self.budgets[-1] if self.budgets else None,
            "node_calibration": [round(r, 4) for r in self.calibration.rates()],
        }


def _depths(parents: Sequence[int]) -> list[int]:
    depths: list[int] = []
    for p in parents:
        depths.append(1 if p < 0 else depths[p] + 1)
    return depths


def measure_verify_cost(
    forward: Callable[[int], float], max_positions: int, reps: int = 3, positions: Sequence[int] = MEASURE_POSITIONS
) -> dict[int, float]:
    """n -> the least seconds of `forward(n)` (one target forward over n positions) over `reps`
    calls, at each of `positions` up to `max_positions` (and max_positions itself), after one
    warm call each: timing noise only adds, so the least is the estimate (VerifyCost then
    rescales it by what the rounds measure)."""
    ns = sorted({n for n in positions if n <= max_positions} | {max(1, max_positions)})
    table: dict[int, float] = {}
    for n in ns:
        forward(n)  # warm
        # past LONG_FORWARD positions a forward is long against the timer's noise: one timed call
        table[n] = max(min(forward(n) for _ in range(reps if n <= LONG_FORWARD else 1)), 1e-9)
    return table


LONG_FORWARD = 17  # measure_verify_cost: positions past which one timed call suffices


def target_forward_timer(model: Any, prompt: Sequence[int], use_cache: bool = True) -> Callable[[int], float]:
    """forward(n): seconds of one target forward over n positions after the prompt (at most its
    last 64 tokens), run as the verify forward runs (CachedLM.feed keeping n rows), the cache
    cropped back after each."""
    from specscope.core.decode.kv import CachedLM

    lm = CachedLM(model, use_cache=use_cache)
    prefix = list(prompt)[-64:] or [0]
    filler = (prefix * (1 + 128 // len(prefix)))[:128]
    if use_cache:
        lm.feed(prefix, keep=1)
    base = lm.processed

    def forward(n: int) -> float:
        tokens = (filler * (1 + n // len(filler)))[:n]
        started = lm.stopwatch.now()
        if use_cache:
            lm.feed(tokens, keep=n)
            lm.crop(base)
        else:
            lm.feed(prefix + tokens, keep=n)
        return lm.stopwatch.now() - started

    return forward
