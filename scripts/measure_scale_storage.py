"""Storage at scale: recording, checking, exporting, importing and opening a long run.

For each size (default 100,000 and 1,000,000 rounds) each step runs in its own child
process, which reports its wall time (after its imports) and peak RSS (ru_maxrss of that
process, imports included), so one step's memory never hides in another's:

    record   TraceWriter (thread backend, the default) writes the run into a new SQLite store
    check    `specscope check DB --run ID --json` (the streaming checker)
    export   `specscope export DB ID -o FILE.jsonl`
    import   `specscope import FILE.jsonl --db OTHER.sqlite`
    open     the inspector (offscreen Qt) opens the stored run: time to the first paint of the
             timeline with rounds in it, then to every round loaded, RSS at both. The window's
             own checker, which `specscope open` runs after loading (streaming the stored
             rounds, as the check step does), is switched off unless --open-checker is given

How the rounds are made (stated with the numbers): a real decoder run of a tiny random-init
Llama pair (vocabulary 256, hidden 32, 1 layer target and a noisy copy as draft, k=1, T=1,
`SpeculativeDecoder` through its public API) gives --real-rounds real rounds; the run of N
rounds repeats rounds 1..m-2 of it in order with their positions shifted (index,
emitted_before, prefix_len, remaining budget, cache lengths) and the first and last rounds
left out (the first fills the caches, the last stopped at the budget), so every round is a real
decoder record and the whole run is consistent for the checker (0 findings expected). A
single real decode of 10^6 rounds would need a context of about 1.5 million tokens, which
no tiny model's cache handles in reasonable time; the store, the checker, export, import and
the GUI do the same work per round either way. The writer encodes and commits every one of
the N rounds (top-8 per distribution, no full vectors).

Usage (the numbers in BENCHMARKS.md come from a quiet machine):

    OMP_NUM_THREADS=1 .venv/bin/python scripts/measure_scale_storage.py --sizes 100000 1000000 \\
        --out /tmp/scale-storage --markdown /tmp/scale-storage/fragment.md
    .venv/bin/python scripts/measure_scale_storage.py --sizes 2000 10000 --out /tmp/scale-small   # a quick check

At 10^6 rounds the files take about 0.7 GB (store), 0.7 GB (imported copy) and 1.7 GB (JSONL)
under --out, and the whole measurement takes on the order of an hour; `--steps` runs a subset.

The markdown fragment goes between <!-- scale:begin --> and <!-- scale:end --> in
BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

RUN_ID = "scale"
STEPS = ("record", "check", "export", "import", "open")
VOCAB = 256
TOP_N = 8


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# ---------------------------------------------------------------------------- rounds


def real_rounds(n_real: int) -> tuple[list, object]:
    """Rounds of one real decoder run of the tiny pair (k=1, T=1), and its config."""
    import torch

    from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
    from tests.tiny_models import noisy_copy, tiny_lm

    torch.set_num_threads(1)
    target = tiny_lm("llama", vocab=VOCAB, seed=0, layers=1, hidden=32, init_range=0.3)
    draft = noisy_copy(target, 0.05)
    decoder = SpeculativeDecoder(
        target,
        DraftModelProposer(draft, label="tiny-draft"),
        k=1,
        sampling=SamplingConfig(temperature=1.0),
        seed=3,
        target_name="tiny-target",
    )
    prompt = [5, 9, 14, 5, 9, 3, 7]
    max_new = min(2 * n_real, 480)  # the tiny models' positions stop at 512
    config = decoder.run_config(prompt, max_new)
    rounds = []
    for rnd in decoder.rounds(prompt, max_new, config=config):
        rounds.append(rnd)
        if len(rounds) >= n_real:
            break
    return rounds, config


def _shift(cache, delta: int):
    if cache is None:
        return None
    return dataclasses.replace(cache, before=cache.before + delta, peak=cache.peak + delta, after=cache.after + delta)


def cycled(base: list, config, n: int):
    """(config, generator of n rounds): rounds 1..m-2 of `base` (not the first, which fills the
    caches, nor the last, which may stop at the budget), repeated with shifted positions."""
    cycle = base[1:-1]
    total = sum(len(cycle[i % len(cycle)].emitted) for i in range(n))
    # the cycled rounds pass the tiny target's 512 positions by construction (a storage
    # measurement, not a decode): the run records no position limit
    config = dataclasses.replace(config, run_id=RUN_ID, max_new_tokens=total, position_limit=None)
    prompt_len = len(config.prompt_ids)

    def rounds():
        emitted = 0
        for i in range(n):
            r = cycle[i % len(cycle)]
            prefix = prompt_len + emitted
            delta = prefix - r.prefix_len
            last = i == n - 1
            yield dataclasses.replace(
                r,
                run_id=RUN_ID,
                index=i,
                prefix_len=prefix,
                emitted_before=emitted,
                remaining_budget=total - emitted,
                k=min(r.k, total - emitted),
                budget_stop=last,
                target_cache=_shift(r.target_cache, delta),
                draft_cache=_shift(r.draft_cache, delta),
            )
            emitted += len(r.emitted)

    return config, rounds()


# ---------------------------------------------------------------------------- steps (child side)


def step_record(args: argparse.Namespace) -> dict:
    from specscope.storage import TraceStore, TraceWriter

    base, config = real_rounds(args.real_rounds)
    config, rounds = cycled(base, config, args.size)
    setup_rss = rss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    with TraceStore(args.db) as store, TraceWriter(store, config, top_n=TOP_N, full_vectors=False) as writer:
        for i, rnd in enumerate(rounds):
            writer.write(rnd)
            if i % 20_000 == 19_999:
                writer.flush(timeout=600)  # a decoder is slower than this loop: keep the queue bounded
        writer.finish("completed", stop_reason="budget", timeout=600)
    wall = time.perf_counter() - t0
    return {
        "wall_s": wall,
        "cpu_s": time.process_time() - c0,
        "setup_rss_mb": setup_rss,
        "real_rounds": len(base),
        "db_mb": Path(args.db).stat().st_size / 2**20,
    }


def _cli(argv: list[str]) -> tuple[int, str]:
    from specscope.app.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    return code, out.getvalue()


def _warm() -> None:
    """The CLI's imports (torch among them), so a step's time is the step's work."""
    import specscope.app.cli
    import specscope.core.check.checker
    import specscope.storage.jsonl.transfer  # noqa: F401


