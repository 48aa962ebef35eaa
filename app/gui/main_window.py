"""The main window: run panel, token timeline, round inspector, draft tree, live plots,
findings, replay of saved traces and compare mode, wired together."""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Iterable

from PySide6.QtCore import QByteArray, QSettings, Qt, QTimer
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QDockWidget,
    QFileDialog,
    QInputDialog,
    QLabel,
    QMainWindow,
    QMessageBox,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from . import theme
from .compare import CompareSession, CompareWidget
from .findings import FindingsWidget
from .inspector import RoundInspectorWidget
from .navigator import RoundNavigatorWidget
from .plots import LivePlotsWidget
from .runmodel import RunModel, has_distributions
from .runpanel import RunPanelWidget
from .session import ModelHub
from .settings import RunSettings, spec_of_run
from .timeline import TokenTimelineWidget
from .traces import RecorderFactory, TraceLibrary, describe_run, looks_like_trace, warm_up_trace_writer
from .tree import DraftTreeView
from .worker import IDLE, LOADING, PAUSED, RUNNING, RunController

log = logging.getLogger(__name__)

ORGANIZATION = "specscope"
APPLICATION = "specscope"
# While running, select the newest round at most 4 times a second: each selection redraws
# the round inspector's plots and the draft tree, and drawing holds the GIL the decoding
# thread needs (scripts/measure_live_overhead.py measures what a live run costs).
FOLLOW_MS = 250
REPLAY_MS = 180
REPLAY_BATCH = 256


def default_checker():
    """The core trace checker: callable(config, rounds) -> findings."""
    from specscope.core.checker import check_run

    return lambda config, rounds: check_run(config, rounds)


def app_settings() -> QSettings:
    """The user's settings (honours QSettings.setDefaultFormat/setPath, as the tests use)."""
    return QSettings(QSettings.defaultFormat(), QSettings.Scope.UserScope, ORGANIZATION, APPLICATION)


