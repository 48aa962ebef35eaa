"""The main window's actions, as data: every menu entry and key of the window in one table,
routed to the controller that does it, with the rule of when it can be used.
`install_actions` (app/gui/actions.py) builds the menus and shortcuts from it and
`update_enablement` greys what the window's context rules out; tests trigger each entry by
its id."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QDockWidget

from specscope.app.gui.actions import Action, records, rounds_at_rest, rounds_exist, run_active
from specscope.app.gui.views.navigator import RoundNavigatorWidget

from . import help_pages

if TYPE_CHECKING:
    from .checks import CheckActions
    from .exports import Exports
    from .run_actions import RunActions
    from .trace_dialogs import TraceDialogs

FULL_VECTORS_TIP = (
    "Recordings keep every p, q and residual in full (about 40x the bytes of the top-N at a vocabulary "
    "of 4096, and slower to record); otherwise the top-N and each vector's support, minimum and sum"
)
Key = Qt.Key


class ActionsWindow(Protocol):
    """What the table routes to: the window's controllers, its navigator and docks."""

    runs: RunActions
    traces: TraceDialogs
    exports: Exports
    checks: CheckActions
    navigator: RoundNavigatorWidget
    run_dock: QDockWidget
    plots_dock: QDockWidget
    findings_dock: QDockWidget

    def close(self) -> bool: ...


def window_actions(w: ActionsWindow) -> tuple[Action, ...]:
    """The table for window `w` (its controllers: runs, traces, exports, checks; its docks)."""
    return (*file_actions(w), *run_actions(w), *view_actions(w), *help_actions(w))


def file_actions(w: ActionsWindow) -> tuple[Action, ...]:
    traces, exports = w.traces, w.exports
    return (
        Action("file.open", "&Open trace…", traces.open_trace_dialog, "&File", QKeySequence.StandardKey.Open),
        Action("file.open_last", "Open &last trace", traces.open_last_trace, "&File", "Ctrl+Shift+O"),
        Action("file.open_recording_store", "Open the &recording store", traces.open_recording_store, "&File"),
        Action(
            "file.full_vectors",
            "Record &full probability vectors",
            w.runs.set_full_vectors,
            "&File",
            tip=FULL_VECTORS_TIP,
            checkable=True,
            checked=lambda: w.runs.full_vectors,
            enabled=records,
        ),
        Action(
            "file.compare_runs",
            "&Compare two runs…",
            traces.compare_stored_dialog,
            "&File",
            tip="Put two stored runs of a trace store side by side on the Compare tab",
        ),
        Action(
            "file.diff_runs",
            "&Diff two runs of a trace…",
            traces.diff_runs_dialog,
            "&File",
            tip="Align two stored runs and report the first divergence in tokens, p and caches",
        ),
        Action(
            "file.export_view",
            "Export current view as &PNG…",
            exports.export_view_dialog,
            "&File",
            "Ctrl+E",
            group="export",
        ),
        Action(
            "file.export_all",
            "Export all views as PNG to a folder…",
            exports.export_all_dialog,
            "&File",
            group="export",
        ),
        Action(
            "file.export_jsonl",
            "Export run as &JSONL…",
            exports.export_jsonl_dialog,
            "&File",
            "Ctrl+J",
            group="export",
            enabled=rounds_exist,
        ),
        Action("file.quit", "&Quit", w.close, "&File", QKeySequence.StandardKey.Quit, group="quit"),
    )


def run_actions(w: ActionsWindow) -> tuple[Action, ...]:
    runs, nav = w.runs, w.navigator
    return (
        Action(
            "run.toggle",
            "Run / Pause",
            runs.toggle_run,
            "&Run",
            Key.Key_Space,
            tip="Run the run panel's settings (also from a replay), or pause the run",
        ),
        Action(
            "run.play",
            "Play / pause the rounds",
            w.traces.toggle_replay_play,
            "&Run",
            Key.Key_P,
            tip="Play the rounds shown back one by one (a replay, or a finished run)",
            enabled=rounds_at_rest,
        ),
        Action("run.step", "Step one round / next round", runs.step_or_next, "&Run", Key.Key_Right),
        Action("run.previous", "Previous round", nav.prev, "&Run", Key.Key_Left, enabled=rounds_exist),
        Action("run.first", "First round", nav.first, "&Run", Key.Key_Home, enabled=rounds_exist),
        Action("run.last", "Last round", nav.last, "&Run", Key.Key_End, enabled=rounds_exist),
        Action("run.stop", "Stop", runs.stop, "&Run", "Ctrl+.", enabled=run_active),
        Action(
            "run.recompute_check",
            "Re&compute check (replay the target)",
            w.checks.recompute_check,
            "&Run",
            tip="Recompute every round's p with the target from the full prefix and compare with the recorded p",
            group="check",
            enabled=rounds_at_rest,
        ),
        Action(
            "run.reference",
            "Compare with plain &greedy (reference)",
            w.checks.reference_check,
            "&Run",
            tip="Decode the prompt plainly with the target and say whether the first difference from this greedy "
            "run is a near tie (numerics) or a logic bug",
            group="check",
            enabled=rounds_at_rest,
        ),
    )


def view_actions(w: ActionsWindow) -> tuple[Action, ...]:
    """Show or hide each dock: Qt's own toggle, which also follows a dock closed by its button."""
    docks = (("view.run_dock", w.run_dock), ("view.plots_dock", w.plots_dock), ("view.findings_dock", w.findings_dock))
    return tuple(Action(name, dock.windowTitle(), None, "&View", qaction=dock.toggleViewAction) for name, dock in docks)


def help_actions(w: ActionsWindow) -> tuple[Action, ...]:
    return (
        Action("help.legend", "Legend and keys", lambda: help_pages.show_legend(w), "&Help"),
        Action("help.kv_caches", "KV caches", lambda: help_pages.show_kv_help(w), "&Help"),
        Action("help.coupled_lanes", "Coupled lanes", lambda: help_pages.show_coupling_help(w), "&Help"),
    )
