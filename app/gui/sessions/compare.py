"""The compare session: the same prompt, target and sampler with two or three proposers (lanes
A, B and an optional C). No widgets: it drives a RunController with the lanes, fills one
RunModel per lane and keeps the summary and the first divergence (compare.CompareWidget shows
them)."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QObject, Signal

from specscope.app.gui import theme
from specscope.app.gui.model.runmodel import RunModel, first_divergence
from specscope.app.gui.model.settings import PanelSettings, proposer_label
from specscope.app.gui.model.traces import Recorder, RecorderFactory

from .hub import PlainCost
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
LANE_NAMES = "ABC"  # the lanes a comparison can have; A and B always run, C when it is chosen


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
class LaneSettings(PanelSettings):
    """A compare lane's settings: the run panel's, the side's proposer and k, and the coupling
    seed of coupled lanes (PanelSettings.coupling_seed, core.verify.coupling; None = uncoupled)."""

    def describe(self) -> str:
        return super().describe() + ("" if self.coupling_seed is None else f", coupled (seed {self.coupling_seed})")


def lanes_coupled(configs: Any) -> bool:
    """Whether every lane's run was coupled with the same seed (their RunConfigs say so)."""
    from specscope.core.verify.coupling import coupling_seed_of

    seeds = [coupling_seed_of(c) for c in configs if c is not None]
    return bool(seeds) and seeds[0] is not None and len(set(seeds)) == 1


def first_divergence_of(outputs: Any) -> int | None:
    """The first output position where some lane's tokens differ from lane A's."""
    found = [first_divergence(outputs[0], other) for other in outputs[1:]]
    return min((i for i in found if i is not None), default=None)


class CompareRecorderFactory(RecorderFactory):
    """Records a comparison's lanes as one comparison of two or three runs: each run's `extra`
    names the comparison and its lane (the worker prepares lane A, then B, then C)."""

    def __init__(self, store_path: str | None):
        super().__init__(store_path)
        self.comparison: str | None = None
        self.coupling_seed: int | None = None
        self.next_lane = 0

    def begin(self, prompt: str, coupling_seed: int | None = None) -> str:
        self.comparison = uuid.uuid4().hex
        self.next_lane = 0
        self.prompt_text = prompt
        self.coupling_seed = coupling_seed
        return self.comparison

    def __call__(self, config, model_info: dict | None = None) -> Recorder:
        lane, self.next_lane = self.next_lane, self.next_lane + 1
        extra = {"comparison": self.comparison, "lane": LANE_NAMES[min(lane, len(LANE_NAMES) - 1)]}
        if self.coupling_seed is not None:
            extra["coupled"] = self.coupling_seed  # the comparison was run with coupled lanes
        return Recorder(
            self.open_store(),
            config,
            prompt_text=self.prompt_text,
            extra=extra,
            full_vectors=True if self.full_vectors else None,
            model_info=model_info,
        )


def comparison_of(info: Any) -> tuple[str, str] | None:
    """(comparison id, lane) of a stored run recorded by compare mode, else None."""
    extra = getattr(info, "extra", None) or {}
    if extra.get("comparison") and extra.get("lane") in tuple(LANE_NAMES):
        return str(extra["comparison"]), str(extra["lane"])
    return None


@dataclass
class SideResult:
    stop_reason: str | None = None
    wall_s: float | None = None


