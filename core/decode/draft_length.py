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

Such a tree's growth is chosen too (`CostPolicy.tree_shape`): its width w (the frontier nodes
expanded per depth and the children each gets, 1..topk; width 1 grows a chain) and its depth.
The candidates cut at each depth d tell what a tree of width w grown d deep keeps (its count and
its 1 + sum of a(v)); the policy keeps EMAs of both per (w, d) (`ShapeEstimate`) and prices them
at choice time with the current verify cost and the width's draft step cost (measured per width:
a wider step expands more rows; never above a wider width's, so one cold round does not condemn
a narrow width). It grows the best, one deeper when the deepest it measured is the best. Every
width is grown once at the start; a shape not measured for n rounds is rated (1 + STALE * n)
times its estimate, so one measured badly is tried again. Where trees do not pay their growth
and verify costs, the run settles on width 1: a chain, chosen by the same measure.

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
FIT_DECAY = 0.95  # the draft cost fit's weight decay a round (about the last 20 rounds)
FIT_SPREAD = 0.2  # the least variance of the fitted rounds' depths that separates fixed from per-depth cost
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


# nodes=auto: a shape not measured for n rounds is rated (1 + STALE * n) times its estimate, so that
# one measured badly (cold timings, an early calibration, a hard stretch of text) is tried again:
# another depth of the width grown soon, another width five times more slowly (a round at the wrong
# width costs more, and the width grown re-measures its shallower depths every round; simulated in
# tests/core/decode/test_draft_length.py)
STALE_DEPTH = 0.005
STALE_WIDTH = 0.001


