"""Per-round metrics kept in growing numpy buffers (pure: numpy + the core records).

The plots read these buffers with setData; appending a round is O(1) amortised, so a live
run of thousands of rounds never recomputes from scratch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from specscope.core.cost import expected_tokens, expected_tokens_from_survival, speedup
from specscope.core.records import Round

ROLLING_WINDOW = 10


class Buffer:
    """A 1-D float buffer that doubles its capacity; `.view` is the filled part."""

    def __init__(self, capacity: int = 256):
        self._data = np.zeros(capacity, dtype=np.float64)
        self.size = 0

    def append(self, value: float) -> None:
        if self.size == len(self._data):
            grown = np.zeros(2 * len(self._data), dtype=np.float64)
            grown[: self.size] = self._data
            self._data = grown
        self._data[self.size] = value
        self.size += 1

    @property
    def view(self) -> np.ndarray:
        return self._data[: self.size]

    def clear(self) -> None:
        self.size = 0


@dataclass(frozen=True)
class CostEstimate:
    """Cost model next to the measurement (units: one verify forward = 1, i.e. v = 1)."""

    alpha: float  # mean sum min(p, q) over visited positions (acceptance rate when greedy)
    c: float  # draft forward time / verify forward time
    k: int
    expected_alpha: float  # E[tokens/round] from alpha (i.i.d. model)
    expected_positions: float  # E[tokens/round] from the measured per-position rates
    measured: float  # mean accepted length (tokens per round)
    speedup_predicted: float
    speedup_measured: float  # tokens per round * verify time / round time


class RunMetrics:
    FIELDS = (
        "round",
        "drafted",
        "accepted",
        "accepted_length",
        "acceptance",
        "emitted",
        "draft_s",
        "verify_s",
        "bookkeeping_s",
        "total_s",
        "tokens_per_s",
        "cumulative_tokens_per_s",
        "rolling_acceptance",
        "rolling_length",
        "pred_alpha",
        "pred_positions",
        "measured_mean",
    )

    def __init__(self) -> None:
        self.buffers = {name: Buffer() for name in self.FIELDS}
        self.clear()

    def clear(self) -> None:
        for b in self.buffers.values():
            b.clear()
        self.visited = np.zeros(0, dtype=np.int64)  # per draft position (0-based)
        self.accepted_at = np.zeros(0, dtype=np.int64)
        self.length_hist = np.zeros(0, dtype=np.int64)  # index = accepted length
        self.overlap_sum = 0.0
        self.overlap_count = 0
        self.drafted_total = 0
        self.accepted_total = 0
        self.emitted_total = 0
        self.accepted_length_total = 0  # a running sum: the mean is O(1) per round, not O(rounds)
        self.time_total = 0.0
        self.draft_time = 0.0
        self.verify_time = 0.0
        self.draft_forwards = 0
        self.target_forwards = 0
        self.k_max = 0
        self.tree_rounds = 0  # rounds whose draft was a tree (not one chain)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.buffers[name].view

    def __len__(self) -> int:
        return self.buffers["round"].size

    def _grow(self, arr: np.ndarray, size: int) -> np.ndarray:
        if len(arr) >= size:
            return arr
        grown = np.zeros(size, dtype=arr.dtype)
        grown[: len(arr)] = arr
        return grown

    def append(self, r: Round) -> None:
        b = self.buffers
        drafted, accepted = r.drafted, r.accepted
        emitted = len(r.emitted)
        t = r.timings
        self.k_max = max(self.k_max, r.k, drafted)
        if any(n.parent != n.index - 1 for n in r.nodes):
            self.tree_rounds += 1
        self.visited = self._grow(self.visited, max(drafted, 1))
        self.accepted_at = self._grow(self.accepted_at, max(drafted, 1))
        for n in r.nodes:
            if n.status != "unvisited" and n.depth - 1 < len(self.visited):
                self.visited[n.depth - 1] += 1
                if n.status == "accepted":
                    self.accepted_at[n.depth - 1] += 1
            if n.status != "unvisited" and n.overlap is not None:
                self.overlap_sum += n.overlap
                self.overlap_count += 1
        self.length_hist = self._grow(self.length_hist, r.accepted_length + 1)
        self.length_hist[r.accepted_length] += 1
        self.drafted_total += drafted
        self.accepted_total += accepted
        self.emitted_total += emitted
        self.accepted_length_total += r.accepted_length
        self.time_total += t.total_s
        self.draft_time += t.draft_s
        self.verify_time += t.verify_s
        self.draft_forwards += r.draft_forwards
        self.target_forwards += r.target_forwards

        b["round"].append(r.index)
        b["drafted"].append(drafted)
        b["accepted"].append(accepted)
        b["accepted_length"].append(r.accepted_length)
        acc = accepted / drafted if drafted else math.nan
        b["acceptance"].append(acc)
        b["emitted"].append(emitted)
        b["draft_s"].append(t.draft_s)
        b["verify_s"].append(t.verify_s)
        b["bookkeeping_s"].append(t.bookkeeping_s)
        b["total_s"].append(t.total_s)
        b["tokens_per_s"].append(emitted / t.total_s if t.total_s > 0 else math.nan)
        b["cumulative_tokens_per_s"].append(self.emitted_total / self.time_total if self.time_total > 0 else math.nan)
        recent = b["acceptance"].view[-ROLLING_WINDOW:]
        recent = recent[~np.isnan(recent)]
        b["rolling_acceptance"].append(float(recent.mean()) if len(recent) else math.nan)
        b["rolling_length"].append(float(b["accepted_length"].view[-ROLLING_WINDOW:].mean()))
        est = self.cost_estimate()
        b["pred_alpha"].append(est.expected_alpha if est else math.nan)
        b["pred_positions"].append(est.expected_positions if est else math.nan)
        b["measured_mean"].append(est.measured if est else math.nan)

    # ------------------------------------------------------------------ derived

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_total / self.drafted_total if self.drafted_total else 0.0

    @property
    def mean_accepted_length(self) -> float:
        n = len(self)
        return self.accepted_length_total / n if n else 0.0

    def per_position(self) -> np.ndarray:
        """Conditional acceptance rate at each draft position (NaN where never visited); for
        trees, at each depth: accepted / tried nodes of that depth."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.visited > 0, self.accepted_at / np.maximum(self.visited, 1), np.nan)

    def alpha(self) -> float:
        if self.overlap_count:
            return self.overlap_sum / self.overlap_count
        visited = int(self.visited.sum())
        return float(self.accepted_at.sum() / visited) if visited else math.nan

    def cost_estimate(self) -> CostEstimate | None:
        n = len(self)
        if n == 0 or self.k_max == 0:
            return None
        alpha = self.alpha()
        if math.isnan(alpha):
            return None
        alpha = min(max(alpha, 0.0), 1.0)
        k = self.k_max
        rates = [min(max(float(x), 0.0), 1.0) for x in self.per_position() if not math.isnan(x)]
        verify_per_forward = self.verify_time / max(self.target_forwards, 1)
        draft_per_forward = self.draft_time / self.draft_forwards if self.draft_forwards else 0.0
        c = draft_per_forward / verify_per_forward if verify_per_forward > 0 else 0.0
        e_alpha = expected_tokens(alpha, k)
        e_pos = expected_tokens_from_survival(rates)
        measured = self.mean_accepted_length
        sp_pred = speedup(e_alpha, k, c, 1.0)
        mean_round = self.time_total / n
        sp_meas = (self.emitted_total / n) * verify_per_forward / mean_round if mean_round > 0 else math.nan
        return CostEstimate(alpha, c, k, e_alpha, e_pos, measured, sp_pred, sp_meas)
