"""Every action of the window's table, triggered as a menu or key triggers it (QAction.trigger,
so Qt's `checked` argument is sent), has a visible effect: a dialog, a message, a state change.

Issue 28 (inspector item 2): File > Compare two runs and File > Diff two runs did nothing,
because `checked=False` reached their `path` parameter and they returned early."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QFileDialog, QMessageBox

from specscope.app.gui.actions import Action, install_actions

from .helpers import configure, wait_idle

# the actions a fresh, idle window answers with a dialog it asks through a static call
ASKS_FOR_A_FILE = {"file.open": "Open a trace", "file.compare_runs": "Compare two runs",
                   "file.diff_runs": "Diff two runs", "file.export_view": "Export view",
                   "file.export_all": "Export all views to"}
# ... with an error (status bar and a message box)
SAYS_WHY_NOT = {"file.open_last": "No trace was opened before", "file.open_recording_store": "No run has been recorded",
                "file.export_jsonl": "Nothing to export yet"}
HELP_TITLES = {"help.legend": "specscope", "help.kv_caches": "KV caches", "help.coupled_lanes": "Coupled lanes"}
DOCKS = {"view.run_dock": "run_dock", "view.plots_dock": "plots_dock", "view.findings_dock": "findings_dock"}
RUN_ACTIONS = ("run.step", "run.toggle", "run.stop", "run.first", "run.last", "run.previous", "run.play",
               "run.recompute_check", "run.reference")


@pytest.fixture
def dialogs(monkeypatch):
    """The static dialogs record their title and answer "cancelled"."""
    seen: list[str] = []

    def asked(answer):
        return staticmethod(lambda parent, title, *a, **k: (seen.append(title), answer)[1])

    monkeypatch.setattr(QFileDialog, "getOpenFileName", asked(("", "")))
    monkeypatch.setattr(QFileDialog, "getSaveFileName", asked(("", "")))
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", asked(""))
    monkeypatch.setattr(QMessageBox, "information", asked(QMessageBox.StandardButton.Ok))
    return seen


def test_every_action_has_a_visible_effect(qtbot, make_window, tmp_path, dialogs):
    w = make_window(store_path=str(tmp_path / "none-yet.sqlite"))
    tested = set(ASKS_FOR_A_FILE) | set(SAYS_WHY_NOT) | set(HELP_TITLES) | set(DOCKS) | set(RUN_ACTIONS)
    tested |= {"file.full_vectors", "file.quit"}
    assert tested == set(w.qactions), "an action of the table has no test here"

    for action_id, title in {**ASKS_FOR_A_FILE, **HELP_TITLES}.items():
        dialogs.clear()
        w.action(action_id).trigger()
        assert dialogs == [title], action_id
    for action_id, words in SAYS_WHY_NOT.items():
        w.last_error = None
        w.action(action_id).trigger()
        assert words in (w.last_error or ""), action_id
        assert w.error_box is not None and w.error_box.isVisible(), action_id
        w.error_box.close()
    for action_id, dock in DOCKS.items():
        dock = getattr(w, dock)
        before = dock.isVisible()
        w.action(action_id).trigger()
        assert dock.isVisible() != before, action_id
        w.action(action_id).trigger()
        assert dock.isVisible() == before, action_id

    full = w.action("file.full_vectors")
    full.trigger()
    assert full.isChecked() and w.live.recording.full_vectors and "full probability" in w.statusBar().currentMessage()
    full.trigger()
    assert not full.isChecked() and not w.live.recording.full_vectors and "top-N" in w.statusBar().currentMessage()

    _run_actions(qtbot, w, dialogs)

    w.action("file.quit").trigger()
    assert not w.isVisible()


def _run_actions(qtbot, w, dialogs) -> None:
    """The Run menu on a live run: Step starts it paused, Stop ends it, Space starts the next
    one; the round keys move the selection; the recompute check reports."""
    configure(w, max_new_tokens="40")
    w.action("run.step").trigger()
    qtbot.waitUntil(lambda: w.state == "paused" and len(w.model.rounds) == 1, timeout=20000)
    first_run = w.model.config.run_id
    w.action("run.stop").trigger()
    qtbot.waitUntil(lambda: w.state == "idle", timeout=20000)
    w.action("run.toggle").trigger()
    qtbot.waitUntil(lambda: getattr(w.model.config, "run_id", first_run) != first_run, timeout=20000)
    wait_idle(qtbot, w)
    n = len(w.model.rounds)
    assert n >= 3, "the run was too short to move the selection"
    w.action("run.first").trigger()
    assert w.model.selected[0] == 0
    w.action("run.last").trigger()
    assert w.model.selected[0] == n - 1
    w.action("run.previous").trigger()
    assert w.model.selected[0] == n - 2
    w.action("run.play").trigger()  # a finished run plays back from where it is
    qtbot.waitUntil(lambda: w.model.selected[0] == n - 1, timeout=5000)
    dialogs.clear()
    w.action("run.recompute_check").trigger()
    w.action("run.reference").trigger()
    assert dialogs == ["Recompute check", "Compare with plain greedy"]


def test_a_callback_never_gets_qts_checked_argument(qtbot, make_window):
    """The one rule in install_actions: a plain callback is called with nothing, a checkable
    one with its new state."""
    w = make_window()
    calls = []
    made = install_actions(w, (
        Action("test.plain", "Plain", lambda path=None: calls.append(("plain", path)), "&Test"),
        Action("test.check", "Check", lambda on: calls.append(("check", on)), "&Test", checkable=True),
    ))
    made["test.plain"].trigger()
    made["test.check"].trigger()
    made["test.check"].trigger()
    assert calls == [("plain", None), ("check", True), ("check", False)]
    with pytest.raises(ValueError, match="two actions"):
        install_actions(w, (Action("a", "A", print, "&Test"), Action("a", "A", print, "&Test")))
