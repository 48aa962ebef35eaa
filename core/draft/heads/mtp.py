"""MTP (DeepSeek-V3's multi-token prediction module) as a draft head: the next token's
embedding and the previous hidden state, each RMS-normalised (`enorm`, `hnorm`),
concatenated [embedding; hidden], projected by `eh_proj` (2H -> H, no bias), one
transformer layer, then `shared_head.norm` and the output head. Embedding and output head
are the target's (the module shares them); a checkpoint that carries copies
(`embed_tokens.weight`, `shared_head.head.weight`, as DeepSeek-V3's does) uses its copies.
The previous hidden state is the target's last hidden state (after its final norm) for the
first step, the module's own layer output for each further step (one module chained k
times, as serving engines draft k > 1 tokens with DeepSeek-V3's single MTP layer).

The format read is DeepSeek-V3's: the module's weights named as the model layer after the
last one, `model.layers.{L}.` with L = config.json's num_hidden_layers (the target's layer
count; `num_nextn_predict_layers` >= 1), for a Llama-style layer: `enorm.weight`,
`hnorm.weight`, `eh_proj.weight`, `self_attn.{q,k,v,o}_proj.weight`,
`mlp.{gate,up,down}_proj.weight`, `input_layernorm.weight`,
`post_attention_layernorm.weight`, `shared_head.norm.weight`, optionally
`embed_tokens.weight` and `shared_head.head.weight`; in model.safetensors (or its index) or
pytorch_model.bin. Only the first MTP module (layer L) is read.

ERNIE-4.5's layout is read too, as vLLM 0.32 reads it (model_executor/models/ernie_mtp.py):
`model.mtp_emb_norm.0.weight` (enorm), `model.mtp_hidden_norm.0.weight` (hnorm),
`model.mtp_linear_proj.0.weight` (eh_proj) and `model.mtp_block.0.*` (the Llama layer), with
no norm before the output head (the logits read the layer's output as it is). The folder is
the target's own checkpoint (`mtp:TARGET_FOLDER`), as with vLLM's `mtp` method.

The embedding paired with position 0 is zeroed, as every vLLM MTP model does ("masking inputs
at position 0, as not needed by MTP": deepseek_mtp.py, ernie_mtp.py, glm4_moe_mtp.py, ...): the
head's first cache entry reads the target's feature alone, so its drafts are vLLM's.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig

from specscope.core.draft.head_folders import HeadFormatError, head_folder, read_config
from specscope.core.draft.heads.base import (
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
    target_layers,
    target_output_embeddings,
)
from specscope.core.draft.heads.trees import TreeAttention
from specscope.core.draft.proposers import TargetMismatch


class SharedHead(nn.Module):
    def __init__(self, config: LlamaConfig, own_head: bool, norm: bool = True) -> None:
        super().__init__()
        if norm:  # ERNIE-4.5's module has none
            self.norm = HeadNorm(config.hidden_size, eps=config.rms_norm_eps)
        if own_head:
            self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)


class MtpHead(RecurrentHead):
    kind = "mtp"

    def __init__(
        self, config: LlamaConfig, index: int, own_embedding: bool, own_head: bool, final_norm: bool = True
    ) -> None:
        super().__init__(config, 1)
        hidden = config.hidden_size
        self.hidden_size, self.index = hidden, index
        if own_embedding:
            self.embed_tokens = nn.Embedding(config.vocab_size, hidden)
        self.enorm = HeadNorm(hidden, eps=config.rms_norm_eps)
        self.hnorm = HeadNorm(hidden, eps=config.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.layer = HeadLayer(config)
        self.shared_head = SharedHead(config, own_head, final_norm)

    def feature_layers(self, target_layers: int) -> tuple[int, ...]:
        return (target_layers,)

    def attach(self, target: nn.Module) -> None:
        check_width(self.kind, "hidden size", self.hidden_size, target_hidden_size(target))
        if self.index != target_layers(target):
            raise TargetMismatch(
                f"mtp: the module is layer {self.index} of a {self.index}-layer model, the target "
                f"has {target_layers(target)} layers: it was trained for another model"
            )
        share_embedding(self, target)
        if getattr(self.shared_head, "head", None) is None:
            self.shared["lm_head"] = target_output_embeddings(target)
        self.place(target)

    def step(
        self, features: torch.Tensor, tokens: torch.Tensor, from_target: bool, at: TreeAttention | None = None
    ) -> torch.Tensor:
        embedded = self.embed(tokens).to(features.dtype)
        where = (
            torch.arange(self.length, self.length + tokens.shape[1], device=tokens.device)
            if at is None
            else at.positions
        )
        embedded = self.enorm(embedded.masked_fill((where == 0)[None, :, None], 0.0))  # position 0: no token (vLLM)
        x = self.eh_proj(torch.cat([embedded, self.hnorm(features)], dim=-1))
        return self.layer.plain(x, self.positions(self.length, x.shape[1], x, at), self.kvs[0], at)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        head = getattr(self.shared_head, "head", None) or self.shared["lm_head"]
        norm = getattr(self.shared_head, "norm", None)
        logits: torch.Tensor = head(norm(hidden) if norm is not None else hidden).float()
        return logits


# the module's names inside a layer of DeepSeek-V3's format -> this module's
RENAMES = (
    ("self_attn.", "layer.self_attn."),
    ("mlp.", "layer.mlp."),
    ("input_layernorm.", "layer.input_layernorm."),
    ("post_attention_layernorm.", "layer.post_attention_layernorm."),
)


# ERNIE-4.5's flat MTP names (its first module) -> this module's (vLLM's ernie_mtp.py maps them alike)
ERNIE_NAMES = (
    ("model.mtp_emb_norm.0.", "enorm."),
    ("model.mtp_hidden_norm.0.", "hnorm."),
    ("model.mtp_linear_proj.0.", "eh_proj."),
    ("model.mtp_block.0.", "layer."),
)


def ernie_weights(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """ERNIE-4.5's MTP module (empty when the checkpoint has none)."""
    mine = {}
    for name, tensor in weights.items():
        for old, new in ERNIE_NAMES:
            if name.startswith(old):
                mine[new + name[len(old) :]] = tensor
    return mine


