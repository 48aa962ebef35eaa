"""EAGLE-3 heads in the `speculators` format (vLLM's standard) and SpecForge's Eagle 3.1
exports, written tensor by tensor under their published names: nested
transformer_layer_config, the flags norm_before_residual / norm_before_fc (input_norm) /
fc_norm (fc_norm.{i}) / norm_output, a sliding-window draft layer, no d2t/t2d when the
vocabularies match. Greedy output equals plain greedy, and the head's first draft token
equals a small reference computation written from vLLM's llama_eagle3.py (its
LlamaDecoderLayer.forward, LlamaModel.forward and combine_hidden_states)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from specscope.core import SamplingConfig, SpeculativeDecoder
from specscope.core.draft.heads.base import HeadFormatError
from specscope.core.draft.registry import SpecError, build_proposer
from tests.tiny_models import tiny_lm

PROMPT = [1, 2, 3, 4, 5, 6, 2, 3, 9, 11, 4]
GREEDY = SamplingConfig(temperature=0)
LAYERS = [1, 2, 3]


@pytest.fixture(scope="module")
def target():
    return tiny_lm("llama", seed=0, init_range=0.3, layers=4, vocab=64)


def write_speculators(
    folder: Path,
    target,
    seed=0,
    norm_before_residual=None,
    norm_before_fc=False,
    fc_norm=False,
    norm_output=False,
    window=None,
    specforge=False,
    d2t=False,
) -> Path:
    """A speculators-format EAGLE-3 folder (specforge=True: a SpecForge Eagle 3.1 export: flat
    config, fc_norm.{i}.weight without the flag)."""
    cfg = target.config
    h, heads, kv = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
    hd, vocab, inter = h // heads, cfg.vocab_size, 2 * h
    gen = torch.Generator().manual_seed(seed)

    def r(*shape, s=0.3):
        return torch.randn(*shape, generator=gen) * s

    def n(k):
        return 1.0 + r(k, s=0.1)

    w = {
        "fc.weight": r(h, 3 * h),
        "layers.0.self_attn.q_proj.weight": r(heads * hd, 2 * h),
        "layers.0.self_attn.k_proj.weight": r(kv * hd, 2 * h),
        "layers.0.self_attn.v_proj.weight": r(kv * hd, 2 * h),
        "layers.0.self_attn.o_proj.weight": r(h, heads * hd),
        "layers.0.mlp.gate_proj.weight": r(inter, h),
        "layers.0.mlp.up_proj.weight": r(inter, h),
        "layers.0.mlp.down_proj.weight": r(h, inter),
        "layers.0.input_layernorm.weight": n(h),
        "layers.0.post_attention_layernorm.weight": n(h),
        "layers.0.hidden_norm.weight": n(h),
        "norm.weight": n(h),
        "lm_head.weight": r(vocab, h, s=1.0),
    }
    if norm_before_fc:
        w["input_norm.weight"] = n(3 * h)
    if fc_norm or specforge:
        for i in range(3):
            w[f"fc_norm.{i}.weight"] = n(h)
    if d2t:
        w["d2t"] = torch.zeros(vocab, dtype=torch.long)
        w["t2d"] = torch.ones(vocab, dtype=torch.bool)
    layer = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": h,
        "intermediate_size": inter,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "num_hidden_layers": 1,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 512,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
    }
    if window:
        layer.update(sliding_window=window, layer_types=["sliding_attention"])
    if specforge:
        config = {
            **layer,
            "architectures": ["LlamaForCausalLMEagle3"],
            "draft_vocab_size": vocab,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": LAYERS},
        }
    else:
        config = {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "transformer_layer_config": layer,
            "draft_vocab_size": vocab,
            "target_hidden_size": h,
            "eagle_aux_hidden_state_layer_ids": LAYERS,
            "norm_before_fc": norm_before_fc,
            "fc_norm": fc_norm,
            "norm_output": norm_output,
            "speculators_config": {
                "algorithm": "eagle3",
                "default_proposal_method": "greedy",
                "verifier": {"name_or_path": "tiny", "architectures": ["LlamaForCausalLM"]},
            },
        }
        if norm_before_residual is not None:
            config["norm_before_residual"] = norm_before_residual
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in w.items()}, str(folder / "model.safetensors"))
    return folder


def plain_greedy(target, n):
    return SpeculativeDecoder(target, build_proposer("lookup"), k=1, sampling=GREEDY).generate(PROMPT, n).new_tokens


def _rms(x, w, eps=1e-6):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def reference_first_draft(folder: Path, target, t0: int) -> int:
    """vLLM's llama_eagle3 for the first draft token, from the folder's tensors: the target's
    features (inputs of layers LAYERS) at the prompt's positions, paired with the next tokens."""
    from safetensors.torch import load_file
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    cfg = json.loads((folder / "config.json").read_text())
    layer_cfg = cfg.get("transformer_layer_config", cfg)
    w = load_file(str(folder / "model.safetensors"))
    speculators = "speculators_model_type" in cfg
    norm_before_residual = cfg.get("norm_before_residual", speculators)  # algos.update_eagle3's default
    with torch.no_grad():
        hs = target(torch.tensor([PROMPT]), output_hidden_states=True).hidden_states
        x = torch.cat([hs[i][0] for i in LAYERS], dim=-1)  # [n, 3H]
        # combine_hidden_states: input_norm (norm_before_fc), then each chunk's fc_norm, then fc
        if cfg.get("norm_before_fc"):
            x = _rms(x, w["input_norm.weight"])
        if "fc_norm.0.weight" in w:
            x = torch.cat([_rms(c, w[f"fc_norm.{i}.weight"]) for i, c in enumerate(x.chunk(3, dim=-1))], dim=-1)
        hidden = x @ w["fc.weight"].T
        embeds = target.get_input_embeddings()(torch.tensor(PROMPT[1:] + [t0]))
        # LlamaDecoderLayer.forward, layer 0
        e = _rms(embeds, w["layers.0.input_layernorm.weight"])
        normed = _rms(hidden, w["layers.0.hidden_norm.weight"])
        residual = normed if norm_before_residual else hidden
        attn_in = torch.cat([e, normed], dim=-1)
        n, h = hidden.shape
        heads, kvh = layer_cfg["num_attention_heads"], layer_cfg["num_key_value_heads"]
        hd = h // heads
        q = (attn_in @ w["layers.0.self_attn.q_proj.weight"].T).view(n, heads, hd).transpose(0, 1)[None]
        k = (attn_in @ w["layers.0.self_attn.k_proj.weight"].T).view(n, kvh, hd).transpose(0, 1)[None]
        v = (attn_in @ w["layers.0.self_attn.v_proj.weight"].T).view(n, kvh, hd).transpose(0, 1)[None]
        from transformers import LlamaConfig

        rope = LlamaRotaryEmbedding(
            LlamaConfig(**{k2: v2 for k2, v2 in layer_cfg.items() if k2 not in ("layer_types", "sliding_window")})
        )
        cos, sin = rope(v, torch.arange(n)[None])
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k, v = k.repeat_interleave(heads // kvh, dim=1), v.repeat_interleave(heads // kvh, dim=1)
        pos = torch.arange(n)
        mask = pos[None, :] <= pos[:, None]
        if layer_cfg.get("sliding_window"):
            mask &= pos[None, :] > pos[:, None] - layer_cfg["sliding_window"]
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = att[0].transpose(0, 1).reshape(n, heads * hd) @ w["layers.0.self_attn.o_proj.weight"].T
        residual = out + residual  # post_attention_layernorm(hidden, residual): fused add
        mlp_in = _rms(residual, w["layers.0.post_attention_layernorm.weight"])
        mlp = (
            torch.nn.functional.silu(mlp_in @ w["layers.0.mlp.gate_proj.weight"].T)
            * (mlp_in @ w["layers.0.mlp.up_proj.weight"].T)
        ) @ w["layers.0.mlp.down_proj.weight"].T
        final = _rms(mlp + residual, w["norm.weight"])  # LlamaModel.forward: norm(hidden, residual)
        logits = final[-1] @ w["lm_head.weight"].T
    return int(torch.argmax(logits))


CASES = {
    "plain": {},
    "norm_before_residual-off": {"norm_before_residual": False},
    "norm_before_fc": {"norm_before_fc": True},
    "fc_norm": {"fc_norm": True},
    "norm_output": {"norm_output": True},
    "all-flags": {"norm_before_fc": True, "fc_norm": True, "norm_output": True},
    "sliding-window": {"window": 4},
    "with-d2t": {"d2t": True},
    "specforge-3.1": {"specforge": True},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_speculators_head_greedy_and_first_draft(case, target, tmp_path):
    folder = write_speculators(tmp_path / case, target, **CASES[case])
    want = plain_greedy(target, 24)
    for k in (1, 4):
        out = SpeculativeDecoder(target, build_proposer(f"eagle3:{folder}"), k=k, sampling=GREEDY).generate(PROMPT, 24)
        assert out.new_tokens == want, (case, k)
    run = SpeculativeDecoder(target, build_proposer(f"eagle3:{folder}"), k=1, sampling=GREEDY).generate(PROMPT, 3)
    first = run.rounds[1].nodes[0].token
    assert first == reference_first_draft(folder, target, want[0]), case


def test_flags_without_their_weights_are_refused(target, tmp_path):
    folder = write_speculators(tmp_path / "h", target, norm_before_fc=True)
    (folder / "config.json").write_text(
        (folder / "config.json").read_text().replace('"norm_before_fc": true', '"norm_before_fc": false')
    )
    with pytest.raises((HeadFormatError, SpecError), match=r"input_norm\.weight"):
        build_proposer(f"eagle3:{folder}")


def test_sliding_window_changes_the_draft_past_the_window(target, tmp_path):
    """The window is applied: a 2-position window's head drafts what the windowed reference
    computes, and its draft distribution differs from the same weights without the window."""
    a = write_speculators(tmp_path / "a", target, window=2)
    b = write_speculators(tmp_path / "b", target)
    t0 = plain_greedy(target, 1)[0]
    sampled = SamplingConfig(temperature=1.0)
    qa = SpeculativeDecoder(target, build_proposer(f"eagle3:{a}"), k=1, sampling=sampled, seed=0).generate(PROMPT, 3)
    qb = SpeculativeDecoder(target, build_proposer(f"eagle3:{b}"), k=1, sampling=sampled, seed=0).generate(PROMPT, 3)
    assert not torch.allclose(torch.as_tensor(qa.rounds[1].nodes[0].q), torch.as_tensor(qb.rounds[1].nodes[0].q))
    run_a = SpeculativeDecoder(target, build_proposer(f"eagle3:{a}"), k=1, sampling=GREEDY).generate(PROMPT, 3)
    assert run_a.rounds[1].nodes[0].token == reference_first_draft(a, target, t0)
