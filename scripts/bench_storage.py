#!/usr/bin/env python
"""Benchmark the trace store: writer throughput, bytes per round, recording overhead.

    python scripts/bench_storage.py                       # tiny random Llama pair, vocab 64
    python scripts/bench_storage.py --vocab 8192          # tiny models with a bigger vocabulary
    python scripts/bench_storage.py --target PATH --draft PATH [--device cuda] [--dtype bfloat16]
                                                          # models load as `specscope run` loads \
them (float32 unless asked)

Numbers:
  rounds/s      rounds per second through TraceWriter (write() of every round until finish()
                returns: encoding and SQLite commits), top-N only and with full
                vectors
  commit lag    in one run of 4x --max-new-tokens, the time from each round's write() until
                the writer reports it committed (the flush interval is 0.25 s)
  bytes/round   growth of the SQLite file per round (after a WAL checkpoint), and the
                distribution-blob bytes per round (sum of length() over the blob columns)
  compressibility  compressed / raw bytes of the run's dense full vectors (stored raw) under
                zlib level 1, byte-shuffle + zlib and byte-shuffle + lzma, with CPU time per vector
  overhead      median wall time of record() (decode + store, until the last commit)
                over median wall time of plain generate(), same decoder and prompt, in
                rotating order to share the machine's noise; one traced kind per
                --writer mode (thread, process); also the median over repetitions of
                traced / untraced of the same repetition (robust to drift of the machine)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from specscope.storage import TraceStore, TraceWriter, record


def tiny(seed: int, layers: int, vocab: int, hidden: int = 32) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return LlamaForCausalLM(cfg).eval()


def load(path: str, device: str, dtype: str) -> torch.nn.Module:
    # the product's loader: float32 unless asked (transformers' own default would keep the
    # bundled checkpoints' bfloat16, which is not what `specscope run` decodes with)
    from specscope.core.loading.models import load_model

    return load_model(path, device, dtype)


def file_size(store: TraceStore) -> int:
    with store.engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    return os.path.getsize(store.path)


def blob_bytes(store: TraceStore, run_id: str) -> int:
    with store.engine.connect() as conn:
        a = conn.exec_driver_sql(
            "SELECT coalesce(sum(length(residual_top)), 0) + coalesce(sum(length(residual_full)), 0) + "
            "coalesce(sum(length(bonus_top)), 0) + coalesce(sum(length(bonus_full)), 0) FROM rounds WHERE run_id = ?",
            (run_id,),
        ).scalar()
        b = conn.exec_driver_sql(
            "SELECT coalesce(sum(length(p_top)), 0) + coalesce(sum(length(q_top)), 0) + "
            "coalesce(sum(length(p_full)), 0) + coalesce(sum(length(q_full)), 0) FROM draft_nodes WHERE run_id = ?",
            (run_id,),
        ).scalar()
    return int(a + b)


def writer_bench(rounds, config, full: bool, n: int, workdir: str, top_n: int, mode: str = "auto") -> dict:
    """Push n rounds (the decoded ones, re-indexed) through a TraceWriter into a fresh file."""
    path = os.path.join(workdir, f"writer-{'full' if full else 'top'}.sqlite")
    batch = []
    emitted = 0
    for i in range(n):
        r = rounds[i % len(rounds)]
        batch.append(dataclasses.replace(r, index=i, emitted_before=emitted))
        emitted += len(r.emitted)
    with TraceStore(path) as store:
        cfg = dataclasses.replace(config, run_id=f"bench-{'full' if full else 'top'}")
        batch = [dataclasses.replace(r, run_id=cfg.run_id) for r in batch]
        writer = TraceWriter(store, cfg, full_vectors=full, top_n=top_n, mode=mode)
        empty = file_size(store)
        t0 = time.perf_counter()
        for r in batch:
            writer.write(r)
        enqueue_s = time.perf_counter() - t0
        writer.finish("completed")
        total_s = time.perf_counter() - t0
        size = file_size(store)
        blobs = blob_bytes(store, cfg.run_id)
    return {
        "rounds": n,
        "rounds_per_s": n / total_s,
        "write_call_us": enqueue_s / n * 1e6,
        "file_bytes_per_round": (size - empty) / n,
        "blob_bytes_per_round": blobs / n,
        "flushes": writer.flushes,
    }


def compressibility(rounds, dtype: str = "float32", limit: int = 60) -> dict:
    """How far general-purpose compressors shrink the dense full vectors the writer stores
    raw (b"R": at least half the entries nonzero), as stored (`dtype`): compressed bytes
    over raw bytes and CPU time per vector, for up to `limit` of the run's p and q."""
    import lzma
    import zlib

    dists = [d for r in rounds for d in [r.bonus_p] + [a for n in r.nodes for a in (n.p, n.q)] if d is not None]
    dense = [
        np.asarray(d).astype(np.dtype(dtype).newbyteorder("<")).tobytes()
        for d in dists
        if 2 * np.count_nonzero(d) > np.size(d)
    ][:limit]
    width = np.dtype(dtype).itemsize

    def shuffled(raw: bytes) -> bytes:  # byte planes (all exponent bytes, then ...), as Blosc/HDF5 do
        return np.frombuffer(raw, dtype=np.uint8).reshape(-1, width).T.tobytes()

    methods = {
        "zlib-1": lambda b: zlib.compress(b, 1),
        "byte-shuffle + zlib-1": lambda b: zlib.compress(shuffled(b), 1),
        "byte-shuffle + lzma-6": lambda b: lzma.compress(shuffled(b), preset=6),
    }
    out = {"vectors": len(dense), "dtype": dtype}
    raw_bytes = sum(map(len, dense))
    for name, compress in methods.items():
        t0 = time.process_time()
        size = sum(len(compress(b)) for b in dense)
        cpu = time.process_time() - t0
        out[name] = {
            "ratio": size / raw_bytes if raw_bytes else None,
            "cpu_us_per_vector": cpu / max(1, len(dense)) * 1e6,
        }
    return out


