"""The writer's hot path: top-N selection, full-vector blobs and the SQLite tuple insert."""

from __future__ import annotations

import pickle
import zlib

import numpy as np
import pytest
from sqlalchemy import select

from specscope.core.sampling.partial import VectorStats, vector_stats
from specscope.storage import TraceStore
from specscope.storage.codec import (
    VectorPolicy,
    decode_full,
    decode_top_stats,
    encode_full,
    encode_top,
    encode_top_arrays,
    full_raw,
    is_partial,
    rebuild,
    top_entries,
    top_rows,
)
from specscope.storage.schema import nodes_table, rounds_table
from specscope.storage.writer.api import TraceWriter
from specscope.storage.writer.sink import RunSink
from tests.storage.helpers import synthetic_config, synthetic_rounds


def reference_top(row: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The definition: positive entries by descending probability, ties by ascending id."""
    ids = sorted((i for i in range(len(row)) if row[i] > 0), key=lambda i: (-row[i], i))[:n]
    return np.array(ids, dtype=np.int64), row[ids]


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("vocab", [7, 50, 97, 160, 1000, 4099])
@pytest.mark.parametrize("n", [1, 5, 20, 40])
@pytest.mark.parametrize("kind", ["smooth", "tied", "sparse", "one-hot", "float32", "uniform"])
def test_top_rows_matches_the_definition(vocab, n, kind):
    rng = np.random.default_rng(vocab * 100 + n)
    m = 9
    logits = rng.standard_normal((m, vocab)) * 3
    if kind == "tied":  # many exact ties, also at the n-th place
        logits = np.round(logits, 1)
    dists = softmax(logits)
    if kind == "sparse":  # fewer positive entries than n in some rows
        dists[dists < np.quantile(dists, 0.995, axis=1, keepdims=True)] = 0.0
    elif kind == "one-hot":
        dists = np.zeros((m, vocab))
        dists[np.arange(m), rng.integers(0, vocab, m)] = 1.0
    elif kind == "float32":  # the bundled models' p and q: ties are common
        dists = softmax(logits).astype(np.float32).astype(np.float64)
    elif kind == "uniform":
        dists = np.full((m, vocab), 1.0 / vocab)
    got = top_rows(dists, n)
    assert len(got) == m
    for row, (ids, probs) in zip(dists, got):
        want_ids, want_probs = reference_top(row, n)
        assert ids.dtype == np.int64
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_array_equal(probs, want_probs)


def test_top_rows_with_a_tie_across_the_cut_takes_the_lower_ids():
    row = np.zeros(400)
    row[[5, 9, 300, 301, 399]] = [0.4, 0.2, 0.2, 0.1, 0.1]
    ids, probs = top_rows(row[None, :], 2)[0]
    assert ids.tolist() == [5, 9] and probs.tolist() == [0.4, 0.2]
    ids, _ = top_rows(row[None, :], 4)[0]
    assert ids.tolist() == [5, 9, 300, 301]


@pytest.mark.parametrize("full", [False, True])
def test_sqlite_tuple_insert_stores_what_the_core_insert_stores(tmp_path, full):
    config = synthetic_config(vocab=300)
    rounds = synthetic_rounds(config, 12, seed=3)
    policy = VectorPolicy.for_vocab(config.vocab_size, 8, full)
    stored = {}
    for fast in (True, False):
        with TraceStore(tmp_path / f"{fast}.sqlite") as store:
            TraceWriter(store, config, top_n=8, full_vectors=full).finish("completed")
            sink = RunSink(store.engine, config.run_id, policy, 0.0)
            assert sink._fast is not None  # SQLite takes the tuple path
            if not fast:
                sink._fast = None
            sink.commit(rounds[:5])
            sink.commit(rounds[5:])
            with store.engine.connect() as conn:
                stored[fast] = (
                    [tuple(r) for r in conn.execute(select(rounds_table).order_by(rounds_table.c.round_index))],
                    [
                        tuple(r)
                        for r in conn.execute(
                            select(nodes_table).order_by(nodes_table.c.round_index, nodes_table.c.node_index)
                        )
                    ],
                )
    assert len(stored[True][0]) == 12 and stored[True][1]
    assert stored[True] == stored[False]


def test_a_top_k_run_keeps_top_k_plus_one_entries(tmp_path):
    """So that a top-N trace still shows whether q and p were filtered to top-k."""
    import dataclasses

    from specscope.core.sampling.reference import SamplingConfig
    from specscope.storage.codec import TOP_K_COVER_MAX, covering_top_n

    assert covering_top_n(20, 0) == 20 and covering_top_n(20, 8) == 20
    assert covering_top_n(20, 20) == 21 and covering_top_n(20, 50) == 51
    assert covering_top_n(20, TOP_K_COVER_MAX) == 20  # a very wide filter: not worth the bytes
    config = dataclasses.replace(synthetic_config(vocab=300), sampling=SamplingConfig(temperature=1.0, top_k=30))
    with TraceStore(tmp_path / "t.sqlite") as store:
        writer = TraceWriter(store, config, top_n=20, full_vectors=False)
        writer.finish("completed")
        assert writer.policy.top_n == 31
        assert [r.top_n for r in store.list_runs()] == [31]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("vocab", [1, 7, 64, 4099])
def test_full_vector_blobs_give_back_the_stored_values(dtype, vocab):
    rng = np.random.default_rng(vocab)
    dense = rng.dirichlet(np.ones(vocab))
    one_hot = np.zeros(vocab)
    one_hot[vocab // 2] = 1.0
    residual = np.maximum(dense - rng.dirichlet(np.ones(vocab)), 0.0)  # about half zero
    stored = np.dtype("<f4" if dtype == "float32" else "<f8")
    for dist in (dense, one_hot, residual, np.zeros(vocab)):
        blob = encode_full(dist, dtype)
        sparse = 2 * np.count_nonzero(dist) <= vocab
        assert blob[:1] == (b"S" if sparse else b"R")
        np.testing.assert_array_equal(decode_full(blob), dist.astype(stored).astype(np.float64))
        assert full_raw(blob) == (dtype, dist.astype(stored).tobytes())
    # the policy's vectorised encoder writes the same blobs
    _, fulls = VectorPolicy.for_vocab(vocab, 4, True, dtype).encode([dense, one_hot, residual])
    assert fulls == [encode_full(d, dtype) for d in (dense, one_hot, residual)]


def test_zlib_full_vector_blobs_of_older_stores_still_read():
    dist = np.random.default_rng(0).dirichlet(np.ones(100))
    blob = b"F4" + zlib.compress(dist.astype("<f4").tobytes(), 1)
    np.testing.assert_array_equal(decode_full(blob), dist.astype("<f4").astype(np.float64))
    with pytest.raises(ValueError):
        decode_full(b"X4" + bytes(8))


def test_top_n_blobs_keep_the_whole_vector_stats():
    rng = np.random.default_rng(1)
    dense = rng.dirichlet(np.ones(300))
    filtered = np.where(dense >= np.sort(dense)[-10], dense, 0.0)
    filtered /= filtered.sum()
    tops, _ = VectorPolicy.for_vocab(300, 5, False).encode([dense, filtered])
    for dist, blob in zip((dense, filtered), tops):
        assert blob == encode_top(dist, 5)
        ids, probs, stats = decode_top_stats(blob)
        assert stats == VectorStats.of(dist)
        assert stats.support == np.count_nonzero(dist) and stats.minimum == dist.min()
        rebuilt = rebuild(blob, None, 300)
        assert rebuilt.stats == stats and vector_stats(rebuilt) == stats
        assert rebuilt.missing_mass == pytest.approx(stats.total - probs.sum(), abs=1e-15)
        assert pickle.loads(pickle.dumps(rebuilt)).stats == stats
        np.testing.assert_array_equal(ids, top_entries(dist, 5)[0])
    # a b"T" blob (older stores, JSONL lines without the stats) has none
    legacy = encode_top_arrays(*top_entries(dense, 5))
    assert legacy[:1] == b"T" and decode_top_stats(legacy)[2] is None
    assert vector_stats(rebuild(legacy, None, 300)) is None
    # a full array's stats are computed from it
    assert vector_stats(dense) == VectorStats.of(dense)


def test_full_vectors_read_back_with_the_exact_stats_float32_storage_loses():
    vocab = 50
    dist = np.full(vocab, 1e-50)  # below float32's smallest subnormal: stored as 0
    dist[:5] = [0.4, 0.3, 0.15, 0.1, 0.05]
    dist /= dist.sum()
    tops, fulls = VectorPolicy.for_vocab(vocab, 5, True, "float32").encode([dist])
    loaded = rebuild(tops[0], fulls[0], vocab)
    assert not is_partial(loaded) and np.count_nonzero(loaded) == 5  # float32 lost the tail
    exact = VectorStats.of(dist)
    assert exact.support == vocab and vector_stats(loaded) == exact
    # derived arrays are not the stored vector: their stats come from their values
    assert (loaded * 1.0).stats is None and vector_stats(loaded[:10]) == VectorStats.of(np.asarray(loaded)[:10])
    assert pickle.loads(pickle.dumps(loaded)).stats == exact
    # a b"T" blob (no stats) gives a plain array
    legacy = encode_top_arrays(*top_entries(dist, 5))
    assert type(rebuild(legacy, fulls[0], vocab)) is np.ndarray