def step_check(args: argparse.Namespace) -> dict:
    _warm()
    t0, c0 = time.perf_counter(), time.process_time()
    code, out = _cli(["check", str(args.db), "--run", RUN_ID, "--json"])
    wall = time.perf_counter() - t0
    report = json.loads(out)
    return {
        "wall_s": wall,
        "cpu_s": time.process_time() - c0,
        "exit": code,
        "rounds": report["runs"][0]["rounds"],
        "findings": report["findings"],
    }


def step_export(args: argparse.Namespace) -> dict:
    _warm()
    t0, c0 = time.perf_counter(), time.process_time()
    code, _ = _cli(["export", str(args.db), RUN_ID, "-o", str(args.jsonl)])
    return {
        "wall_s": time.perf_counter() - t0,
        "cpu_s": time.process_time() - c0,
        "exit": code,
        "jsonl_mb": Path(args.jsonl).stat().st_size / 2**20,
    }


def step_import(args: argparse.Namespace) -> dict:
    if Path(args.db2).exists():
        Path(args.db2).unlink()
    _warm()
    t0, c0 = time.perf_counter(), time.process_time()
    code, _ = _cli(["import", str(args.jsonl), "--db", str(args.db2)])
    return {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "exit": code}


def step_open(args: argparse.Namespace) -> dict:  # long: one event loop with its milestones
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    t0 = time.perf_counter()
    from PySide6.QtCore import QEvent, QObject, QTimer

    from specscope.app.gui import create_app
    from specscope.app.gui.main_window import MainWindow
    from specscope.app.gui.views.timeline import TokenTimelineWidget

    app = create_app([])
    window = MainWindow()
    if not args.open_checker:
        window.checker = None  # see --open-checker
    window.show()
    marks: dict[str, float] = {}

    class FirstPaint(QObject):
        def eventFilter(self, obj, event):  # Qt's name
            if event.type() == QEvent.Type.Paint and "first_paint_s" not in marks and len(window.model.rounds):
                marks["first_paint_s"] = time.perf_counter() - t0
                marks["first_paint_rss_mb"] = rss_mb()
            return False

    spy = FirstPaint()
    for timeline in window.findChildren(TokenTimelineWidget):
        timeline.viewport().installEventFilter(spy)

    def poll():
        n = len(window.model.rounds)
        if "loaded_s" not in marks and n >= args.size:
            marks["loaded_s"] = time.perf_counter() - t0
            marks["loaded_rss_mb"] = rss_mb()
            marks["loaded_peak_rss_mb"] = peak_rss_mb()
        if "loaded_s" in marks and window.replay.loaded_all and window.model.stop_reason is not None:
            marks["done_s"] = time.perf_counter() - t0
            app.quit()
        elif time.perf_counter() - t0 > args.open_timeout:
            marks["timed_out"] = True
            app.quit()

    timer = QTimer()
    timer.timeout.connect(poll)
    timer.start(20)

    def open_it():
        marks["window_ready_s"] = time.perf_counter() - t0  # imports, the window, the bundled models
        marks["window_ready_rss_mb"] = rss_mb()
        window.open_trace(str(args.db))

    QTimer.singleShot(0, open_it)
    app.exec()
    for key in ("first_paint_s", "loaded_s", "done_s"):
        if key in marks:
            marks[key.replace("_s", "_after_open_s")] = marks[key] - marks["window_ready_s"]
    # the table's wall time: from open_trace to every round in the model (the window's own
    # start-up, the same at any size, is reported apart)
    marks["wall_s"] = marks.get("loaded_after_open_s", time.perf_counter() - t0)
    marks["rounds_loaded"] = len(window.model.rounds)
    marks["findings"] = len(window.model.findings)
    return marks


