"""The compare session: the same prompt, target and sampler with two proposers. No widgets:
it drives a RunController with two lanes, fills two RunModels and keeps the summary and the
first divergence (compare.CompareWidget shows them)."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QObject, Signal

from specscope.app.gui import theme
from specscope.app.gui.model.runmodel import RunModel, first_divergence
from .hub import PlainCost
from specscope.app.gui.model.settings import RunSettings, proposer_label
from specscope.app.gui.model.traces import Recorder, RecorderFactory
from .worker import RunController

SUMMARY_ROWS = (
    ("proposer", "proposer"),
    ("mean_accepted_length", "mean accepted length"),
    ("acceptance_rate", "acceptance rate"),
    ("rounds", "rounds"),
    ("new_tokens", "new tokens"),
    ("target_passes", "target forward passes"),
    ("draft_passes", "draft forward passes"),
    ("decode_s", "decoding time (s)"),
    ("tokens_per_s", "tokens / s"),
    ("speedup", "speedup over plain decoding"),
    ("stop", "stop reason"),
    ("reference", "vs plain greedy"),
)

CHECKING = "checking"  # a lane's reference comparison queued on the worker


def reference_text(result: Any) -> tuple[str, str]:
    """A lane's reference cell and its tooltip: the comparison with plain greedy decoding
    (core.check.diverge.Divergence), the error's text, CHECKING, or None (not compared)."""
    if result is None:
        return "—", "Compared with plain greedy decoding after a greedy live comparison"
    if result == CHECKING:
        return "checking…", "Decoding the prompt plainly with the target"
    if isinstance(result, str):
        return "failed", f"The comparison with plain greedy decoding failed: {result}"
    full = "\n".join(result.lines())
    if result.identical:
        return "identical", full
    kind = "near tie" if result.verdict == "near tie" else "LOGIC BUG"
    return f"{kind} at token {result.position} (round {result.round})", full


@dataclass(frozen=True)
class LaneSettings(RunSettings):
    """A compare lane's settings: the run panel's, the side's proposer and k, and the coupling
    seed of coupled lanes (RunSettings.coupling_seed, core.coupling; None = uncoupled)."""

    def describe(self) -> str:
        return super().describe() + ("" if self.coupling_seed is None else f", coupled (seed {self.coupling_seed})")


def lanes_coupled(configs: Any) -> bool:
    """Whether both lanes' runs were coupled with the same seed (their RunConfigs say so)."""
    from specscope.core.verify.coupling import coupling_seed_of

    seeds = [coupling_seed_of(c) if c is not None else None for c in configs]
    return seeds[0] is not None and len(set(seeds)) == 1


class CompareRecorderFactory(RecorderFactory):
    """Records a comparison's two lanes as one comparison of two runs: each run's `extra`
    names the comparison and its lane (the worker prepares lane A, then lane B)."""

    def __init__(self, store_path: str | None):
        super().__init__(store_path)
        self.comparison: str | None = None
        self.next_lane = 0

    def begin(self, prompt: str, coupling_seed: int | None = None) -> str:
        self.comparison = uuid.uuid4().hex
        self.next_lane = 0
        self.prompt_text = prompt
        self.coupling_seed = coupling_seed
        return self.comparison

    def __call__(self, config) -> Recorder:
        lane, self.next_lane = self.next_lane, self.next_lane + 1
        extra = {"comparison": self.comparison, "lane": "AB"[min(lane, 1)]}
        if getattr(self, "coupling_seed", None) is not None:
            extra["coupled"] = self.coupling_seed  # the comparison was run with coupled lanes
        return Recorder(self.open_store(), config, prompt_text=self.prompt_text, extra=extra,
                        full_vectors=True if self.full_vectors else None)


def comparison_of(info: Any) -> tuple[str, str] | None:
    """(comparison id, lane) of a stored run recorded by compare mode, else None."""
    extra = getattr(info, "extra", None) or {}
    if extra.get("comparison") and extra.get("lane") in ("A", "B"):
        return str(extra["comparison"]), str(extra["lane"])
    return None


@dataclass
class SideResult:
    stop_reason: str | None = None
    wall_s: float | None = None


