"""Runs that end at a stop, stored and exported: the stops, each round's match and its tokens'
text survive the store and JSONL, the stored run checks clean, and a trace that does not say
which stops its run had is read with the stop rules named as not checked."""

from __future__ import annotations

import json

import pytest

from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.check.checker import check_report
from specscope.core.decode.stops import Stops
from specscope.storage import TraceStore, export_run, import_run, record
from tests.tiny_models import noisy_copy, tiny_lm

PROMPT = [1, 2, 3, 4, 5]


def piece(token: int) -> str:
    return "abcdefghijklmnopqrstuvwxyz"[token % 26] * (1 + token % 3)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    target = tiny_lm("llama", seed=0, init_range=0.3)
    draft = noisy_copy(target, 0.1)
    greedy = SamplingConfig(temperature=0)
    plain = SpeculativeDecoder(target, DraftModelProposer(draft), k=4, sampling=greedy).generate(PROMPT, 30).new_tokens
    absent = [t for t in range(64) if t not in plain]
    eos = (absent[0], absent[1])  # two EOS ids the output never reaches: the stop string ends it
    stops = Stops(strings=("".join(piece(t) for t in plain[8:11])[1:],), sequences=((absent[2], absent[3]),))
    decoder = SpeculativeDecoder(
        target, DraftModelProposer(draft), k=4, sampling=greedy, stops=stops, token_piece=piece, eos_token_id=eos
    )
    path = tmp_path_factory.mktemp("stops") / "runs.sqlite"
    with TraceStore(path) as store:
        result = record(store, decoder, PROMPT, 30, keep_rounds=True)
    assert result.stop_reason == "stop"
    return path, result


def test_a_stopped_run_is_stored_whole_and_checks_clean(stopped):
    path, result = stopped
    rid = result.config.run_id
    with TraceStore(path) as store:
        info = store.get_run(rid)
        assert info.stop_reason == "stop" and info.n_new_tokens == len(result.new_tokens)
        assert info.status == "completed"  # a stop ends a run as EOS does: nothing interrupted it
        config = info.config
        assert len(config.eos_token_ids) == 2 and (config.stop_strings, config.stop_ids, config.eos_token_ids) == (
            result.config.stop_strings,
            result.config.stop_ids,
            result.config.eos_token_ids,
        )
        rounds = store.load_rounds(rid, full=True)
        assert rounds[-1].stop == result.rounds[-1].stop and rounds[-1].pieces == result.rounds[-1].pieces
        report = check_report(config, rounds, end=info.end)
        assert report.findings == [] and "stop-leak" not in report.not_checked


def test_jsonl_round_trip_keeps_the_stops(stopped, tmp_path):
    path, result = stopped
    rid = result.config.run_id
    out = tmp_path / "run.jsonl"
    with TraceStore(path) as store:
        export_run(store, rid, out)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["stops"]["strings"] == list(result.config.stop_strings)
    assert lines[-2]["stop"] == result.rounds[-1].stop.to_dict() and lines[-1]["stop_reason"] == "stop"
    assert lines[-1]["status"] == "completed"
    with TraceStore(tmp_path / "b.sqlite") as dst:
        import_run(dst, out)
        back = dst.get_run(rid).config
        assert back.stop_ids == result.config.stop_ids and "stops" not in back.unrecorded
        assert dst.load_rounds(rid, full=True)[-1].stop == result.rounds[-1].stop
    # an older trace (no `stops` in its header, no `stop` in its rounds) still reads: unknown stays unknown
    old = [dict(line) for line in lines]
    del old[0]["stops"]
    for line in old[1:-1]:
        line.pop("stop", None)
        line.pop("pieces", None)
    older = tmp_path / "old.jsonl"
    older.write_text("".join(json.dumps(line) + "\n" for line in old))
    with TraceStore(tmp_path / "c.sqlite") as dst:
        import_run(dst, older)
        info = dst.get_run(rid)
        assert "stops" in info.config.unrecorded and info.config.stop_strings == ()
        report = check_report(info.config, dst.load_rounds(rid, full=True), end=info.end)
        assert report.findings == [] and "stop-leak" in report.not_checked
