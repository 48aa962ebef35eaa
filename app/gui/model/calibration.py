"""The calibration view's numbers (pure: numpy + the core records; no Qt).

Two questions about a run's proposer:

- Is its confidence calibrated? Each draft node records the proposer's own probability for
  its token (DraftNode.confidence: the untransformed softmax at temperature 1, greedy runs
  too). A reliability curve bins the nodes the verifier reached (accepted or rejected; an
  unvisited node was never tested) by confidence and sets each bin's mean confidence
  against the fraction of its nodes accepted, per depth and over all depths.
- Does a draft head accept as often as its training said? Acceptance by depth is the
  conditional rate, accepted / reached nodes at that depth (the live plots' per-position
  acceptance). A head trained by training/train_head.py records its held-out accuracy by
  depth in its config.json (`specscope.accuracy_by_depth`: head argmax = target argmax at
  depth d, the tokens before it correct, which is what reaching depth d means in serving).
  A greedy run is compared with the record of the target's own greedy continuations
  (`specscope.heldout.greedy`, the contexts a greedy run drafts on) when the config has it, or
  a chat head's greedy answers per prompt kind pooled (`greedy-chat`, `greedy-summary`,
  `greedy-code`), any other run with the headline record (all held-out sets). A chat head's
  record written before train_head.py labelled the answer's positions only (no
  `specscope.labels` = "answers") also counted the prompt's, which the head memorises and
  serving never drafts: the verdict says it overstates (issue 41). A depth whose realised rate
  lies far below it is a train/serve mismatch (the head is not served what it was trained
  on: fault `head-feature-shift` shows what that looks like) or a prompt unlike its data.

`CalibrationTally` accumulates round by round (a live run appends; nothing is recomputed
from the start); `head_reference(config)` reads the head's training record without torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specscope.core.records import Round, RunConfig

BINS = 10  # equal-width confidence bins over [0, 1]
MAX_DEPTH_CURVES = 4  # depths with a reliability curve of their own; deeper nodes join the last
FAR_BELOW = 0.10  # a depth's acceptance this far below the training accuracy (and 2 standard errors) is flagged
MIN_REACHED = 8  # nodes a depth needs before it is judged against the training accuracy


@dataclass(frozen=True)
class ReliabilityCurve:
    """One curve: per non-empty bin, its mean confidence, the fraction accepted and the count."""

    label: str  # "all depths", "depth 1", ..., "depth 4+"
    depth: int  # 0 for all depths; the last depth row takes every deeper node
    confidence: np.ndarray
    accepted: np.ndarray
    counts: np.ndarray

    @property
    def nodes(self) -> int:
        return int(self.counts.sum())

    def calibration_error(self) -> float:
        """Expected calibration error: the count-weighted mean |confidence - accepted|."""
        if not self.nodes:
            return math.nan
        return float((self.counts * np.abs(self.confidence - self.accepted)).sum() / self.counts.sum())


@dataclass(frozen=True)
class HeadReference:
    """What the run's proposer was trained to: accuracy by depth, or why there is none."""

    accuracy: tuple[float, ...] | None
    source: str  # the config.json it came from ("" when none)
    why_none: str  # when accuracy is None: one sentence for the view
    label: str = ""  # which record: "held-out greedy" (the target's greedy continuations) or "held-out, all sets"
    caveat: str = ""  # a record that is known to overstate what serving can accept: one sentence why


@dataclass(frozen=True)
class Shortfall:
    depth: int
    realised: float
    training: float
    reached: int

    def sentence(self) -> str:
        return (
            f"depth {self.depth}: accepted {self.realised:.2f} of the time, trained to {self.training:.2f} "
            f"({self.reached} nodes reached)"
        )


