"""Layouts: how a draft is laid out in the target's one verify forward, and what the target
cache keeps of it once the verifier has spoken (the decoder's `layout` seam).

- `ChainLayout`: the draft is fed causally after the pending context (the model's own
  causal attention is the chain's: no 4D mask, today's fast path) and the cache is cropped
  to the accepted prefix.
- `TreeLayout`: every node in one forward with an additive 4D mask (each node sees the
  context, its ancestors and itself) at position prefix length + depth - 1 (`masked_feed`);
  the cache keeps the prefix and the accepted path's rows, gathered by index
  (`keep_positions`). A chain is the tree whose node i has parent i - 1, so a chain draft
  laid out as a tree gives what the chain layout gives.

A layout also says how long a draft may be, which verifier judges it by default, how its
task is handed to the verifier and what its record adds (a tree round's TreeInfo).
`layout_for` picks a proposer's layout from what the proposer protocol says (`tree`): the
one place in the round's path that knows whether a draft is a tree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import numpy as np
import torch
from transformers.cache_utils import DynamicLayer

from specscope.core.decode.kv import PLAIN_LAYERS, CachedLM, CachePolicy
from specscope.core.draft.trees import additive_mask, ancestor_matrix, context_and_tree, node_depths, tree_positions
from specscope.core.records import Round, TreeInfo, TreeRound
from specscope.core.verify.chain import Verdict, Verifier, VerifyTask
from specscope.core.verify.coupling import CoupledVerifier, Coupling
from specscope.core.verify.tree import TreeVerifier, check_children_mode


@dataclass(frozen=True)
class Placement:
    """Where the forward put the draft's nodes and which cache rows were kept (what a tree
    round records; a chain's are implied by its shape)."""

    positions: tuple[int, ...] = ()
    visible: tuple[tuple[int, ...], ...] = ()
    kept_rows: tuple[int, ...] = ()


class Layout(Protocol):
    """What the decoder's round asks of a layout, in the order it asks."""

    def draft_length(self, k: int, remaining: int) -> int:
        """The k the proposer is asked for."""
        ...

    def verifier(self, coupling: Coupling | None) -> Verifier:
        """The verifier a decoder uses when it is given none."""
        ...

    def check(self, draft: Any, k: int) -> None:
        """ValueError (completing "proposer NAME ...") for a draft this layout cannot lay out."""
        ...

    def forward(self, lm: CachedLM, pending: list[int], draft: Any, prefix_len: int) -> tuple[torch.Tensor, Placement]:
        """One target forward over the pending context and the draft: the (n + 1, V) float32
        logits at the prefix and after each node, on the model's device."""
        ...

    def task(self, draft: Any, **common: Any) -> VerifyTask: ...

    walk_facts: bool  # whether its record keeps the walk's residual updates and final p' (RoundVectors)

    def keep(
        self, lm: CachedLM, policy: CachePolicy, prefix_len: int, path: list[int], draft: Any, placed: Placement
    ) -> Placement:
        """Keep the prefix and the accepted path in the target cache (the policy crops)."""
        ...

    def record(
        self, fields: dict[str, Any], task: VerifyTask, verdict: Verdict, vectors: Any, placed: Placement
    ) -> Round: ...


class ChainLayout:
    """A chain: fed causally, kept by cropping (no mask, no gather). Its record is a plain
    Round: the walk's residual updates and final p' (`walk_facts`) are not kept."""

    walk_facts = False

    def draft_length(self, k: int, remaining: int) -> int:
        return min(k, remaining)

    def verifier(self, coupling: Coupling | None) -> Verifier:
        return TreeVerifier() if coupling is None else CoupledVerifier(coupling)

    def check(self, draft: Any, k: int) -> None:
        if not draft.is_chain:
            raise ValueError(
                "drafted a tree, which the chain layout cannot verify (a tree proposer declares its "
                "`tree`; or give the decoder layout=TreeLayout())"
            )
        if len(draft.tokens) > k:
            raise ValueError(f"returned {len(draft.tokens)} tokens for k={k}")

    def forward(self, lm: CachedLM, pending: list[int], draft: Any, prefix_len: int) -> tuple[torch.Tensor, Placement]:
        return lm.feed(pending + list(draft.tokens), keep=len(draft.tokens) + 1), Placement()

    def task(self, draft: Any, **common: Any) -> VerifyTask:
        return walk_task(draft, **common)

    def keep(
        self, lm: CachedLM, policy: CachePolicy, prefix_len: int, path: list[int], draft: Any, placed: Placement
    ) -> Placement:
        policy.crop(lm, prefix_len + len(path))
        return placed

    def record(
        self, fields: dict[str, Any], task: VerifyTask, verdict: Verdict, vectors: Any, placed: Placement
    ) -> Round:
        return Round(**fields)


