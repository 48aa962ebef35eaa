"""Recording real decoder runs and reading them back."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
from sqlalchemy import text

from specscope.storage import (
    PartialDistribution,
    RunExistsError,
    TraceStore,
    TraceWriter,
    WriterError,
    is_partial,
    round_is_partial,
)
from specscope.storage.writer.api import MODE_ENV
from tests.storage.conftest import PROMPT
from tests.storage.helpers import assert_rounds_equal, synthetic_config, synthetic_rounds


@pytest.fixture(params=["process", "thread"])
def writer_mode(request, monkeypatch):
    """Runs a test with writers in a writer process and again with writer threads."""
    monkeypatch.setenv(MODE_ENV, request.param)
    return request.param


def test_recorded_runs_load_back(recorded):
    path, results = recorded
    with TraceStore(path) as store:
        runs = {r.run_id: r for r in store.list_runs()}
        for kind, res in results.items():
            info = runs[res.config.run_id]
            assert info.status == "completed" and info.stop_reason == res.stop_reason
            assert info.config == res.config
            assert store.new_tokens(res.config.run_id) == res.new_tokens and info.n_new_tokens == len(res.new_tokens)
            assert info.n_rounds == len(res.rounds) == store.count_rounds(info.run_id)
            assert info.drafted == res.summary.drafted and info.accepted == res.summary.accepted
            assert info.mean_accepted_length == pytest.approx(res.summary.mean_accepted_length)
            assert info.wall_s == res.wall_s
            assert info.library_versions["sqlalchemy"] and info.library_versions["python"]
            full = kind != "lookup"
            assert info.full_vectors is full
            loaded = store.load_rounds(info.run_id, full=True)
            assert len(loaded) == len(res.rounds)
            for a, b in zip(res.rounds, loaded):
                # float32 full vectors: within float32 rounding; scalars exact
                assert_rounds_equal(a, b, atol=1e-7 if full else 0, vectors=full)
                assert round_is_partial(b) is (not full)
        sampled = runs[results["sampled"].config.run_id]
        assert sampled.models.target_hash == "sha256:t" and sampled.models.draft_name == "tiny-draft"
        assert sampled.models.target_name == "tiny-target"


def test_the_runs_exercise_rejections_and_bonuses(recorded):
    _, results = recorded
    rounds = results["sampled"].rounds
    assert any(r.rejected_node is not None for r in rounds)
    assert any(r.bonus is not None for r in rounds)


def test_top_n_entries_and_exact_scalars_are_exact(recorded):
    path, results = recorded
    res = results["sampled"]
    with TraceStore(path) as store:
        for orig, part in zip(res.rounds, store.load_rounds(res.config.run_id, full=False)):
            for a, b in zip(orig.nodes, part.nodes):
                assert isinstance(b.p, PartialDistribution) and is_partial(b.p)
                assert b.p.shape == a.p.shape
                ids = b.p.known_ids
                assert np.array_equal(b.p[ids], a.p[ids])  # bit-exact where known
                assert b.p[a.token] == a.p_token and b.q[a.token] == a.q_token
                assert int(np.argmax(b.p)) == int(np.argmax(a.p))
                assert b.p.missing_mass == pytest.approx(1 - a.p[ids].sum(), abs=1e-12)
                unknown = np.setdiff1d(np.arange(a.p.size), ids)
                assert (b.p[unknown] == 0).all()
            if orig.residual is not None:
                assert is_partial(part.residual)
                assert int(np.argmax(part.residual)) == int(np.argmax(orig.residual))


def test_greedy_run_has_no_q(recorded):
    path, results = recorded
    with TraceStore(path) as store:
        r = store.load_round(results["greedy"].config.run_id, 0)
    assert all(n.q is None and n.u is None for n in r.nodes)
    assert not round_is_partial(r)


def test_lazy_ranges_and_summaries(recorded):
    path, results = recorded
    res = results["sampled"]
    rid = res.config.run_id
    with TraceStore(path) as store:
        part = store.load_rounds(rid, 2, 5)
        assert [r.index for r in part] == [2, 3, 4]
        assert store.load_rounds(rid, 10_000) == []
        sums = store.round_summaries(rid)
        assert [s.index for s in sums] == list(range(len(res.rounds)))
        for s, r in zip(sums, res.rounds):
            assert s.tokens == r.tokens and s.accepted == r.accepted and s.drafted == r.drafted
            assert s.emitted == r.emitted and s.target_cache == r.target_cache and s.draft_cache == r.draft_cache
            assert s.accepted_length == r.accepted_length and s.timings == r.timings
        assert [r.index for r in store.iter_rounds(rid, batch_size=3)] == list(range(len(res.rounds)))
        one = store.load_round(rid, 1)
        assert_rounds_equal(res.rounds[1], one, atol=1e-7)
        with pytest.raises(KeyError):
            store.load_round(rid, 10_000)
        assert store.resolve_run_id(rid[:10]) == rid


def test_flushes_within_the_interval_and_reads_while_running(store, writer_mode):
    config = synthetic_config()
    rounds = synthetic_rounds(config, 30)
    writer = TraceWriter(store, config, flush_interval=0.1)
    try:
        for r in rounds[:10]:
            writer.write(r)
        time.sleep(0.5)  # no explicit flush: the thread's interval must have committed them
        with TraceStore(store.path) as other:
            info = other.get_run(config.run_id)
            assert info.status == "running" and other.count_rounds(config.run_id) == 10 and info.n_rounds == 10
        # another process reads the run in progress and does not mark it interrupted
        code = (
            "import sys; from specscope.storage import TraceStore\n"
            "s = TraceStore(sys.argv[1]); r = s.get_run(sys.argv[2])\n"
            "print(r.status, len(s.round_summaries(r.run_id)), len(s.load_rounds(r.run_id)))\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, store.path, config.run_id], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["running", "10", "10"]
        for r in rounds[10:]:
            writer.write(r)
    finally:
        writer.finish("completed")
    assert store.get_run(config.run_id).status == "completed"
    assert store.count_rounds(config.run_id) == 30


def test_writer_rejects_misuse(store, writer_mode):
    config = synthetic_config()
    rounds = synthetic_rounds(config, 3)
    with TraceWriter(store, config) as writer:
        with pytest.raises(ValueError, match="out of order"):
            writer.write(rounds[1])
        writer.write(rounds[0])
        other = synthetic_rounds(synthetic_config(), 1)[0]
        with pytest.raises(ValueError, match="given to the writer"):
            writer.write(other)
    assert store.get_run(config.run_id).status == "completed"
    with pytest.raises(WriterError, match="finished"):
        writer.write(rounds[1])
    with pytest.raises(RunExistsError):
        TraceWriter(store, config)


def test_exception_marks_failed_and_cancel_marks_interrupted(store, writer_mode, make_decoder):
    config = synthetic_config()
    with pytest.raises(RuntimeError), TraceWriter(store, config) as writer:
        writer.write(synthetic_rounds(config, 1)[0])
        raise RuntimeError("boom")
    info = store.get_run(config.run_id)
    assert info.status == "failed" and "boom" in info.error and info.n_rounds == 1

    dec = make_decoder("sampled")
    cfg = dec.run_config(PROMPT, 40)
    gen = dec.rounds(PROMPT, 40, config=cfg)
    with TraceWriter(store, cfg) as writer:
        writer.write(next(gen))
        writer.write(next(gen))
        gen.close()
        writer.finish("interrupted")
    info = store.get_run(cfg.run_id)
    assert info.status == "interrupted" and info.n_rounds == 2


def test_writer_failure_surfaces(store, writer_mode):
    config = synthetic_config()
    writer = TraceWriter(store, config, flush_interval=0.05)
    assert writer.mode == writer_mode
    with store.engine.begin() as conn:  # sabotage: the rounds table disappears
        conn.execute(text("ALTER TABLE draft_nodes RENAME TO draft_nodes_gone"))
    writer.write(synthetic_rounds(config, 1)[0])
    with pytest.raises(WriterError):
        writer.flush()
    with pytest.raises(WriterError):
        writer.finish()
    with store.engine.begin() as conn:
        conn.execute(text("ALTER TABLE draft_nodes_gone RENAME TO draft_nodes"))
    assert store.get_run(config.run_id).status == "failed"


def test_heartbeat_while_idle(store, writer_mode):
    config = synthetic_config()
    with TraceWriter(store, config) as writer:
        first = store.get_run(config.run_id).heartbeat_at
        time.sleep(1.3)
        assert store.get_run(config.run_id).heartbeat_at > first
        assert writer.rounds_written == 0


def test_commit_period_leaves_room_for_the_work_inside_the_flush_interval():
    from specscope.storage.writer.api import COMMIT_MARGIN, commit_period

    assert commit_period(0.25, 0.0) == pytest.approx(COMMIT_MARGIN * 0.25)
    for work in (0.005, 0.02, 0.04, 0.06):
        period = commit_period(0.25, work)
        assert period <= COMMIT_MARGIN * 0.25 and period + 2 * work <= 0.25 - 0.02 + 1e-12
    assert commit_period(0.25, 1.0) == pytest.approx(0.25 * 0.25)  # never busier than 4 commits per interval


def test_full_vector_policy(store, writer_mode):
    with (
        TraceWriter(store, synthetic_config(vocab=2048)) as big,
        TraceWriter(store, synthetic_config(vocab=1024)) as small,
    ):
        assert big.policy.full is False and small.policy.full is True
    assert store.get_run(big.run_id).full_vectors is False
    forced = synthetic_config(vocab=9000)
    r = synthetic_rounds(forced, 1)[0]
    with TraceWriter(store, forced, full_vectors=True, full_dtype="float64", top_n=3) as w:
        w.write(r)
    loaded = store.load_round(forced.run_id, 0)
    assert_rounds_equal(r, loaded, atol=0)  # float64 full vectors: bit-exact
    top = store.load_round(forced.run_id, 0, full=False)
    assert len(top.nodes[0].p.known_ids) <= 4  # top-3 plus the proposed token


def test_storage_never_imports_qt_or_app():
    code = (
        "import sys, specscope.storage, specscope.storage.jsonl.transfer, specscope.storage.writer.api\n"
        "bad = [m for m in sys.modules if m.startswith(('PySide6', 'pyqtgraph', 'specscope.app'))]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    src = os.path.join(os.path.dirname(__file__), "..", "..", "..", "storage")
    for name in os.listdir(src):
        if name.endswith(".py"):
            with open(os.path.join(src, name), encoding="utf-8") as fh:
                body = fh.read()
            assert "PySide6" not in body and "specscope.app" not in body and "pyqtgraph" not in body, name
