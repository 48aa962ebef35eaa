"""The checker against the fault zoo: every fault that fires is flagged at the round where
it first fired, and clean runs of the same settings produce no finding at all."""

from collections import Counter

import numpy as np
import pytest

from specscope.core import DraftModelProposer, PromptLookupProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.check.checker import RULES, Finding, check_run, first_bad_round, recompute_findings
from specscope.core.faults.zoo import FAULTS, faulty_decoder
from tests.tiny_models import noisy_copy, tiny_lm

SETTINGS = [
    SamplingConfig(temperature=0),
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=1.0, top_k=8),
    SamplingConfig(temperature=0.8, top_p=0.9),
]
PROMPTS = [[1, 2, 3, 4], [9, 8, 7], [5, 17, 5, 17, 5], [40], [3, 3, 3, 3, 3, 3]]


@pytest.fixture(scope="module")
def models():
    target = tiny_lm("llama", vocab=64, seed=0, init_range=0.3)
    return target, noisy_copy(target, 0.08)


@pytest.fixture(scope="module")
def eos_id(models):
    """A token the target emits often, so that EOS lands inside rounds."""
    target, draft = models
    dec = SpeculativeDecoder(target, DraftModelProposer(draft), k=4, sampling=SamplingConfig(temperature=1.0))
    counts = Counter()
    for seed, prompt in enumerate(PROMPTS):
        counts.update(dec.generate(prompt, 40, seed=seed).new_tokens)
    return counts.most_common(1)[0][0]


def runs(models, decoder_factory, eos, seeds=range(6)):
    target, draft = models
    for cfg in SETTINGS:
        for use_eos in (False, True):
            dec = decoder_factory(target, draft, cfg, eos if use_eos else None)
            for seed in seeds:
                prompt = PROMPTS[seed % len(PROMPTS)]
                for max_new in (13, 30):
                    out = dec.generate(prompt, max_new, seed=seed)
                    yield dec, out


@pytest.mark.slow
def test_clean_runs_have_no_findings(models, eos_id):
    target = models[0]
    count = 0
    for _, out in runs(
        models,
        lambda t, d, cfg, eos: SpeculativeDecoder(t, DraftModelProposer(d), k=4, sampling=cfg, eos_token_id=eos),
        eos_id,
    ):
        findings = check_run(out.config, out.rounds)
        assert findings == [], [str(f) for f in findings[:3]]
        count += 1
    assert count == len(SETTINGS) * 2 * 6 * 2
    # Deep replay agrees with clean traces too (a sample: it does full forwards).
    for _, out in runs(
        models,
        lambda t, d, cfg, eos: SpeculativeDecoder(t, DraftModelProposer(d), k=4, sampling=cfg, eos_token_id=eos),
        eos_id,
        seeds=range(1),
    ):
        assert recompute_findings(out.config, out.rounds, target) == []


def test_clean_prompt_lookup_runs_have_no_findings(models):
    target = models[0]
    for cfg in SETTINGS:
        dec = SpeculativeDecoder(target, PromptLookupProposer(), k=3, sampling=cfg)
        for seed, prompt in enumerate(PROMPTS):
            out = dec.generate(prompt * 3, 25, seed=seed)
            assert check_run(out.config, out.rounds) == []


@pytest.mark.slow
@pytest.mark.parametrize("fault", [name for name, f in FAULTS.items() if not f.needs])
def test_every_fired_fault_is_flagged_at_its_first_round(models, eos_id, fault):
    fired = flagged = 0
    for dec, out in runs(
        models,
        lambda t, d, cfg, eos: faulty_decoder(fault, t, DraftModelProposer(d), k=4, sampling=cfg, eos_token_id=eos),
        eos_id,
    ):
        findings = check_run(out.config, out.rounds)
        if not dec.fault_rounds:
            assert findings == [], f"{fault} did not fire but the checker reported {findings[0]}"
            continue
        fired += 1
        assert findings, f"{fault} fired in round {dec.fault_rounds[0]} but nothing was flagged"
        assert first_bad_round(findings) == dec.fault_rounds[0], (
            fault,
            dec.fault_rounds,
            [str(f) for f in findings[:2]],
        )
        flagged += 1
    assert fired >= 5, f"{fault} fired in only {fired} runs: the test does not exercise it"
    assert flagged == fired


