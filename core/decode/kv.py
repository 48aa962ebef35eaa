"""A causal LM together with its KV cache and the bookkeeping of what the cache holds.

`processed` is the number of leading context tokens whose keys/values are in the cache; the
rest of the context is pending and is fed on the next forward. Lengths are always read
from the cache object, never tracked on the side, so a crop that went wrong shows up.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from typing import Any, cast

import torch
from transformers import DynamicCache, PretrainedConfig
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer


def model_vocab_size(model: torch.nn.Module) -> int:
    """Width of the model's logits (may exceed the tokenizer's length when padded)."""
    # a transformers model's methods and config: nn.Module types attribute access Tensor | Module
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if get_head is not None else None
    if head is not None and hasattr(head, "weight"):
        return int(head.weight.shape[0])
    return int(cast(PretrainedConfig, model.config).get_text_config().vocab_size)


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


class Stopwatch:
    """perf_counter timing that waits for queued CUDA work, so GPU time lands where it ran."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()


class CachedLM:
    """Runs a transformers causal LM incrementally over a growing (and shrinking) context."""

    def __init__(self, model: torch.nn.Module, use_cache: bool = True):
        self.model = model
        self.use_cache = use_cache
        self.device = model_device(model)
        self.vocab_size = model_vocab_size(model)
        self.cache: DynamicCache | None = None
        self.stopwatch = Stopwatch(self.device)
        self.forwards = 0
        self.forward_s = 0.0  # time spent inside model forwards since the last reset
        # The hidden-state indices a draft head reads (core.draft.proposers: target_features):
        # only then does a forward ask the model for its hidden states, and `features` keeps
        # those layers of the last forward alone, (n fed, layers, H), until they are taken.
        self.hidden_layers: tuple[int, ...] = ()
        self.features: torch.Tensor | None = None
        # Explicit positions when the model takes them: the same values the model would
        # derive from the cache length itself, sliced from one preallocated arange.
        try:
            takes_positions = "position_ids" in inspect.signature(model.forward).parameters
        except (TypeError, ValueError):
            takes_positions = False
        self._positions: torch.Tensor | None = None
        if takes_positions and use_cache:
            self._positions = torch.arange(256, dtype=torch.long, device=self.device)
        self.reset()

    def reset(self) -> None:
        self.cache = growing_cache(cast(PretrainedConfig, self.model.config)) if self.use_cache else None
        self.forwards = 0
        self.forward_s = 0.0

    @property
    def processed(self) -> int:
        """Tokens held by the cache object (0 when running without a cache)."""
        return self.cache.get_seq_length() if self.cache is not None else 0

    def forward(self, context: Sequence[int], keep: int) -> torch.Tensor:
        """Process the pending part of `context`; return logits of its last `keep` positions.

        Returns a (keep, V) float32 tensor on the model's device.
        """
        return self.feed(CachePolicy().pending(self, context), keep)

    def _position_ids(self, start: int, n: int) -> torch.Tensor:
        """(1, n) positions start .. start + n - 1 (a view of a preallocated arange)."""
        end = start + n
        if self._positions is None or end > self._positions.numel():
            size = max(end, 2 * self._positions.numel() if self._positions is not None else 256)
            self._positions = torch.arange(size, dtype=torch.long, device=self.device)
        return self._positions[start:end].unsqueeze(0)

    @torch.inference_mode()
    def feed(
        self,
        tokens: Sequence[int] | torch.Tensor,
        keep: int,
        positions: Sequence[int] | None = None,
        attention_mask: torch.Tensor | dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Append `tokens` after whatever the cache holds; logits of the last `keep` of them.

        `tokens` is a sequence of ids or a 1-D LongTensor already on the model's device (a
        draft token fed back without a host round trip). A tree's nodes are fed with their
        own `positions` and an additive 4D `attention_mask` (core.decode.layout.masked_feed
        builds it; transformers uses a 4D mask as it is).
        """
        if isinstance(tokens, torch.Tensor):
            ids = tokens.view(1, -1)
        else:
            ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)
        n = ids.shape[1]
        if keep > n:
            raise RuntimeError(f"asked for {keep} logits but only {n} positions are pending")
        kwargs: dict[str, object] = {}
        if positions is not None:
            kwargs["position_ids"] = torch.tensor([list(positions)], dtype=torch.long, device=self.device)
        elif self._positions is not None and self.cache is not None:
            kwargs["position_ids"] = self._position_ids(self.cache.get_seq_length(), n)
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
        started = self.stopwatch.now()
        out = self.model(
            input_ids=ids,
            cache=self.cache,
            use_cache=self.use_cache,
            logits_to_keep=keep,
            **self.hidden_kwargs(),
            **kwargs,
        )
        self.keep_features(out)
        logits: torch.Tensor = out.logits[0, -keep:]
        if logits.dtype != torch.float32:
            logits = logits.float()
        self.forward_s += self.stopwatch.now() - started
        self.forwards += 1
        return logits

    def hidden_kwargs(self) -> dict[str, bool]:
        """What a forward passes for the features a head asked for: nothing when none did."""
        return {"output_hidden_states": True} if self.hidden_layers else {}

    def keep_features(self, out: Any) -> None:  # a transformers ModelOutput
        """Keep the asked-for layers of a forward's hidden states (the others are dropped
        with the output): (n fed, layers, H), on the model's device."""
        if self.hidden_layers:
            states = out.hidden_states
            self.features = torch.stack([states[i][0] for i in self.hidden_layers], dim=1)

    def take_features(self, rows: Sequence[int]) -> torch.Tensor:
        """The kept features of the fed positions `rows` (indices into the last forward's
        inputs); the rest are released."""
        if self.features is None:
            raise RuntimeError("no features were kept: the last forward asked for no hidden states")
        index = torch.as_tensor(list(rows), dtype=torch.long, device=self.features.device)
        taken, self.features = self.features.index_select(0, index), None
        return taken

    def crop(self, length: int) -> None:
        """Drop cached positions beyond `length` (keeps what is already shorter)."""
        if self.cache is None:
            return
        excess = self.processed - length
        if excess > 0:
            self.cache.crop(-excess)


