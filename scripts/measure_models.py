"""Measure the bundled models on held-out code and print a markdown report.

    python scripts/measure_models.py                  # bundled models, defaults below
    python scripts/measure_models.py --reps 7 --json /tmp/measure.json

Held-out prompts come from the stdlib files the training script held out (listed in
resources/models/training.json), so no prompt token was trained on. Reported:

- target held-out loss (nats/token) and perplexity over every held-out token;
- alpha at temperature 1 for each draft: continuations are sampled from the target, then
  the target (p) and the draft (q) are evaluated along them, alpha = mean of sum_x min(p, q);
- per-token forward cost: median single-token forward with a KV cache at the prompt's
  length, draft / target;
- greedy speculative decoding (core SpeculativeDecoder, k=4) against plain greedy decoding
  of the same target with a KV cache: speedup = median over interleaved repetitions of
  (plain wall time / speculative wall time), summed over the prompts; mean accepted length;
- whether greedy continuations read as Python (code_shape: distinct 4-grams, repeated
  lines, indentation, Python's tokenizer), next to the same measures on the held-out
  file's own text after each prompt;
- a few greedy continuations of the target.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from specscope.core import DraftModelProposer, PromptLookupProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.decode.kv import CachedLM
from specscope.core.loading.models import example_prompts, load_model, load_tokenizer, models_dir

# ---------------------------------------------------------------------------- prompts


def heldout_texts(models: Path) -> tuple[dict[str, str], dict]:
    meta = json.loads((models / "training.json").read_text(encoding="utf-8"))
    root = Path(meta["data"]["stdlib_path"])
    if not root.is_dir():
        import sysconfig

        root = Path(sysconfig.get_paths()["stdlib"])
    texts = {}
    for rel in meta["heldout_files"]:
        path = root / rel
        if path.is_file():
            texts[rel] = path.read_text(encoding="utf-8", errors="replace")
        else:
            print(f"warning: held-out file {rel} not found under {root}", file=sys.stderr)
    return texts, meta


def heldout_prompts(
    tokenizer, texts: dict[str, str], n: int, length: int, seed: int, references: dict[str, str] | None = None
) -> list[tuple[str, list[int]]]:
    """n prompts of about `length` tokens, each ending at the end of a line inside a held-out file.

    `references`, when given, receives (the file's text up to the prompt's end, the file's
    text after it) for each prompt, by prompt name.

    Prompts start on a line boundary and are spread over the files (round robin), at
    positions drawn with a fixed seed.
    """
    rng = np.random.default_rng(seed)
    names = sorted(t for t in texts if len(tokenizer(texts[t], add_special_tokens=False)["input_ids"]) > length + 200)
    prompts = []
    i = 0
    while len(prompts) < n and names:
        name = names[i % len(names)]
        i += 1
        lines = texts[name].splitlines(keepends=True)
        start = int(rng.integers(0, max(1, len(lines) - 60)))
        text = ""
        used = 0
        for line in lines[start:]:
            if len(tokenizer(text + line, add_special_tokens=False)["input_ids"]) > length:
                break
            text += line
            used += 1
        # No trailing newline: the tokenizer merges a newline with the next indentation,
        # so a prompt must not end at a bare newline (see core.loading.example_prompts).
        ids = tokenizer(text.rstrip(), add_special_tokens=False)["input_ids"]
        if len(ids) >= length // 2:
            prompts.append((f"{name}:{start + 1}", ids))
            if references is not None:  # (the file up to the prompt's end, the file's text after it)
                references[f"{name}:{start + 1}"] = (
                    "".join(lines[:start]) + text.rstrip(),
                    text[len(text.rstrip()) :] + "".join(lines[start + used : start + used + 80]),
                )
        if i > 50 * n:
            break
    return prompts


# ---------------------------------------------------------------------------- quality


def code_shape(before: str, continuation: str, ids: list[int]) -> dict:
    """Does a continuation read as Python? Cheap, model-free measures:

    distinct_4grams   unique token 4-grams / all token 4-grams (degenerate loops are low)
    repeated_lines    share of the non-blank lines (4+ characters) that repeat an earlier
                      line of the same continuation
    indent_by_4       share of the non-blank lines indented by a multiple of 4 spaces
    python_tokenizes  Python's own tokenizer reads the file from its start through the
                      prompt and the continuation (up to its last complete line) without an
                      error or a mismatched bracket; a bracket or string still open at the
                      cut is fine
    """
    import io
    import tokenize

    grams = [tuple(ids[i : i + 4]) for i in range(len(ids) - 3)]
    lines = [line for line in continuation.splitlines() if line.strip()]
    seen: set[str] = set()
    repeats = 0
    for line in lines:
        key = line.strip()
        if len(key) >= 4:
            repeats += key in seen
            seen.add(key)
    long_lines = sum(1 for line in lines if len(line.strip()) >= 4)
    complete = (before + continuation).rsplit("\n", 1)[0] + "\n"
    ok = True
    stack: list[str] = []
    pairs = {")": "(", "]": "[", "}": "{"}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(complete).readline):
            if tok.type == tokenize.OP and tok.string in "([{":
                stack.append(tok.string)
            elif tok.type == tokenize.OP and tok.string in pairs and (not stack or stack.pop() != pairs[tok.string]):
                ok = False
                break
    except (tokenize.TokenError, IndentationError, SyntaxError) as exc:
        # a bracket or a string still open where the text is cut is reported as an EOF error
        ok = "EOF in multi-line" in str(exc)
    return {
        "distinct_4grams": len(set(grams)) / len(grams) if grams else 1.0,
        "repeated_lines": repeats / long_lines if long_lines else 0.0,
        "indent_by_4": sum(1 for line in lines if (len(line) - len(line.lstrip(" "))) % 4 == 0) / len(lines)
        if lines
        else 1.0,
        "python_tokenizes": ok,
    }


def mean_shape(shapes: list[dict]) -> dict:
    return {key: float(np.mean([s[key] for s in shapes])) for key in shapes[0]}


@torch.inference_mode()
def heldout_loss(model, tokenizer, texts: dict[str, str], window: int) -> tuple[float, int]:
    """Mean next-token cross-entropy over every held-out token (files joined by EOS)."""
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for name in sorted(texts):
        ids += tokenizer(texts[name], add_special_tokens=False)["input_ids"] + [eos]
    total, count = 0.0, 0
    for s in range(0, len(ids) - 1, window):
        chunk = torch.tensor([ids[s : s + window + 1]])
        if chunk.shape[1] < 2:
            break
        logits = model(input_ids=chunk[:, :-1]).logits.float()
        total += F.cross_entropy(logits[0], chunk[0, 1:], reduction="sum").item()
        count += chunk.shape[1] - 1
    return total / count, count


@torch.inference_mode()
def sample_continuation(model, prompt: list[int], n: int, gen: torch.Generator, temperature: float = 1.0) -> list[int]:
    """Ancestral sampling from the target (at `temperature`), with a KV cache."""
    lm = CachedLM(model)
    ctx = list(prompt)
    for _ in range(n):
        logits = lm.forward(ctx, keep=1)[0].double() / temperature
        ctx.append(int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)))
    return ctx[len(prompt) :]


@torch.inference_mode()
def alpha_along(target, drafts: dict, prompt: list[int], cont: list[int]) -> dict[str, list[float]]:
    """sum_x min(p, q) at every continuation position, p from the target, q from each draft."""
    seq = torch.tensor([prompt + cont])
    positions = slice(len(prompt) - 1, len(prompt) + len(cont) - 1)
    p = torch.softmax(target(input_ids=seq).logits[0, positions].double(), -1)
    out = {}
    for name, draft in drafts.items():
        q = torch.softmax(draft(input_ids=seq).logits[0, positions].double(), -1)
        out[name] = torch.minimum(p, q).sum(-1).tolist()
    return out


# ---------------------------------------------------------------------------- speed


@torch.inference_mode()
def forward_ms(model, prompt: list[int], n: int) -> list[float]:
    """Single-token forward times (ms) with a KV cache, after prefilling the prompt."""
    lm = CachedLM(model)
    ctx = list(prompt)
    lm.forward(ctx, keep=1)
    times = []
    for i in range(n):
        ctx.append(int(ctx[-1 - (i % 7)]))
        t0 = time.perf_counter()
        lm.forward(ctx, keep=1)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


@torch.inference_mode()
def plain_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Plain greedy decoding of the target with a KV cache: the baseline."""
    lm = CachedLM(model)
    ctx = list(prompt)
    for _ in range(n):
        ctx.append(int(torch.argmax(lm.forward(ctx, keep=1)[0])))
    return ctx[len(prompt) :]


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--models", type=Path, default=None, help="folder with target/, draft-small/, draft-tiny/ (default: bundled)"
    )
    ap.add_argument("--prompts", type=int, default=8, help="held-out prompts")
    ap.add_argument("--prompt-tokens", type=int, default=192)
    ap.add_argument("--alpha-tokens", type=int, default=64, help="target-sampled tokens per prompt for alpha")
    ap.add_argument("--new-tokens", type=int, default=64, help="greedy tokens per prompt for the speed test")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5, help="interleaved repetitions of the speed test")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--samples", type=int, default=2, help="greedy continuations to print")
    ap.add_argument(
        "--shape-tokens", type=int, default=128, help="greedy tokens per prompt for the code-shape measures"
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the numbers as JSON")
    ap.add_argument(
        "--shape-only",
        action="store_true",
        help="only the target's held-out loss and the code-shape measures (no drafts needed in --models; "
        "held-out files and tokenizer from the bundled models)",
    )
    args = ap.parse_args(argv)

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    folder = args.models or models_dir()
    if args.shape_only:
        return shape_only(folder, args)
    tok = load_tokenizer(folder / "target")
    target = load_model(folder / "target", "cpu", role="target")
    drafts = {name: load_model(folder / f"draft-{name}", "cpu", role="draft") for name in ("small", "tiny")}
    texts, meta = heldout_texts(folder)
    references: dict[str, str] = {}
    prompts = heldout_prompts(tok, texts, args.prompts, args.prompt_tokens, args.seed, references)
    print(
        f"{len(prompts)} held-out prompts of ~{args.prompt_tokens} tokens from {len(texts)} held-out files",
        file=sys.stderr,
    )

    # 1. quality
    loss, n_tokens = heldout_loss(target, tok, texts, window=meta["config"]["seq_len"])
    draft_loss = {name: heldout_loss(d, tok, texts, window=meta["config"]["seq_len"])[0] for name, d in drafts.items()}
    gen = torch.Generator().manual_seed(args.seed)
    overlaps: dict[str, list[float]] = {name: [] for name in drafts}
    for _, ids in prompts:
        cont = sample_continuation(target, ids, args.alpha_tokens, gen)
        for name, vals in alpha_along(target, drafts, ids, cont).items():
            overlaps[name] += vals
    alpha = {name: float(np.mean(v)) for name, v in overlaps.items()}
    print(f"loss {loss:.3f}, alpha {alpha}", file=sys.stderr)

    # 2. per-token forward cost (interleaved, medians)
    costs: dict[str, list[float]] = {"target": [], **{name: [] for name in drafts}}
    for _ in range(3):
        for _, ids in prompts[:4]:
            for name, model in (("target", target), *drafts.items()):
                costs[name] += forward_ms(model, ids, 16)
    cost_ms = {name: statistics.median(v) for name, v in costs.items()}

    # 3. greedy speed: plain vs speculative, interleaved repetitions
    greedy = SamplingConfig(temperature=0.0)
    decoders = {
        "draft-small": SpeculativeDecoder(
            target, DraftModelProposer(drafts["small"], label="draft-small"), k=args.k, sampling=greedy
        ),
        "draft-tiny": SpeculativeDecoder(
            target, DraftModelProposer(drafts["tiny"], label="draft-tiny"), k=args.k, sampling=greedy
        ),
        "prompt lookup": SpeculativeDecoder(target, PromptLookupProposer(max_ngram=3), k=args.k, sampling=greedy),
    }
    ratios: dict[str, list[float]] = {name: [] for name in decoders}
    accepted: dict[str, list[float]] = {name: [] for name in decoders}
    mismatches = {name: 0 for name in decoders}
    plain_out = {}
    for rep in range(args.reps):
        plain_s = 0.0
        spec_s = {name: 0.0 for name in decoders}
        for pi, (_, ids) in enumerate(prompts):
            order = ["plain", *decoders]
            if (rep + pi) % 2:
                order.reverse()
            for what in order:
                if what == "plain":
                    dt, out = timed(plain_greedy, target, ids, args.new_tokens)
                    plain_s += dt
                    plain_out[pi] = out
                else:
                    dt, res = timed(decoders[what].generate, ids, args.new_tokens)
                    spec_s[what] += dt
                    if rep == 0:
                        accepted[what] += (
                            [r.accepted_length for r in res.rounds]
                            if hasattr(res.rounds[0], "accepted_length")
                            else [len(r.emitted) for r in res.rounds]
                        )
                        spec_tokens = res.new_tokens
                        if pi in plain_out and spec_tokens != plain_out[pi]:
                            mismatches[what] += 1
        for name in decoders:
            ratios[name].append(plain_s / spec_s[name])
        print(f"rep {rep}: " + ", ".join(f"{n} x{r[-1]:.2f}" for n, r in ratios.items()), file=sys.stderr)
    speedup = {name: statistics.median(v) for name, v in ratios.items()}
    mean_accepted = {name: float(np.mean(v)) for name, v in accepted.items()}

    # 4. do greedy continuations read as Python? The held-out file's own text is the yardstick.
    shapes, sampled_shapes, reference_shapes = shape_measures(target, tok, prompts, references, args)

    # 5. samples
    samples = []
    for _, ids in prompts[: args.samples]:
        samples.append((tok.decode(ids[-60:]), tok.decode(plain_greedy(target, ids, 64))))
    for p in example_prompts("novel")[:1]:
        ids = tok(p.text, add_special_tokens=False)["input_ids"]
        samples.append((p.text, tok.decode(plain_greedy(target, ids, 64))))

    weights = {
        name: (folder / name / "model.safetensors").stat().st_size for name in ("target", "draft-small", "draft-tiny")
    }
    params = {
        name: sum(p.numel() for p in m.parameters())
        for name, m in (("target", target), ("draft-small", drafts["small"]), ("draft-tiny", drafts["tiny"]))
    }
    result = {
        "heldout_tokens": n_tokens,
        "target_loss": loss,
        "target_ppl": math.exp(loss),
        "draft_loss": draft_loss,
        "alpha_t1": alpha,
        "forward_ms": cost_ms,
        "cost_ratio": {name: cost_ms[name] / cost_ms["target"] for name in drafts},
        "greedy_speedup": speedup,
        "speedup_reps": ratios,
        "mean_accepted_length": mean_accepted,
        "greedy_mismatches": mismatches,
        "code_shape": {
            "target_greedy": mean_shape(shapes),
            "target_sampled_t0.7": mean_shape(sampled_shapes),
            "heldout_text": mean_shape(reference_shapes),
            "per_prompt": shapes,
        },
        "weights_bytes": weights,
        "params": params,
        "prompts": [name for name, _ in prompts],
        "settings": vars(args) | {"models": str(folder), "json": str(args.json) if args.json else None},
        "machine": f"{platform.processor() or platform.machine()}, torch {torch.__version__}, {args.threads} threads",
    }
    print_report(result, samples, args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


def shape_measures(target, tok, prompts, references, args) -> tuple[list[dict], list[dict], list[dict]]:
    """Code-shape measures of greedy and T=0.7 continuations and of the held-out text."""
    shapes, sampled_shapes, reference_shapes = [], [], []
    shape_gen = torch.Generator().manual_seed(args.seed)
    for name, ids in prompts:
        before, after = references[name]
        cont = plain_greedy(target, ids, args.shape_tokens)
        shapes.append(code_shape(before, tok.decode(cont), cont))
        cont = sample_continuation(target, ids, args.shape_tokens, shape_gen, temperature=0.7)
        sampled_shapes.append(code_shape(before, tok.decode(cont), cont))
        ref_ids = tok(after, add_special_tokens=False)["input_ids"][: args.shape_tokens]
        reference_shapes.append(code_shape(before, tok.decode(ref_ids), ref_ids))
    return shapes, sampled_shapes, reference_shapes


def shape_only(folder: Path, args) -> dict:
    """--shape-only: held-out loss and code shape of `folder`/target (e.g. a training experiment)."""
    bundled = models_dir()
    tok = load_tokenizer(bundled / "target")
    target = load_model(folder / "target", "cpu", role="target")
    texts, meta = heldout_texts(bundled)
    references: dict[str, tuple[str, str]] = {}
    prompts = heldout_prompts(tok, texts, args.prompts, args.prompt_tokens, args.seed, references)
    loss, n_tokens = heldout_loss(target, tok, texts, window=meta["config"]["seq_len"])
    shapes, sampled, reference = shape_measures(target, tok, prompts, references, args)
    result = {
        "models": str(folder),
        "prompts": len(prompts),
        "heldout_tokens": n_tokens,
        "target_loss": loss,
        "target_ppl": math.exp(loss),
        "code_shape": {
            "target_greedy": mean_shape(shapes),
            "target_sampled_t0.7": mean_shape(sampled),
            "heldout_text": mean_shape(reference),
        },
    }
    print(
        f"{folder / 'target'}: held-out loss {loss:.3f} (perplexity {math.exp(loss):.2f}); "
        f"{len(prompts)} prompts, {args.shape_tokens} tokens each\n"
    )
    print_shape_table(result["code_shape"])
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


def print_shape_table(code_shape: dict) -> None:
    print("| text | distinct token 4-grams | repeated lines | lines indented by 4s | Python tokenizer accepts it |")
    print("|---|---|---|---|---|")
    for label, key in (
        ("target, greedy", "target_greedy"),
        ("target, sampled at T=0.7", "target_sampled_t0.7"),
        ("held-out file (reference)", "heldout_text"),
    ):
        m = code_shape[key]
        print(
            f"| {label} | {m['distinct_4grams']:.2f} | {m['repeated_lines']:.2f} | {m['indent_by_4']:.2f} | "
            f"{m['python_tokenizes']:.0%} |"
        )


def print_report(r: dict, samples: list[tuple[str, str]], args) -> None:
    mb = {k: v / 1e6 for k, v in r["weights_bytes"].items()}
    print(
        f"Held-out: {len(r['prompts'])} prompts of ~{args.prompt_tokens} tokens, {r['heldout_tokens']} held-out "
        "tokens for the loss; "
        f"{args.threads} torch threads; {r['machine']}.\n"
    )
    print(
        "| model | params | weights (bf16) | held-out loss (nats/token) | perplexity | alpha at T=1 | forward "
        "ms/token | cost vs target |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print(
        f"| target | {r['params']['target'] / 1e6:.2f}M | {mb['target']:.1f} MB | {r['target_loss']:.3f} | "
        f"{r['target_ppl']:.2f} | - | "
        f"{r['forward_ms']['target']:.2f} | 1 |"
    )
    for name in ("small", "tiny"):
        key = f"draft-{name}"
        print(
            f"| {key} | {r['params'][key] / 1e6:.2f}M | {mb[key]:.1f} MB | {r['draft_loss'][name]:.3f} | "
            f"{math.exp(r['draft_loss'][name]):.2f} | "
            f"{r['alpha_t1'][name]:.3f} | {r['forward_ms'][name]:.2f} | {r['cost_ratio'][name]:.3f} |"
        )
    print(f"\nTotal weights: {sum(mb.values()):.1f} MB.\n")
    print(
        f"Greedy decoding, {args.new_tokens} new tokens per prompt, k={args.k}, median of {args.reps} interleaved "
        "repetitions "
        "(plain = the same target, greedy, KV cache):\n"
    )
    print("| proposer | speedup vs plain greedy | repetitions | mean accepted length | output equals plain greedy |")
    print("|---|---|---|---|---|")
    for name, s in r["greedy_speedup"].items():
        reps = ", ".join(f"{x:.2f}" for x in r["speedup_reps"][name])
        same = "yes" if r["greedy_mismatches"][name] == 0 else f"no ({r['greedy_mismatches'][name]} prompts differ)"
        print(f"| {name} | {s:.2f}x | {reps} | {r['mean_accepted_length'][name]:.2f} | {same} |")
    cs = r["code_shape"]
    print(
        f"\nDo greedy continuations read as Python? {args.shape_tokens} greedy tokens after each held-out prompt, "
        "against the held-out file's own next tokens (means over the prompts):\n"
    )
    print_shape_table(cs)
    print("\nGreedy continuations of the target (prompt tail, then `# >>>` and the continuation):\n")
    for prompt, cont in samples:
        print("```python")
        print(prompt.rstrip("\n") + "\n# >>>\n" + cont)
        print("```\n")


if __name__ == "__main__":
    main()
