"""Issue 32, checked in a real X window (Xvfb at 1500x920 and 1024x700): what a new user still
tripped on there, each with the test that failed before its fix."""

from __future__ import annotations

import pytest


def _fresh_window(qtbot, hub, settings_file, tmp_path, geometry=None):
    from specscope.app.gui import create_app
    from specscope.app.gui.main_window import MainWindow

    create_app()
    if geometry is not None:
        settings_file.setValue("window/geometry", geometry)
    w = MainWindow(hub=hub, settings=settings_file, record=False, store_path=str(tmp_path / "t.sqlite"))
    qtbot.addWidget(w)
    return w


@pytest.mark.parametrize("saved", [False, True])
def test_the_window_fits_the_screen(qtbot, hub, settings_file, tmp_path, saved):
    """Item 3: on a 1024x700 screen the first start opened 1500x920 (and a size saved on a larger
    monitor came back as it was): the status bar and the live plots lay off screen."""
    geometry = None
    if saved:
        big = _fresh_window(qtbot, hub, settings_file, tmp_path)
        big.setGeometry(0, 0, 2400, 1500)
        geometry = big.saveGeometry()
        big.close()
    w = _fresh_window(qtbot, hub, settings_file, tmp_path, geometry)
    room = w.screen().availableGeometry()
    assert room.width() < 1500 or room.height() < 920  # the offscreen screen is smaller than the default
    assert w.width() <= room.width() and w.height() <= room.height()
    w.close()


def _shows(widget) -> bool:
    return widget.isVisible() and not widget.visibleRegion().isEmpty()


def test_a_refusal_scrolls_its_field_into_view_at_1024x700(qtbot, make_window, hub):
    """Item 1: Max new tokens 100000 was refused under the field, but the field lay below the
    run panel's fold: the refusal showed only in the status bar, cut short."""
    from tests.app.helpers import configure

    w = make_window()
    w.resize(1024, 700)
    qtbot.wait(200)
    configure(w, max_new_tokens="100000")
    label = w.run_panel.errors["max_new_tokens"]
    assert not _shows(w.run_panel.fields["max_new_tokens"])  # below the fold to begin with
    assert w.start_run()
    qtbot.waitUntil(lambda: label.text() != "", timeout=30000)
    qtbot.waitUntil(lambda: _shows(label) and _shows(w.run_panel.fields["max_new_tokens"]), timeout=3000)

    def whole_message() -> bool:  # not its first lines (the label grows as its text wraps: wait for layout)
        return label.visibleRegion().boundingRect().height() >= label.height() - 1

    try:
        qtbot.waitUntil(whole_message, timeout=5000)
    except AssertionError:
        raise AssertionError((label.visibleRegion().boundingRect(), label.size())) from None


def test_a_compare_past_the_position_limit_is_refused_under_the_field(qtbot, make_window, hub, monkeypatch):
    """Item 1: Compare with max new tokens 100000 opened a dialog and left the field unmarked."""
    from tests.app.helpers import configure

    w = make_window()
    dialogs = []
    monkeypatch.setattr(w, "show_error", lambda message, *a, **k: dialogs.append(message))
    configure(w, max_new_tokens="100000")
    w.runs.start_compare()
    label = w.run_panel.errors["max_new_tokens"]
    qtbot.waitUntil(lambda: label.text() != "", timeout=30000)
    assert "needs 100012 positions" in label.text() and "max new tokens must be at most" in label.text()
    assert "Cannot compare" in w.statusBar().currentMessage() and w.last_error == label.text()
    assert dialogs == [] and w.compare_session.count == 2 and not any(m.rounds for m in w.compare_session.models)
    qtbot.waitUntil(lambda: _shows(label), timeout=3000)


def test_a_lane_refusal_is_shown_beside_that_lane(qtbot, window):
    """A refusal of a lane's own field goes beside the lane it is about, not a dialog."""
    window.runs.compare_refused({"proposer": "this draft cannot propose for the target"}, 1)
    assert window.compare.errors[1].text() == "this draft cannot propose for the target"
    assert window.compare.errors[0].text() == "" and window.run_panel.errors["proposer"].text() == ""


def _ranges(plot):
    (x0, x1), (y0, y1) = plot.vb.viewRange()
    return round(x0, 3), round(x1, 3), round(y0, 3), round(y1, 3)


def _tick_labels(plot):
    axis = plot.getAxis("bottom")
    return [] if axis._tickLevels is None else [label for level in axis._tickLevels for _, label in level]