@dataclass(frozen=True)
class TreeLayout:
    """A token tree: one masked forward over every node; the cache keeps the accepted path's
    rows. `spec` is the tree spec a round records. `visible`, `positions` and `kept_rows`
    are the three facts a tree's correctness rests on (the fault zoo replaces them)."""

    spec: str = ""
    walk_facts = True  # the record keeps every residual update and the final p' (TreeInfo)

    def draft_length(self, k: int, remaining: int) -> int:
        return remaining  # a tree's own spec bounds it; the budget caps its depth

    def verifier(self, coupling: Coupling | None) -> Verifier:
        if coupling is not None:
            raise ValueError("coupled lanes verify chain drafts only; a tree proposer cannot be coupled")
        return TreeVerifier()

    def check(self, draft: Any, k: int) -> None:
        node_depths(draft.parents)  # parents before children

    def visible(self, parents: tuple[int, ...]) -> np.ndarray:
        return ancestor_matrix(parents)

    def positions(self, parents: tuple[int, ...], prefix_len: int) -> list[int]:
        return tree_positions(parents, prefix_len)

    def kept_rows(self, prefix_len: int, path: list[int], parents: tuple[int, ...]) -> list[int]:
        return [prefix_len + i for i in path]

    def forward(self, lm: CachedLM, pending: list[int], draft: Any, prefix_len: int) -> tuple[torch.Tensor, Placement]:
        visible = self.visible(draft.parents)
        node_positions = self.positions(draft.parents, prefix_len)
        cached = lm.processed
        allowed = context_and_tree(cached, len(pending), visible)
        positions = list(range(cached, cached + len(pending))) + list(node_positions)
        logits = masked_feed(lm, pending + list(draft.tokens), positions, allowed, keep=len(draft.tokens) + 1)
        seen = tuple(tuple(int(j) for j in np.flatnonzero(row)) for row in visible)
        return logits, Placement(positions=tuple(node_positions), visible=seen)

    def task(self, draft: Any, **common: Any) -> VerifyTask:
        return walk_task(draft, **common)

    def keep(
        self, lm: CachedLM, policy: CachePolicy, prefix_len: int, path: list[int], draft: Any, placed: Placement
    ) -> Placement:
        rows = self.kept_rows(prefix_len, path, draft.parents)
        if lm.cache is not None:
            if not keep_positions(lm, prefix_len, rows):
                lm.crop(prefix_len)  # cannot gather: the path is recomputed as pending tokens
            policy.crop(lm, prefix_len + len(path))
        return dataclasses.replace(placed, kept_rows=tuple(rows))

    def record(
        self, fields: dict[str, Any], task: VerifyTask, verdict: Verdict, vectors: Any, placed: Placement
    ) -> Round:
        info = TreeInfo(
            spec=self.spec,
            children=task.children,
            path=tuple(verdict.path),
            tried=tuple((node, tuple(kids)) for node, kids in verdict.tried.items()),
            updates=tuple(vectors.updates),
            final_p=vectors.final,
            positions=placed.positions,
            visible=placed.visible,
            kept_rows=placed.kept_rows,
        )
        return TreeRound(**{**fields, "k": max(node_depths(task.parents), default=0)}, tree=info)


def walk_task(draft: Any, **common: Any) -> VerifyTask:
    """The walk's task for a draft of any shape (a chain's parents are -1, 0, ..., n - 2)."""
    return VerifyTask(tokens=draft.tokens, parents=draft.parents, children=children_rule(draft), **common)


def children_rule(draft: Any) -> str:
    """How the walk judges a draft's children: as the proposer named it; unnamed, the
    point-mass rule (exact however siblings were picked), except where no node has two
    children: a lone child was drawn from its q (the proposer protocol), the chain's rule."""
    if draft.children is not None:
        return check_children_mode(draft.children)
    return "sampled" if len(set(draft.parents)) == len(draft.parents) else "topk"