def mtp_weights(weights: dict[str, torch.Tensor], index: int) -> dict[str, torch.Tensor]:
    prefix = f"model.layers.{index}."
    mine = {}
    for name, tensor in weights.items():
        if not name.startswith(prefix):
            continue  # other MTP depths, or the main model's layers in a full checkpoint
        name = name[len(prefix) :]
        for old, new in RENAMES:
            if name.startswith(old):
                name = new + name[len(old) :]
                break
        mine[name] = tensor
    return mine


def load_mtp(path: str | Path) -> RecurrentHeadProposer:
    kind = MtpHead.kind
    folder = head_folder(path, kind)
    raw = read_config(folder, kind)
    config = llama_config(raw, kind)
    if int(raw.get("num_nextn_predict_layers", 0) or 0) < 1:
        raise HeadFormatError(f"{kind}: config.json has no num_nextn_predict_layers >= 1 (not an MTP checkpoint)")
    index = int(config.num_hidden_layers)
    every = read_weights(folder, kind)
    ernie = ernie_weights(every)
    weights = ernie or mtp_weights(every, index)
    if "eh_proj.weight" not in weights:
        raise HeadFormatError(
            f"{kind}: the checkpoint has no model.layers.{index}.eh_proj.weight (the MTP module "
            f"is the layer after the model's {index}) nor ERNIE-4.5's model.mtp_linear_proj.0.weight"
        )
    head = MtpHead(
        config,
        index,
        own_embedding="embed_tokens.weight" in weights,
        own_head="shared_head.head.weight" in weights,
        final_norm=not ernie,
    )
    load_exactly(head, weights, kind)
    return RecurrentHeadProposer(head.eval(), str(path))
