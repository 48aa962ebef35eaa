"""Checking, exporting and importing a stored run hold a bounded number of rounds, whatever
the run's length. Asserted structurally (live round objects, rows handed over per batch,
ranges read), not with timing or process memory."""

from __future__ import annotations

import io
import json
import weakref

import numpy as np
from sqlalchemy import event

from specscope.app.cli import main
from specscope.core.check.checker import check_report, check_run
from specscope.storage import TraceStore, TraceWriter, export_run, import_run
from specscope.storage.errors import TraceFormatError
from specscope.storage.jsonl import read as jsonl_read
from specscope.storage.jsonl import transfer as jsonl
from tests.storage.helpers import synthetic_config, synthetic_round, synthetic_rounds


class Live:
    """Rounds handed out and still alive (weak references only)."""

    def __init__(self) -> None:
        self.rounds: weakref.WeakSet = weakref.WeakSet()
        self.most = 0

    def add(self, rnd):
        self.rounds.add(rnd)  # rounds hold no reference cycles: freed as soon as nothing holds them
        self.most = max(self.most, len(self.rounds))
        return rnd


def test_the_checker_holds_three_rounds_of_a_long_stream():
    config = synthetic_config(run_id="stream")
    live = Live()

    def rounds():
        rng, emitted = np.random.default_rng(0), 0
        for i in range(300):
            rnd = live.add(synthetic_round(config, i, emitted, rng))
            emitted += len(rnd.emitted)
            yield rnd

    report = check_report(config, rounds())
    assert live.most <= 3, live.most  # the round checked, the one before, the one read ahead
    # the same findings as over a list of the same rounds
    assert report.findings == check_run(config, synthetic_rounds(config, 300))


def _stored(tmp_path, n: int, run_id: str = "long"):
    config = synthetic_config(run_id=run_id)
    path = tmp_path / "s.sqlite"
    with TraceStore(path) as store, TraceWriter(store, config) as writer:
        for rnd in synthetic_rounds(config, n):
            writer.write(rnd)
    return path, config


def test_iter_rounds_holds_one_batch(tmp_path):
    path, _ = _stored(tmp_path, 90)
    live = Live()
    with TraceStore(path) as store:
        seen = [live.add(r).index for r in store.iter_rounds("long", batch_size=16, full=True)]
        assert seen == list(range(90))
        assert live.most <= 16
        # the default batch is bounded by the vocabulary: 64 MiB of dense vectors
        assert store.batch_size("long") == 256
    big = synthetic_config(vocab=151_936, run_id="big")
    with TraceStore(tmp_path / "big.sqlite") as store:
        TraceWriter(store, big).finish()
        assert store.batch_size("big") == (64 << 20) // (151_936 * 8 * 2 * (4 + 2))


