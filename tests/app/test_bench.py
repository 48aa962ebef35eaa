"""The benchmark harness on tiny models: every method runs, greedy outputs are checked
identical, and a method that disagrees fails the bench."""

import pytest
import torch

from specscope.app.bench import Bench, BenchError, Sample, format_table
from specscope.core import SamplingConfig

from ..tiny_models import noisy_copy, tiny_lm


@pytest.fixture(scope="module")
def models():
    target = tiny_lm("llama", seed=0, init_range=0.3)
    return target, {"near": noisy_copy(target, 0.05), "far": noisy_copy(target, 0.5)}


PROMPTS = [[1, 2, 3, 4, 1, 2], [7, 7, 8, 9]]


def test_greedy_bench_runs_every_method_and_reports(models):
    target, drafts = models
    bench = Bench(target, drafts, PROMPTS, ks=[2, 3], max_new=12, reps=2, sampling=SamplingConfig(temperature=0),
                  eos=None, device=torch.device("cpu"))
    bench.run()
    rows = bench.rows()
    names = [r["method"] for r in rows]
    assert names[0] == "plain (KV cache)"
    assert "transformers assisted draft-near k=2" in names and "transformers lookup k=3" in names
    assert names[-1].endswith("traced+stored")
    for r in rows:
        assert r["tokens"] == 24 and r["tokens_per_s_median"] > 0
        assert r["speedup_min"] <= r["speedup_median"] <= r["speedup_max"]
    spec = next(r for r in rows if r["method"] == "specscope draft-near k=3")
    assert 1.0 <= spec["mean_accepted_length"] <= 4.0
    assert 0.0 <= spec["orchestration_share"] <= 1.0 and spec["predicted_speedup"] > 0
    assert "tracing_overhead_median" in rows[-1]
    assert format_table(rows).count("\n") == len(rows) + 1


def test_a_greedy_mismatch_fails_the_bench(models):
    target, drafts = models
    bench = Bench(target, {"near": drafts["near"]}, PROMPTS[:1], ks=[2], max_new=6, reps=1,
                  sampling=SamplingConfig(temperature=0), eos=None, device=torch.device("cpu"),
                  include_transformers=False, include_traced=False)
    broken = bench.methods[1]
    real = broken.run
    broken.run = lambda prompt: Sample([t + 1 for t in real(prompt).tokens], 0.01)
    with pytest.raises(BenchError, match="differs from plain decoding"):
        bench.run()


def test_sampled_bench_skips_identity_and_transformers_lookup(models):
    target, drafts = models
    bench = Bench(target, {"near": drafts["near"]}, PROMPTS, ks=[2], max_new=8, reps=1,
                  sampling=SamplingConfig(temperature=1.0), eos=None, device=torch.device("cpu"), include_traced=False)
    bench.run()
    names = [r["method"] for r in bench.rows()]
    assert "transformers lookup k=2" not in names and "transformers assisted draft-near k=2" in names
