"""Crafted (hostile) JSONL traces: every field is bounded by what the store and the checker
can hold. A bad file fails `specscope import` with one line naming the line and the field,
and leaves the store unchanged; a store stays listable whatever is in it."""

from __future__ import annotations

import base64
import copy
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import zlib

import pytest
from sqlalchemy import text

from specscope.app.cli import main
from specscope.storage import TraceFormatError, TraceStore, import_run

HEADER = {
    "format": "specscope-trace",
    "version": 1,
    "record": "run",
    "run_id": "hostile",
    "started_at": 1764400000.25,
    "prompt_ids": [1, 2],
    "prompt_text": "hi",
    "config": {
        "max_new_tokens": 8,
        "k": 2,
        "vocab_size": 8,
        "seed": 0,
        "proposer": "draft",
        "proposer_params": {"draft": "x"},
    },
    "models": {"target_name": "tiny-target", "draft_name": "tiny-draft"},
    "extra": {"note": "ok"},
    "storage": {"top_n": 4},
}
ROUND = {
    "record": "round",
    "index": 0,
    "prefix_len": 2,
    "remaining_budget": 8,
    "k": 2,
    "nodes": [{"token": 1, "status": "accepted", "depth": 1, "p": {"top_ids": [1, 0], "top_probs": [0.75, 0.25]}}],
    "emitted": [{"token": 1, "kind": "accepted", "node": 0}, {"token": 3, "kind": "bonus", "node": None}],
    "target_cache": {"before": 1, "peak": 3, "after": 3, "pending": [3]},
    "draft_cache": {"before": 1, "peak": 2, "after": 2, "pending": [3]},
    "draft_forwards": 1,
    "target_forwards": 1,
}
END = {
    "record": "end",
    "status": "completed",
    "stop_reason": "budget",
    "ended_at": 1764400001.0,
    "wall_s": 0.75,
    "new_tokens": [1, 3],
}


def lines(header=None, rounds=None, end=None) -> list[dict]:
    """A small valid trace (header, one round, end), each part replaceable."""
    return [
        copy.deepcopy(header or HEADER),
        *copy.deepcopy([ROUND] if rounds is None else rounds),
        copy.deepcopy(end or END),
    ]


def dump(records: list) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)


def table_dump(db) -> dict:
    with TraceStore(db) as store, store.engine.connect() as conn:
        return {
            t: [tuple(r) for r in conn.execute(text(f"SELECT * FROM {t} ORDER BY 1, 2"))]
            for t in ("runs", "rounds", "draft_nodes")
        }


@pytest.fixture()
def db(tmp_path):
    """A store holding one good run."""
    path = tmp_path / "store.sqlite"
    good = tmp_path / "good.jsonl"
    good.write_text(dump(lines(header={**HEADER, "run_id": "good"})), encoding="utf-8")
    assert main(["import", str(good), "--db", str(path)]) == 0
    return path


def refused(capsys, tmp_path, db, content: str | bytes) -> str:
    """Import a file through the CLI; it must fail with one line and leave the store unchanged."""
    path = tmp_path / "bad.jsonl"
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_bytes(content)
    capsys.readouterr()
    before = table_dump(db)
    code = main(["import", str(path), "--db", str(db)])
    err = capsys.readouterr().err
    assert code != 0
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err[:2000]
    assert len(err) < 500, err[:2000]
    assert table_dump(db) == before
    return err.strip()


def set_path(record: dict, path: str, value) -> None:
    keys = [int(k) if k.isdigit() else k for k in path.replace("[", ".").replace("]", "").split(".")]
    for k in keys[:-1]:
        record = record[k]
    record[keys[-1]] = value


# ---------------------------------------------------------------------------- JSON itself


def test_json_nested_100k_deep_is_one_line_error(capsys, tmp_path, db):
    header = json.dumps(HEADER)
    deep = header[:-1] + ', "extra2": ' + "[" * 100_000 + "]" * 100_000 + "}"
    err = refused(capsys, tmp_path, db, deep + "\n")
    assert err.startswith("specscope: error: line 1, field 'extra2'") and "nested" in err


