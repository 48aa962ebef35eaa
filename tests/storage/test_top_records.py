"""Rounds whose records keep top-N (the decoder's vectors="top", every vocabulary above
4096) go into a store and through JSONL unchanged: same top-N, facts and drawn entries, and
the checker reads them back with no finding."""

from __future__ import annotations

import numpy as np
import pytest

from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.check.checker import check_report
from specscope.core.sampling.dists import TopDistribution
from specscope.storage import TraceStore
from specscope.storage.jsonl.transfer import export_run, import_run
from specscope.storage.writer.api import record
from tests.tiny_models import noisy_copy, tiny_lm


@pytest.fixture(scope="module")
def decoder():
    target = tiny_lm("llama", vocab=300, seed=0, init_range=0.3)
    return SpeculativeDecoder(
        target,
        DraftModelProposer(noisy_copy(target, 0.3)),
        k=3,
        vectors="top",
        sampling=SamplingConfig(temperature=0.9, top_k=30),
        seed=3,
    )


def same_dist(stored, recorded) -> None:
    assert stored is not None and isinstance(recorded, TopDistribution)
    ids, probs = recorded.top
    stored_top = getattr(stored, "top", None)
    assert stored_top is not None and np.array_equal(stored_top[0], ids) and np.array_equal(stored_top[1], probs)
    assert stored.stats == recorded.stats


def test_top_records_round_trip_through_a_store_and_jsonl(tmp_path, decoder):
    store = TraceStore(tmp_path / "t.sqlite")
    result = decoder.generate([1, 2, 3, 4], 40)
    live = result.rounds
    run_id = record(store, decoder, [1, 2, 3, 4], 40).config.run_id
    stored = store.load_rounds(run_id)
    assert [r.tokens for r in stored] == [r.tokens for r in live]
    for a, b in zip(stored, live):
        for x, y in zip(a.nodes, b.nodes):
            same_dist(x.p, y.p)
            same_dist(x.q, y.q)
            assert x.p_token == y.p_token and x.q_token == y.q_token
        if b.residual is not None:
            same_dist(a.residual, b.residual)
        if b.bonus_p is not None:
            same_dist(a.bonus_p, b.bonus_p)
    assert check_report(store.run_config(run_id), stored).findings == []
    path = tmp_path / "run.jsonl"
    export_run(store, run_id, path)
    other = TraceStore(tmp_path / "u.sqlite")
    again = other.load_rounds(import_run(other, path))
    assert [r.tokens for r in again] == [r.tokens for r in live]
    for a, b in zip(again, live):
        for x, y in zip(a.nodes, b.nodes):
            same_dist(x.p, y.p)
