"""Peak memory of one bench method (target + draft weights, KV caches, the decoder's state),
measured in a child process of its own so methods do not share a high-water mark.

The child loads only the models the method runs, notes its resident set (RSS) before and
after loading, resets the kernel's high-water mark (`echo 5 > /proc/self/clear_refs`), runs
the method once over every prompt and reads the high-water mark back (VmHWM in
/proc/self/status). On CUDA it also reads torch.cuda.max_memory_allocated after a reset of
the peak stats before loading. Children are forked from a server process that has imported
torch and transformers and nothing else, so every child starts from the same state; one
measurement is reproduced in a fresh interpreter with

    python -m specscope.app.bench.memory SPEC.json

where SPEC.json is the `spec` the bench's JSON keeps beside each result.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

MB = 1024 * 1024


def _status_kb() -> dict[str, int]:
    out = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


def _reset_hwm() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _load(spec: dict[str, Any]):
    """The target and the one draft (or none) this method runs."""
    from specscope.core.loading import models as loading

    device = loading.resolve_device(spec["device"])
    draft_label, draft_ref = spec.get("draft_label"), spec.get("draft_ref")
    pair = loading.load_models(target=spec.get("target_ref"), draft=draft_ref, device=device, dtype=spec.get("dtype"))
    drafts = {draft_label: pair.draft} if draft_label is not None else {}
    return pair.target, drafts, device


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one method once over the prompts in this process; its memory numbers."""
    import torch

    from specscope.core import SamplingConfig

    from .measurement import Bench

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    start = _status_kb()
    cuda = spec["device"].startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    target, drafts, device = _load(spec)
    loaded = _status_kb()
    weights = sum(p.numel() * p.element_size() for m in [target, *drafts.values()] for p in m.parameters())
    bench = Bench(
        target,
        drafts,
        spec["prompts"],
        ks=[spec["k"]],
        max_new=spec["max_new"],
        reps=1,
        sampling=SamplingConfig(temperature=spec["temperature"]),
        eos=spec["eos"],
        device=device,
        include_transformers=spec["include_transformers"],
        include_traced=spec["include_traced"],
        specs=spec["specs"],
    )
    method = next((m for m in bench.methods if m.name == spec["method"]), None)
    if method is None:
        raise ValueError(
            f"no method {spec['method']!r} in the child's bench ({', '.join(m.name for m in bench.methods)})"
        )
    reset = _reset_hwm()
    for prompt in bench.prompts:
        method.run(prompt)
    end = _status_kb()
    out: dict[str, Any] = {
        "weights_mb": weights / MB,
        "rss_start_mb": start.get("VmRSS", 0) / 1024,
        "rss_loaded_mb": loaded.get("VmRSS", 0) / 1024,
        "peak_rss_mb": end.get("VmHWM", 0) / 1024,
        "hwm_reset": reset,
    }
    # what the models and the run added to a process that had only imported the libraries (this
    # includes the model classes' own modules, imported on first load), and what decoding added
    # on top of the loaded models: KV caches, activations, the decoder's records, allocator slack
    out["models_and_run_mb"] = out["peak_rss_mb"] - out["rss_start_mb"]
    out["decoding_added_mb"] = out["peak_rss_mb"] - out["rss_loaded_mb"]
    if cuda:
        out["cuda_max_allocated_mb"] = torch.cuda.max_memory_allocated() / MB
    return out


def _child(spec: dict[str, Any], conn: Any) -> None:
    try:
        conn.send(measure(spec))
    except Exception as exc:  # noqa: BLE001 - whatever the measurement raises is reported in the bench's JSON, not a traceback
        conn.send({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        conn.close()


def measure_all(
    specs: Sequence[dict[str, Any]],
    progress: Callable[[str], None] | None = None,
    timeout_s: float = 600.0,
    parallel: int | None = None,
) -> list[dict[str, Any]]:
    """Each spec measured in a fresh child process; results in order, each with its spec.

    Up to `parallel` children (default: 2, or 1 on a single core) run at once: a process's
    resident set and high-water mark are its own, so running beside another changes them
    only under memory pressure, and the bench's timings are over by then."""
    import multiprocessing as mp
    import os

    say = progress or (lambda msg: None)
    try:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "transformers", "specscope.core", "specscope.app.bench.memory"])
    except ValueError:  # no forkserver on this platform
        ctx = mp.get_context("spawn")
    width = parallel or min(2, os.cpu_count() or 1)
    results: list[dict[str, Any]] = []
    for first in range(0, len(specs), width):
        batch = []
        for i, spec in enumerate(specs[first : first + width], start=first):
            say(f"memory {i + 1}/{len(specs)}: {spec['method']} ({spec['mode']})")
            receive, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, args=(spec, send), daemon=True)
            proc.start()
            send.close()
            batch.append((spec, proc, receive))
        results += [{**_answer(proc, receive, timeout_s), "spec": spec} for spec, proc, receive in batch]
    return results


def _answer(proc: Any, receive: Any, timeout_s: float) -> dict[str, Any]:
    try:
        result = receive.recv() if receive.poll(timeout_s) else {"error": f"no answer within {timeout_s:.0f} s"}
    except EOFError:
        result = {"error": "the child process ended without an answer"}
    proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join()
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m specscope.app.bench.memory SPEC.json", file=sys.stderr)
        return 2
    try:
        spec = json.loads(Path(args[0]).read_text(encoding="utf-8"))
        print(json.dumps(measure(spec), indent=2))
    except (OSError, ValueError, KeyError) as exc:
        print(f"specscope bench memory: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
