"""Round structure on scripted drafts: where rejections fall, bonus, EOS and budget."""

import numpy as np
import pytest
import torch

from specscope.core import SamplingConfig, SpeculativeDecoder
from tests.core.scripted import ScriptedProposer
from tests.tiny_models import tiny_lm

V = 64
PROMPT = [11, 22, 33, 44]
GREEDY = SamplingConfig(temperature=0)


@pytest.fixture(scope="module")
def target():
    return tiny_lm("llama", seed=7, init_range=0.3, dtype=torch.float64)


@pytest.fixture(scope="module")
def reference(target):
    ids = torch.tensor([PROMPT])
    out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=80, do_sample=False, pad_token_id=0)
    return out[0, len(PROMPT) :].tolist()


def scripted(reference, wrong_at=()):
    """Propose the reference continuation, except a wrong token at draft positions wrong_at."""

    def script(context, k):
        pos = len(context) - len(PROMPT)
        return [(reference[pos + j] + 1) % V if j in wrong_at else reference[pos + j] for j in range(k)]

    return ScriptedProposer(script, V)


def one_round(target, proposer, k=4, max_new=40, eos=None):
    dec = SpeculativeDecoder(target, proposer, k=k, sampling=GREEDY, eos_token_id=eos)
    return dec.generate(PROMPT, max_new)


@pytest.mark.parametrize("reject_at", [0, 2, 3], ids=["first", "middle", "last"])
def test_rejection_position(target, reference, reject_at):
    out = one_round(target, scripted(reference, wrong_at={reject_at}))
    rnd = out.rounds[0]
    assert [n.status for n in rnd.nodes] == ["accepted"] * reject_at + ["rejected"] + ["unvisited"] * (3 - reject_at)
    assert [e.kind for e in rnd.emitted] == ["accepted"] * reject_at + ["repaired"]
    assert rnd.tokens == reference[: reject_at + 1]
    assert rnd.rejected_node == reject_at and rnd.bonus is None
    assert rnd.target_cache.after == len(PROMPT) + reject_at
    assert rnd.target_cache.cropped == 4 - reject_at
    assert out.new_tokens == reference[:40]


def test_all_accepted_emits_a_bonus(target, reference):
    out = one_round(target, scripted(reference))
    rnd = out.rounds[0]
    assert [e.kind for e in rnd.emitted] == ["accepted"] * 4 + ["bonus"]
    assert rnd.tokens == reference[:5]
    assert rnd.accepted_length == 5 and rnd.bonus_p is not None
    assert rnd.target_cache.cropped == 0 and rnd.target_cache.pending == (reference[4],)
    assert len(out.rounds) == 8  # 40 tokens, 5 per round


def test_zero_new_tokens_returns_at_once(target, reference):
    proposer = scripted(reference)
    out = one_round(target, proposer, max_new=0)
    assert out.new_tokens == [] and out.rounds == [] and proposer.calls == []
    assert out.stop_reason == "budget"


def test_k_larger_than_remaining_budget_is_capped(target, reference):
    proposer = scripted(reference)
    out = one_round(target, proposer, k=6, max_new=3)
    assert proposer.calls == [(len(PROMPT), 3)]
    rnd = out.rounds[0]
    assert rnd.k == 3 and rnd.drafted == 3
    assert out.new_tokens == reference[:3]
    assert rnd.bonus_withheld and rnd.budget_stop and rnd.bonus is None


def test_budget_is_never_exceeded(target, reference):
    for max_new in range(1, 13):
        out = one_round(target, scripted(reference), k=4, max_new=max_new)
        assert out.new_tokens == reference[:max_new]
        assert out.rounds[-1].budget_stop
        assert not any(r.budget_stop for r in out.rounds[:-1])


def eos_case(reference, position):
    """An EOS id that first occurs in the reference at `position`."""
    eos = reference[position]
    assert eos not in reference[:position], "pick a position whose token is new"
    return eos


def first_new_position(reference, start):
    return next(i for i in range(start, 40) if reference[i] not in reference[:i])