def test_deeply_nested_objects_name_the_field(capsys, tmp_path, db):
    records = lines()
    records[1]["timings"] = "DEEP"
    deep = '{"a\\"b": ' * 50_000 + "1" + "}" * 50_000
    err = refused(capsys, tmp_path, db, dump(records).replace('"DEEP"', deep))
    assert 'line 2, field \'timings.a"b.a"b.a"b\'' in err and "nested" in err, err


def test_free_form_object_nested_too_deep_names_the_field(capsys, tmp_path, db):
    records = lines()
    records[0]["extra"] = {"a": json.loads("[" * 40 + "]" * 40)}
    err = refused(capsys, tmp_path, db, dump(records))
    assert "line 1, field 'extra.a" in err and "nested" in err


# ---------------------------------------------------------------------------- integers


BIG_INT_FIELDS = [
    (1, "config.seed"),
    (1, "config.k"),
    (1, "config.max_new_tokens"),
    (1, "storage.top_n"),
    (1, "prompt_ids[0]"),
    (2, "prefix_len"),
    (2, "remaining_budget"),
    (2, "k"),
    (2, "nodes[0].depth"),
    (2, "target_cache.before"),
    (2, "target_cache.peak"),
    (2, "draft_cache.after"),
    (2, "target_cache.pending[0]"),
    (2, "draft_forwards"),
    (2, "target_forwards"),
]


@pytest.mark.parametrize("line,field", BIG_INT_FIELDS)
@pytest.mark.parametrize("value", [2**64, -(2**64)])
def test_integers_beyond_64_bits_name_line_and_field(capsys, tmp_path, db, line, field, value):
    records = lines()
    set_path(records[line - 1], field, value)
    err = refused(capsys, tmp_path, db, dump(records))
    assert f"line {line}, field {field!r}" in err, err


def test_seed_at_the_64_bit_limits_imports(tmp_path):
    for seed in (2**63 - 1, -(2**63)):
        records = lines(header={**HEADER, "config": {**HEADER["config"], "seed": seed}})
        with TraceStore(tmp_path / f"s{seed}.sqlite") as store:
            rid = import_run(store, _write(tmp_path, dump(records)))
            assert store.run_config(rid).seed == seed


def _write(tmp_path, content: str):
    path = tmp_path / "trace.jsonl"
    path.write_text(content, encoding="utf-8")
    return path


@pytest.mark.parametrize("line,field", [(1, "config.seed"), (2, "nodes[0].depth"), (2, "nodes[0].p.top_ids[0]")])
def test_5000_digit_integer_names_line_and_field(capsys, tmp_path, db, line, field):
    records = lines()
    set_path(records[line - 1], field, 424242)
    content = dump(records).replace("424242", "9" * 5000)
    err = refused(capsys, tmp_path, db, content)
    assert f"line {line}, field {field!r}" in err and "5000 digits" in err, err


@pytest.mark.parametrize(
    "field,value",
    [
        ("config.vocab_size", 10**12),
        ("config.vocab_size", 2**24 + 1),
        ("config.k", 100_000),
        ("storage.top_n", 2**24 + 1),
    ],
)
def test_vocabulary_and_sizes_the_checker_can_hold(capsys, tmp_path, db, field, value):
    header = copy.deepcopy(HEADER)
    set_path(header, field, value)
    err = refused(capsys, tmp_path, db, dump([header]))  # header only: no round would allocate a vector
    assert f"line 1, field {field!r}" in err, err


def test_depth_bound(capsys, tmp_path, db):
    records = lines()
    records[1]["nodes"][0]["depth"] = 10**6
    err = refused(capsys, tmp_path, db, dump(records))
    assert "line 2, field 'nodes[0].depth'" in err


# ---------------------------------------------------------------------------- floats and times