class CompareSession(QObject):
    """Two or three lanes of one worker. `slots` holds a RunModel for every lane a comparison
    can have (the view binds its columns to them once); `models` are the first `count`, the
    lanes of the comparison shown."""

    changed = Signal()
    divergence = Signal(object)  # output position or None
    failed = Signal(str, str)
    refused = Signal(object, int)  # {field: message}, lane: a lane's settings cannot run; nothing started
    stateChanged = Signal(str)

    def __init__(self, controller: RunController, parent=None, recording: CompareRecorderFactory | None = None):
        super().__init__(parent)
        self.controller = controller
        self.recording = recording  # the factory the controller's worker records with, or None
        self.source = "live"  # or the trace store the lanes were read from
        self.slots = tuple(RunModel(self) for _ in LANE_NAMES)
        self.count = 2  # lanes in the comparison shown
        self.settings: tuple[PanelSettings, ...] | None = None
        self.results = [SideResult() for _ in range(self.count)]
        self.plain: PlainCost | None = None  # plain decoding of the target, measured before the run
        self.references: list[Any] = [None] * self.count  # per lane: reference_text's input
        self.first_divergence: int | None = None
        self._reader: Any = None  # the trace store stored lanes read their rounds' vectors from
        w = controller.worker
        w.prepared.connect(self._on_prepared)
        w.roundReady.connect(self._on_round)
        w.laneFinished.connect(self._on_lane_finished)
        w.baseline.connect(self._on_baseline)
        w.referenced.connect(self._on_referenced)
        w.failed.connect(self.failed)
        w.refused.connect(self._on_refused)
        w.stateChanged.connect(self.stateChanged)

    def _on_refused(self, errors: dict, lane: int) -> None:
        """A lane's settings cannot run with its models (core.decode.factory: the position limit):
        the window shows each message under its field, as a refused Run does."""
        self.refused.emit(errors, lane)

    @property
    def models(self) -> tuple[RunModel, ...]:
        """The models of the comparison's lanes (the other slots are empty)."""
        return self.slots[: self.count]

    def start(self, *lanes: PanelSettings) -> None:
        """Run two or three lanes (A, B and maybe C) side by side."""
        if not 2 <= len(lanes) <= len(LANE_NAMES):
            raise ValueError(f"a comparison has 2 to {len(LANE_NAMES)} lanes, got {len(lanes)}")
        self.settings = tuple(lanes)
        self.count = len(lanes)
        self.source = "live"
        self._close_reader()
        if self.recording is not None:
            self.recording.begin(lanes[0].prompt, lanes[0].coupling_seed)
        self.results = [SideResult() for _ in lanes]
        self.plain = None
        self.references = [None] * self.count
        self.first_divergence = None
        for m in self.slots:
            m.clear()
        self.controller.start(list(lanes), run=True, measure_baseline=True)

    def stop(self) -> None:
        self.controller.stop()

    def load(self, lanes: list[tuple[Any, list, Any]], source: str) -> None:
        """Show two or three stored runs side by side: per lane (RunInfo, rounds, token_text)."""
        self.controller.stop()
        self.settings = None
        self.source = source
        self.plain = None
        self.count = len(lanes)
        self.references = [None] * self.count
        self.results = []
        for m in self.slots:
            m.clear()
        self._close_reader()
        for side, (info, rounds, token_text) in enumerate(lanes):
            m = self.models[side]
            m.begin(info.config, token_text, source=source, label=f"{LANE_NAMES[side]}: {info.run_id[:8]}")
            m.loader = self._stored_loader(source, info.run_id)
            m.extend(rounds)
            reason = info.stop_reason or info.status
            m.finish(reason, info.wall_s)
            self.results.append(SideResult(reason, info.wall_s))
        self.first_divergence = first_divergence_of([m.output_tokens for m in self.models])
        self.divergence.emit(self.first_divergence)
        self.changed.emit()

    def _stored_loader(self, source: str, run_id: str) -> Any:
        """A lane's round with its stored distributions (the lanes are read without them), as
        the Inspect tab's replay reads them: the Round tab showed no p for a round held slim."""

        def load(index: int) -> Any:
            if self._reader is None:
                from specscope.app.gui.model.traces import TraceLibrary

                self._reader = TraceLibrary(source)
            return self._reader.loader(run_id)(index)

        return load

    def _close_reader(self) -> None:
        if self._reader is not None:
            try:
                self._reader.close()
            finally:
                self._reader = None

    @property
    def coupled(self) -> bool:
        """Whether the lanes shown were coupled (core.verify.coupling), live or loaded from a store."""
        if self.settings:
            return self.settings[0].coupling_seed is not None
        return lanes_coupled([m.config for m in self.models])

    @property
    def running(self) -> bool:
        """Whether lanes are being prepared, decoded or stopped."""
        return self.controller.busy

    def _on_prepared(self, lane: int, config, token_text, label: str) -> None:
        if lane >= self.count:
            return  # a lane of an earlier comparison with more lanes
        m = self.models[lane]
        m.begin(config, token_text, source="compare", label=label)
        store = self.recording.store if self.recording is not None else None
        if store is not None:  # the lane is recorded: a round held slim reads its vectors back (as a live run's)
            run_id = config.run_id
            m.loader = lambda i: store.load_round(run_id, i, full=True)

    def _on_round(self, lane: int, rnd) -> None:
        if lane >= self.count:
            return  # a lane of an earlier comparison with more lanes
        cfg = self.models[lane].config
        if cfg is None or rnd.run_id != cfg.run_id:
            return  # a round of a cancelled comparison
        self.models[lane].append(rnd)
        div = first_divergence_of([m.output_tokens for m in self.models])
        if div != self.first_divergence:
            self.first_divergence = div
            self.divergence.emit(div)
        self.changed.emit()

    def _on_lane_finished(self, lane: int, reason: str, wall: float, result) -> None:
        if lane >= self.count:
            return  # a lane of an earlier comparison with more lanes
        self.results[lane] = SideResult(reason, wall)
        self.models[lane].finish(reason, wall)
        self._ask_reference()
        self.changed.emit()

    def _ask_reference(self) -> None:
        """Once every lane of a greedy live comparison is done, the worker compares each
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
        self.references = [CHECKING] * self.count
        self.controller.reference(lanes)

    def _on_referenced(self, lane: int, result: Any) -> None:
        if lane >= self.count:
            return  # a lane of an earlier comparison with more lanes
        cfg = self.models[lane].config
        if self.references[lane] != CHECKING or (
            hasattr(result, "run_id") and cfg is not None and result.run_id != cfg.run_id
        ):
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
        speed = (
            self.plain.total_s(met.emitted_total) / decode
            if self.plain is not None and decode and met.emitted_total
            else math.nan
        )
        s = self.settings[lane] if self.settings else None
        cfg = m.config
        stored = f"{m.label} · {cfg.draft_name or cfg.proposer}, k={cfg.k}" if cfg is not None else m.label
        return {
            "proposer": (
                (f"{'transformers: ' if s.engine == 'transformers' else ''}{proposer_label(s.proposer)}, k={s.k}")
                if s
                else stored
            ),
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
        lanes = [
            f"{LANE_NAMES[i]}: {len(m.metrics)} rounds · {m.metrics.emitted_total} tokens"
            for i, m in enumerate(self.models)
            if m.config is not None
        ]
        head = "comparing" if self.running else "comparison" if lanes else "compare: no lanes yet"
        if self.settings and self.running:
            head += " " + " vs ".join(proposer_label(s.proposer) for s in self.settings)
        return " · ".join([head, *lanes])

    def divergence_text(self) -> str:
        outputs = [m.output_tokens for m in self.models]
        n = min(len(o) for o in outputs)
        cfg = self.models[0].config
        greedy = bool(self.settings[0].greedy) if self.settings else bool(cfg and cfg.sampling.temperature == 0)
        if self.first_divergence is None:
            if not n:
                return ""
            note = (
                " (greedy: identical outputs, as exactness requires)"
                if greedy
                else " (coupled lanes: both emit the target's pick at every position)"
                if self.coupled
                else ""
            )
            return f"<span style='color:#007a4d'>✔ no divergence in the first {n} tokens{note}</span>"
        i = self.first_divergence
        tt = self.models[0].token_text
        tokens = " vs ".join(f"{LANE_NAMES[lane]} “{tt(out[i])}”" for lane, out in enumerate(outputs) if i < len(out))
        text = (
            f"<b style='color:{theme.DIVERGENCE_COLOR.name()}'>first divergence at output position {i}</b>: " + tokens
        )
        if greedy:
            text += " — <b style='color:#b00020'>greedy outputs must be identical: this is a bug</b>"
        elif self.coupled:
            text += (
                " (coupled lanes emit the same token wherever their prefixes agree, up to float differences "
                "between the lanes' target forwards: a near-tie of log p + G decided differently)"
            )
        else:
            text += " (expected when sampling: the proposers consume the random stream differently)"
        return text
