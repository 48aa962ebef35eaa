"""Coupled lanes (core.verify.coupling): keyed Gumbel randomness, the drafter-invariant verifier,
its exactness, its invariance to the proposer, and the checker's coupled rule."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specscope.core import DraftModelProposer, PromptLookupProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.check.checker import check_report, check_run, first_bad_round
from specscope.core.faults.zoo import faulty_decoder
from specscope.core.verify.chain import VerifyTask
from specscope.core.verify.coupling import CoupledVerifier, Coupling, coupling_seed_of, gumbel_vector
from tests.core.chi_square import count_outputs, fit_pvalue, stat_models
from tests.core.verify.test_chain_distribution import LENGTH, PROMPT, exact_distribution

ALPHA = 1e-3
T1 = SamplingConfig(temperature=1.0)
T07_TOPK = SamplingConfig(temperature=0.7, top_k=8)


def test_gumbel_keys_are_a_function_of_seed_and_position():
    a = gumbel_vector(3, 5, 1000)
    assert np.array_equal(a, gumbel_vector(3, 5, 1000))
    assert not np.array_equal(a, gumbel_vector(3, 6, 1000))
    assert not np.array_equal(a, gumbel_vector(4, 5, 1000))
    # standard Gumbel: mean = Euler-Mascheroni, variance = pi^2 / 6
    big = gumbel_vector(0, 0, 200_000)
    assert abs(big.mean() - 0.5772) < 0.01 and abs(big.var() - np.pi**2 / 6) < 0.03


def test_coupling_seed_is_validated():
    for bad in (-1, 1.5, "3", True):
        with pytest.raises(ValueError, match="coupling seed"):
            Coupling(bad)


def test_torch_and_numpy_rows_pick_the_same_token():
    rng = np.random.default_rng(0)
    row = rng.dirichlet(np.ones(300))
    row[rng.random(300) < 0.3] = 0  # a filtered row: zeros are outside the support
    row /= row.sum()
    c = Coupling(11)
    for position in range(20):
        t = c.pick(torch.as_tensor(row), position)
        assert t == c.pick(row, position) and row[t] > 0


def test_gumbel_pick_samples_p():
    p = np.array([0.5, 0.25, 0.15, 0.1, 0.0])
    counts = np.bincount([Coupling(s).pick(p, 0) for s in range(4000)], minlength=5)
    assert counts[4] == 0
    assert chisquare(counts[:4], p[:4] * 4000).pvalue > ALPHA


def _task(p, q, tokens, position=0, remaining=10):
    p = torch.as_tensor(np.asarray(p, dtype=np.float64))
    return VerifyTask(
        tokens=tuple(tokens),
        q=torch.as_tensor(np.asarray(q, dtype=np.float64)),
        p=p,
        argmax=p.argmax(dim=-1).numpy(),
        greedy=False,
        eos_token_id=None,
        remaining=remaining,
        position=position,
    )


def test_coupled_verifier_emits_the_targets_picks_whatever_is_proposed():
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(6), size=3)
    q = rng.dirichlet(np.ones(6), size=2)
    for seed in range(50):
        c = Coupling(seed)
        y = [c.pick(p[i], 7 + i) for i in range(3)]
        for tokens in ([y[0], y[1]], [y[0], (y[1] + 1) % 6], [(y[0] + 1) % 6, 0]):
            verdict = CoupledVerifier(c).verify(_task(p, q, tokens, position=7), rng)
            emitted = [e.token for e in verdict.emitted]
            assert emitted == y[: len(emitted)]  # every emitted token is y_j, accepted or not
            accepted = [t == yj for t, yj in zip(tokens, y)]
            n_acc = accepted.index(False) if False in accepted else 2
            assert verdict.accepted == n_acc
            assert [e.kind for e in verdict.emitted][-1] == ("bonus" if n_acc == 2 else "repaired")
            assert verdict.residual is None and all(d is None for d in verdict.draws)


def test_coupled_verifier_withholds_the_bonus_at_the_budget_and_stops_at_eos():
    p = np.array([[0, 1.0, 0], [0, 0, 1.0], [1.0, 0, 0]])
    q = np.array([[0, 1.0, 0], [0, 0, 1.0]])
    rng = np.random.default_rng(0)
    v = CoupledVerifier(Coupling(0)).verify(_task(p, q, [1, 2], remaining=2), rng)
    assert [e.token for e in v.emitted] == [1, 2] and v.bonus_withheld
    task = VerifyTask(**{**_task(p, q, [1, 2]).__dict__, "eos_token_id": 1})
    v = CoupledVerifier(Coupling(0)).verify(task, rng)
    assert [e.token for e in v.emitted] == [1] and v.eos


def coupled_draws(spec, seeds):
    """The continuation for each coupling seed, the run's own seed fixed: only the keys vary
    (run in a worker: the models are rebuilt there)."""
    cfg, emit = spec
    target, draft = stat_models()
    proposer = DraftModelProposer(draft)
    outs = []
    for seed in seeds:
        v = None if emit is None else CoupledVerifier(Coupling(seed), emit=emit)
        dec = SpeculativeDecoder(target, proposer, k=2, sampling=cfg, coupling_seed=seed, verifier=v)
        outs.append(tuple(dec.generate(PROMPT, LENGTH, seed=0).new_tokens))
    return outs


def _fit(cfg, emit=None, samples=3000):
    expected = exact_distribution(stat_models()[0], cfg)
    return fit_pvalue(count_outputs(coupled_draws, (cfg, emit), samples), expected)


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [T1, SamplingConfig(temperature=0.8, top_k=3)], ids=lambda c: c.describe())
def test_coupled_output_distribution_is_the_target_distribution(cfg):
    assert _fit(cfg) > ALPHA


@pytest.mark.slow
def test_statistical_test_detects_emitting_the_drafts_pick():
    """500 seeds, not 3000: emitting the draft's pick scores chi2 = 9839 on 10 degrees of
    freedom there (p underflows to 0; chi2 = 61970 at 3000), an overwhelming verdict already."""
    assert _fit(T1, emit="draft", samples=500) < ALPHA


def _lane(target, proposer, cfg, k, coupling_seed, max_new=24, prompt=(1, 2, 3, 1, 2)):
    dec = SpeculativeDecoder(target, proposer, k=k, sampling=cfg, coupling_seed=coupling_seed)
    return dec.generate(list(prompt), max_new, seed=5)


@pytest.mark.parametrize("cfg", [T1, T07_TOPK], ids=lambda c: c.describe())
def test_coupled_lanes_emit_the_same_tokens_whatever_the_proposer(llama_pair, cfg):
    target, draft = llama_pair
    lanes = [
        _lane(target, DraftModelProposer(draft), cfg, 4, 9),
        _lane(target, PromptLookupProposer(), cfg, 4, 9),
        _lane(target, DraftModelProposer(draft), cfg, 2, 9),
    ]
    assert lanes[0].new_tokens == lanes[1].new_tokens == lanes[2].new_tokens
    assert lanes[0].summary.rounds != lanes[1].summary.rounds  # different proposers, different rounds
    assert coupling_seed_of(lanes[0].config) == 9 and lanes[0].config.proposer_params["verifier"] == "coupled"
    for lane in lanes:
        assert check_run(lane.config, lane.rounds) == []


def test_uncoupled_lanes_are_not_coupled(llama_pair):
    """The control of the test above: without coupling the proposers' draws part the lanes."""
    target, draft = llama_pair
    a = _lane(target, DraftModelProposer(draft), T1, 4, None)
    b = _lane(target, PromptLookupProposer(), T1, 4, None)
    assert a.new_tokens != b.new_tokens and coupling_seed_of(a.config) is None


