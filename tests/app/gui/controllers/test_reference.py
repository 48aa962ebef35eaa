"""Run > Compare with plain greedy: the reference for a finished or replayed greedy run."""

from __future__ import annotations

from PySide6.QtWidgets import QMessageBox


def _greedy_trace(hub, path, fault=None):
    from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
    from specscope.core.faults.zoo import faulty_decoder
    from specscope.storage import TraceStore, TraceWriter

    target, _ = hub.target("cpu")
    proposer = DraftModelProposer(hub.draft("draft-small", "cpu"), label="draft-small")
    options = dict(k=3, sampling=SamplingConfig(temperature=0))
    dec = (
        faulty_decoder(fault, target, proposer, **options) if fault else SpeculativeDecoder(target, proposer, **options)
    )
    config = dec.run_config([5, 6, 7, 8], 16)
    with TraceStore(path) as store, TraceWriter(store, config) as writer:
        writer.record(dec.rounds([5, 6, 7, 8], 16, config=config))
    return config.run_id, getattr(dec, "fault_rounds", [])


def test_reference_of_replayed_greedy_runs(qtbot, window, hub, tmp_path, monkeypatch):
    shown = []
    monkeypatch.setattr(QMessageBox, "information", staticmethod(lambda parent, title, text: shown.append(text)))
    path = tmp_path / "clean.sqlite"
    run_id, _ = _greedy_trace(hub, path)
    assert window.open_trace(str(path), run_id=run_id)
    qtbot.waitUntil(lambda: window.replay.loaded_all, timeout=30000)
    found = window.checks.reference_check()
    assert found is not None and found.verdict == "identical" and "identical" in shown[-1]

    path = tmp_path / "faulty.sqlite"
    run_id, fired = _greedy_trace(hub, path, fault="budget-overshoot")
    assert window.open_trace(str(path), run_id=run_id)
    qtbot.waitUntil(lambda: window.replay.loaded_all, timeout=30000)
    found = window.checks.reference_check()
    assert found.verdict == "logic bug" and found.blame_round == fired[0]
    assert "LOGIC BUG" in shown[-1] and "[budget]" in shown[-1]
    assert window.model.selected[0] == found.round  # the timeline shows the diverging round


def test_a_sampled_run_is_refused_in_words(qtbot, window, hub, tmp_path):
    from tests.app.gui.controllers.test_replay_panel import _stored_runs

    path = tmp_path / "sampled.sqlite"
    run_id = _stored_runs(hub, path, seeds=(0,))[0]
    assert window.open_trace(str(path), run_id=run_id)
    qtbot.waitUntil(lambda: window.replay.loaded_all, timeout=30000)
    window.last_error = None
    assert window.checks.reference_check() is None
    assert "only defined at temperature 0" in (window.last_error or "")
