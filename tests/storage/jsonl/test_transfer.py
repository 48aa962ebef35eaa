"""JSONL export/import: exact round trips, validation with line and field, all-or-nothing."""

from __future__ import annotations

import dataclasses
import io
import json

import numpy as np
import pytest
from sqlalchemy import text

from specscope.storage import (
    FORMAT_VERSION,
    RunExistsError,
    TraceFormatError,
    TraceStore,
    TraceStoreError,
    TraceWriter,
    export_run,
    import_run,
    round_is_partial,
)
from tests.storage.helpers import assert_rounds_equal, synthetic_config, synthetic_rounds


def table_dump(store) -> dict:
    out = {}
    with store.engine.connect() as conn:
        for t in ("runs", "rounds", "draft_nodes", "schema_version"):
            out[t] = [tuple(r) for r in conn.execute(text(f"SELECT * FROM {t} ORDER BY 1, 2"))]
    return out


@pytest.mark.parametrize("kind", ["sampled", "greedy", "lookup"])
def test_export_import_reproduces_the_run_exactly(recorded, tmp_path, kind):
    path, results = recorded
    rid = results[kind].config.run_id
    first = tmp_path / "a.jsonl"
    with TraceStore(path) as src:
        n = export_run(src, rid, first)
        assert n == len(results[kind].rounds)
        original_info = src.get_run(rid)
        original_rounds = src.load_rounds(rid, full=True)
        original_top = src.load_rounds(rid, full=False)
        with src.engine.connect() as conn:
            original_rows = [
                tuple(r) for r in conn.execute(text("SELECT * FROM rounds WHERE run_id = :r ORDER BY 2"), {"r": rid})
            ]
            original_nodes = [
                tuple(r)
                for r in conn.execute(text("SELECT * FROM draft_nodes WHERE run_id = :r ORDER BY 2, 3"), {"r": rid})
            ]
    with TraceStore(tmp_path / "b.sqlite") as dst:
        assert import_run(dst, first) == rid
        liveness = dict(heartbeat_at=None, writer_host=None, writer_pid=None)  # the writer's, not the run's
        assert dst.get_run(rid) == dataclasses.replace(original_info, **liveness)
        for a, b in zip(original_rounds, dst.load_rounds(rid, full=True)):
            assert_rounds_equal(a, b, atol=0)
        for a, b in zip(original_top, dst.load_rounds(rid, full=False)):
            assert_rounds_equal(a, b, atol=0)
            assert round_is_partial(a) == round_is_partial(b)
        with dst.engine.connect() as conn:  # the stored rows themselves, blobs included
            assert [tuple(r) for r in conn.execute(text("SELECT * FROM rounds ORDER BY 2"))] == original_rows
            assert [tuple(r) for r in conn.execute(text("SELECT * FROM draft_nodes ORDER BY 2, 3"))] == original_nodes
        second = tmp_path / "c.jsonl"
        export_run(dst, rid, second)
    assert first.read_bytes() == second.read_bytes()


def test_format_header_and_lines(recorded, tmp_path):
    path, results = recorded
    out = io.StringIO()
    with TraceStore(path) as s:
        export_run(s, results["sampled"].config.run_id, out)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines[0]["format"] == "specscope-trace" and lines[0]["version"] == FORMAT_VERSION
    assert lines[0]["record"] == "run" and lines[-1]["record"] == "end"
    assert {line["record"] for line in lines[1:-1]} == {"round"}
    node = lines[1]["nodes"][0]
    # the sampled run has top-k=40: the writer keeps 41 entries so that the filter is checkable
    assert lines[0]["storage"]["top_n"] == 41
    assert len(node["p"]["top_ids"]) == len(node["p"]["top_probs"]) <= 41
    assert node["p"]["full"]["dtype"] == "float32"


def test_import_under_another_id_and_duplicate(recorded, tmp_path):
    path, results = recorded
    f = tmp_path / "a.jsonl"
    rid = results["greedy"].config.run_id
    with TraceStore(path) as s:
        export_run(s, rid, f)
    with TraceStore(tmp_path / "b.sqlite") as dst:
        import_run(dst, f)
        before = table_dump(dst)
        with pytest.raises(RunExistsError, match="--run-id"):
            import_run(dst, f)
        assert table_dump(dst) == before
        assert import_run(dst, f, run_id="copy") == "copy"
        assert dst.load_round("copy", 0).run_id == "copy"
        assert dst.get_run("copy").n_rounds == dst.get_run(rid).n_rounds