def commit_lag(decoder, store: TraceStore, prompt: list[int], max_new_tokens: int, full, top_n: int, mode: str) -> dict:
    """How long rounds wait to be committed while decoding keeps the cores busy: for each
    round, the time from write() until the writer reports it committed (seen at later
    write() calls, so an upper bound by at most one round)."""
    config = decoder.run_config(prompt, max_new_tokens)
    writer = TraceWriter(store, config, full_vectors=full, top_n=top_n, mode=mode)
    written: list[float] = []
    seen: list[tuple[float, int]] = []
    gen = decoder.rounds(prompt, max_new_tokens, config=config)
    t0 = time.perf_counter()
    while True:
        try:
            rnd = next(gen)
        except StopIteration as stop:
            result = stop.value
            break
        writer.write(rnd)
        now = time.perf_counter() - t0
        written.append(now)
        seen.append((now, writer.rounds_written))
    end = time.perf_counter() - t0
    writer.finish_with(result)
    lags, j = [], 0
    for i, at in enumerate(written):
        while j < len(seen) and seen[j][1] <= i:
            j += 1
        if j < len(seen):  # rounds still uncommitted when decoding ended are not counted
            lags.append(seen[j][0] - at)
    return {
        "rounds": len(written),
        "decode_s": end,
        "flush_interval_s": writer.flush_interval,
        "max_lag_s": max(lags) if lags else None,
        "median_lag_s": statistics.median(lags) if lags else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", help="path of the target model (transformers format); default: a tiny random Llama")
    ap.add_argument("--draft", help="path of the draft model; default: a tiny random Llama")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", help="dtype of --target/--draft models (as `specscope run --dtype`)")
    ap.add_argument("--vocab", type=int, default=64, help="vocabulary of the tiny random models")
    ap.add_argument("--hidden", type=int, default=32, help="hidden size of the random target (draft: a quarter, >= 32)")
    ap.add_argument("--layers", type=int, default=2, help="layers of the random target (draft: 1)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=7, help="runs of each kind for the overhead medians")
    ap.add_argument("--writer-rounds", type=int, default=2000)
    ap.add_argument("--top-n", type=int, default=20)
    ap.add_argument(
        "--full",
        choices=("auto", "on", "off"),
        default="auto",
        help="full vectors in the overhead runs (auto: when vocab <= 1024)",
    )
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument(
        "--writer",
        default="thread",
        help="writer mode(s) to measure, comma-separated: thread, process (e.g. thread,process); "
        "the writer-throughput numbers use the first",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = ap.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    target = (
        load(args.target, args.device, args.dtype) if args.target else tiny(0, args.layers, args.vocab, args.hidden)
    )
    draft = (
        load(args.draft, args.device, args.dtype) if args.draft else tiny(1, 1, args.vocab, max(32, args.hidden // 4))
    )
    decoder = SpeculativeDecoder(
        target, DraftModelProposer(draft), k=args.k, sampling=SamplingConfig(temperature=args.temperature), seed=0
    )
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, decoder.vocab_size, args.prompt_len).tolist()
    workdir = tempfile.mkdtemp(prefix="specscope-bench-")

    # recording overhead: untraced and traced runs (one per writer mode) in rotating order
    decoder.generate(prompt, args.max_new_tokens)  # warm-up
    modes = args.writer.split(",")
    full = {"auto": None, "on": True, "off": False}[args.full]
    kinds = ["untraced"] + modes
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    with TraceStore(os.path.join(workdir, "overhead.sqlite")) as store:
        for mode in modes:  # warm-up (and the writer process's start, if any)
            record(store, decoder, prompt, args.max_new_tokens, full_vectors=full, top_n=args.top_n, mode=mode)
        for rep in range(args.repeats):
            for kind in kinds[rep % len(kinds) :] + kinds[: rep % len(kinds)]:
                t0 = time.perf_counter()
                if kind == "untraced":
                    result = decoder.generate(prompt, args.max_new_tokens)
                else:
                    record(store, decoder, prompt, args.max_new_tokens, full_vectors=full, top_n=args.top_n, mode=kind)
                times[kind].append(time.perf_counter() - t0)
    u = statistics.median(times["untraced"])
    # Two estimates: the ratio of the medians, and the median of the per-repetition ratios
    # (each repetition runs every kind back to back, so the pairs share the machine's drift).
    overhead = {
        mode: {
            "traced_s": statistics.median(times[mode]),
            "overhead_pct": 100 * (statistics.median(times[mode]) - u) / u,
            "paired_overhead_pct": 100 * statistics.median(t / v - 1 for t, v in zip(times[mode], times["untraced"])),
            "traced_all_s": times[mode],
        }
        for mode in modes
    }

    out = {
        "models": {
            "target": args.target or f"random-llama-{args.layers}L-h{args.hidden}-vocab{args.vocab}",
            "draft": args.draft or f"random-llama-1L-h{max(32, args.hidden // 4)}-vocab{args.vocab}",
            "vocab": decoder.vocab_size,
        },
        "k": args.k,
        "temperature": args.temperature,
        "max_new_tokens": args.max_new_tokens,
        "writer": args.writer,
        "rounds_per_run": len(result.rounds),
        "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "overhead": {
            "full_vectors": args.full,
            "untraced_s": u,
            "untraced_all_s": times["untraced"],
            "writers": overhead,
        },
        "commit_lag": commit_lag(
            decoder,
            TraceStore(os.path.join(workdir, "lag.sqlite")),
            prompt,
            4 * args.max_new_tokens,
            full,
            args.top_n,
            modes[0],
        ),
        "writer_top_n_only": writer_bench(
            result.rounds, result.config, False, args.writer_rounds, workdir, args.top_n, modes[0]
        ),
        "writer_full_vectors": writer_bench(
            result.rounds, result.config, True, args.writer_rounds, workdir, args.top_n, modes[0]
        ),
        "compressibility": compressibility(result.rounds),
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    m = out["models"]
    print(
        f"models: {m['target']} / {m['draft']} (vocab {m['vocab']}), k={args.k}, T={args.temperature}, "
        f"{args.max_new_tokens} new tokens = {out['rounds_per_run']} rounds/run, torch threads "
        f"{out['torch_threads']}, cpus {out['cpus']}"
    )
    o = out["overhead"]
    for mode, w in o["writers"].items():
        print(
            f"overhead, writer {mode} (full vectors: {args.full}): untraced {o['untraced_s'] * 1e3:.1f} ms, "
            "traced+stored "
            f"{w['traced_s'] * 1e3:.1f} ms (medians of {args.repeats}, rotating order) -> {w['overhead_pct']:+.1f}% "
            f"(median of the per-repetition ratios: {w['paired_overhead_pct']:+.1f}%)"
        )
    lag = out["commit_lag"]
    if lag["max_lag_s"] is not None:
        print(
            f"commit lag while decoding ({lag['rounds']} rounds, {lag['decode_s']:.1f} s, writer {modes[0]}, flush "
            f"interval {lag['flush_interval_s'] * 1e3:.0f} ms): max {lag['max_lag_s'] * 1e3:.0f} ms, median "
            f"{lag['median_lag_s'] * 1e3:.0f} ms"
        )
    for name in ("writer_top_n_only", "writer_full_vectors"):
        w = out[name]
        print(
            f"{name}: {w['rounds_per_s']:.0f} rounds/s ({w['rounds']} rounds, {w['flushes']} commits), "
            f"write() {w['write_call_us']:.1f} us, {w['file_bytes_per_round']:.0f} file bytes/round, "
            f"{w['blob_bytes_per_round']:.0f} blob bytes/round"
        )
    c = out["compressibility"]
    if c["vectors"]:
        print(
            f"dense full vectors ({c['vectors']} of the run's p and q, {c['dtype']}) compressed / raw: "
            + ", ".join(
                f"{name} {v['ratio']:.1%} at {v['cpu_us_per_vector']:.0f} us"
                for name, v in c.items()
                if isinstance(v, dict)
            )
        )
    else:
        print("dense full vectors: none in this run (greedy or filtered distributions are stored sparse)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
