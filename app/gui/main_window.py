"""The main window: it arranges the views (run panel, Inspect and Compare tabs, live plots,
findings) and routes the user's actions to the session that is active.

Three sessions, no widgets in any of them: `LiveSession` (a run of the decoder),
`ReplaySession` (a stored run) and `CompareSession` (two lanes). Live and replay fill the
Inspect tab's RunModel; the mode is which of the two is active.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from PySide6.QtCore import QByteArray, QSettings, Qt, QTimer
from PySide6.QtWidgets import QApplication, QDockWidget, QLabel, QMainWindow, QMessageBox, QScrollArea, QTabWidget, QWidget

from .compare import CompareSession, CompareWidget
from .compare_session import CompareRecorderFactory
from .findings import FindingsWidget
from .live_session import LiveSession
from .pages import InspectPage
from .plot_scroll import ScrollingPlots
from .plots import LivePlotsWidget
from .replay_session import ReplaySession
from .runmodel import RunModel
from .runpanel import RunPanelWidget
from .session import ModelHub
from .settings import RunSettings
from .trace_dialogs import TraceDialogs
from .window_actions import WindowActions
from .window_menus import WindowMenus
from .worker import IDLE, LOADING, PAUSED, RUNNING, RunController

log = logging.getLogger(__name__)

ORGANIZATION = "specscope"
APPLICATION = "specscope"
NARROW_PX = 1400  # below this width the live plots share the left column with the findings
RUN_DOCK_PX = 320
PLOTS_MIN_PX = 300


def default_checker():
    """The core trace checker: callable(config, rounds) -> findings."""
    from specscope.core.check.checker import check_run

    return lambda config, rounds: check_run(config, rounds)


def app_settings() -> QSettings:
    """The user's settings (honours QSettings.setDefaultFormat/setPath, as the tests use)."""
    return QSettings(QSettings.defaultFormat(), QSettings.Scope.UserScope, ORGANIZATION, APPLICATION)


def scrolled(widget: QWidget) -> QScrollArea:
    """`widget` in a scroll area: a dock smaller than the widget's minimum scrolls."""
    area = QScrollArea()
    area.setWidgetResizable(True)
    area.setWidget(widget)
    area.setFrameShape(QScrollArea.Shape.NoFrame)
    return area


