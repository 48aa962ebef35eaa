"""The decoder's device-side maths and what a round record keeps of its rows.

The float64 torch transforms and draws must give what the numpy reference gives; a record
that keeps top-N (vectors="top") must decide exactly as one that keeps full vectors, keep
the same top-N, facts and drawn entries the store would compute from the full vectors, and
pass (and fail) the checker the same way; and a run must not keep its rounds unless asked.
"""

from __future__ import annotations

import gc
import pickle
import weakref

import numpy as np
import pytest
import torch

from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.check.checker import check_report, first_bad_round
from specscope.core.draft.proposers import PromptLookupProposer
from specscope.core.faults.zoo import FAULTS, faulty_decoder
from specscope.core.sampling.device import draft_distribution, process_logits_torch, sample_from_torch
from specscope.core.sampling.dists import TopDistribution, compact_rows, covering_top_n, keeps_full_vectors
from specscope.core.sampling.partial import VectorStats
from specscope.core.sampling.reference import process_logits, sample_from
from tests.tiny_models import noisy_copy, tiny_lm

CONFIGS = [
    SamplingConfig(temperature=0.0),
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.7, top_k=5),
    SamplingConfig(temperature=1.3, top_p=0.8),
    SamplingConfig(temperature=0.9, top_k=20, top_p=0.6),
    SamplingConfig(temperature=1.0, top_p=0.999),
]


def reference_top(dist: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The store's top-N rule, by a full sort: desc probability, ties by ascending id, p > 0."""
    ids = np.arange(len(dist))
    order = np.lexsort((ids, -dist))[:n]
    order = order[dist[order] > 0]
    return ids[order], dist[order]


def same_facts(a: VectorStats, b: VectorStats) -> bool:
    """Support and minimum exactly; the sum up to summation order (torch and numpy add in
    different orders: a few ulps)."""
    return a.support == b.support and a.minimum == b.minimum and abs(a.total - b.total) < 1e-13


def tied_logits(rng: np.random.Generator, rows: int, vocab: int) -> np.ndarray:
    """Logits with many exact ties (a few distinct values), where the tie rules matter."""
    return rng.integers(-3, 4, size=(rows, vocab)).astype(np.float32)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.describe())
@pytest.mark.parametrize("ties", [False, True])
def test_torch_transforms_equal_the_numpy_reference(config, ties):
    rng = np.random.default_rng(7)
    for vocab in (50, 3000, 40_000):  # 40,000: core.sampling.row_ops's chunked topk on the CPU
        logits = tied_logits(rng, 4, vocab) if ties else (rng.standard_normal((4, vocab)) * 3).astype(np.float32)
        expected = process_logits(logits, config)
        got = process_logits_torch(torch.from_numpy(logits), config).numpy()
        assert np.array_equal(got > 0, expected > 0), "the filters must keep the same tokens"
        assert np.abs(got - expected).max() < 1e-12


def test_torch_draws_equal_the_numpy_reference():
    rng = np.random.default_rng(3)
    for _ in range(20):
        probs = rng.dirichlet(np.full(300, 0.1))
        probs[rng.integers(0, 300, size=100)] = 0.0
        for u in rng.random(25).tolist() + [0.0, 1 - 1e-16]:
            token = sample_from_torch(torch.from_numpy(probs), u)
            assert token == sample_from(probs, u) and probs[token] > 0


def test_transforms_reject_non_finite_logits_on_the_device():
    logits = torch.zeros(10)
    logits[3] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        process_logits_torch(logits, SamplingConfig())


@pytest.mark.parametrize("ties", [False, True])
def test_compact_rows_keep_the_stores_top_n_the_facts_and_the_drawn_entries(ties):
    rng = np.random.default_rng(11)
    logits = tied_logits(rng, 6, 500) if ties else rng.standard_normal((6, 500)).astype(np.float32)
    rows = process_logits_torch(torch.from_numpy(logits), SamplingConfig(temperature=0.8, top_k=40))
    dense = rows.numpy()
    extra = [[int(rng.integers(0, 500))] for _ in range(6)]
    for dist, full, (token,) in zip(compact_rows(rows, 20, extra), dense, extra):
        ids, vals = reference_top(full, 20)
        assert np.array_equal(dist.top[0], ids) and np.array_equal(dist.top[1], vals)
        assert same_facts(dist.stats, VectorStats.of(full))
        assert dist[token] == full[token] and token in dist.known_ids
        assert dist.partial and len(dist) == 500 and dist.shape == (500,)
        dense_again = np.asarray(dist)
        assert np.array_equal(dense_again[dist.known_ids], full[dist.known_ids])
        assert dense_again.sum() == pytest.approx(full.sum() - dist.missing_mass)
        again = pickle.loads(pickle.dumps(dist))
        assert isinstance(again, TopDistribution) and np.array_equal(np.asarray(again), dense_again)