def test_a_new_run_starts_from_empty_views_not_the_last_runs_axes(qtbot, make_window):
    """Items 5-6: after a finished run, a new (here refused) run cleared the rounds but the p/q,
    residual and acceptance plots kept the last round's ranges and token ticks, and the live
    plots their y ranges (latency 50..150 ms, histogram ticks 1..5); before any run the
    residual's empty axes read -0.4..0.4 and the acceptance test a rejection band at u = 0."""
    from tests.app.helpers import configure, wait_idle

    w = make_window()
    ins, live = w.inspector, w.plots
    assert _ranges(ins.res_plot) == (0, 1, 0, 1) and not ins.reject_bar.isVisible() and not ins.u_line.isVisible()
    assert "appear here" in ins.pq_note.toPlainText() and "appears here" in ins.res_text.toPlainText()
    live.refresh()
    empty_live = {name: _ranges(plot) for name, plot in live.plots.items()}
    configure(w, max_new_tokens="16", temperature="1")
    w.start_run()
    wait_idle(qtbot, w)
    w.model.select(len(w.model.rounds) - 1, 0)
    qtbot.wait(100)
    live.refresh()
    assert not ins.pq_note.isVisible() and ins.reject_bar.isVisible()
    configure(w, max_new_tokens="100000")
    w.start_run()
    qtbot.waitUntil(lambda: w.run_panel.errors["max_new_tokens"].text() != "", timeout=30000)
    # issue 42 item 8: a refused start keeps the previous run on screen; a run that starts
    # begins the model afresh (LiveSession._on_prepared), as clear() does here
    assert len(w.model.rounds) > 0
    w.model.clear()
    live.refresh()
    assert len(w.model.rounds) == 0
    assert _ranges(ins.pq_plot) == (0, 1, 0, 1) and _ranges(ins.res_plot) == (0, 1, 0, 1)
    assert _tick_labels(ins.pq_plot) == [] and _tick_labels(ins.res_plot) == [] and ins.pq_note.isVisible()
    assert not ins.reject_bar.isVisible() and not ins.u_line.isVisible()
    assert {name: _ranges(plot) for name, plot in live.plots.items()} == empty_live


def test_the_empty_draft_tree_pane_says_what_will_appear(qtbot, window):
    """Item 6: before a round is selected the draft-tree pane was a blank box."""
    from PySide6.QtWidgets import QGraphicsTextItem

    from specscope.app.gui.views.tree import EMPTY_NOTE

    def note():
        texts = [item.toPlainText() for item in window.tree.scene.items() if isinstance(item, QGraphicsTextItem)]
        return texts == [EMPTY_NOTE]

    assert note()
    window.runs.step()
    qtbot.waitUntil(lambda: len(window.model.rounds) == 1, timeout=20000)
    window.model.select(0, 0)
    assert not note() and window.tree.nodes
    window.runs.stop()
    qtbot.waitUntil(lambda: window.live.state == "idle", timeout=20000)
    window.model.clear()
    assert note()


@pytest.mark.parametrize("temperature", ["0", "1"])
def test_the_inspector_plots_fit_its_width_at_1024x700_for_every_position(qtbot, make_window, temperature):
    """Item 6: at 1024x700 a greedy round's acceptance title ("greedy: draft tes vs target argmax
    i → rejected") set the right column's minimum width: the plots grew past the inspector and
    the residual plot, its title and its note were cut at the window's edge."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QApplication

    from tests.app.helpers import configure, wait_idle

    w = make_window()
    w.resize(1024, 700)
    configure(w, max_new_tokens="24", temperature=temperature)
    w.start_run()
    wait_idle(qtbot, w)
    g = w.inspector.graphics
    checked = 0
    for rnd in range(len(w.model.rounds)):
        for pos in range(len(w.model.rounds[rnd].nodes) + 1):
            w.model.select(rnd, pos)
            QApplication.processEvents()  # the layouts settle their minimum sizes
            need = g.ci.effectiveSizeHint(Qt.SizeHint.MinimumSize).width()
            assert need <= g.viewport().width(), (
                rnd,
                pos,
                need,
                g.viewport().width(),
                w.inspector.ratio_plot.titleLabel.text,
            )
            checked += 1
    assert checked > 10


@pytest.mark.parametrize("key", ["system", "stop_strings", "stop_ids", "prompt"])
def test_space_types_in_every_free_text_field(qtbot, window, key):
    """Item 4: Space typed only in the prompt: in the chat's system text ("You are kind") and
    the stop strings it started a run instead of a space."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QPlainTextEdit

    panel = window.run_panel
    panel.chat.setChecked(True)
    field = panel.fields[key]
    field.clear()
    window.activateWindow()
    field.setFocus()
    qtbot.keyClicks(field, "1")
    qtbot.keyClick(field, Qt.Key.Key_Space)
    qtbot.keyClicks(field, "2")
    qtbot.wait(100)
    text = field.toPlainText() if isinstance(field, QPlainTextEdit) else field.text()
    assert text == "1 2"
    assert window.live.state == "idle" and not window.model.rounds  # nothing ran


