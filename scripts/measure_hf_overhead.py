"""Recording overhead of the transformers engine on transformers' own generate().

For each configuration (assisted / prompt lookup, greedy / sampled) and each prompt, the
same generate() call runs plain (`TransformersEngine.plain_generate`: nothing recorded) and
recorded, interleaved (the order rotates every call), after one warm-up of each. The
overhead of a configuration is median(recorded time) / median(plain time) - 1 over all
prompts and repetitions; the recorded tokens are checked equal to the plain ones on every
call. Everything runs in the calling (main) thread, with torch's default thread count
unless --threads says otherwise: the product's conditions (`specscope run` sets no thread
count and calls the engine from its main thread).

Recorded modes (--modes):
  drain    engine.start(...).drain(each): what the CLI, the trace writer and the bench do;
           generate() runs in the calling thread and `each` (here a no-op) is called from
           inside its loop
  stepped  iterating the run handle round by round: what the GUI does; generate() runs in
           a worker thread that hands each round over

--clock cpu times the process's CPU time instead of wall time: on a machine shared with
other work, wall times swing with the load, CPU times much less (it counts every thread of
the process, so a worker thread's work is in it too).

--self-time also reports the recorder's own work: the CPU time of the generate() thread
spent in the recorder's observers (reading the round, building the Round, the hooks) per
round, and its share of a drained call's CPU time. It does not depend on the machine's
load the way a difference of two medians does.

    python scripts/measure_hf_overhead.py                       # bundled target + draft-small, CPU
    python scripts/measure_hf_overhead.py --reps 15 --prompts 3 --max-new 48 --modes drain,stepped
    python scripts/measure_hf_overhead.py --device cuda --reps 7 --max-new 64
    python scripts/measure_hf_overhead.py --target DIR --draft DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from specscope.core import SamplingConfig
from specscope.core.engines import TransformersEngine
from specscope.core.loading.models import example_prompts, load_bundled, load_models, resolve_device

CONFIGS = (("assisted", 0.0), ("assisted", 1.0), ("lookup", 0.0), ("lookup", 1.0))
MODES = ("drain", "stepped")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _call(engine: TransformersEngine, mode: str, prompt: list[int], max_new: int, seed: int) -> tuple[list[int], int]:
    """One call; its tokens and its number of rounds (0 for plain)."""
    if mode == "plain":
        return engine.plain_generate(prompt, max_new, seed=seed), 0
    run = engine.start(prompt, max_new, seed=seed)
    if mode == "drain":
        result = run.drain(lambda rnd: None)
    else:
        for _ in run:
            pass
        result = run.result
    return result.new_tokens, result.summary.rounds


class SelfTime:
    """Thread CPU time spent in the recorder's observers, by wrapping them (class level)."""

    METHODS = (
        "_before_candidates",
        "_after_candidates",
        "_read_round",
        "_round_done",
        "_target_forward",
        "_draft_pre",
        "_draft_forward",
        "finish",
    )

    def __init__(self) -> None:
        from specscope.core.engines import hf_recorder

        self.cls, self.saved, self.seconds = hf_recorder.RoundRecorder, {}, 0.0
        for name in self.METHODS:
            self.saved[name] = original = getattr(self.cls, name)
            setattr(self.cls, name, self._timed(original))

    def _timed(self, original):
        def timed(*args, **kwargs):
            start = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds += time.thread_time() - start

        return timed

    def restore(self) -> None:
        for name, original in self.saved.items():
            setattr(self.cls, name, original)


def self_time(engine: TransformersEngine, prompts: list[list[int]], max_new: int) -> dict:
    """The recorder's own CPU time per round over one drained call per prompt."""
    timer = SelfTime()
    try:
        rounds, total = 0, 0.0
        for i, prompt in enumerate(prompts):
            start = time.thread_time()
            rounds += _call(engine, "drain", prompt, max_new, i)[1]
            total += time.thread_time() - start
    finally:
        timer.restore()
    return {
        "recorder_ms_per_round": 1e3 * timer.seconds / max(rounds, 1),
        "call_ms_per_round": 1e3 * total / max(rounds, 1),
        "recorder_share": timer.seconds / total,
    }