@dataclass(frozen=True)
class Calibration:
    """A run's calibration, as the view draws it."""

    rounds: int
    reached: int  # nodes the verifier reached (accepted or rejected)
    with_confidence: int  # of those, nodes that recorded a confidence
    curves: tuple[ReliabilityCurve, ...]  # "all depths" first, then by depth; only non-empty ones
    depth_reached: np.ndarray  # index d - 1: nodes reached at depth d
    depth_accepted: np.ndarray
    reference: HeadReference
    shortfalls: tuple[Shortfall, ...]  # depths far below the training accuracy

    @property
    def acceptance_by_depth(self) -> np.ndarray:
        """accepted / reached per depth (NaN where none was reached)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.depth_reached > 0, self.depth_accepted / np.maximum(self.depth_reached, 1), np.nan)

    @property
    def empty(self) -> bool:
        return self.reached == 0

    def verdict(self) -> str:
        """One or two sentences under the plots: the mismatch, or why there is no reference."""
        if self.empty:
            return ""
        if self.reference.accuracy is None:
            return self.reference.why_none
        caveat = f" {self.reference.caveat}" if self.reference.caveat else ""
        if self.shortfalls:
            where = "; ".join(s.sentence() for s in self.shortfalls)
            return (
                f"Far below the head's training accuracy ({self.reference.label}) at {where}. The output "
                f"stays exact (the verifier sees to that): this is wasted drafting, a train/serve mismatch "
                f"(the head is not served the features, target or tokenizer it was trained with) or a "
                f"prompt unlike its training data.{caveat}"
            )
        judged = int((self.depth_reached[: len(self.reference.accuracy)] >= MIN_REACHED).sum())
        if not judged:
            return f"Too few nodes reached yet (fewer than {MIN_REACHED} at every depth) to compare with training."
        return (
            f"Acceptance by depth is not far below the head's training accuracy ({self.reference.label}, "
            f"{Path(self.reference.source).parent.name}).{caveat}"
        )


class CalibrationTally:
    """Counts accumulated round by round: per depth and confidence bin, nodes reached, nodes
    accepted and the sum of their confidences; per depth, nodes reached and accepted."""

    def __init__(self) -> None:
        self.rounds = 0
        self.reached = 0
        self.with_confidence = 0
        self.depth_reached = np.zeros(0, dtype=np.int64)
        self.depth_accepted = np.zeros(0, dtype=np.int64)
        # rows: depth 1 .. MAX_DEPTH_CURVES (the last row takes every deeper node)
        self.bin_counts = np.zeros((MAX_DEPTH_CURVES, BINS), dtype=np.int64)
        self.bin_accepted = np.zeros((MAX_DEPTH_CURVES, BINS), dtype=np.int64)
        self.bin_confidence = np.zeros((MAX_DEPTH_CURVES, BINS), dtype=np.float64)

    def add(self, r: Round) -> None:
        self.rounds += 1
        for n in r.nodes:
            if n.status == "unvisited":
                continue
            ok = n.status == "accepted"
            self.reached += 1
            if n.depth > len(self.depth_reached):
                grow = n.depth - len(self.depth_reached)
                self.depth_reached = np.concatenate([self.depth_reached, np.zeros(grow, dtype=np.int64)])
                self.depth_accepted = np.concatenate([self.depth_accepted, np.zeros(grow, dtype=np.int64)])
            self.depth_reached[n.depth - 1] += 1
            self.depth_accepted[n.depth - 1] += ok
            c = n.confidence
            if c is None or not math.isfinite(c):
                continue
            self.with_confidence += 1
            row, b = min(n.depth, MAX_DEPTH_CURVES) - 1, min(int(c * BINS), BINS - 1)
            self.bin_counts[row, b] += 1
            self.bin_accepted[row, b] += ok
            self.bin_confidence[row, b] += c

    def extend(self, rounds: Iterable[Round]) -> None:
        for r in rounds:
            self.add(r)

    def curves(self) -> tuple[ReliabilityCurve, ...]:
        rows = [("all depths", 0, self.bin_counts.sum(0), self.bin_accepted.sum(0), self.bin_confidence.sum(0))]
        for d in range(MAX_DEPTH_CURVES):
            deeper = d == MAX_DEPTH_CURVES - 1 and len(self.depth_reached) > MAX_DEPTH_CURVES
            rows.append(
                (
                    f"depth {d + 1}{'+' if deeper else ''}",
                    d + 1,
                    self.bin_counts[d],
                    self.bin_accepted[d],
                    self.bin_confidence[d],
                )
            )
        out = []
        for label, depth, counts, accepted, conf in rows:
            kept = counts > 0
            if kept.any():
                n = counts[kept]
                out.append(ReliabilityCurve(label, depth, conf[kept] / n, accepted[kept] / n, n.copy()))
        return tuple(out)

    def result(self, reference: HeadReference) -> Calibration:
        calibration = Calibration(
            rounds=self.rounds,
            reached=self.reached,
            with_confidence=self.with_confidence,
            curves=self.curves(),
            depth_reached=self.depth_reached.copy(),
            depth_accepted=self.depth_accepted.copy(),
            reference=reference,
            shortfalls=(),
        )
        return _with_shortfalls(calibration)


def _with_shortfalls(c: Calibration) -> Calibration:
    if c.reference.accuracy is None:
        return c
    rates = c.acceptance_by_depth
    found = []
    for d, trained in enumerate(c.reference.accuracy):
        if d >= len(rates) or c.depth_reached[d] < MIN_REACHED:
            continue
        realised, n = float(rates[d]), int(c.depth_reached[d])
        spread = math.sqrt(max(trained * (1 - trained), 1e-6) / n)  # the training rate's sampling spread at n nodes
        if trained - realised > max(FAR_BELOW, 2 * spread):
            found.append(Shortfall(d + 1, realised, float(trained), n))
    return Calibration(**{**c.__dict__, "shortfalls": tuple(found)})


def calibration_of(rounds: Iterable[Round], config: RunConfig | None) -> Calibration:
    """A finished run's calibration, in one pass."""
    tally = CalibrationTally()
    tally.extend(rounds)
    return tally.result(head_reference(config))