class CompareSession(QObject):
    """Two lanes of one worker; fills models[0] and models[1]."""

    changed = Signal()
    divergence = Signal(object)  # output position or None
    failed = Signal(str, str)
    stateChanged = Signal(str)

    def __init__(self, controller: RunController, parent=None, recording: CompareRecorderFactory | None = None):
        super().__init__(parent)
        self.controller = controller
        self.recording = recording  # the factory the controller's worker records with, or None
        self.source = "live"  # or the trace store the lanes were read from
        self.models = (RunModel(self), RunModel(self))
        self.settings: tuple[RunSettings, RunSettings] | None = None
        self.results = [SideResult(), SideResult()]
        self.plain: PlainCost | None = None  # plain decoding of the target, measured before the run
        self.references: list[Any] = [None, None]  # per lane: reference_text's input
        self.first_divergence: int | None = None
        w = controller.worker
        w.prepared.connect(self._on_prepared)
        w.roundReady.connect(self._on_round)
        w.laneFinished.connect(self._on_lane_finished)
        w.baseline.connect(self._on_baseline)
        w.referenced.connect(self._on_referenced)
        w.failed.connect(self.failed)
        w.refused.connect(self._on_refused)
        w.stateChanged.connect(self.stateChanged)

    def _on_refused(self, errors: dict) -> None:
        """A lane's settings cannot run with its models (core.decode.factory: the position limit)."""
        self.failed.emit("Cannot compare: " + "; ".join(errors.values()), "")

    def start(self, a: RunSettings, b: RunSettings) -> None:
        self.settings = (a, b)
        self.source = "live"
        if self.recording is not None:
            self.recording.begin(a.prompt, getattr(a, "coupling_seed", None))
        self.results = [SideResult(), SideResult()]
        self.plain = None
        self.references = [None, None]
        self.first_divergence = None
        for m in self.models:
            m.clear()
        self.controller.start([a, b], run=True, measure_baseline=True)

    def stop(self) -> None:
        self.controller.stop()

    def load(self, lanes: list[tuple[Any, list, Any]], source: str) -> None:
        """Show two stored runs side by side: per lane (RunInfo, rounds, token_text)."""
        self.controller.stop()
        self.settings = None
        self.source = source
        self.plain = None
        self.references = [None, None]
        self.results = []
        for side, (info, rounds, token_text) in enumerate(lanes):
            m = self.models[side]
            m.begin(info.config, token_text, source=source, label=f"{'AB'[side]}: {info.run_id[:8]}")
            m.extend(rounds)
            reason = info.stop_reason or info.status
            m.finish(reason, info.wall_s)
            self.results.append(SideResult(reason, info.wall_s))
        a, b = (m.output_tokens for m in self.models)
        self.first_divergence = first_divergence(a, b)
        self.divergence.emit(self.first_divergence)
        self.changed.emit()

    @property
    def coupled(self) -> bool:
        """Whether the lanes shown were coupled (core.coupling), live or loaded from a store."""
        if self.settings:
            return getattr(self.settings[0], "coupling_seed", None) is not None
        return lanes_coupled([m.config for m in self.models])

    @property
    def running(self) -> bool:
        """Whether lanes are being prepared, decoded or stopped."""
        return self.controller.busy

    def _on_prepared(self, lane: int, config, token_text, label: str) -> None:
        self.models[lane].begin(config, token_text, source="compare", label=label)

    def _on_round(self, lane: int, rnd) -> None:
        cfg = self.models[lane].config
        if cfg is None or rnd.run_id != cfg.run_id:
            return  # a round of a cancelled comparison
        self.models[lane].append(rnd)
        a, b = (m.output_tokens for m in self.models)
        div = first_divergence(a, b)
        if div != self.first_divergence:
            self.first_divergence = div
            self.divergence.emit(div)
        self.changed.emit()

    def _on_lane_finished(self, lane: int, reason: str, wall: float, result) -> None:
        self.results[lane] = SideResult(reason, wall)
        self.models[lane].finish(reason, wall)
        self._ask_reference()
        self.changed.emit()

    def _ask_reference(self) -> None:
        """Once both lanes of a greedy live comparison are done, the worker compares each
        with plain greedy decoding (a cancelled lane has no whole output to compare)."""
        if not self.settings or not all(s.greedy for s in self.settings) or any(self.references):
            return
        if not all(r.stop_reason and r.stop_reason != "cancelled" for r in self.results):
            return
        lanes = []
        for lane, (settings, m) in enumerate(zip(self.settings, self.models)):
            if m.config is None:
                return
            lanes.append((lane, settings, m.config, [m.full_round(i) for i in range(len(m.rounds))]))
        self.references = [CHECKING, CHECKING]
        self.controller.reference(lanes)

    def _on_referenced(self, lane: int, result: Any) -> None:
        cfg = self.models[lane].config
        if self.references[lane] != CHECKING or (hasattr(result, "run_id") and cfg is not None
                                                  and result.run_id != cfg.run_id):
            return  # a comparison started since
        self.references[lane] = result
        self.changed.emit()

    def _on_baseline(self, plain: PlainCost) -> None:
        self.plain = plain
        self.changed.emit()

    # ------------------------------------------------------------------ summary

    def summary(self, lane: int) -> dict[str, str]:
        m = self.models[lane]
        met = m.metrics
        res = self.results[lane]
        # The lane's own rounds (draft + verify + bookkeeping), not the wall time from its
        # start to its end: the two lanes run interleaved on one worker, so each lane's wall
        # time also holds the other lane's rounds, the recording and the window's updates.
        decode = met.time_total
        tps = met.emitted_total / decode if decode else math.nan
        speed = (self.plain.total_s(met.emitted_total) / decode
                 if self.plain is not None and decode and met.emitted_total else math.nan)
        s = self.settings[lane] if self.settings else None
        cfg = m.config
        stored = f"{m.label} · {cfg.draft_name or cfg.proposer}, k={cfg.k}" if cfg is not None else m.label
        return {
            "proposer": ((f"{'transformers: ' if s.engine == 'transformers' else ''}{proposer_label(s.proposer)}, "
                          f"k={s.k}") if s else stored),
            "mean_accepted_length": f"{met.mean_accepted_length:.3f}",
            "acceptance_rate": f"{met.acceptance_rate:.3f}",
            "rounds": str(len(met)),
            "new_tokens": str(met.emitted_total),
            "target_passes": str(met.target_forwards),
            "draft_passes": str(met.draft_forwards),
            "decode_s": f"{decode:.3f}" if decode else "—",
            "tokens_per_s": f"{tps:.1f}" if not math.isnan(tps) else "—",
            "speedup": f"{speed:.2f}×" if not math.isnan(speed) else "—",
            "stop": res.stop_reason or ("running" if len(met) else "—"),
            "reference": reference_text(self.references[lane])[0],
        }

    def status_words(self) -> str:
        """The status bar's words for the comparison: running or not, each lane's rounds."""
        lanes = [f"{'AB'[i]}: {len(m.metrics)} rounds · {m.metrics.emitted_total} tokens"
                 for i, m in enumerate(self.models) if m.config is not None]
        head = "comparing" if self.running else "comparison" if lanes else "compare: no lanes yet"
        if self.settings and self.running:
            head += " " + " vs ".join(proposer_label(s.proposer) for s in self.settings)
        return " · ".join([head, *lanes])

    def divergence_text(self) -> str:
        a, b = (m.output_tokens for m in self.models)
        n = min(len(a), len(b))
        cfg = self.models[0].config
        greedy = bool(self.settings[0].greedy) if self.settings else bool(cfg and cfg.sampling.temperature == 0)
        if self.first_divergence is None:
            if not n:
                return ""
            note = (" (greedy: identical outputs, as exactness requires)" if greedy
                    else " (coupled lanes: both emit the target's pick at every position)" if self.coupled else "")
            return f"<span style='color:#007a4d'>✔ no divergence in the first {n} tokens{note}</span>"
        i = self.first_divergence
        tt = self.models[0].token_text
        text = (f"<b style='color:{theme.DIVERGENCE_COLOR.name()}'>first divergence at output position {i}</b>: "
                f"A “{tt(a[i])}” vs B “{tt(b[i])}”")
        if greedy:
            text += " — <b style='color:#b00020'>greedy outputs must be identical: this is a bug</b>"
        elif self.coupled:
            text += (" (coupled lanes emit the same token wherever their prefixes agree, up to float differences "
                     "between the two lanes' target forwards: a near-tie of log p + G decided differently)")
        else:
            text += " (expected when sampling: the two proposers consume the random stream differently)"
        return text
