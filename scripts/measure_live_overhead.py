#!/usr/bin/env python
"""How much a live run in the window is slowed by the window itself (offscreen, no display).

    python scripts/measure_live_overhead.py [--temperature 0] [--tokens 160] [--reps 5]

Runs the bundled target + draft-small on a bundled example prompt in the main window (live
views on, recording to a temporary trace store, as a user's run does), then the same
decoder headless with generate(), alternating, and prints the medians: the window's wall
time from Run to the last round, the sum of its rounds' own times (what the live plots
show) and the headless wall time. Drawing holds Python's interpreter lock, which the
decoding thread needs, so the ratios say how much the live views cost.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from render_screenshots import settle, wait


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--temperature", default="0")
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--size", default="1600x1000", help="window size WxH")
    args = ap.parse_args(argv)

    from PySide6.QtCore import QSettings

    from specscope.app.gui import create_app
    from specscope.app.gui.main_window import MainWindow
    from specscope.app.gui.sessions.hub import ModelHub
    from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder

    app = create_app(["measure_live_overhead"])  # noqa: F841 - keeps the QApplication alive
    tmp = Path(tempfile.mkdtemp(prefix="specscope-live-"))
    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp))
    hub = ModelHub()
    if hub.missing:
        print("the bundled models are not installed", file=sys.stderr)
        return 1
    w = MainWindow(
        hub=hub,
        settings=QSettings(str(tmp / "specscope.ini"), QSettings.Format.IniFormat),
        store_path=str(tmp / "traces.sqlite"),
    )
    width, height = (int(v) for v in args.size.lower().split("x"))
    w.resize(width, height)
    w.show()
    settle()
    name, prompt = next(((n, t) for n, t in hub.example_prompts() if "novel" in n), hub.example_prompts()[0])
    w.run_panel.set_texts(
        {
            "prompt": prompt,
            "proposer": "draft-small",
            "k": "4",
            "temperature": args.temperature,
            "top_k": "0",
            "top_p": "1",
            "seed": "7",
            "max_new_tokens": str(args.tokens),
            "eos": "none",
            "device": "cpu",
        }
    )
    target, tokenizer = hub.target("cpu")
    decoder = SpeculativeDecoder(
        target,
        DraftModelProposer(hub.draft("draft-small", "cpu")),
        k=4,
        sampling=SamplingConfig(temperature=float(args.temperature)),
        seed=7,
    )
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    decoder.generate(ids, args.tokens)  # warm-up
    window_s, rounds_s, headless_s = [], [], []
    for _ in range(args.reps):
        if not w.start_run():
            print(w.last_error, file=sys.stderr)
            return 1
        started = time.perf_counter()
        wait(
            lambda: w.model.stop_reason is not None and w.live.state == "idle"
        )  # the last run stays on screen until this one starts
        window_s.append(time.perf_counter() - started)
        rounds_s.append(sum(r.timings.draft_s + r.timings.verify_s + r.timings.bookkeeping_s for r in w.model.rounds))
        settle(0.5)
        started = time.perf_counter()
        decoder.generate(ids, args.tokens)
        headless_s.append(time.perf_counter() - started)

    def ratio(xs: list[float]) -> float:
        return statistics.median(x / h for x, h in zip(xs, headless_s))

    print(
        f"{name}, T={args.temperature}, {args.tokens} tokens, {len(w.model.rounds)} rounds, medians of {args.reps}: "
        f"window {statistics.median(window_s):.2f} s ({ratio(window_s):.2f}x headless), its rounds' own times "
        f"{statistics.median(rounds_s):.2f} s ({ratio(rounds_s):.2f}x), headless {statistics.median(headless_s):.2f} s"
    )
    w.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