# ---------------------------------------------------------------------------- the head's training record


def head_folder_of(config: RunConfig) -> Path | None:
    """The checkpoint folder of a run's draft head (its `head` parameter: a folder, or
    "bundled:NAME" for a head specscope ships); None when the proposer is not a head."""
    label = (config.proposer_params or {}).get("head")
    if not isinstance(label, str) or not label:
        return None
    if label.startswith("bundled:"):
        from specscope.core.loading.models import models_dir  # imports no torch

        return models_dir() / label.split(":", 1)[1]
    return Path(label).expanduser()


def head_reference(config: RunConfig | None) -> HeadReference:
    """The accuracy by depth the run's head was trained to, read from its config.json, or
    why there is none (the proposer is no head; the folder is not here; no record)."""
    if config is None:
        return HeadReference(None, "", "No run.")
    folder = head_folder_of(config)
    if folder is None:
        kind = {"draft": "a draft model", "lookup": "prompt lookup"}.get(
            config.proposer, config.proposer or "the proposer"
        )
        return HeadReference(
            None,
            "",
            f"Only the realised acceptance is shown: the run's proposer ({kind}) is not "
            f"a draft head, so there is no training accuracy to compare with.",
        )
    file = folder / "config.json"
    try:
        import json

        raw: Any = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        why = "is not on this machine" if isinstance(exc, OSError) else "is not valid JSON"
        return HeadReference(None, "", f"Only the realised acceptance is shown: the head's config {file} {why}.")
    record = raw.get("specscope") if isinstance(raw, dict) else None
    record = record if isinstance(record, dict) else raw if isinstance(raw, dict) else {}
    heldout = record.get("heldout") if isinstance(record.get("heldout"), dict) else {}
    caveat = _prompt_positions_caveat(record, heldout)
    greedy = heldout.get("greedy")
    if config.sampling.greedy and isinstance(greedy, dict) and _accuracies(greedy.get("accuracy_by_depth")):
        return HeadReference(_accuracies(greedy["accuracy_by_depth"]), str(file), "", "held-out greedy", caveat)
    answers = _pooled_greedy_answers(heldout)
    if config.sampling.greedy and answers is not None:
        return HeadReference(answers, str(file), "", "held-out greedy answers", caveat)
    accuracy = _accuracies(record.get("accuracy_by_depth"))
    if accuracy is None:
        return HeadReference(
            None,
            str(file),
            f"Only the realised acceptance is shown: the head's config.json "
            f"({folder.name}) records no accuracy_by_depth (training/train_head.py "
            f"writes one).",
        )
    return HeadReference(accuracy, str(file), "", "held-out, all sets", caveat)


def _pooled_greedy_answers(heldout: dict) -> tuple[float, ...] | None:
    """A chat head's greedy answers per prompt kind (greedy-chat, greedy-summary, greedy-code),
    pooled by their label positions: the contexts a greedy run drafts on."""
    sets = [
        (acc, v.get("positions"))
        for name, v in heldout.items()
        if name.startswith("greedy-") and isinstance(v, dict)
        for acc in [_accuracies(v.get("accuracy_by_depth"))]
        if acc is not None and isinstance(v.get("positions"), int) and v["positions"] > 0
    ]
    if not sets or len({len(a) for a, _ in sets}) != 1:
        return None
    total = sum(n for _, n in sets)
    return tuple(sum(a[d] * n for a, n in sets) / total for d in range(len(sets[0][0])))


def _prompt_positions_caveat(record: dict, heldout: dict) -> str:
    """A chat head's record written before training/train_head.py counted the answer's positions
    only (issue 41) also counted the prompt's: say so, it overstates what serving accepts."""
    chat = any(isinstance(name, str) and name.startswith("greedy-") for name in heldout)
    if not chat or record.get("labels") == "answers":
        return ""
    return (
        "This head's record also counted the prompt's positions (the chat template and system turn, "
        "which the head memorises and serving never drafts), so it overstates what serving can accept; "
        "training/train_head.py now counts the answer's positions only."
    )


def _accuracies(value: Any) -> tuple[float, ...] | None:
    if isinstance(value, list) and value and all(isinstance(a, (int, float)) and 0 <= a <= 1 for a in value):
        return tuple(float(a) for a in value)
    return None
