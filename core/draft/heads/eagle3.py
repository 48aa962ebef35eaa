"""EAGLE-3: features of three target layers, concatenated (low, middle, high) and fused by
one projection `fc` (3 x target hidden -> H, no bias); the head's one layer attends over
[input_layernorm(embedding); hidden_norm(feature)] (its q/k/v projections are 2H wide) with
the fused feature as the residual; then its own `norm` and `lm_head` over a reduced draft
vocabulary, whose id d is the target's id d + d2t[d]. Each further draft step feeds the
layer's output back as the feature (without `fc`).

The format read is the EAGLE repository's (SpecForge writes it too, and vLLM's
llama_eagle3.py reads it): config.json with hidden_size, draft_vocab_size, vocab_size (the
target's), optional target_hidden_size and the target layers
`eagle_aux_hidden_state_layer_ids` (at the top level or in `eagle_config`; indices into the
target's output_hidden_states, 0 = embeddings; default the published (2, L//2, L-3), L = the
target's layer count), and weights `fc.weight`, `midlayer.{hidden_norm,input_layernorm,
post_attention_layernorm}.weight`, `midlayer.self_attn.{q,k,v,o}_proj.weight`,
`midlayer.mlp.{gate,up,down}_proj.weight`, `norm.weight`, `lm_head.weight`, `d2t` (draft ->
target offsets), `t2d` (which target ids the draft vocabulary holds) and optionally
`embed_tokens.weight`. A `layers.0.` spelling of `midlayer.` and a `model.` prefix are accepted.

The `speculators` library's format (vLLM's standard; core/draft/heads/speculators.py reads its
config) and SpecForge's Eagle 3.1 exports add four flags, with vLLM's semantics
(model_executor/models/llama_eagle3.py, transformers_utils/configs/speculators/algos.py):
- norm_before_residual: the layer's residual is hidden_norm(feature), not the raw feature
  (default True in a speculators config, False in a flat EAGLE config, as vLLM reads them);
- norm_before_fc: one RMSNorm `input_norm` over the concatenated 3 x target-hidden features
  before `fc`;
- fc_norm: one RMSNorm per feature chunk, `fc_norm.{i}`, before `fc` (after input_norm);
- norm_output: the feature fed back to the next draft step is the layer's output after `norm`
  (and the logits read it as is), not before;
and a sliding-window draft layer (`sliding_window`, with `layer_types` saying
"sliding_attention"): its attention sees the last `sliding_window` positions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from transformers import LlamaConfig

from specscope.core.draft.head_folders import HeadFormatError, head_folder, read_config
from specscope.core.draft.heads.base import (
    HeadKV,
    HeadLayer,
    HeadNorm,
    RecurrentHead,
    RecurrentHeadProposer,
    check_width,
    llama_config,
    load_exactly,
    read_weights,
    share_embedding,
    target_hidden_size,
)
from specscope.core.draft.heads.eagle import strip_prefix
from specscope.core.draft.heads.trees import TreeAttention
from specscope.core.draft.proposers import TargetMismatch

FLAG_KEYS = (
    "norm_before_residual",
    "norm_before_fc",
    "fc_norm",
    "norm_output",
    "speculators_format",
    "draft_sliding_window",
)


def published_layers(target_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's default feature layers: (2, L//2, L-3) (they repeat on shallow targets)."""
    return (2, target_layers // 2, target_layers - 3)


class Eagle3Layer(HeadLayer):
    """The head's layer: attention over [norm(embedding); norm(feature)], 2H wide."""

    def __init__(self, config: LlamaConfig, norm_before_residual: bool = False) -> None:
        super().__init__(config, width=2 * config.hidden_size)
        self.hidden_norm = HeadNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.norm_before_residual = norm_before_residual

    def fused(
        self,
        embedded: torch.Tensor,
        feature: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        kv: HeadKV,
        at: TreeAttention | None = None,
    ) -> torch.Tensor:
        normed = self.hidden_norm(feature)
        attn_in = torch.cat([self.input_layernorm(embedded), normed], dim=-1)
        return self.forward(attn_in, normed if self.norm_before_residual else feature, rope, kv, at)


class Eagle3Head(RecurrentHead):
    kind = "eagle3"
    d2t: torch.Tensor  # buffers (register_buffer in __init__): draft id -> target id offset
    t2d: torch.Tensor  # target ids the draft vocabulary holds

    def __init__(
        self,
        config: LlamaConfig,
        own_embedding: bool,
        layers: tuple[int, ...] | None,
        flags: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(config, 1)
        flags = flags or {}
        self.norm_output = bool(flags.get("norm_output", False))
        hidden = config.hidden_size
        self.hidden_size = hidden
        self.target_hidden = int(getattr(config, "target_hidden_size", None) or hidden)
        self.draft_vocab = int(getattr(config, "draft_vocab_size", None) or config.vocab_size)
        self.layer_ids = layers
        if own_embedding:
            self.embed_tokens = nn.Embedding(config.vocab_size, hidden)
        if flags.get("norm_before_fc"):
            self.input_norm = HeadNorm(3 * self.target_hidden, eps=config.rms_norm_eps)
        if flags.get("fc_norm"):
            self.fc_norm = nn.ModuleList(HeadNorm(self.target_hidden, eps=config.rms_norm_eps) for _ in range(3))
        self.fc = nn.Linear(3 * self.target_hidden, hidden, bias=False)
        self.midlayer = Eagle3Layer(config, bool(flags.get("norm_before_residual", False)))
        self.midlayer.self_attn.window = flags.get("sliding_window")
        self.norm = HeadNorm(hidden, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, self.draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(self.draft_vocab, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))

    def feature_layers(self, target_layers: int) -> tuple[int, ...]:
        layers = self.layer_ids if self.layer_ids is not None else published_layers(target_layers)
        bad = [i for i in layers if not 0 <= i < target_layers]
        if bad:
            raise TargetMismatch(
                f"eagle3: feature layers {tuple(layers)} do not exist in a {target_layers}-layer "
                f"target (each is the input of a target layer, 0..{target_layers - 1}); name them "
                f"in config.json's eagle_aux_hidden_state_layer_ids"
            )
        return tuple(layers)

    def attach(self, target: nn.Module) -> None:
        check_width(self.kind, "target hidden size", self.target_hidden, target_hidden_size(target))
        share_embedding(self, target)
        table = getattr(self, "embed_tokens", None) or self.shared["embed"]
        if int(cast(torch.Tensor, table.weight).shape[-1]) != self.hidden_size:
            raise TargetMismatch(
                f"eagle3: the head is {self.hidden_size} wide but carries no embedding of that width "
                f"and the target's is {target_hidden_size(target)}"
            )
        self.place(target)
        ids = torch.arange(self.draft_vocab, device=self.d2t.device)
        self.draft_to_target = ids + self.d2t

    def step(
        self, features: torch.Tensor, tokens: torch.Tensor, from_target: bool, at: TreeAttention | None = None
    ) -> torch.Tensor:
        feature = self.fc(self.fc_input(features)) if from_target else features
        rope = self.positions(self.length, feature.shape[1], feature, at)
        out = self.midlayer.fused(self.embed(tokens).to(feature.dtype), feature, rope, self.kvs[0], at)
        normed: torch.Tensor = (
            self.norm(out) if self.norm_output else out
        )  # norm_output: the fed-back feature is post-norm
        return normed

    def fc_input(self, features: torch.Tensor) -> torch.Tensor:
        """The concatenated target features before `fc`: input_norm (norm_before_fc), then
        each chunk's fc_norm, as vLLM's combine_hidden_states applies them."""
        norm = getattr(self, "input_norm", None)
        if norm is not None:
            features = norm(features)
        chunk_norms = getattr(self, "fc_norm", None)
        if chunk_norms is not None:
            features = torch.cat([n(c) for n, c in zip(chunk_norms, features.chunk(3, dim=-1))], dim=-1)
        combined: torch.Tensor = features
        return combined

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        normed: torch.Tensor = (
            hidden if self.norm_output else self.norm(hidden)
        )  # norm_output: step() already normed it
        logits: torch.Tensor = self.lm_head(normed).float()  # over the draft vocabulary
        return logits


def layer_ids(raw: dict[str, Any]) -> tuple[int, ...] | None:
    ids = raw.get("eagle_aux_hidden_state_layer_ids")
    nested = raw.get("eagle_config")
    if ids is None and isinstance(nested, dict):
        ids = nested.get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        return None
    if not isinstance(ids, list) or len(ids) != 3 or not all(isinstance(i, int) for i in ids):
        raise HeadFormatError(f"eagle3: eagle_aux_hidden_state_layer_ids must be three layer indices, got {ids!r}")
    return tuple(ids)


def eagle3_names(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    weights = strip_prefix(weights)
    return {
        ("midlayer." + name[len("layers.0.") :] if name.startswith("layers.0.") else name): tensor
        for name, tensor in weights.items()
    }


def check_vocab_map(head: Eagle3Head, vocab: int) -> None:
    targets = torch.arange(head.draft_vocab) + head.d2t
    if bool((targets < 0).any() or (targets >= vocab).any()):
        raise HeadFormatError(f"eagle3: d2t maps draft ids outside the target vocabulary [0, {vocab})")
    if int(torch.unique(targets).numel()) != head.draft_vocab:
        raise HeadFormatError("eagle3: d2t maps two draft ids to one target id")
    if bool(head.t2d.any()) and not bool(torch.equal(head.t2d.nonzero().flatten(), torch.sort(targets).values)):
        raise HeadFormatError("eagle3: t2d and d2t disagree on which target ids the draft vocabulary holds")


def load_eagle3(path: str | Path) -> RecurrentHeadProposer:
    kind = Eagle3Head.kind
    folder = head_folder(path, kind)
    raw = read_config(folder, kind)
    from specscope.core.draft.heads.speculators import eagle3_flags, flatten_speculators

    raw = flatten_speculators(raw, kind)
    config = llama_config({k: v for k, v in raw.items() if k not in FLAG_KEYS}, kind)
    weights = eagle3_names(read_weights(folder, kind))
    if "fc.weight" not in weights or "midlayer.hidden_norm.weight" not in weights:
        raise HeadFormatError(
            f"{kind}: the checkpoint has no fc.weight / midlayer.hidden_norm.weight (an EAGLE-1 head? use eagle:{path})"
        )
    draft_vocab = int(raw.get("draft_vocab_size") or config.vocab_size)
    if draft_vocab < config.vocab_size and "d2t" not in weights:
        raise HeadFormatError(f"{kind}: a draft vocabulary of {draft_vocab} < {config.vocab_size} needs the d2t map")
    head = Eagle3Head(
        config,
        own_embedding="embed_tokens.weight" in weights,
        layers=layer_ids(raw),
        flags=eagle3_flags(raw, weights, kind),
    )
    load_exactly(head, weights, kind, optional=("d2t", "t2d"))
    check_vocab_map(head, config.vocab_size)
    return RecurrentHeadProposer(head.eval(), str(path))
