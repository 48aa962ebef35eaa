"""Quickly train an EAGLE head and Medusa heads for a small Llama target (default: the bundled
one) and save them in the format vLLM 0.32's `eagle` and `medusa` methods load, which
specscope's eagle:FOLDER and medusa:FOLDER read as saved (docs/vllm.md, "EAGLE, Medusa and MTP
through vLLM"): OUT/eagle (config.json naming LlamaForCausalLM; model.safetensors with fc.weight
without a bias and layers.0.*) and OUT/medusa (num_heads, num_hidden_layers, hidden_size,
vocab_size; blocks.{i}.layers.0.weight without biases, lm_heads.{i}.weight).

The data are windows of the CPython standard library's .py files, labelled with the target's
own greedy next tokens (one target forward caches its last feature and argmax at every
position). Medusa head i learns the token i + 2 ahead of a feature; the EAGLE head learns the
next feature and the token after it from (feature, next token) pairs, depth 0 only (no
training-time test). A few minutes on one CPU thread: the heads are for exercising the engines
with accepted drafts (about two thirds accepted on a held-out prompt here), not for speed.

    python scripts/train_vllm_heads.py --out /tmp/heads [--steps 150] [--target PATH]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from specscope.core.draft.heads.base import llama_config
from specscope.core.draft.heads.eagle import EagleHead
from specscope.core.loading.models import bundled_path, load_tokenizer

SEQ, WINDOWS, MEDUSA_HEADS = 96, 48, 3


def windows(tokenizer, n: int, seq: int) -> torch.Tensor:
    files = sorted(Path(sys.base_prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}").glob("[a-m]*.py"))
    random.Random(0).shuffle(files)
    out: list[list[int]] = []
    for file in files:
        ids = tokenizer.encode(file.read_text(errors="ignore"))
        out += [ids[i : i + seq] for i in range(0, len(ids) - seq, seq * 4)]
        if len(out) >= n:
            break
    return torch.tensor(out[:n])


def train_medusa(feats: torch.Tensor, pred: torch.Tensor, lm: torch.Tensor, steps: int, out: Path) -> None:
    """Head i: x + SiLU(W_i x), then its own output layer (from the target's), on the target's
    argmax i + 1 positions after the feature's."""
    n, seq, hidden = feats.shape
    blocks = [torch.zeros(hidden, hidden, requires_grad=True) for _ in range(MEDUSA_HEADS)]
    heads = [lm.clone().requires_grad_(True) for _ in range(MEDUSA_HEADS)]
    opt = torch.optim.Adam(blocks + heads, lr=3e-3)
    span = seq - MEDUSA_HEADS - 1
    for step in range(steps):
        idx = torch.randint(0, n * span, (2048,))
        row, col = idx // span, idx % span
        h = feats[row, col]
        loss = torch.stack(
            [
                torch.nn.functional.cross_entropy(
                    (h + torch.nn.functional.silu(h @ blocks[i].T)) @ heads[i].T, pred[row, col + i + 1]
                )
                for i in range(MEDUSA_HEADS)
            ]
        ).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"medusa step {step} loss {loss.item() / MEDUSA_HEADS:.3f}", flush=True)
    weights = {f"blocks.{i}.layers.0.weight": blocks[i].detach().contiguous() for i in range(MEDUSA_HEADS)}
    weights.update({f"lm_heads.{i}.weight": heads[i].detach().contiguous() for i in range(MEDUSA_HEADS)})
    out.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out / "model.safetensors"))
    config = {
        "architectures": ["MedusaModel"],
        "model_type": "medusa",
        "num_heads": MEDUSA_HEADS,
        "num_hidden_layers": 1,
        "hidden_size": hidden,
        "vocab_size": int(lm.shape[0]),
    }
    (out / "config.json").write_text(json.dumps(config, indent=1))


def train_eagle(target, tokens: torch.Tensor, feats: torch.Tensor, pred: torch.Tensor, steps: int, out: Path) -> None:
    """specscope's EAGLE module (its state dict names are the format's), fc without a bias,
    started as the identity on the feature: entry j pairs f_j with x_{j+1} and learns f_{j+1}
    and the target's argmax there."""
    text = target.config.get_text_config()
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": int(text.hidden_size),
        "intermediate_size": int(text.intermediate_size),
        "num_attention_heads": int(text.num_attention_heads),
        "num_key_value_heads": int(text.num_key_value_heads),
        "head_dim": int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads),
        "num_hidden_layers": 1,
        "vocab_size": int(text.vocab_size),
        "rms_norm_eps": float(text.rms_norm_eps),
        "max_position_embeddings": int(text.max_position_embeddings),
        "hidden_act": "silu",
    }
    hidden = config["hidden_size"]
    head = EagleHead(llama_config(config, "eagle"), fc_bias=False, own_embedding=False)
    head.shared["embed"] = target.get_input_embeddings()
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, hidden:] = torch.eye(hidden)
    lm = target.get_output_embeddings().weight.detach()
    opt = torch.optim.Adam([p for p in head.parameters() if p.requires_grad], lr=1e-3)
    for step in range(steps):
        rows = torch.randint(0, feats.shape[0], (8,))
        outs = []
        for r in rows.tolist():  # the head's layer runs one sequence at a time
            head.reset()
            outs.append(head.step(feats[r : r + 1, :-2], tokens[r : r + 1, 1:-1], from_target=True))
        h = torch.cat(outs)
        loss = torch.nn.functional.cross_entropy((h @ lm.T).reshape(-1, lm.shape[0]), pred[rows, 1:-1].reshape(-1))
        loss = loss + torch.nn.functional.mse_loss(h, feats[rows, 1:-1])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"eagle step {step} loss {loss.item():.3f}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in head.state_dict().items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--target", default=None, help="a Llama checkpoint folder (default: the bundled target)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    folder = Path(args.target) if args.target else bundled_path("target")
    target = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokens = windows(load_tokenizer(folder), WINDOWS, SEQ)
    started = time.time()
    with torch.inference_mode():
        output = target(tokens, output_hidden_states=True)
        feats, pred = output.hidden_states[-1].clone(), output.logits.argmax(-1).clone()
    lm = target.get_output_embeddings().weight.detach()
    train_medusa(feats, pred, lm, args.steps, args.out / "medusa")
    train_eagle(target, tokens, feats, pred, args.steps, args.out / "eagle")
    print(f"wrote {args.out / 'eagle'} and {args.out / 'medusa'} in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
