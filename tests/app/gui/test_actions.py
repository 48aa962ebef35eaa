"""Every action of the window's table, triggered as a menu or key triggers it (QAction.trigger,
so Qt's `checked` argument is sent), has a visible effect: a dialog, a message, a state change.

Issue 28 (inspector item 2): File > Compare two runs and File > Diff two runs did nothing,
because `checked=False` reached their `path` parameter and they returned early."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QFileDialog, QMessageBox

from specscope.app.gui.actions import Action, install_actions
from tests.app.helpers import configure, wait_idle

# the actions a fresh, idle window answers with a dialog it asks through a static call
ASKS_FOR_A_FILE = {
    "file.open": "Open a trace",
    "file.compare_runs": "Compare two runs",
    "file.diff_runs": "Diff two runs",
    "file.export_view": "Export view",
    "file.export_all": "Export all views to",
}
# ... with an error (status bar and a message box)
SAYS_WHY_NOT = {
    "file.open_last": "No trace was opened before",
    "file.open_recording_store": "No run has been recorded",
}
# greyed by their enablement rule on a fresh window (no run, no rounds), usable once a run has rounds
NEED_ROUNDS = (
    "file.export_jsonl",
    "run.first",
    "run.last",
    "run.previous",
    "run.play",
    "run.recompute_check",
    "run.reference",
)
HELP_TITLES = {"help.legend": "specscope", "help.kv_caches": "KV caches", "help.coupled_lanes": "Coupled lanes"}
DOCKS = {"view.run_dock": "run_dock", "view.plots_dock": "plots_dock", "view.findings_dock": "findings_dock"}
RUN_ACTIONS = (
    "run.step",
    "run.toggle",
    "run.stop",
    "run.first",
    "run.last",
    "run.previous",
    "run.play",
    "run.recompute_check",
    "run.reference",
)


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


TESTED = (
    set(ASKS_FOR_A_FILE)
    | set(SAYS_WHY_NOT)
    | set(HELP_TITLES)
    | set(DOCKS)
    | set(RUN_ACTIONS)
    | set(NEED_ROUNDS)
    | {"file.full_vectors", "file.quit"}
)


def menu_entries(window) -> list[tuple[str, str]]:
    """(object name, menu path) of every entry of every menu of the menu bar, submenus too:
    what a person can click, whoever made the QAction."""
    found = []

    def walk(menu, where):
        for action in menu.actions():
            if action.isSeparator():
                continue
            label = f"{where} > {action.text()}"
            if action.menu() is not None:
                walk(action.menu(), label)
            else:
                found.append((action.objectName(), label))

    for top in window.menuBar().actions():
        walk(top.menu(), top.text())
    return found


def test_every_menu_entry_is_tested_here(make_window):
    """Enumerated from the menu bar, not the table: an entry added any other way is caught too."""
    w = make_window()
    entries = menu_entries(w)
    assert len(entries) >= len(TESTED)
    untested = [label for name, label in entries if name not in TESTED]
    assert not untested, f"menu entries without a test in test_every_action_has_a_visible_effect: {untested}"
    assert {name for name, _ in entries} >= TESTED, "a tested action is in no menu"


def test_every_action_has_a_visible_effect(qtbot, make_window, tmp_path, dialogs):
    w = make_window(store_path=str(tmp_path / "none-yet.sqlite"))
    assert set(w.qactions) == TESTED, "an action of the table has no test here"
    greyed = [a for a in NEED_ROUNDS + ("run.stop",) if not w.action(a).isEnabled()]
    assert greyed == [*NEED_ROUNDS, "run.stop"], "a fresh window has no run to browse, check, export or stop"
    w.last_error = None
    w.action("file.export_jsonl").trigger()  # greyed: nothing happens, as from its key
    assert w.last_error is None and w.error_box is None

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
    qtbot.waitUntil(lambda: w.live.state == "paused" and len(w.model.rounds) == 1, timeout=20000)
    assert w.action("run.stop").isEnabled() and not w.action("run.recompute_check").isEnabled()  # a run holds it
    first_run = w.model.config.run_id
    w.action("run.stop").trigger()
    qtbot.waitUntil(lambda: w.live.state == "idle", timeout=20000)
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
    assert all(w.action(a).isEnabled() for a in NEED_ROUNDS) and not w.action("run.stop").isEnabled()
    w.action("run.recompute_check").trigger()
    w.action("run.reference").trigger()
    assert dialogs == ["Recompute check", "Compare with plain greedy"]


def test_a_callback_never_gets_qts_checked_argument(qtbot, make_window):
    """The one rule in install_actions: a plain callback is called with nothing, a checkable
    one with its new state."""
    w = make_window()
    calls = []
    made = install_actions(
        w,
        (
            Action("test.plain", "Plain", lambda path=None: calls.append(("plain", path)), "&Test"),
            Action("test.check", "Check", lambda on: calls.append(("check", on)), "&Test", checkable=True),
        ),
    )
    made["test.plain"].trigger()
    made["test.check"].trigger()
    made["test.check"].trigger()
    assert calls == [("plain", None), ("check", True), ("check", False)]
    with pytest.raises(ValueError, match="two actions"):
        install_actions(w, (Action("a", "A", print, "&Test"), Action("a", "A", print, "&Test")))


def test_compare_and_diff_two_runs_from_the_menu_show_the_runs(qtbot, make_window, tmp_path, monkeypatch):
    """File > Compare two runs and File > Diff two runs, from the menu (Qt's checked=False sent)
    through the file dialog and the run pickers to what they show: the two runs on the Compare
    tab, their diff in a message. The file dialog starts at the recording store (in a hidden
    folder a new user could not find), not the working directory."""
    from PySide6.QtWidgets import QInputDialog

    from specscope.app.gui.controllers import trace_dialogs

    store = str(tmp_path / "recorded.sqlite")
    w = make_window(store_path=store)
    ids = []
    for seed in ("0", "1"):
        configure(w, max_new_tokens="12", temperature="1", seed=seed)
        w.start_run()
        wait_idle(qtbot, w)
        ids.append(w.model.config.run_id)
    started_at, shown = [], []
    monkeypatch.setattr(
        QFileDialog,
        "getOpenFileName",
        staticmethod(lambda parent, title, start, *a, **k: (started_at.append(start), (store, ""))[1]),
    )
    picks = iter(ids)
    monkeypatch.setattr(trace_dialogs, "pick_run", lambda *a, **k: next(picks))
    w.action("file.compare_runs").trigger()
    assert started_at == [store]
    assert w.tabs.currentWidget() is w.compare and w.compare_session.count == 2
    assert [m.config.run_id for m in w.compare_session.models] == ids and all(
        m.rounds for m in w.compare_session.models
    )

    labels = iter(range(2))
    monkeypatch.setattr(
        QInputDialog, "getItem", staticmethod(lambda parent, title, label, items, *a, **k: (items[next(labels)], True))
    )
    monkeypatch.setattr(
        QMessageBox, "information", staticmethod(lambda parent, title, text: shown.append((title, text)))
    )
    w.action("file.diff_runs").trigger()
    assert len(shown) == 1 and shown[0][0] == "Diff runs" and ids[0][:8] in shown[0][1]


# the signals a button or menu entry sends with Qt's `checked` argument
CHECKED_SIGNALS = ("clicked", "triggered", "toggled")


def test_no_button_or_action_slot_takes_qts_checked_for_an_optional_parameter():
    """Every `X.clicked/triggered/toggled.connect(self.method)` in the GUI: the method takes no
    optional first parameter that Qt's `checked` would fill (File > Compare two runs once got
    checked=False for its path). Read from the source, so a new connection is checked too."""
    import ast
    import pathlib

    import specscope.app.gui as gui

    root = pathlib.Path(gui.__file__).parent
    offenders, connections = [], 0
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        methods = {
            node.name: node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "connect"
                and isinstance(node.func.value, ast.Attribute)
                and node.func.value.attr in CHECKED_SIGNALS
                and node.args
            ):
                continue
            connections += 1
            slot = node.args[0]
            if isinstance(slot, ast.Lambda):
                args = slot.args
            elif isinstance(slot, ast.Attribute) and slot.attr in methods:
                args = methods[slot.attr].args
            else:
                continue  # a signal's emit, a local function checked by its own tests
            positional = [a.arg for a in args.posonlyargs + args.args if a.arg != "self"]
            n_defaults = len(args.defaults)
            first_optional = positional and len(positional) <= n_defaults
            if first_optional and positional[0] not in ("checked", "_checked", "on", "_"):
                offenders.append(f"{path.relative_to(root)}:{node.lineno} {ast.unparse(slot)[:60]}")
    assert connections >= 8
    assert not offenders, offenders
