#!/usr/bin/env python
"""Where start-up goes: the command line and the window, timed from outside the process.

    python scripts/measure_startup.py [--reps 5] [--window-reps 3] [--rounds 100]

Times, as the median of --reps runs each: `specscope --help`; `specscope check` of a SQLite
store holding at least --rounds rounds (made here once with `specscope run`); and
the window (run offscreen unless QT_QPA_PLATFORM or DISPLAY say otherwise): from the
process's start to the start-up window, to the end of the imports (torch, transformers,
pyqtgraph), to the main window shown, to the models ready, then from the window's close to
the process's exit (the window logs its phases through SPECSCOPE_STARTUP_LOG and closes
itself once the models are ready). Also the import time of torch, transformers and PySide6
alone, each in a fresh interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def timed(cmd: list[str], env: dict | None = None) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 1):  # check exits 1 on findings; anything else is a failure
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return elapsed


def median_of(reps: int, cmd: list[str], env: dict | None = None) -> tuple[float, list[float]]:
    times = [timed(cmd, env) for _ in range(reps)]
    return statistics.median(times), times


def window_once(home: Path) -> dict[str, float]:
    log_path = home / "startup.log"
    log_path.unlink(missing_ok=True)
    env = dict(
        os.environ,
        SPECSCOPE_STARTUP_LOG=str(log_path),
        SPECSCOPE_STARTUP_QUIT="1",
        XDG_CONFIG_HOME=str(home / "config"),
    )  # fresh settings: no remembered trace or size
    if not env.get("DISPLAY"):
        env.setdefault("QT_QPA_PLATFORM", "offscreen")
    start = time.time()
    done = subprocess.run(
        [str(BIN / "specscope")], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=600
    )
    end = time.time()
    if done.returncode != 0:
        raise SystemExit(f"the window exited with {done.returncode}: {done.stderr.strip()[-400:]}")
    marks = {}
    for line in log_path.read_text().splitlines():
        event, at = line.split()
        marks[event] = float(at)
    phases = {name: marks[name] - start for name in marks}
    phases["exit-after-close"] = end - marks["close-requested"]
    return phases


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--window-reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=100, help="about how many rounds the checked store holds")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    specscope = str(BIN / "specscope")
    result: dict[str, object] = {"load_average": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        for module in ("torch", "transformers", "PySide6.QtWidgets"):
            result[f"import {module}"] = median_of(3, [sys.executable, "-c", f"import {module}"])[0]
        result["specscope --help"], _ = median_of(args.reps, [specscope, "--help"])
        store = home / "runs.sqlite"
        # the bundled pair at k=4 emits about 2.5-3 tokens a round on this prompt: runs are
        # added until the store holds at least --rounds rounds
        rounds = 0
        while rounds < args.rounds:
            subprocess.run(
                [
                    specscope,
                    "run",
                    "--prompt",
                    "def fibonacci(n):",
                    "--max-new",
                    str(int((args.rounds - rounds) * 3.2) + 8),
                    "--db",
                    str(store),
                    "--json",
                ],
                check=True,
                stdout=subprocess.PIPE,
            )
            listing = subprocess.run(
                [specscope, "runs", str(store), "--json"], check=True, stdout=subprocess.PIPE, text=True
            ).stdout
            rounds = sum(int(json.loads(line).get("rounds") or 0) for line in listing.splitlines())
        result["store rounds"] = rounds
        result["specscope check (store)"], _ = median_of(args.reps, [specscope, "check", str(store)])
        windows = [window_once(home) for _ in range(args.window_reps)]
        for phase in windows[0] if windows else ():
            result[f"window: {phase}"] = statistics.median(w[phase] for w in windows)
    result["load_average_after"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for name, value in result.items():
            print(f"{name:40s} {value:8.2f}" + ("" if "load" in name or "rounds" in name else " s"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
