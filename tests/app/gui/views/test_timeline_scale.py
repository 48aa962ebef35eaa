"""The timeline stays fluid with thousands of tokens: layout is incremental and a paint
touches only the visible rows."""

from __future__ import annotations

import time
from dataclasses import replace

from specscope.app.gui.model.runmodel import RunModel
from specscope.app.gui.model.settings import PanelSettings
from specscope.app.gui.views.timeline import TokenTimelineWidget


def test_thousands_of_tokens_paint_fast(qtbot, hub):
    prep = hub.build(PanelSettings(prompt="1 2 3 4 5 6 7 8", proposer="draft-tiny", temperature=1.0, max_new_tokens=80))
    base = prep.decoder.generate(prep.prompt_ids, 80).rounds
    # Tile the real rounds into a long run (~6000 tokens) with consistent indices.
    rounds, emitted = [], 0
    while emitted < 6000:
        for r in base:
            rounds.append(replace(r, index=len(rounds), emitted_before=emitted))
            emitted += len(r.emitted)
    model = RunModel()
    model.begin(prep.config, prep.token_text)
    tl = TokenTimelineWidget(model)
    qtbot.addWidget(tl)
    tl.resize(900, 500)
    tl.show()
    t0 = time.perf_counter()
    for i in range(0, len(rounds), 50):  # arrive in chunks, as in a live run
        model.extend(rounds[i : i + 50])
    append_s = time.perf_counter() - t0
    assert tl._laid == len(model.cells) > 6000
    tl.verticalScrollBar().setValue(tl.verticalScrollBar().maximum() // 2)
    t0 = time.perf_counter()
    for _ in range(10):
        tl.viewport().repaint()
    paint_s = (time.perf_counter() - t0) / 10
    assert paint_s < 0.1, f"a paint took {paint_s * 1000:.0f} ms"
    assert append_s < 5.0
    # Hit-testing a cell in the middle of the run finds it.
    cell = model.cells.round_first[len(rounds) // 2]
    tl.ensure_cell_visible(cell)
    assert tl.cell_at(tl.cell_rect(cell).center()) == cell