def test_space_still_runs_from_a_number_field(qtbot, window):
    """Space runs wherever a space means nothing (a number field): README's promise."""
    from PySide6.QtCore import Qt

    from tests.app.helpers import configure

    configure(window, max_new_tokens="4")
    field = window.run_panel.fields["k"]
    window.activateWindow()
    field.setFocus()
    qtbot.keyClick(field, Qt.Key.Key_Space)
    qtbot.waitUntil(lambda: len(window.model.rounds) > 0, timeout=20000)
    assert field.text() == "4"


def test_replaying_a_trace_unticks_a_chat_template_it_did_not_use(qtbot, make_window, tmp_path):
    """Item 5: the chat box (and its system text) ticked for an earlier run stayed ticked when
    a plain run was replayed, so Run templated the prompt and did not reproduce the trace."""
    from tests.app.helpers import configure, wait_idle

    store = str(tmp_path / "plain.sqlite")
    w = make_window(store_path=store)
    configure(w, max_new_tokens="8")
    w.start_run()
    wait_idle(qtbot, w)
    run_id = w.model.config.run_id
    w.run_panel.set_texts({"chat": "on", "system": "be brief"})
    assert w.open_trace(store, run_id=run_id)
    qtbot.waitUntil(lambda: w.replay.loaded_all, timeout=20000)
    texts = w.run_panel.texts()
    assert texts["chat"] == "" and texts["system"] == ""
    assert w.replay_panel.mismatch == []


def test_a_run_recorded_in_the_window_replays_as_text_on_the_bundled_target(
    qtbot, bundled_hub, settings_file, tmp_path
):
    """Item 5: the window recorded no tokenizer and named the bundled target by its folder, so
    each of its runs replayed as token ids with the target menu on 'local target'."""
    from specscope.app.gui import create_app
    from specscope.app.gui.main_window import MainWindow
    from specscope.storage import TraceStore
    from tests.app.helpers import wait_idle

    create_app()
    store = str(tmp_path / "window.sqlite")
    w = MainWindow(hub=bundled_hub, settings=settings_file, store_path=store)
    qtbot.addWidget(w)
    w.show()
    w.run_panel.set_texts({"prompt": "def add(a, b):", "max_new_tokens": "8", "eos": "none"})
    w.start_run()
    wait_idle(qtbot, w, timeout=60000)
    run_id, live_text = w.model.config.run_id, w.model.token_text(w.model.output_tokens[0])
    with TraceStore(store) as s:
        models = s.get_run(run_id).models
    assert models.target_name == "specscope/target" and models.tokenizer_hash
    said = []
    w.say_long = said.append
    w.run_panel.set_texts({"target": "", "proposer": "lookup"})
    assert w.open_trace(store, run_id=run_id)
    qtbot.waitUntil(lambda: w.replay.loaded_all, timeout=20000)
    assert w.model.token_text(w.model.output_tokens[0]) == live_text
    assert not any("token ids" in s for s in said), said
    assert w.run_panel.target.spec() == "" and w.replay_panel.mismatch == []
    w.close()


def test_tree_notes_and_tags_stay_off_the_node_borders(qtbot, window):
    """Item 6: a dynamic tree's sibling note ("#2 u=0.74") sat on its node's top border and the
    'rejected' tag on the bottom one: text and border overlapped in the real window."""
    from PySide6.QtWidgets import QGraphicsSimpleTextItem

    from specscope.app.gui.views.tree import _NodeItem
    from tests.app.helpers import configure, wait_idle

    configure(
        window,
        proposer="draft:small,tree=dynamic:nodes=16,depth=5,topk=4",
        temperature="1",
        seed="3",
        max_new_tokens="16",
    )
    assert window.start_run(), window.last_error
    wait_idle(qtbot, window)
    checked = 0
    for r in window.model.rounds:
        window.jump_to(r.index, -1)
        for node in (i for i in window.tree.scene.items() if isinstance(i, _NodeItem)):
            box = node.mapRectToScene(node.path().boundingRect())
            for t in node.childItems():
                if (
                    isinstance(t, QGraphicsSimpleTextItem) and t.text() and t.text() in ("rejected", "repair", "bonus")
                ) or (isinstance(t, QGraphicsSimpleTextItem) and t.text().startswith("#")):
                    assert not t.sceneBoundingRect().intersects(box), (r.index, t.text())
                    checked += 1
    assert checked > 5


