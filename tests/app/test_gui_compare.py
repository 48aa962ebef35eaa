"""Issue 20: compare lanes you can inspect: a clicked position shows its round in both lanes."""

from __future__ import annotations

from .helpers import configure


def _run_compare(qtbot, window):
    configure(window, max_new_tokens="20")
    window.compare.set_side(0, "draft-small", 4)
    window.compare.set_side(1, "draft-tiny", 2)
    window.start_compare()
    qtbot.waitUntil(lambda: all(r.stop_reason for r in window.compare_session.results)
                    and window.compare_controller.state == "idle", timeout=60000)


def _round_of(model, out):
    return next(r for r in model.rounds if r.emitted_before <= out < r.emitted_before + len(r.emitted))


def test_clicking_a_lane_position_shows_both_lanes_rounds_there(qtbot, window):
    _run_compare(qtbot, window)
    a, b = window.compare_session.models
    out = 9
    cell_index = a.cells.out_cell[out]
    window.compare.timelines[0].click_cell(cell_index)
    assert a.selected[0] == _round_of(a, out).index
    assert b.selected[0] == _round_of(b, out).index
    c = window.compare
    assert all(t.currentIndex() == 1 for t in c.details)  # the Round tab of each lane
    assert c.inspectors[0].shown[0] == a.selected[0] and c.inspectors[1].shown[0] == b.selected[0]
    assert c.trees[1].shown[0] == b.selected[0]
    assert c.inspectors[1].kv.diagnoses  # the other lane's caches too
    # clicking in B moves A the same way
    out = 15
    window.compare.timelines[1].click_cell(b.cells.out_cell[out])
    assert a.selected[0] == _round_of(a, out).index


def test_lane_cells_give_the_whole_token_and_the_tab_has_the_legend(qtbot, window):
    _run_compare(qtbot, window)
    tl = window.compare.timelines[0]
    model = window.compare_session.models[0]
    cell_index = model.cells.out_cell[3]
    token = model.cells.cell(cell_index).token
    assert f"(id {token})" in tl.tooltip_for(cell_index)
    assert "accepted" in window.compare.legend.text() and "repaired" in window.compare.legend.text()