def test_coupling_is_not_recorded_when_greedy(llama_pair):
    target, draft = llama_pair
    greedy = SamplingConfig(temperature=0)
    a = _lane(target, DraftModelProposer(draft), greedy, 4, 3)
    b = _lane(target, DraftModelProposer(draft), greedy, 4, None)
    assert a.new_tokens == b.new_tokens and coupling_seed_of(a.config) is None


def test_a_tree_proposer_cannot_be_coupled(llama_pair):
    target, draft = llama_pair
    with pytest.raises(ValueError, match="chain"):
        SpeculativeDecoder(target, DraftModelProposer(draft, tree="2,1"), sampling=T1, coupling_seed=0)


def test_checker_flags_the_draft_pick_fault_at_its_first_round(llama_pair):
    target, draft = llama_pair
    dec = faulty_decoder("coupled-draft-pick", target, DraftModelProposer(draft), k=4, sampling=T1, coupling_seed=2)
    out = dec.generate([1, 2, 3, 1, 2], 32, seed=0)
    assert dec.fault_rounds, "the fault never fired"
    findings = check_run(out.config, out.rounds)
    assert findings and first_bad_round(findings) == dec.fault_rounds[0]
    assert {f.rule for f in findings} == {"coupled"}


def test_checker_rejects_an_accepted_token_that_is_not_the_pick(llama_pair):
    """A coupled round replayed with another seed is wrong somewhere: the keys decide it."""
    import dataclasses

    target, draft = llama_pair
    out = _lane(target, DraftModelProposer(draft), T1, 4, 4)
    params = {**out.config.proposer_params, "coupling_seed": 5}
    assert check_run(dataclasses.replace(out.config, proposer_params=params), out.rounds)


