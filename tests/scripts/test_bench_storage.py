"""scripts/bench_storage.py end to end on tiny random models (seconds), so the benchmark that
BENCHMARKS.md quotes keeps running."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("specscope_bench_storage", REPO / "scripts" / "bench_storage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_storage_reports_every_measure(bench, capsys):
    assert (
        bench.main(["--repeats", "1", "--writer-rounds", "30", "--max-new-tokens", "24", "--vocab", "300", "--json"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["models"]["vocab"] == 300 and out["rounds_per_run"] >= 1
    writer = out["overhead"]["writers"]["thread"]
    assert writer["traced_s"] > 0 and len(writer["traced_all_s"]) == 1
    top, full = out["writer_top_n_only"], out["writer_full_vectors"]
    assert top["rounds"] == full["rounds"] == 30
    assert full["blob_bytes_per_round"] > top["blob_bytes_per_round"] > 0
    packed = out["compressibility"]
    assert packed["vectors"] > 0 and packed["dtype"] == "float32"
    for name in ("zlib-1", "byte-shuffle + zlib-1", "byte-shuffle + lzma-6"):
        assert 0 < packed[name]["ratio"] < 1.5 and packed[name]["cpu_us_per_vector"] >= 0


def test_compressibility_counts_only_dense_vectors(bench):
    import numpy as np

    rng = np.random.default_rng(0)
    dense = rng.dirichlet(np.ones(64))
    one_hot = np.zeros(64)
    one_hot[3] = 1.0
    # only the fields compressibility() reads: each round's bonus_p and its nodes' p and q
    rounds = [SimpleNamespace(bonus_p=None, nodes=(SimpleNamespace(p=dense, q=one_hot),))]
    packed = bench.compressibility(rounds)
    assert packed["vectors"] == 1  # the one-hot q is sparse: the writer stores it as a bitmap, not raw
    raw = dense.astype("<f4").tobytes()
    assert packed["zlib-1"]["ratio"] == len(__import__("zlib").compress(raw, 1)) / len(raw)
    only_sparse = bench.compressibility([SimpleNamespace(bonus_p=one_hot, nodes=())])
    assert only_sparse["vectors"] == 0 and only_sparse["zlib-1"]["ratio"] is None