@dataclass
class ShapeEstimate:
    """nodes=auto: what trees of one (width, depth) kept, as EMAs over the rounds that grew them
    (a deeper tree cut at this depth counts): the expected accepted length 1 + sum a(v) and the
    node count kept. Its rate is priced at choice time with the current step and verify costs."""

    expected: float
    kept: float
    age: int = 0  # rounds with costs since it was last measured


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
    max_width: int = 1  # nodes=auto: the widest growth (the spec's topk)

    def __post_init__(self) -> None:
        if self.k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {self.k_max}")
        if self.max_width < 1:
            raise ValueError(f"max_width must be >= 1, got {self.max_width}")
        self.acceptance = Acceptance(self.k_max)
        self.draft_s: float | None = None  # seconds per drafted depth
        # decayed sums (weight, d, d^2, seconds, d x seconds) of the rounds' draft times by
        # drafted depth d: the fit seconds = fixed + per_depth x d (`draft_cost`)
        self._draft_fit = [0.0] * 5
        self.nodes: list[float | None] = [None] * self.k_max  # a tree's mean node count within depth d + 1
        self.chosen: list[int] = []
        self.calibration = NodeCalibration()  # nodes=auto: a(v) of a kept node
        self.budgets: list[int] = []  # nodes=auto: each round's kept node count
        self._kept_values: list[float] | None = None  # the last tree_budget's kept nodes' v, in node order
        # the last tree_budget's (width, grown depth, candidates' depths and a(v) by rank), for observe
        self._shape_round: tuple[int, int, list[int], list[float]] | None = None
        # nodes=auto: width -> what a tree of that width grown d deep keeps (index d - 1)
        self.shapes: dict[int, list[ShapeEstimate | None]] = {
            w: [None] * self.k_max for w in range(1, self.max_width + 1)
        }
        self.width = self.max_width  # nodes=auto: the width this round grows at (tree_shape)
        self.widths: list[int] = []  # nodes=auto: each round's width
        self.step_s: dict[int, float] = {}  # nodes=auto: seconds per drafted depth, by width

    def positions(self, d: int) -> float:
        """Target positions a round of length d verifies: its nodes plus the pending token."""
        if not self.tree:
            return d + 1
        known = self.nodes[d - 1]
        return (known if known is not None else d) + 1

    def expected(self, d: int) -> float:
        return expected_tokens_from_survival(self.acceptance.rates()[:d])

    def draft_cost(self, d: int) -> float:
        """Seconds of a round that drafts d deep: a fixed part (a head first reads the accepted
        tokens' features, whatever d is) plus a part per depth, fitted by decayed least squares
        over the rounds once their depths differ enough to tell the two apart; before that, d
        times the per-depth cost. Charging the fixed part per depth made short rounds measure a
        dear per-depth cost and so every longer draft look dearer than it is (BENCHMARKS.md,
        session 29)."""
        if self.draft_s is None:
            return 0.0
        w, sd, sdd, st, sdt = self._draft_fit
        if w > 0:
            mean_d, mean_t = sd / w, st / w
            spread = sdd / w - mean_d * mean_d
            if spread > FIT_SPREAD:
                per_depth = (sdt / w - mean_d * mean_t) / spread
                fixed = mean_t - per_depth * mean_d
                if per_depth >= 0 and fixed >= 0:
                    return fixed + per_depth * d
        return self.draft_s * d

    def rate(self, d: int) -> float:
        """Expected tokens per second of a round of length d."""
        draft = self.draft_cost(d)
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
        The same candidates cut at each shallower depth d tell what a tree of this round's width
        grown d deep would have given (its draft cost d steps at this width): the rates
        `tree_shape` chooses the next round's width and depth by."""
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))  # select_dynamic's ranking
        if not order:
            return 0
        depths = _depths(parents)
        ranked_depths = [depths[i] for i in order]
        grown, width = max(depths), self.width
        step = self.step(width)
        values = [math.exp(scores[i]) if scores[i] > -math.inf else 0.0 for i in order]
        gains = [self.calibration.value(v) for v in values]
        budget = max(self._best_counts(ranked_depths, gains, step, grown)[-1][0], 1)  # at the depth grown
        value_of = dict(zip(order[:budget], values, strict=False))
        self._kept_values = [value_of[i] for i in sorted(order[:budget])]  # in node order, as kept
        self._shape_round = (width, grown, ranked_depths, gains)  # rated in observe, once its cost is known
        self.budgets.append(budget)
        return budget

    def _best_counts(
        self, ranked_depths: Sequence[int], gains: Sequence[float], step: float, grown: int
    ) -> list[tuple[int, float]]:
        """For each depth d in 1..grown: (N, expected), the count of the best-ranked candidates
        within depth d that maximises the expected tokens per second (a draft step costing
        `step` seconds, d of them), and their expected accepted length 1 + sum a(v)."""
        verify = [self.verify(n + 1) for n in range(len(gains) + 1)]
        out = []
        for d in range(1, grown + 1):
            best, best_rate, best_expected, expected, n = 0, 0.0, 1.0, 1.0, 0
            for depth, gain in zip(ranked_depths, gains, strict=True):
                if depth > d:
                    continue
                n += 1
                expected += gain
                rate = expected / (step * d + verify[n])
                if rate > best_rate:
                    best, best_rate, best_expected = n, rate, expected
            out.append((best, best_expected))
        return out

    def _measure_shape(self, width: int, grown: int, ranked_depths: Sequence[int], gains: Sequence[float]) -> None:
        """A nodes=auto round's tree, cut at each depth: what each (width, depth <= grown) keeps."""
        row = self.shapes[width]
        for shapes in self.shapes.values():
            for estimate in shapes:
                if estimate is not None:
                    estimate.age += 1
        for d, (kept, expected) in enumerate(self._best_counts(ranked_depths, gains, self.step(width), grown), start=1):
            if d <= len(row):
                old = row[d - 1]
                if old is None:
                    row[d - 1] = ShapeEstimate(expected, float(kept))
                else:
                    old.expected += 0.3 * (expected - old.expected)
                    old.kept += 0.3 * (kept - old.kept)
                    old.age = 0

    def step(self, width: int) -> float:
        """Seconds of one draft step at `width`: its measured EMA, at most a wider width's (a
        wider step never costs less: a narrower one measured on a cold or busy round is not
        kept dearer than a wider one); before any, the pooled per-depth draft cost."""
        known = [s for w, s in self.step_s.items() if w >= width]
        if known:
            return min(known)
        return 0.0 if self.draft_s is None else self.draft_s

    def shape_rate(self, width: int, depth: int) -> float | None:
        """Expected tokens per second of a tree of `width` grown `depth` deep (None: never
        measured), at the current step and verify costs."""
        estimate = self.shapes[width][depth - 1]
        if estimate is None:
            return None
        return estimate.expected / (self.step(width) * depth + self.verify(estimate.kept + 1))

    def tree_shape(self) -> tuple[int, int]:
        """nodes=auto: (depth, width) to grow this round. The first round grows the widest tree
        k_max deep, then each narrower width once (width 1 first: a chain), k_max deep; from then
        on the best (width, depth) the past rounds measured (`shape_rate` at the current costs,
        times the staleness factor; ties to the narrower, then the shallower), one deeper when
        the deepest measured at that width is the best (so a tree that pays grows until it stops
        paying)."""
        untried = [w for w, shapes in self.shapes.items() if all(e is None for e in shapes)]
        if len(untried) == len(self.shapes):
            width, depth = self.max_width, self.k_max
        elif untried:
            width, depth = min(untried), self.k_max
        else:
            scored = []
            for w, shapes in self.shapes.items():
                stale = STALE_DEPTH if w == self.width else STALE_WIDTH
                for d, estimate in enumerate(shapes, start=1):
                    if estimate is not None:
                        rate = cast(float, self.shape_rate(w, d)) * (1 + stale * estimate.age)
                        scored.append((rate, -w, -d, w, d))
            *_, width, depth = max(scored)
            deepest = max(d for d, estimate in enumerate(self.shapes[width], start=1) if estimate is not None)
            if depth == deepest and depth < self.k_max:
                depth += 1
        self.width = width
        self.chosen.append(depth)
        self.widths.append(width)
        return depth, width

    def tree_width(self) -> int:
        """nodes=auto: the width this round grows at (core.draft.tree_draft.grow_dynamic asks)."""
        return self.width

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
        shape_round, self._shape_round = self._shape_round, None
        grown = shape_round[1] if shape_round is not None else None
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
        depth = max(drafted, grown or 0)  # a tree's steps: the depth it grew
        per_depth = max(draft_s, 0.0) / depth
        self._draft_fit = [x * FIT_DECAY for x in self._draft_fit]
        for i, x in enumerate((1.0, depth, depth * depth, max(draft_s, 0.0), depth * max(draft_s, 0.0))):
            self._draft_fit[i] += x
        self.draft_s = (
            per_depth if self.draft_s is None else self.draft_s + self.draft_weight * (per_depth - self.draft_s)
        )
        if shape_round is not None:  # nodes=auto: a wider step costs more, so each width has its own
            width = shape_round[0]
            old = self.step_s.get(width)
            self.step_s[width] = per_depth if old is None else old + self.draft_weight * (per_depth - old)
            self._measure_shape(*shape_round)
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
            "tree_width": self.widths[-1] if self.widths else None,
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
