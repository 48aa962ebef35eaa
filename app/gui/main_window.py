"""The main window: it arranges the views (run panel, Inspect and Compare tabs, live plots,
findings), owns the sessions and the controllers, and builds its menus and keys from one
table of actions (controllers/table.py: actions as data, installed by actions.py).

Three sessions, no widgets in any of them (sessions/): `LiveSession` (a run of the decoder),
`ReplaySession` (a stored run) and `CompareSession` (two lanes). Live and replay fill the
Inspect tab's RunModel; the mode is which of the two is active. The controllers (controllers/)
do what the actions ask: `runs` (run, step, pause, stop, compare), `traces` (open, compare
and diff stored runs), `replay_panel` (the run panel during a replay), `checks` (the checker,
findings, the recompute check), `exports` and `docks` (the docks for the width).
"""

from __future__ import annotations

import functools
import logging
import time

from PySide6.QtCore import QByteArray, QEvent, QSettings, QSize, Qt, QTimer
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (
    QApplication,
    QDockWidget,
    QMainWindow,
    QMessageBox,
    QScrollArea,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from . import collector, startup
from .actions import WindowContext, install_actions, update_enablement
from .controllers.checks import CheckActions
from .controllers.docks import RUN_DOCK_PX, DockLayout
from .controllers.exports import Exports
from .controllers.keys import StepKeys, WheelGuard
from .controllers.model_fetch import ModelFetchController
from .controllers.replay_panel import ReplayPanel
from .controllers.run_actions import RunActions
from .controllers.table import window_actions
from .controllers.trace_dialogs import TraceDialogs
from .model.runmodel import RunModel
from .model.traces import looks_like_trace
from .sessions.compare import LANE_NAMES, CompareRecorderFactory, CompareSession
from .sessions.hub import ModelHub
from .sessions.live import LiveSession
from .sessions.protocol import InspectSession
from .sessions.replay import ReplaySession, run_token_text
from .sessions.worker import IDLE, LOADING, PAUSED, RUNNING, RunController
from .views.calibration import CalibrationView
from .views.compare import CompareWidget
from .views.findings import FindingsWidget
from .views.pages import InspectPage
from .views.plot_scroll import ScrollingPlots
from .views.plots import LivePlotsWidget
from .views.runpanel import RunPanelWidget
from .views.status_bar import ElidingStatusBar

log = logging.getLogger(__name__)

ORGANIZATION = "specscope"
APPLICATION = "specscope"
DEFAULT_SIZE = QSize(1500, 920)  # a first start without a screen to measure
MAX_FIRST_SIZE = QSize(2560, 1440)  # a first start fills the screen's free area up to this (first_size)


def default_checker():
    """The core trace checker: callable(config, rounds, end=None) -> CheckReport (its findings
    and the rules it could not check; `end`: the run's end record); any callable returning a
    list of findings will do."""
    from specscope.core.check.checker import check_report

    return lambda config, rounds, end=None: check_report(config, rounds, end=end)


def app_settings() -> QSettings:
    """The user's settings (honours QSettings.setDefaultFormat/setPath, as the tests use)."""
    return QSettings(QSettings.defaultFormat(), QSettings.Scope.UserScope, ORGANIZATION, APPLICATION)


def pinned_above(top: QWidget, body: QWidget) -> QWidget:
    """`top` always visible, `body` scrolling under it."""
    box = QWidget()
    layout = QVBoxLayout(box)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.setSpacing(0)
    layout.addWidget(top)
    layout.addWidget(scrolled(body), 1)
    return box


def scrolled(widget: QWidget) -> QScrollArea:
    """`widget` in a scroll area: a dock smaller than the widget's minimum scrolls."""
    area = QScrollArea()
    area.setWidgetResizable(True)
    area.setWidget(widget)
    area.setFrameShape(QScrollArea.Shape.NoFrame)
    return area


class MainWindow(QMainWindow):
    runs: RunActions  # built in _build_controllers

    def __init__(
        self,
        hub: ModelHub | None = None,
        settings: QSettings | None = None,
        record: bool = True,
        store_path: str | None = None,
    ):
        super().__init__()
        collector.acquire()  # Python's garbage collected on this thread only (app/gui/collector.py)
        self.collecting = True
        self.setWindowTitle("specscope")
        self.setAcceptDrops(True)
        self.setDockOptions(QMainWindow.DockOption.AnimatedDocks | QMainWindow.DockOption.AllowTabbedDocks)
        self.hub = hub or ModelHub()
        self.qsettings = settings or app_settings()
        self.last_error: str | None = None
        self.error_box: QMessageBox | None = None
        self.record = record
        self.store_path = store_path or str(self.qsettings.value("recording/path", "") or "") or None
        self._shown_once = False
        self.closed = False  # set once closeEvent has stopped the decoders and closed the recordings
        self.quick_quit = False  # launch(): the process ends at close (end_process), a preload need not finish
        self.checker = default_checker()  # callable(config, rounds) -> findings

        self.status_bar = ElidingStatusBar(self)
        self.setStatusBar(self.status_bar)
        self.model = RunModel(self)
        self.live = LiveSession(self.model, self.hub, self.store_path, record, self)
        self.replay = ReplaySession(self.model, functools.partial(run_token_text, self.hub, say=self.say_long), self)
        self.session: InspectSession = self.live  # the active one of live and replay
        self.compare_recording = CompareRecorderFactory(self.store_path) if record else None
        self.compare_controller = RunController(self.hub, self.compare_recording, self)
        self.compare_session = CompareSession(self.compare_controller, self, self.compare_recording)

        self._build_widgets()
        self._build_controllers()
        self._wire()
        self.action_table = window_actions(self)
        self.qactions = install_actions(self, self.action_table)
        self.step_keys = StepKeys(self, self.run_panel.free_text_fields(), self)
        QApplication.instance().installEventFilter(self.step_keys)
        self.wheel_guard = WheelGuard(self, self)
        QApplication.instance().installEventFilter(self.wheel_guard)
        self._restore()
        self._temperature_to_compare()
        self._examples_for_run()
        self.runs.on_state(IDLE)
        # Built without torch: the worker imports it, lists the devices and loads the models,
        # starting once the window has painted (importing torch meanwhile would hold the GIL the
        # first paint needs); until then the panel and the status bar say so, and a Run waits
        # in the worker's queue.
        self._preload_started = False
        self.defer_preload = False  # launch() with a trace: the models load once its run is chosen
        self._painted = False
        target = self.run_panel.texts().get("target", "")
        self.live.preloading(target)
        self.loading_message = self.live.preloading_text[0].upper() + self.live.preloading_text[1:]
        self.statusBar().showMessage(self.hub.missing or self.loading_message)  # missing: one line, kept

    # ------------------------------------------------------------------ what scripts call

    def start_run(self, run: bool = True) -> bool:
        """Start the run panel's settings live (False, with `last_error`, when they do not validate)."""
        return self.runs.start_run(run)

    def open_trace(self, path: str, run_id: str | None = None) -> bool:
        """Replay run `run_id` (a prefix; asked when None) of the trace store at `path`."""
        return self.traces.open_trace(path, run_id)

    def action(self, action_id: str) -> QAction:
        """The QAction of the table's action `action_id` ("file.compare_runs")."""
        return self.qactions[action_id]

    def jump_to(self, rnd: int, pos: int) -> None:
        """Show round `rnd` (node or position `pos`, -1 for none) on the Inspect tab."""
        self.live.follow_latest = False
        self.tabs.setCurrentWidget(self.page)
        self.model.select(rnd, pos)

    @property
    def mode(self) -> str:
        """ "replay" while a stored run is the active session, else "live"."""
        return "replay" if self.session is self.replay else "live"

    def context(self) -> WindowContext:
        """What the actions' enablement rules ask of the window now."""
        return WindowContext(
            run_active=self.live.busy,
            run_loaded=self.model.config is not None,
            rounds_exist=bool(self.model.rounds),
            replaying=self.session is self.replay,
            records=self.record,
        )

    def update_actions(self) -> None:
        """Every action enabled or greyed by its rule in the window's context."""
        update_enablement(self.action_table, self.qactions, self.context())

    def export_views(self) -> dict[str, QWidget]:
        """Every view by name, as File > Export all views writes them."""
        return {
            "window": self,
            "timeline": self.timeline,
            "inspector": self.inspector,
            "tree": self.tree,
            "plots": self.plots,
            "findings": self.findings,
            "compare": self.compare,
            "calibration": self.calibration,
        }

    # ------------------------------------------------------------------ building

    def _build_controllers(self) -> None:
        """The controllers the window owns (the table of actions routes menus and keys to them),
        each given the views and sessions it works with."""
        self.runs = RunActions(self)
        self.traces = TraceDialogs(self)
        self.replay_panel = ReplayPanel(self.hub, self.run_panel, self.replay)
        self.checks = CheckActions(self)
        self.exports = Exports(
            self,
            self.export_views,
            self.tabs.currentWidget,
            self.model,
            lambda: self.session,
            self.status_bar,
            self.show_error,
        )
        self.docks = DockLayout(
            self,
            self.run_dock,
            self.plots_dock,
            self.findings_dock,
            self.page,
            self.tabs,
            self.compare,
            self.update_status,
        )

    def _build_widgets(self) -> None:
        """The run panel, the Inspect and Compare tabs and the docks."""
        self.run_panel = RunPanelWidget(self.hub.devices(), self.hub.example_prompts())
        self.model_fetch = ModelFetchController(self.run_panel, self)  # the target menu's fetchable models
        self.page = InspectPage(self.model)
        self.timeline, self.inspector = self.page.timeline, self.page.inspector
        self.tree, self.navigator = self.page.tree, self.page.navigator
        self.plots = LivePlotsWidget(self.model, compact=True)
        self.findings = FindingsWidget()
        self.compare = CompareWidget(self.compare_session)
        self.calibration = CalibrationView(self.model)  # the Inspect tab's run, its proposer judged as a whole
        self.tabs = QTabWidget()
        self.tabs.addTab(self.page, "Inspect")
        self.tabs.addTab(self.compare, "Compare")
        self.tabs.addTab(self.calibration, "Calibration")
        self.setCentralWidget(self.tabs)
        # Run, Pause, Step and Stop above the fields: visible without scrolling at any height
        self.run_dock = self._dock(
            "Run", pinned_above(self.run_panel.action_row, self.run_panel), Qt.DockWidgetArea.LeftDockWidgetArea
        )
        self.plots_dock = self._dock("Live plots", ScrollingPlots(self.plots), Qt.DockWidgetArea.RightDockWidgetArea)
        self.findings_dock = self._dock("Findings", self.findings, Qt.DockWidgetArea.LeftDockWidgetArea)
        # never narrower than the panel's own minimum (a sideways scrollbar otherwise)
        self.run_dock.setMinimumWidth(max(RUN_DOCK_PX - 40, self.run_panel.minimumSizeHint().width() + 24))
        self.status_label = self.status_bar.state_label

    def _wire(self) -> None:
        """Connect the sessions, the panels and the timers to the window."""
        runs, traces = self.runs, self.traces
        self.live.failed.connect(self._on_failed)
        self.live.refused.connect(runs.refused)
        self.live.stateChanged.connect(runs.on_state)
        self.live.activity.connect(self.on_activity)
        self.live.finished.connect(runs.on_live_finished)
        self.live.begun.connect(self._on_live_begun)
        self.live.noted.connect(self.say_note)
        self.compare_controller.worker.noted.connect(
            lambda lane, text: self.say_note(f"Lane {LANE_NAMES[lane]}: {text}")
        )
        self.live.controller.worker.preloaded.connect(self._on_preloaded)  # a slot: queued to the GUI thread
        self.live.controller.worker.devicesFound.connect(self._on_devices)
        self.replay.loaded.connect(traces.replay_done)
        self.replay.progress.connect(lambda n: self.statusBar().showMessage(f"Loading… {n} rounds", 2000))
        self.replay.failed.connect(lambda message: self.show_error(message, title="Open trace"))
        self.replay.playingChanged.connect(self.navigator.set_playing)
        self.compare_session.failed.connect(self._on_failed)
        self.compare_session.refused.connect(runs.compare_refused)
        self.compare_session.stateChanged.connect(lambda _state: self.update_status())
        self.run_panel.runClicked.connect(runs.run_or_resume)
        self.run_panel.pauseClicked.connect(runs.pause)
        self.run_panel.stepClicked.connect(runs.step)
        self.run_panel.stopClicked.connect(runs.stop)
        self.run_panel.edited.connect(self.replay_panel.panel_edited)
        self.navigator.playToggled.connect(traces.toggle_replay_play)
        self.findings.findingActivated.connect(self.checks.jump_to_finding)
        self.model.findingsChanged.connect(
            lambda: self.findings.set_findings(
                self.model.findings, fault=self.model.config.fault if self.model.config is not None else None
            )
        )
        self.model.findingsChanged.connect(lambda: self.docks.room_for_findings(len(self.model.findings)))
        self.compare.compareRequested.connect(runs.start_compare)
        self.compare.stopRequested.connect(self.compare_session.stop)
        self.run_panel.edited.connect(self._temperature_to_compare)
        self.run_panel.edited.connect(self._examples_for_run)
        self.live.follow_timer.timeout.connect(self.update_status)
        self.timeline.cellClicked.connect(self.live.user_selected)
        self.tree.nodeClicked.connect(self.live.user_selected)
        self.tabs.currentChanged.connect(self.docks.tab_changed)
        self.model.reset.connect(self.update_actions)
        self.model.appended.connect(lambda _first, _n: self.update_actions())
        self.model.finished.connect(lambda _reason: self.update_actions())
        self.navigator.can_play = lambda: self.session.can_play()

    def chat_examples(self) -> list[tuple[str, str]]:
        """The chat example prompts (resources/prompts/chat.json: questions, summaries, code)."""
        try:
            from specscope.core.loading.chat import chat_prompts

            return [(f"{p.name} ({p.kind})", p.user) for p in chat_prompts()]
        except Exception as exc:  # noqa: BLE001 - a missing prompt file must not stop the window
            log.warning("could not read the chat example prompts: %s", exc)
            return []

    def _examples_for_run(self) -> None:
        """The example menu offers the chat prompts for a chat run (the Chat box ticked, or a
        named target: the fetchable ones are instruction models) and the bundled target's code
        prompts otherwise (they were all Python with Target smollm2)."""
        texts = self.run_panel.texts()
        chat = str(texts.get("chat", "")).lower() in ("true", "on", "1", "yes") or bool(texts.get("target"))
        examples = self.chat_examples() if chat else []
        self.run_panel.set_examples(examples or self.hub.example_prompts())

    def _temperature_to_compare(self) -> None:
        """The Compare tab's coupled-lanes box follows the run panel's temperature (off at 0)."""
        self.compare.update_coupling_note(self.run_panel.texts().get("temperature", ""))

    def _dock(self, title: str, widget: QWidget, area) -> QDockWidget:
        dock = QDockWidget(title, self)
        dock.setObjectName(f"dock_{title.lower().replace(' ', '_')}")
        dock.setWidget(widget)
        self.addDockWidget(area, dock)
        return dock

    def start_preload(self) -> None:
        """Have the worker import torch and load the default models (once)."""
        if not self._preload_started and not self.defer_preload:
            self._preload_started = True
            texts = self.run_panel.texts()
            self.live.controller.preload(texts.get("device") or "cpu", texts.get("target", ""))

    def paintEvent(self, event) -> None:
        super().paintEvent(event)
        if not self._painted:
            self._painted = True
            startup.mark("main-window-painted")
            QTimer.singleShot(0, self.start_preload)  # after this paint has reached the screen

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if not self._shown_once:
            self._shown_once = True
            if not isinstance(self.qsettings.value("window/state"), QByteArray):
                QTimer.singleShot(0, self.docks.default_sizes)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if self._shown_once:
            self.docks.adapt()

    # ------------------------------------------------------------------ settings

    def _restore(self) -> None:
        s = self.qsettings
        geo = s.value("window/geometry")
        if isinstance(geo, QByteArray):
            self.restoreGeometry(geo)
            self.fit_screen()
        else:
            self.first_size()
        state = s.value("window/state")
        if isinstance(state, QByteArray):
            self.restoreState(state)
        if str(s.value("window/plots_hidden_by_compare", "false")) == "true":
            self.plots_dock.show()  # hidden only because the window closed on the Compare tab
        if str(s.value("window/findings_hidden_by_compare", "false")) == "true":
            self.findings_dock.show()
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

    def first_size(self) -> None:
        """A first start fills the screen's free area (at most MAX_FIRST_SIZE, centred): it
        opened at 982x542 on a 1024x700 screen (the live plots a 60 px strip) and at 1218x720
        on a 1920x1080 one."""
        screen = self.screen() or QApplication.primaryScreen()
        if screen is None:
            self.resize(DEFAULT_SIZE)
            return
        room = screen.availableGeometry()
        size = room.size().boundedTo(MAX_FIRST_SIZE)
        self.resize(size)
        self.move(room.x() + (room.width() - size.width()) // 2, room.y() + (room.height() - size.height()) // 2)

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.WindowStateChange and self._shown_once:
            # maximised or back: the docks and the panes laid out for the new size (after
            # maximising at 1920x1080 the live plots stayed a small tab, the tree pane blank)
            QTimer.singleShot(0, self.docks.default_sizes)

    def fit_screen(self) -> None:
        """No larger than the screen's free area: on a 1024x700 screen the default 1500x920 (or
        a size saved on a larger monitor) put the status bar and the live plots off screen,
        with no window manager to shrink it."""
        screen = self.screen() or QApplication.primaryScreen()
        if screen is None:
            return
        room = screen.availableGeometry()
        size = self.size().boundedTo(room.size())
        if size != self.size():
            self.resize(size)
            self.move(room.topLeft())

    def save_settings(self) -> None:
        s = self.qsettings
        s.setValue("window/geometry", self.saveGeometry())
        s.setValue("window/state", self.saveState())
        on_compare = self.tabs.currentWidget() is self.compare
        for name, dock in (("plots", self.plots_dock), ("findings", self.findings_dock)):
            hidden = on_compare and dock in self.docks.hidden_by_compare
            s.setValue(f"window/{name}_hidden_by_compare", "true" if hidden else "false")
        s.setValue("window/main_splitter", self.page.splitter.saveState())
        s.beginGroup("run")
        for key, value in self.run_panel.texts().items():
            s.setValue(key, value)
        s.endGroup()
        for side in range(2):
            prop, k = self.compare.side_texts(side)
            s.setValue(f"compare/{side}/proposer", prop)
            s.setValue(f"compare/{side}/k", k)
        if self.session.trace_path:
            s.setValue("trace/last", self.session.trace_path)
        s.sync()

    def closeEvent(self, event) -> None:
        self.save_settings()
        # gone from the screen at once: stopping the decoder waits for the round or the model
        # load in progress (3-8 s on a loaded machine), which the user need not watch
        self.hide()
        QApplication.processEvents()
        QApplication.instance().removeEventFilter(self.step_keys)
        QApplication.instance().removeEventFilter(self.wheel_guard)
        self.replay.close()
        if self.quick_quit and self.live.controller.worker.preloading and not self.live.busy:
            # only a preload to stop (importing torch, loading the models: nothing to save, and
            # nothing can interrupt it): the process ends without waiting for it (end_process);
            # quitting during start-up lingered 2-10 s
            self.live.follow_timer.stop()
            self.live.controller.close(timeout_ms=200)
            self.live.recording.close()
        else:
            self.live.close()
        self.compare_controller.close()
        if self.compare_recording is not None:
            self.compare_recording.close()
        self.closed = True
        if self.collecting:  # the decoder threads are stopped: automatic collection may come back
            self.collecting = False
            collector.release()
        super().closeEvent(event)

    # ------------------------------------------------------------------ drag and drop

    def dragEnterEvent(self, event) -> None:
        urls = event.mimeData().urls() if event.mimeData().hasUrls() else []
        if any(u.isLocalFile() and looks_like_trace(u.toLocalFile()) for u in urls):
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:
        for u in event.mimeData().urls():
            if u.isLocalFile() and looks_like_trace(u.toLocalFile()):
                self.open_trace(u.toLocalFile())
                event.acceptProposedAction()
                return

    # ------------------------------------------------------------------ errors and status

    def say_long(self, message: str) -> None:
        self.statusBar().showMessage(message, 15000)

    def say_note(self, message: str) -> None:
        """A warning about the run's models (tokenizers that differ but give the same ids): the
        status bar for 30 s, and the log."""
        log.warning("%s", message)
        self.statusBar().showMessage(message, 30000)

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

    def _on_devices(self, devices: tuple[str, ...]) -> None:
        """torch is imported (in the worker): the device menu and the run panel's check get
        the real list, and a Run that waited for it starts."""
        panel = self.run_panel
        panel.devices = tuple(devices)
        chosen = panel.device.currentText()
        for device in devices:
            if panel.device.findText(device) < 0:
                panel.device.addItem(device)
        panel.set_field("device", chosen)
        self.runs.devices_known()

    def _on_preloaded(self, message: str) -> None:
        if self.statusBar().currentMessage() in ("", self.loading_message):  # never over a run's own message
            self.statusBar().showMessage(message, 8000)
        self.live.preloaded()
        self.runs.devices_known(listed=False)  # a failed import lists none: a waiting Run then says why
        startup.mark("models-ready")
        if startup.quit_when_ready():
            startup.mark("close-requested")
            self.close()

    def _on_live_begun(self, description: str) -> None:
        """A live run was prepared and replaces the run on screen: its title, no findings yet
        (until then a start that fails leaves the previous run, its title and findings)."""
        self.findings.set_findings([], checked=False)
        self.setWindowTitle(f"specscope — live: {description}")

    def _on_failed(self, message: str, details: str) -> None:
        self.show_error(message, details)

    def on_activity(self, text: str) -> None:
        if self.session.shows_run_state:
            if text:
                self.run_panel.state_label.setText(text[0].upper() + text[1:])
            else:  # done: the panel's own words for the state again
                self.run_panel.set_state(self.live.state)
        self.update_status()

    def update_status(self) -> None:
        """The status bar's state text, and the actions' enablement (both follow every state change)."""
        self.update_actions()
        m = self.model.metrics
        parts = [self.session.status_words()]
        if self.tabs.currentWidget() is self.compare or self.compare_session.running:
            parts = [self.compare_session.status_words()]  # not the Inspect tab's run
        elif len(m):
            acceptance = f"{m.acceptance_rate:.2f}" if m.drafted_total else "— (nothing drafted)"
            parts.append(
                f"{len(m)} round{'s' if len(m) != 1 else ''} · {m.emitted_total} tokens · acceptance {acceptance}"
            )
        n = self.torch_threads()
        parts.append(f"{n} torch thread{'s' if n != 1 else ''}")
        self.status_bar.set_state(" · ".join(parts))

    def torch_threads(self) -> int:
        """The torch threads the next (or current) run decodes with."""
        from specscope.app.threads import default_threads

        worker = self.live.controller.worker
        if worker.threads is not None and self.live.busy:
            return worker.threads
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


__all__ = [
    "LOADING",
    "PAUSED",
    "RUNNING",
    "MainWindow",
    "app_settings",
    "default_checker",
    "flush_events",
]
