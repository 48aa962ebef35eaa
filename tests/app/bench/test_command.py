"""The benchmark harness on tiny models: every method runs, greedy outputs are checked
identical, and a method that disagrees fails the bench."""

import pytest
import torch

from specscope.app.bench import Bench, BenchError, Sample, format_table
from specscope.core import SamplingConfig
from tests.tiny_models import noisy_copy, tiny_lm


@pytest.fixture(scope="module")
def models():
    target = tiny_lm("llama", seed=0, init_range=0.3)
    return target, {"near": noisy_copy(target, 0.05), "far": noisy_copy(target, 0.5)}


PROMPTS = [[1, 2, 3, 4, 1, 2], [7, 7, 8, 9]]


def test_greedy_bench_runs_every_method_and_reports(models):
    target, drafts = models
    bench = Bench(
        target,
        drafts,
        PROMPTS,
        ks=[2, 3],
        max_new=12,
        reps=2,
        sampling=SamplingConfig(temperature=0),
        eos=None,
        device=torch.device("cpu"),
    )
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
    hf = next(r for r in rows if r["method"] == "transformers assisted draft-near k=3 traced+stored")
    assert hf["tokens"] == 24 and "tracing_overhead_median" in hf  # its twin: the same generate() untraced
    assert format_table(rows).count("\n") == len(rows) + 1


def test_a_greedy_mismatch_fails_the_bench(models):
    target, drafts = models
    bench = Bench(
        target,
        {"near": drafts["near"]},
        PROMPTS[:1],
        ks=[2],
        max_new=6,
        reps=1,
        sampling=SamplingConfig(temperature=0),
        eos=None,
        device=torch.device("cpu"),
        include_transformers=False,
        include_traced=False,
    )
    broken = bench.methods[1]
    real = broken.run
    broken.run = lambda prompt: Sample([t + 1 for t in real(prompt).tokens], 0.01)
    with pytest.raises(BenchError, match="differs from plain decoding"):
        bench.run()


def test_sampled_bench_skips_identity_and_transformers_lookup(models):
    target, drafts = models
    bench = Bench(
        target,
        {"near": drafts["near"]},
        PROMPTS,
        ks=[2],
        max_new=8,
        reps=1,
        sampling=SamplingConfig(temperature=1.0),
        eos=None,
        device=torch.device("cpu"),
        include_traced=False,
    )
    bench.run()
    names = [r["method"] for r in bench.rows()]
    assert "transformers lookup k=2" not in names and "transformers assisted draft-near k=2" in names


def test_lookup_prediction_uses_measured_drafted_count_and_search_time(models):
    """Prompt lookup drafts nothing when it finds no match: the prediction must count those
    rounds (in E and in n) and charge the n-gram search as the proposal cost c."""
    target, drafts = models
    prompts = [[5, 9, 13, 17, 21, 25], [1, 2, 3, 1, 2, 3, 1, 2]]  # the first has no repeat at all
    bench = Bench(
        target,
        {"near": drafts["near"]},
        prompts,
        ks=[3],
        max_new=12,
        reps=1,
        sampling=SamplingConfig(temperature=0),
        eos=None,
        device=torch.device("cpu"),
        include_transformers=False,
        include_traced=False,
    )
    bench.run()
    rows = {r["method"]: r for r in bench.rows()}
    lookup = rows["specscope lookup k=3"]
    method = next(m for m in bench.methods if m.name == "specscope lookup k=3")
    rounds = [r for rep in method.samples for s in rep for r in s.rounds]
    drafted = [r.drafted for r in rounds]
    assert 0 in drafted  # some rounds found no match
    assert lookup["mean_drafted_per_round"] == pytest.approx(sum(drafted) / len(rounds))
    assert lookup["mean_drafted_per_round"] < 3
    assert lookup["expected_tokens_per_round"] == pytest.approx(1 + sum(r.accepted for r in rounds) / len(rounds))
    assert lookup["expected_tokens_per_round"] == pytest.approx(lookup["mean_accepted_length"])
    assert lookup["proposer_cost_per_round"] > 0  # the search costs time although no model runs
    assert lookup["cost_c"] * lookup["mean_drafted_per_round"] == pytest.approx(lookup["proposer_cost_per_round"])
    assert lookup["predicted_speedup"] == pytest.approx(
        lookup["expected_tokens_per_round"] / (lookup["proposer_cost_per_round"] + lookup["cost_v"])
    )
    # A draft model drafts k per round (budget permitting) and is charged its forwards.
    draft = rows["specscope draft-near k=3"]
    assert 2.5 < draft["mean_drafted_per_round"] <= 3
    assert draft["predicted_speedup"] == pytest.approx(
        draft["expected_tokens_per_round"] / (draft["mean_drafted_per_round"] * draft["cost_c"] + draft["cost_v"])
    )