def test_checker_on_top_n_records_proves_what_it_can(llama_pair):
    target, draft = llama_pair
    dec = SpeculativeDecoder(
        target, DraftModelProposer(draft), k=4, sampling=T1, coupling_seed=1, vectors="top", top_n=8
    )
    out = dec.generate([1, 2, 3, 1, 2], 24, seed=0)
    report = check_report(out.config, out.rounds)
    assert report.findings == []
    bad = faulty_decoder(
        "coupled-draft-pick",
        target,
        DraftModelProposer(draft),
        k=4,
        sampling=T1,
        coupling_seed=1,
        vectors="top",
        top_n=8,
    )
    out = bad.generate([1, 2, 3, 1, 2], 24, seed=0)
    findings = check_run(out.config, out.rounds)
    assert bad.fault_rounds, "the fault never fired"
    # the draft's pick is stored (a proposed token), and the target's best stored entry beats it
    assert findings and first_bad_round(findings) == bad.fault_rounds[0]


@pytest.fixture(scope="module")
def bundled():
    from specscope.core.loading.models import bundled_available, example_prompts, load_bundled

    if not bundled_available():
        pytest.skip("needs the bundled models")
    pair = load_bundled("small", device="cpu")
    prompt = list(pair.tokenizer(example_prompts()[0].text, add_special_tokens=False)["input_ids"])
    return pair, prompt[-200:]


@pytest.mark.parametrize("cfg", [T1, SamplingConfig(temperature=0.7, top_k=20)], ids=lambda c: c.describe())
def test_coupled_lanes_agree_on_the_bundled_models(bundled, cfg):
    pair, prompt = bundled
    lanes = [(DraftModelProposer(pair.draft), 4), (PromptLookupProposer(), 4), (DraftModelProposer(pair.draft), 2)]
    outs = []
    for proposer, k in lanes:
        dec = SpeculativeDecoder(pair.target, proposer, k=k, sampling=cfg, coupling_seed=11)
        out = dec.generate(prompt, 40, seed=k)  # the run seeds differ: only the coupling is shared
        assert check_run(out.config, out.rounds) == []
        outs.append(out.new_tokens)
    assert outs[0] == outs[1] == outs[2] and len(outs[0]) == 40
