"""EAGLE-3 heads as the `speculators` library (vLLM's standard format) and SpecForge save
them: the config is flattened here the way vLLM reads it
(vllm/transformers_utils/configs/speculators/algos.py: update_eagle3), and the four flags
are read with vLLM's defaults and checked against the weights (core/draft/heads/eagle3.py
applies them).

A speculators config.json: `speculators_model_type: "eagle3"`, the draft layer's Llama
config nested in `transformer_layer_config`, `draft_vocab_size`, `target_hidden_size`,
`eagle_aux_hidden_state_layer_ids`, `norm_before_residual` (absent: True), `norm_before_fc`,
`fc_norm`, `norm_output` (absent: False) and `speculators_config` (the verifier, proposal
methods: informative). Weights: `fc.weight`, `layers.0.*`, `norm.weight`, `lm_head.weight`,
optional `d2t`/`t2d` (absent when the vocabularies match), `embed_tokens.weight`,
`input_norm.weight` (norm_before_fc), `fc_norm.{i}.weight` (fc_norm; SpecForge's Eagle 3.1)."""

from __future__ import annotations

from typing import Any

import torch

from specscope.core.draft.head_folders import HeadFormatError

SPECULATOR_KEYS = (
    "draft_vocab_size",
    "target_hidden_size",
    "eagle_aux_hidden_state_layer_ids",
    "norm_before_residual",
    "norm_before_fc",
    "fc_norm",
    "norm_output",
)


def flatten_speculators(raw: dict[str, Any], kind: str) -> dict[str, Any]:
    """A speculators config as the flat config the EAGLE-3 loader reads (unchanged when it
    is already flat). The nested layer config gives the shapes; the speculator's own fields
    override; `speculators_format` marks it (norm_before_residual's default differs)."""
    model_type = raw.get("speculators_model_type")
    if model_type is None and "transformer_layer_config" not in raw:
        return raw
    if model_type not in (None, "eagle3"):
        raise HeadFormatError(f"{kind}: a speculators head of type {model_type!r}, not eagle3")
    layer = raw.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise HeadFormatError(f"{kind}: a speculators config without its transformer_layer_config object")
    flat = {k: v for k, v in layer.items() if k not in ("architectures", "auto_map", "transformers_version")}
    flat.setdefault("vocab_size", raw.get("vocab_size"))
    for key in SPECULATOR_KEYS:
        if raw.get(key) is not None:
            flat[key] = raw[key]
    layer_types = layer.get("layer_types")
    window = layer.get("sliding_window")
    sliding = bool(window) and (
        (layer_types is None and bool(layer.get("use_sliding_window", False)))
        or (isinstance(layer_types, list) and layer_types[:1] == ["sliding_attention"])
    )
    flat.pop("sliding_window", None)
    flat.pop("layer_types", None)
    flat.pop("use_sliding_window", None)
    if sliding and window is not None:  # sliding implies a window (bool(window) above)
        flat["draft_sliding_window"] = int(window)
    flat["speculators_format"] = True
    return flat


def eagle3_flags(raw: dict[str, Any], weights: dict[str, torch.Tensor], kind: str) -> dict[str, Any]:
    """The four flags with vLLM's defaults, and the sliding window; a flag whose weights are
    missing (or weights without their flag) is refused, never silently ignored."""
    speculators = bool(raw.get("speculators_format"))
    flags = {
        "norm_before_residual": bool(raw.get("norm_before_residual", speculators)),
        "norm_before_fc": bool(raw.get("norm_before_fc", False)),
        "fc_norm": bool(raw.get("fc_norm", False)),
        "norm_output": bool(raw.get("norm_output", False)),
        "sliding_window": raw.get("draft_sliding_window"),
    }
    has_input_norm = "input_norm.weight" in weights
    has_fc_norm = any(name.startswith("fc_norm.") for name in weights)
    if flags["norm_before_fc"] != has_input_norm:
        raise HeadFormatError(
            f"{kind}: norm_before_fc is {flags['norm_before_fc']} but the checkpoint "
            f"{'lacks' if flags['norm_before_fc'] else 'has'} input_norm.weight"
        )
    if has_fc_norm and not flags["fc_norm"] and "fc_norm" not in raw:
        flags["fc_norm"] = True  # SpecForge's Eagle 3.1 exports carry fc_norm.{i}.weight without the flag
    if flags["fc_norm"] != has_fc_norm:
        raise HeadFormatError(
            f"{kind}: fc_norm is {flags['fc_norm']} but the checkpoint "
            f"{'lacks' if flags['fc_norm'] else 'has'} fc_norm.{{0,1,2}}.weight"
        )
    return flags
