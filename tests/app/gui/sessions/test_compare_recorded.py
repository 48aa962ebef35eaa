"""Issue 20: compare lanes you can inspect: a clicked position shows its round in both lanes."""

from __future__ import annotations

import gc

import pytest

from tests.app.conftest import dispose
from tests.app.helpers import configure


def _run_compare(qtbot, window):
    configure(window, max_new_tokens="20")
    window.compare.set_side(0, "draft-small", 4)
    window.compare.set_side(1, "draft-tiny", 2)
    window.runs.start_compare()
    qtbot.waitUntil(
        lambda: (
            all(r.stop_reason for r in window.compare_session.results) and window.compare_controller.state == "idle"
        ),
        timeout=60000,
    )


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


def test_a_comparison_is_recorded_as_two_runs_and_replays_side_by_side(qtbot, make_window, tmp_path):
    from specscope.app.gui.sessions.compare import comparison_of
    from specscope.storage import TraceStore

    store = tmp_path / "cmp.sqlite"
    w = make_window(store_path=str(store))
    _run_compare(qtbot, w)
    live_a, live_b = (m.output_tokens for m in w.compare_session.models)
    w.close()
    gc.collect()  # here, not in the middle of building the next window (see conftest.dispose)
    with TraceStore(store) as s:
        runs = s.list_runs()
    lanes = {comparison_of(r)[1]: r for r in runs if comparison_of(r)}
    assert set(lanes) == {"A", "B"} and comparison_of(lanes["A"])[0] == comparison_of(lanes["B"])[0]
    assert lanes["A"].prompt_text == "1 2 3 4 5 6 7 8 1 2 3 4"
    r = make_window(store_path=str(tmp_path / "other.sqlite"))
    assert r.open_trace(str(store), run_id=lanes["B"].run_id)
    qtbot.waitUntil(lambda: r.replay.loaded_all, timeout=30000)
    a, b = r.compare_session.models
    assert a.config.run_id == lanes["A"].run_id and b.config.run_id == lanes["B"].run_id
    assert a.output_tokens == live_a and b.output_tokens == live_b
    assert r.compare_session.first_divergence is None  # greedy: both exact
    assert "no divergence" in r.compare.divergence.text()
    # any two runs side by side (File > Compare two runs)
    assert r.traces.compare_stored(str(store), lanes["B"].run_id, lanes["A"].run_id)
    assert r.tabs.currentWidget() is r.compare and a.config.run_id == lanes["B"].run_id


def test_greedy_lanes_are_compared_with_plain_greedy_decoding(qtbot, window):
    """Issue 31's reference lane: after a greedy comparison each lane's output is compared
    with plain greedy decoding of the target (core.check.diverge), in the summary table."""
    _run_compare(qtbot, window)
    session = window.compare_session
    qtbot.waitUntil(lambda: all(r is not None and r != "checking" for r in session.references), timeout=60000)
    window.compare.refresh()
    for side in range(2):
        result = session.references[side]
        assert result.identical, result.lines()
        assert result.plain == tuple(session.models[side].output_tokens)
        cell = window.compare.summary_cell("vs plain greedy", side)
        assert cell.text() == "identical" and "identical to plain greedy decoding" in cell.toolTip()


def test_sampled_lanes_are_not_compared_with_plain_greedy(qtbot, window):
    configure(window, max_new_tokens="12", temperature="1.0")
    window.compare.set_side(0, "draft-small", 4)
    window.compare.set_side(1, "draft-tiny", 2)
    window.runs.start_compare()
    qtbot.waitUntil(
        lambda: (
            all(r.stop_reason for r in window.compare_session.results) and window.compare_controller.state == "idle"
        ),
        timeout=60000,
    )
    assert window.compare_session.references == [None, None]
    assert window.compare.summary_cell("vs plain greedy", 0).text() == "—"


def test_reference_cells_name_the_verdict_and_where():
    from specscope.app.gui.sessions.compare import CHECKING, reference_text
    from specscope.core.check.diverge import LOGIC_BUG, NEAR_TIE, Divergence

    def div(verdict):
        return Divergence(
            run_id="r",
            verdict=verdict,
            reason="why",
            speculative=(1, 2),
            plain=(1, 3),
            dtype="bfloat16",
            position=1,
            speculative_token=2,
            plain_token=3,
            round=4,
            margin=0.01,
            top2_margin=0.01,
            logit_diff=0.02,
            verify_margin=-0.01,
        )

    assert reference_text(div(NEAR_TIE))[0] == "near tie at token 1 (round 4)"
    text, tip = reference_text(div(LOGIC_BUG))
    assert text == "LOGIC BUG at token 1 (round 4)" and "first difference at output position 1" in tip
    assert reference_text("no target")[0] == "failed" and "no target" in reference_text("no target")[1]
    assert reference_text(CHECKING)[0] == "checking…" and reference_text(None)[0] == "—"


@pytest.fixture
def bundled_window(qtbot, bundled_hub, settings_file, tmp_path):
    """A window on the bundled models: the bundled EAGLE-3 head is the bundled target's."""
    from specscope.app.gui import create_app
    from specscope.app.gui.main_window import MainWindow

    create_app()
    w = MainWindow(hub=bundled_hub, settings=settings_file, store_path=str(tmp_path / "traces.sqlite"))
    qtbot.addWidget(w)
    w.resize(1400, 900)
    w.show()
    yield w
    dispose(w)