@pytest.mark.parametrize("ties", [False, True])
def test_sparse_rows_compact_as_dense_rows_do(ties):
    """Rows of a top-k run read once for their nonzeros give the same records."""
    rng = np.random.default_rng(5)
    logits = tied_logits(rng, 5, 800) if ties else rng.standard_normal((5, 800)).astype(np.float32)
    rows = process_logits_torch(torch.from_numpy(logits), SamplingConfig(temperature=0.9, top_k=12, top_p=0.9))
    residual = torch.clamp_min(rows[0] - rows[1], 0).reshape(1, -1)
    rows = torch.cat([rows, residual / residual.sum()])
    extra = [[int(rng.integers(0, 800)), int(rows[i].argmax())] for i in range(6)]
    for a, b in zip(compact_rows(rows, 20, extra), compact_rows(rows, 20, extra, sparse=True)):
        assert np.array_equal(a.top[0], b.top[0]) and np.array_equal(a.top[1], b.top[1])
        assert same_facts(a.stats, b.stats)
        assert all(a[t] == b[t] for t in np.concatenate([a.known_ids, b.known_ids]).tolist())


def test_the_vector_mode_and_top_n_rules():
    assert keeps_full_vectors("auto", 4096) and not keeps_full_vectors("auto", 4097)
    assert keeps_full_vectors("full", 151_936) and not keeps_full_vectors("top", 64)
    with pytest.raises(ValueError, match="vectors must be one of"):
        keeps_full_vectors("some", 10)
    assert covering_top_n(20, 50) == 51 and covering_top_n(20, 0) == 20 and covering_top_n(20, 300) == 20


@pytest.fixture(scope="module")
def pair():
    target = tiny_lm("llama", vocab=300, seed=0, init_range=0.3)
    return target, noisy_copy(target, 0.3)


def run(pair, vectors: str, sampling: SamplingConfig, k: int = 3, proposer=None, fault: str | None = None):
    target, draft = pair
    proposer = proposer or DraftModelProposer(draft)
    kwargs = dict(k=k, sampling=sampling, seed=5, vectors=vectors, eos_token_id=7)
    dec = faulty_decoder(fault, target, proposer, **kwargs) if fault else SpeculativeDecoder(target, proposer, **kwargs)
    return dec.generate([1, 2, 3, 4, 5], 40)


@pytest.fixture(scope="module")
def wide_pair():
    """40,000 tokens: the CPU's chunked reductions, and the q facts taken at draft time."""
    target = tiny_lm("llama", vocab=40_000, seed=0, init_range=0.3, hidden=16, layers=1)
    return target, noisy_copy(target, 0.3)


@pytest.mark.parametrize("sampling", CONFIGS[:3], ids=lambda c: c.describe())
@pytest.mark.parametrize("models", ["pair", "wide_pair"])
def test_top_records_decide_exactly_as_full_records(request, models, sampling):
    pair = request.getfixturevalue(models)
    full, top = run(pair, "full", sampling), run(pair, "top", sampling)
    assert top.new_tokens == full.new_tokens
    for a, b in zip(full.rounds, top.rounds):
        assert [e.__dict__ for e in a.emitted] == [e.__dict__ for e in b.emitted]
        assert (a.residual_mass, a.eos, a.budget_stop, a.bonus_withheld) == (
            b.residual_mass,
            b.eos,
            b.budget_stop,
            b.bonus_withheld,
        )
        for x, y in zip(a.nodes, b.nodes):
            assert (x.status, x.u, x.p_token, x.q_token, x.ratio, x.target_argmax) == (
                y.status,
                y.u,
                y.p_token,
                y.q_token,
                y.ratio,
                y.target_argmax,
            )
            assert x.overlap == pytest.approx(y.overlap, abs=1e-15) if x.overlap is not None else y.overlap is None
            assert isinstance(x.p, np.ndarray) and isinstance(y.p, TopDistribution)
            for dense, kept in ((x.p, y.p), (x.q, y.q)):
                if dense is not None:
                    assert np.array_equal(kept.top[0], reference_top(dense, 20)[0])
                    assert same_facts(kept.stats, VectorStats.of(dense)) and kept[x.token] == dense[x.token]
        for dense, kept in ((a.bonus_p, b.bonus_p), (a.residual, b.residual)):
            assert (dense is None) == (kept is None)
            if dense is not None:
                assert np.array_equal(kept.top[1], reference_top(dense, 20)[1])
                assert kept[a.emitted[-1].token] == dense[a.emitted[-1].token]