def test_check_command_reads_the_run_in_batches(tmp_path, monkeypatch, capsys):
    """`specscope check` never asks the store for a whole run: every read is a bounded range."""
    path, _ = _stored(tmp_path, 300)
    ranges = []
    real = TraceStore.load_rounds

    def spy(self, run_id, start=0, stop=None, full=False):
        ranges.append((start, stop))
        return real(self, run_id, start, stop, full)

    monkeypatch.setattr(TraceStore, "load_rounds", spy)
    monkeypatch.setattr("specscope.storage.store.MAX_BATCH", 64)
    code = main(["check", str(path), "--run", "long", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code in (0, 1) and out["runs"][0]["rounds"] == 300
    assert len(ranges) == 5 and all(stop is not None and stop - start == 64 for start, stop in ranges), ranges


def _trace_text(tmp_path, n: int) -> str:
    path, _ = _stored(tmp_path, n, run_id="orig")
    buf = io.StringIO()
    with TraceStore(path) as store:
        export_run(store, "orig", buf)
    return buf.getvalue()


def test_import_hands_over_rows_in_batches(tmp_path, monkeypatch):
    text = _trace_text(tmp_path, 50)
    monkeypatch.setattr(jsonl_read, "BATCH_ROUNDS", 7)
    sizes = []
    real = jsonl._StoreSink.batch

    def spy(self, run):
        sizes.append(len(run.rounds))
        real(self, run)

    monkeypatch.setattr(jsonl._StoreSink, "batch", spy)
    with TraceStore(tmp_path / "in.sqlite") as store:
        rid = import_run(store, io.StringIO(text), run_id="copy")
        assert sizes == [7] * 7 + [1]  # never more than a batch pending
        with TraceStore(tmp_path / "s.sqlite") as orig:
            assert store.new_tokens(rid) == orig.new_tokens("orig")
            assert store.get_run(rid).n_new_tokens == orig.get_run("orig").n_new_tokens
            assert store.get_run(rid).n_rounds == 50
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM run_tokens").scalar() == 8  # a chunk per batch


def test_a_failed_streaming_import_leaves_the_store_unchanged(tmp_path, monkeypatch):
    """Batches already inserted are rolled back with the rest: all or nothing."""
    lines = _trace_text(tmp_path, 50).splitlines()
    bad = json.loads(lines[40])
    bad["index"] = 99
    lines[40] = json.dumps(bad)
    monkeypatch.setattr(jsonl_read, "BATCH_ROUNDS", 7)
    with TraceStore(tmp_path / "in.sqlite") as store:
        try:
            import_run(store, io.StringIO("\n".join(lines)), run_id="copy")
        except TraceFormatError as exc:
            assert exc.line == 41 and "index" in str(exc)
        else:
            raise AssertionError("the bad line was accepted")
        with store.engine.connect() as conn:
            for table in ("runs", "rounds", "draft_nodes", "run_tokens"):
                assert conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar() == 0, table


def test_export_is_lazy(tmp_path, monkeypatch):
    """The export's lines come out while the run is read batch by batch."""
    path, _ = _stored(tmp_path, 100)
    made = []
    real = jsonl.round_json
    monkeypatch.setattr(jsonl, "round_json", lambda r, nodes: made.append(r["round_index"]) or real(r, nodes))
    with TraceStore(path) as store:
        lines = jsonl.iter_export(store, "long", batch_size=10)
        next(lines), next(lines)  # the header and round 0
        assert len(made) == 1
        rest = list(lines)
        assert len(made) == 100 and json.loads(rest[-1])["new_tokens"] == store.new_tokens("long")


def test_rounds_without_vectors_read_no_blob(tmp_path):
    """load_rounds(vectors=False), what a long replay's timeline reads: the rounds' scalars
    and nodes as stored, every distribution None, and no blob column selected."""
    path, _ = _stored(tmp_path, 20)
    with TraceStore(path) as store:
        statements = []
        event.listen(store.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
        slim = store.load_rounds("long", 5, 15, vectors=False)
        whole = store.load_rounds("long", 5, 15)
    assert [r.index for r in slim] == list(range(5, 15))
    assert all(
        r.bonus_p is None and r.residual is None and all(n.p is None and n.q is None for n in r.nodes) for r in slim
    )
    for a, b in zip(slim, whole):
        assert a.emitted == b.emitted and a.target_cache == b.target_cache and a.residual_mass == b.residual_mass
        assert [(n.token, n.status, n.p_token, n.u) for n in a.nodes] == [
            (n.token, n.status, n.p_token, n.u) for n in b.nodes
        ]
    first_reads = " ".join(statements[:3])
    assert "_top" not in first_reads and "_full" not in first_reads


def test_show_prints_a_long_timeline_in_batches(tmp_path, monkeypatch, capsys):
    path, _ = _stored(tmp_path, 30)
    monkeypatch.setattr("specscope.app.cli.traces.SHOW_BATCH", 7)
    ranges = []
    real = TraceStore.round_summaries

    def spy(self, run_id, start=0, stop=None):
        ranges.append((start, stop))
        return real(self, run_id, start, stop)

    monkeypatch.setattr(TraceStore, "round_summaries", spy)
    assert main(["show", str(path), "long"]) == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    rows = [parts[0] for parts in lines if len(parts) > 1 and parts[0].isdigit() and parts[1].isdigit()]
    assert rows == [str(i) for i in range(30)]
    assert ranges == [(0, 7), (7, 14), (14, 21), (21, 28), (28, 35)]
