"""The trace subcommands: runs, show, export, import (registered into an argparse parser)."""

from __future__ import annotations

import argparse
import json

import pytest

from specscope.app.cli import traces as cli_traces
from specscope.storage import TraceStore


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="specscope")
    cli_traces.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    return args.func(args)


def test_runs_lists_every_run(recorded, capsys):
    path, results = recorded
    assert run_cli("runs", str(path)) == 0
    out = capsys.readouterr().out
    for res in results.values():
        assert res.config.run_id[:12] in out
    assert run_cli("runs", str(path), "--json", "--status", "completed") == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["run_id"] for r in rows} == {r.config.run_id for r in results.values()}


def test_show_run_and_round(recorded, capsys):
    path, results = recorded
    res = results["sampled"]
    assert run_cli("show", str(path), res.config.run_id[:8]) == 0
    out = capsys.readouterr().out
    assert res.config.run_id in out and "completed" in out and "tiny-target" in out
    table = out.split("emitted (! repaired, + bonus)")[1].strip().splitlines()
    assert [int(line.split()[0]) for line in table] == list(range(len(res.rounds)))
    r = next(r for r in res.rounds if r.rejected_node is not None)
    assert run_cli("show", str(path), res.config.run_id, "--round", str(r.index)) == 0
    out = capsys.readouterr().out
    assert f"first rejection at node {r.rejected_node}" in out and "residual top" in out and "p top" in out
    assert run_cli("show", str(path), res.config.run_id, "--round", str(r.index), "--json") == 0
    assert json.loads(capsys.readouterr().out)["index"] == r.index
    assert run_cli("show", str(path), "last", "--json") == 0
    assert json.loads(capsys.readouterr().out)["record"] == "run"


def test_show_prints_the_whole_vector_facts_of_a_top_n_save(tmp_path, capsys):
    from specscope.storage import TraceWriter
    from tests.storage.helpers import synthetic_config, synthetic_rounds

    config = synthetic_config()
    rnd = synthetic_rounds(config, 1)[0]
    path = tmp_path / "top.sqlite"
    with TraceStore(path) as store, TraceWriter(store, config, full_vectors=False, top_n=3) as writer:
        writer.write(rnd)
    assert run_cli("show", str(path), config.run_id, "--round", "0") == 0
    out = capsys.readouterr().out
    support = int((rnd.nodes[0].p > 0).sum())
    assert "top-N only" in out and f"({support} of {config.vocab_size} tokens > 0" in out


def test_export_then_import(recorded, tmp_path, capsys):
    path, results = recorded
    rid = results["greedy"].config.run_id
    f = tmp_path / "g.jsonl"
    assert run_cli("export", str(path), rid, "-o", str(f)) == 0
    db = tmp_path / "new.sqlite"
    assert run_cli("import", str(f), "--db", str(db)) == 0
    assert f"imported run {rid}" in capsys.readouterr().out
    with TraceStore(db) as s:
        assert s.get_run(rid).n_rounds == len(results["greedy"].rounds)
    assert run_cli("import", str(f), "--db", str(db)) == 1  # duplicate id
    assert "already in the store" in capsys.readouterr().err
    assert run_cli("import", str(f), "--db", str(db), "--run-id", "again") == 0


def test_errors_are_one_line_and_exit_1(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "specscope-trace", "version": 1}\n')
    assert run_cli("import", str(bad), "--db", str(tmp_path / "x.sqlite")) == 1
    err = capsys.readouterr().err
    assert "line 1" in err and "record" in err and err.count("\n") == 1
    notdb = tmp_path / "notes.txt"
    notdb.write_text("hello")
    assert run_cli("runs", str(notdb)) == 1
    assert "not an SQLite database" in capsys.readouterr().err
    assert run_cli("runs", str(tmp_path / "missing.sqlite")) == 1
    assert "no trace store" in capsys.readouterr().err
    db = tmp_path / "empty.sqlite"
    TraceStore(db).close()
    assert run_cli("show", str(db), "abc") == 1
    assert "no run 'abc'" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["runs", "show", "export", "import"])
def test_help_works(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        run_cli(command, "--help")
    assert exit_.value.code == 0
