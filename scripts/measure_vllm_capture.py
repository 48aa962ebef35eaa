"""What specscope's capture costs vLLM: tokens/s with the capture off and on, interleaved.

For each proposer (default: `lookup` -> vLLM's ngram, and `draft:smollm2-draft`, SmolLM2's own
draft) one vLLM process (core/engines/vllm/inside/driver.py, `overhead_reps`) loads SmolLM2
once, makes one recorded run (capture on: the warm-up), then runs the same generate() `--reps`
times with the capture off and on, the order alternating each repetition (off, on / on,
off), so a drift of the machine hits both. "Off" is the capture plugin loaded but idle: each
of its wrappers returns to vLLM's own function after one file-existence check
(`capture.jsonl.off`), so the difference is what recording costs. It prints the load average
before and after each proposer: a number taken under load is not a result.

    .venv/bin/python scripts/measure_vllm_capture.py          # 5 repetitions, 32 tokens: about 3 min (estimated)
    .venv/bin/python scripts/measure_vllm_capture.py --reps 1 --max-new 8   # a quick check

Needs `specscope vllm setup` and SmolLM2 (`specscope models fetch smollm2`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

PROMPTS = ["def fibonacci(n):\n", "The capital of France is", "Once upon a time, there was a"]


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def measure(proposer: str, args: argparse.Namespace, prompts: list[list[int]], target: Path) -> dict:
    from specscope.core.draft.registry import parse_spec
    from specscope.core.engines.vllm.engine import VllmRun, checkpoint_folder, run_driver

    spec = parse_spec(proposer)
    path = str(checkpoint_folder(spec.model_ref or spec.arg, "draft")) if spec.kind != "lookup" else None
    run = VllmRun(
        target=str(target),
        prompts=prompts,
        proposer_kind=spec.kind,
        proposer_path=path,
        proposer_params=dict(spec.params),
        k=args.k,
        max_new_tokens=args.max_new,
        overhead_reps=args.reps,
        threads=args.threads,
        proposer_text=proposer,
    )
    before = _load()
    t0 = time.time()
    _, _, timing = run_driver(run, work=Path(tempfile.mkdtemp(prefix="specscope-vllm-overhead-")))
    reps = timing.get("overhead") or []
    out: dict = {"proposer": proposer, "vllm": timing.get("vllm"), "load_before": before, "load_after": _load()}
    out["wall_s"] = time.time() - t0
    for mode in ("off", "on"):
        rows = [r for r in reps if r["capture"] == mode]
        out[mode] = {
            "s": [round(r["s"], 3) for r in rows],
            "tokens_per_s": [round(r["tokens"] / r["s"], 2) for r in rows],
        }
    pairs = {}
    for r in reps:
        pairs.setdefault(r.get("rep"), {})[r["capture"]] = r["s"]
    ratios = [p["on"] / p["off"] for p in pairs.values() if "on" in p and "off" in p]
    out["on_over_off"] = [round(x, 3) for x in ratios]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--proposer", action="append", default=None, help="default: lookup and draft:smollm2-draft")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of vLLM's processes")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from specscope.core.engines.vllm.engine import VllmEngineError, checkpoint_folder
    from specscope.core.loading.models import load_tokenizer

    try:
        target = checkpoint_folder(args.target, "target")
    except VllmEngineError as exc:
        print(f"measure_vllm_capture: {exc}", file=sys.stderr)
        return 2
    tok = load_tokenizer(target)
    prompts = [list(tok(p, add_special_tokens=False)["input_ids"]) for p in PROMPTS]
    results = []
    print(
        f"target {args.target}, {len(prompts)} prompts x {args.max_new} tokens in one generate(), k={args.k}, greedy, "
        f"{args.reps} repetitions of capture off/on (alternating order); load average {_load()}",
        file=sys.stderr,
    )
    for proposer in args.proposer or ["lookup", "draft:smollm2-draft"]:
        try:
            r = measure(proposer, args, prompts, target)
        except VllmEngineError as exc:
            print(f"measure_vllm_capture: {proposer}: {exc}", file=sys.stderr)
            return 1
        results.append(r)
        off, on = statistics.median(r["off"]["tokens_per_s"]), statistics.median(r["on"]["tokens_per_s"])
        ratio = statistics.median(r["on_over_off"])
        print(
            f"{proposer:24s} vLLM {r['vllm']}: tokens/s off {off:7.2f} (min-max {min(r['off']['tokens_per_s']):.2f}-"
            f"{max(r['off']['tokens_per_s']):.2f}), on {on:7.2f} (min-max {min(r['on']['tokens_per_s']):.2f}-"
            f"{max(r['on']['tokens_per_s']):.2f}); time on/off per repetition {r['on_over_off']}, median "
            f"{ratio:.3f} ({100 * (ratio - 1):+.1f}%); load average {r['load_before']} -> {r['load_after']}; "
            f"{r['wall_s']:.0f} s"
        )
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
