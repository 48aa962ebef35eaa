"""How far two lanes stay aligned, coupled and uncoupled, on the bundled prompts.

    python scripts/measure_coupling.py                          # the full measurement (see docs/coupling.md)
    python scripts/measure_coupling.py --prompts 2 --max-new 16 --seeds 0   # a quick check

Two lane pairs on the bundled target at temperature 1 (--temperature, --top-k):
  draft vs lookup   the bundled draft-small (k=4) against prompt lookup (k=4)
  k=2 vs k=4        the bundled draft-small at k=2 against k=4
each run uncoupled (each lane's own random stream, the run seed shared) and coupled
(core.verify.coupling: `SpeculativeDecoder(coupling_seed=SEED)`, the seed shared). For every
bundled prompt and seed it records the first output position at which the lanes differ
(None: identical over the whole budget), the fraction of output positions whose tokens
agree, and each lane's acceptance rate (accepted draft tokens / drafted tokens). It prints
a markdown table per lane pair (means over the seeds) and a summary line, and writes
everything to --json.

Nothing here is a timing, so a busy machine changes no number; the run takes about
(prompts x seeds x 8 runs x max_new) decoded tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from specscope.core import DraftModelProposer, PromptLookupProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.loading.models import example_prompts, load_bundled, max_positions

PAIRS = {
    "draft vs lookup": (("draft", 4), ("lookup", 4)),
    "k=2 vs k=4": (("draft", 2), ("draft", 4)),
}


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first output position where the lanes differ (a shorter lane differs where it ends)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def aligned_fraction(a: list[int], b: list[int]) -> float:
    n = max(len(a), len(b))
    return sum(x == y for x, y in zip(a, b)) / n if n else 1.0


def lane(pair, kind: str, k: int, sampling: SamplingConfig, prompt: list[int], max_new: int, seed: int, coupled: bool):
    proposer = DraftModelProposer(pair.draft, label=pair.draft_name) if kind == "draft" else PromptLookupProposer()
    dec = SpeculativeDecoder(
        pair.target,
        proposer,
        k=k,
        sampling=sampling,
        eos_token_id=None,
        seed=seed,
        coupling_seed=seed if coupled else None,
        vectors="top",
    )
    return dec.generate(prompt, max_new, keep_rounds=False)


def measure(pair, prompts, sampling: SamplingConfig, max_new: int, seeds: list[int]) -> list[dict]:
    rows = []
    for name, prompt in prompts:
        for pair_name, ((ka, na), (kb, nb)) in PAIRS.items():
            for coupled in (False, True):
                for seed in seeds:
                    a = lane(pair, ka, na, sampling, prompt, max_new, seed, coupled)
                    b = lane(pair, kb, nb, sampling, prompt, max_new, seed, coupled)
                    rows.append(
                        {
                            "prompt": name,
                            "pair": pair_name,
                            "coupled": coupled,
                            "seed": seed,
                            "first_divergence": first_divergence(a.new_tokens, b.new_tokens),
                            "aligned": aligned_fraction(a.new_tokens, b.new_tokens),
                            "acceptance_a": a.acceptance_rate,
                            "acceptance_b": b.acceptance_rate,
                            "tokens": len(a.new_tokens),
                        }
                    )
                    print(
                        f"  {name:<28} {pair_name:<16} {'coupled' if coupled else 'uncoupled':<9} seed {seed}: "
                        f"first divergence {rows[-1]['first_divergence']}, aligned {rows[-1]['aligned']:.2f}",
                        file=sys.stderr,
                        flush=True,
                    )
    return rows


def _mean(values) -> float:
    values = list(values)
    return statistics.fmean(values) if values else float("nan")


def _div_text(rows: list[dict], max_new: int) -> str:
    """Mean first divergence over the seeds; a lane pair that never parted counts max_new (shown '≥')."""
    values = [r["first_divergence"] for r in rows]
    never = sum(v is None for v in values)
    mean = _mean(max_new if v is None else v for v in values)
    return f"{'≥' if never else ''}{mean:.1f}" + (f" ({never}/{len(values)} never)" if never else "")


def report(rows: list[dict], max_new: int) -> str:
    out = []
    for pair_name in PAIRS:
        out += [
            f"### {pair_name}",
            "",
            "| prompt | first divergence, uncoupled | coupled | aligned, uncoupled | coupled | "
            "acceptance A / B, uncoupled | coupled |",
            "|---|---|---|---|---|---|---|",
        ]
        mine = [r for r in rows if r["pair"] == pair_name]
        for prompt in dict.fromkeys(r["prompt"] for r in mine):
            cells = []
            by = {c: [r for r in mine if r["prompt"] == prompt and r["coupled"] is c] for c in (False, True)}
            cells += [_div_text(by[False], max_new), _div_text(by[True], max_new)]
            cells += [f"{_mean(r['aligned'] for r in by[c]):.2f}" for c in (False, True)]
            cells += [
                f"{_mean(r['acceptance_a'] for r in by[c]):.2f} / {_mean(r['acceptance_b'] for r in by[c]):.2f}"
                for c in (False, True)
            ]
            out.append(f"| {prompt} | " + " | ".join(cells) + " |")
        for c in (False, True):
            sel = [r for r in mine if r["coupled"] is c]
            out.append(
                f"\n{'coupled' if c else 'uncoupled'}, all prompts: aligned {_mean(r['aligned'] for r in sel):.3f}, "
                f"first divergence {_div_text(sel, max_new)}, acceptance A {_mean(r['acceptance_a'] for r in sel):.3f}"
                f" / B {_mean(r['acceptance_b'] for r in sel):.3f}"
            )
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=0, help="use the first N bundled prompts (default: all)")
    ap.add_argument("--max-new", type=int, default=64, help="tokens per lane (default: 64)")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds: run seed = coupling seed (default: 0,1,2)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    ap.add_argument("--json", type=Path, default=None, help="write every row and the settings here")
    args = ap.parse_args(argv)
    if args.temperature <= 0:
        ap.error("--temperature must be > 0: greedy lanes agree without coupling")
    torch.set_num_threads(args.threads)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    pair = load_bundled("small", device=args.device)
    limit = max_positions(pair.target) or 10**9
    prompts = []
    for ex in example_prompts()[: args.prompts or None]:
        ids = list(pair.tokenizer(ex.text, add_special_tokens=False)["input_ids"])
        prompts.append((ex.name, ids[-max(1, limit - args.max_new - 1) :]))  # the end of a long prompt
    sampling = SamplingConfig(temperature=args.temperature, top_k=args.top_k)
    started = time.perf_counter()
    rows = measure(pair, prompts, sampling, args.max_new, seeds)
    text = (
        f"bundled target + draft-small, {sampling.describe()}, {args.max_new} tokens per lane, seeds {seeds}, "
        f"{len(prompts)} prompts ({time.perf_counter() - started:.0f} s)\n\n" + report(rows, args.max_new)
    )
    print(text)
    result = {
        "settings": {
            "temperature": args.temperature,
            "top_k": args.top_k,
            "max_new": args.max_new,
            "seeds": seeds,
            "prompts": [n for n, _ in prompts],
            "device": args.device,
        },
        "rows": rows,
        "report": text,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2), encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
