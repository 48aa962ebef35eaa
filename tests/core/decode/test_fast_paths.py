"""The decoder's fast paths compute exactly what the straightforward code computes.

Greedy drafting keeps the argmax on the device and checks finiteness once per round;
CachedLM passes explicit position ids and accepts a token tensor. None of this may change a
token, a distribution or a cache length.
"""

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.decode.kv import CachedLM
from tests.tiny_models import ARCHITECTURES, noisy_copy, tiny_lm


class StepwiseGreedyProposer(DraftModelProposer):
    """The reference greedy draft: one feed, one finite check and one int() per step, and the
    confidence as a softmax entry."""

    def _propose_greedy(self, feed, k):
        tokens, confidence = [], []
        for _ in range(k):
            logits = self.lm.feed(feed, keep=1)[0]
            assert bool(torch.isfinite(logits).all())
            token = int(torch.argmax(logits))
            tokens.append(token)
            confidence.append(float(torch.softmax(logits.double(), dim=-1)[token]))
            feed = [token]
        return tokens, confidence


def _round_fields(r):
    return (
        r.tokens,
        r.k,
        r.rejected_node,
        r.bonus_withheld,
        r.eos,
        r.draft_forwards,
        (r.target_cache.before, r.target_cache.peak, r.target_cache.after, r.target_cache.pending),
        (r.draft_cache.before, r.draft_cache.peak, r.draft_cache.after, r.draft_cache.pending),
        [(n.token, n.status, n.target_argmax, n.p_token, n.q, n.u) for n in r.nodes],
    )


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_draft_fast_path_gives_identical_records(arch, k):
    target = tiny_lm(arch, seed=0, init_range=0.3)
    draft = noisy_copy(target, 0.3)
    fast = SpeculativeDecoder(target, DraftModelProposer(draft), k=k, sampling=SamplingConfig(temperature=0.0))
    ref = SpeculativeDecoder(target, StepwiseGreedyProposer(draft), k=k, sampling=SamplingConfig(temperature=0.0))
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    a, b = fast.generate(prompt, 40), ref.generate(prompt, 40)
    assert a.new_tokens == b.new_tokens
    assert len(a.rounds) == len(b.rounds)
    for ra, rb in zip(a.rounds, b.rounds):
        assert _round_fields(ra) == _round_fields(rb)
        for na, nb in zip(ra.nodes, rb.nodes):
            assert na.p.dtype == np.float64 and na.p.shape == (target.config.vocab_size,)
            assert np.array_equal(na.p, nb.p)
            assert na.confidence == pytest.approx(nb.confidence, rel=1e-5) and 0 < na.confidence <= 1
    # k draft forwards per round and one target forward: no extra pass anywhere.
    assert fast.proposer.lm.forwards == sum(r.draft_forwards for r in a.rounds)
    assert fast.target_lm.forwards == len(a.rounds)


def test_greedy_draft_fast_path_still_refuses_non_finite_logits():
    broken = tiny_lm("llama", seed=0)
    with torch.no_grad():
        broken.lm_head.weight[3, 0] = float("nan")
    proposer = DraftModelProposer(broken)
    with pytest.raises(ValueError, match="non-finite"):
        proposer.propose([1, 2, 3], 3, SamplingConfig(temperature=0.0), np.random.default_rng(0))


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_cached_lm_logits_equal_a_plain_model_call(arch):
    """Explicit position ids and tensor input change nothing, bit for bit."""
    model = tiny_lm(arch, seed=1, init_range=0.3)
    lm = CachedLM(model)
    sequence = [5, 7, 11, 13, 17, 19, 23, 29, 31, 37]
    lm.feed(sequence[:6], keep=1)
    lm.feed(torch.tensor(sequence[6:8]), keep=2)
    got = lm.feed(sequence[8:], keep=2)
    with torch.inference_mode():
        want = model(torch.tensor([sequence])).logits[0, -2:].float()
    assert torch.allclose(got, want, atol=1e-5)
    # and bitwise equal to the same incremental computation without explicit positions
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.tensor([sequence[:6]]), cache=cache, use_cache=True)
        model(input_ids=torch.tensor([sequence[6:8]]), cache=cache, use_cache=True)
        plain = model(input_ids=torch.tensor([sequence[8:]]), cache=cache, use_cache=True, logits_to_keep=2).logits[0]
    assert torch.equal(got, plain.float())
    assert lm.processed == len(sequence)


def test_cached_lm_positions_grow_past_the_preallocated_range():
    model = tiny_lm("llama", seed=2)
    lm = CachedLM(model)
    sequence = list(np.random.default_rng(0).integers(0, 64, size=300))
    lm.feed(sequence[:290], keep=1)
    got = lm.feed(sequence[290:], keep=3)
    with torch.inference_mode():
        want = model(torch.tensor([sequence])).logits[0, -3:].float()
    assert torch.allclose(got, want, atol=1e-5)