@pytest.mark.parametrize("sampling", CONFIGS[:3], ids=lambda c: c.describe())
def test_the_checker_passes_top_records_of_a_correct_run(pair, sampling):
    result = run(pair, "top", sampling)
    report = check_report(result.config, result.rounds)
    assert report.findings == []


@pytest.fixture(scope="module")
def close_pair():
    """A small vocabulary and a close draft, so that whole drafts (and EOS inside them) are
    accepted often; and a token the target emits often, which as EOS lands inside rounds."""
    target = tiny_lm("llama", vocab=64, seed=0, init_range=0.3)
    draft = noisy_copy(target, 0.08)
    dec = SpeculativeDecoder(target, DraftModelProposer(draft), k=4, sampling=SamplingConfig(temperature=1.0))
    tokens = [t for seed in range(4) for t in dec.generate([1, 2, 3, 4, 5 + seed], 40, seed=seed).new_tokens]
    return target, draft, int(np.bincount(tokens).argmax())


@pytest.mark.slow
@pytest.mark.parametrize("fault", [name for name, f in FAULTS.items() if not f.needs])
def test_faults_are_flagged_on_top_records_where_full_records_flag_them(close_pair, fault):
    """The same faulty runs recorded both ways: the checker's first bad round is the same
    (a top-N record loses no fault the full one shows)."""
    target, draft, frequent_token = close_pair
    fired = 0
    for seed in range(8):
        for sampling in (
            SamplingConfig(temperature=0.0),
            SamplingConfig(temperature=1.0),
            SamplingConfig(temperature=0.8, top_k=8),
        ):
            firsts, tokens = [], []
            for vectors in ("full", "top"):
                dec = faulty_decoder(
                    fault,
                    target,
                    DraftModelProposer(draft),
                    k=4,
                    sampling=sampling,
                    seed=seed,
                    eos_token_id=frequent_token,
                    vectors=vectors,
                )
                out = dec.generate([1, 2, 3, 4, 5 + seed], 9 + 2 * seed)
                firsts.append(first_bad_round(check_report(out.config, out.rounds).findings))
                tokens.append(out.new_tokens)
            assert tokens[0] == tokens[1]
            assert firsts[0] == firsts[1], (fault, seed, sampling.describe(), firsts, dec.fault_rounds)
            fired += bool(dec.fault_rounds)
            if dec.fault_rounds:
                assert firsts[1] is not None, f"{fault} fired in rounds {dec.fault_rounds} and went unnoticed"
    assert fired >= 1, f"{fault} never fired: the test does not exercise it"


def test_prompt_lookup_records_with_top_vectors(pair):
    result = run(pair, "top", SamplingConfig(temperature=1.0), proposer=PromptLookupProposer(max_ngram=2))
    assert check_report(result.config, result.rounds).findings == []
    drafted = [n for r in result.rounds for n in r.nodes]
    assert all(n.q_token == 1.0 and n.q.stats.support == 1 for n in drafted)


def test_a_run_keeps_no_round_it_has_yielded(pair):
    target, draft = pair
    dec = SpeculativeDecoder(target, DraftModelProposer(draft), k=3, sampling=SamplingConfig(temperature=1.0))
    handle = dec.start([1, 2, 3], 30)
    first = next(handle)
    ref = weakref.ref(first)
    del first
    next(handle)
    gc.collect()
    assert ref() is None, "the decoder (or its generator) still holds a round it has yielded"
    result = handle.drain()
    assert result.rounds == [] and result.summary.new_tokens == len(result.new_tokens) == 30


def test_generate_can_keep_only_the_tokens_and_the_summary(pair):
    target, draft = pair
    dec = SpeculativeDecoder(target, DraftModelProposer(draft), k=3, sampling=SamplingConfig(temperature=1.0), seed=2)
    kept, light = dec.generate([1, 2, 3], 30), dec.generate([1, 2, 3], 30, keep_rounds=False)
    assert light.rounds == [] and light.new_tokens == kept.new_tokens
    a, b = kept.summary, light.summary
    assert (a.rounds, a.drafted, a.accepted, a.mean_accepted_length) == (
        b.rounds,
        b.drafted,
        b.accepted,
        b.mean_accepted_length,
    )


def test_bad_vector_options_are_refused(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="vectors must be one of"):
        SpeculativeDecoder(target, DraftModelProposer(draft), vectors="dense")
    with pytest.raises(ValueError, match="top_n"):
        SpeculativeDecoder(target, DraftModelProposer(draft), top_n=0)


