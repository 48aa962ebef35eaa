"""The one row builder (storage.rows) and the writer's finish API."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
from sqlalchemy import text

from specscope.core.decode.run import RunHandle
from specscope.core.records import Round
from specscope.storage import PartialDistribution, RoundSummary, StoredFullDistribution, TraceStore, TraceWriter
from tests.storage.conftest import PROMPT
from tests.storage.helpers import synthetic_config, synthetic_rounds


def _rows(store: TraceStore, run_id: str) -> tuple[list, list]:
    with store.engine.connect() as conn:
        rounds = [
            tuple(r)[1:]
            for r in conn.execute(text("SELECT * FROM rounds WHERE run_id = :r ORDER BY round_index"), {"r": run_id})
        ]
        nodes = [
            tuple(r)[1:]
            for r in conn.execute(
                text("SELECT * FROM draft_nodes WHERE run_id = :r ORDER BY round_index, node_index"), {"r": run_id}
            )
        ]
    return rounds, nodes


@pytest.mark.parametrize("kind", ["sampled", "greedy", "lookup"])
@pytest.mark.parametrize("full", [True, False])
def test_rounds_read_back_are_stored_again_unchanged(recorded, tmp_path, kind, full):
    """Rounds loaded from a store (full vectors or top-N only) keep their stored top-N, facts
    and full-vector dtype, so writing them again yields the same rows, blobs included."""
    path, results = recorded
    rid = results[kind].config.run_id
    with TraceStore(path) as src:
        info = src.get_run(rid)
        rounds = src.load_rounds(rid, full=full)
        original = _rows(src, rid)
    with TraceStore(tmp_path / "copy.sqlite") as dst:
        with TraceWriter(
            dst, info.config, top_n=info.top_n, full_vectors=info.full_vectors and full, full_dtype=info.full_dtype
        ) as writer:
            for rnd in rounds:
                writer.write(rnd)
        copied = _rows(dst, rid)
    if full or not info.full_vectors:
        assert copied == original
    else:  # top-N only: everything but the full-vector blobs
        blobs = {"residual_full", "bonus_full", "p_full", "q_full"}
        with TraceStore(path) as src, src.engine.connect() as conn:
            rcols = list(conn.execute(text("SELECT * FROM rounds LIMIT 0")).keys())[1:]
            ncols = list(conn.execute(text("SELECT * FROM draft_nodes LIMIT 0")).keys())[1:]
        for rows_a, rows_b, cols in ((original[0], copied[0], rcols), (original[1], copied[1], ncols)):
            keep = [i for i, c in enumerate(cols) if c not in blobs]
            assert [[r[i] for i in keep] for r in rows_a] == [[r[i] for i in keep] for r in rows_b]


def test_stored_arrays_pickle_with_what_the_row_builder_needs(recorded):
    path, results = recorded
    with TraceStore(path) as s:
        full = s.load_round(results["sampled"].config.run_id, 1, full=True).nodes[0].p
        top = s.load_round(results["sampled"].config.run_id, 1, full=False).nodes[0].p
    assert isinstance(full, StoredFullDistribution) and isinstance(top, PartialDistribution)
    for a in (full, top):
        b = pickle.loads(pickle.dumps(a, protocol=5))
        assert type(b) is type(a) and b.stats == a.stats
        assert (b.top[0] == a.top[0]).all() and (b.top[1] == a.top[1]).all()
    assert pickle.loads(pickle.dumps(full)).full_dtype == "float32"
    assert (full * 1).top is None and (top * 1).top is None  # derived arrays are plain values again


def test_round_summary_has_rounds_fields_but_the_distributions():
    round_fields = {f.name for f in dataclasses.fields(Round)}
    summary_fields = {f.name for f in dataclasses.fields(RoundSummary)}
    assert summary_fields == round_fields - {"nodes", "bonus_p", "residual"} | {"drafted", "accepted", "draft_tokens"}


def test_finish_takes_explicit_arguments(store):
    config = synthetic_config()
    writer = TraceWriter(store, config)
    with pytest.raises(ValueError, match="status"):
        writer.finish("done")
    with pytest.raises(ValueError, match="stop_reason"):
        writer.finish("completed", stop_reason="tired")
    writer.write(synthetic_rounds(config, 1)[0])
    writer.finish("interrupted", stop_reason="cancelled", error="stopped by hand", wall_s=1.5)
    writer.finish("failed")  # idempotent: the first call closed the run
    info = store.get_run(config.run_id)
    assert (info.status, info.stop_reason, info.error, info.wall_s, info.n_rounds) == (
        "interrupted",
        "cancelled",
        "stopped by hand",
        1.5,
        1,
    )


@pytest.mark.parametrize(
    "exc, status, stop_reason, error",
    [
        (KeyboardInterrupt(), "interrupted", "cancelled", "KeyboardInterrupt"),
        (GeneratorExit(), "interrupted", "cancelled", "GeneratorExit"),
        (RuntimeError("boom"), "failed", None, "RuntimeError: boom"),
    ],
)
def test_fail_derives_the_outcome_from_the_exception(store, exc, status, stop_reason, error):
    config = synthetic_config()
    TraceWriter(store, config).fail(exc)
    info = store.get_run(config.run_id)
    assert (info.status, info.stop_reason, info.error) == (status, stop_reason, error)


@pytest.mark.parametrize("handle", [False, True])
def test_record_takes_a_generator_or_a_run_handle(store, make_decoder, handle):
    dec = make_decoder("greedy")
    config = dec.run_config(PROMPT, 12)
    rounds = dec.rounds(PROMPT, 12, config=config)
    with TraceWriter(store, config) as writer:
        result = writer.record(RunHandle(rounds, config) if handle else rounds)
    info = store.get_run(config.run_id)
    assert info.status == "completed" and info.stop_reason == result.stop_reason == "budget"
    assert info.wall_s == result.wall_s and info.n_rounds == result.summary.rounds
