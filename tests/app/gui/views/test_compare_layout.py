"""Issue 20: the Compare tab's lane plots stay readable from 1024x700 up, and the KV view's
'after = expected' label sits beside its markers, not on them."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from tests.app.gui.sessions.test_compare import wait_compare
from tests.app.helpers import configure, wait_idle


@pytest.mark.parametrize("size,cols", [((1024, 700), 1), ((1920, 1080), 2)])
def test_lane_plots_keep_a_readable_size(qtbot, make_window, size, cols):
    from specscope.app.gui.views.plot_scroll import ScrollingPlots

    w = make_window()
    w.resize(*size)
    w.tabs.setCurrentWidget(w.compare)
    configure(w, max_new_tokens="16")
    qtbot.mouseClick(w.compare.compare_button, Qt.MouseButton.LeftButton)
    wait_compare(qtbot, w)
    qtbot.wait(150)
    assert w.compare_session.count == 2  # lane C is off by default
    for tabs in w.compare.details[:2]:
        lane = tabs.widget(0)
        assert isinstance(lane, ScrollingPlots) and lane.cols == cols
        shown = [lane.plots.plots[name] for name in lane.plots.shown]
        for plot in shown:  # every plot at least the size its title, ticks and labels need
            r = plot.sceneBoundingRect()
            assert r.width() >= ScrollingPlots.PLOT_W - 20 and r.height() >= ScrollingPlots.PLOT_H - 20, (size, r)
        rows = {round(p.sceneBoundingRect().top()) for p in shown}
        assert len(rows) == len(shown) // cols  # one below the other when narrow, a 2x2 grid when wide


def test_the_after_equals_expected_label_is_beside_its_markers(qtbot, window):
    configure(window, temperature="0.8")
    assert window.start_run()
    wait_idle(qtbot, window)
    kv = window.inspector.kv
    for i in range(len(window.model.rounds)):
        window.model.select(i, 0)
        for d, row in zip(kv.diagnoses, kv.rows):
            if d.state.after != d.expected:
                continue
            label = row.labels["after"]
            assert label.toPlainText().strip() == f"after = expected {d.expected}"
            # anchored at its left edge on the markers' x: the text starts right of both lines
            assert tuple(label.anchor) == (0.0, 0.5) and label.pos().x() == d.expected
            return
    pytest.fail("no cache had after == expected")


def test_a_tree_round_does_not_widen_the_window(qtbot, make_window):
    """The draft tree's legend wraps: selecting a tree node at 1024x700 keeps the window 1024 px wide."""
    w = make_window()
    w.resize(1024, 700)
    configure(w, proposer="draft:small,tree=3,2,1,children=sampled", temperature="0.8", max_new_tokens="16")
    assert w.start_run(), w.last_error
    wait_idle(qtbot, w)
    for r in w.model.rounds:
        w.jump_to(r.index, len(r.nodes) - 1)
        qtbot.wait(20)
        assert w.width() == 1024 and w.minimumSizeHint().width() <= 1024, (r.index, w.minimumSizeHint())


def test_three_lanes_keep_the_window_at_1024x700(qtbot, make_window):
    """Three lanes with long labels (the status text names every proposer while they run)
    once widened the window to 1300 px: it stays 1024 px wide, and each lane's plots keep
    their readable width (scrolling sideways)."""
    from specscope.app.gui.views.plot_scroll import ScrollingPlots

    w = make_window()
    w.resize(1024, 700)
    w.tabs.setCurrentWidget(w.compare)
    configure(w, max_new_tokens="16")
    for side, spec in enumerate(("draft-small", "draft-tiny", "lookup:max_ngram=4,min_ngram=2")):
        w.compare.set_side(side, spec, 3)
    qtbot.mouseClick(w.compare.compare_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(
        lambda: (
            len(w.compare_session.results) == 3
            and all(r.stop_reason for r in w.compare_session.results)
            and w.compare_controller.state == "idle"
        ),
        timeout=60000,
    )
    qtbot.wait(150)
    assert (w.width(), w.height()) == (1024, 700) and w.minimumSizeHint().height() <= 700
    assert w.compare_session.count == 3
    for tabs in w.compare.details:
        lane = tabs.widget(0)
        assert lane.isVisibleTo(w) and lane.plots.width() >= ScrollingPlots.PLOT_W
    assert w.status_bar.full_state.startswith("comparison") and "C: " in w.status_bar.full_state


def test_lane_c_is_built_only_when_a_comparison_has_three_lanes(make_window):
    """Lane C's column (plots, tree, inspector) cost about half a second of the window's
    start-up; it is built when first needed, with its summary column."""
    from specscope.app.gui.views.compare import BLOCK_COLUMNS

    w = make_window()
    c = w.compare
    assert len(c.timelines) == len(c.plots) == len(c.inspectors) == 2
    assert c.table.isColumnHidden(BLOCK_COLUMNS * 0 + 1 + 2)  # lane C's summary column, hidden
    c._show_lanes(3)
    assert len(c.timelines) == len(c.plots) == len(c.inspectors) == len(c.details) == 3
    assert c.columns.count() == 3 and not c.columns.widget(2).isHidden()
    assert not c.table.isColumnHidden(BLOCK_COLUMNS * 0 + 1 + 2)
    c._show_lanes(2)
    assert c.columns.widget(2).isHidden() and len(c.timelines) == 3  # kept, hidden