def layout_for(proposer: Any) -> Layout:
    """The layout of a proposer's drafts: a tree for a proposer that drafts trees (its
    `tree`, part of the proposer protocol), else a chain."""
    return ChainLayout() if proposer.tree is None else TreeLayout(str(proposer.tree))


# ---------------------------------------------------------------------------- the tree forward and gather


def model_dtype(lm: CachedLM) -> torch.dtype:
    return next(lm.model.parameters()).dtype


def masked_feed(
    lm: CachedLM, tokens: Sequence[int], positions: Sequence[int], allowed: np.ndarray, keep: int
) -> torch.Tensor:
    """Append `tokens` at `positions` after what the cache holds, each row attending the
    columns `allowed` (rows: tokens; columns: cached positions then tokens). Returns the
    (keep, V) float32 logits of the last `keep` tokens, on the model's device (CachedLM.feed
    with the tree's mask: transformers returns a 4D mask as it is, for eager and SDPA
    attention alike)."""
    n = len(tokens)
    cached = lm.processed
    if allowed.shape != (n, cached + n):
        raise RuntimeError(f"tree mask of shape {allowed.shape} for {n} tokens after {cached} cached")
    return lm.feed(tokens, keep, positions=positions, attention_mask=attention_masks(lm, allowed, positions))


def attention_masks(
    lm: CachedLM, allowed: np.ndarray, positions: Sequence[int]
) -> torch.Tensor | dict[str, torch.Tensor]:
    """The additive 4D mask(s) of a masked feed. A given 4D mask is used as it is, so a model
    with sliding-window layers needs the window applied here: a token at position i sees a
    column at position j only when i - j < window, as transformers' own sliding mask rules
    (the cache's columns sit at positions 0..cached-1, the fed tokens at `positions`). Models
    whose layers differ (Gemma 2 and 3: `layer_types`) take one mask per layer type; a model
    whose every layer slides (Mistral with `sliding_window`) takes the windowed mask alone."""
    dtype, device = model_dtype(lm), lm.device
    config = lm.model.config
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    slides = window is not None and (layer_types is None or "sliding_attention" in layer_types)
    if not slides:
        return additive_mask(allowed, dtype, device)
    cached = allowed.shape[1] - len(positions)
    columns = np.concatenate([np.arange(cached), np.asarray(positions)])
    windowed = allowed & ((np.asarray(positions)[:, None] - columns[None, :]) < window)
    if layer_types is None:
        return additive_mask(windowed, dtype, device)
    return {
        "full_attention": additive_mask(allowed, dtype, device),
        "sliding_attention": additive_mask(windowed, dtype, device),
    }


def keep_positions(lm: CachedLM, prefix_len: int, rows: Sequence[int]) -> bool:
    """Keep the first `prefix_len` cache positions and then the cache rows `rows` (in that
    order); drop the rest. False when the cache cannot be gathered (anything but plain
    full-attention layers; nothing changed): the caller crops to the prefix instead."""
    cache = lm.cache
    if cache is None:
        return True
    if not all(type(layer) in PLAIN_LAYERS for layer in cache.layers):
        return False
    rows = list(rows)
    index = torch.tensor(rows, dtype=torch.long, device=lm.device)
    end = prefix_len + len(rows)
    with torch.inference_mode():  # the cache's tensors are inference tensors
        for any_layer in cache.layers:
            layer = cast(DynamicLayer, any_layer)  # every layer is one of PLAIN_LAYERS (checked above)
            if not layer.is_initialized:
                continue
            # an initialized plain layer holds one tensor each (typed Optional by transformers)
            old_keys, old_values = cast(torch.Tensor, layer.keys), cast(torch.Tensor, layer.values)
            if not old_keys.numel():
                continue
            # only the path's rows move (O(path), not O(context)): gather them, cut the
            # cache after the prefix + path, write them in place behind the prefix
            keys = old_keys.index_select(-2, index.to(old_keys.device))
            values = old_values.index_select(-2, index.to(old_values.device))
            new_keys = layer.keys = old_keys[..., :end, :]
            new_values = layer.values = old_values[..., :end, :]
            new_keys[..., prefix_len:end, :] = keys
            new_values[..., prefix_len:end, :] = values
    return True
