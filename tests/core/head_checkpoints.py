"""Random-initialised draft-head checkpoints written in their authors' formats, tensor by
tensor under the published names (not through specscope's modules, so a loader that reads
another layout fails here): EAGLE (EAGLE repository), EAGLE-3 (EAGLE repository /
SpecForge, with d2t/t2d), Medusa (medusa_lm_head file) and DeepSeek-V3's MTP layer."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def _shapes(target) -> dict:
    cfg = target.config.get_text_config()
    hidden = int(cfg.hidden_size)
    heads = int(cfg.num_attention_heads)
    return dict(
        hidden=hidden,
        heads=heads,
        kv_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
        head_dim=hidden // heads,
        inter=2 * hidden,
        vocab=int(target.get_output_embeddings().weight.shape[0]),
        layers=int(cfg.num_hidden_layers),
    )


def _config(target, **extra) -> dict:
    s = _shapes(target)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": s["hidden"],
        "intermediate_size": s["inter"],
        "num_attention_heads": s["heads"],
        "num_key_value_heads": s["kv_heads"],
        "num_hidden_layers": 1,
        "vocab_size": s["vocab"],
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 512,
        "hidden_act": "silu",
        "torch_dtype": "float32",
        **extra,
    }


def _rand(gen, *shape, scale=0.3):
    return torch.randn(*shape, generator=gen) * scale


def _norm(gen, n):
    return 1.0 + _rand(gen, n, scale=0.1)


def _layer(gen, prefix: str, s: dict, width: int, input_norm: bool = True) -> dict:
    h, q, kv = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    w = {
        f"{prefix}self_attn.q_proj.weight": _rand(gen, q, width),
        f"{prefix}self_attn.k_proj.weight": _rand(gen, kv, width),
        f"{prefix}self_attn.v_proj.weight": _rand(gen, kv, width),
        f"{prefix}self_attn.o_proj.weight": _rand(gen, h, q),
        f"{prefix}mlp.gate_proj.weight": _rand(gen, s["inter"], h),
        f"{prefix}mlp.up_proj.weight": _rand(gen, s["inter"], h),
        f"{prefix}mlp.down_proj.weight": _rand(gen, h, s["inter"]),
        f"{prefix}post_attention_layernorm.weight": _norm(gen, h),
    }
    if input_norm:
        w[f"{prefix}input_layernorm.weight"] = _norm(gen, h)
    return w


def _save(folder: Path, config: dict, weights: dict, file: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if file.endswith(".safetensors"):
        save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / file))
    else:
        torch.save(weights, folder / file)
    return folder


def write_eagle(
    folder: Path, target, seed: int = 0, bias: bool = True, embedding: bool = False, file: str = "pytorch_model.bin"
) -> Path:
    """EAGLE-1/2: fc (2H -> H) over [embedding; feature], layers.0 without input_layernorm."""
    gen, s = torch.Generator().manual_seed(seed), _shapes(target)
    h = s["hidden"]
    weights = {"fc.weight": _rand(gen, h, 2 * h), **_layer(gen, "layers.0.", s, h, input_norm=False)}
    if bias:
        weights["fc.bias"] = _rand(gen, h)
    if embedding:
        weights["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().clone()
    return _save(folder, _config(target, bias=bias), weights, file)


def write_eagle3(
    folder: Path,
    target,
    seed: int = 0,
    draft_vocab: int | None = None,
    layers=None,
    file: str = "model.safetensors",
    head_scale: float = 1.0,
) -> Path:
    """EAGLE-3: fc (3H -> H), midlayer with 2H-wide q/k/v and hidden_norm, norm, lm_head over
    a draft vocabulary of `draft_vocab` target ids (every other id from the top), d2t, t2d."""
    gen, s = torch.Generator().manual_seed(seed), _shapes(target)
    h, vocab = s["hidden"], s["vocab"]
    draft_vocab = draft_vocab or vocab
    ids = torch.sort(torch.randperm(vocab, generator=gen)[:draft_vocab]).values
    weights = {
        "fc.weight": _rand(gen, h, 3 * h),
        **_layer(gen, "midlayer.", s, 2 * h),
        "midlayer.hidden_norm.weight": _norm(gen, h),
        "norm.weight": _norm(gen, h),
        "lm_head.weight": _rand(gen, draft_vocab, h, scale=head_scale),
        "d2t": ids - torch.arange(draft_vocab),
        "t2d": torch.zeros(vocab, dtype=torch.bool).index_fill_(0, ids, True),
    }
    extra = {"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": draft_vocab}
    if layers is not None:
        extra["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(layers)}
    return _save(folder, _config(target, **extra), weights, file)


def write_medusa(
    folder: Path,
    target,
    seed: int = 0,
    heads: int = 3,
    blocks: int = 1,
    file: str = "medusa_lm_head.safetensors",
    head_scale: float = 1.0,
) -> Path:
    """Medusa: `heads` Sequentials of `blocks` ResBlocks ({i}.{j}.linear) and an output layer ({i}.{blocks})."""
    gen, s = torch.Generator().manual_seed(seed), _shapes(target)
    h = s["hidden"]
    weights = {}
    for i in range(heads):
        for j in range(blocks):
            weights[f"{i}.{j}.linear.weight"] = _rand(gen, h, h)
            weights[f"{i}.{j}.linear.bias"] = _rand(gen, h)
        weights[f"{i}.{blocks}.weight"] = _rand(gen, s["vocab"], h, scale=head_scale)
    config = {"medusa_num_heads": heads, "medusa_num_layers": blocks, "base_model_name_or_path": "tiny-llama"}
    return _save(folder, config, weights, file)


def write_vllm_eagle(folder: Path, target, seed: int = 0, scale: float = 0.3) -> Path:
    """EAGLE as vLLM 0.32's llama_eagle.py loads it: model.safetensors, fc without a bias,
    layers.N without a `model.` prefix, config.json naming LlamaForCausalLM."""
    gen, s = torch.Generator().manual_seed(seed), _shapes(target)
    h = s["hidden"]
    weights = {"fc.weight": _rand(gen, h, 2 * h, scale=scale), **_layer(gen, "layers.0.", s, h, input_norm=False)}
    return _save(folder, _config(target, head_dim=s["head_dim"]), weights, "model.safetensors")


def write_vllm_medusa(
    folder: Path,
    target,
    seed: int = 0,
    heads: int = 3,
    blocks: int = 1,
    bias: bool = False,
    prefix: str = "",
    head_scale: float = 1.0,
    shared_head: bool = False,
) -> Path:
    """Medusa as vLLM 0.32's medusa.py loads it (and MedusaConfig reads its config):
    blocks.{i}.layers.{j}.weight (with `bias`, .bias and medusa_fc_bias: true), lm_heads.{i}.weight,
    config.json with num_heads, num_hidden_layers, hidden_size, vocab_size; `shared_head`:
    original_lm_head, one lm_heads.0.weight for every head."""
    gen, s = torch.Generator().manual_seed(seed), _shapes(target)
    h = s["hidden"]
    weights = {}
    for i in range(heads):
        for j in range(blocks):
            weights[f"{prefix}blocks.{i}.layers.{j}.weight"] = _rand(gen, h, h)
            if bias:
                weights[f"{prefix}blocks.{i}.layers.{j}.bias"] = _rand(gen, h)
        if i == 0 or not shared_head:
            weights[f"{prefix}lm_heads.{i}.weight"] = _rand(gen, s["vocab"], h, scale=head_scale)
    config = {
        "architectures": ["MedusaModel"],
        "model_type": "medusa",
        "num_heads": heads,
        "num_hidden_layers": blocks,
        "hidden_size": h,
        "vocab_size": s["vocab"],
        **({"medusa_fc_bias": True} if bias else {}),
        **({"original_lm_head": True} if shared_head else {}),
    }
    return _save(folder, config, weights, "model.safetensors")


def write_mtp(folder: Path, target, seed: int = 0, copies: bool = False, file: str = "model.safetensors") -> Path:
    """DeepSeek-V3's MTP layer as model.layers.{L}.*: enorm, hnorm, eh_proj, one layer,
    shared_head.norm (and, with `copies`, embed_tokens and shared_head.head as DeepSeek-V3 ships)."""
    gen, s = torch.Generator().manual_seed(seed), _shapes(target)
    h, prefix = s["hidden"], f"model.layers.{s['layers']}."
    weights = {
        f"{prefix}enorm.weight": _norm(gen, h),
        f"{prefix}hnorm.weight": _norm(gen, h),
        f"{prefix}eh_proj.weight": _rand(gen, h, 2 * h),
        **_layer(gen, prefix, s, h),
        f"{prefix}shared_head.norm.weight": _norm(gen, h),
    }
    if copies:
        weights[f"{prefix}embed_tokens.weight"] = target.get_input_embeddings().weight.detach().clone()
        weights[f"{prefix}shared_head.head.weight"] = target.get_output_embeddings().weight.detach().clone()
    config = _config(
        target, architectures=["DeepseekV3ForCausalLM"], num_hidden_layers=s["layers"], num_nextn_predict_layers=1
    )
    return _save(folder, config, weights, file)


WRITERS = {"eagle": write_eagle, "eagle3": write_eagle3, "medusa": write_medusa, "mtp": write_mtp}


def write_ernie_mtp_target(folder: Path, seed: int = 0, layers: int = 2, hidden: int = 256, vocab: int = 4096) -> Path:
    """A tiny dense ERNIE-4.5 target (Ernie4_5_MoeForCausalLM without experts: moe_layer_start_index past
    its layers; head_dim 64, vLLM's CPU attention has no smaller kernel) whose checkpoint carries its MTP
    module under ERNIE-4.5's names, as vLLM 0.32's ernie_mtp.py reads them: model.mtp_emb_norm.0,
    model.mtp_hidden_norm.0, model.mtp_linear_proj.0 (2H -> H, no bias), model.mtp_block.0.* (a Llama
    layer); config.json's num_nextn_predict_layers = 1. Random, written tensor by tensor."""
    from transformers import Ernie4_5_MoeConfig, Ernie4_5_MoeForCausalLM

    torch.manual_seed(seed)
    inter, heads = 2 * hidden, hidden // 64
    config = Ernie4_5_MoeConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=64,
        max_position_embeddings=1024,
        moe_num_experts=0,
        moe_layer_start_index=layers,
        moe_layer_end_index=layers - 1,
        use_bias=False,
        tie_word_embeddings=True,
        initializer_range=0.3,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    Ernie4_5_MoeForCausalLM(config).save_pretrained(folder)
    from safetensors.torch import load_file

    weights = load_file(str(folder / "model.safetensors"))
    gen = torch.Generator().manual_seed(seed + 1)
    s = dict(hidden=hidden, heads=heads, kv_heads=heads, head_dim=64, inter=inter)
    weights.update(
        {
            "model.mtp_emb_norm.0.weight": _norm(gen, hidden),
            "model.mtp_hidden_norm.0.weight": _norm(gen, hidden),
            "model.mtp_linear_proj.0.weight": _rand(gen, hidden, 2 * hidden),
            **_layer(gen, "model.mtp_block.0.", s, hidden),
        }
    )
    save_file(
        {k: v.contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"), metadata={"format": "pt"}
    )
    saved = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**saved, "num_nextn_predict_layers": 1}, indent=1))
    return folder
