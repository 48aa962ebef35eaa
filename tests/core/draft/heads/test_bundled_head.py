"""The EAGLE-3 head shipped for the bundled target (resources/models/eagle3-target, trained
by training/train_head.py): `eagle3` without a path loads it, it decodes the bundled target
exactly, its drafts are accepted (it was trained, not random), and its config records the
held-out accuracy per depth it was trained to."""

from __future__ import annotations

import json

import pytest

from specscope.core import SamplingConfig, SpeculativeDecoder
from specscope.core.decode.baseline import plain_generate
from specscope.core.draft.registry import build_proposer
from specscope.core.loading import bundled_head_path, bundled_path, example_prompts, load_model, load_tokenizer

GREEDY = SamplingConfig(temperature=0)


@pytest.fixture(scope="module")
def target():
    return load_model(bundled_path("target"), device="cpu", dtype="float32")


def test_the_bundled_head_records_its_held_out_accuracy_per_depth():
    record = json.loads((bundled_head_path("eagle3-target") / "config.json").read_text())["specscope"]
    accuracy = record["accuracy_by_depth"]
    assert len(accuracy) == record["unroll_depth"] == 4
    assert all(0.3 < a < 1 for a in accuracy) and accuracy == sorted(accuracy, reverse=True)
    assert record["target"] == "specscope/target" and record["heldout"]["greedy"]["accepted_length"] > 2


def test_the_bundled_head_decodes_the_bundled_target_exactly_and_is_accepted(target):
    tokenizer = load_tokenizer(bundled_path("target"))
    prompt = tokenizer(example_prompts()[2].text, add_special_tokens=False)["input_ids"]
    want = plain_generate(target, prompt, 40, GREEDY, None).new_tokens
    for k in (1, 4):
        result = SpeculativeDecoder(target, build_proposer("eagle3"), k=k, sampling=GREEDY).generate(prompt, 40)
        assert result.new_tokens == want, k
    drafted = [r for r in result.rounds if r.nodes]
    accepted = sum(1 for r in drafted for n in r.nodes if n.status == "accepted")
    assert accepted / len(drafted) > 0.5  # a random head is almost never accepted on a 4,096-token vocabulary
