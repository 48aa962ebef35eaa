"""Where a recorded run's extra time goes: writer start-up, the rounds, the final flush.

Issue 41: `specscope bench --quick` reported 28.7% tracing overhead (traced+stored wall over
the same method's untraced wall). That ratio times, for the traced run, the whole
`with TraceWriter(...)` block: the writer's start (the run row inserted and committed, the
writer thread started), the decode with every round queued, and `finish_with` (the last
rounds encoded and committed, the run row closed: a second commit). At --quick's 24 tokens
a run is a few dozen milliseconds, so two commits of a fixed cost weigh as much as the
rounds. This script times the three parts separately against the untraced run, on the
bench's models (the bundled pair, draft-small, k=4), interleaved, the order alternating
every repetition, and prints per part the median over repetitions of (part / untraced
wall) of the same repetition:

    start      TraceWriter(store, config): insert + commit of the run row, thread start
    decode     the rounds with writer.write (what recording costs per round, while the
               writer thread encodes and commits alongside)
    finish     finish_with(result): the last flush and the run row's close (commit)
    total      what the bench's tracing overhead measures (traced / untraced - 1)

Run (about a minute on a quiet 2-core machine; prints the load average):

    .venv/bin/python scripts/measure_trace_overhead.py --threads 2 --reps 15 --max-new 24 128
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-new", type=int, nargs="+", default=[24, 128], help="tokens per run (bench --quick: 24)")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.0, help="bench --quick's first mode is greedy")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
    from specscope.core.loading import models as loading
    from specscope.storage import TraceStore, TraceWriter

    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; torch threads {torch.get_num_threads()}")
    pair = loading.load_bundled("small", device="cpu")
    tok = pair.tokenizer
    prompt = tok(loading.example_prompts()[0].text, add_special_tokens=False)["input_ids"]
    dec = SpeculativeDecoder(
        pair.target,
        DraftModelProposer(pair.draft),
        k=args.k,
        sampling=SamplingConfig(temperature=args.temperature),
        eos_token_id=None,
        seed=0,
    )
    tmp = tempfile.TemporaryDirectory(prefix="specscope-trace-overhead-")
    store = TraceStore(Path(tmp.name) / "bench.sqlite")

    def untraced(max_new: int) -> dict[str, float]:
        started = time.perf_counter()
        dec.start(prompt, max_new).drain()
        return {"wall": time.perf_counter() - started}

    def traced(max_new: int) -> dict[str, float]:
        t0 = time.perf_counter()
        config = dec.run_config(prompt, max_new)
        with TraceWriter(store, config) as writer:
            t1 = time.perf_counter()
            result = dec.start(prompt, max_new, config=config).drain(writer.write)
            t2 = time.perf_counter()
            writer.finish_with(result)
            t3 = time.perf_counter()
        return {"wall": t3 - t0, "start": t1 - t0, "decode": t2 - t1, "finish": t3 - t2}

    for max_new in args.max_new:
        untraced(max_new), traced(max_new)  # warm-up
        rows: list[tuple[dict[str, float], dict[str, float]]] = []
        for rep in range(args.reps):
            if rep % 2 == 0:
                a, b = untraced(max_new), traced(max_new)
            else:
                b, a = traced(max_new), untraced(max_new)
            rows.append((a, b))
        base = statistics.median(a["wall"] for a, _ in rows)
        print(f"\n{max_new} tokens: untraced {1e3 * base:.1f} ms (median of {args.reps})")
        for part in ("start", "decode", "finish", "wall"):
            if part == "decode":  # the rounds alone: traced decode / untraced wall - 1
                shares = [b["decode"] / a["wall"] - 1 for a, b in rows]
            elif part == "wall":
                shares = [b["wall"] / a["wall"] - 1 for a, b in rows]
            else:
                shares = [b[part] / a["wall"] for a, b in rows]
            label = {"start": "start", "decode": "decode", "finish": "finish", "wall": "total"}[part]
            ms = statistics.median(b[part] for _, b in rows)
            print(
                f"  {label:<7}{1e3 * ms:>9.1f} ms   {100 * statistics.median(shares):+6.1f}% of the untraced run "
                f"({100 * min(shares):+.1f} .. {100 * max(shares):+.1f})"
            )
    print(f"\nload average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
