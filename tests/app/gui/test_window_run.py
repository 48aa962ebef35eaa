"""Drive the real window with the tiny models: run, step, stop, inspect, errors."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from specscope.app.gui import theme
from specscope.app.gui.sessions.worker import IDLE, PAUSED
from tests.app.helpers import configure, wait_idle


def test_run_fills_timeline_inspector_tree_and_plots(qtbot, window):
    configure(window, temperature="1.0", proposer="draft-tiny", max_new_tokens="40", seed="5")
    qtbot.mouseClick(window.run_panel.run_button, Qt.MouseButton.LeftButton)
    wait_idle(qtbot, window)
    model = window.model
    assert model.stop_reason == "budget"
    assert len(model.output_tokens) == 40
    assert window.last_error is None
    # The timeline laid out every cell and paints without error.
    tl = window.timeline
    assert tl._laid == len(model.cells)
    tl.viewport().grab()
    # Click the first rejected draft token in the timeline: inspector shows that round.
    r = next(r for r in model.rounds if r.rejected_node is not None)
    cell = next(
        i for i in range(len(model.cells)) if model.cells.round[i] == r.index and model.cells.kind[i] == theme.REJECTED
    )
    tl.ensure_cell_visible(cell)
    rect = tl.cell_rect(cell)
    qtbot.mouseClick(tl.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert model.selected == (r.index, r.rejected_node)
    values = window.inspector.values
    node = r.nodes[r.rejected_node]
    assert values["round"] == r.index and values["status"] == "rejected"
    assert values["ratio"] == pytest.approx(node.ratio) and values["u"] == pytest.approx(node.u)
    assert values["residual_mass"] == pytest.approx(r.residual_mass)
    j = values["tokens"].index(node.token)
    assert values["p"][j] == pytest.approx(node.p_token)
    assert values["q"][j] == pytest.approx(node.q_token)
    assert values["min"][j] == pytest.approx(min(node.p_token, node.q_token))
    tc = r.target_cache
    assert values["target_cache"] == (tc.before, tc.peak, tc.after, tc.pending)
    assert "rejected" in values["header"]
    # The tooltip explains the decision.
    tip = tl.tooltip_for(cell)
    assert "rejected" in tip and "u =" in tip
    # Draft tree: the repair is a sibling of the rejected node, clicking a node selects it.
    keys = {n.key: n for n in window.tree.nodes}
    assert keys["repair"].parent == keys[f"n{r.rejected_node}"].parent
    assert keys["repair"].depth == keys[f"n{r.rejected_node}"].depth
    if r.rejected_node > 0:
        window.tree.click_node("n0")
        assert model.selected == (r.index, 0)
        assert window.inspector.values["status"] == "accepted"
    # Live plots hold one point per round.
    window.plots.refresh()
    assert len(window.plots.acc_scatter.data) == len(model.rounds)
    assert "mean accepted length" in window.plots.summary.text()


def test_step_pause_resume_and_stop(qtbot, window):
    configure(window, max_new_tokens="400")
    qtbot.mouseClick(window.run_panel.step_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(window.model.rounds) == 1 and window.live.state == PAUSED, timeout=20000)
    qtbot.mouseClick(window.run_panel.step_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(window.model.rounds) == 2 and window.live.state == PAUSED, timeout=20000)
    qtbot.wait(100)
    assert len(window.model.rounds) == 2  # a step is exactly one round
    assert window.run_panel.run_button.text() == "Resume"
    # Resume, then stop: cancelled at a round boundary, before the budget.
    qtbot.mouseClick(window.run_panel.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(window.model.rounds) >= 4, timeout=20000)
    qtbot.mouseClick(window.run_panel.stop_button, Qt.MouseButton.LeftButton)
    wait_idle(qtbot, window)
    assert window.model.stop_reason == "cancelled"
    assert len(window.model.output_tokens) < 400
    assert [r.index for r in window.model.rounds] == list(range(len(window.model.rounds)))


def test_bad_settings_are_explained_next_to_the_field(qtbot, window):
    configure(window, k="0", top_p="2", prompt="")
    qtbot.mouseClick(window.run_panel.run_button, Qt.MouseButton.LeftButton)
    qtbot.wait(50)
    errors = window.run_panel.errors
    assert errors["k"].isVisible() and errors["k"].text() == "k (draft length) must be at least 1, got 0"
    assert errors["top_p"].isVisible() and "(0, 1]" in errors["top_p"].text()
    assert errors["prompt"].text()
    assert not errors["seed"].text()
    assert window.live.state == IDLE and not window.model.rounds
    # Fixing the field clears its message as you type.
    window.run_panel.set_field("k", "3")
    assert not errors["k"].text()


def test_worker_exceptions_become_a_dialog(qtbot, make_window, hub, monkeypatch):
    window = make_window(record=False)
    configure(window)

    def broken(settings, run_id=None):
        raise RuntimeError("the draft checkpoint is corrupt")

    monkeypatch.setattr(hub, "build", broken)
    qtbot.mouseClick(window.run_panel.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.error_box is not None and window.error_box.isVisible(), timeout=10000)
    assert "corrupt" in window.error_box.text()
    assert "Traceback" in window.error_box.detailedText()  # details are there, not in the face
    assert window.live.state == IDLE
    window.error_box.button(QMessageBox.StandardButton.Ok).click()


def test_keyboard_space_runs_and_right_steps(qtbot, window):
    configure(window, max_new_tokens="200")
    window.activateWindow()
    window.tabs.setFocus()
    qtbot.keyClick(window.tabs, Qt.Key.Key_Right)
    qtbot.waitUntil(lambda: len(window.model.rounds) == 1 and window.live.state == PAUSED, timeout=20000)
    qtbot.keyClick(window.tabs, Qt.Key.Key_Space)
    wait_idle(qtbot, window)
    assert window.model.stop_reason == "budget"
    # Left/Right now walk the rounds of the finished run.
    window.model.select(3)
    qtbot.keyClick(window.tabs, Qt.Key.Key_Left)
    assert window.model.selected[0] == 2
    qtbot.keyClick(window.tabs, Qt.Key.Key_Right)
    assert window.model.selected[0] == 3


def test_space_in_the_prompt_types_a_space(qtbot, window):
    configure(window, prompt="ab")
    window.run_panel.prompt.setFocus()
    qtbot.keyClick(window.run_panel.prompt, Qt.Key.Key_Space)
    qtbot.wait(50)
    assert window.live.state == IDLE
    assert " " in window.run_panel.prompt.toPlainText()


def test_settings_persist_between_sessions(qtbot, make_window, settings_file):
    w1 = make_window(settings=settings_file)
    configure(w1, k="6", temperature="0.7", prompt="9 9 9")
    w1.close()
    w2 = make_window(settings=settings_file)
    texts = w2.run_panel.texts()
    assert texts["k"] == "6" and texts["temperature"] == "0.7" and texts["prompt"] == "9 9 9"


def test_stepping_keys_step_from_a_field_but_type_in_the_prompt(qtbot, window):
    """Issue 20: Space runs wherever the focus is, except while typing in the prompt (issue 32:
    the cursor keys stay with a text field, tests/app/gui/views/test_first_contact.py)."""
    configure(window, k="12")
    prompt = window.run_panel.prompt
    prompt.setFocus()
    prompt.moveCursor(prompt.textCursor().MoveOperation.End)
    qtbot.keyClick(prompt, Qt.Key.Key_Space)
    qtbot.keyClick(prompt, Qt.Key.Key_Right)
    qtbot.wait(50)
    assert window.live.state == IDLE and not window.model.rounds
    assert prompt.toPlainText().endswith("4 ")
    field = window.run_panel.fields["k"]
    field.setFocus()
    qtbot.keyClick(field, Qt.Key.Key_Space)  # runs
    wait_idle(qtbot, window)
    assert field.text() == "12" and window.model.rounds


def test_worker_thread_messages_reach_the_status_bar_through_the_gui_thread(qtbot, window):
    """The worker announces preloaded models from its own thread; the window must show the
    message from the GUI thread (a direct call from the worker made Qt warn that timers
    cannot be started from another thread)."""
    import threading

    from PySide6.QtCore import qInstallMessageHandler

    # the window's own preload (started after its first paint) would overwrite the message; a
    # preload's message shows over the loading message or none, never over another one
    qtbot.waitUntil(lambda: window.statusBar().currentMessage().startswith("Models ready ("), timeout=30000)
    window.statusBar().clearMessage()
    warnings: list[str] = []
    previous = qInstallMessageHandler(lambda mode, ctx, msg: warnings.append(msg))
    try:
        t = threading.Thread(target=window.live.controller.worker.preloaded.emit, args=("Models ready (test).",))
        t.start()
        t.join()
        qtbot.waitUntil(lambda: window.statusBar().currentMessage() == "Models ready (test).", timeout=5000)
    finally:
        qInstallMessageHandler(previous)
    assert not [w for w in warnings if "another thread" in w]


def test_the_decoding_thread_holds_no_widget(window):
    """The worker may drop the last reference to what it holds on its own thread; a Qt widget
    deleted there deadlocks against the GUI thread (a bound method of the window once did)."""
    import gc
    import types

    from PySide6.QtWidgets import QWidget

    held = [window.live.controller.worker, window.compare_controller.worker]
    seen: set[int] = set()
    for _ in range(5):  # a few references deep: instances and containers, not modules or classes
        nxt = []
        for obj in held:
            for ref in gc.get_referents(obj):
                if id(ref) in seen or isinstance(ref, (type, types.ModuleType, types.FunctionType)):
                    continue
                seen.add(id(ref))
                assert not isinstance(ref, QWidget), f"{type(obj).__name__} holds a {type(ref).__name__}"
                nxt.append(ref)
        held = nxt