@pytest.mark.parametrize("vocab", [4096, 40_000 + 17])
def test_chunked_draws_on_the_cpu_equal_the_numpy_reference(vocab):
    """At large vocabularies the CPU draw sums by chunks first (core.sampling.device): the
    same token as the sequential scan, zeros and the u -> 1 end included."""
    rng = np.random.default_rng(vocab)
    for trial in range(12):
        probs = rng.dirichlet(np.full(vocab, 0.05))
        probs[rng.integers(0, vocab, size=vocab // 3)] = 0.0
        if trial % 3 == 0:
            probs[-200:] = 0.0  # no mass in the last chunks
        if trial % 3 == 1:
            probs[:] = 0.0
            probs[rng.integers(0, vocab, size=60)] = rng.random(60)  # top-k-like: a few entries
        for u in rng.random(40).tolist() + [0.0, 1 - 1e-16, 0.5]:
            token = sample_from_torch(torch.from_numpy(probs), u)
            assert token == sample_from(probs, u) and probs[token] > 0


@pytest.mark.parametrize("config", CONFIGS[1:], ids=lambda c: c.describe())
def test_the_drafts_q_is_a_distribution_within_1e6_of_the_float64_one(config):
    """draft_distribution takes an unfiltered row's exponentials in float32 (any q is exact
    when it is the one drawn from and verified with): still float64 rows that sum to 1, the
    reference's support, and within about 1e-7 of the float64 transforms."""
    rng = np.random.default_rng(11)
    for vocab in (50, 40_000):
        logits = (rng.standard_normal((3, vocab)) * 3).astype(np.float32)
        q = draft_distribution(torch.from_numpy(logits), config)
        expected = process_logits(logits, config)
        assert q.dtype == torch.float64
        q = q.numpy()
        assert np.array_equal(q > 0, expected > 0)
        assert np.abs(q.sum(axis=-1) - 1).max() < 1e-12
        assert np.abs(q - expected).max() < 1e-6


def test_the_drafts_q_takes_the_float64_path_where_float32_overflows_or_underflows():
    logits = torch.tensor([[3.0, 1.0, -2.0, 0.5]])
    config = SamplingConfig(temperature=1e-39)  # logits / T overflow float32, not float64
    q = draft_distribution(logits, config)
    assert torch.equal(q, process_logits_torch(logits, config))
    assert q[0].tolist() == [1.0, 0.0, 0.0, 0.0]
    # at T=0.01 exp(-300) underflows float32 but not float64: the support stays the float64 one
    config = SamplingConfig(temperature=0.01)
    q = draft_distribution(logits, config)
    assert torch.equal(q, process_logits_torch(logits, config)) and bool((q > 0).all())


def test_keep_full_vectors_makes_a_top_record_decoder_keep_full_rows(pair):
    target, draft = pair
    dec = SpeculativeDecoder(
        target, DraftModelProposer(draft), k=3, sampling=SamplingConfig(temperature=1.0), vectors="top"
    )
    assert isinstance(dec.generate([1, 2, 3], 6).rounds[0].nodes[0].p, TopDistribution)
    dec.keep_full_vectors()
    rnd = dec.generate([1, 2, 3], 6).rounds[0]
    assert isinstance(rnd.nodes[0].p, np.ndarray) and isinstance(rnd.nodes[0].q, np.ndarray)


@pytest.mark.parametrize("top_p", [1e-9, 0.3, 0.9, 0.999999, 1 - 1e-16, 0.5, 0.75])
@pytest.mark.parametrize("kind", ["peaked", "flat", "tied", "dyadic"])
def test_the_top_p_mask_equals_the_full_sort_reference(top_p, kind):
    """_top_p_keep sorts only what the rule needs (the 256 largest, then one full sort when
    they do not reach top_p): it must keep exactly the tokens the numpy reference's full
    stable sort keeps, on peaked rows (the head suffices), flat rows (a random model's: the
    fallback), heavily tied rows and rows of exact dyadic probabilities whose cumulative
    sums land on top_p itself (0.5, 0.75)."""
    from specscope.core.sampling.device import _top_p_keep
    from specscope.core.sampling.reference import _top_p_mask

    rng = np.random.default_rng(11)
    for vocab in (300, 40_000):
        if kind == "peaked":
            probs = rng.dirichlet(np.full(vocab, 0.01))
        elif kind == "flat":
            probs = process_logits(rng.standard_normal(vocab) * 0.02, SamplingConfig())
        elif kind == "tied":
            probs = process_logits(tied_logits(rng, 1, vocab)[0], SamplingConfig())
        else:  # 1/2, 1/4, 1/8, ... on shuffled ids, the rest of the mass in equal parts
            probs = np.zeros(vocab)
            ids = rng.permutation(vocab)
            probs[ids[:10]] = 0.5 ** np.arange(1, 11)
            probs[ids[10:20]] = (1 - probs.sum()) / 10
        expected = _top_p_mask(probs[None], top_p)[0]
        got = _top_p_keep(torch.from_numpy(probs), top_p).numpy()
        assert np.array_equal(got, expected), (vocab, int(got.sum()), int(expected.sum()))
