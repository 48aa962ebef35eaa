"""Everything that opens a trace store: open one of its runs for replay (asking which, and
before replacing a live run), compare two stored runs side by side, diff two runs. Owned by
the window (`window.traces`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox, QStatusBar, QTabWidget, QWidget

from specscope.app.gui.model.runmodel import RunModel
from specscope.app.gui.model.traces import TraceLibrary, describe_run
from specscope.app.gui.sessions.compare import CompareSession
from specscope.app.gui.sessions.hub import ModelHub
from specscope.app.gui.sessions.live import LiveSession
from specscope.app.gui.sessions.protocol import InspectSession
from specscope.app.gui.sessions.replay import ReplaySession, run_token_text
from specscope.app.gui.views.compare import CompareWidget
from specscope.app.gui.views.findings import FindingsWidget
from specscope.app.gui.views.navigator import RoundNavigatorWidget
from specscope.app.gui.views.pages import InspectPage
from specscope.app.gui.views.run_picker import pick_run

if TYPE_CHECKING:
    from .checks import CheckActions
    from .replay_panel import ReplayPanel

log = logging.getLogger(__name__)

TRACE_FILTER = "Trace stores (*.sqlite *.sqlite3 *.db);;All files (*)"
CHECK_ROUNDS = 20_000  # the picker checks runs (for their finding counts) up to this many rounds in all


def finding_counter(library: TraceLibrary, runs: list[Any]) -> Callable[[int], str]:
    """Each run's finding count from the checker, one run a call, in the runs' order ("—" past
    CHECK_ROUNDS rounds in all): the count `specscope check` gives (storage.checking.check_stored_run,
    end record included). The picker calls it after it is shown, so a store of many runs opens
    at once and its counts fill in."""
    budget = [CHECK_ROUNDS]

    def count(index: int) -> str:
        from specscope.storage.checking import check_stored_run

        info = runs[index]
        if info.n_rounds > budget[0]:
            return "—"
        budget[0] -= info.n_rounds
        try:
            return str(len(check_stored_run(library.store, info.run_id, info=info).findings))
        except Exception:  # noqa: BLE001 - a count is a convenience
            return "?"

    return count


def finding_counts(library: TraceLibrary, runs: list[Any]) -> list[str]:
    """Every run's finding count at once (finding_counter's, in order)."""
    count = finding_counter(library, runs)
    return [count(i) for i in range(len(runs))]


class TraceWindow(Protocol):
    """What TraceDialogs uses of the window (a QWidget: the parent of its dialogs)."""

    qsettings: QSettings
    store_path: str | None
    hub: ModelHub
    live: LiveSession
    replay: ReplaySession
    session: InspectSession
    model: RunModel
    compare_session: CompareSession
    tabs: QTabWidget
    page: InspectPage
    compare: CompareWidget
    navigator: RoundNavigatorWidget
    findings: FindingsWidget
    checks: CheckActions
    replay_panel: ReplayPanel

    def statusBar(self) -> QStatusBar: ...

    def setWindowTitle(self, title: str) -> None: ...

    def show_error(self, message: str, details: str = "", title: str = "specscope") -> None: ...

    def say_long(self, message: str) -> None: ...

    def update_status(self) -> None: ...


class TraceDialogs:
    def __init__(self, window: TraceWindow):
        self.w = window
        self.last_trace = window.qsettings.value("trace/last") or None
        self.newer_note: str | None = None  # the last store of a newer schema opened: what the status bar said

    def parent(self) -> QWidget | None:
        """The dialogs' parent: the window."""
        return self.w if isinstance(self.w, QWidget) else None

    def ask(self, title: str, question: str) -> bool:
        """A yes/no question (tests replace it)."""
        answer = QMessageBox.question(self.parent(), title, question)
        return answer == QMessageBox.StandardButton.Yes

    def choose_file(self, title: str) -> str:
        """A trace store picked in a file dialog ("" when cancelled), starting at the last trace
        opened, else at the recording store (the runs just made: it lies in a hidden folder,
        ~/.local/share/specscope, that a new user could not find from the working directory)."""
        path, _ = QFileDialog.getOpenFileName(
            self.parent(), title, str(self.last_trace or self.recording_store() or ""), TRACE_FILTER
        )
        return path

    def recording_store(self) -> str | None:
        """The store live runs are recorded to, when it is a file that exists."""
        from specscope.app.gui.model.traces import default_trace_path
        from specscope.storage import TraceStoreError

        try:
            path = self.w.store_path or default_trace_path()
        except TraceStoreError:
            return None
        return path if os.path.isfile(path) else None

    # ------------------------------------------------------------------ opening a run

    def open_trace_dialog(self) -> None:
        path = self.choose_file("Open a trace")
        if path:
            self.open_trace(path)

    def open_last_trace(self) -> None:
        if self.last_trace and os.path.exists(str(self.last_trace)):
            self.open_trace(str(self.last_trace))
        else:
            self.w.show_error("No trace was opened before (or it has moved).")

    def open_recording_store(self) -> None:
        """The store live runs are recorded to: pick one of its runs to replay."""
        from specscope.app.gui.model.traces import default_trace_path
        from specscope.storage import TraceStoreError

        try:
            path = self.w.store_path or default_trace_path()
        except TraceStoreError as exc:  # no home directory: there is no default store
            self.w.show_error(str(exc))
            return
        if os.path.exists(path):
            self.open_trace(path)
        else:
            self.w.show_error(f"No run has been recorded yet ({path} does not exist).")

    def _choose_run(self, library: TraceLibrary, runs: list[Any]) -> str | None:
        if len(runs) == 1:
            return runs[0].run_id
        prompts = [r.prompt_text or self.w.replay_panel.decode_prompt(r) for r in runs]
        return pick_run(self.parent(), runs, prompts, findings=finding_counter(library, runs))

    def open_trace(self, path: str, run_id: str | None = None) -> bool:
        """Open a trace store (a file, or a database URL) and replay one of its runs (asks
        which when there are several, and before replacing a live run that is going)."""
        if "://" not in path and not os.path.exists(path):
            self.w.show_error(f"No such trace file: {path}")
            return False
        try:
            library = TraceLibrary(path)
            runs = library.runs()
        except Exception as exc:  # noqa: BLE001 - not a trace, corrupt, newer schema...
            self.w.show_error(f"Cannot open {os.path.basename(path)}: {exc}", title="Open trace")
            return False
        self.say_newer(library)
        info = self._open_run(library, path, runs, run_id)
        if info is None:
            library.close()
            return False
        try:
            self._open_partner(library, path, info)
        except Exception:
            log.exception("could not open the run's comparison")
        self.replay_trace(library, path, info)
        return True

    def say_newer(self, library: TraceLibrary) -> None:
        """A store of a newer schema is read as far as this version understands it: the
        status bar says so (and keeps saying it while the replay shows)."""
        note = library.store.newer_schema
        if note:
            self.newer_note = note
            self.w.statusBar().showMessage(note)
            log.warning("%s", note)

    def _open_run(self, library: TraceLibrary, path: str, runs: list[Any], run_id: str | None) -> Any:
        show_error = self.w.show_error
        if not runs:
            show_error(f"{os.path.basename(path)} holds no runs.", title="Open trace")
            return None
        if run_id is None:
            run_id = self._choose_run(library, runs)
            if run_id is None:
                return None
        matches = [r.run_id for r in runs if r.run_id.startswith(run_id)]
        if len(matches) != 1:
            show_error(
                f"{os.path.basename(path)} has {'no' if not matches else 'several'} run(s) matching {run_id!r}.",
                title="Open trace",
            )
            return None
        try:
            info = library.run(matches[0])
        except Exception as exc:  # noqa: BLE001
            show_error(f"Cannot read run {run_id}: {exc}", title="Open trace")
            return None
        if self.w.live.busy and not self.ask("Open trace", "A live run is going. Stop it and replay the trace?"):
            return None
        return info

    # ------------------------------------------------------------------ two runs

    def compare_stored_dialog(self, path: str | None = None) -> bool:
        """File > Compare two runs: any two runs of a store side by side on the Compare tab."""
        path = path or self.choose_file("Compare two runs")
        if not path:
            return False
        try:
            library = TraceLibrary(path)
            runs = library.runs()
        except Exception as exc:  # noqa: BLE001
            self.w.show_error(f"Cannot open {os.path.basename(path)}: {exc}", title="Compare two runs")
            return False
        self.say_newer(library)
        try:
            if len(runs) < 2:
                self.w.show_error(
                    f"{os.path.basename(path)} holds {len(runs)} run(s); a comparison needs two.",
                    title="Compare two runs",
                )
                return False
            prompts = [r.prompt_text or self.w.replay_panel.decode_prompt(r) for r in runs]
            picked = [pick_run(self.parent(), runs, prompts, f"Compare two runs: run {which}") for which in "AB"]
        finally:
            library.close()
        if None in picked:
            return False
        return self.compare_stored(path, picked[0], picked[1])

    def compare_stored(self, path: str, *run_ids: str, show: bool = True) -> bool:
        """Read two or three stored runs into the Compare tab's lanes (A, B, C in order)."""
        try:
            library = TraceLibrary(path)
            self.say_newer(library)
            try:
                infos = [library.run(r) for r in run_ids]
                lanes = [
                    (info, library.rounds(info.run_id), run_token_text(self.w.hub, info, say=self.w.say_long))
                    for info in infos
                ]
            finally:
                library.close()
        except Exception as exc:  # noqa: BLE001 - never a traceback in the GUI
            self.w.show_error(f"Cannot read these runs: {exc}", title="Compare two runs")
            return False
        self.w.compare_session.load(lanes, path)
        if show:
            self.w.tabs.setCurrentWidget(self.w.compare)
        return True

    def _open_partner(self, library: TraceLibrary, path: str, info: Any) -> None:
        """A run recorded by compare mode: its comparison opens side by side on the Compare tab."""
        from specscope.app.gui.sessions.compare import comparison_of

        mine = comparison_of(info)
        if mine is None:
            return
        lanes = {
            comparison_of(r)[1]: r.run_id
            for r in library.runs()
            if r.run_id != info.run_id and (comparison_of(r) or ("", ""))[0] == mine[0]
        }
        if not lanes:
            return
        lanes[mine[1]] = info.run_id
        if self.compare_stored(path, *(lanes[name] for name in sorted(lanes)), show=False):
            self.w.statusBar().showMessage(
                f"Run {info.run_id[:8]} is lane {mine[1]} of a comparison: its "
                f"{len(lanes)} lanes are on the Compare tab.",
                15000,
            )

    def diff_runs_dialog(self, path: str | None = None) -> str | None:
        """Pick a trace store and two of its runs; show `specscope diff` of them."""
        path = path or self.choose_file("Diff two runs")
        if not path:
            return None
        try:
            library = TraceLibrary(path)
        except Exception as exc:  # noqa: BLE001 - not a trace, corrupt, newer schema...
            self.w.show_error(f"Cannot open {os.path.basename(path)}: {exc}", title="Diff runs")
            return None
        self.say_newer(library)
        try:
            text = self._diff_two(library, path)
        except Exception as exc:  # noqa: BLE001 - never a traceback in the GUI
            self.w.show_error(f"Cannot diff these runs: {exc}", title="Diff runs")
            return None
        finally:
            library.close()
        if text is not None:
            QMessageBox.information(self.parent(), "Diff runs", text)
        return text

    def _diff_two(self, library: TraceLibrary, path: str) -> str | None:
        """Ask for runs A and B of `library`; their diff (None when cancelled or too few runs)."""
        runs = library.runs()
        if len(runs) < 2:
            self.w.show_error(
                f"{os.path.basename(path)} holds {len(runs)} run(s); a diff needs two.", title="Diff runs"
            )
            return None
        labels = [describe_run(r) for r in runs]
        picked = []
        for which in ("A", "B"):
            choice, ok = QInputDialog.getItem(self.parent(), "Diff runs", f"Run {which}:", labels, len(picked), False)
            if not ok:
                return None
            picked.append(runs[labels.index(choice)].run_id)
        return library.diff(*picked)

    # ------------------------------------------------------------------ replay

    def replay_trace(self, library, path: str, info) -> None:
        """Make the replay session active on `info`'s run (the live run, if any, stops)."""
        w = self.w
        w.live.stop()
        w.live.active = False
        w.session = w.replay
        w.replay.open(library, path, info)
        w.findings.set_findings([], checked=False)
        try:
            w.replay_panel.show_trace_settings(info)
        except Exception:
            log.exception("could not show the trace's settings")
        w.setWindowTitle(f"specscope — {path.rsplit('/', 1)[-1]} · {describe_run(info)}")
        w.tabs.setCurrentWidget(w.page)
        w.qsettings.setValue("trace/last", path)
        self.last_trace = path
        w.update_status()
        w.navigator.refresh_play()

    def replay_done(self) -> None:
        self.w.checks.run_checker()
        self.w.statusBar().showMessage(
            f"Loaded {len(self.w.model.rounds)} rounds from {self.w.replay.trace_path}", 8000
        )

    def leave_replay(self) -> None:
        self.w.replay.close()
        self.w.session = self.w.live
        self.w.live.active = True
        self.w.navigator.refresh_play()

    def toggle_replay_play(self) -> None:
        if self.w.session.can_play():
            self.w.live.follow_latest = False
            self.w.replay.toggle_play()
