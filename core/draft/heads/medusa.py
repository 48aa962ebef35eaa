"""Medusa: K heads on the target's last feature (its last hidden state, after the final
norm), head i a stack of residual blocks x + SiLU(W x + b) and a linear output layer over the
vocabulary, predicting the token i + 2 positions ahead of the feature (the target's own
lm_head predicts the next one: here that token is the round's repair or bonus). The heads
do not read each other's tokens, so drafting is one pass over the last feature: draft token
i comes from head i, and a chain has at most K tokens. Each q_i is the distribution token i
was drawn from whatever was drawn before it, so the chain's verification is exact. A tree
(`medusa,tree=3,2,1` or Medusa's own `paths:...` choices) is at most K deep; the children of
every node at depth d come from head d's one distribution (core.draft.heads.trees).

Two formats are read, as saved:
- the Medusa repository's: config.json (`medusa_num_heads`, `medusa_num_layers`,
  `base_model_name_or_path`) and `medusa_lm_head.safetensors` or `medusa_lm_head.pt`, a
  state dict with `{i}.{j}.linear.weight` / `.bias` for block j of head i and
  `{i}.{medusa_num_layers}.weight` for its output layer;
- vLLM's (model_executor/models/medusa.py, transformers_utils/configs/medusa.py):
  config.json with `num_heads`, `num_hidden_layers` (the blocks per head), `hidden_size`,
  `vocab_size` (model_type "medusa"), optionally `medusa_fc_bias`, and `model.safetensors`
  (or pytorch_model.bin) holding `blocks.{i}.layers.{j}.weight` (and `.bias` when
  medusa_fc_bias is true) and `lm_heads.{i}.weight`, with or without a `medusa_heads.` prefix;
  `original_lm_head: true` shares one output layer, `lm_heads.0.weight`, among the heads.
A block without a bias is x + SiLU(W x). vLLM builds its blocks with a bias only when
config.json says `medusa_fc_bias: true` and drops a checkpoint's biases otherwise (the
vLLM engine says so before it runs such a head: core/engines/vllm/heads.py); a flag that
disagrees with the weights is refused here. A reduced vocabulary (`truncated_vocab_size`,
`token_map`) is refused. Hidden size and vocabulary are read from the weights and checked
against the target.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from specscope.core import kernels
from specscope.core.decode.kv import model_vocab_size
from specscope.core.draft.head_folders import HeadFormatError, head_folder, read_config, tree_too_deep
from specscope.core.draft.heads.base import (
    WEIGHT_FILES,
    HeadDrafting,
    check_width,
    head_confidence,
    load_exactly,
    make_draft,
    read_weights,
    target_hidden_size,
    target_layers,
    tree_draft,
)
from specscope.core.draft.heads.trees import DepthRowsGrowth
from specscope.core.draft.proposers import Draft
from specscope.core.draft.tree_draft import grow_dynamic, grow_static
from specscope.core.draft.trees import tree_options
from specscope.core.sampling.reference import SamplingConfig

MEDUSA_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")


class ResBlock(nn.Module):
    def __init__(self, hidden: int, bias: bool = True):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(nn.ModuleList):
    """The K heads, a list of Sequentials: its state dict names are the format's."""

    def __init__(self, heads: int, blocks: int, hidden: int, vocab: int, bias: bool = True):
        super().__init__(
            [
                nn.Sequential(*[ResBlock(hidden, bias) for _ in range(blocks)], nn.Linear(hidden, vocab, bias=False))
                for _ in range(heads)
            ]
        )
        self.hidden_size, self.vocab_size = hidden, vocab


class MedusaProposer(HeadDrafting):
    name = "medusa"

    def __init__(self, heads: MedusaHeads, label: str):
        super().__init__(label)
        self.heads = heads

    def target_features(self, target: nn.Module) -> tuple[int, ...]:
        check_width(self.name, "hidden size", self.heads.hidden_size, target_hidden_size(target))
        self.vocab_size = model_vocab_size(target)
        check_width(self.name, "vocabulary", self.heads.vocab_size, self.vocab_size)
        param = next(target.parameters())
        self.heads.to(device=param.device, dtype=param.dtype)
        if kernels.installed(target):  # as the target runs its linears (core.kernels)
            kernels.install(self.heads)
        return (target_layers(target),)

    def params(self) -> dict[str, Any]:
        return {**super().params(), "heads": len(self.heads)}

    def draft_trees(self, tree: Any, children: str = "topk") -> None:
        """A tree at most as deep as there are heads (head d drafts depth d + 1)."""
        spec, children = tree_options(tree, children)
        if spec is not None and spec.depth > len(self.heads):
            raise ValueError(tree_too_deep(spec.depth, len(self.heads)))
        self.tree, self.children = spec, children

    def take_features(self, first_position: int, features: torch.Tensor) -> None:
        super().take_features(first_position, features)
        self._features = cast(torch.Tensor, self._features)[-1:]  # only the last position's feature is read

    @torch.inference_mode()
    def propose(self, context: Sequence[int], k: int, sampling: SamplingConfig, rng: np.random.Generator) -> Draft:
        if self._feature_end == 0:  # the prefill round
            return make_draft([], [], [], 0, None, None, children=self.tree_children)
        if self._feature_end != len(context) - 1:
            raise RuntimeError(
                f"medusa: the last feature is of position {self._feature_end - 1}, but the context "
                f"has {len(context)} tokens"
            )
        last = cast(torch.Tensor, self._features)[0]  # take_features set it (checked just above)
        if self.tree is not None:
            depth = min(self.tree.depth, k)
            growth = DepthRowsGrowth(
                [head(last).float() for head in list(self.heads)[:depth]], len(context), sampling, rng
            )
            if self.tree.kind == "dynamic":
                kept = grow_dynamic(growth, self.tree, depth, growth.root_q(), self.tree_policy)
            else:
                kept = grow_static(growth, self.tree, self.children, depth, growth.root_q())
            return tree_draft(growth, kept, sampling, self.children, None, None)
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        draws: list[float] = []
        confidence: list[torch.Tensor] = []
        for i, head in enumerate(list(self.heads)[:k]):
            logits = head(last).float()
            token, q, u = self.draw(logits, sampling, rng, len(context) - self._prompt_len + i, None)
            confidence.append(head_confidence(logits, token, None))
            tokens.append(token)
            qs += [q] if q is not None else []
            draws += [u] if u is not None else []
        return make_draft(tokens, qs, draws, 1, None, None, confidence)

    def observe(self, committed_len: int) -> int | None:
        return None


