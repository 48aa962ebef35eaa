"""Answer tokens/s of training/data.py's batched generation, by batch size and thread count.

    python training/measure_speed.py                   # SmolLM2, batches 16/32/64, 1 and 2 threads
    python training/measure_speed.py --wait active     # torch's default spinning OpenMP barrier
    python training/measure_speed.py --batches 128 --threads 2 --new 160     # the data run's shape
    python training/measure_speed.py --batches 64 --threads 2 --new 160 --cache transformers,roomy
                                                       # the KV cache: transformers' DynamicCache vs data.py's

Each measurement decodes `batch` chat prompts for --new tokens each (no early stop: every row
runs the full length, so the count is exact), --sampled of the rows sampled at T = 1 as the data
run samples them; configurations interleaved, --reps rounds; it prints the load average beside
every number and the median per configuration. About 2-3 minutes on a quiet 2-core machine.
Timings taken while others use the cores are not results.
"""

from __future__ import annotations

import argparse
import os
import sys

if __name__ == "__main__":
    wait = "ACTIVE" if "--wait" in sys.argv and sys.argv[sys.argv.index("--wait") + 1] == "active" else "PASSIVE"
    os.environ["OMP_WAIT_POLICY"] = wait  # before torch loads

import statistics
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import data
import smollm2_prompts as prompts_mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--batches", default="16,32,64")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--new", type=int, default=24, help="tokens decoded per row")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument(
        "--sampled",
        type=float,
        default=0.95,
        help="the fraction of rows sampled at T = 1, each with its own seed (the rest greedy); the data run samples "
        "about 95%%",
    )
    ap.add_argument("--wait", choices=("passive", "active"), default="passive")
    ap.add_argument(
        "--cache",
        default="roomy",
        help="KV caches to compare: roomy (data.py's, appends into spare room), transformers (DynamicCache)",
    )
    args = ap.parse_args()
    caches = args.cache.split(",")
    if set(caches) - {"roomy", "transformers"}:
        raise SystemExit("measure_speed: --cache takes roomy and/or transformers")
    from specscope.core.loading.chat import chat_prompt_ids

    model, tok, _ = data.load_target(args.target, 1)
    users = [p for p in prompts_mod.build_prompts(prompts_mod.docs_root()) if p["kind"] != "summary"]
    batches = [int(b) for b in args.batches.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    prompts = [chat_prompt_ids(tok, p["user"], p.get("system")) for p in users[: max(batches)]]
    print(f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}, torch {torch.__version__}, {os.cpu_count()} cpus")
    results: dict[tuple[str, int, int], list[float]] = {}
    roomy = data._new_cache
    for rep in range(args.reps + 1):  # round 0 warms up and is not counted
        for cache in caches:
            data._new_cache = roomy if cache == "roomy" else _transformers_cache
            for t in threads:
                torch.set_num_threads(t)
                for b in batches:
                    jobs = [
                        data.Job(str(i), p, sample=i < round(args.sampled * b), seed=i)
                        for i, p in enumerate(prompts[:b])
                    ]
                    t0 = time.perf_counter()
                    made = sum(len(j.answer) for j in data.generate(model, jobs, max_new=args.new, stop={-1}, batch=b))
                    rate = made / (time.perf_counter() - t0)
                    load = os.getloadavg()[0]
                    if rep:
                        results.setdefault((cache, t, b), []).append(rate)
                    print(
                        f"{'warm-up' if not rep else f'rep {rep}'}: cache {cache} threads {t} batch {b}: "
                        f"{rate:7.1f} answer tokens/s (load average {load:.2f})",
                        flush=True,
                    )
    print("median answer tokens/s:")
    for (c, t, b), v in sorted(results.items()):
        print(
            f"  cache {c} threads {t} batch {b:3d}: {statistics.median(v):7.1f}  (min {min(v):.1f}, max {max(v):.1f})"
        )


def _transformers_cache() -> object:
    from transformers import DynamicCache

    return DynamicCache()


if __name__ == "__main__":
    main()