def _run_three_lanes(qtbot, window, **texts):
    """The bundled EAGLE-3 head, draft-small and prompt lookup side by side (lanes A, B, C)."""
    configure(window, **{"max_new_tokens": "20", **texts})
    for side, spec in enumerate(("eagle3", "draft:small", "lookup")):
        window.compare.set_side(side, spec, 4)
    window.runs.start_compare()
    session = window.compare_session
    assert window.last_error is None, window.last_error
    qtbot.waitUntil(
        lambda: (
            window.last_error is not None
            or (
                len(session.results) == 3
                and all(r.stop_reason for r in session.results)
                and window.compare_controller.state == "idle"
            )
        ),
        timeout=120000,
    )
    assert window.last_error is None, window.last_error
    window.compare.refresh()
    return session


def test_a_head_a_draft_and_lookup_run_side_by_side(qtbot, bundled_window):
    window = bundled_window
    """Issue 30: three lanes on one prompt, each exact (greedy: plain greedy decoding's output),
    each with its own summary column and timeline."""
    session = _run_three_lanes(qtbot, window)
    c = window.compare
    assert session.count == 3 and [s.proposer for s in session.settings] == ["eagle3", "draft:small", "lookup"]
    outputs = [m.output_tokens for m in session.models]
    assert len(outputs[0]) == 20 and outputs[1] == outputs[0] and outputs[2] == outputs[0]
    assert session.first_divergence is None and "no divergence in the first 20 tokens" in c.divergence.text()
    qtbot.waitUntil(lambda: all(r is not None and r != "checking" for r in session.references), timeout=60000)
    c.refresh()
    labels = ("eagle3: the target's trained head, k=4", "draft model: small, k=4", "prompt lookup")
    for side, label in enumerate(labels):
        assert session.references[side].identical, session.references[side].lines()
        assert c.summary_cell("proposer", side).text().startswith(label)
        assert c.summary_cell("new tokens", side).text() == "20"
        assert float(c.summary_cell("mean accepted length", side).text()) >= 1.0
        assert c.summary_cell("stop reason", side).text() == "budget"
        assert c.summary_cell("vs plain greedy", side).text() == "identical"
        assert not c.table.isColumnHidden(1 + side) and c.columns.widget(side).isVisibleTo(c)
        assert label.split(",")[0] in c.headers[side].text()
        assert session.models[side].cells.out_cell  # its timeline has the tokens
    assert int(c.summary_cell("draft forward passes", 0).text()) > 0  # the head drafted
    # clicking a position in lane C shows every lane's round there
    c.timelines[2].click_cell(session.models[2].cells.out_cell[9])
    for m in session.models:
        assert m.selected[0] == _round_of(m, 9).index
    # lane C left out again: two lanes, its columns hidden
    c.set_side(2, None, 4)
    assert len(c.lane_settings(window.run_panel.texts(), window.hub.devices())) == 2


def test_three_coupled_lanes_emit_the_same_tokens(qtbot, bundled_window):
    window = bundled_window
    window.compare.coupled.setChecked(True)
    session = _run_three_lanes(qtbot, window, temperature="1.0", seed="3")
    assert all(s.coupling_seed == 3 for s in session.settings)
    outputs = [m.output_tokens for m in session.models]
    assert len(outputs[0]) == 20 and outputs[1] == outputs[0] and outputs[2] == outputs[0]
    assert "coupled lanes" in window.compare.divergence.text()
    assert session.references == [None, None, None]  # sampled lanes: no plain greedy reference


def test_a_three_lane_comparison_is_recorded_and_reopens_with_its_three_lanes(qtbot, make_window, tmp_path):
    from specscope.app.gui.sessions.compare import comparison_of
    from specscope.storage import TraceStore

    store = tmp_path / "cmp3.sqlite"
    w = make_window(store_path=str(store))
    configure(w, max_new_tokens="12")
    for side, spec in enumerate(("draft-small", "draft-tiny", "lookup")):
        w.compare.set_side(side, spec, 3)
    w.runs.start_compare()
    qtbot.waitUntil(
        lambda: (
            len(w.compare_session.results) == 3
            and all(r.stop_reason for r in w.compare_session.results)
            and w.compare_controller.state == "idle"
        ),
        timeout=60000,
    )
    live = [m.output_tokens for m in w.compare_session.models]
    w.close()
    gc.collect()
    with TraceStore(store) as s:
        lanes = {comparison_of(r)[1]: r for r in s.list_runs() if comparison_of(r)}
    assert set(lanes) == {"A", "B", "C"} and len({comparison_of(r)[0] for r in lanes.values()}) == 1
    r = make_window(store_path=str(tmp_path / "other.sqlite"))
    assert r.open_trace(str(store), run_id=lanes["B"].run_id)  # any lane opens the whole comparison, in order
    qtbot.waitUntil(lambda: r.replay.loaded_all, timeout=30000)
    session = r.compare_session
    assert session.count == 3
    assert [m.config.run_id for m in session.models] == [lanes[n].run_id for n in "ABC"]
    assert [m.output_tokens for m in session.models] == live
    r.compare.refresh()
    assert not r.compare.table.isColumnHidden(3) and r.compare.columns.widget(2).isVisibleTo(r.compare)
    assert "no divergence" in r.compare.divergence.text()
    # two stored runs side by side again: lane C's columns are hidden
    assert r.traces.compare_stored(str(store), lanes["A"].run_id, lanes["C"].run_id)
    assert session.count == 2 and r.compare.table.isColumnHidden(3)
    assert not r.compare.columns.widget(2).isVisibleTo(r.compare)
