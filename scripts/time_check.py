"""Time the checker (core.check.checker.check_report) on long stored runs, this checkout's
core/check against another revision's, interleaved.

    .venv/bin/python scripts/time_check.py [--ref REV] [--reps 5] [--tokens 500]

Once, it records four long runs (greedy and sampled, chain k=4 and tree 3,2,1, tiny models,
seeded) into a store under build/time_check/ (one per --tokens, kept: later calls reuse it). Each repetition
then checks every run in a fresh process per side, A (REV's core/check, extracted with git
archive and put in place of the package's folder) and B (this checkout), alternating A/B and
B/A, and prints each side's median and min-max seconds per run, the findings count (both
sides must agree) and the load average before and after. About 1-2 minutes on a quiet machine
at the defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "build" / "time_check"
RUNS = [("chain", 0.0), ("chain", 1.0), ("tree", 0.0), ("tree", 1.0)]


def store_path(tokens: int) -> Path:
    return FOLDER / f"runs-{tokens}.sqlite"


def record(tokens: int) -> None:
    sys.path.insert(0, str(ROOT))
    from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
    from specscope.storage import TraceStore, TraceWriter
    from tests.tiny_models import noisy_copy, tiny_lm

    FOLDER.mkdir(parents=True, exist_ok=True)
    target = tiny_lm("llama", vocab=64, seed=0, init_range=0.3)
    draft = noisy_copy(target, 0.3)
    with TraceStore(store_path(tokens)) as store:
        for shape, temperature in RUNS:
            proposer = DraftModelProposer(draft, tree="3,2,1", children="sampled") if shape == "tree" else None
            dec = SpeculativeDecoder(
                target, proposer or DraftModelProposer(draft), k=4, sampling=SamplingConfig(temperature=temperature)
            )
            config = dec.run_config([1, 2, 3, 4], tokens, run_id=f"{shape}-t{temperature:g}", seed=0)
            with TraceWriter(store, config, full_vectors=True) as writer:
                writer.record(dec.rounds([1, 2, 3, 4], tokens, config=config))
            print(f"recorded {config.run_id}", flush=True)


def once(check_dir: str | None, tokens: int) -> None:
    """In a fresh process: check every stored run; print {run_id: [seconds, findings]} as JSON."""
    if check_dir:
        import specscope.core.check as package

        package.__path__[:] = [check_dir]  # REV's modules, imported under the same names
    from specscope.core.check.checker import check_report
    from specscope.storage import TraceStore

    out = {}
    with TraceStore(store_path(tokens)) as store:
        for shape, temperature in RUNS:
            run_id = f"{shape}-t{temperature:g}"
            config = store.run_config(run_id)
            rounds = store.load_rounds(run_id, full=True)
            start = time.perf_counter()
            report = check_report(config, rounds)
            out[run_id] = [time.perf_counter() - start, len(report.findings), len(rounds)]
    print(json.dumps(out))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ref", default="HEAD", help="revision A (default HEAD: the last commit)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=500)  # the tiny models read 512 positions
    ap.add_argument("--once", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.once is not None:
        once(args.once or None, args.tokens)
        return 0
    if not store_path(args.tokens).exists():
        record(args.tokens)
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "archive", args.ref, "core/check"], cwd=ROOT, check=True, capture_output=True
        ).stdout
        tar_path = Path(tmp) / "a.tar"
        tar_path.write_bytes(archive)
        with tarfile.open(tar_path) as tar:
            tar.extractall(tmp, filter="data")
        sides = {"A": str(Path(tmp) / "core" / "check"), "B": ""}
        times: dict[str, dict[str, list[float]]] = {"A": {}, "B": {}}
        counts: dict[str, dict[str, int]] = {"A": {}, "B": {}}
        print(f"load average before: {os.getloadavg()}")
        for rep in range(args.reps):
            for side in "AB" if rep % 2 == 0 else "BA":
                res = subprocess.run(
                    [sys.executable, __file__, "--once", sides[side], "--tokens", str(args.tokens)],
                    cwd=ROOT,
                    check=True,
                    capture_output=True,
                    text=True,
                )
                for run_id, (seconds, findings, n) in json.loads(res.stdout.splitlines()[-1]).items():
                    times[side].setdefault(run_id, []).append(seconds)
                    counts[side][f"{run_id} ({n} rounds)"] = findings
        print(f"load average after: {os.getloadavg()}")
        print(f"A = {args.ref}'s core/check, B = this checkout's; seconds per check_report, {args.reps} reps")
        for run_id in times["A"]:
            a, b = times["A"][run_id], times["B"][run_id]
            ratio = statistics.median(b) / statistics.median(a)
            print(
                f"  {run_id:10s} A {statistics.median(a):.3f} ({min(a):.3f}-{max(a):.3f})  "
                f"B {statistics.median(b):.3f} ({min(b):.3f}-{max(b):.3f})  B/A {ratio:.2f}"
            )
        print(f"findings A {counts['A']}")
        print(f"findings B {counts['B']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
