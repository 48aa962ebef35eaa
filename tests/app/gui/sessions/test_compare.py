"""Compare mode: two proposers on the same prompt, target and sampler, side by side."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from tests.app.helpers import configure


def wait_compare(qtbot, window, timeout=40000):
    session = window.compare_session
    qtbot.waitUntil(
        lambda: all(r.stop_reason for r in session.results) and window.compare_controller.state == "idle",
        timeout=timeout,
    )


def test_greedy_compare_has_no_divergence_and_fills_the_table(qtbot, window):
    configure(window, max_new_tokens="40", temperature="0")
    window.compare.set_side(0, "draft-small", 2)
    window.compare.set_side(1, "lookup", 6)
    qtbot.mouseClick(window.compare.compare_button, Qt.MouseButton.LeftButton)
    wait_compare(qtbot, window)
    a, b = window.compare_session.models
    assert a.output_tokens == b.output_tokens and len(a.output_tokens) == 40
    assert window.compare_session.first_divergence is None
    assert "no divergence" in window.compare.divergence.text()
    cell = window.compare.summary_cell
    assert float(cell("mean accepted length", 0).text()) == round(a.metrics.mean_accepted_length, 3)
    speed = cell("speedup over plain decoding", 0).text()
    assert speed.endswith("×")
    # times are each lane's own rounds: the lanes run interleaved, so a lane's wall time from
    # start to end also holds the other lane's rounds
    session = window.compare_session
    for lane, m in enumerate((a, b)):
        decode = m.metrics.time_total
        assert float(cell("decoding time (s)", lane).text()) == round(decode, 3)
        assert decode < session.results[lane].wall_s
        shown = float(cell("speedup over plain decoding", lane).text().rstrip("×"))
        assert shown == round(session.plain.total_s(len(m.output_tokens)) / decode, 2)
    # plain decoding's first token (the prompt's forward) counts once, not in every token
    plain = session.plain
    assert plain.first_s > 0 and plain.step_s > 0
    assert plain.total_s(1) == plain.first_s and plain.total_s(40) == pytest.approx(plain.first_s + 39 * plain.step_s)
    assert cell("proposer", 1).text().startswith("prompt lookup")
    assert a.config.k == 2 and b.config.k == 6
    # Both timelines use the aligned layout: output position n sits at the same place.
    ta, tb = window.compare.timelines  # lane C, off here, is built only when a comparison has three lanes
    ta.viewport().grab(), tb.viewport().grab()
    pos = 17
    ra = ta.cell_rect(a.cells.out_cell[pos])
    rb = tb.cell_rect(b.cells.out_cell[pos])
    assert (ra.x(), ra.y()) == (rb.x(), rb.y())


def test_sampled_compare_marks_the_first_divergence(qtbot, window):
    configure(window, max_new_tokens="40", temperature="1.0", seed="1")
    window.compare.set_side(0, "draft-small", 4)
    window.compare.set_side(1, "draft-tiny", 4)
    window.runs.start_compare()
    wait_compare(qtbot, window)
    a, b = window.compare_session.models
    div = window.compare_session.first_divergence
    if a.output_tokens != b.output_tokens:
        assert div is not None and a.output_tokens[:div] == b.output_tokens[:div]
        assert "first divergence" in window.compare.divergence.text()
        assert window.compare.timelines[0].marker_pos == div


def test_compare_rejects_a_bad_k(qtbot, window):
    configure(window)
    window.compare.set_side(1, "lookup", "x")
    window.runs.start_compare()
    assert window.compare.errors[1].isVisible() and "whole number" in window.compare.errors[1].text()
    assert not window.compare.errors[0].text()
    assert window.compare_controller.state == "idle"


def test_the_summary_table_follows_running_lanes_at_most_4_times_a_second(qtbot, window, monkeypatch):
    session = window.compare_session
    summaries = []
    original = session.summary
    monkeypatch.setattr(session, "summary", lambda side: (summaries.append(side), original(side))[1])
    monkeypatch.setattr(type(session), "running", property(lambda self: True))
    for _ in range(20):  # rounds arriving
        session.changed.emit()
    assert summaries == []  # no rebuild per round
    qtbot.waitUntil(lambda: len(summaries) == 2, timeout=2000)  # one refresh (both sides) after the interval
    qtbot.wait(400)
    assert len(summaries) == 2
    monkeypatch.setattr(type(session), "running", property(lambda self: False))
    session.changed.emit()  # the lanes stopped: at once
    assert len(summaries) == 4