class CachePolicy:
    """How a CachedLM's cache follows the committed context: the decoder's seam for caches.

    The decoder asks `pending()` which context tokens to feed before a forward, and calls
    `crop()` after verification with the number of context positions whose entries stay
    valid. The fault zoo wraps this object to inject rollback bugs; a correct decoder uses
    it as it is.
    """

    def pending(self, lm: CachedLM, context: Sequence[int]) -> list[int]:
        """The context tokens the cache has not processed yet (at least one)."""
        if not lm.use_cache:
            return list(context)
        start = lm.processed
        if start >= len(context):
            raise RuntimeError(
                f"cache holds {start} tokens but the context has only {len(context)}: nothing to process"
            )
        return list(context[start:])

    def crop(self, lm: CachedLM, committed: int) -> None:
        """Keep the first `committed` positions: the accepted prefix."""
        lm.crop(committed)


class GrowingLayer(DynamicLayer):
    """transformers' DynamicLayer with its keys and values kept as views of buffers that
    grow by doubling. DynamicLayer appends with torch.cat, which copies the whole cache on
    every forward: O(context) per round, so a long run's rounds slow down as it grows. Here
    a forward copies only its new positions (the buffers are reallocated O(log n) times), and
    a crop only shortens the views; the next forward overwrites what was cropped."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # transformers' DynamicLayer.__init__(**kwargs) is unannotated

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.get_seq_length()
        end = length + key_states.shape[-2]
        if not self._holds(key_states, value_states, end):
            self._grow(key_states, value_states, length, end)
        key_buffer = cast(torch.Tensor, self._key_buffer)  # _holds found them, or _grow made them
        value_buffer = cast(torch.Tensor, self._value_buffer)
        key_buffer[..., length:end, :].copy_(key_states)
        value_buffer[..., length:end, :].copy_(value_states)
        keys = self.keys = key_buffer[..., :end, :]
        values = self.values = value_buffer[..., :end, :]
        return keys, values

    def _holds(self, key_states: torch.Tensor, value_states: torch.Tensor, end: int) -> bool:
        """Whether the buffers can take positions up to `end` and still back self.keys (a
        method of DynamicLayer that reassigns keys, e.g. a beam reorder, replaces them)."""
        k, v = self._key_buffer, self._value_buffer
        keys, values = self.keys, self.values  # set by lazy_initialization: never None here
        return (
            k is not None
            and v is not None
            and keys is not None
            and values is not None
            and end <= k.shape[-2]
            and k.shape[:2] == key_states.shape[:2]
            and k.shape[-1] == key_states.shape[-1]
            and v.shape[-1] == value_states.shape[-1]
            and (keys.numel() == 0 or keys.data_ptr() == k.data_ptr())
            and (values.numel() == 0 or values.data_ptr() == v.data_ptr())
        )

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, length: int, end: int) -> None:
        old = self._key_buffer.shape[-2] if self._key_buffer is not None else 0
        capacity = max(end, 2 * old, 64)
        keys = key_states.new_empty((*key_states.shape[:2], capacity, key_states.shape[-1]))
        values = value_states.new_empty((*value_states.shape[:2], capacity, value_states.shape[-1]))
        if length:
            keys[..., :length, :].copy_(cast(torch.Tensor, self.keys))  # length > 0: they hold it
            values[..., :length, :].copy_(cast(torch.Tensor, self.values))
        self._key_buffer, self._value_buffer = keys, values

    def reset(self) -> None:
        self._key_buffer = self._value_buffer = None
        super().reset()


# Full-attention layers whose keys/values are one tensor per layer, sliceable by position.
PLAIN_LAYERS = (DynamicLayer, GrowingLayer)


def growing_cache(config: PretrainedConfig) -> DynamicCache:
    """A DynamicCache for `config` whose attention layers are all GrowingLayers.

    Sliding-window layers too: transformers' own DynamicSlidingWindowLayer keeps only the
    last `window` positions, so a rejected draft that ran past the window could not be
    cropped away. A full layer keeps every position and is cropped like any other; the
    window is still applied, by the mask: transformers builds a sliding layer's mask from
    absolute positions (the query offset and kv length a full layer reports), so its
    attention sees exactly the last `window` positions, as with its own cache. The cost is
    memory: a sliding layer's cache grows with the context like a full layer's.
    Other layer kinds (linear attention, state-space layers) stay transformers' own."""
    cache = DynamicCache(config=config)
    layers = getattr(cache, "layers", None)
    if layers:
        for i, layer in enumerate(layers):
            if type(layer) in (DynamicLayer, DynamicSlidingWindowLayer):
                layers[i] = GrowingLayer()
        others = sorted({type(layer).__name__ for layer in layers if type(layer) is not GrowingLayer})
        if others:  # e.g. linear-attention or convolution states: no per-position crop
            raise ValueError(
                f"specscope cannot decode {getattr(config, 'model_type', 'this model')!r} models: their "
                f"{', '.join(others)} cache layers cannot be rolled back to an accepted prefix "
                f"(it decodes models whose layers are full or sliding-window attention)"
            )
    return cache