class InspectPage(QWidget):
    """Navigator, legend, timeline and (inspector | draft tree)."""

    def __init__(self, model: RunModel, parent=None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        self.navigator = RoundNavigatorWidget(model)
        layout.addWidget(self.navigator)
        self.legend = QLabel(theme.kind_legend_html())
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        layout.addWidget(self.legend)
        self.splitter = QSplitter(Qt.Orientation.Vertical)
        self.timeline = TokenTimelineWidget(model)
        self.tree = DraftTreeView(model)
        self.inspector = RoundInspectorWidget(model)
        for i, w in enumerate((self.timeline, self.tree, self.inspector)):
            self.splitter.addWidget(w)
            self.splitter.setStretchFactor(i, (3, 1, 6)[i])
        self.splitter.setSizes([270, 150, 540])
        layout.addWidget(self.splitter, 1)


class MainWindow(QMainWindow):
    def __init__(
        self,
        hub: ModelHub | None = None,
        settings: QSettings | None = None,
        record: bool = True,
        store_path: str | None = None,
    ):
        super().__init__()
        self.setWindowTitle("specscope")
        self.setAcceptDrops(True)
        self.setDockOptions(QMainWindow.DockOption.AnimatedDocks | QMainWindow.DockOption.AllowTabbedDocks)
        self.hub = hub or ModelHub()
        self.qsettings = settings or app_settings()
        self.mode = "live"  # or "replay"
        self.last_error: str | None = None
        self.error_box: QMessageBox | None = None
        self.trace_path: str | None = None
        self.replay_run_id: str | None = None
        self.library: TraceLibrary | None = None
        self.replay_loaded = False
        self._replay_batches = None
        self.record = record
        self.store_path = store_path or str(self.qsettings.value("recording/path", "") or "") or None
        self.recording = RecorderFactory(self.store_path)  # called on the worker's thread
        self.recorded_path: str | None = None
        self._shown_once = False
        self.follow_latest = True
        self._last_followed = -1
        self.checker = default_checker()  # callable(config, rounds) -> findings

        self.model = RunModel(self)
        self.controller = RunController(self.hub, self.recording if self.record else None, self)
        if self.record:
            warm_up_trace_writer()
        self.compare_controller = RunController(self.hub, None, self)

        self._build_widgets()
        self._wire()
        self._plots_dock_was_visible = True
        self._build_menus()
        self._restore()
        self._on_state(IDLE)
        device = self.run_panel.texts().get("device") or "cpu"
        self.statusBar().showMessage(f"Loading {self.hub.description()}…", 10000)
        self.controller.preload(device if device in self.hub.devices() else "cpu")

    # ------------------------------------------------------------------ building

    def _build_widgets(self) -> None:
        """The run panel, the Inspect and Compare tabs and the docks."""
        self.run_panel = RunPanelWidget(self.hub.devices(), self.hub.example_prompts())
        self.page = InspectPage(self.model)
        self.timeline = self.page.timeline
        self.inspector = self.page.inspector
        self.tree = self.page.tree
        self.navigator = self.page.navigator
        self.plots = LivePlotsWidget(self.model, compact=True)
        self.findings = FindingsWidget()
        self.compare_session = CompareSession(self.compare_controller, self)
        self.compare = CompareWidget(self.compare_session)
        self.tabs = QTabWidget()
        self.tabs.addTab(self.page, "Inspect")
        self.tabs.addTab(self.compare, "Compare")
        self.setCentralWidget(self.tabs)
        self.run_dock = self._dock("Run", self.run_panel, Qt.DockWidgetArea.LeftDockWidgetArea)
        self.plots_dock = self._dock("Live plots", self.plots, Qt.DockWidgetArea.RightDockWidgetArea)
        self.findings_dock = self._dock("Findings", self.findings, Qt.DockWidgetArea.LeftDockWidgetArea)
        self.resizeDocks([self.run_dock, self.plots_dock], [300, 560], Qt.Orientation.Horizontal)
        self.resizeDocks([self.run_dock, self.findings_dock], [560, 300], Qt.Orientation.Vertical)
        self.status_label = QLabel("")
        self.statusBar().addPermanentWidget(self.status_label)
        if self.hub.fallback:
            self.statusBar().showMessage("Bundled models not found: using tiny random models.", 8000)

    def _wire(self) -> None:
        """Connect the worker, the panels and the timers to the window."""
        w = self.controller.worker
        w.prepared.connect(self._on_prepared)
        w.roundReady.connect(self._on_round)
        w.laneFinished.connect(self._on_lane_finished)
        w.failed.connect(self._on_failed)
        w.stateChanged.connect(self._on_state)
        w.recorded.connect(self._on_recorded)
        # a bound slot, not a lambda: the worker emits from its own thread, and only a slot of
        # this window makes Qt queue the call to the GUI thread
        w.preloaded.connect(self._on_preloaded)
        self.compare_session.failed.connect(self._on_failed)
        self.run_panel.runClicked.connect(self.run_or_resume)
        self.run_panel.pauseClicked.connect(self.pause)
        self.run_panel.stepClicked.connect(self.step)
        self.run_panel.stopClicked.connect(self.stop)
        self.navigator.playToggled.connect(self.toggle_replay_play)
        self.findings.findingActivated.connect(self.jump_to_finding)
        self.model.findingsChanged.connect(lambda: self.findings.set_findings(self.model.findings))
        self.compare.compareRequested.connect(self.start_compare)
        self.compare.stopRequested.connect(self.compare_session.stop)
        self.follow_timer = QTimer(self)
        self.follow_timer.setInterval(FOLLOW_MS)
        self.follow_timer.timeout.connect(self._follow)
        self.follow_timer.start()
        self.timeline.cellClicked.connect(self._user_selected)
        self.tree.nodeClicked.connect(self._user_selected)
        self.replay_timer = QTimer(self)
        self.replay_timer.setInterval(REPLAY_MS)
        self.replay_timer.timeout.connect(self._replay_tick)
        self.tabs.currentChanged.connect(self._tab_changed)

    def _dock(self, title: str, widget: QWidget, area) -> QDockWidget:
        dock = QDockWidget(title, self)
        dock.setObjectName(f"dock_{title.lower().replace(' ', '_')}")
        dock.setWidget(widget)
        self.addDockWidget(area, dock)
        return dock

    def _action(self, menu, text: str, slot, shortcut=None, tip: str = "") -> QAction:
        act = QAction(text, self)
        if shortcut is not None:
            act.setShortcut(QKeySequence(shortcut))
            act.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        if tip:
            act.setStatusTip(tip)
        act.triggered.connect(slot)
        menu.addAction(act)
        self.addAction(act)
        return act

    def _build_menus(self) -> None:
        bar = self.menuBar()
        f = bar.addMenu("&File")
        self.open_action = self._action(f, "&Open trace…", self.open_trace_dialog, QKeySequence.StandardKey.Open)
        self.open_last_action = self._action(f, "Open &last trace", self.open_last_trace, "Ctrl+Shift+O")
        self.open_recorded_action = self._action(f, "Open the &recording store", self.open_recording_store)
        self.full_vectors_action = self._action(
            f, "Record &full probability vectors", self._full_vectors_toggled,
            tip="Recordings keep every p, q and residual in full (about 40x the bytes of the top-N at a vocabulary "
                "of 4096, and slower to record); otherwise the top-N and each vector's support, minimum and sum")
        self.full_vectors_action.setCheckable(True)
        self.recording.full_vectors = str(self.qsettings.value("recording/full_vectors", "false")) == "true"
        self.full_vectors_action.setChecked(self.recording.full_vectors)
        self._action(f, "&Diff two runs of a trace…", self.diff_runs_dialog,
                     tip="Align two stored runs and report the first divergence in tokens, p and caches")
        f.addSeparator()
        self._action(f, "Export current view as &PNG…", self.export_view_dialog, "Ctrl+E")
        self._action(f, "Export all views as PNG to a folder…", self.export_all_dialog)
        self._action(f, "Export run as &JSONL…", self.export_jsonl_dialog, "Ctrl+J")
        f.addSeparator()
        self._action(f, "&Quit", self.close, QKeySequence.StandardKey.Quit)
        r = bar.addMenu("&Run")
        self.run_action = self._action(r, "Run / Pause", self.toggle_run, Qt.Key.Key_Space)
        self.step_action = self._action(r, "Step one round / next round", self.step_or_next, Qt.Key.Key_Right)
        self.back_action = self._action(r, "Previous round", self.navigator.prev, Qt.Key.Key_Left)
        self._action(r, "First round", self.navigator.first, Qt.Key.Key_Home)
        self._action(r, "Last round", self.navigator.last, Qt.Key.Key_End)
        self._action(r, "Stop", self.stop, "Ctrl+.")
        v = bar.addMenu("&View")
        for dock in (self.run_dock, self.plots_dock, self.findings_dock):
            v.addAction(dock.toggleViewAction())
        h = bar.addMenu("&Help")
        self._action(h, "Legend and keys", self.show_help)

    def showEvent(self, event) -> None:  # noqa: N802 (Qt API)
        super().showEvent(event)
        if not self._shown_once:
            self._shown_once = True
            if not isinstance(self.qsettings.value("window/state"), QByteArray):
                QTimer.singleShot(0, self.default_dock_sizes)

    def default_dock_sizes(self) -> None:
        self.resizeDocks([self.run_dock, self.plots_dock], [290, max(560, self.width() // 3)],
                         Qt.Orientation.Horizontal)
        self.resizeDocks([self.run_dock, self.findings_dock], [560, 300], Qt.Orientation.Vertical)

    # ------------------------------------------------------------------ settings

    def _restore(self) -> None:
        s = self.qsettings
        geo = s.value("window/geometry")
        if isinstance(geo, QByteArray):
            self.restoreGeometry(geo)
        else:
            self.resize(1500, 920)
        state = s.value("window/state")
        if isinstance(state, QByteArray):
            self.restoreState(state)
        for key, splitter in (("window/main_splitter", self.page.splitter),):
            st = s.value(key)
            if isinstance(st, QByteArray):
                splitter.restoreState(st)
        texts = {}
        s.beginGroup("run")
        for key in s.childKeys():
            texts[key] = s.value(key)
        s.endGroup()
        if texts:
            self.run_panel.set_texts({k: str(v) for k, v in texts.items()})
        elif self.hub.example_prompts():
            self.run_panel.set_field("prompt", self.hub.example_prompts()[0][1])
        for side in range(2):
            prop = s.value(f"compare/{side}/proposer")
            k = s.value(f"compare/{side}/k")
            if prop:
                self.compare.set_side(side, str(prop), str(k or 4))
        self.last_trace = s.value("trace/last") or None

    def save_settings(self) -> None:
        s = self.qsettings
        s.setValue("window/geometry", self.saveGeometry())
        s.setValue("window/state", self.saveState())
        s.setValue("window/main_splitter", self.page.splitter.saveState())
        s.beginGroup("run")
        for key, value in self.run_panel.texts().items():
            s.setValue(key, value)
        s.endGroup()
        for side in range(2):
            prop, k = self.compare.side_texts(side)
            s.setValue(f"compare/{side}/proposer", prop)
            s.setValue(f"compare/{side}/k", k)
        if self.trace_path:
            s.setValue("trace/last", self.trace_path)
        s.sync()

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt API)
        self.save_settings()
        self.replay_timer.stop()
        self.follow_timer.stop()
        self.controller.close()
        self.compare_controller.close()
        if self.library is not None:
            self.library.close()
        self.recording.close()
        super().closeEvent(event)

    # ------------------------------------------------------------------ errors

    def show_error(self, message: str, details: str = "", title: str = "specscope") -> None:
        self.last_error = message
        self.statusBar().showMessage(message, 15000)
        log.warning("%s", message)
        if self.error_box is not None:
            self.error_box.close()
        box = QMessageBox(QMessageBox.Icon.Warning, title, message, QMessageBox.StandardButton.Ok, self)
        if details:
            box.setDetailedText(details)
        box.setWindowModality(Qt.WindowModality.WindowModal)
        self.error_box = box
        box.open()

    def _tab_changed(self, index: int) -> None:
        """Compare mode has its own plots per column: the single-run plots dock steps aside."""
        if self.tabs.widget(index) is self.compare:
            self._plots_dock_was_visible = self.plots_dock.isVisible()
            self.plots_dock.hide()
        elif self._plots_dock_was_visible:
            self.plots_dock.show()

    def _on_preloaded(self, message: str) -> None:
        self.statusBar().showMessage(message, 8000)

    def _on_failed(self, message: str, details: str) -> None:
        self.show_error(message, details)

    # ------------------------------------------------------------------ live runs

    @property
    def state(self) -> str:
        return self.controller.state

    def _full_vectors_toggled(self, checked: bool) -> None:
        self.recording.full_vectors = checked
        self.qsettings.setValue("recording/full_vectors", "true" if checked else "false")
        self.statusBar().showMessage(
            "The next recorded runs keep full probability vectors" if checked
            else "The next recorded runs keep the top-N of each distribution (full vectors for vocabularies up to 1024)", 8000)

    def validated_settings(self) -> RunSettings | None:
        v = self.run_panel.validate()
        if not v.ok:
            first = next(iter(v.errors.values()))
            self.statusBar().showMessage(f"Cannot run: {first}", 10000)
            self.last_error = first
            return None
        return v.settings

    def start_run(self, run: bool = True) -> bool:
        settings = self.validated_settings()
        if settings is None:
            return False
        self._leave_replay()
        self.recording.prompt_text = settings.prompt
        self.follow_latest = True
        self._last_followed = -1
        self.model.clear()
        self.findings.set_findings([], checked=False)
        self.controller.start([settings], run=run)
        if not run:
            self.controller.step()
        self.setWindowTitle(f"specscope — live: {settings.describe()}")
        return True

    def run_or_resume(self) -> None:
        if self.state == PAUSED:
            self.follow_latest = True
            self.controller.run()
        elif self.state in (IDLE,):
            self.start_run(run=True)

    def toggle_run(self) -> None:
        if self.tabs.currentWidget() is self.compare:
            if self.compare_controller.state in (RUNNING, LOADING):
                self.compare_session.stop()
            else:
                self.start_compare()
            return
        if self.mode == "replay":
            self.toggle_replay_play()
        elif self.state == RUNNING:
            self.pause()
        else:
            self.run_or_resume()

    def pause(self) -> None:
        self.controller.pause()

    def step(self) -> None:
        if self.state == PAUSED:
            self.follow_latest = True
            self.controller.step()
        elif self.state == IDLE:
            self.start_run(run=False)

    def step_or_next(self) -> None:
        if self.mode == "replay" or (self.state == IDLE and self.model.rounds and
                                     self.model.selected[0] < len(self.model.rounds) - 1):
            self.follow_latest = False
            self.navigator.next()
        else:
            self.step()

    def stop(self) -> None:
        self.controller.stop()

    def _on_prepared(self, lane: int, config, token_text, label: str) -> None:
        if self.mode == "replay":  # a live run cancelled by opening a trace: not ours any more
            return
        self.model.begin(config, token_text, source="live", label=label)
        if self.recording.store is not None:
            lib_store = self.recording.store
            run_id = config.run_id
            self.model.loader = lambda i: lib_store.load_round(run_id, i, full=True)

    def _on_round(self, lane: int, rnd) -> None:
        if self.mode == "replay" or self.model.config is None or rnd.run_id != self.model.config.run_id:
            return  # a round of a run that was cancelled after it left the worker
        self.model.append(rnd)

    def _on_lane_finished(self, lane: int, reason: str, wall: float, result) -> None:
        if self.mode == "replay":
            return
        self.model.finish(reason, wall)
        self._follow(force=True)
        self._run_checker()
        m = self.model.metrics
        self.statusBar().showMessage(
            f"Run finished ({reason}): {m.emitted_total} tokens in {len(m)} rounds, "
            f"mean accepted length {m.mean_accepted_length:.2f}", 15000)

    def _on_recorded(self, lane: int, path: str) -> None:
        self.recorded_path = path
        self.trace_path = path

    def _on_state(self, state: str) -> None:
        self.run_panel.set_state(state)
        self._update_status()

    def _user_selected(self, rnd: int, pos: int) -> None:
        self.follow_latest = rnd == len(self.model.rounds) - 1 and self.state == RUNNING

    def _follow(self, force: bool = False) -> None:
        n = len(self.model.rounds)
        if self.mode == "live" and self.follow_latest and n and (n - 1 != self._last_followed or force):
            self._last_followed = n - 1
            self.model.select(n - 1)
        self._update_status()

    def _update_status(self) -> None:
        m = self.model.metrics
        parts = []
        if self.mode == "replay" and self.trace_path:
            parts.append(f"replay {os.path.basename(self.trace_path)}")
        else:
            parts.append({IDLE: "idle", LOADING: "loading models", PAUSED: "paused", RUNNING: "running"}.get(
                self.state, self.state))
        if len(m):
            parts.append(f"{len(m)} rounds · {m.emitted_total} tokens · acceptance {m.acceptance_rate:.2f}")
        if self.recorded_path and self.mode == "live":
            parts.append(f"recording to {os.path.basename(self.recorded_path)}")
        self.status_label.setText(" · ".join(parts))

    # ------------------------------------------------------------------ findings

    def set_findings(self, findings: Iterable[Any]) -> None:
        """Show the checker's findings (objects/dicts with round, position, rule, message)."""
        self.model.set_findings(findings)

    def rounds_for_checking(self) -> list:
        """The run's rounds with whatever distributions are stored (without full vectors the
        checker works from the top-N entries and each vector's stored support, minimum and sum)."""
        rounds = self.model.rounds
        if self.mode == "replay" and self.library is not None and self.replay_run_id:
            return list(self.library.store.iter_rounds(self.replay_run_id, full=True))
        if not rounds or all(has_distributions(r) or not r.nodes for r in rounds):
            return list(rounds)
        if self.recording.store is not None and self.model.config is not None:
            try:
                return list(self.recording.store.iter_rounds(self.model.config.run_id, full=True))
            except Exception:  # noqa: BLE001 - fall back to the slim rounds
                log.exception("reading the recorded rounds failed")
        return [self.model.full_round(i) for i in range(len(rounds))]

    def _run_checker(self) -> None:
        if self.checker is None or not self.model.rounds or self.model.config is None:
            return
        try:
            found = self.checker(self.model.config, self.rounds_for_checking())
        except Exception as exc:  # noqa: BLE001
            log.exception("the checker failed")
            self.findings.set_error(str(exc))
            return
        self.set_findings(found)
        if found:
            self.findings_dock.raise_()
            self.statusBar().showMessage(f"The checker found {len(found)} problem(s); see Findings.", 15000)

    def jump_to_finding(self, f) -> None:
        pos = -1
        if f.node is not None:
            pos = f.node
        elif f.position is not None and 0 <= f.position < len(self.model.cells.out_cell):
            cell = self.model.cells.cell(self.model.cells.out_cell[f.position])
            if cell.round == f.round:
                pos = cell.pos
        self.jump_to(f.round, pos)

    def jump_to(self, rnd: int, pos: int) -> None:
        self.follow_latest = False
        self.tabs.setCurrentWidget(self.page)
        self.model.select(rnd, pos)

    # ------------------------------------------------------------------ replay

    def open_trace_dialog(self) -> None:
        start = str(self.last_trace or "")
        path, _ = QFileDialog.getOpenFileName(self, "Open a trace", start,
                                              "Trace stores (*.sqlite *.sqlite3 *.db);;All files (*)")
        if path:
            self.open_trace(path)

    def diff_runs_dialog(self, path: str | None = None) -> str | None:
        """Pick a trace store and two of its runs; show `specscope diff` of them."""
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Diff two runs", str(self.last_trace or ""),
                                                  "Trace stores (*.sqlite *.sqlite3 *.db);;All files (*)")
        if not path:
            return None
        try:
            library = TraceLibrary(path)
        except Exception as exc:  # noqa: BLE001 - not a trace, corrupt, newer schema...
            self.show_error(f"Cannot open {os.path.basename(path)}: {exc}", title="Diff runs")
            return None
        try:
            runs = library.runs()
            if len(runs) < 2:
                self.show_error(f"{os.path.basename(path)} holds {len(runs)} run(s); a diff needs two.", title="Diff runs")
                return None
            labels = [describe_run(r) for r in runs]
            picked = []
            for which in ("A", "B"):
                choice, ok = QInputDialog.getItem(self, "Diff runs", f"Run {which}:", labels, len(picked), False)
                if not ok:
                    return None
                picked.append(runs[labels.index(choice)].run_id)
            text = library.diff(*picked)
        except Exception as exc:  # noqa: BLE001 - never a traceback in the GUI
            self.show_error(f"Cannot diff these runs: {exc}", title="Diff runs")
            return None
        finally:
            library.close()
        QMessageBox.information(self, "Diff runs", text)
        return text

    def open_last_trace(self) -> None:
        if self.last_trace and os.path.exists(str(self.last_trace)):
            self.open_trace(str(self.last_trace))
        else:
            self.show_error("No trace was opened before (or it has moved).")

    def open_recording_store(self) -> None:
        """The store live runs are recorded to: pick one of its runs to replay."""
        from .traces import default_trace_path

        path = self.store_path or default_trace_path()
        if os.path.exists(path):
            self.open_trace(path)
        else:
            self.show_error(f"No run has been recorded yet ({path} does not exist).")

    def _show_trace_settings(self, info) -> None:
        """Put the replayed run's settings in the run panel, so Run reproduces it."""
        cfg = info.config
        proposer = spec_of_run(cfg.proposer, cfg.proposer_params, cfg.draft_name)
        texts = {"k": str(cfg.k), "temperature": f"{cfg.sampling.temperature:g}", "top_k": str(cfg.sampling.top_k),
                 "top_p": f"{cfg.sampling.top_p:g}", "seed": str(cfg.seed), "max_new_tokens": str(cfg.max_new_tokens),
                 "eos": "none" if cfg.eos_token_id is None else str(cfg.eos_token_id)}
        if proposer:
            texts["proposer"] = proposer
        if info.prompt_text:
            texts["prompt"] = info.prompt_text
        self.run_panel.set_texts(texts)
        self.run_panel.set_state(IDLE, f"Replaying run {info.run_id[:8]} ({info.status}); Run starts these "
                                       "settings live." + ("" if proposer else f" Proposer: {cfg.draft_name or cfg.proposer}."))

    def open_trace(self, path: str, run_id: str | None = None) -> bool:
        """Open a trace store (a file, or a database URL) and replay one of its runs (asks
        which when there are several)."""
        if "://" not in path and not os.path.exists(path):
            self.show_error(f"No such trace file: {path}")
            return False
        try:
            library = TraceLibrary(path)
            runs = library.runs()
        except Exception as exc:  # noqa: BLE001 - not a trace, corrupt, newer schema...
            self.show_error(f"Cannot open {os.path.basename(path)}: {exc}", title="Open trace")
            return False
        if not runs:
            library.close()
            self.show_error(f"{os.path.basename(path)} holds no runs.", title="Open trace")
            return False
        if run_id is None:
            if len(runs) == 1:
                run_id = runs[0].run_id
            else:
                labels = [describe_run(r) for r in runs]
                choice, ok = QInputDialog.getItem(self, "Open trace", "Run to replay:", labels, 0, False)
                if not ok:
                    library.close()
                    return False
                run_id = runs[labels.index(choice)].run_id
        try:
            info = library.run(run_id)
        except Exception as exc:  # noqa: BLE001
            library.close()
            self.show_error(f"Cannot read run {run_id}: {exc}", title="Open trace")
            return False
        self.controller.stop()
        self._leave_replay()
        self.library = library
        self.trace_path = path
        self.replay_run_id = info.run_id
        self.mode = "replay"
        self.replay_loaded = False
        self.follow_latest = False
        token_text = self._token_text_for(info)
        self.model.begin(info.config, token_text, source=path, label=describe_run(info))
        self.model.loader = library.loader(info.run_id)
        self.findings.set_findings([], checked=False)
        try:
            self._show_trace_settings(info)
        except Exception:  # noqa: BLE001 - only a convenience
            log.exception("could not show the trace's settings")
        self._replay_batches = library.batches(info.run_id, REPLAY_BATCH)
        self.setWindowTitle(f"specscope — {os.path.basename(path)} · {describe_run(info)}")
        self.tabs.setCurrentWidget(self.page)
        self.qsettings.setValue("trace/last", path)
        self.last_trace = path
        QTimer.singleShot(0, self._load_next_batch)
        self._update_status()
        return True

    def _token_text_for(self, info):
        """Token text for a replayed run: the bundled tokenizer when the run used the bundled
        target (or a target of the same vocabulary), else the ids."""
        try:
            tok = self.hub.tokenizer()
            if tok is not None and info.config.vocab_size and len(tok) > info.config.vocab_size:
                tok = None
            return self.hub.token_text(tok)
        except Exception:  # noqa: BLE001 - fall back to ids
            return self.hub.token_text(None)

    def _load_next_batch(self) -> None:
        if self._replay_batches is None:
            return
        try:
            batch = next(self._replay_batches, None)
        except Exception as exc:  # noqa: BLE001
            self._replay_batches = None
            self.replay_loaded = True
            self.show_error(f"Reading the trace failed: {exc}", title="Open trace")
            return
        if batch is None:
            self._replay_done()
            return
        self.model.extend(batch)
        if self.model.selected[0] < 0 and self.model.rounds:
            self.model.select(0)
        self.statusBar().showMessage(f"Loading… {len(self.model.rounds)} rounds", 2000)
        QTimer.singleShot(0, self._load_next_batch)

    def _replay_done(self) -> None:
        self._replay_batches = None
        self.replay_loaded = True
        info = self.library.run(self.replay_run_id) if self.library else None
        self.model.finish(info.stop_reason or info.status if info else "replay",
                          info.wall_s if info else None)
        if self.model.rounds and self.model.selected[0] < 0:
            self.model.select(0)
        self._run_checker()
        self.statusBar().showMessage(f"Loaded {len(self.model.rounds)} rounds from {self.trace_path}", 8000)

    def _leave_replay(self) -> None:
        self.replay_timer.stop()
        self.navigator.set_playing(False)
        self._replay_batches = None
        if self.library is not None:
            self.library.close()
            self.library = None
        self.mode = "live"

    def toggle_replay_play(self) -> None:
        if not self.model.rounds:
            return
        if self.replay_timer.isActive():
            self.replay_timer.stop()
            self.navigator.set_playing(False)
        else:
            if self.model.selected[0] >= len(self.model.rounds) - 1:
                self.model.select(0)
            self.follow_latest = False
            self.replay_timer.start()
            self.navigator.set_playing(True)

    def _replay_tick(self) -> None:
        cur = self.model.selected[0]
        if cur >= len(self.model.rounds) - 1:
            self.replay_timer.stop()
            self.navigator.set_playing(False)
            return
        self.model.select(cur + 1)

    # ------------------------------------------------------------------ compare

    def start_compare(self) -> None:
        self.tabs.setCurrentWidget(self.compare)
        pair = self.compare.settings_pair(self.run_panel.texts(), self.hub.devices())
        if pair is None:
            base = self.run_panel.validate()
            msg = next(iter(base.errors.values()), "check the proposers and k of A and B")
            self.statusBar().showMessage(f"Cannot compare: {msg}", 10000)
            self.last_error = msg
            return
        self.tabs.setCurrentWidget(self.compare)
        self.compare_session.start(*pair)

    # ------------------------------------------------------------------ export

    def export_view_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export view", "specscope.png", "PNG (*.png)")
        if path:
            self.export_view(self.tabs.currentWidget(), path)

    def export_view(self, widget: QWidget, path: str) -> bool:
        ok = widget.grab().save(path)
        if not ok:
            self.show_error(f"Could not write {path}")
        return ok

    def export_all_dialog(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Export all views to")
        if folder:
            self.export_all(folder)

    def export_all(self, folder: str) -> list[str]:
        views = {"window": self, "timeline": self.timeline, "inspector": self.inspector, "tree": self.tree,
                 "plots": self.plots, "findings": self.findings, "compare": self.compare}
        written = []
        for name, widget in views.items():
            path = os.path.join(folder, f"specscope-{name}.png")
            if widget.grab().save(path):
                written.append(path)
        self.statusBar().showMessage(f"Wrote {len(written)} PNG files to {folder}", 8000)
        return written

    def export_jsonl_dialog(self) -> None:
        if not self.model.rounds:
            self.show_error("Nothing to export yet: run or open a trace first.")
            return
        path, _ = QFileDialog.getSaveFileName(self, "Export run", "run.jsonl", "JSON lines (*.jsonl)")
        if path:
            self.export_jsonl(path)

    def export_jsonl(self, path: str) -> bool:
        """Export the current run with the storage layer's JSONL format."""
        from specscope.storage import export_run

        try:
            if self.mode == "replay" and self.library is not None and self.replay_run_id:
                export_run(self.library.store, self.replay_run_id, path)
            elif self.recording.store is not None and self.model.config is not None:
                export_run(self.recording.store, self.model.config.run_id, path)
            else:
                raise RuntimeError("this run was not recorded, so it cannot be exported")
        except Exception as exc:  # noqa: BLE001
            self.show_error(f"Export failed: {exc}")
            return False
        self.statusBar().showMessage(f"Wrote {path}", 8000)
        return True

    # ------------------------------------------------------------------ drag and drop, help

    def dragEnterEvent(self, event) -> None:  # noqa: N802 (Qt API)
        urls = event.mimeData().urls() if event.mimeData().hasUrls() else []
        if any(u.isLocalFile() and looks_like_trace(u.toLocalFile()) for u in urls):
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:  # noqa: N802 (Qt API)
        for u in event.mimeData().urls():
            if u.isLocalFile() and looks_like_trace(u.toLocalFile()):
                self.open_trace(u.toLocalFile())
                event.acceptProposedAction()
                return

    def show_help(self) -> None:
        QMessageBox.information(
            self, "specscope",
            "<p><b>Timeline</b>: " + theme.kind_legend_html() + "</p>"
            "<p><b>Keys</b>: Space run/pause (replay: play), Right step one round (replay: next round), "
            "Left previous round, Home/End first/last round, Ctrl+O open a trace.</p>"
            "<p>Hover a token for p, q, p/q, u and the decision; click it to inspect its round.</p>")


def flush_events(seconds: float = 0.0) -> None:
    """Process events for a while (used by scripts that drive the window)."""
    app = QApplication.instance()
    end = time.perf_counter() + seconds
    while True:
        app.processEvents()
        if time.perf_counter() >= end:
            break
        time.sleep(0.005)
