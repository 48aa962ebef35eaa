"""Tiny random-initialised transformers models (no downloads): the tests' one tiny-model
factory (`tiny_lm`, `noisy_copy`), used by the core, storage, app and window tests (the
window's through tests/tiny_hub.py)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

ARCHITECTURES = ("llama", "gpt2", "qwen2")


def tiny_lm(
    arch: str = "llama",
    vocab: int = 64,
    seed: int = 0,
    layers: int = 2,
    hidden: int = 32,
    init_range: float = 0.02,
    dtype: torch.dtype = torch.float32,
    positions: int = 512,
    sharpen: float = 1.0,
    bos: int | None = None,
    eos: int | None = None,
) -> torch.nn.Module:
    """A small causal LM. A larger init_range gives peakier, more varied distributions, and so
    does `sharpen` (the output head scaled by it). `bos`/`eos`: the special ids its config and
    generation config name (None: none, so a run stops only at its budget)."""
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, initializer_range=init_range, bos_token_id=bos, eos_token_id=eos, pad_token_id=None)
    if arch == "llama":
        cfg = LlamaConfig(
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=positions,
            tie_word_embeddings=False,
            **common,
        )
        model = LlamaForCausalLM(cfg)
    elif arch == "gpt2":
        cfg = GPT2Config(n_embd=hidden, n_layer=layers, n_head=4, n_positions=positions, **common)
        model = GPT2LMHeadModel(cfg)
    elif arch == "qwen2":
        cfg = Qwen2Config(
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=positions,
            **common,
        )
        model = Qwen2ForCausalLM(cfg)
    else:
        raise ValueError(arch)
    model = model.to(dtype).eval()
    if sharpen != 1.0:
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(sharpen)
    model.generation_config.eos_token_id = eos
    model.generation_config.bos_token_id = bos
    model.generation_config.pad_token_id = 0
    return model


def noisy_copy(model: torch.nn.Module, noise: float, seed: int = 1, floor: float = 1e-3) -> torch.nn.Module:
    """A draft that mostly agrees with `model`: its weights plus Gaussian noise of `noise` times
    each tensor's spread (at least `floor`: 0 leaves constant tensors, the norms' ones, as they are)."""
    import copy

    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in draft.parameters():
            spread = param.std().clamp_min(floor)
            param.add_(torch.randn(param.shape, generator=gen, dtype=param.dtype) * noise * spread)
    return draft


def save_pair(root, noise: float = 0.05):
    """A tiny llama target and its noisy copy saved as checkpoint folders: (target dir, draft dir)."""
    target = tiny_lm("llama", seed=0, init_range=0.3)
    target.save_pretrained(root / "target")
    noisy_copy(target, noise).save_pretrained(root / "draft")
    return root / "target", root / "draft"


def nfc_only_tokenizer_pair(root: Path) -> tuple[Path, Path]:
    """A tiny Qwen2 target and a tiny Llama draft (checkpoint folders) sharing the bundled
    tokenizer.json with Qwen2's pre-tokenizer, so that the Qwen2 class's added NFC normalizer is
    their only difference: it changes no id of text as given (issue 43 item 5, a warning)."""
    import json

    from specscope.core.loading import models as loading

    folder = loading.bundled_path("tokenizer")
    data = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.pop("tokenizer_class")  # each model class picks its own tokenizer class
    config.pop("backend", None)

    def save(place: Path, tokenizer: dict) -> tuple[Path, Path]:
        made = []
        for arch in ("qwen2", "llama"):
            out = place / arch
            tiny_lm(arch, vocab=len(tokenizer["model"]["vocab"])).save_pretrained(out)
            (out / "tokenizer.json").write_text(json.dumps(tokenizer))
            (out / "tokenizer_config.json").write_text(json.dumps(config))
            made.append(out)
        return made[0], made[1]

    probe = loading.load_tokenizer(save(root / "probe", data)[0])
    data["pre_tokenizer"] = json.loads(probe.backend_tokenizer.to_str())["pre_tokenizer"]
    return save(root / "shared", data)