@pytest.mark.parametrize(
    "line,field,value",
    [
        (1, "started_at", 1e308),
        (1, "started_at", -1.0),
        (1, "started_at", 253402300800.0),
        (3, "ended_at", 1e308),
        (3, "ended_at", -5e9),
        (3, "wall_s", 1e308),
    ],
)
def test_timestamps_within_what_datetime_formats(capsys, tmp_path, db, line, field, value):
    records = lines()
    records[line - 1][field] = value
    err = refused(capsys, tmp_path, db, dump(records))
    assert f"line {line}, field {field!r}" in err, err


@pytest.mark.parametrize(
    "field,token",
    [
        ("extra.bad", "NaN"),
        ("extra.bad", "Infinity"),
        ("extra.bad", "-Infinity"),
        ("extra.bad", "1e999"),
        ("config.proposer_params.bad", "NaN"),
        ("library_versions.bad", "Infinity"),
    ],
)
def test_non_finite_floats_in_free_form_objects(capsys, tmp_path, db, field, token):
    records = lines()
    records[0].setdefault("library_versions", {})
    set_path(records[0], field, 0.4242)
    err = refused(capsys, tmp_path, db, dump(records).replace("0.4242", token))
    assert f"line 1, field {field!r}" in err and "finite" in err, err


def test_non_finite_inside_a_nested_free_form_value(capsys, tmp_path, db):
    records = lines()
    records[0]["extra"] = {"a": [1, {"b": 0.4242}]}
    err = refused(capsys, tmp_path, db, dump(records).replace("0.4242", "NaN"))
    assert "line 1, field 'extra.a[1].b'" in err


# ---------------------------------------------------------------------------- zlib bomb


def _bomb(inflated: int) -> str:
    z = zlib.compressobj(9)
    chunk = b"\0" * (1 << 20)
    parts = [z.compress(chunk) for _ in range(inflated >> 20)]
    parts.append(z.flush())
    return base64.b64encode(b"".join(parts)).decode("ascii")


def _bomb_trace(inflated: int, vocab: int = 2**20) -> str:
    """A trace whose one full vector (vocab float32 values, 4 MiB) inflates to `inflated` bytes."""
    records = lines()
    records[0]["config"]["vocab_size"] = vocab
    records[1]["nodes"][0]["p"] = {"full": {"dtype": "float32", "zlib_base64": _bomb(inflated)}}
    return dump(records)


def test_zlib_bomb_refused(capsys, tmp_path, db):
    err = refused(capsys, tmp_path, db, _bomb_trace(64 << 20))
    assert "line 2, field 'nodes[0].p.full.zlib_base64'" in err and "inflates" in err, err


def test_base64_longer_than_any_stream_of_the_vocabulary(capsys, tmp_path, db):
    err = refused(capsys, tmp_path, db, _bomb_trace(64 << 20, vocab=8))
    assert "line 2, field 'nodes[0].p.full.zlib_base64'" in err and "too long for 8 float32 values" in err, err


def test_short_and_broken_zlib_blobs(capsys, tmp_path, db):
    records = lines()
    good = base64.b64encode(zlib.compress(b"\0" * 32)).decode("ascii")  # 8 float32 zeros
    for data, words in (
        (base64.b64encode(zlib.compress(b"\0" * 16)).decode("ascii"), "expected 8"),
        (base64.b64encode(zlib.compress(b"\0" * 32)[:-3]).decode("ascii"), "zlib"),
        (good + "A", "base64"),
    ):
        records[1]["nodes"][0]["p"] = {"full": {"dtype": "float32", "zlib_base64": data}}
        err = refused(capsys, tmp_path, db, dump(records))
        assert "line 2, field 'nodes[0].p.full" in err and words in err, err