def test_recompute_catches_a_stale_target_cache(models):
    target, draft = models
    dec = faulty_decoder(
        "target-crop-off-by-one", target, DraftModelProposer(draft), k=4, sampling=SamplingConfig(temperature=0)
    )
    out = dec.generate([1, 2, 3, 4], 30)
    assert dec.fault_rounds
    # Blind the ordinary cache rule: the deep replay alone still finds the damage.
    findings = recompute_findings(out.config, out.rounds, target)
    assert findings and findings[0].round == dec.fault_rounds[0] + 1
    assert findings[0].rule == "recompute"


def test_findings_name_a_known_rule_and_read_as_one_line(models, eos_id):
    target, draft = models
    dec = faulty_decoder(
        "eos-leak",
        target,
        DraftModelProposer(draft),
        k=4,
        sampling=SamplingConfig(temperature=1.0),
        eos_token_id=eos_id,
    )
    for seed in range(30):
        out = dec.generate(PROMPTS[0], 40, seed=seed)
        if dec.fault_rounds:
            break
    findings = check_run(out.config, out.rounds)
    assert findings
    for f in findings:
        assert isinstance(f, Finding) and f.rule in RULES and f.run_id == out.config.run_id
        assert "\n" not in str(f)
    eos_findings = [f for f in findings if f.rule == "eos"]
    assert eos_findings and eos_findings[0].position is not None


def test_tampered_records_are_flagged(models):
    """Edits to a clean trace, the way a buggy external decoder would write it."""
    import dataclasses

    target, draft = models
    dec = SpeculativeDecoder(target, DraftModelProposer(draft), k=4, sampling=SamplingConfig(temperature=1.0))
    out = dec.generate([1, 2, 3, 4], 30, seed=3)
    rounds = list(out.rounds)
    victim = next(i for i, r in enumerate(rounds) if r.rejected_node is not None and i > 0)
    rnd = rounds[victim]

    # 1. the round claims a prefix one token too long
    bad = rounds[:victim] + [dataclasses.replace(rnd, prefix_len=rnd.prefix_len + 1)] + rounds[victim + 1 :]
    assert {f.rule for f in check_run(out.config, bad) if f.round == victim} >= {"prefix-continuity"}

    # 2. a rejected node whose draw says it should have been accepted
    node = rnd.nodes[rnd.rejected_node]
    flipped = dataclasses.replace(node, u=0.0)
    nodes = tuple(flipped if n.index == node.index else n for n in rnd.nodes)
    bad = rounds[:victim] + [dataclasses.replace(rnd, nodes=nodes)] + rounds[victim + 1 :]
    assert any(f.rule == "acceptance-draw" and f.round == victim for f in check_run(out.config, bad))

    # 3. a bonus after a rejection
    extra = dataclasses.replace(rnd.emitted[-1], kind="bonus", node=None)
    bad_round = dataclasses.replace(rnd, emitted=rnd.emitted + (extra,))
    bad = rounds[:victim] + [bad_round] + rounds[victim + 1 :]
    assert any(f.rule == "round-structure" and f.round == victim for f in check_run(out.config, bad))

    # 4. a residual that is not normalise(max(p - q, 0))
    skewed = np.roll(rnd.residual, 1)
    bad = rounds[:victim] + [dataclasses.replace(rnd, residual=skewed)] + rounds[victim + 1 :]
    assert any(f.rule == "residual" and f.round == victim for f in check_run(out.config, bad))
