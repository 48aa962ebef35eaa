"""The live plots keep their drawing cheap for the decoding thread: the frame interval
follows the cost of a frame, and following the newest round does not repaint them."""

from __future__ import annotations

import pytest

from specscope.app.gui.model.runmodel import RunModel
from specscope.app.gui.model.settings import PanelSettings
from specscope.app.gui.views.plots import FRAME_COST_SHARE, FRAME_MS, MAX_FRAME_MS, LivePlotsWidget


@pytest.fixture(scope="module")
def rounds(hub):
    prep = hub.build(
        PanelSettings(
            prompt="1 2 3 4 5 6 7 8 1 2 3 4", proposer="draft-tiny", temperature=1.0, max_new_tokens=30, seed=3
        )
    )
    return prep, prep.decoder.generate(prep.prompt_ids, 30).rounds


def test_the_frame_interval_follows_the_cost_of_a_frame(qtbot, gui_env, rounds):
    prep, rs = rounds
    model = RunModel()
    model.begin(prep.config, prep.token_text)
    w = LivePlotsWidget(model)
    qtbot.addWidget(w)
    w.show()
    model.extend(rs[:5])
    w.graphics.paint_s = 0.05  # a slow machine: 50 ms a paint
    w._tick()
    assert FRAME_COST_SHARE * 50 <= w.timer.interval() <= MAX_FRAME_MS
    w.graphics.paint_s = 0.0
    model.extend(rs[5:8])
    w._tick()
    assert FRAME_MS <= w.timer.interval() < FRAME_COST_SHARE * 50
    w.graphics.paint_s = 10.0
    model.extend(rs[8:9])
    w._tick()
    assert w.timer.interval() == MAX_FRAME_MS


def test_following_a_live_run_moves_the_round_line_at_the_next_frame(qtbot, gui_env, rounds):
    prep, rs = rounds
    model = RunModel()
    model.begin(prep.config, prep.token_text)  # a live run: rounds still arriving
    w = LivePlotsWidget(model)
    qtbot.addWidget(w)
    w.show()
    model.extend(rs[:6])
    w.refresh()
    model.select(4)
    assert w.round_line.value() != 4  # no repaint of all six plots for a selection
    w._tick()
    assert w.round_line.value() == 4
    model.finish("budget")
    model.select(2)  # a finished run: the line moves at once
    assert w.round_line.value() == 2