def run_child(args: argparse.Namespace) -> None:
    result = {"step": args.child, "size": args.size}
    cpu = time.process_time()
    result.update(globals()[f"step_{args.child}"](args))
    result.setdefault("cpu_s", time.process_time() - cpu)  # open: start-up included
    result["peak_rss_mb"] = peak_rss_mb()
    print("RESULT " + json.dumps(result), flush=True)


# ---------------------------------------------------------------------------- driver


def measure(size: int, out: Path, args: argparse.Namespace) -> dict[str, dict]:
    out.mkdir(parents=True, exist_ok=True)
    db, db2, jsonl = out / f"scale-{size}.sqlite", out / f"scale-{size}-imported.sqlite", out / f"scale-{size}.jsonl"
    for path, made_by in ((db, "record"), (db2, "import"), (jsonl, "export")):
        if made_by in args.steps:  # a subset of --steps reuses what an earlier run made
            for extra in ("", "-wal", "-shm"):
                Path(f"{path}{extra}").unlink(missing_ok=True)
    results = {}
    for step in args.steps:
        cmd = [
            sys.executable,
            __file__,
            "--child",
            step,
            "--size",
            str(size),
            "--db",
            str(db),
            "--db2",
            str(db2),
            "--jsonl",
            str(jsonl),
            "--real-rounds",
            str(args.real_rounds),
            "--open-timeout",
            str(args.open_timeout),
        ]
        cmd += ["--open-checker"] if args.open_checker else []
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            raise SystemExit(f"step {step} at {size} rounds failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        results[step] = json.loads(line[len("RESULT ") :])
        print(f"{size:>9} {step:7} {json.dumps(results[step])}", file=sys.stderr, flush=True)
    return results


def _cell(r: dict | None, key: str, fmt: str) -> str:
    if r is None or key not in r:
        return "-"
    return format(r[key], fmt)


def markdown(sizes: list[int], results: dict[int, dict[str, dict]], args: argparse.Namespace) -> str:
    small, big = sizes[0], sizes[-1]
    a, b = results[small], results[big]
    real = a.get("record", {}).get("real_rounds", "about 300")
    lines = [
        f"Storage at scale (`scripts/measure_scale_storage.py --sizes {' '.join(map(str, sizes))}`): each step in "
        "its own "
        f"process, wall time and peak RSS (ru_maxrss) of that process. Rounds: {real} real "
        f"rounds of a tiny random-init Llama pair (vocabulary {VOCAB}, k=1, T=1) repeated with shifted positions (see "
        "the script's docstring); the writer encodes and commits every round (top-8 per distribution, no full "
        "vectors).",
        "",
        f"| step | {small:,} rounds: wall s | CPU s | peak RSS MB | {big:,} rounds: wall s | CPU s | peak RSS MB "
        "| wall ratio | CPU ratio | RSS ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for step in args.steps:
        ra, rb = a.get(step), b.get(step)
        ratio_w = rb["wall_s"] / ra["wall_s"] if ra and rb and ra["wall_s"] else float("nan")
        ratio_m = rb["peak_rss_mb"] / ra["peak_rss_mb"] if ra and rb else float("nan")
        ratio_c = rb["cpu_s"] / ra["cpu_s"] if ra and rb and ra.get("cpu_s") and rb.get("cpu_s") else float("nan")
        lines.append(
            f"| {step} | {_cell(ra, 'wall_s', '.1f')} | {_cell(ra, 'cpu_s', '.1f')} | "
            f"{_cell(ra, 'peak_rss_mb', '.0f')} | "
            f"{_cell(rb, 'wall_s', '.1f')} | {_cell(rb, 'cpu_s', '.1f')} | {_cell(rb, 'peak_rss_mb', '.0f')} | "
            f"{ratio_w:.2f} | {ratio_c:.2f} | {ratio_m:.2f} |"
        )
    lines.append("")
    lines.append(
        f"Size ratio {big / small:g}: a linear step's wall ratio is about {big / small:g}; a bounded step's RSS "
        "ratio is about 1. The open row's wall time runs from `open_trace` to every round in the window's "
        "model; its peak RSS includes the window and the bundled models it loads at start-up."
    )
    for size in sizes:
        r = results[size]
        notes = [
            f"store {_cell(r.get('record'), 'db_mb', '.0f')} MB",
            f"JSONL {_cell(r.get('export'), 'jsonl_mb', '.0f')} MB",
            f"check findings {_cell(r.get('check'), 'findings', 'd')}",
        ]
        o = r.get("open")
        if o:
            notes.append(
                f"open: window ready {_cell(o, 'window_ready_s', '.1f')} s ({_cell(o, 'window_ready_rss_mb', '.0f')} "
                "MB); "
                f"after open_trace: first paint of the timeline {_cell(o, 'first_paint_after_open_s', '.2f')} s "
                f"(RSS {_cell(o, 'first_paint_rss_mb', '.0f')} MB), all {o.get('rounds_loaded', 0):,} rounds loaded "
                f"{_cell(o, 'loaded_after_open_s', '.1f')} s (RSS {_cell(o, 'loaded_rss_mb', '.0f')} MB)"
                + (
                    ""
                    if not args.open_checker
                    else ", the window's checker "
                    + (
                        "did not finish in time"
                        if o.get("timed_out")
                        else f"done {_cell(o, 'done_after_open_s', '.1f')} s"
                    )
                )
                + f"; peak RSS {_cell(o, 'peak_rss_mb', '.0f')} MB"
            )
        lines.append(f"- {size:,} rounds: " + "; ".join(notes))
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS))
    parser.add_argument("--out", type=Path, default=Path("/tmp/specscope-scale-storage"))
    parser.add_argument("--real-rounds", type=int, default=300, help="rounds of the real decoder run that are repeated")
    parser.add_argument("--open-timeout", type=float, default=7200.0, help="seconds the open step may take")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the fragment for BENCHMARKS.md here")
    parser.add_argument(
        "--open-checker",
        action="store_true",
        help="let the window run its checker after loading (it reads every round's vectors)",
    )
    parser.add_argument("--child", choices=STEPS, help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    parser.add_argument("--db2", help=argparse.SUPPRESS)
    parser.add_argument("--jsonl", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_child(args)
        return
    sizes = sorted(args.sizes)
    results = {size: measure(size, args.out, args) for size in sizes}
    text = markdown(sizes, results, args)
    print(text)
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
