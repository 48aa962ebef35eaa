"""The checker on tree rounds: clean tree runs have no findings, each tree fault is flagged
at the first round it fired, and tampered tree records are caught."""

import dataclasses

import pytest

from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.check.checker import check_report, first_bad_round
from specscope.core.faults.zoo import FAULTS, faulty_decoder
from tests.tiny_models import noisy_copy, tiny_lm

PROMPTS = [[1, 2, 3, 4], [9, 8, 7], [5, 17, 5, 17, 5], [40]]
SETTINGS = [SamplingConfig(temperature=0), SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.8, top_k=8)]
TREES = [("3,2,1", "topk"), ("3,2,1", "sampled"), ("2,2,2", "distinct"), ("dynamic:nodes=10,depth=4,topk=3", "topk")]


@pytest.fixture(scope="module")
def models():
    target = tiny_lm("llama", vocab=64, seed=0, init_range=0.3)
    return target, noisy_copy(target, 0.3)


def runs(models, make, eos=None, max_new=24):
    target, draft = models
    for tree, children in TREES:
        for cfg in SETTINGS:
            dec = make(target, DraftModelProposer(draft, tree=tree, children=children), cfg)
            for seed, prompt in enumerate(PROMPTS):
                yield dec, dec.generate(prompt, max_new, seed=seed)


def test_clean_tree_runs_have_no_findings(models):
    count = 0
    for _dec, out in runs(models, lambda t, p, cfg: SpeculativeDecoder(t, p, sampling=cfg, eos_token_id=11)):
        report = check_report(out.config, out.rounds)
        assert report.findings == [], [str(f) for f in report.findings[:3]]
        assert not report.not_checked
        count += 1
    assert count == len(TREES) * len(SETTINGS) * len(PROMPTS)


TREE_FAULTS = [name for name, f in FAULTS.items() if f.needs == "tree"]


def test_tree_faults_are_in_the_one_list_and_need_a_tree():
    assert set(TREE_FAULTS) == {
        "tree-stale-residual",
        "tree-sibling-mask",
        "tree-wrong-branch-kv",
        "tree-positions-by-index",
    }


@pytest.mark.parametrize("fault", TREE_FAULTS)
def test_every_fired_tree_fault_is_flagged_at_its_first_round(models, fault):
    fired = 0
    for dec, out in runs(models, lambda t, p, cfg: faulty_decoder(fault, t, p, sampling=cfg)):
        findings = check_report(out.config, out.rounds).findings
        if not dec.fault_rounds:
            assert findings == [], f"{fault} did not fire but the checker reported {findings[0]}"
            continue
        fired += 1
        assert first_bad_round(findings) == dec.fault_rounds[0], (
            fault,
            dec.fault_rounds,
            [str(f) for f in findings[:2]],
        )
    assert fired >= 5, f"{fault} fired in only {fired} runs"


def test_layout_faults_change_the_greedy_output(models):
    """Not just bookkeeping: a wrong mask, positions or kept branch changes what the target computes."""
    target, draft = models
    for fault in ("tree-sibling-mask", "tree-positions-by-index", "tree-wrong-branch-kv"):
        changed = 0
        for prompt in PROMPTS:
            good = SpeculativeDecoder(target, DraftModelProposer(draft, tree="3,2,1"), sampling=SETTINGS[0])
            bad = faulty_decoder(fault, target, DraftModelProposer(draft, tree="3,2,1"), sampling=SETTINGS[0])
            changed += good.generate(prompt, 24).new_tokens != bad.generate(prompt, 24).new_tokens
        assert changed > 0, fault


def _tamper(rnd, **node_changes):
    ((index, changes),) = node_changes.items()
    nodes = list(rnd.nodes)
    i = int(index.removeprefix("n"))
    nodes[i] = dataclasses.replace(nodes[i], **changes)
    return dataclasses.replace(rnd, nodes=tuple(nodes))


def test_tampered_tree_records_are_flagged(models):
    target, draft = models
    dec = SpeculativeDecoder(target, DraftModelProposer(draft, tree="3,2,1", children="sampled"), sampling=SETTINGS[1])
    out = dec.generate(PROMPTS[0], 30, seed=1)
    # a round where a first child was rejected and a later sibling tried
    at = next(
        i
        for i, r in enumerate(out.rounds)
        if any(u.parent == -1 for u in r.tree.updates) and len(r.tree.tried[0][1]) > 1
    )
    rnd = out.rounds[at]
    first = rnd.tree.tried[0][1][0]
    # the first child's draw moved below its acceptance probability: the walk accepts it
    flipped = _tamper(rnd, **{f"n{first}": {"u": 0.0}})
    rounds = out.rounds[:at] + [flipped] + out.rounds[at + 1 :]
    findings = check_report(out.config, rounds).findings
    assert findings and findings[0].rule == "acceptance-draw" and findings[0].round == at
    # a recorded residual update that is not the recomputed one
    update = rnd.tree.updates[0]
    stale = dataclasses.replace(update, p_after=rnd.nodes[first].p)
    tree = dataclasses.replace(rnd.tree, updates=(stale,) + rnd.tree.updates[1:])
    rounds = out.rounds[:at] + [dataclasses.replace(rnd, tree=tree)] + out.rounds[at + 1 :]
    findings = check_report(out.config, rounds).findings
    assert findings and findings[0].rule == "residual" and findings[0].round == at


@pytest.mark.parametrize("cfg", SETTINGS, ids=lambda c: c.describe())
def test_top_n_tree_records_keep_what_the_checker_reads(models, cfg):
    """vectors="top": tree rounds keep TopDistributions (the same tokens as with full
    vectors); the checker proves the walk from them (core.check.walk), finds nothing, and says
    which parts of the residual updates only full vectors would prove."""
    target, draft = models
    for tree, children in TREES:
        runs_ = []
        for vectors in ("full", "top"):
            dec = SpeculativeDecoder(
                target, DraftModelProposer(draft, tree=tree, children=children), sampling=cfg, seed=2, vectors=vectors
            )
            runs_.append(dec.generate(PROMPTS[0], 20))
        full, top = runs_
        assert full.new_tokens == top.new_tokens
        assert all(getattr(n.p, "partial", False) for r in top.rounds for n in r.nodes)
        report = check_report(top.config, top.rounds)
        assert report.findings == [], [str(f) for f in report.findings[:2]]
        assert "tree-walk" not in report.not_checked
        if not cfg.greedy and any(r.tree.updates for r in top.rounds):
            assert set(report.not_checked) == {"residual"} and "partly" in report.not_checked["residual"]
