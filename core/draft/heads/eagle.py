"""EAGLE (EAGLE-1 and EAGLE-2's head): the target's last feature and the next token's
embedding, concatenated [embedding; feature] and projected by `fc` (2H -> H, with a bias
unless config.json says "bias": false), then the head's decoder layer(s), and the target's
own output head on the result (no norm in between: the feature it imitates is the target's
last hidden state after its final norm, which the lm_head reads as it is).

The format read is the EAGLE repository's (and vLLM's llama_eagle.py reads the same): a
folder with a Llama config.json (num_hidden_layers = the head's layers, usually 1) and
`pytorch_model.bin` or `model.safetensors` holding `fc.weight`, `fc.bias`,
`layers.N.self_attn.{q,k,v,o}_proj.weight`, `layers.N.mlp.{gate,up,down}_proj.weight`,
`layers.N.post_attention_layernorm.weight`, and `layers.N.input_layernorm.weight` for every
layer but the first (EAGLE's first layer reads the projection without a norm); an
`embed_tokens.weight` when the head carries its own copy of the target's embedding (else
the target's is used). A `model.` prefix on every name is accepted.

vLLM 0.32's `eagle` method (model_executor/models/llama_eagle.py) loads such a folder when
its config.json names `architectures` (["LlamaForCausalLM"]) and its names carry no `model.`
prefix, but builds `fc` without a bias and drops a checkpoint's `fc.bias`: a folder without
fc.bias is the same head in both (the vLLM engine notes a bias: core/engines/vllm/heads.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import torch
from torch import nn
from transformers import LlamaConfig

from specscope.core.draft.head_folders import HeadFormatError, head_folder, read_config
from specscope.core.draft.heads.base import (
    HeadLayer,
    RecurrentHead,
    RecurrentHeadProposer,
    check_width,
    llama_config,
    load_exactly,
    read_weights,
    share_embedding,
    target_hidden_size,
    target_output_embeddings,
)
from specscope.core.draft.heads.trees import TreeAttention


class EagleHead(RecurrentHead):
    kind = "eagle"

    def __init__(self, config: LlamaConfig, fc_bias: bool, own_embedding: bool) -> None:
        layers = int(config.num_hidden_layers)
        super().__init__(config, layers)
        hidden = config.hidden_size
        self.hidden_size = hidden
        if own_embedding:
            self.embed_tokens = nn.Embedding(config.vocab_size, hidden)
        self.fc = nn.Linear(2 * hidden, hidden, bias=fc_bias)
        self.layers = nn.ModuleList([HeadLayer(config, input_norm=i != 0) for i in range(layers)])

    def feature_layers(self, target_layers: int) -> tuple[int, ...]:
        return (target_layers,)  # the last layer's output, after the final norm

    def attach(self, target: nn.Module) -> None:
        check_width(self.kind, "hidden size", self.hidden_size, target_hidden_size(target))
        share_embedding(self, target)
        self.shared["lm_head"] = target_output_embeddings(target)
        self.place(target)

    def step(
        self, features: torch.Tensor, tokens: torch.Tensor, from_target: bool, at: TreeAttention | None = None
    ) -> torch.Tensor:
        x: torch.Tensor = self.fc(torch.cat([self.embed(tokens).to(features.dtype), features], dim=-1))
        rope = self.positions(self.length, x.shape[1], x, at)
        layers = cast("list[HeadLayer]", self.layers)  # an nn.ModuleList of HeadLayers
        for layer, kv in zip(layers, self.kvs):
            x = layer.plain(x, rope, kv, at)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.shared["lm_head"](hidden).float()
        return logits


def strip_prefix(weights: dict[str, torch.Tensor], prefix: str = "model.") -> dict[str, torch.Tensor]:
    if weights and all(name.startswith(prefix) for name in weights):
        return {name[len(prefix) :]: tensor for name, tensor in weights.items()}
    return weights


def load_eagle(path: str | Path) -> RecurrentHeadProposer:
    kind = EagleHead.kind
    folder = head_folder(path, kind)
    raw = read_config(folder, kind)
    if "draft_vocab_size" in raw or any("Eagle3" in a for a in raw.get("architectures", [])):
        raise HeadFormatError(
            f"{kind}: {folder} is an EAGLE-3 head (draft_vocab_size / Eagle3 architecture): use eagle3:{path}"
        )
    config = llama_config(raw, kind)
    weights = strip_prefix(read_weights(folder, kind))
    weights.pop("lm_head.weight", None)  # a copy of the target's head some exports carry: the target's is used
    if "fc.weight" not in weights:
        raise HeadFormatError(f"{kind}: the checkpoint has no fc.weight (is it an EAGLE head?)")
    fc_bias = "fc.bias" in weights
    if "bias" in raw and bool(raw["bias"]) != fc_bias:
        raise HeadFormatError(
            f"{kind}: config.json says bias={raw['bias']} but the weights {'have' if fc_bias else 'lack'} fc.bias"
        )
    head = EagleHead(config, fc_bias=fc_bias, own_embedding="embed_tokens.weight" in weights)
    load_exactly(head, weights, kind)
    return RecurrentHeadProposer(head.eval(), str(path))