def medusa_counts(raw: dict[str, Any], kind: str = "medusa") -> tuple[int, int]:
    """(heads, blocks per head) from the Medusa repository's keys or vLLM's."""
    try:
        count = int(raw["medusa_num_heads"] if "medusa_num_heads" in raw else raw["num_heads"])
        blocks = int(raw.get("medusa_num_layers", raw.get("num_hidden_layers", 1)))
    except (KeyError, TypeError, ValueError):
        raise HeadFormatError(
            f"{kind}: config.json needs medusa_num_heads (the Medusa repository's) or num_heads (vLLM's), an integer"
        ) from None
    if count < 1 or blocks < 0:
        raise HeadFormatError(f"{kind}: medusa_num_heads must be >= 1 and medusa_num_layers >= 0")
    return count, blocks


def medusa_names(weights: dict[str, torch.Tensor], blocks: int, shared_head: bool) -> dict[str, torch.Tensor]:
    """vLLM's names as the Medusa repository's (`blocks.{i}.layers.{j}.X` -> `{i}.{j}.linear.X`,
    `lm_heads.{i}.weight` -> `{i}.{blocks}.weight`, a `medusa_heads.` prefix dropped); the
    repository's names are kept. `shared_head` (original_lm_head): `lm_heads.0.weight` or
    `lm_head.weight` is every head's output layer, as vLLM loads it."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        parts = name.removeprefix("medusa_heads.").split(".")
        if len(parts) == 5 and parts[0] == "blocks" and parts[2] == "layers":
            out[f"{parts[1]}.{parts[3]}.linear.{parts[4]}"] = tensor
        elif len(parts) == 3 and parts[0] == "lm_heads" and parts[2] == "weight":
            if not shared_head or parts[1] == "0":
                out[f"{parts[1]}.{blocks}.weight"] = tensor
        elif parts == ["lm_head", "weight"] and shared_head:
            out[f"0.{blocks}.weight"] = tensor
        else:
            out[".".join(parts)] = tensor
    return out


def load_medusa(path: str | Path) -> MedusaProposer:
    kind = "medusa"
    folder = head_folder(path, kind)
    raw = read_config(folder, kind)
    count, blocks = medusa_counts(raw, kind)
    shared_head = bool(raw.get("original_lm_head", False))
    weights = medusa_names(read_weights(folder, kind, MEDUSA_FILES + WEIGHT_FILES), blocks, shared_head)
    if "token_map" in weights or (raw.get("truncated_vocab_size") or 0) not in (0, raw.get("vocab_size")):
        raise HeadFormatError(f"{kind}: a reduced draft vocabulary (truncated_vocab_size, token_map) is not read")
    out = weights.get(f"0.{blocks}.weight")
    if out is None or out.ndim != 2:
        raise HeadFormatError(
            f"{kind}: the checkpoint has no 0.{blocks}.weight or lm_heads.0.weight (head 0's output layer "
            f"with medusa_num_layers={blocks})"
        )
    if shared_head:
        weights.update({f"{i}.{blocks}.weight": out for i in range(1, count)})
    vocab, hidden = (int(n) for n in out.shape)
    bias = any(name.endswith(".linear.bias") for name in weights)
    if "medusa_fc_bias" in raw and bool(raw["medusa_fc_bias"]) != bias and blocks > 0:
        raise HeadFormatError(
            f"{kind}: config.json says medusa_fc_bias={raw['medusa_fc_bias']} but the blocks "
            f"{'have' if bias else 'lack'} biases"
        )
    heads = MedusaHeads(count, blocks, hidden, vocab, bias)
    load_exactly(heads, weights, kind)
    return MedusaProposer(heads.eval(), str(path))
