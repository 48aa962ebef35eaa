"""The run model of a long trace: rounds kept column by column without their distributions,
cells in typed arrays, a round's vectors read from the store when it is selected. Asserted on
what is held (bytes of arrays, live round objects, reads), not on timing."""

from __future__ import annotations

import dataclasses
import weakref

import numpy as np
import pytest

from specscope.app.gui.model.compact import CompactRounds
from specscope.app.gui.model.runmodel import RunModel, has_distributions, slim
from specscope.app.gui.model.traces import TraceLibrary
from specscope.storage import TraceStore, TraceWriter
from tests.storage.helpers import synthetic_config, synthetic_rounds


def same(a, b) -> bool:
    """Field by field (DraftNode and Round compare by identity)."""
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return (a is None and b is None) or (a == b and type(a) is type(b))


def test_compact_rounds_give_back_the_slim_rounds():
    config = synthetic_config(run_id="c")
    rounds = synthetic_rounds(config, 200)
    compact = CompactRounds()
    for r in rounds:
        compact.append(r)
    assert len(compact) == 200
    assert all(same(compact[i], slim(r)) for i, r in enumerate(rounds))
    assert same(compact[-1], slim(rounds[-1])) and [x.index for x in compact[10:13]] == [10, 11, 12]
    assert compact.tokens == [t for r in rounds for t in r.tokens]
    # a few hundred bytes a round (k=4): typed arrays, no per-round Python objects
    assert compact.nbytes() / len(rounds) < 1200, compact.nbytes() / len(rounds)
    live = weakref.WeakSet(rounds)
    del rounds, r
    assert len(live) == 0  # nothing of the given rounds is kept


def test_a_batch_extend_equals_appending_one_by_one():
    config = synthetic_config(run_id="b")
    rounds = synthetic_rounds(config, 300)
    rounds[0] = dataclasses.replace(rounds[0], residual_mass=None, draft_cache=None)
    one, many = CompactRounds(), CompactRounds()
    for r in rounds:
        one.append(r)
    for start in (0, 1, 120):  # a first batch of one round, then bigger ones
        many.extend(rounds[start : {0: 1, 1: 120, 120: 300}[start]], [False] * 300)
    assert len(many) == 300 and many.tokens == one.tokens and many.nbytes() == one.nbytes()
    assert all(same(many[i], one[i]) for i in range(300))


def test_odd_values_and_leading_nones_survive():
    config = synthetic_config(run_id="odd")
    rounds = synthetic_rounds(config, 6)
    rounds[0] = dataclasses.replace(rounds[0], residual_mass=None, draft_cache=None)  # None before any value
    rounds[3] = dataclasses.replace(rounds[3], draft_forwards=np.int64(7), greedy=np.bool_(True))
    compact = CompactRounds()
    for r in rounds:
        compact.append(r)
    assert compact[0].residual_mass is None and compact[0].draft_cache is None
    assert compact[3].draft_forwards == 7 and compact[3].greedy is True
    assert all(same(compact[i], slim(rounds[i])) for i in (1, 2, 4, 5))


def test_a_long_replay_holds_slim_rounds_and_loads_the_selected_one(qapp, tmp_path):
    config = synthetic_config(run_id="replay")
    rounds = synthetic_rounds(config, 1500)
    path = tmp_path / "long.sqlite"
    with TraceStore(path) as store, TraceWriter(store, config, full_vectors=True) as writer:
        for r in rounds:
            writer.write(r)
    library = TraceLibrary(str(path))
    try:
        model = RunModel()
        model.begin(config, source=str(path))
        model.loader = library.loader("replay")
        reads = []
        real = library.store.load_round
        library.store.load_round = lambda *a, **k: reads.append(a) or real(*a, **k)
        for batch in library.batches("replay", 500):
            assert len(batch) <= 500 and not any(has_distributions(r) for r in batch)
            model.extend(batch)
        assert len(model.rounds) == 1500 and not model.rounds.held and not model._full
        assert model.output_tokens == [t for r in rounds for t in r.tokens]
        assert len(model.cells.out_cell) == len(model.output_tokens)
        got = model.full_round(1234)  # selected: its vectors come from the store, once
        assert reads == [("replay", 1234)] and has_distributions(got)
        assert np.allclose(got.nodes[0].p, rounds[1234].nodes[0].p, atol=1e-6)
        model.full_round(1234)
        assert len(reads) == 1  # then from the recent-round cache
        assert model.cells.text[len(config.prompt_ids)] == str(model.cells.token[len(config.prompt_ids)])
    finally:
        library.close()


@pytest.mark.slow
def test_a_100k_round_run_loads_and_scrolls(qtbot):
    """100,000 slim rounds (as a replay reads them) into the model and the timeline: held in
    typed arrays (a few hundred bytes each), the timeline lays out every cell and paints its
    last rows, and the round under the last cell reads back."""
    from specscope.app.gui.views.timeline import TokenTimelineWidget

    config = synthetic_config(run_id="100k")
    base = [slim(r) for r in synthetic_rounds(config, 50)]
    rounds, emitted = [], 0
    for i in range(100_000):
        r = base[i % len(base)]
        rounds.append(dataclasses.replace(r, index=i, emitted_before=emitted, prefix_len=3 + emitted))
        emitted += len(r.emitted)
    model = RunModel()
    model.begin(config, source="100k.sqlite")
    timeline = TokenTimelineWidget(model)
    qtbot.addWidget(timeline)
    timeline.resize(900, 500)
    timeline.show()
    for start in range(0, len(rounds), 1024):
        model.extend(rounds[start : start + 1024])
    assert len(model.rounds) == 100_000 and not model.rounds.held
    assert model.rounds.nbytes() / 100_000 < 1200
    del rounds
    qtbot.waitUntil(lambda: timeline._laid == len(model.cells), timeout=120_000)
    bar = timeline.verticalScrollBar()
    bar.setValue(bar.maximum())
    timeline.viewport().repaint()
    last = model.cells.cell(len(model.cells) - 1)
    assert last.round == 99_999 and model.rounds[last.round].index == 99_999
    model.select(99_999)
    assert model.selected[0] == 99_999


def test_the_mean_accepted_length_is_a_running_sum():
    """The cost estimate each appended round updates uses a running sum (it summed the whole
    accepted-length buffer per round: quadratic over a long replay); same value."""
    from specscope.app.gui.model.metrics import RunMetrics

    config = synthetic_config(run_id="m")
    metrics = RunMetrics()
    for r in synthetic_rounds(config, 300):
        metrics.append(r)
    assert metrics.accepted_length_total == int(metrics["accepted_length"].sum())
    assert metrics.mean_accepted_length == pytest.approx(float(metrics["accepted_length"].mean()), rel=1e-12)
    metrics.clear()
    assert metrics.mean_accepted_length == 0.0 and metrics.accepted_length_total == 0