def _lines(recorded, tmp_path) -> list[dict]:
    path, results = recorded
    out = io.StringIO()
    with TraceStore(path) as s:
        export_run(s, results["sampled"].config.run_id, out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def _write(tmp_path, lines, name="bad.jsonl"):
    f = tmp_path / name
    f.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return f


def _breakages():
    def set_(path, value):
        def apply(lines):
            obj = lines
            for key in path[:-1]:
                obj = obj[key]
            obj[path[-1]] = value

        return apply

    def drop(path):
        def apply(lines):
            obj = lines
            for key in path[:-1]:
                obj = obj[key]
            del obj[path[-1]]

        return apply

    return [
        (set_([0, "format"], "other"), 1, "format"),
        (set_([0, "version"], 99), 1, "version"),
        (drop([0, "config", "vocab_size"]), 1, "config.vocab_size"),
        (set_([0, "prompt_ids", 1], 10_000), 1, "prompt_ids[1]"),
        (set_([2, "nodes", 1, "status"], "maybe"), 3, "nodes[1].status"),
        (set_([2, "nodes", 0, "p", "top_probs", 2], "0.5"), 3, "nodes[0].p.top_probs[2]"),
        (set_([2, "nodes", 0, "token"], 64), 3, "nodes[0].token"),
        (set_([2, "index"], 5), 3, "index"),
        (set_([3, "emitted", 0, "kind"], "guessed"), 4, "emitted[0].kind"),
        (set_([3, "nodes", 0, "u"], 1.5), 4, "nodes[0].u"),
        (set_([2, "nodes", 0, "q", "full", "zlib_base64"], "!!!"), 3, "nodes[0].q.full.zlib_base64"),
        (drop([2, "emitted"]), 3, "emitted"),
        (drop([2, "nodes", 0, "p", "total"]), 3, "nodes[0].p.total"),
        (set_([2, "nodes", 0, "q", "support"], 65), 3, "nodes[0].q.support"),
        (set_([2, "nodes", 0, "p", "minimum"], 0.9), 3, "nodes[0].p.minimum"),
        (set_([-1, "new_tokens"], [1, 2, 3]), -1, "new_tokens"),
        (set_([2, "target_cache", "before"], True), 3, "target_cache.before"),
    ]


@pytest.mark.parametrize("case", range(len(_breakages())))
def test_invalid_lines_report_line_and_field_and_change_nothing(recorded, tmp_path, case):
    breaker, line, field = _breakages()[case]
    lines = _lines(recorded, tmp_path)
    breaker(lines)
    if line < 0:
        line = len(lines) + 1 + line
    f = _write(tmp_path, lines)
    with TraceStore(tmp_path / "dst.sqlite") as dst:
        config = synthetic_config()
        with TraceWriter(dst, config) as w:
            w.write(synthetic_rounds(config, 1)[0])
        before = table_dump(dst)
        with pytest.raises(TraceFormatError) as err:
            import_run(dst, f)
        assert (err.value.line, err.value.field) == (line, field), str(err.value)
        assert f"line {line}" in str(err.value) and field in str(err.value)
        assert table_dump(dst) == before


def test_malformed_json_and_trailing_lines(recorded, tmp_path):
    lines = _lines(recorded, tmp_path)
    with TraceStore(tmp_path / "dst.sqlite") as dst:
        f = _write(tmp_path, [lines[0], lines[1], "{not json"])
        with pytest.raises(TraceFormatError, match="line 3: not valid JSON"):
            import_run(dst, f)
        f = _write(tmp_path, lines + [lines[1]])
        with pytest.raises(TraceFormatError, match="nothing may follow the end record"):
            import_run(dst, f)
        with pytest.raises(TraceFormatError, match="empty"):
            import_run(dst, _write(tmp_path, []))
        assert dst.list_runs() == []


def test_database_failure_mid_import_rolls_back(recorded, tmp_path):
    lines = _lines(recorded, tmp_path)
    f = _write(tmp_path, lines)
    with TraceStore(tmp_path / "dst.sqlite") as dst:
        before = table_dump(dst)
        with dst.engine.begin() as conn:  # nodes cannot be inserted: the run and rounds must vanish too
            conn.execute(
                text("CREATE TRIGGER no_nodes BEFORE INSERT ON draft_nodes BEGIN SELECT RAISE(ABORT, 'nope'); END")
            )
        with pytest.raises(TraceStoreError):
            import_run(dst, f)
        with dst.engine.begin() as conn:
            conn.execute(text("DROP TRIGGER no_nodes"))
        assert table_dump(dst) == before


def test_minimal_third_party_trace(tmp_path):
    """What someone's own decoder has to write: the rest is derived or defaulted."""
    header = {
        "format": "specscope-trace",
        "version": 1,
        "record": "run",
        "run_id": "mine",
        "prompt_ids": [1, 2],
        "config": {"vocab_size": 8, "k": 2, "max_new_tokens": 4, "sampling": {"temperature": 1.0}},
    }
    p = [0.5, 0.2, 0.1, 0.1, 0.05, 0.05, 0.0, 0.0]
    q = [0.25] * 4 + [0.0] * 4
    r0 = {
        "record": "round",
        "index": 0,
        "nodes": [
            {"token": 0, "status": "accepted", "u": 0.1, "p": {"full": p}, "q": {"full": q}},
            {
                "token": 3,
                "status": "rejected",
                "u": 0.9,
                "p": {"top_ids": [0, 1], "top_probs": [0.5, 0.2]},
                "q": {"top_ids": [3], "top_probs": [0.25]},
            },
        ],
        "emitted": [
            {"token": 0, "kind": "accepted", "node": 0},
            {"token": 1, "kind": "repaired", "node": 1, "draw": 0.3},
        ],
    }
    r1 = {"record": "round", "index": 1, "nodes": [], "emitted": [{"token": 2, "kind": "bonus"}]}
    end = {"record": "end", "status": "completed", "new_tokens": [0, 1, 2]}
    f = _write(tmp_path, [header, r0, r1, end], "mine.jsonl")
    with TraceStore(tmp_path / "s.sqlite") as s:
        assert import_run(s, f) == "mine"
        info = s.get_run("mine")
        assert (
            info.status == "completed"
            and s.new_tokens("mine") == [0, 1, 2]
            and info.n_new_tokens == 3
            and info.n_rounds == 2
        )
        rnd = s.load_round("mine", 0)
        n0, n1 = rnd.nodes
        assert n0.p_token == 0.5 and n0.q_token == 0.25 and n0.ratio == 2.0 and n0.target_argmax == 0
        assert n0.overlap == pytest.approx(sum(min(a, b) for a, b in zip(p, q)), abs=1e-7)
        assert n1.parent == 0 and n1.depth == 2 and n1.p_token == 0.0 and n1.q_token == 0.25
        assert rnd.rejected_node == 1 and rnd.emitted_before == 0 and rnd.prefix_len == 2
        assert s.load_round("mine", 1).prefix_len == 4
        # without an end line the run counts as cut off
        f2 = _write(tmp_path, [dict(header, run_id="cut"), r0], "cut.jsonl")
        import_run(s, f2)
        assert s.get_run("cut").status == "interrupted"


def test_export_of_a_run_in_progress_imports_as_interrupted(tmp_path):
    with TraceStore(tmp_path / "a.sqlite") as s:
        config = synthetic_config()
        w = TraceWriter(s, config)
        for r in synthetic_rounds(config, 3):
            w.write(r)
        w.flush()
        out = io.StringIO()
        assert export_run(s, config.run_id, out) == 3
        w.finish()
    assert '"record":"end"' not in out.getvalue()
    with TraceStore(tmp_path / "b.sqlite") as d:
        import_run(d, io.StringIO(out.getvalue()))
        assert d.get_run(config.run_id).status == "interrupted" and d.count_rounds(config.run_id) == 3


def test_round_trip_keeps_exact_facts_of_entries_that_float32_flushes_to_zero(tmp_path):
    """A p with entries below float32's smallest positive value, kept as float32 full
    vectors: the export carries the exact whole-vector facts (all entries > 0), which the
    float32 vector alone cannot show, and the import accepts and keeps them."""
    config = synthetic_config()
    rnd = synthetic_rounds(config, 1)[0]
    p = np.asarray(rnd.nodes[0].p, dtype=np.float64).copy()
    p[p < np.median(p)] = 1e-50
    p /= p.sum()
    node = dataclasses.replace(rnd.nodes[0], p=p, p_token=float(p[rnd.nodes[0].token]))
    rnd = dataclasses.replace(rnd, nodes=(node,) + tuple(rnd.nodes[1:]))
    with TraceStore(tmp_path / "a.sqlite") as src:
        with TraceWriter(src, config, full_vectors=True) as writer:
            writer.write(rnd)
        out = tmp_path / "a.jsonl"
        export_run(src, config.run_id, out)
    line = json.loads(out.read_text().splitlines()[1])
    assert line["nodes"][0]["p"]["support"] == config.vocab_size
    with TraceStore(tmp_path / "b.sqlite") as dst:
        import_run(dst, out)
        top = dst.load_round(config.run_id, 0, full=False)
        assert top.nodes[0].p.stats.support == config.vocab_size and top.nodes[0].p.stats.minimum > 0
        export_run(dst, config.run_id, tmp_path / "b.jsonl")
    assert (tmp_path / "b.jsonl").read_bytes() == out.read_bytes()