def test_zlib_bomb_peak_memory(tmp_path):
    """A 1 GiB bomb (about 1.4 MB of file) is refused without inflating it: the import's peak
    memory grows by little more than the 4 MiB its vocabulary implies (it took 2.3 GB)."""
    path = tmp_path / "bomb.jsonl"
    path.write_text(_bomb_trace(1 << 30), encoding="utf-8")
    assert path.stat().st_size < 2_000_000
    good = tmp_path / "good.jsonl"
    good.write_text(dump(lines()), encoding="utf-8")
    script = textwrap.dedent(f"""
        import resource, sys
        from specscope.app.cli import main
        assert main(["import", {str(good)!r}, "--db", {str(tmp_path / "bomb.sqlite")!r}]) == 0  # warm: imports, store
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        code = main(["import", {str(path)!r}, "--db", {str(tmp_path / "bomb.sqlite")!r}])
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(code, before, after)
    """)
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    code, before, after = map(int, out.stdout.split()[-3:])
    assert code == 1, out.stderr
    assert "inflates" in out.stderr
    assert (after - before) * 1024 < 64 << 20, (before, after)  # ru_maxrss is in KiB on Linux


# ---------------------------------------------------------------------------- strings


@pytest.mark.parametrize(
    "field,value",
    [
        ("models.target_name", "x" * 10_000_000),
        ("run_id", "x" * 65),
        ("run_id", "evil\x1b[2J"),
        ("config.proposer", "a\x07b"),
        ("models.draft_name", "line\nbreak"),
        ("config.device", "d" * 5000),
        ("prompt_text", "p" * 2_000_000),
    ],
)
def test_strings_bounded_and_ids_without_control_characters(capsys, tmp_path, db, field, value):
    records = lines()
    set_path(records[0], field, value)
    err = refused(capsys, tmp_path, db, dump(records))
    assert f"line 1, field {field!r}" in err, err
    assert "\x1b" not in err and "\x07" not in err


@pytest.mark.parametrize("new_id", ["x\x1b[2J", "y" * 65])
def test_run_id_given_on_the_command_line_is_bounded_too(capsys, tmp_path, db, new_id):
    path = _write(tmp_path, dump(lines()))
    capsys.readouterr()
    before = table_dump(db)
    assert main(["import", str(path), "--db", str(db), "--run-id", new_id]) == 1
    err = capsys.readouterr().err
    assert "field 'run_id'" in err and "--run-id" in err and "\x1b" not in err
    assert table_dump(db) == before


@pytest.mark.parametrize("field", ["run_id", "models.target_name", "prompt_text"])
def test_lone_surrogates_refused(capsys, tmp_path, db, field):
    records = lines()
    set_path(records[0], field, "SURROGATE")
    err = refused(capsys, tmp_path, db, dump(records).replace("SURROGATE", "a\\ud800b"))
    assert f"line 1, field {field!r}" in err and "surrogate" in err, err


def test_free_form_object_size_bounded(capsys, tmp_path, db):
    records = lines()
    records[0]["extra"] = {"blob": "x" * 2_000_000}
    err = refused(capsys, tmp_path, db, dump(records))
    assert "line 1, field 'extra'" in err


def test_long_error_text_bounded(capsys, tmp_path, db):
    records = lines()
    records[2]["error"] = "e" * 2_000_000
    err = refused(capsys, tmp_path, db, dump(records))
    assert "line 3, field 'error'" in err


def test_error_messages_quote_hostile_values_briefly(capsys, tmp_path, db):
    records = lines()
    records[1]["nodes"][0]["status"] = "\x1b[31m" + "y" * 100_000
    err = refused(capsys, tmp_path, db, dump(records))
    assert "line 2, field 'nodes[0].status'" in err and "\x1b" not in err


# ---------------------------------------------------------------------------- display


def _poison(db, **values) -> None:
    """Put odd values into the good run directly (a store written by an older specscope)."""
    with TraceStore(db) as store, store.engine.begin() as conn:
        sets = ", ".join(f"{k} = :{k}" for k in values)
        conn.execute(text(f"UPDATE runs SET {sets} WHERE run_id = 'good'"), values)


