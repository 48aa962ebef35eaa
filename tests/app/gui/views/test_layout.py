"""Issue 20: the window works from 1024x700 up; every view keeps a readable minimum."""

from __future__ import annotations

import pytest

from tests.app.helpers import configure, wait_idle


def _visible_size(widget):
    return widget.isVisible(), widget.width(), widget.height()


@pytest.mark.parametrize("size", [(1024, 700), (1920, 1080)])
def test_the_window_fits_and_every_view_keeps_a_readable_minimum(qtbot, make_window, size):
    w = make_window()
    w.resize(*size)
    qtbot.wait(150)  # the first show arranges the docks for the size
    hint = w.minimumSizeHint()
    assert hint.width() <= 1024 and hint.height() <= 700, hint
    assert w.width() == size[0] and w.height() == size[1]
    configure(w, temperature="0.8", max_new_tokens="24")
    assert w.start_run()
    wait_idle(qtbot, w)
    rejected = next((r for r in w.model.rounds if r.rejected_node is not None), w.model.rounds[0])
    w.jump_to(rejected.index, rejected.rejected_node if rejected.rejected_node is not None else -1)
    qtbot.wait(100)
    floors = {
        "timeline": (w.timeline, 200, 80),
        "tree": (w.tree, 200, 90),
        "inspector": (w.inspector, 300, 200),
        "run panel dock": (w.run_dock, 240, 200),
    }
    for name, (widget, min_w, min_h) in floors.items():
        shown, width, height = _visible_size(widget)
        assert shown and width >= min_w and height >= min_h, (name, width, height)
    # inside the inspector's scroll area the plots keep their own minimum heights
    assert w.inspector.graphics.height() >= 200
    assert w.inspector.res_plot.size().height() >= 100  # the residual plot has real height
    assert w.inspector.kv.graphics.height() >= 2 * 75
    # p/q token labels have room: no more bars than the plot's width gives each label
    from specscope.app.gui.views.inspector import TICK_PX

    qtbot.wait(150)  # a resize re-fits the bars after 50 ms
    bars = len(w.inspector.values["tokens"])
    assert bars >= 3 and (bars - 1) * TICK_PX <= w.inspector.pq_plot.vb.width(), (bars, w.inspector.pq_plot.vb.width())
    # the live plots are either a dock of their own or a tab beside the findings, never clipped:
    # shown, every plot keeps a readable size (the dock scrolls them)
    assert w.plots_dock.width() >= 260 or w.tabifiedDockWidgets(w.plots_dock)
    from specscope.app.gui.views.plot_scroll import ScrollingPlots

    w.plots_dock.raise_()
    qtbot.wait(150)
    for name in w.plots.shown:
        rect = w.plots.plots[name].sceneBoundingRect()
        assert rect.width() >= 240 and rect.height() >= ScrollingPlots.PLOT_H - 20, (name, rect)
    w.tabs.setCurrentWidget(w.compare)
    qtbot.wait(100)
    c = w.compare
    for widget, min_w, min_h in ((c.table, 300, 100), (c.timelines[0], 200, 100), (c.timelines[1], 200, 100)):
        assert widget.isVisible() and widget.width() >= min_w and widget.height() >= min_h
    stop = c.stop_button
    assert stop.isVisible() and stop.mapTo(w, stop.rect().bottomRight()).x() <= w.width()


def test_an_error_under_a_field_is_shown_whole_and_pushes_the_form_down_only(qtbot, window):
    """Errors wrap (the inspector issue: "seed must lie in [0, 92233" was cut): the fields
    below move down to make room, none moves up, and each error label is as tall as its
    wrapped text needs."""
    panel = window.run_panel
    before = {key: f.mapTo(panel, f.rect().topLeft()).y() for key, f in panel.fields.items()}
    configure(window, k="0", top_p="2")
    window.run_panel.validate()
    qtbot.wait(50)
    after = {key: f.mapTo(panel, f.rect().topLeft()).y() for key, f in panel.fields.items()}
    assert all(after[key] >= before[key] for key in before)
    for key in ("k", "top_p"):
        label = panel.errors[key]
        assert label.text() and label.wordWrap() and label.height() >= label.heightForWidth(label.width())
