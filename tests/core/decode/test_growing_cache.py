"""core.decode.kv.GrowingLayer: the decoder's KV cache layers append into buffers that grow by
doubling, instead of transformers' torch.cat of the whole cache on every forward. The
logits must be those of transformers' own DynamicCache through any feeds and crops, and an
append must not copy what is already cached."""

import pytest
import torch
from transformers import DynamicCache

from specscope.core.decode.kv import CachedLM, GrowingLayer
from tests.tiny_models import tiny_lm


def feeds_and_crops(lm: CachedLM) -> list[torch.Tensor]:
    """A speculative-decoding-like schedule: prefill, multi-token feeds, crops, refeeds."""
    g = torch.Generator().manual_seed(0)
    out = []
    lm.reset()
    out.append(lm.feed(torch.randint(0, 64, (9,), generator=g).tolist(), keep=3))
    for step in range(40):
        n = 1 + step % 5
        out.append(lm.feed(torch.randint(0, 64, (n,), generator=g).tolist(), keep=n))
        if step % 3 == 2:
            lm.crop(lm.processed - (1 + step % 4))
    return out


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_growing_layers_give_the_logits_of_transformers_dynamic_cache(arch):
    model = tiny_lm(arch, vocab=64, seed=3, dtype=torch.float64)
    growing = CachedLM(model)
    assert all(isinstance(layer, GrowingLayer) for layer in growing.cache.layers)
    plain = CachedLM(model)
    plain.reset = lambda: setattr(plain, "cache", DynamicCache(config=model.config))  # transformers' own layers
    for a, b in zip(feeds_and_crops(growing), feeds_and_crops(plain)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert growing.processed == plain.processed


def test_an_append_copies_only_the_new_positions():
    model = tiny_lm("llama", vocab=64, seed=1)
    lm = CachedLM(model)
    lm.feed(list(range(10)), keep=1)
    layer = lm.cache.layers[0]
    buffer = layer.keys.data_ptr()
    for t in range(40):  # within the first buffer's capacity (64): no reallocation
        lm.feed([t % 64], keep=1)
    assert layer.keys.data_ptr() == buffer and layer.keys.shape[-2] == 50
    lm.crop(20)
    assert layer.keys.shape[-2] == 20 and layer.keys.data_ptr() == buffer
    lm.feed(list(range(60)), keep=1)  # past the capacity: one larger buffer, the 20 kept positions moved
    assert layer.keys.shape[-2] == 80 and layer.keys.data_ptr() != buffer


def test_a_layer_whose_keys_were_replaced_rebuilds_its_buffers():
    """DynamicLayer methods such as a beam reorder assign new tensors to keys/values; the next
    append must start from those, not from the stale buffer."""
    model = tiny_lm("llama", vocab=64, seed=2, dtype=torch.float64)
    lm, ref = CachedLM(model), CachedLM(model)
    ref.reset = lambda: setattr(ref, "cache", DynamicCache(config=model.config))
    ref.reset()
    for cached in (lm, ref):
        cached.feed(list(range(12)), keep=1)
        for layer in cached.cache.layers:
            layer.keys, layer.values = layer.keys * 1.5, layer.values * 0.5  # new tensors, other values
    torch.testing.assert_close(lm.feed([5, 6], keep=2), ref.feed([5, 6], keep=2), rtol=1e-12, atol=1e-12)