def test_eos_accepted_ends_the_output(target, reference):
    pos = first_new_position(reference, 1)
    eos = eos_case(reference, pos)
    out = one_round(target, scripted(reference), k=4, eos=eos)
    last = out.rounds[-1]
    assert out.new_tokens == reference[: pos + 1] and out.stop_reason == "eos"
    assert last.eos and last.emitted[-1].token == eos
    if last.emitted[-1].kind == "accepted":
        assert last.nodes[last.emitted[-1].node].status == "accepted"
        assert all(n.status == "unvisited" for n in last.nodes[last.emitted[-1].node + 1 :])


def test_eos_repaired_ends_the_output(target, reference):
    pos = first_new_position(reference, 1)
    eos = eos_case(reference, pos)

    def script(context, k):
        at = len(context) - len(PROMPT)
        return [(reference[at + j] + 1) % V if at + j == pos else reference[at + j] for j in range(k)]

    out = one_round(target, ScriptedProposer(script, V), k=4, eos=eos)
    assert out.new_tokens == reference[: pos + 1]
    assert out.rounds[-1].emitted[-1].kind == "repaired" and out.rounds[-1].eos


def test_eos_bonus_ends_the_output(target, reference):
    pos = first_new_position(reference, 4)
    eos = eos_case(reference, pos)

    def script(context, k):
        at = len(context) - len(PROMPT)
        return [reference[at + j] for j in range(min(k, pos - at))]  # stop drafting before EOS

    out = one_round(target, ScriptedProposer(script, V), k=4, eos=eos)
    assert out.new_tokens == reference[: pos + 1]
    assert out.rounds[-1].emitted[-1].kind == "bonus" and out.rounds[-1].eos


def test_many_rounds_with_mixed_outcomes(target, reference):
    rng = np.random.default_rng(0)

    def script(context, k):
        at = len(context) - len(PROMPT)
        return [(reference[at + j] + 1) % V if rng.random() < 0.3 else reference[at + j] for j in range(k)]

    out = one_round(target, ScriptedProposer(script, V), k=4, max_new=70)
    assert out.new_tokens == reference[:70]
    assert len(out.rounds) > 15
    lengths = {r.accepted_length for r in out.rounds}
    assert len(lengths) >= 3
    # Rounds chain: each starts where the previous ended.
    for prev, nxt in zip(out.rounds, out.rounds[1:]):
        assert nxt.prefix_len == prev.prefix_len + len(prev.emitted)
        assert nxt.target_cache.before == prev.target_cache.after


def test_point_mass_outside_the_support_is_always_repaired_from_the_residual(target):
    sampling = SamplingConfig(temperature=1.0, top_k=5)
    # Find a token outside the target's top-5 after PROMPT.
    with torch.inference_mode():
        logits = target(torch.tensor([PROMPT])).logits[0, -1]
    outside = int(torch.argsort(logits)[0])
    proposer = ScriptedProposer(lambda ctx, k: [outside], V)
    repairs = set()
    for seed in range(40):
        dec = SpeculativeDecoder(target, proposer, k=1, sampling=sampling, seed=seed)
        rnd = dec.generate(PROMPT, 1).rounds[0]
        node = rnd.nodes[0]
        assert node.p_token == 0.0 and node.ratio == 0.0 and node.status == "rejected"
        # The residual of a point mass outside the support is p itself.
        np.testing.assert_allclose(rnd.residual, node.p)
        assert rnd.residual_mass == pytest.approx(1.0)
        assert rnd.emitted[0].kind == "repaired" and node.p[rnd.emitted[0].token] > 0
        repairs.add(rnd.emitted[0].token)
    assert len(repairs) > 1


def test_zero_q_tokens_are_reachable_through_the_repair(target):
    sampling = SamplingConfig(temperature=1.0)
    with torch.inference_mode():
        top = int(target(torch.tensor([PROMPT])).logits[0, -1].argmax())
    proposer = ScriptedProposer(lambda ctx, k: [top], V)  # q = one-hot(top): every other q is 0
    emitted_other = 0
    for seed in range(60):
        dec = SpeculativeDecoder(target, proposer, k=1, sampling=sampling, seed=seed)
        rnd = dec.generate(PROMPT, 1).rounds[0]
        if rnd.emitted[0].kind == "repaired":
            assert rnd.emitted[0].token != top
            assert rnd.residual[top] == 0.0
            emitted_other += 1
    assert emitted_other > 0
