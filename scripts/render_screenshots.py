#!/usr/bin/env python
"""Render screenshots of the inspector's main views to PNG (offscreen, no display needed).

    python scripts/render_screenshots.py                 # -> docs/screenshots/*.png
    python scripts/render_screenshots.py --out /tmp/shots --tiny
    python scripts/render_screenshots.py --size 1024x700     # -> docs/screenshots/*-1024x700.png
    python scripts/render_screenshots.py --size 1500x920 --only compare-heads

Uses the bundled models when they are installed (else tiny random models, or always with
--tiny). Saves the window before any run (empty-window*.png: what each empty view says will
appear) and with two bad values refused under their fields (field-errors*.png; `--only
first-contact` renders just these two). Runs a sampled speculative decode, selects a round with a rejection, and
saves the
main window and each view; runs a token tree (tree-*.png); runs compare mode (draft vs lookup;
with the bundled models also the bundled EAGLE-3 head, draft-small and prompt lookup as three
coupled lanes, compare-heads*.png); and opens a trace recorded with a deliberate bug so the
Findings panel has something to show. `--only compare-heads` renders just that comparison. The Calibration tab is shown
for the sampled run and for the bundled EAGLE-3 head, clean and with the fault
head-feature-shift (calibration*.png; `--only calibration` renders just these).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def wait(predicate, timeout: float = 300.0) -> None:
    from specscope.app.gui.main_window import flush_events

    end = time.time() + timeout
    while not predicate():
        if time.time() > end:
            raise TimeoutError("timed out waiting for the window")
        flush_events(0.05)


def settle(seconds: float = 0.4) -> None:
    from specscope.app.gui.main_window import flush_events

    flush_events(seconds)


def render_tree(w, prompt: str, save) -> None:
    """Run a 3,2,1 tree of sampled children, select a node tried after a rejected sibling
    (its inspector shows p' against its q) and save the tree, inspector, timeline and plots."""
    w.run_panel.set_texts(
        {
            "prompt": prompt,
            "proposer": "draft:small,tree=3,2,1,children=sampled",
            "temperature": "0.8",
            "top_k": "0",
            "top_p": "0.95",
            "seed": "7",
            "max_new_tokens": "64",
            "eos": "auto",
        }
    )
    assert w.start_run(), w.last_error
    wait(
        lambda: w.model.stop_reason is not None and w.live.state == "idle"
    )  # the last run stays on screen until this one starts
    settle()
    model = w.model
    rounds = [model.full_round(i) for i in range(len(model.rounds))]
    tried = [(r, kids) for r in rounds for _, kids in getattr(r.tree, "tried", ()) if len(kids) > 1]
    # prefer a round whose path goes on after a rejected sibling (the richest picture)
    r, kids = max(tried, key=lambda t: (len(t[0].tree.path), len(t[1]))) if tried else (rounds[0], [0])
    sizes = w.page.splitter.sizes()  # a tree needs more room than a chain: drag the tree pane taller
    total = sum(sizes)
    w.page.splitter.setSizes([total * 22 // 100, total * 38 // 100, total - total * 60 // 100])
    w.jump_to(r.index, kids[1] if len(kids) > 1 else kids[0])
    settle(0.6)
    save(w, "tree-main-window")
    save(w.tree, "tree-draft-tree")
    save(w.timeline, "tree-timeline")
    w.page.splitter.setSizes(sizes)
    settle(0.4)
    save(w.inspector, "tree-inspector")
    # the plots on their own at a readable size (a small window tabs the dock narrow)
    from specscope.app.gui.views.plots import LivePlotsWidget

    plots = LivePlotsWidget(model, compact=True)
    plots.resize(max(640, w.width() // 2), max(480, w.height() * 2 // 3))
    plots.show()
    plots.refresh()
    settle(0.4)
    save(plots, "tree-live-plots")
    plots.close()
    w.run_panel.set_texts({"proposer": "draft:small"})  # back to a chain for what follows


def render_compare_heads(w, prompt: str, save) -> None:
    """The bundled EAGLE-3 head (A), draft-small (B) and prompt lookup (C) on one prompt,
    coupled at T = 0.7: all three lanes emit the same tokens, their acceptance differs."""
    w.run_panel.set_texts(
        {
            "prompt": prompt,
            "temperature": "0.7",
            "top_k": "0",
            "top_p": "1.0",
            "seed": "3",
            "max_new_tokens": "64",
            "eos": "auto",
        }
    )
    for side, spec in enumerate(("eagle3", "draft:small", "lookup")):
        w.compare.set_side(side, spec, 4)
    w.compare.coupled.setChecked(True)
    w.runs.start_compare()  # clears a refused Run's last_error (the first-contact shot's bad seed)
    assert w.last_error is None, w.last_error
    wait(
        lambda: (
            len(w.compare_session.results) == 3
            and all(r.stop_reason for r in w.compare_session.results)
            and w.compare_controller.state == "idle"
        )
    )
    settle(0.6)
    save(w, "compare-heads")
    w.compare.set_side(2, None, 4)  # back to two uncoupled lanes for what follows
    w.compare.coupled.setChecked(False)


def head_calibration_shots(w, hub, prompts, fallback: str, tmp: Path, save) -> None:
    """The head's Calibration screenshots on example prompt 2; skipped, with a line, where
    the bundled head cannot run (the tiny random models)."""
    try:
        render_head_calibration(w, hub, prompts[2][1] if len(prompts) > 2 else fallback, tmp, save)
    except Exception as exc:  # noqa: BLE001 - tiny models have no head
        print(f"skipped the head's calibration screenshots: {exc}", file=sys.stderr)


def render_head_calibration(w, hub, prompt: str, tmp: Path, save, tokens: int = 96) -> None:
    """Record two greedy runs of the bundled EAGLE-3 head on the bundled target, clean and
    with fault head-feature-shift, open each and save the window on its Calibration tab."""
    from specscope.core import SamplingConfig, SpeculativeDecoder
    from specscope.core.draft.registry import build_proposer
    from specscope.core.faults.zoo import faulty_decoder
    from specscope.storage import TraceStore, TraceWriter

    target, tokenizer = hub.target("cpu")
    prompt_ids = hub.encode(prompt, tokenizer, int(target.config.vocab_size))
    greedy = SamplingConfig(temperature=0)
    path = tmp / "head.sqlite"
    runs = {}
    with TraceStore(path) as store:
        for name, fault in (("calibration-head", None), ("calibration-head-fault", "head-feature-shift")):
            proposer = build_proposer("eagle3")
            dec = (
                SpeculativeDecoder(target, proposer, k=4, sampling=greedy)
                if fault is None
                else faulty_decoder(fault, target, proposer, k=4, sampling=greedy)
            )
            config = dec.run_config(prompt_ids, tokens)
            with TraceWriter(store, config) as writer:
                writer.record(dec.rounds(prompt_ids, tokens, config=config))
            runs[name] = config.run_id
    for name, run_id in runs.items():
        assert w.open_trace(str(path), run_id=run_id), w.last_error
        wait(lambda: w.replay.loaded_all)
        w.tabs.setCurrentWidget(w.calibration)
        settle(0.6)
        save(w, name)
    w.tabs.setCurrentWidget(w.page)


def smollm2_cached() -> bool:
    """Whether SmolLM2 is fetched (`specscope models fetch smollm2`): its shots need it."""
    try:
        from specscope.core.loading import catalog

        model = catalog.lookup("smollm2")
        return model is not None and catalog.cached_checkpoint(model) is not None
    except Exception:  # noqa: BLE001 - no catalog, no shots
        return False


def render_smollm2(w, save, tokens: int = 48) -> None:
    """SmolLM2-135M-Instruct (fetched) as the target, chatting with its bundled EAGLE-3 head:
    greedy, first as a chain (smollm2-*.png), then as a 16-node dynamic tree
    (smollm2-tree-*.png: the tree pane fitted to its room)."""
    from specscope.core.loading.chat import chat_prompts

    chat = chat_prompts("chat")
    user = chat[0].user if chat else "What is the capital of France?"
    w.run_panel.set_texts(
        {
            "target": "smollm2",
            "chat": "true",
            "prompt": user,
            "proposer": "eagle3",
            "k": "4",
            "temperature": "0",
            "top_k": "0",
            "top_p": "1.0",
            "seed": "0",
            "max_new_tokens": str(tokens),
            "eos": "auto",
            "stop_strings": "",
            "stop_ids": "",
        }
    )
    for name, proposer in (("smollm2", "eagle3"), ("smollm2-tree", "eagle3,tree=dynamic:nodes=16,depth=5,topk=4")):
        w.run_panel.set_texts({"proposer": proposer})
        assert w.start_run(), w.last_error
        wait(lambda: w.model.stop_reason is not None and w.live.state == "idle", timeout=900)
        settle(0.6)
        rounds = w.model.rounds
        pick = max(rounds, key=lambda r: (r.rejected_node is not None, len(r.emitted)), default=None)
        if pick is not None:
            w.jump_to(pick.index, pick.rejected_node if pick.rejected_node is not None else -1)
        settle(0.8)
        save(w, f"{name}-main-window")
        save(w.tree, f"{name}-draft-tree")
        save(w.timeline, f"{name}-timeline")
        save(w.inspector, f"{name}-inspector")
    w.run_panel.set_texts({"target": "", "chat": "false", "proposer": "draft-small"})


def first_contact_shots(w, save) -> None:
    """Before any run: what each empty view says will appear (empty-window); then two bad
    values refused under their fields, wrapped to the panel's width (field-errors)."""
    settle(0.6)
    save(w, "empty-window")
    w.run_panel.set_texts(
        {"seed": "99999999999999999999999", "tree": "dynamic:nodes=12,depth=4,topk=3", "children": "sampled"}
    )
    assert not w.start_run(), "the bad values were not refused"
    settle(0.6)
    save(w, "field-errors")
    w.run_panel.set_texts({"seed": "0", "tree": "chain", "children": "topk"})
    w.run_panel.show_errors({})
    settle(0.3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs" / "screenshots"))
    parser.add_argument(
        "--tiny", action="store_true", help="the tests' tiny random models (tests/tiny_hub.py), not the bundled ones"
    )
    parser.add_argument("--size", default="1600x1000", help="window size WxH")
    parser.add_argument("--tokens", type=int, default=160, help="max new tokens of the main run")
    parser.add_argument(
        "--only",
        choices=("compare-heads", "calibration", "first-contact", "smollm2"),
        default=None,
        help="render only these screenshots (compare-heads: the three-lane comparison; "
        "calibration: the Calibration tab's three; first-contact: the empty window "
        "and refused fields; smollm2: the fetched SmolLM2 with its EAGLE-3 head, a chain "
        "and a dynamic tree)",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    width, height = (int(v) for v in args.size.lower().split("x"))
    # the default size keeps the plain names; any other size is named after it
    suffix = "" if args.size == parser.get_default("size") else f"-{width}x{height}"

    from PySide6.QtCore import QSettings

    from specscope.app.gui import create_app
    from specscope.app.gui.main_window import MainWindow
    from specscope.app.gui.sessions.hub import ModelHub

    if args.tiny:  # the tests' tiny random models (tests/tiny_hub.py): production code has none
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.tiny_hub import TinyModelHub

    app = create_app(["render_screenshots"])  # noqa: F841 - keeps the QApplication alive
    tmp = Path(tempfile.mkdtemp(prefix="specscope-shots-"))
    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp))
    hub = TinyModelHub() if args.tiny else ModelHub()
    print(f"models: {hub.description()}")
    store = tmp / "traces.sqlite"
    settings = QSettings(str(tmp / "specscope.ini"), QSettings.Format.IniFormat)
    w = MainWindow(hub=hub, settings=settings, store_path=str(store))
    w.resize(width, height)
    w.show()
    settle()
    try:
        return render(w, hub, args, out, suffix, tmp)
    finally:
        # the decoder threads stop before the interpreter goes: a QThread destroyed while
        # running aborts the process ("QThread: Destroyed while thread ... is still running")
        if not w.closed:
            w.close()
        settle(0.1)


def render(w, hub, args, out: Path, suffix: str, tmp: Path) -> int:
    """Every screenshot; main() closes the window however this ends."""

    def save(widget, name: str) -> None:
        path = out / f"{name}{suffix}.png"
        widget.grab().save(str(path))
        print(f"wrote {path}")

    prompts = hub.example_prompts()
    copy = next((t for n, t in prompts if "copy" in n), prompts[0][1])
    if args.only in (None, "first-contact"):
        first_contact_shots(w, save)
    if args.only == "first-contact":
        return 0
    if args.only == "compare-heads":
        w.tabs.setCurrentWidget(w.compare)
        render_compare_heads(w, copy, save)
        return 0
    if args.only == "smollm2":
        render_smollm2(w, save)
        return 0

    # ---- a live sampled run
    novel = next((t for n, t in prompts if "novel" in n), prompts[0][1])
    w.run_panel.set_texts(
        {
            "prompt": novel,
            "proposer": "draft-small",
            "k": "4",
            "temperature": "0.8",
            "top_k": "0",
            "top_p": "0.95",
            "seed": "7",
            "max_new_tokens": str(args.tokens),
            "eos": "auto",
            "device": "cpu",
        }
    )
    assert w.start_run(), w.last_error
    wait(
        lambda: w.model.stop_reason is not None and w.live.state == "idle"
    )  # the last run stays on screen until this one starts
    settle()
    rounds = w.model.rounds
    pick = next(
        (r for r in rounds[len(rounds) // 3 :] if r.rejected_node is not None and r.rejected_node > 0),
        next((r for r in rounds if r.rejected_node is not None), rounds[-1]),
    )
    w.jump_to(pick.index, pick.rejected_node if pick.rejected_node is not None else -1)
    settle(0.6)
    # ---- the Calibration tab: draft-small's confidence against acceptance (the sampled run),
    # then the bundled EAGLE-3 head, clean and with a train/serve mismatch
    w.tabs.setCurrentWidget(w.calibration)
    settle(0.6)
    save(w, "calibration")
    w.tabs.setCurrentWidget(w.page)
    settle(0.3)
    if args.only == "calibration":
        head_calibration_shots(w, hub, prompts, novel, tmp, save)
        return 0
    save(w, "main-window")
    save(w.timeline, "timeline")
    save(w.inspector, "round-inspector")
    save(w.tree, "draft-tree")
    save(w.inspector.kv, "kv-cache")
    w.plots_dock.raise_()  # a small window tabs the plots with the findings: show their tab
    settle(0.4)
    w.plots.refresh()
    settle(0.2)
    save(w.plots, "live-plots")
    w.findings_dock.raise_()

    # ---- compare: draft model vs prompt lookup on a copy-heavy prompt, greedy
    w.run_panel.set_texts({"prompt": copy, "temperature": "0", "max_new_tokens": "96"})
    w.compare.set_side(0, "draft-small", 4)
    w.compare.set_side(1, "lookup", 6)
    w.runs.start_compare()
    wait(lambda: all(r.stop_reason for r in w.compare_session.results) and w.compare_controller.state == "idle")
    # greedy lanes: the "vs plain greedy" row fills in once the reference decode has run
    from specscope.app.gui.sessions.compare import CHECKING

    wait(lambda: all(ref is not None and ref != CHECKING for ref in w.compare_session.references[:2]))
    settle(0.6)
    save(w, "compare")
    if not args.tiny and not hub.missing:  # the bundled head is the bundled target's
        render_compare_heads(w, copy, save)

    # ---- a token tree (issue 18): a static tree of sampled children (after compare: a tree
    # round's inspector widens the window beyond 1024 px, which the compare shot would inherit)
    render_tree(w, novel, save)

    # ---- a trace with a deliberate bug, replayed with the checker's findings
    try:
        from specscope.core import DraftModelProposer, SamplingConfig
        from specscope.core.faults.zoo import faulty_decoder
        from specscope.storage import TraceStore, TraceWriter

        target, tokenizer = hub.target("cpu")
        draft = hub.draft("draft-small", "cpu")
        prompt_ids = hub.encode(novel, tokenizer, w.model.config.vocab_size)
        faulty = tmp / "faulty.sqlite"
        run_id = None
        from specscope.core.loading.models import bundled_path, tokenizer_sha256

        bundled_info = {
            "target_name": "specscope/target",
            "draft_name": "specscope/draft-small",
            "tokenizer_name": "specscope/target",
            "tokenizer_hash": tokenizer_sha256(bundled_path("target")),
        }
        if args.tiny or hub.missing:  # tiny random models: no tokenizer to name
            bundled_info = None
        with TraceStore(faulty) as fstore:
            for seed in range(8):
                dec = faulty_decoder(
                    "target-crop-off-by-one",
                    target,
                    DraftModelProposer(draft, label="draft-small"),
                    k=4,
                    sampling=SamplingConfig(temperature=0.8),
                    seed=seed,
                )
                config = dec.run_config(prompt_ids, 64)
                # named as the window and the CLI name the bundled pair, so the replay decodes text
                with TraceWriter(fstore, config, model_info=bundled_info, prompt_text=novel) as writer:
                    writer.record(dec.rounds(prompt_ids, 64, config=config))
                if dec.fault_rounds:
                    run_id = config.run_id
                    break
        if run_id is not None and w.open_trace(str(faulty), run_id=run_id):
            wait(lambda: w.replay.loaded_all)
            settle(0.3)
            if w.findings.findings:
                w.findings.table.selectRow(0)
                w.checks.jump_to_finding(w.findings.findings[0])
            settle(0.6)
            save(w, "replay-findings")
            save(w.inspector.kv, "kv-cache-fault")
    except Exception as exc:  # noqa: BLE001 - the other screenshots are still useful
        print(f"skipped the findings screenshot: {exc}", file=sys.stderr)
    head_calibration_shots(w, hub, prompts, novel, tmp, save)
    if args.tiny:
        pass
    elif smollm2_cached():
        render_smollm2(w, save)
    else:
        print(
            "skipped the SmolLM2 screenshots: SmolLM2 is not fetched (specscope models fetch smollm2)", file=sys.stderr
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
