"""What the run buttons and keys do, routed to the active session: run, step, pause and stop
a live run; play a replay; start a comparison; what full vectors the next recordings keep.
Owned by the window (`window.runs`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QStatusBar, QTabWidget

from specscope.app.gui.model.runmodel import RunModel
from specscope.app.gui.model.settings import PanelSettings
from specscope.app.gui.sessions.compare import CompareSession
from specscope.app.gui.sessions.hub import ModelHub
from specscope.app.gui.sessions.live import LiveSession
from specscope.app.gui.sessions.protocol import InspectSession
from specscope.app.gui.sessions.worker import LOADING, RUNNING, RunController
from specscope.app.gui.views.compare import CompareWidget
from specscope.app.gui.views.navigator import RoundNavigatorWidget
from specscope.app.gui.views.runpanel import RunPanelWidget

if TYPE_CHECKING:
    from .checks import CheckActions
    from .trace_dialogs import TraceDialogs

FULL_VECTORS_KEY = "recording/full_vectors"
LANE_FIELDS = ("proposer", "k", "engine", "checkpoint", "draw", "tree", "children")  # a compare lane's own


class RunActionsWindow(Protocol):
    """What RunActions uses of the window."""

    qsettings: QSettings
    hub: ModelHub
    live: LiveSession
    session: InspectSession
    model: RunModel
    run_panel: RunPanelWidget
    navigator: RoundNavigatorWidget
    tabs: QTabWidget
    compare: CompareWidget
    compare_controller: RunController
    compare_session: CompareSession
    checks: CheckActions
    traces: TraceDialogs
    last_error: str | None

    def statusBar(self) -> QStatusBar: ...

    def start_preload(self) -> None: ...

    def on_activity(self, text: str) -> None: ...

    def update_status(self) -> None: ...


class RunActions:
    def __init__(self, window: RunActionsWindow):
        self.w = window
        self.full_vectors = str(window.qsettings.value(FULL_VECTORS_KEY, "false")) == "true"
        window.live.recording.full_vectors = self.full_vectors
        self.waiting_run: bool | None = None  # a Run (True) or Step (False) waiting for the device list

    def set_full_vectors(self, checked: bool) -> None:
        """File > Record full probability vectors (for the next recorded runs)."""
        self.full_vectors = checked
        self.w.live.recording.full_vectors = checked
        self.w.qsettings.setValue(FULL_VECTORS_KEY, "true" if checked else "false")
        self.w.statusBar().showMessage(
            "The next recorded runs keep full probability vectors"
            if checked
            else (
                "The next recorded runs keep the top-N of each distribution (full vectors for vocabularies up to 1024)"
            ),
            8000,
        )

    def validated_settings(self) -> PanelSettings | None:
        v = self.w.run_panel.validate()
        if not v.ok:
            self._cannot_run(v.errors)
            return None
        return v.settings

    def refused(self, errors: dict[str, str]) -> None:
        """The worker refused the settings with the models loaded (core.decode.factory: the
        prompt plus the budget past the position limit, an EOS outside the vocabulary): each
        message under its field, as the CLI refuses them; no run started."""
        self.w.run_panel.show_errors(errors)
        self._cannot_run(errors)

    def _cannot_run(self, errors: dict[str, str], verb: str = "run") -> None:
        first = next(iter(errors.values()), "")
        self.w.statusBar().showMessage(f"Cannot {verb}: {first}", 10000)
        self.w.last_error = first

    def compare_refused(self, errors: dict[str, str], lane: int) -> None:
        """The compare worker refused lane `lane`'s settings with the models loaded (the prompt
        plus max new tokens past the position limit, a draft that cannot propose for the
        target): a lane's own field's message beside that lane, the run panel's fields' under
        them, as a refused Run shows them (it was a dialog, and nothing under the field)."""
        w = self.w
        own = {key: msg for key, msg in errors.items() if key in LANE_FIELDS}
        if own:
            w.compare.show_lane_error(lane, "; ".join(own.values()))
        w.run_panel.show_errors({key: msg for key, msg in errors.items() if key not in LANE_FIELDS})
        self._cannot_run(errors, "compare")

    def start_run(self, run: bool = True) -> bool:
        """Start the run panel's settings live (leaving a replay); False when they do not validate.
        A device other than cpu asked for while torch still loads waits for the device list."""
        w = self.w
        device = (w.run_panel.texts().get("device") or "").strip()
        if device and not w.hub.devices_known and device not in w.hub.devices():
            self.waiting_run = run
            w.start_preload()  # lists the devices (a window driven before its first paint has not started it)
            w.statusBar().showMessage(
                f"The run starts once torch has loaded and can say whether {device} is available…"
            )
            return True
        settings = self.validated_settings()
        if settings is None:
            return False
        self.w.last_error = None
        self.w.traces.leave_replay()
        self.w.live.start(settings, run=run)  # the title and the findings follow once it is prepared (live.begun)
        return True

    def devices_known(self, listed: bool = True) -> None:
        """The worker listed the devices (or, `listed` False, gave up loading): start the Run
        that waited for them; unlisted, the run panel's check refuses an unknown device."""
        if self.waiting_run is None:
            return
        run, self.waiting_run = self.waiting_run, None
        if listed or self.w.hub.devices_known:
            self.start_run(run)
        else:
            self.validated_settings()  # refuses the device under its field: torch did not load

    def run_or_resume(self) -> None:
        self.w.session.run_key(self.start_run)

    def toggle_run(self) -> None:
        """Space: run/pause (from a replay: a new live run; the Compare tab: start or stop the comparison)."""
        w = self.w
        if w.tabs.currentWidget() is w.compare:
            if w.compare_controller.state in (RUNNING, LOADING):
                w.compare_session.stop()
            else:
                self.start_compare()
            return
        w.session.space_key(self.start_run)

    def pause(self) -> None:
        self.w.live.pause()

    def step(self) -> None:
        self.w.session.step_key(self.start_run)

    def step_or_next(self) -> None:
        if self.w.session.browses():
            self.w.live.follow_latest = False
            self.w.navigator.next()
        else:
            self.step()

    def stop(self) -> None:
        self.w.live.stop()

    def start_compare(self) -> None:
        w = self.w
        w.tabs.setCurrentWidget(w.compare)
        w.last_error = None  # a refused Run's message is not this comparison's
        lanes = w.compare.lane_settings(w.run_panel.texts(), w.hub.devices())
        if lanes is None:
            base = w.run_panel.validate()
            msg = next(iter(base.errors.values()), "check the proposers and k of the lanes")
            w.statusBar().showMessage(f"Cannot compare: {msg}", 10000)
            w.last_error = msg
            return
        w.compare_session.start(*lanes)

    def on_state(self, state: str) -> None:
        w = self.w
        if w.session.shows_run_state:
            w.run_panel.set_state(state)
            if w.live.activity_text:
                w.on_activity(w.live.activity_text)
        w.navigator.refresh_play()
        w.update_status()

    def on_live_finished(self, reason: str) -> None:
        self.w.checks.run_checker()
        m = self.w.model.metrics
        self.w.statusBar().showMessage(
            f"Run finished ({reason}): {m.emitted_total} tokens in {len(m)} rounds, "
            f"mean accepted length {m.mean_accepted_length:.2f}",
            15000,
        )
