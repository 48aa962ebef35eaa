"""Tree forwards on a CachedLM, and keeping exactly the accepted path in its KV cache.

`masked_feed` runs one forward with explicit positions and an additive 4D mask (transformers
returns a 4D mask as it is, for eager and SDPA attention alike). `keep_positions` gathers
the cache rows of the accepted path by index; for a cache whose layers cannot be gathered
(anything but plain full-attention layers) it reports False, and the caller crops to the prefix so
the path is recomputed as pending tokens instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from specscope.core.decode.kv import PLAIN_LAYERS, CachedLM
from specscope.core.draft.trees import additive_mask


def model_dtype(lm: CachedLM) -> torch.dtype:
    return next(lm.model.parameters()).dtype


@torch.inference_mode()
def masked_feed(lm: CachedLM, tokens: Sequence[int], positions: Sequence[int], allowed: np.ndarray,
                keep: int) -> torch.Tensor:
    """Append `tokens` at `positions` after what the cache holds, each row attending the
    columns `allowed` (rows: tokens; columns: cached positions then tokens). Returns the
    (keep, V) float32 logits of the last `keep` tokens, on the model's device."""
    n = len(tokens)
    cached = lm.processed
    if allowed.shape != (n, cached + n):
        raise RuntimeError(f"tree mask of shape {allowed.shape} for {n} tokens after {cached} cached")
    ids = torch.tensor([list(tokens)], dtype=torch.long, device=lm.device)
    pos = torch.tensor([list(positions)], dtype=torch.long, device=lm.device)
    mask = additive_mask(allowed, model_dtype(lm), lm.device)
    started = lm.stopwatch.now()
    out = lm.model(input_ids=ids, cache=lm.cache, use_cache=lm.use_cache, attention_mask=mask, position_ids=pos,
                   logits_to_keep=keep)
    logits = out.logits[0, -keep:].float()
    lm.forward_s += lm.stopwatch.now() - started
    lm.forwards += 1
    return logits


def keep_positions(lm: CachedLM, prefix_len: int, rows: Sequence[int]) -> bool:
    """Keep the first `prefix_len` cache positions and then the cache rows `rows` (in that
    order); drop the rest. False when the cache cannot be gathered (nothing changed)."""
    cache = lm.cache
    if cache is None:
        return True
    if not all(type(layer) in PLAIN_LAYERS for layer in cache.layers):
        return False
    rows = list(rows)
    index = torch.tensor(rows, dtype=torch.long, device=lm.device)
    end = prefix_len + len(rows)
    with torch.inference_mode():  # the cache's tensors are inference tensors
        for layer in cache.layers:
            if not (layer.is_initialized and layer.keys.numel()):
                continue
            # only the path's rows move (O(path), not O(context)): gather them, cut the
            # cache after the prefix + path, write them in place behind the prefix
            keys = layer.keys.index_select(-2, index.to(layer.keys.device))
            values = layer.values.index_select(-2, index.to(layer.values.device))
            layer.keys = layer.keys[..., :end, :]
            layer.values = layer.values[..., :end, :]
            layer.keys[..., prefix_len:end, :] = keys
            layer.values[..., prefix_len:end, :] = values
    return True
