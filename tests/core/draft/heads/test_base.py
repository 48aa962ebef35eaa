"""The head layer's parts that a draft step runs hundreds of times a run (core/draft/heads/base.py):
the cache that grows in place, the rotary table looked up instead of recomputed, the one-op
RMSNorm and the unmasked single query. Each must give what the plain computation gives, to the
bit where the plain computation is the same arithmetic."""

from __future__ import annotations

import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

from specscope.core.draft.heads.base import HeadAttention, HeadKV, HeadNorm, RecurrentHead
from specscope.core.draft.heads.trees import TreeAttention

CONFIG = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)


def test_the_cache_appends_in_place_and_crops_like_a_concatenation():
    torch.manual_seed(0)
    kv, keys, values = HeadKV(), torch.zeros(1, 2, 0, 8), torch.zeros(1, 2, 0, 8)
    buffers = set()
    for step, (n, cut) in enumerate([(5, None), (1, None), (1, 4), (3, None), (70, None), (1, 60), (1, None)]):
        if cut is not None:
            kv.crop(cut)
            keys, values = keys[:, :, :cut], values[:, :, :cut]
        k, v = torch.randn(1, 2, n, 8), torch.randn(1, 2, n, 8)
        got_k, got_v = kv.append(k, v)
        keys, values = torch.cat([keys, k], dim=2), torch.cat([values, v], dim=2)
        assert torch.equal(got_k, keys) and torch.equal(got_v, values), step
        assert kv.length == keys.shape[2] and torch.equal(kv.keys, keys) and torch.equal(kv.values, values)
        buffers.add(got_k.data_ptr())
    assert len(buffers) == 2  # one buffer until 70 entries outgrew it: appends write in place
    kv.crop(0)
    assert kv.length == 0 and kv.keys.shape[2] == 0


class _Head(RecurrentHead):
    pass


def test_the_rotary_table_gives_what_the_rotary_embedding_gives_at_every_position():
    head, rope = _Head(CONFIG), LlamaRotaryEmbedding(CONFIG)
    like = torch.zeros(1, 1, 64)
    with torch.inference_mode():
        for start, n in [(0, 7), (250, 12), (3, 1), (600, 1), (0, 300)]:  # across the table's growth
            cos, sin = head.positions(start, n, like)
            want_cos, want_sin = rope(like, torch.arange(start, start + n)[None])
            assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin), (start, n)
        at = TreeAttention(positions=torch.tensor([40, 41, 41, 42, 900]), allowed=torch.ones(5, 5, dtype=torch.bool))
        cos, sin = head.positions(0, 5, like, at)
        want_cos, want_sin = rope(like, at.positions[None])
        assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    # with gradients (training) the embedding itself is called: no inference tensor is kept
    cos, _ = head.positions(5, 3, like.requires_grad_())
    assert not cos.is_inference()


def test_head_norm_is_llamas_rms_norm():
    torch.manual_seed(1)
    ours, theirs = HeadNorm(64, eps=1e-5), LlamaRMSNorm(64, eps=1e-5)
    weight = torch.randn(64)
    ours.weight.data.copy_(weight)
    theirs.weight.data.copy_(weight)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    for x in (torch.randn(1, 1, 64), 30 * torch.randn(3, 9, 64)):
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-6, atol=1e-6)
    mixed = torch.randn(2, 5, 64).bfloat16()  # autocast hands a bfloat16 input to a float32 weight
    assert torch.equal(ours(mixed), theirs(mixed))


def test_a_single_new_entry_without_a_mask_attends_like_the_causal_mask():
    torch.manual_seed(2)
    attention = HeadAttention(CONFIG, width=64).eval()
    head = _Head(CONFIG)
    history, one = torch.randn(1, 6, 64), torch.randn(1, 1, 64)
    unmasked, masked = HeadKV(), HeadKV()
    with torch.inference_mode():
        for kv in (unmasked, masked):
            attention(history, head.positions(0, 6, history), kv)
        fast = attention(one, head.positions(6, 1, one), unmasked)
        full = attention(one, head.positions(6, 1, one), masked, torch.ones(1, 7, dtype=torch.bool))
    torch.testing.assert_close(fast, full, rtol=1e-6, atol=1e-6)
    assert not torch.equal(fast, attention(one, head.positions(6, 1, one), HeadKV()))  # the history counts
