"""The head fault of the zoo (issue 30): `head-feature-shift` feeds the draft head the target's
feature of the position before the one it belongs to. The verifier is untouched, so the
output stays exactly the clean run's; only acceptance falls. No checker rule sees it (every
round is a correct round of a poor draft); the calibration model says where it shows (acceptance by depth far
below the accuracy the head's training recorded: tests/app/gui/model/test_calibration.py)."""

from __future__ import annotations

import pytest

from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.check.checker import check_report
from specscope.core.draft.registry import build_proposer
from specscope.core.faults.zoo import FAULTS, faulty_decoder
from specscope.core.loading import bundled_path, example_prompts, load_model, load_tokenizer
from tests.tiny_models import tiny_lm

GREEDY = SamplingConfig(temperature=0)
BUDGET = 48


def _depth1(result) -> float:
    nodes = [n for r in result.rounds for n in r.nodes if n.depth == 1 and n.status != "unvisited"]
    return sum(n.status == "accepted" for n in nodes) / len(nodes)


@pytest.fixture(scope="module")
def runs():
    target = load_model(bundled_path("target"), device="cpu", dtype="float32")
    tokenizer = load_tokenizer(bundled_path("target"))
    prompt = tokenizer(example_prompts()[2].text, add_special_tokens=False)["input_ids"]
    clean = SpeculativeDecoder(target, build_proposer("eagle3"), k=4, sampling=GREEDY).generate(prompt, BUDGET)
    decoder = faulty_decoder("head-feature-shift", target, build_proposer("eagle3"), k=4, sampling=GREEDY)
    faulty = decoder.generate(prompt, BUDGET)
    return clean, faulty, decoder


def test_the_fault_needs_a_head():
    assert FAULTS["head-feature-shift"].needs == "head"
    with pytest.raises(ValueError, match="needs a draft-head proposer"):
        faulty_decoder("head-feature-shift", tiny_lm(), DraftModelProposer(tiny_lm(seed=1)), k=2, sampling=GREEDY)


def test_the_output_stays_exact_but_acceptance_at_depth_1_collapses(runs):
    clean, faulty, decoder = runs
    assert faulty.new_tokens == clean.new_tokens
    assert faulty.config.fault == "head-feature-shift" and decoder.fault_rounds
    assert _depth1(faulty) < 0.6 * _depth1(clean), (_depth1(faulty), _depth1(clean))  # measured 0.40 against 0.82
    assert len(faulty.rounds) > len(clean.rounds)  # the wasted work: more target forwards for the same tokens


def test_no_checker_rule_can_see_it_from_the_record(runs):
    _, faulty, _ = runs
    assert check_report(faulty.config, faulty.rounds).findings == []


# --------------------------------------------------------------------------- head confidence


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "medusa", "mtp"])
def test_every_head_records_its_confidence_greedy_and_sampled(kind, tmp_path):
    """At T=1 without filters q is the head's own softmax, so the confidence equals q(token)
    (EAGLE-3 with a reduced vocabulary too: its q is placed at the target ids); greedy, q is a
    point mass and the confidence is still the head's softmax entry, below 1."""
    from tests.core.head_checkpoints import write_eagle, write_eagle3, write_medusa, write_mtp

    target = tiny_lm("llama", seed=0, init_range=0.3, layers=4, vocab=64)
    write = {
        "eagle": write_eagle,
        "eagle3": lambda f, t: write_eagle3(f, t, draft_vocab=40),
        "medusa": write_medusa,
        "mtp": write_mtp,
    }[kind]
    write(tmp_path, target)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    sampled = SpeculativeDecoder(
        target, build_proposer(f"{kind}:{tmp_path}"), k=3, sampling=SamplingConfig(temperature=1.0)
    ).generate(prompt, 16, seed=1)
    nodes = [n for r in sampled.rounds for n in r.nodes]
    assert nodes and all(n.confidence == pytest.approx(n.q_token, rel=1e-4, abs=1e-6) for n in nodes)
    greedy = SpeculativeDecoder(target, build_proposer(f"{kind}:{tmp_path}"), k=3, sampling=GREEDY).generate(prompt, 16)
    nodes = [n for r in greedy.rounds for n in r.nodes]
    assert nodes and all(n.q_token is None and 0 < n.confidence <= 1 for n in nodes)
    assert any(n.confidence < 0.999 for n in nodes)  # a softmax entry, not the point mass


@pytest.mark.parametrize("kind", ["eagle3", "medusa", "mtp"])
@pytest.mark.parametrize("tree", ["2,2,children=sampled", "dynamic:nodes=6,depth=3,topk=2"])
def test_a_head_tree_records_each_nodes_confidence(kind, tree, tmp_path):
    """A tree node's confidence is the head's softmax entry for its token from its parent's
    output: at T=1 with sampled children, exactly the q row it was drawn from; greedy, a
    softmax entry below 1 (EAGLE-3 through its reduced vocabulary; Medusa by depth)."""
    from tests.core.head_checkpoints import write_eagle3, write_medusa, write_mtp

    target = tiny_lm("llama", seed=0, init_range=0.3, layers=4, vocab=64)
    write = {"eagle3": lambda f, t: write_eagle3(f, t, draft_vocab=40), "medusa": write_medusa, "mtp": write_mtp}[kind]
    write(tmp_path, target)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    spec = f"{kind}:{tmp_path},tree={tree}"
    if "sampled" in tree:
        sampled = SpeculativeDecoder(
            target, build_proposer(spec), k=3, sampling=SamplingConfig(temperature=1.0)
        ).generate(prompt, 16, seed=1)
        nodes = [n for r in sampled.rounds for n in r.nodes]
        assert nodes and all(n.confidence == pytest.approx(n.q_token, rel=1e-4, abs=1e-6) for n in nodes)
    greedy = SpeculativeDecoder(target, build_proposer(spec), k=3, sampling=GREEDY).generate(prompt, 16)
    nodes = [n for r in greedy.rounds for n in r.nodes]
    assert nodes and all(n.confidence is not None and 0 < n.confidence <= 1 for n in nodes)
    assert any(n.confidence < 0.999 for n in nodes)