def test_runs_and_show_escape_and_cut_untrusted_strings(capsys, tmp_path, db):
    _poison(
        db,
        target_name="\x1b[2J" + "t" * 10_000_000,
        draft_name="d\x07raft",
        proposer="p\x1b]0;x\x07",
        error="boom\x1b[31m" + "e" * 100_000,
        prompt_text="\x1b[1m" + "q" * 100_000,
        device="cpu\r",
    )
    capsys.readouterr()
    assert main(["runs", str(db)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out
    assert max(len(line) for line in out.splitlines()) < 400
    assert "\\x1b" in out and "…" in out
    assert main(["show", str(db), "good"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out
    assert max(len(line) for line in out.splitlines()) < 600


def test_run_id_with_control_characters_is_displayed_escaped(capsys, tmp_path, db):
    conn = sqlite3.connect(db)  # foreign keys off: rename the run in every table
    with conn:
        for t in ("draft_nodes", "rounds", "runs"):
            conn.execute(f"UPDATE {t} SET run_id = ? WHERE run_id = 'good'", ("g\x1b[2Jood",))
    conn.close()
    capsys.readouterr()
    assert main(["runs", str(db)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "g\\x1b" in out
    assert main(["show", str(db), "g"]) == 0
    assert "\x1b" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "column,value", [("started_at", 1e308), ("started_at", -1e308), ("ended_at", 1e308), ("ended_at", -1e308)]
)
def test_store_stays_listable_with_odd_timestamps(capsys, tmp_path, db, column, value):
    other = tmp_path / "other.jsonl"
    other.write_text(dump(lines(header={**HEADER, "run_id": "other"})), encoding="utf-8")
    assert main(["import", str(other), "--db", str(db)]) == 0
    _poison(db, **{column: value})
    capsys.readouterr()
    assert main(["runs", str(db)]) == 0
    out = capsys.readouterr().out
    assert "good" in out and "other" in out
    assert main(["runs", str(db), "--json"]) == 0
    capsys.readouterr()
    assert main(["show", str(db), "good"]) == 0
    assert "run good" in capsys.readouterr().out


def test_export_of_a_stored_nan_names_the_field(capsys, tmp_path, db):
    """A store an older specscope let NaN into exports with a one-line error, not a traceback."""
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("""UPDATE runs SET extra = '{"a": [1, NaN]}' WHERE run_id = 'good'""")
    conn.close()
    capsys.readouterr()
    assert main(["export", str(db), "good", "-o", str(tmp_path / "out.jsonl")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        "specscope: error: cannot export run good: its header: field 'extra.a[1]' holds NaN or Infinity, "
        "which the trace format does not allow"
    ), err
    assert not (tmp_path / "out.jsonl").exists()


def test_a_valid_hostile_looking_trace_still_imports(tmp_path):
    """Values at the bounds import and export unchanged."""
    records = lines()
    records[0]["run_id"] = "r" * 64
    records[0]["config"]["vocab_size"] = 2**24
    records[0]["config"]["seed"] = 2**63 - 1
    records[0]["extra"] = {"n": -(2**63), "deep": json.loads("[" * 30 + "]" * 30), "f": 1e308}
    records[0]["started_at"] = 0.0
    records[2]["ended_at"] = 253402214399.0
    path = _write(tmp_path, dump(records))
    with TraceStore(tmp_path / "ok.sqlite") as store:
        rid = import_run(store, path)
        out = tmp_path / "back.jsonl"
        from specscope.storage import export_run

        export_run(store, rid, out)
    assert json.loads(out.read_text().splitlines()[0])["extra"] == records[0]["extra"]


def test_trace_format_error_is_raised_by_the_api(tmp_path):
    records = lines()
    records[0]["config"]["seed"] = 2**64
    with TraceStore(tmp_path / "api.sqlite") as store, pytest.raises(TraceFormatError) as exc:
        import_run(store, _write(tmp_path, dump(records)))
    assert exc.value.line == 1 and exc.value.field == "config.seed"
