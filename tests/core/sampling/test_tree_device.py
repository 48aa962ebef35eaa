"""Tree rounds decide on the model's device: at a vocabulary above 4,096 a tree round builds no
full-vocabulary host array unless full vectors are asked for, its top-N records hold the
full rows' entries, and the checker passes on them."""

import numpy as np
import pytest
import torch

from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.check.checker import check_report
from specscope.core.sampling.dists import TopDistribution
from tests.tiny_models import noisy_copy, tiny_lm

VOCAB = 5000  # above core.sampling.dists.FULL_VECTORS_MAX_VOCAB
CASES = [
    ("3,2,1", "topk", SamplingConfig(temperature=1.0)),
    ("3,2,1", "sampled", SamplingConfig(temperature=1.0)),
    ("2,2", "distinct", SamplingConfig(temperature=0.8, top_k=30, top_p=0.9)),
    ("3,2,1", "topk", SamplingConfig(temperature=0.0)),
]


@pytest.fixture(scope="module")
def models():
    target = tiny_lm("llama", vocab=VOCAB, seed=0, init_range=0.5)
    return target, noisy_copy(target, 0.5)


def run(models, tree, children, sampling, vectors, seed=3):
    target, draft = models
    dec = SpeculativeDecoder(
        target, DraftModelProposer(draft, tree=tree, children=children), sampling=sampling, vectors=vectors, seed=seed
    )
    return dec.generate([1, 2, 3, 4], max_new_tokens=20)


@pytest.fixture
def host_rows_built(monkeypatch):
    """Sizes of the host arrays made from tensors (Tensor.numpy) during a run."""
    sizes: list[int] = []
    original = torch.Tensor.numpy

    def spy(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        sizes.append(out.shape[-1] if out.ndim else 1)
        return out

    monkeypatch.setattr(torch.Tensor, "numpy", spy)
    return sizes


@pytest.mark.parametrize("tree,children,sampling", CASES)
def test_no_full_vocabulary_host_row_unless_full_vectors(models, host_rows_built, tree, children, sampling):
    out = run(models, tree, children, sampling, "top")
    assert out.rounds and all(r.tree is not None for r in out.rounds)
    assert host_rows_built, "the spy saw no transfer at all"
    assert max(host_rows_built) < VOCAB
    host_rows_built.clear()
    run(models, tree, children, sampling, "full")  # the spy does see full rows where they are kept
    assert max(host_rows_built) == VOCAB


@pytest.mark.parametrize("tree,children,sampling", CASES)
def test_top_records_hold_the_full_rows_entries(models, tree, children, sampling):
    top, full = run(models, tree, children, sampling, "top"), run(models, tree, children, sampling, "full")
    assert top.new_tokens == full.new_tokens
    assert len(top.rounds) == len(full.rounds)
    compared = 0
    for a, b in zip(top.rounds, full.rounds):
        assert (a.tree.path, a.tree.tried, a.emitted) == (b.tree.path, b.tree.tried, b.emitted)
        pairs = [(x.p, y.p) for x, y in zip(a.nodes, b.nodes)] + [(x.q, y.q) for x, y in zip(a.nodes, b.nodes)]
        pairs += [(x.p_after, y.p_after) for x, y in zip(a.tree.updates, b.tree.updates)]
        pairs += [(a.tree.final_p, b.tree.final_p), (a.residual, b.residual), (a.bonus_p, b.bonus_p)]
        for x, y in zip(a.tree.updates, b.tree.updates):
            assert x.mass == pytest.approx(y.mass, abs=1e-12)
        for kept, dense in pairs:
            assert (kept is None) == (dense is None)
            if kept is None:
                continue
            assert isinstance(kept, TopDistribution) and isinstance(dense, np.ndarray)
            ids = kept.known_ids
            np.testing.assert_allclose([kept[int(i)] for i in ids], dense[ids], rtol=0, atol=1e-12)
            assert kept.stats.support == int(np.count_nonzero(dense))
            assert kept.stats.total == pytest.approx(float(dense.sum()), abs=1e-12)
            compared += 1
        for x, y in zip(a.nodes, b.nodes):
            assert (x.status, x.u, x.target_argmax) == (y.status, y.u, y.target_argmax)
            assert x.p_token == pytest.approx(y.p_token, abs=1e-12)
    assert compared > 20
    if not sampling.greedy:
        assert any(r.tree.updates for r in top.rounds), "no rejection: the residual updates went unexercised"
    assert check_report(top.config, top.rounds).findings == []
    assert check_report(full.config, full.rounds).findings == []


def test_top_children_on_the_device_match_a_stable_descending_sort():
    """The draft's top-k children from a device row: the numpy reference's order (ties by the
    lower token id), including ties across the k-th entry and rows with few nonzeros."""
    from specscope.core.draft.tree_draft import choose_children

    rng = np.random.default_rng(0)
    for trial in range(400):
        vocab = int(rng.choice([5, 17, 600, 5000]))
        q = rng.random(vocab)
        if trial % 4 == 1:
            q = np.round(q * 4) / 4  # heavy ties
        elif trial % 4 == 2:
            q[rng.random(vocab) < 0.8] = 0
        elif trial % 4 == 3:
            q = np.zeros(vocab)
            q[rng.integers(0, vocab, 3)] = 0.5
        count = int(rng.integers(1, 8))
        want = [int(t) for t in np.argsort(-q, kind="stable")[:count] if q[t] > 0]
        assert choose_children("topk", torch.from_numpy(q), count, False, rng)[0] == want