class MainWindow(WindowActions, WindowMenus, TraceDialogs, QMainWindow):
    def __init__(self, hub: ModelHub | None = None, settings: QSettings | None = None, record: bool = True,
                 store_path: str | None = None):
        super().__init__()
        self.setWindowTitle("specscope")
        self.setAcceptDrops(True)
        self.setDockOptions(QMainWindow.DockOption.AnimatedDocks | QMainWindow.DockOption.AllowTabbedDocks)
        self.hub = hub or ModelHub()
        self.qsettings = settings or app_settings()
        self.last_error: str | None = None
        self.error_box: QMessageBox | None = None
        self.record = record
        self.store_path = store_path or str(self.qsettings.value("recording/path", "") or "") or None
        self.replay_mismatch: list[str] = []
        self._shown_once = False
        self.checker = default_checker()  # callable(config, rounds) -> findings

        self.model = RunModel(self)
        self.live = LiveSession(self.model, self.hub, self.store_path, record, self)
        self.replay = ReplaySession(self.model, self._token_text_for, self)
        self.session: Any = self.live  # the active one of live and replay
        self.compare_recording = CompareRecorderFactory(self.store_path) if record else None
        self.compare_controller = RunController(self.hub, self.compare_recording, self)
        self.compare_session = CompareSession(self.compare_controller, self, self.compare_recording)

        self._build_widgets()
        self._wire()
        self._build_menus()
        self._restore()
        self._temperature_to_compare()
        self._on_state(IDLE)
        device = self.run_panel.texts().get("device") or "cpu"
        self.statusBar().showMessage(f"Loading {self.hub.description()}…", 10000)
        self.controller.preload(device if device in self.hub.devices() else "cpu")

    # ------------------------------------------------------------------ the old names

    @property
    def controller(self) -> RunController:
        return self.live.controller

    @property
    def recording(self):
        return self.live.recording

    @property
    def recorded_path(self) -> str | None:
        return self.live.recorded_path

    @property
    def mode(self) -> str:
        return "replay" if self.session is self.replay else "live"

    @property
    def state(self) -> str:
        return self.live.state

    @property
    def library(self):
        return self.replay.library

    @property
    def replay_loaded(self) -> bool:
        return self.replay.loaded_all

    @property
    def trace_path(self) -> str | None:
        return self.session.trace_path

    @property
    def follow_latest(self) -> bool:
        return self.live.follow_latest

    @follow_latest.setter
    def follow_latest(self, value: bool) -> None:
        self.live.follow_latest = value

    # ------------------------------------------------------------------ building

    def _build_widgets(self) -> None:
        """The run panel, the Inspect and Compare tabs and the docks."""
        self.run_panel = RunPanelWidget(self.hub.devices(), self.hub.example_prompts())
        self.page = InspectPage(self.model)
        self.timeline, self.inspector = self.page.timeline, self.page.inspector
        self.tree, self.navigator = self.page.tree, self.page.navigator
        self.plots = LivePlotsWidget(self.model, compact=True)
        self.findings = FindingsWidget()
        self.compare = CompareWidget(self.compare_session)
        self.tabs = QTabWidget()
        self.tabs.addTab(self.page, "Inspect")
        self.tabs.addTab(self.compare, "Compare")
        self.setCentralWidget(self.tabs)
        self.run_dock = self._dock("Run", scrolled(self.run_panel), Qt.DockWidgetArea.LeftDockWidgetArea)
        self.plots_dock = self._dock("Live plots", ScrollingPlots(self.plots), Qt.DockWidgetArea.RightDockWidgetArea)
        self.findings_dock = self._dock("Findings", self.findings, Qt.DockWidgetArea.LeftDockWidgetArea)
        # never narrower than the panel's own minimum (a sideways scrollbar otherwise)
        self.run_dock.setMinimumWidth(max(RUN_DOCK_PX - 40, self.run_panel.minimumSizeHint().width() + 24))
        self.status_label = QLabel("")
        self.statusBar().addPermanentWidget(self.status_label)
        if self.hub.fallback:
            self.statusBar().showMessage("Bundled models not found: using tiny random models.", 8000)

    def _wire(self) -> None:
        """Connect the sessions, the panels and the timers to the window."""
        self.live.failed.connect(self._on_failed)
        self.live.refused.connect(self.refused)
        self.live.stateChanged.connect(self._on_state)
        self.live.activity.connect(self._on_activity)
        self.live.finished.connect(self._on_live_finished)
        self.controller.worker.preloaded.connect(self._on_preloaded)  # a slot: queued to the GUI thread
        self.replay.loaded.connect(self._replay_done)
        self.replay.progress.connect(lambda n: self.statusBar().showMessage(f"Loading… {n} rounds", 2000))
        self.replay.failed.connect(lambda message: self.show_error(message, title="Open trace"))
        self.replay.playingChanged.connect(self.navigator.set_playing)
        self.compare_session.failed.connect(self._on_failed)
        self.run_panel.runClicked.connect(self.run_or_resume)
        self.run_panel.pauseClicked.connect(self.pause)
        self.run_panel.stepClicked.connect(self.step)
        self.run_panel.stopClicked.connect(self.stop)
        self.run_panel.edited.connect(self.panel_edited)
        self.navigator.playToggled.connect(self.toggle_replay_play)
        self.findings.findingActivated.connect(self.jump_to_finding)
        self.model.findingsChanged.connect(lambda: self.findings.set_findings(self.model.findings))
        self.compare.compareRequested.connect(self.start_compare)
        self.compare.stopRequested.connect(self.compare_session.stop)
        self.run_panel.edited.connect(self._temperature_to_compare)
        self.live.follow_timer.timeout.connect(self._update_status)
        self.timeline.cellClicked.connect(self.live.user_selected)
        self.tree.nodeClicked.connect(self.live.user_selected)
        self.tabs.currentChanged.connect(self._tab_changed)

    def _temperature_to_compare(self) -> None:
        """The Compare tab's coupled-lanes box follows the run panel's temperature (off at 0)."""
        self.compare.update_coupling_note(self.run_panel.texts().get("temperature", ""))

    def _dock(self, title: str, widget: QWidget, area) -> QDockWidget:
        dock = QDockWidget(title, self)
        dock.setObjectName(f"dock_{title.lower().replace(' ', '_')}")
        dock.setWidget(widget)
        self.addDockWidget(area, dock)
        return dock

    def showEvent(self, event) -> None:  # noqa: N802 (Qt API)
        super().showEvent(event)
        if not self._shown_once:
            self._shown_once = True
            if not isinstance(self.qsettings.value("window/state"), QByteArray):
                QTimer.singleShot(0, self.default_dock_sizes)

    _plots_tabbed_for_width = False

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt API)
        super().resizeEvent(event)
        if self._shown_once:
            self._adapt_docks()

    def _adapt_docks(self) -> None:
        """Below NARROW_PX wide the live plots dock becomes a tab beside the findings (a
        column of its own would be clipped); wide again, it goes back to the right."""
        plots = self.plots_dock
        if plots.isFloating():
            return
        if self.width() < NARROW_PX and self.dockWidgetArea(plots) == Qt.DockWidgetArea.RightDockWidgetArea \
                and not self.tabifiedDockWidgets(plots):
            self.tabifyDockWidget(self.findings_dock, plots)
            self.findings_dock.raise_()
            self._plots_tabbed_for_width = True
        elif self.width() >= NARROW_PX and self._plots_tabbed_for_width:
            self._plots_tabbed_for_width = False
            self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, plots)
            plots.show() if not self._plots_hidden_by_compare else None
            self.resizeDocks([plots], [max(PLOTS_MIN_PX, self.width() // 4)], Qt.Orientation.Horizontal)

    def default_dock_sizes(self) -> None:
        """Docks for the window's size (see _adapt_docks), the run panel a fixed width."""
        self._adapt_docks()
        if self.width() < NARROW_PX:
            self.resizeDocks([self.run_dock], [RUN_DOCK_PX], Qt.Orientation.Horizontal)
        else:
            self.resizeDocks([self.run_dock, self.plots_dock], [RUN_DOCK_PX, max(PLOTS_MIN_PX, self.width() // 4)],
                             Qt.Orientation.Horizontal)
        body = max(300, self.height() - 80)
        self.resizeDocks([self.run_dock, self.findings_dock], [int(body * 0.62), int(body * 0.38)],
                         Qt.Orientation.Vertical)
        self.page.fit_sizes(max(400, self.height() - 140))

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
        if str(s.value("window/plots_hidden_by_compare", "false")) == "true":
            self.plots_dock.show()  # hidden only because the window closed on the Compare tab
        st = s.value("window/main_splitter")
        if isinstance(st, QByteArray):
            self.page.splitter.restoreState(st)
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
        on_compare = self.tabs.currentWidget() is self.compare and self._plots_hidden_by_compare
        s.setValue("window/plots_hidden_by_compare", "true" if on_compare else "false")
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
        QApplication.instance().removeEventFilter(self.step_keys)
        self.replay.close()
        self.live.close()
        self.compare_controller.close()
        if self.compare_recording is not None:
            self.compare_recording.close()
        super().closeEvent(event)

    # ------------------------------------------------------------------ errors and status

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

    _plots_hidden_by_compare = False

    def _tab_changed(self, index: int) -> None:
        """Compare mode has its own plots per column: the single-run plots dock steps aside,
        and comes back on leaving the tab (or at the next start)."""
        if self.tabs.widget(index) is self.compare:
            self._plots_hidden_by_compare = self.plots_dock.isVisible()
            self.plots_dock.hide()
        elif self._plots_hidden_by_compare:
            self._plots_hidden_by_compare = False
            self.plots_dock.show()

    def _on_preloaded(self, message: str) -> None:
        self.statusBar().showMessage(message, 8000)

    def _on_failed(self, message: str, details: str) -> None:
        self.show_error(message, details)

    def _on_activity(self, text: str) -> None:
        if self.session.shows_run_state:
            if text:
                self.run_panel.state_label.setText(text[0].upper() + text[1:])
            else:  # done: the panel's own words for the state again
                self.run_panel.set_state(self.state)
        self._update_status()

    def _update_status(self) -> None:
        m = self.model.metrics
        parts = [self.session.status_words()]
        if len(m):
            parts.append(f"{len(m)} rounds · {m.emitted_total} tokens · acceptance {m.acceptance_rate:.2f}")
        n = self.torch_threads()
        parts.append(f"{n} torch thread{'s' if n != 1 else ''}")
        self.status_label.setText(" · ".join(parts))

    def torch_threads(self) -> int:
        """The torch threads the next (or current) run decodes with."""
        from specscope.app.threads import default_threads

        if self.controller.worker.threads is not None and self.live.busy:
            return self.controller.worker.threads
        v = self.run_panel.validate_quietly()
        return v.threads if v is not None and v.threads is not None else default_threads()


def flush_events(seconds: float = 0.0) -> None:
    """Process events for a while (used by scripts that drive the window)."""
    app = QApplication.instance()
    end = time.perf_counter() + seconds
    while True:
        app.processEvents()
        if time.perf_counter() >= end:
            break
        time.sleep(0.005)


__all__ = ["MainWindow", "app_settings", "default_checker", "flush_events", "RunSettings", "LOADING", "PAUSED",
           "RUNNING"]
