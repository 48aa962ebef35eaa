"""KV-cache rollback: at every round the cached computation equals a full recompute."""

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from specscope.core import DraftModelProposer, PromptLookupProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.decode.kv import CachePolicy
from tests.tiny_models import ARCHITECTURES, noisy_copy, tiny_lm


class RecordingPolicy(CachePolicy):
    """The default cache policy, noting the context each target forward starts from."""

    def __init__(self):
        self.contexts: list[list[int]] = []

    def pending(self, lm, context):
        self.contexts.append(list(context))
        return super().pending(lm, context)


def RecordingDecoder(*args, **kwargs):
    """A decoder that keeps every verify forward's input sequence and logits: the sequence is
    the context its cache policy was asked about plus the draft it fed, the logits are what
    the target's forward returned."""
    policy = RecordingPolicy()
    dec = SpeculativeDecoder(*args, target_cache=policy, **kwargs)
    dec.verified = []
    feed = dec.target_lm.feed

    def recording_feed(tokens, keep):
        logits = feed(tokens, keep)
        draft = list(tokens)[len(tokens) - (keep - 1) :] if keep > 1 else []
        dec.verified.append((policy.contexts[-1] + draft, logits.cpu().numpy()))
        return logits

    dec.target_lm.feed = recording_feed
    return dec


def full_logits(model, sequence, keep):
    with torch.inference_mode():
        return model(torch.tensor([sequence])).logits[0, -keep:].float().numpy()


def fresh_keys(model, prefix):
    """Layer-0 keys of a cache filled by one forward over `prefix` from scratch."""
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(torch.tensor([prefix]), cache=cache, use_cache=True)
    return cache.layers[0].keys


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cached_logits_equal_full_recompute_at_every_round(arch, temperature):
    target = tiny_lm(arch, seed=3, init_range=0.3)
    draft = noisy_copy(target, 0.2 if temperature else 0.05)
    dec = RecordingDecoder(
        target, DraftModelProposer(draft), k=4, sampling=SamplingConfig(temperature=temperature), seed=5
    )
    prompt = [3, 9, 27, 17, 51, 25]
    context = list(prompt)
    seen = []
    for rnd in dec.rounds(prompt, max_new_tokens=60):
        sequence, logits = dec.verified[rnd.index]
        assert sequence[: len(context)] == context
        np.testing.assert_allclose(logits, full_logits(target, sequence, len(logits)), atol=1e-4, rtol=0)

        context += rnd.tokens
        committed = rnd.prefix_len + rnd.accepted
        # The recorded lengths are the cache objects' own, and they match the contract.
        assert rnd.target_cache.after == dec.target_lm.processed == committed
        assert rnd.target_cache.pending == tuple(context[committed:])
        assert rnd.target_cache.peak == len(sequence)
        assert rnd.draft_cache.after == dec.proposer.lm.processed == min(committed, rnd.draft_cache.peak)
        assert rnd.draft_cache.pending == tuple(context[rnd.draft_cache.after :])
        # Nothing of a rejected suffix survives: the cache equals a fresh prefix forward.
        kept = dec.target_lm.cache.layers[0].keys
        torch.testing.assert_close(kept, fresh_keys(target, context[:committed]), atol=1e-5, rtol=0)
        draft_kept = dec.proposer.lm.cache.layers[0].keys
        torch.testing.assert_close(draft_kept, fresh_keys(draft, context[: rnd.draft_cache.after]), atol=1e-5, rtol=0)
        seen.append(rnd)
    assert len(seen) >= 10
    # Both rollback (a rejection) and a multi-token accept were exercised.
    assert any(r.rejected_node is not None and r.draft_cache.cropped > 0 for r in seen)
    assert any(r.accepted >= 2 for r in seen)


def test_prompt_lookup_rounds_keep_the_target_cache_consistent():
    target = tiny_lm("llama", seed=4, init_range=0.3)
    dec = RecordingDecoder(target, PromptLookupProposer(), k=3, sampling=SamplingConfig(temperature=1.0), seed=2)
    prompt = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2]
    context = list(prompt)
    for rnd in dec.rounds(prompt, max_new_tokens=30):
        sequence, logits = dec.verified[rnd.index]
        np.testing.assert_allclose(logits, full_logits(target, sequence, len(logits)), atol=1e-4, rtol=0)
        context += rnd.tokens
        assert rnd.target_cache.after == rnd.prefix_len + rnd.accepted
        assert rnd.draft_cache is None


def test_no_cache_mode_matches_cached_mode():
    target = tiny_lm("llama", seed=6, init_range=0.3, dtype=torch.float64)
    draft = noisy_copy(target, 0.05)
    prompt = [7, 8, 9, 10]
    cached = SpeculativeDecoder(target, DraftModelProposer(draft), k=3, sampling=SamplingConfig(temperature=0))
    uncached = SpeculativeDecoder(
        target, DraftModelProposer(draft), k=3, sampling=SamplingConfig(temperature=0), use_cache=False
    )
    a = cached.generate(prompt, 30)
    b = uncached.generate(prompt, 30)
    assert a.new_tokens == b.new_tokens
    assert all(r.target_cache.after == 0 for r in b.rounds)