def test_the_default_rows_run_the_bundled_head_only_on_a_target_it_fits(models):
    from specscope.app.bench import default_specs
    from specscope.core.loading import bundled_path, load_model

    bundled = load_model(bundled_path("target"), device="cpu", dtype="float32")
    assert default_specs(["small"], target=bundled) == ["draft:small", "lookup", "eagle3"]
    assert default_specs(["small"], target=models[0]) == ["draft:small", "lookup"]  # another hidden size and vocabulary
    assert default_specs(["small"], ["lookup:max_ngram=4"], target=bundled) == ["draft:small", "lookup:max_ngram=4"]


def test_a_heads_propose_calls_are_its_draft_time_not_orchestration(models, tmp_path):
    from tests.core.head_checkpoints import write_eagle3

    target, _ = models
    write_eagle3(tmp_path / "head", target, draft_vocab=target.config.vocab_size - 3, layers=(0, 1, 1))  # 2 layers
    bench = Bench(
        target,
        {},
        PROMPTS,
        ks=[3],
        max_new=8,
        reps=1,
        sampling=SamplingConfig(temperature=0),
        eos=None,
        device=torch.device("cpu"),
        include_transformers=False,
        specs=[f"eagle3:{tmp_path / 'head'}"],
    )
    bench.run()
    head = bench.methods[1]
    sample = head.samples[0][0]
    assert sample.draft_forwards == sum(r.drafted for r in sample.rounds) > 0
    assert sample.draft_forward_s == pytest.approx(sum(r.draft_s for r in sample.rounds)) and sample.draft_forward_s > 0
    row = next(r for r in bench.rows() if r["method"] == head.name)
    assert row["draft_forward_share"] > 0 and row["cost_c"] > 0


def test_k_auto_rows_choose_each_rounds_length_and_equal_plain_decoding(models):
    import argparse

    from specscope.app.bench.command import UsageError, settings_of

    target, drafts = models
    args = argparse.Namespace(quick=False, k="2,Auto", max_new=8, reps=None, prompts=None, kinds=None)
    assert settings_of(args)["ks"] == [2, "auto"]
    with pytest.raises(UsageError, match="integers or auto"):
        settings_of(argparse.Namespace(**{**vars(args), "k": "2,often"}))
    bench = Bench(
        target,
        {"near": drafts["near"]},
        PROMPTS,
        ks=[2, "auto"],
        max_new=12,
        reps=1,
        sampling=SamplingConfig(temperature=0),
        eos=None,
        device=torch.device("cpu"),
    )
    names = [m.name for m in bench.methods]
    # the traced twin at a fixed k: auto's lengths follow the timings, so its twin would not decode alike
    twins = ("specscope draft-near", "transformers assisted draft-near")
    assert names[-2:] == [f"{twin} k=2 traced+stored" for twin in twins]
    bench.methods = [m for m in bench.methods if m.family != "traced" and "traced" not in m.name]
    names = [m.name for m in bench.methods]
    # transformers' rows take a fixed k: none for auto
    assert "specscope draft-near k=auto" in names and "transformers assisted draft-near k=2" in names
    assert not any(n.startswith("transformers") and n.endswith("k=auto") for n in names)
    bench.run()  # greedy: a row whose output differs from plain decoding fails the bench
    auto = next(r for r in bench.rows() if r["method"] == "specscope draft-near k=auto")
    drafted = {c.drafted for m in bench.methods if m.k == "auto" for rep in m.samples for s in rep for c in s.rounds}
    assert auto["tokens"] == 24 and len(auto["acceptance_by_position"]) == max(drafted)