def test_an_empty_compare_lane_says_how_lanes_start_and_fits_its_width(qtbot, make_window):
    """Items 3 and 6: at 1024x700 each empty lane repeated the Inspect tab's "Press Space, or
    the Run button at the top of the Run panel" (Run does not start lanes), cut at both ends."""
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QFontMetrics

    w = make_window()
    w.resize(1024, 700)
    w.tabs.setCurrentWidget(w.compare)
    qtbot.wait(200)
    lanes = w.compare._timelines
    assert lanes
    for tl in lanes:
        assert "Compare button" in tl.empty_text and "Run button" not in tl.empty_text
        room = tl.viewport().rect().adjusted(6, 4, -6, -4)
        need = QFontMetrics(tl.font()).boundingRect(
            room, int(Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap), tl.empty_text
        )
        assert need.width() <= room.width() and need.height() <= room.height(), (need, room)


def _wheel(widget, steps=-1):
    from PySide6.QtCore import QPoint, QPointF, Qt
    from PySide6.QtGui import QWheelEvent
    from PySide6.QtWidgets import QApplication

    centre = QPointF(widget.rect().center())
    event = QWheelEvent(
        centre,
        QPointF(widget.mapToGlobal(centre.toPoint())),
        QPoint(0, 0),
        QPoint(0, 120 * steps),
        Qt.MouseButton.NoButton,
        Qt.KeyboardModifier.NoModifier,
        Qt.ScrollPhase.NoScrollPhase,
        False,
    )
    QApplication.sendEvent(widget, event)


def test_the_wheel_scrolls_the_run_panel_not_the_menu_under_the_pointer(qtbot, make_window):
    """Item 4: in the real window at 1024x700, scrolling the run panel with the pointer over the
    Proposer menu switched it to 'eagle3: head checkpoint'; every menu of the panel and of the
    compare lanes turned the same way."""
    from PySide6.QtWidgets import QComboBox, QScrollArea

    w = make_window()
    w.resize(1024, 700)
    qtbot.wait(200)
    area = next(a for a in w.findChildren(QScrollArea) if a.widget() is w.run_panel)
    boxes = [b for b in w.run_panel.findChildren(QComboBox) if b.isEnabled()] + [
        b for b in w.compare.findChildren(QComboBox)
    ]
    assert len(boxes) >= 6
    for box in boxes:
        before = box.currentIndex()
        _wheel(box, -1)
        _wheel(box, -1)
        assert box.currentIndex() == before, box.currentText()
    area.verticalScrollBar().setValue(0)
    _wheel(w.run_panel.proposer, -2)
    assert area.verticalScrollBar().value() > 0  # the panel scrolled instead
    w.run_panel.proposer.setFocus()  # a menu clicked or tabbed into still takes the wheel
    qtbot.wait(int(w.wheel_guard.SCROLLING_S * 1000) + 200)  # once the panel is no longer being scrolled
    before = w.run_panel.proposer.currentIndex()
    _wheel(w.run_panel.proposer, -1)
    assert w.run_panel.proposer.currentIndex() != before


def test_a_focused_menu_takes_a_typed_letter_instead_of_the_play_shortcut(qtbot, window):
    """Item 4's class: with the Proposer menu focused, P played the rounds back instead of
    picking the menu's entry that starts with P (its keyboard search)."""
    from PySide6.QtCore import Qt

    from tests.app.helpers import configure, wait_idle

    configure(window, max_new_tokens="6")
    window.run_panel.runClicked.emit()
    wait_idle(qtbot, window)
    assert window.session.can_play()  # P would play these rounds back
    box = window.run_panel.proposer
    box.setCurrentIndex(0)
    window.activateWindow()
    box.setFocus()
    qtbot.keyClick(box, Qt.Key.Key_P)
    qtbot.wait(100)
    assert box.currentText().lower().startswith("p")
    assert not window.replay.playing
    window.timeline.setFocus()  # elsewhere, P still plays
    qtbot.keyClick(window.timeline, Qt.Key.Key_P)
    qtbot.waitUntil(lambda: window.replay.playing, timeout=5000)