def measure(
    engine: TransformersEngine,
    prompts: list[list[int]],
    reps: int,
    max_new: int,
    modes: list[str],
    clock,
    device: torch.device,
) -> dict:
    names = ["plain", *modes]
    times: dict[str, list[float]] = {name: [] for name in names}
    rounds = 0
    for prompt in prompts:  # warm-up
        for name in names:
            _call(engine, name, prompt, max_new, 0)
    for rep in range(reps):
        for i, prompt in enumerate(prompts):
            shift = (rep * len(prompts) + i) % len(names)
            tokens = {}
            for name in names[shift:] + names[:shift]:
                _sync(device)
                start = clock()
                tokens[name], n = _call(engine, name, prompt, max_new, i)
                _sync(device)
                times[name].append(clock() - start)
                rounds += n if name == modes[0] else 0
            for name in modes:
                if tokens[name] != tokens["plain"]:
                    raise SystemExit(f"{name}: recorded tokens differ from plain generate() (prompt {i}, rep {rep})")
    plain = statistics.median(times["plain"])
    out: dict = {
        "plain_median_s": plain,
        "calls": len(times["plain"]),
        "mean_rounds_per_call": rounds / len(times["plain"]),
    }
    for name in modes:
        median = statistics.median(times[name])
        ratios = [b / a for a, b in zip(times["plain"], times[name])]
        out[name] = {
            "median_s": median,
            "overhead": median / plain - 1.0,
            "paired_ratio_median": statistics.median(ratios) - 1.0,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None, help="target checkpoint (default: the bundled target)")
    ap.add_argument("--draft", default="small", help="draft: 'small', 'tiny' or a checkpoint (default: small)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=3, help="how many bundled example prompts (default: 3)")
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads (default: torch's own choice, as `specscope run`; on this machine 2)",
    )
    ap.add_argument(
        "--modes", default="drain", help=f"recorded modes, comma-separated, of {', '.join(MODES)} (default: drain)"
    )
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall time (default), or the process's CPU time (steadier on a loaded machine)",
    )
    ap.add_argument("--self-time", action="store_true", help="also report the recorder's own CPU time per round")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        ap.error(f"--modes takes {', '.join(MODES)}, got {args.modes!r}")
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    pair = (
        load_bundled(args.draft, device=device)
        if args.target is None
        else load_models(target=args.target, draft=args.draft, device=device)
    )
    prompts = [
        list(pair.tokenizer(p.text, add_special_tokens=False)["input_ids"]) for p in example_prompts()[: args.prompts]
    ]
    report = {
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
        "target": pair.target_name,
        "draft": pair.draft_name,
        "reps": args.reps,
        "clock": args.clock,
        "modes": modes,
        "max_new": args.max_new,
        "k": args.k,
        "prompts": len(prompts),
        "configs": {},
    }
    for kind, temperature in CONFIGS:
        engine = TransformersEngine(
            pair.target,
            kind=kind,
            draft=pair.draft,
            k=args.k,
            sampling=SamplingConfig(temperature=temperature),
            eos_token_id=pair.tokenizer.eos_token_id,
            draft_name=pair.draft_name,
        )
        name = f"{kind} {'greedy' if temperature == 0 else f'T={temperature:g}'}"
        report["configs"][name] = measure(engine, prompts, args.reps, args.max_new, modes, clock, device)
        if args.self_time:
            report["configs"][name]["self_time"] = self_time(engine, prompts, args.max_new)
        print(f"{name}: {report['configs'][name]}", file=sys.stderr, flush=True)
    text = json.dumps(report, indent=2)
    print(text)
    for name, row in report["configs"].items():  # the table docs/transformers-engine.md shows
        cells = [f"{name}", f"plain {row['plain_median_s']:.3f} s"]
        cells += [
            f"{m} {row[m]['median_s']:.3f} s ({row[m]['overhead']:+.1%}; paired {row[m]['paired_ratio_median']:+.1%})"
            for m in modes
        ]
        if "self_time" in row:
            st = row["self_time"]
            cells.append(f"recorder {st['recorder_ms_per_round']:.3f} ms/round = {st['recorder_share']:.1%}")
        print(" | ".join(cells), file=sys.stderr)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
