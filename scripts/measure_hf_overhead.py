"""Recording overhead of the transformers engine on transformers' own generate().

For each configuration (assisted / prompt lookup, greedy / sampled) and each prompt, the
same generate() call runs with and without the recorder, interleaved (the order alternates
every repetition), after one warm-up of each. The overhead of a configuration is
median(recorded wall time) / median(plain wall time) - 1 over all prompts and repetitions;
the recorded tokens are checked equal to the plain ones on every call.

    python scripts/measure_hf_overhead.py                       # bundled target + draft-small, CPU
    python scripts/measure_hf_overhead.py --device cuda --reps 7 --max-new 64
    python scripts/measure_hf_overhead.py --target DIR --draft DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

import torch

from specscope.core import SamplingConfig
from specscope.core.engines import TransformersEngine
from specscope.core.loading import example_prompts, load_bundled, load_models, resolve_device

CONFIGS = (("assisted", 0.0), ("assisted", 1.0), ("lookup", 0.0), ("lookup", 1.0))


def _timed(fn) -> tuple[float, list[int]]:
    """Wall time of fn() run in a fresh thread, as the engine runs generate(): torch's CPU
    thread team differs between the main thread and others (on a loaded machine a main-thread
    generate() measured several times slower), so both sides run in a non-main thread."""
    box: dict = {}

    def body() -> None:
        start = time.perf_counter()
        box["tokens"] = fn()
        box["s"] = time.perf_counter() - start

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    if "tokens" not in box:
        raise SystemExit("a generate() call failed")
    return box["s"], box["tokens"]


def measure(engine: TransformersEngine, prompts: list[list[int]], reps: int, max_new: int) -> dict:
    plain_s: list[float] = []
    recorded_s: list[float] = []
    rounds = 0
    for prompt in prompts:  # warm-up
        engine.plain_generate(prompt, max_new, seed=0)
        engine.generate(prompt, max_new, seed=0)
    for rep in range(reps):
        for i, prompt in enumerate(prompts):
            plain = lambda: engine.plain_generate(prompt, max_new, seed=i)  # noqa: E731
            result_box = []

            def recorded():
                result = engine.generate(prompt, max_new, seed=i)
                result_box.append(result)
                return result.new_tokens

            order = (plain, recorded) if (rep + i) % 2 == 0 else (recorded, plain)
            times = {}
            for fn in order:
                times[fn], tokens = _timed(fn)
                if fn is recorded:
                    rec_tokens = tokens
                else:
                    plain_tokens = tokens
            if rec_tokens != plain_tokens:
                raise SystemExit(f"recorded tokens differ from plain generate() (prompt {i}, rep {rep})")
            rounds += len(result_box[0].rounds)
            plain_s.append(times[plain])
            recorded_s.append(times[recorded])
    p, r = statistics.median(plain_s), statistics.median(recorded_s)
    ratios = sorted(b / a for a, b in zip(plain_s, recorded_s))
    return {"plain_median_s": p, "recorded_median_s": r, "overhead": r / p - 1.0,
            "paired_ratio_median": statistics.median(ratios) - 1.0, "calls": len(plain_s),
            "mean_rounds_per_call": rounds / len(plain_s)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None, help="target checkpoint (default: the bundled target)")
    ap.add_argument("--draft", default="small", help="draft: 'small', 'tiny' or a checkpoint (default: small)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=3, help="how many bundled example prompts (default: 3)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (default: 1; several threads spin-wait and swing wildly on a busy machine)")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    pair = (load_bundled(args.draft, device=device) if args.target is None
            else load_models(target=args.target, draft=args.draft, device=device))
    prompts = [list(pair.tokenizer(p.text, add_special_tokens=False)["input_ids"])
               for p in example_prompts()[: args.prompts]]
    report = {"device": str(device), "torch_threads": torch.get_num_threads(), "target": pair.target_name, "draft": pair.draft_name, "reps": args.reps,
              "max_new": args.max_new, "k": args.k, "prompts": len(prompts), "configs": {}}
    for kind, temperature in CONFIGS:
        engine = TransformersEngine(pair.target, kind=kind, draft=pair.draft, k=args.k,
                                    sampling=SamplingConfig(temperature=temperature),
                                    eos_token_id=pair.tokenizer.eos_token_id, draft_name=pair.draft_name)
        name = f"{kind} {'greedy' if temperature == 0 else f'T={temperature:g}'}"
        report["configs"][name] = measure(engine, prompts, args.reps, args.max_new)
        print(f"{name}: {report['configs'][name]}", file=sys.stderr, flush=True)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
