"""Issue 20: the KV-cache view names a cache that differs from the committed context, from
the view alone (the off-by-one crop fault), and says nothing is wrong on a correct run."""

from __future__ import annotations

import pytest

from tests.app.helpers import configure, wait_idle


def _faulty_trace(hub, path):
    from specscope.core import DraftModelProposer, SamplingConfig
    from specscope.core.faults.zoo import faulty_decoder
    from specscope.storage import TraceStore, TraceWriter

    target, _ = hub.target("cpu")
    draft = hub.draft("draft-small", "cpu")
    ids = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4]
    with TraceStore(path) as store:
        dec = faulty_decoder(
            "target-crop-off-by-one",
            target,
            DraftModelProposer(draft, label="draft-small"),
            k=4,
            sampling=SamplingConfig(temperature=0.8),
            seed=0,
        )
        config = dec.run_config(ids, 24)
        with TraceWriter(store, config) as writer:
            writer.record(dec.rounds(ids, 24, config=config))
    assert dec.fault_rounds, "the fault did not fire"
    return config.run_id, dec.fault_rounds[0]


def test_the_off_by_one_crop_is_named_by_the_kv_view(qtbot, window, hub, tmp_path):
    path = tmp_path / "faulty.sqlite"
    run_id, fired = _faulty_trace(hub, path)
    window.checker = None  # the view alone: no findings panel
    assert window.open_trace(str(path), run_id=run_id)
    qtbot.waitUntil(lambda: window.replay.loaded_all, timeout=30000)
    window.model.select(fired, 0)
    kv = window.inspector.kv
    target = next(d for d in kv.diagnoses if d.name == "target")
    assert target.difference == 1 and target.problems
    text = kv.verdict_text()
    assert "1 entry more than expected" in text and "not cropped" in text
    assert "✗" in kv.verdict.text()
    assert "(+1)" in kv.rows[0].plot.titleLabel.text


def test_a_correct_run_shows_every_cache_as_expected(qtbot, window):
    configure(window, temperature="0.8")
    assert window.start_run()
    wait_idle(qtbot, window)
    for i in range(len(window.model.rounds)):
        window.model.select(i, 0)
        kv = window.inspector.kv
        assert kv.diagnoses and all(d.ok for d in kv.diagnoses), kv.verdict_text()
        assert all(d.state.after <= d.expected for d in kv.diagnoses)
    assert "✔" in window.inspector.kv.verdict.text() or "pending" in window.inspector.kv.verdict_text()


@pytest.mark.parametrize("whole", [False, True])
def test_the_view_zooms_on_the_round(qtbot, window, whole):
    configure(window)
    assert window.start_run()
    wait_idle(qtbot, window)
    window.model.select(len(window.model.rounds) - 1, 0)
    kv = window.inspector.kv
    kv.whole.setChecked(whole)
    (x0, x1), _ = kv.rows[0].plot.viewRange()
    d = kv.diagnoses[0]
    assert x1 >= d.state.peak
    if whole:
        assert x0 <= 0
    else:
        assert x0 >= min(d.state.before, d.expected) - 4 and x0 > 0
