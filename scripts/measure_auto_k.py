"""Tokens/s of `--k auto` against fixed k = 1..6 on the bundled pair (resources/models), greedy.

Every setting decodes the same prompts (one of each bundled kind) in each repetition, the
settings interleaved and their order rotated each repetition, so a machine that slows down
during the run slows every setting alike. A row's tokens/s is its new tokens over its wall
time (verify-cost measurement of auto included: it is paid once per decoder, before its first
run, outside the timed runs, as a run's config is made before the run starts), the median
over repetitions; the outputs of every setting must be identical (greedy: plain greedy's).
The load average is printed before and after: timings taken on a loaded machine are not
results. About 1-2 minutes on 2 quiet cores with the defaults.

    .venv/bin/python scripts/measure_auto_k.py                      # draft-small, k = 1..6 and auto
    .venv/bin/python scripts/measure_auto_k.py --proposer eagle3 --reps 5 --max-new 64
    .venv/bin/python scripts/measure_auto_k.py --proposer "eagle3,stop=0.3" --ks 2,4

Auto's chosen lengths (a histogram over all its rounds) are printed under the table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import Counter

import torch

from specscope.core.decode.factory import Models, RunSettings, build_decoder
from specscope.core.loading import example_prompts, load_bundled


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--proposer", default="draft:small", help="proposer spec (default: draft:small)")
    ap.add_argument("--ks", default="1,2,3,4,5,6", help="fixed draft lengths to compare (default: 1..6)")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions (default: 3)")
    ap.add_argument("--max-new", type=int, default=48, help="new tokens per prompt (default: 48)")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (default: 2)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}  (cores: {os.cpu_count()})")

    pair = load_bundled("small", device="cpu", dtype="float32")
    models = Models(
        pair.target,
        tokenizer=pair.tokenizer,
        target_name=pair.target_name,
        draft=pair.draft,
        draft_name=pair.draft_name,
    )
    kinds: dict[str, str] = {}
    for p in example_prompts():
        kinds.setdefault(p.kind, p.text)
    prompts = [pair.tokenizer(t, add_special_tokens=False)["input_ids"] for t in kinds.values()]
    labels = [f"k={k}" for k in args.ks.split(",")] + ["auto"]
    decoders = {}
    for label in labels:
        k: int | str = "auto" if label == "auto" else int(label[2:])
        settings = RunSettings(
            proposer=args.proposer, k=k, temperature=0.0, max_new_tokens=args.max_new, eos_disabled=True
        )
        decoders[label] = build_decoder(settings, models)
        decoders[label].run_config(prompts[0], args.max_new)  # auto: measures the verify cost here, untimed

    # warm every decoder once (first-call allocations, lazy imports)
    for dec in decoders.values():
        dec.generate(prompts[0], max_new_tokens=8, keep_rounds=False)

    rates: dict[str, list[float]] = {label: [] for label in labels}
    mal: dict[str, list[float]] = {label: [] for label in labels}
    outputs: dict[str, list[list[int]]] = {}
    chosen: Counter[int] = Counter()
    for rep in range(args.reps):
        order = labels[rep % len(labels) :] + labels[: rep % len(labels)]
        for label in order:
            dec = decoders[label]
            tokens, wall, rounds = 0, 0.0, 0
            outs = []
            for ids in prompts:
                started = time.perf_counter()
                result = dec.generate(ids, max_new_tokens=args.max_new, keep_rounds=label == "auto")
                wall += time.perf_counter() - started
                tokens += len(result.new_tokens)
                rounds += result.summary.rounds
                outs.append(result.new_tokens)
                if label == "auto":
                    chosen.update(r.k for r in result.rounds if r.index > 0)
            rates[label].append(tokens / wall)
            mal[label].append(tokens / rounds)
            outputs.setdefault(label, outs)
            assert outputs[label] == outs, f"{label}: greedy output changed between repetitions"

    reference = outputs[labels[0]]
    print(
        f"\nproposer {args.proposer}, greedy, {len(prompts)} prompts ({', '.join(kinds)}), "
        f"{args.max_new} new tokens each, {args.reps} interleaved reps, {args.threads} threads"
    )
    print(f"{'setting':>8} {'tok/s':>8} {'min':>8} {'max':>8} {'tokens/round':>13} {'vs best fixed':>14}  output")
    best_fixed = max(statistics.median(rates[label]) for label in labels if label != "auto")
    for label in labels:
        med = statistics.median(rates[label])
        same = "identical" if outputs[label] == reference else "DIFFERS"
        print(
            f"{label:>8} {med:>8.1f} {min(rates[label]):>8.1f} {max(rates[label]):>8.1f} "
            f"{statistics.median(mal[label]):>13.2f} {med / best_fixed:>13.2f}x  {same}"
        )
    total = sum(chosen.values())
    hist = "  ".join(f"k={k}: {n / total:.0%}" for k, n in sorted(chosen.items()))
    print(f"\nauto's lengths (rounds after the first): {hist}")
    auto_dec = decoders["auto"]
    table = auto_dec._verify_cost_table(prompts[0])
    print("measured verify cost (ms by positions): " + "  ".join(f"{n}:{s * 1e3:.2f}" for n, s in table.items()))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0 if all(outputs[label] == reference for label in labels) else 1


if __name__ == "__main__":
    raise SystemExit(main())
