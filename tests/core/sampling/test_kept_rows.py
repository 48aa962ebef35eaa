"""A top-k row on the CPU as its kept entries (core.sampling.kept_rows) equals the numpy reference.

The kept path is what the decoder runs for every draft and target row of a top-k run at a
real vocabulary on the CPU, so it must give core.sampling's distribution (same support,
values to rounding), the same argmax, the same inverse-CDF draw, and hand back to the
general path exactly where that one decides differently (ties at the k-th logit,
non-finite logits); and a decoder with it must emit what one without it emits.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.draft import proposers
from specscope.core.draft.proposers import sample_token
from specscope.core.sampling import device as device_sampling
from specscope.core.sampling import kept_rows
from specscope.core.sampling.kept_rows import applies, draw_kept, kept_row
from specscope.core.sampling.reference import process_logits, sample_from
from tests.tiny_models import noisy_copy, tiny_lm

VOCAB = 40_000  # above row_ops.MIN_VOCAB, not a multiple of the chunk (64)
CONFIGS = [
    SamplingConfig(temperature=1.0, top_k=50, top_p=0.9),
    SamplingConfig(temperature=0.7, top_k=1),
    SamplingConfig(temperature=1.6, top_k=150),  # near the widest the chunks take at this vocabulary (156)
    SamplingConfig(temperature=0.05, top_k=40, top_p=0.5),
    SamplingConfig(temperature=1.0, top_k=8, top_p=0.3),
]


def logits_of(seed: int, rows: int = 3, vocab: int = VOCAB, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * scale


def assert_equals_reference(rows, logits: torch.Tensor, config: SamplingConfig) -> None:
    reference = process_logits(logits.numpy(), config)
    for row, want, raw in zip(rows, reference, logits.numpy()):
        got = np.zeros(logits.shape[-1])
        got[row.ids] = row.probs
        assert np.array_equal(np.flatnonzero(got), np.flatnonzero(want))  # the same support, exactly
        assert np.abs(got - want).max() < 1e-12
        assert list(row.ids) == sorted(row.ids)
        assert row.argmax == int(np.argmax(raw))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.describe())
@pytest.mark.parametrize("seed", [0, 1])
def test_kept_rows_equal_the_numpy_reference(config, seed):
    logits = logits_of(seed)
    assert applies(logits, config)
    rows = kept_rows.kept_rows(logits, config)
    assert rows is not None
    assert_equals_reference(rows, logits, config)


TORCH_TOPK = torch.topk


def topk_with_ties_shuffled(seed: int):
    """torch.topk, with equal values returned in a random order (torch sets no order)."""
    rng = np.random.default_rng(seed)

    def topk(values, k, dim=-1):
        top = TORCH_TOPK(values, k, dim=dim)
        v, i = top.values.numpy(), top.indices.numpy()
        order = np.lexsort((rng.random(v.shape), -v), axis=-1)
        return torch.return_types.topk(
            (torch.from_numpy(np.take_along_axis(v, order, -1)), torch.from_numpy(np.take_along_axis(i, order, -1)))
        )

    return topk


@pytest.mark.parametrize("tie_order", [None, 0, 1, 2, 3])
def test_equal_probabilities_at_the_top_p_cut_are_kept_by_ascending_id(tie_order, monkeypatch):
    if tie_order is not None:  # whatever order topk gives equal values in
        monkeypatch.setattr(kept_rows.torch, "topk", topk_with_ties_shuffled(tie_order))
    logits = torch.full((VOCAB,), -5.0)
    logits[[30_001, 7, 12_345, 999]] = 2.0  # tied among the kept: the cut must take the lowest ids first
    logits[20_000] = 1.0
    config = SamplingConfig(temperature=1.0, top_k=5, top_p=0.4)
    row = kept_row(logits, config)
    assert row is not None
    assert list(row.ids) == [7, 999]
    assert_equals_reference([row], logits.reshape(1, -1), config)
    assert row.argmax == 7  # the first maximal logit


def test_entries_that_underflow_at_a_low_temperature_are_not_kept():
    logits = torch.full((VOCAB,), -10.0)
    logits[[5, 70, 39_999]] = torch.tensor([5.0, 4.9, -5.0])  # exp(-1000) is 0 in float64
    config = SamplingConfig(temperature=0.01, top_k=3)
    row = kept_row(logits, config)
    assert list(row.ids) == [5, 70]
    assert_equals_reference([row], logits.reshape(1, -1), config)


def test_a_tie_at_the_kth_logit_goes_to_the_general_path_which_keeps_every_tied_token():
    logits = logits_of(3, rows=1)[0]
    order = torch.argsort(logits, descending=True)
    logits[order[4]] = logits[order[3]]  # the 4th and 5th largest tie: top-k 4 keeps both
    config = SamplingConfig(temperature=1.0, top_k=4)
    assert kept_row(logits, config) is None
    q = torch.empty(VOCAB, dtype=torch.float64)
    token, dist, _, *kept = sample_token(logits, config, np.random.default_rng(0), out=q)
    assert not kept  # the general path hands no kept entries back
    assert int((dist > 0).sum()) == 5
    assert np.abs(dist.numpy() - process_logits(logits.numpy(), config)).max() < 1e-12


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_logits_are_refused(bad):
    logits = logits_of(4, rows=1)[0]
    logits[33_333] = bad
    config = SamplingConfig(temperature=1.0, top_k=50)
    assert kept_row(logits, config) is None
    with pytest.raises(ValueError, match="non-finite"):
        sample_token(logits, config, np.random.default_rng(0))


def test_draws_equal_the_reference_draw_on_the_dense_row():
    config = SamplingConfig(temperature=1.0, top_k=30, top_p=0.95)
    row = kept_row(logits_of(5, rows=1)[0], config)
    dense = np.zeros(VOCAB)
    dense[row.ids] = row.probs
    us = np.concatenate([np.random.default_rng(0).random(2000), [0.0, 1 - 2**-53], np.cumsum(row.probs)[:-1]])
    assert [draw_kept(row, float(u)) for u in us] == [sample_from(dense, float(u)) for u in us]


def test_where_the_kept_path_does_not_apply():
    logits = logits_of(6, rows=1)[0]
    assert not applies(logits, SamplingConfig(temperature=1.0))  # no top-k: dense rows
    assert not applies(logits, SamplingConfig(temperature=0.0, top_k=5))  # greedy
    assert not applies(logits[:1000], SamplingConfig(temperature=1.0, top_k=5))  # small vocabulary
    assert not applies(logits.double(), SamplingConfig(temperature=1.0, top_k=5))
    assert not applies(logits, SamplingConfig(temperature=1.0, top_k=VOCAB // 100))  # too wide for chunks
    assert not applies(logits, SamplingConfig(temperature=1e-300, top_k=5))  # would overflow float64


def test_the_draft_step_hands_back_q_in_its_row_with_the_kept_entries():
    config = SamplingConfig(temperature=0.8, top_k=20, top_p=0.9)
    logits = logits_of(7, rows=1)[0]
    out = torch.full((VOCAB,), 7.0, dtype=torch.float64)  # stale values: the step must clear them
    token, q, u, kept = sample_token(logits, config, np.random.default_rng(1), out=out)
    assert q.data_ptr() == out.data_ptr()
    want = process_logits(logits.numpy(), config)
    assert np.abs(q.numpy() - want).max() < 1e-12
    assert np.array_equal(np.flatnonzero(q.numpy()), kept.ids)
    assert token == sample_from(q.numpy(), u)


@pytest.fixture(scope="module")
def big_pair():
    target = tiny_lm("llama", vocab=VOCAB, seed=0, hidden=16, layers=1, init_range=0.5)
    return target, noisy_copy(target, 0.3)


def _run(pair, config, seed, vectors="top"):
    target, draft = pair
    dec = SpeculativeDecoder(target, DraftModelProposer(draft), k=3, sampling=config, seed=seed, vectors=vectors)
    return dec.generate([1, 2, 3], 12)


@pytest.mark.parametrize("config", CONFIGS[:3], ids=lambda c: c.describe())
def test_a_decoder_on_the_kept_path_emits_and_records_what_the_general_path_does(big_pair, config, monkeypatch):
    fast = [_run(big_pair, config, seed) for seed in range(3)]
    monkeypatch.setattr(proposers, "applies", lambda *a: False)
    monkeypatch.setattr(device_sampling, "applies", lambda *a: False)
    slow = [_run(big_pair, config, seed) for seed in range(3)]
    for a, b in zip(fast, slow):
        assert a.new_tokens == b.new_tokens
        for ra, rb in zip(a.rounds, b.rounds):
            assert [n.status for n in ra.nodes] == [n.status for n in rb.nodes]
            for na, nb in zip(ra.nodes, rb.nodes):
                assert na.target_argmax == nb.target_argmax
                for x, y in ((na.p, nb.p), (na.q, nb.q)):
                    assert np.array_equal(x.top[0], y.top[0]) and np.abs(x.top[1] - y.top[1]).max() < 1e-12
                    assert x.stats.support == y.stats.support and x.stats.minimum == y.stats.minimum
                assert abs(na.overlap - nb.overlap) < 1e-12


def test_a_tree_decoder_on_the_kept_path_emits_what_the_general_path_does(big_pair, monkeypatch):
    target, draft = big_pair
    config = SamplingConfig(temperature=1.0, top_k=20, top_p=0.9)

    def run(seed):
        proposer = DraftModelProposer(draft, tree="2,2,1", children="sampled")
        dec = SpeculativeDecoder(target, proposer, k=3, sampling=config, seed=seed, vectors="top")
        result = dec.generate([1, 2, 3], 10)
        return result.new_tokens, [[n.target_argmax for n in r.nodes] for r in result.rounds]

    fast = [run(seed) for seed in range(3)]
    monkeypatch.setattr(device_sampling, "applies", lambda *a: False)
    assert [run(seed) for seed in range(3)] == fast
