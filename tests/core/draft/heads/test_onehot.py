"""A head's `draw=onehot` (core.draft.registry, HeadDrafting.draw): at T > 0 the head proposes
the top token of its q (after the sampling transforms) and reports q as a point mass on it,
the shape of vLLM #40149's bug. Point-mass verification is exact for any token, so:

- the output at T = 1 is exactly the target's distribution (the chi-square test of
  test_heads_distribution, same tiny target, EAGLE-3 head with a 3-token draft vocabulary:
  the point mass sits at a target id), with its negative control: the top token proposed but
  the verifier handed the head's full q (min(1, p/q) of a token that was never drawn from q)
  must be rejected (600 seeds: p = 0.075 for the onehot head, p = 1e-81 for the bug);
- greedy runs are unchanged (equal to plain greedy decoding);
- every T > 0 draft node reports q = the point mass on its token, the run records its draw,
  and the checker finds nothing wrong (uncoupled and coupled).
"""

from __future__ import annotations

import pytest
import torch

from specscope.core import SamplingConfig, SpeculativeDecoder
from specscope.core.check.checker import check_run
from specscope.core.draft.registry import KINDS, SpecError, build_proposer, parse_spec
from tests.core.chi_square import count_outputs, fit_pvalue, stat_models
from tests.core.draft.heads.test_formats import GREEDY, head_spec, plain_greedy
from tests.core.head_checkpoints import WRITERS, write_eagle3
from tests.core.verify.test_chain_distribution import ALPHA, LENGTH, PROMPT, exact_distribution

SAMPLES = 600
T1 = SamplingConfig(temperature=1.0)


def full_q_reported(proposer):
    """The bug: the top token proposed, but the verifier handed the head's full q, as if the
    token had been sampled from it."""
    draw = proposer.draw

    def misreported(logits, sampling, rng, position, to_target):
        token, point, u = draw(logits, sampling, rng, position, to_target)
        proposer.draw_mode = "sampled"
        try:
            _, q, _ = draw(logits, sampling, rng, position, to_target)
        finally:
            proposer.draw_mode = "onehot"
        return token, q, u

    proposer.draw = misreported
    return proposer


def onehot_draws(spec, seeds):
    """The decoder's continuation for each seed (run in a worker: the head is loaded there)."""
    head, broken = spec
    proposer = build_proposer(head)
    dec = SpeculativeDecoder(stat_models()[0], full_q_reported(proposer) if broken else proposer, k=2, sampling=T1)
    return [tuple(dec.generate(PROMPT, LENGTH, seed=seed).new_tokens) for seed in seeds]


def onehot_fit(folder, broken=False):
    target = stat_models()[0]
    # a flat q (head_scale 0.1) over 3 of the 5 tokens: its top token is often rejected, so
    # repairs from p without x carry much of the output
    write_eagle3(folder, target, seed=3, draft_vocab=3, layers=[0, 0, 0], head_scale=0.1)
    counts = count_outputs(onehot_draws, (f"eagle3:{folder},draw=onehot", broken), SAMPLES)
    return fit_pvalue(counts, exact_distribution(target, T1))


@pytest.mark.slow
def test_onehot_head_output_is_the_target_distribution(tmp_path):
    assert onehot_fit(tmp_path / "eagle3") > ALPHA


@pytest.mark.slow
def test_statistical_test_detects_a_top_token_verified_with_the_full_q(tmp_path):
    assert onehot_fit(tmp_path / "eagle3", broken=True) < ALPHA


@pytest.fixture(scope="module")
def target():
    from tests.tiny_models import tiny_lm

    return tiny_lm("llama", seed=0, init_range=0.3, layers=4, vocab=64)


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_onehot_greedy_equals_plain_greedy(kind, target, tmp_path):
    spec = head_spec(kind, tmp_path, target)
    want = plain_greedy(target, [1, 2, 3, 4, 5, 6, 2, 3], 30)
    for k in (1, 4):
        out = SpeculativeDecoder(target, build_proposer(f"{spec},draw=onehot"), k=k, sampling=GREEDY).generate(
            [1, 2, 3, 4, 5, 6, 2, 3], 30
        )
        assert out.new_tokens == want, (kind, k)
        assert out.config.proposer_params["draw"] == "onehot"


@pytest.mark.parametrize("coupling_seed", [None, 5])
def test_onehot_drafts_are_the_top_token_as_a_point_mass(target, tmp_path, coupling_seed):
    spec = head_spec("eagle3", tmp_path, target)
    runs = {
        draw: SpeculativeDecoder(
            target, build_proposer(f"{spec},draw={draw}"), k=3, sampling=T1, vectors="full", coupling_seed=coupling_seed
        ).generate([1, 2, 3, 4, 5, 6, 2, 3], 30, seed=2)
        for draw in ("sampled", "onehot")
    }
    onehot = runs["onehot"]
    assert onehot.config.proposer_params["spec"] == f"{spec},draw=onehot"
    assert (
        onehot.config.proposer_params["draw"] == "onehot"
        and runs["sampled"].config.proposer_params["draw"] == "sampled"
    )
    nodes = [node for rnd in onehot.rounds for node in rnd.nodes]
    assert len(nodes) >= 20
    for node in nodes:
        q = torch.as_tensor(node.q)
        assert node.q_token == 1.0 and q[node.token] == 1.0 and q.sum() == 1.0
    # both lanes draft their first tokens after the same context (the prefill round's token):
    # the onehot head proposes the top token of the q the sampled head draws from
    first = {draw: next(r for r in run.rounds if r.nodes) for draw, run in runs.items()}
    assert first["onehot"].emitted_before == first["sampled"].emitted_before
    assert first["onehot"].nodes[0].token == int(torch.as_tensor(first["sampled"].nodes[0].q).argmax())
    # the sampled head's q is not a point mass: its drafts are draws, not the top token
    assert any(float(torch.as_tensor(n.q).max()) < 1.0 for r in runs["sampled"].rounds for n in r.nodes)
    assert check_run(onehot.config, onehot.rounds) == []
    if coupling_seed is not None:  # coupled lanes emit the same tokens whatever the proposer draws
        assert onehot.new_tokens == runs["sampled"].new_tokens


def test_the_draw_parameter_parses_and_is_checked_without_building():
    assert str(parse_spec("eagle3:draw=onehot")) == "eagle3:draw=onehot"
    assert str(parse_spec("eagle3:/some/head,draw=onehot")) == "eagle3:/some/head,draw=onehot"
    for kind in ("eagle", "eagle3", "medusa", "mtp"):
        assert KINDS[kind].param("draw").default == "sampled"
        with pytest.raises(SpecError, match="draw must be sampled or onehot, got 'top'"):
            KINDS[kind].check(parse_spec(f"{kind}:/some/head,draw=top"))
    with pytest.raises(SpecError, match="draw must be sampled or onehot"):
        build_proposer("eagle3:draw=top")
    with pytest.raises(SpecError, match="has no parameter 'draw'"):
        parse_spec("lookup:draw=onehot")
