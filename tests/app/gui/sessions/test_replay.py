"""Recording while running, replaying saved traces, the checker's findings, export."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt

from specscope.core import DraftModelProposer, SamplingConfig
from specscope.core.faults.zoo import faulty_decoder
from specscope.storage import TraceStore, TraceWriter
from tests.app.helpers import configure, wait_idle


def record_live(qtbot, window, **texts):
    configure(window, **texts)
    qtbot.mouseClick(window.run_panel.run_button, Qt.MouseButton.LeftButton)
    wait_idle(qtbot, window)
    return window.model.config.run_id, list(window.model.rounds)


def test_live_run_is_recorded_and_replays_identically(qtbot, make_window, tmp_path):
    store_path = str(tmp_path / "live.sqlite")
    w = make_window(store_path=store_path)
    run_id, live_rounds = record_live(qtbot, w, temperature="1.0", proposer="draft-tiny", max_new_tokens="30")
    assert w.live.recorded_path == store_path
    assert w.findings.findings == [] and "no findings" in w.findings.status.text()
    with TraceStore(store_path) as store:
        info = store.get_run(run_id)
        assert info.status == "completed" and info.n_rounds == len(live_rounds)

    r = make_window(store_path=str(tmp_path / "other.sqlite"))
    assert r.open_trace(store_path)
    qtbot.waitUntil(lambda: r.replay.loaded_all, timeout=20000)
    assert r.mode == "replay" and r.last_error is None
    replayed = r.model.rounds
    assert [x.tokens for x in replayed] == [x.tokens for x in live_rounds]
    assert r.model.output_tokens == w.model.output_tokens
    assert r.model.selected[0] == 0
    # The run panel shows the replayed run's settings (the proposer as its spec).
    texts = r.run_panel.texts()
    assert texts["temperature"] == "1" and texts["proposer"] == "draft:tiny" and texts["max_new_tokens"] == "30"
    # Slider, next/previous and the keyboard move through the rounds.
    r.navigator.slider.setValue(5)
    assert r.model.selected[0] == 5
    r.activateWindow()
    qtbot.keyClick(r.tabs, Qt.Key.Key_Right)
    assert r.model.selected[0] == 6
    qtbot.keyClick(r.tabs, Qt.Key.Key_Left)
    qtbot.keyClick(r.tabs, Qt.Key.Key_Left)
    assert r.model.selected[0] == 4
    # The inspector shows the stored values (top-N distributions are loaded on demand).
    rnd = next(x for x in live_rounds if x.rejected_node is not None)
    r.model.select(rnd.index, rnd.rejected_node)
    values = r.inspector.values
    node = rnd.nodes[rnd.rejected_node]
    assert values["ratio"] == pytest.approx(node.ratio)
    assert values["u"] == pytest.approx(node.u)
    j = values["tokens"].index(node.token)
    assert values["p"][j] == pytest.approx(node.p_token, rel=1e-5)
    # P plays the replay (Space runs).
    r.model.select(0)
    qtbot.keyClick(r.tabs, Qt.Key.Key_P)
    qtbot.waitUntil(lambda: r.model.selected[0] >= 2, timeout=5000)
    qtbot.keyClick(r.tabs, Qt.Key.Key_P)
    assert not r.replay.playing
    # Export the run as JSONL through the storage format.
    out = tmp_path / "run.jsonl"
    assert r.exports.export_jsonl(str(out))
    lines = out.read_text().splitlines()
    assert json.loads(lines[0])  # a header line
    assert len(lines) >= len(live_rounds)


@pytest.mark.parametrize(
    "fault,sampling,full_vectors",
    [
        ("resample-p", SamplingConfig(temperature=1.0), None),
        # a q that skipped top-p, in a trace without full vectors (the whole-vector facts show it)
        ("raw-q", SamplingConfig(temperature=1.0, top_p=0.9), False),
    ],
    ids=["resample-p", "raw-q-top-n-trace"],
)
def test_faulty_trace_shows_findings_that_jump_to_their_round(
    qtbot, make_window, hub, tmp_path, fault, sampling, full_vectors
):
    target, _ = hub.target("cpu")
    draft = hub.draft("draft-small", "cpu")
    path = tmp_path / "faulty.sqlite"
    with TraceStore(path) as store:
        for seed in range(6):
            dec = faulty_decoder(fault, target, DraftModelProposer(draft), k=4, sampling=sampling, seed=seed)
            config = dec.run_config([1, 2, 3, 4, 5], 40)
            with TraceWriter(store, config, full_vectors=full_vectors) as writer:
                writer.record(dec.rounds([1, 2, 3, 4, 5], 40, config=config))
            if dec.fault_rounds:
                run_id = config.run_id
                break
        else:
            pytest.skip("the fault never fired")
    w = make_window()
    assert w.open_trace(str(path), run_id=run_id)
    qtbot.waitUntil(lambda: w.replay.loaded_all, timeout=20000)
    found = w.findings.findings
    assert found, f"the checker should flag {fault}"
    assert all(f.rule for f in found) and found[0].round == dec.fault_rounds[0]
    target_round = found[0].round
    w.model.select(target_round, 0)
    if full_vectors is False:  # the inspector says what a top-N save keeps of p and q
        assert (
            "saved without full vectors" in w.inspector.header.text() and "tokens &gt; 0" in w.inspector.header.text()
        )
    else:  # full vectors read back (with their exact whole-vector facts): nothing to say
        assert "saved without full vectors" not in w.inspector.header.text()
    w.model.select(0)
    w.findings.table.cellClicked.emit(0, 0)
    assert w.model.selected[0] == target_round


def test_opening_bad_files_is_explained(qtbot, window, tmp_path):
    assert not window.open_trace(str(tmp_path / "missing.sqlite"))
    assert "No such trace" in window.last_error
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database" * 100)
    assert not window.open_trace(str(junk))
    assert "Cannot open" in window.last_error
    empty = tmp_path / "empty.sqlite"
    TraceStore(empty).close()
    assert not window.open_trace(str(empty))
    assert "no runs" in window.last_error
    assert window.mode == "live"


def test_opening_a_trace_during_a_live_run_cancels_it(qtbot, make_window, tmp_path):
    store = str(tmp_path / "first.sqlite")
    w = make_window(store_path=store)
    configure(w, max_new_tokens="12")
    w.start_run()
    wait_idle(qtbot, w)
    first_id, tokens = w.model.config.run_id, w.model.output_tokens
    configure(w, max_new_tokens="4000")  # a long run within the tiny models' 4096 positions
    w.start_run()
    qtbot.waitUntil(lambda: len(w.model.rounds) >= 2, timeout=20000)
    asked = []
    w.traces.ask = lambda title, question: asked.append(question) or True  # issue 20: it asks first
    assert w.open_trace(store, run_id=first_id)
    assert asked
    qtbot.waitUntil(lambda: w.replay.loaded_all and w.live.controller.state == "idle", timeout=20000)
    qtbot.wait(200)  # late signals of the cancelled run must not leak into the replay
    assert w.mode == "replay" and w.model.config.run_id == first_id
    assert w.model.output_tokens == tokens
    with TraceStore(store) as s:
        second = next(r for r in s.list_runs() if r.run_id != first_id)
        assert second.status == "interrupted" and second.stop_reason == "cancelled"


def test_recording_keeps_full_vectors_when_asked(qtbot, make_window, tmp_path):
    from specscope.storage import FULL_VECTORS_AUTO_MAX_VOCAB

    store_path = str(tmp_path / "vectors.sqlite")
    w = make_window(store_path=store_path)
    assert not w.action("file.full_vectors").isChecked()
    default_id, _ = record_live(qtbot, w, temperature="1.0", max_new_tokens="8")
    w.action("file.full_vectors").trigger()
    assert w.action("file.full_vectors").isChecked() and "full probability vectors" in w.statusBar().currentMessage()
    full_id, rounds = record_live(qtbot, w, temperature="1.0", max_new_tokens="8")
    with TraceStore(store_path) as store:
        default, full = store.get_run(default_id), store.get_run(full_id)
        assert default.full_vectors == (w.model.config.vocab_size <= FULL_VECTORS_AUTO_MAX_VOCAB)
        assert full.full_vectors
        stored = store.load_round(full_id, 0)
        assert not getattr(stored.nodes[0].p, "partial", False)
        assert stored.nodes[0].p == pytest.approx(rounds[0].nodes[0].p, rel=1e-6, abs=1e-12)
    # the choice is remembered
    assert make_window(store_path=store_path).action("file.full_vectors").isChecked()
