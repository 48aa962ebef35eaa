"""Tree rows in the bench: one row per tree spec (k does not apply), greedy outputs checked
identical to plain decoding, accepted length and target passes reported."""

import argparse

import pytest
import torch

from specscope.app.bench import Bench, format_table
from specscope.app.bench.command import UsageError, tree_specs
from specscope.core import SamplingConfig
from tests.tiny_models import noisy_copy, tiny_lm

PROMPTS = [[1, 2, 3, 4, 1, 2], [7, 7, 8, 9]]


@pytest.fixture(scope="module")
def models():
    target = tiny_lm("llama", seed=0, init_range=0.3)
    return target, {"near": noisy_copy(target, 0.05)}


def test_tree_rows(models):
    target, drafts = models
    args = argparse.Namespace(tree=["3,2,1", "dynamic:nodes=8,depth=3,topk=2"], children="topk")
    specs = ["draft:near"] + tree_specs(args, drafts)
    for mode in (SamplingConfig(temperature=0), SamplingConfig(temperature=1.0)):
        bench = Bench(
            target,
            drafts,
            PROMPTS,
            ks=[2, 4],
            max_new=12,
            reps=1,
            sampling=mode,
            eos=None,
            device=torch.device("cpu"),
            include_transformers=False,
            include_traced=False,
            specs=specs,
        )
        bench.run()  # greedy: every method's output is checked equal to plain decoding
        rows = {r["method"]: r for r in bench.rows()}
        trees = [name for name in rows if "tree=" in name]
        assert trees == [
            "specscope draft-near tree=3,2,1 topk",
            "specscope draft-near tree=dynamic:nodes=8,depth=3,topk=2 topk",
        ]
        chain = rows["specscope draft-near k=4"]
        for name in trees:
            row = rows[name]
            assert row["k"] is None and row["tokens"] == 24
            assert 1.0 <= row["mean_accepted_length"] <= 4.0 and row["predicted_speedup"] > 0
            method = next(m for m in bench.methods if m.name == name)
            for sample in (s for rep in method.samples for s in rep):  # one target forward per round
                assert sample.target_forwards == len(sample.rounds) > 0
        assert chain["mean_accepted_length"] >= 1.0
        assert format_table(bench.rows()).count("\n") == len(rows) + 1


def test_tree_flag_errors():
    with pytest.raises(UsageError, match="--tree"):
        tree_specs(argparse.Namespace(tree=["3,x"], children="topk"), {"near": None})
    with pytest.raises(UsageError, match="--children topk"):
        tree_specs(argparse.Namespace(tree=["dynamic:nodes=8,depth=3,topk=2"], children="sampled"), {"near": None})
