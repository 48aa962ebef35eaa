"""Where the speculative decoder's wall time goes, per round, and an A/B against another revision.

For each mode (greedy, sampled T=1) the script runs `SpeculativeDecoder` with the draft model
(k=4 by default) over the first N bundled example prompts and splits every round into

    draft fwd     time inside the draft model's forwards (CachedLM.forward_s)
    draft other   the proposer's own work around them (sampling q, argmax, token feeding)
    verify fwd    time inside the target's verify forward
    verify other  the host transfer and the finite check after it
    bookkeeping   process p, accept/repair/bonus, crops, building the Round record
    between       the generator's own work between rounds (wall minus the three timings)

"orchestration" is wall time outside model forwards, as `specscope bench` defines it.
Numbers are medians over repetitions (ms per round, tokens/s, orchestration share).

A/B: `--ab REV` also loads the `core/` package of git revision REV (extracted into a
temporary folder and imported under another name, so both live in one process) and runs
it interleaved with the working tree's core, the order alternating each repetition, on the
same model objects. Ratios are paired per repetition (same machine state), so a noisy
machine (another job running) still gives usable relative numbers. The tokens of A and B
must be identical (greedy and seeded sampled runs alike), and greedy tokens must equal
plain greedy decoding; the script fails otherwise. `--hf` adds transformers'
`generate(assistant_model=draft)` with a constant schedule of k tokens as a third variant.

Reproduce the numbers of issue 7 (1 torch thread because another job shared the cores):

    .venv/bin/python scripts/profile_decoder.py --ab 737eac8 --hf --threads 1 --reps 7

`--cprofile greedy|sampled` prints cProfile's top functions of one generation instead.

At a real vocabulary (issue 41: per-round work outside the forwards <= 10% of the round with
top-k/top-p at T=1): `--scale` replaces the bundled pair by two random-initialised 2-layer
hidden-256 Llamas with Qwen2.5's 151,936 tokens (tied embeddings, seeds 0 and 1) and the
prompts by random 32-token ones; `--top-k`/`--top-p` filter the sampled mode. The "orch."
column is then the share of the round outside the two models' forwards. The lead's rerun
(about 2 minutes on a quiet 2-core machine):

    .venv/bin/python scripts/profile_decoder.py --scale --ab 7e2f642 --mode sampled \
        --top-k 50 --top-p 0.9 --threads 2 --reps 5 --prompts 1 --max-new 64
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent


def load_core_at(rev: str, into: Path) -> Any:
    """Import the core package of git revision `rev` as a separate package; return the module."""
    name = "specscope_ab_" + "".join(c if c.isalnum() else "_" for c in rev)
    blob = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", rev, "core"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(into / "pkg", filter="data")
    (into / "pkg" / "core").rename(into / "pkg" / name)
    for path in (into / "pkg" / name).rglob("*.py"):  # its own absolute imports, not the working tree's
        path.write_text(path.read_text(encoding="utf-8").replace("specscope.core", name), encoding="utf-8")
    sys.path.insert(0, str(into / "pkg"))
    return importlib.import_module(name)


class Variant:
    """One implementation of the decoder (a core package) plus how to run it on a prompt."""

    def __init__(self, label: str, core: Any, target, draft, k: int, sampling_kwargs: dict, eos: int | None, seed: int):
        self.label = label
        self.core = core
        sampling = core.SamplingConfig(**sampling_kwargs)
        self.dec = core.SpeculativeDecoder(
            target, core.DraftModelProposer(draft), k=k, sampling=sampling, eos_token_id=eos, seed=seed
        )

    def run(self, prompt: list[int], max_new: int) -> dict[str, Any]:
        dec = self.dec
        t_lm, d_lm = dec.target_lm, dec.proposer.lm
        parts = {key: 0.0 for key in ("draft_fwd", "draft_other", "verify_fwd", "verify_other", "bookkeeping")}
        tokens: list[int] = []
        rounds = draft_forwards = 0
        started = time.perf_counter()
        # CachedLM counters are reset at the start of a run, i.e. inside the first next().
        last_t = last_d = 0.0
        for rnd in dec.start(prompt, max_new):
            t_f, d_f = t_lm.forward_s - last_t, d_lm.forward_s - last_d
            last_t, last_d = t_lm.forward_s, d_lm.forward_s
            tm = rnd.timings
            parts["draft_fwd"] += d_f
            parts["draft_other"] += tm.draft_s - d_f
            parts["verify_fwd"] += t_f
            parts["verify_other"] += tm.verify_s - t_f
            parts["bookkeeping"] += tm.bookkeeping_s
            tokens.extend(rnd.tokens)
            rounds += 1
            draft_forwards += rnd.draft_forwards
        wall = time.perf_counter() - started
        parts["between"] = wall - sum(parts.values())
        return {
            "tokens": tokens,
            "wall": wall,
            "rounds": rounds,
            "draft_forwards": draft_forwards,
            "parts": parts,
            "forward_s": t_lm.forward_s + d_lm.forward_s,
        }


class HFVariant:
    label = "transformers"

    def __init__(self, target, draft, k: int, sampling_kwargs: dict, eos: int | None):
        self.target, self.draft, self.k, self.eos = target, draft, k, eos
        self.sampling_kwargs = sampling_kwargs

    def run(self, prompt: list[int], max_new: int) -> dict[str, Any]:
        cfg = self.draft.generation_config
        cfg.num_assistant_tokens, cfg.num_assistant_tokens_schedule, cfg.assistant_confidence_threshold = (
            self.k,
            "constant",
            0.0,
        )
        ids = torch.tensor([prompt])
        kw: dict[str, Any] = {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "max_new_tokens": max_new,
            "eos_token_id": self.eos,
            "pad_token_id": self.eos if self.eos is not None else 0,
            "assistant_model": self.draft,
        }
        t = self.sampling_kwargs.get("temperature", 1.0)
        if t == 0:
            kw["do_sample"] = False
        else:
            kw.update(do_sample=True, temperature=t, top_k=None, top_p=1.0)
        started = time.perf_counter()
        with torch.inference_mode():
            out = self.target.generate(**kw)
        wall = time.perf_counter() - started
        return {"tokens": out[0, len(prompt) :].tolist(), "wall": wall, "rounds": 0, "parts": {}, "forward_s": None}


def run_all(variant, prompts: list[list[int]], max_new: int) -> dict[str, Any]:
    """One repetition of a variant: every prompt once; sums over the prompts."""
    runs = [variant.run(p, max_new) for p in prompts]
    total: dict[str, Any] = {
        "tokens": [r["tokens"] for r in runs],
        "n_tokens": sum(len(r["tokens"]) for r in runs),
        "wall": sum(r["wall"] for r in runs),
        "rounds": sum(r["rounds"] for r in runs),
    }
    if runs[0]["parts"]:
        total["parts"] = {key: sum(r["parts"][key] for r in runs) for key in runs[0]["parts"]}
        total["forward_s"] = sum(r["forward_s"] for r in runs)
        total["draft_forwards"] = sum(r["draft_forwards"] for r in runs)
    return total


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def report(mode: str, variants: list, reps: list[dict[str, dict]]) -> None:
    print(f"\n== {mode}: medians over {len(reps)} repetitions")
    keys = ("draft_fwd", "draft_other", "verify_fwd", "verify_other", "bookkeeping", "between")
    head = (
        f"{'variant':<14}{'tok/s':>9}{'rounds':>8}"
        + "".join(f"{k:>13}" for k in keys)
        + f"{'orch.':>8}{'ms/draft step':>15}"
    )
    print(head)
    for v in variants:
        rows = [rep[v.label] for rep in reps]
        tps = median([r["n_tokens"] / r["wall"] for r in rows])
        line = f"{v.label:<14}{tps:>9.1f}"
        if "parts" in rows[0]:
            n_rounds = rows[0]["rounds"]
            line += f"{n_rounds:>8}"
            for k in keys:
                line += f"{median([1e3 * r['parts'][k] / r['rounds'] for r in rows]):>13.3f}"
            orch = median([1 - r["forward_s"] / r["wall"] for r in rows])
            step = median(
                [
                    1e3 * (r["parts"]["draft_fwd"] + r["parts"]["draft_other"]) / max(1, r["draft_forwards"])
                    for r in rows
                ]
            )
            line += f"{100 * orch:>7.1f}%{step:>15.3f}"
        print(line)
    base = variants[0].label
    for v in variants[1:]:
        if v.label == "transformers":
            continue
        ratios = [
            rep[v.label]["n_tokens"] / rep[v.label]["wall"] / (rep[base]["n_tokens"] / rep[base]["wall"])
            for rep in reps
        ]
        print(f"tok/s {v.label} / {base}: median {median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")
    hf = variants[-1].label
    if hf == "transformers":
        for v in variants[:-1]:
            ratios = [
                rep[v.label]["n_tokens"] / rep[v.label]["wall"] / (rep[hf]["n_tokens"] / rep[hf]["wall"])
                for rep in reps
            ]
            print(f"tok/s {v.label} / {hf}: median {median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")


def check_tokens(mode: str, variants: list, reps: list[dict[str, dict]], plain: list[list[int]] | None) -> None:
    ref = reps[0][variants[0].label]["tokens"]
    for rep in reps:
        for v in variants:
            if v.label == "transformers" and mode != "greedy":
                continue  # its sampler draws from torch's RNG: different tokens by design
            if rep[v.label]["tokens"] != ref:
                raise SystemExit(f"{mode}: tokens of {v.label} differ from {variants[0].label}")
    if plain is not None and ref != plain:
        raise SystemExit(f"{mode}: greedy tokens differ from plain greedy decoding")
    print(f"{mode}: tokens identical across variants and repetitions" + (" and equal to plain greedy" if plain else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ab", default=None, metavar="REV", help="git revision whose core/ is the baseline (A)")
    ap.add_argument("--hf", action="store_true", help="add transformers' assisted generate() as a variant")
    ap.add_argument("--models", default=None, help="folder with target/ and draft-small/ (default: bundled)")
    ap.add_argument("--draft", default="draft-small")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--prompts", type=int, default=2, help="first N bundled example prompts")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--mode", choices=("greedy", "sampled", "both"), default="both")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cprofile", choices=("greedy", "sampled"), default=None)
    ap.add_argument("--scale", action="store_true", help="a random 2-layer hidden-256 Llama pair at --vocab tokens")
    ap.add_argument("--vocab", type=int, default=151_936, help="with --scale")
    ap.add_argument("--top-k", type=int, default=0, help="the sampled mode's top-k (0: off)")
    ap.add_argument("--top-p", type=float, default=1.0, help="the sampled mode's top-p (1: off)")
    args = ap.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    from specscope import core
    from specscope.core.decode.baseline import plain_generate
    from specscope.core.loading import models as loading

    if args.scale:
        from types import SimpleNamespace

        from measure_scale import llama as random_llama  # the scale runs' random pair (scripts/ is on sys.path)

        pair = SimpleNamespace(
            target=random_llama(args.vocab, 256, 2, seed=0), draft=random_llama(args.vocab, 256, 2, seed=1)
        )
        gen = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, args.vocab, (32,), generator=gen).tolist() for _ in range(args.prompts)]
        eos = None
    else:
        if args.models:
            root = Path(args.models)
            pair = loading.load_pair(root / "target", root / args.draft, device="cpu")
        else:
            pair = loading.load_bundled(args.draft.removeprefix("draft-"), device="cpu")
        tok = pair.tokenizer
        texts = loading.example_prompts()
        prompts = [tok(p.text, add_special_tokens=False)["input_ids"] for p in texts][: args.prompts]
        eos = tok.eos_token_id
    modes = ["greedy", "sampled"] if args.mode == "both" else [args.mode]
    sampled = {"temperature": 1.0, "top_k": args.top_k, "top_p": args.top_p}
    sampling_of = {"greedy": {"temperature": 0.0}, "sampled": sampled}

    if args.cprofile:
        import cProfile
        import pstats

        v = Variant("B", core, pair.target, pair.draft, args.k, sampling_of[args.cprofile], eos, args.seed)
        run_all(v, prompts, args.max_new)
        prof = cProfile.Profile()
        prof.enable()
        run_all(v, prompts, args.max_new)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
        return 0

    tmp = tempfile.TemporaryDirectory(prefix="specscope-ab-")
    base_core = load_core_at(args.ab, Path(tmp.name)) if args.ab else None
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, sampled mode {sampled}")
    print(
        f"torch threads {torch.get_num_threads()}, k={args.k}, {len(prompts)} prompts x {args.max_new} tokens, "
        f"{args.reps} repetitions" + (f", A = core@{args.ab}, B = working tree" if args.ab else "")
    )
    for mode in modes:
        variants: list = []
        if base_core is not None:
            variants.append(Variant("A", base_core, pair.target, pair.draft, args.k, sampling_of[mode], eos, args.seed))
        variants.append(
            Variant(
                "B" if base_core is not None else "decoder",
                core,
                pair.target,
                pair.draft,
                args.k,
                sampling_of[mode],
                eos,
                args.seed,
            )
        )
        if args.hf:
            variants.append(HFVariant(pair.target, pair.draft, args.k, sampling_of[mode], eos))
        for v in variants:  # warm-up
            run_all(v, prompts, args.max_new)
        reps: list[dict[str, dict]] = []
        for i in range(args.reps):
            order = variants if i % 2 == 0 else variants[::-1]
            reps.append({v.label: run_all(v, prompts, args.max_new) for v in order})
        plain = None
        if mode == "greedy":
            plain = [
                plain_generate(pair.target, p, args.max_new, core.SamplingConfig(temperature=0.0), eos).new_tokens
                for p in prompts
            ]
        check_tokens(mode, variants, reps, plain)
        report(mode, variants, reps)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
