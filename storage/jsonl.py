"""The JSONL trace format (docs/trace-format.md): export a stored run, import a file.

Line 1 is the run header, then one line per round in order, then (optionally) one end line.
Import validates every line before it writes anything and inserts the run in a single
transaction, so a failed import leaves the store unchanged. The first error is reported
as a TraceFormatError with its 1-based line number and the dotted path of the field.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import os
import time
import zlib
from dataclasses import dataclass, field
from typing import IO, Any, Iterator, Mapping

import numpy as np
from sqlalchemy import insert, select

from specscope.core.partial import VectorStats

from .codec import (
    DEFAULT_TOP_N,
    FULL_DTYPES,
    ZLIB_LEVEL,
    decode_top,
    decode_top_stats,
    encode_full,
    encode_full_values,
    encode_top_arrays,
    full_raw,
    top_entries,
)
from .errors import RunExistsError, TraceFormatError
from .info import library_versions as current_versions
from .schema import nodes_table, rounds_table, runs_table
from .store import TraceStore, translate_errors

FORMAT_NAME = "specscope-trace"
FORMAT_VERSION = 1
_ITEMSIZE = {"float32": 4, "float64": 8}
_RUN_STATUSES = ("completed", "interrupted", "failed", "running")
_STOP_REASONS = ("eos", "budget", "cancelled", "running")


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False, ensure_ascii=False)


# ============================================================================ export


def _dist_json(top: bytes | None, full: bytes | None) -> dict | None:
    if top is None:
        return None
    ids, probs, stats = decode_top_stats(top)
    out: dict[str, Any] = {"top_ids": ids.tolist(), "top_probs": probs.tolist(), "full": None}
    if stats is not None:
        out.update(stats._asdict())
    if full is not None:
        compressed = full[2:] if full[:1] == b"F" else zlib.compress(full_raw(full)[1], ZLIB_LEVEL)
        out["full"] = {"dtype": "float32" if full[1:2] == b"4" else "float64",
                       "zlib_base64": base64.b64encode(compressed).decode("ascii")}
    return out


def _cache_json(before: Any, peak: Any, after: Any, pending: Any) -> dict | None:
    if before is None:
        return None
    return {"before": before, "peak": peak, "after": after, "pending": list(pending or [])}


def header_json(run: Mapping[str, Any]) -> dict:
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "record": "run",
        "run_id": run["run_id"],
        "started_at": run["started_at"],
        "prompt_ids": list(run["prompt_ids"]),
        "prompt_text": run["prompt_text"],
        "config": {
            "max_new_tokens": run["max_new_tokens"],
            "k": run["k"],
            "sampling": {"temperature": run["temperature"], "top_k": run["top_k"], "top_p": run["top_p"]},
            "seed": run["seed"],
            "eos_token_id": run["eos_token_id"],
            "proposer": run["proposer"],
            "proposer_params": run["proposer_params"],
            "device": run["device"],
            "dtype": run["dtype"],
            "vocab_size": run["vocab_size"],
            "use_cache": bool(run["use_cache"]),
            "fault": run["fault"],
        },
        "models": {key: run[key] for key in ("target_name", "target_hash", "draft_name", "draft_hash", "tokenizer_name", "tokenizer_hash")},
        "library_versions": run["library_versions"],
        "extra": run["extra"],
        "storage": {"top_n": run["top_n"], "full_vectors": bool(run["full_vectors"]), "full_dtype": run["full_dtype"]},
    }


def round_json(r: Mapping[str, Any], nodes: list[Mapping[str, Any]]) -> dict:
    return {
        "record": "round",
        "index": r["round_index"],
        "prefix_len": r["prefix_len"],
        "emitted_before": r["emitted_before"],
        "remaining_budget": r["remaining_budget"],
        "k": r["k"],
        "greedy": bool(r["greedy"]),
        "nodes": [
            {
                "index": n["node_index"],
                "token": n["token"],
                "parent": n["parent"],
                "depth": n["depth"],
                "status": n["status"],
                "u": n["u"],
                "p_token": n["p_token"],
                "q_token": n["q_token"],
                "ratio": n["ratio"],
                "overlap": n["overlap"],
                "target_argmax": n["target_argmax"],
                "p": _dist_json(n["p_top"], n["p_full"]),
                "q": _dist_json(n["q_top"], n["q_full"]),
            }
            for n in nodes
        ],
        "bonus_p": _dist_json(r["bonus_top"], r["bonus_full"]),
        "rejected_node": r["rejected_node"],
        "residual": _dist_json(r["residual_top"], r["residual_full"]),
        "residual_mass": r["residual_mass"],
        "emitted": [{"token": t, "kind": kind, "node": node, "draw": draw} for t, kind, node, draw in r["emitted"]],
        "eos": bool(r["eos"]),
        "budget_stop": bool(r["budget_stop"]),
        "bonus_withheld": bool(r["bonus_withheld"]),
        "target_cache": _cache_json(r["tc_before"], r["tc_peak"], r["tc_after"], r["tc_pending"]),
        "draft_cache": _cache_json(r["dc_before"], r["dc_peak"], r["dc_after"], r["dc_pending"]),
        "timings": {"draft_s": r["draft_s"], "verify_s": r["verify_s"], "bookkeeping_s": r["bookkeeping_s"]},
        "draft_forwards": r["draft_forwards"],
        "target_forwards": r["target_forwards"],
    }


def end_json(run: Mapping[str, Any]) -> dict:
    return {
        "record": "end",
        "status": run["status"],
        "stop_reason": run["stop_reason"],
        "error": run["error"],
        "ended_at": run["ended_at"],
        "wall_s": run["wall_s"],
        "new_tokens": list(run["new_tokens"] or []),
    }


def iter_export(store: TraceStore, run_id: str, batch_size: int = 256) -> Iterator[str]:
    """The lines (without newlines) of a run's JSONL export. A run still being written is
    exported as far as it is committed, without an end line."""
    run_id = store.resolve_run_id(run_id)
    with translate_errors(f"exporting run {run_id}"):
        with store.engine.connect() as conn:
            run = conn.execute(select(runs_table).where(runs_table.c.run_id == run_id)).one()._mapping
            yield _dumps(header_json(run))
            start = 0
            while True:
                rows = [r._mapping for r in conn.execute(
                    select(rounds_table).where(rounds_table.c.run_id == run_id, rounds_table.c.round_index >= start)
                    .order_by(rounds_table.c.round_index).limit(batch_size))]
                if not rows:
                    break
                hi = rows[-1]["round_index"]
                nodes: dict[int, list] = {}
                for n in conn.execute(
                    select(nodes_table).where(nodes_table.c.run_id == run_id, nodes_table.c.round_index >= start,
                                              nodes_table.c.round_index <= hi)
                    .order_by(nodes_table.c.round_index, nodes_table.c.node_index)):
                    nodes.setdefault(n.round_index, []).append(n._mapping)
                for r in rows:
                    yield _dumps(round_json(r, nodes.get(r["round_index"], [])))
                start = hi + 1
            if run["status"] != "running":
                yield _dumps(end_json(run))


def export_run(store: TraceStore, run_id: str, out: str | os.PathLike | IO[str]) -> int:
    """Write a run as JSONL to a path (atomically) or a text file object; return the number
    of rounds written."""
    rounds = 0

    def write(fh: IO[str]) -> None:
        nonlocal rounds
        for line in iter_export(store, run_id):
            fh.write(line)
            fh.write("\n")
            rounds += line.startswith('{"record":"round"')

    if isinstance(out, (str, os.PathLike)):
        tmp = f"{os.fspath(out)}.part"
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                write(fh)
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    else:
        write(out)
    return rounds


# ============================================================================ validation


class _V:
    """Field access with errors that name the line and the field."""

    def __init__(self, line: int):
        self.line = line

    def fail(self, path: str, message: str) -> TraceFormatError:
        return TraceFormatError(self.line, path, message)

    def obj(self, value: Any, path: str) -> dict:
        if not isinstance(value, dict):
            raise self.fail(path, f"expected an object, got {_kind(value)}")
        return value

    def get(self, d: dict, key: str, path: str, kind: str, *, required: bool = True, default: Any = None,
            nullable: bool = False, choices: tuple | None = None) -> Any:
        full = f"{path}.{key}" if path else key
        if key not in d:
            if required:
                raise self.fail(full, "missing")
            return default
        return self.check(d[key], full, kind, nullable=nullable, choices=choices)

    def check(self, v: Any, path: str, kind: str, *, nullable: bool = False, choices: tuple | None = None) -> Any:
        if v is None:
            if nullable:
                return None
            raise self.fail(path, f"must not be null (expected {kind})")
        if kind == "int":
            if isinstance(v, bool) or not isinstance(v, int):
                raise self.fail(path, f"expected an integer, got {_kind(v)}")
        elif kind == "num":
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise self.fail(path, f"expected a finite number, got {_kind(v)}")
            v = float(v)
        elif kind == "bool":
            if not isinstance(v, bool):
                raise self.fail(path, f"expected true or false, got {_kind(v)}")
        elif kind == "str":
            if not isinstance(v, str):
                raise self.fail(path, f"expected a string, got {_kind(v)}")
        elif kind == "obj":
            if not isinstance(v, dict):
                raise self.fail(path, f"expected an object, got {_kind(v)}")
        elif kind == "list":
            if not isinstance(v, list):
                raise self.fail(path, f"expected an array, got {_kind(v)}")
        elif kind == "ints":
            if not isinstance(v, list):
                raise self.fail(path, f"expected an array of integers, got {_kind(v)}")
            for i, x in enumerate(v):
                self.check(x, f"{path}[{i}]", "int")
        elif kind == "any":
            pass
        else:  # pragma: no cover
            raise AssertionError(kind)
        if choices is not None and v not in choices:
            raise self.fail(path, f"expected one of {'|'.join(map(str, choices))}, got {v!r}")
        return v

    def token(self, d: dict, key: str, path: str, vocab: int, *, required: bool = True, default: Any = None, nullable: bool = False) -> Any:
        v = self.get(d, key, path, "int", required=required, default=default, nullable=nullable)
        if v is not None and not 0 <= v < vocab:
            raise self.fail(f"{path}.{key}" if path else key, f"token id {v} outside the vocabulary [0, {vocab})")
        return v


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return f"the number {v!r}"
    if isinstance(v, str):
        return f"the string {v[:40]!r}"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


@dataclass
class _Run:
    vocab: int
    top_n: int
    full_dtype: str
    greedy: bool
    prompt_len: int
    max_new_tokens: int
    row: dict
    rounds: list[dict] = field(default_factory=list)
    nodes: list[dict] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    end: dict | None = None


def _header(v: _V, d: dict, run_id: str | None) -> _Run:
    fmt = v.get(d, "format", "", "str")
    if fmt != FORMAT_NAME:
        raise v.fail("format", f"expected {FORMAT_NAME!r}, got {fmt!r}: not a specscope trace")
    version = v.get(d, "version", "", "int")
    if version > FORMAT_VERSION or version < 1:
        raise v.fail("version", f"format version {version} is not supported (this specscope reads versions 1..{FORMAT_VERSION})")
    v.get(d, "record", "", "str", choices=("run",))
    rid = v.get(d, "run_id", "", "str")
    if not rid or len(rid) > 64:
        raise v.fail("run_id", "must be a non-empty string of at most 64 characters")
    cfg = v.get(d, "config", "", "obj")
    vocab = v.get(cfg, "vocab_size", "config", "int")
    if vocab < 1:
        raise v.fail("config.vocab_size", "must be >= 1")
    prompt = v.get(d, "prompt_ids", "", "ints")
    for i, t in enumerate(prompt):
        if not 0 <= t < vocab:
            raise v.fail(f"prompt_ids[{i}]", f"token id {t} outside the vocabulary [0, {vocab})")
    sampling = v.get(cfg, "sampling", "config", "obj", required=False, default={})
    temperature = v.get(sampling, "temperature", "config.sampling", "num", required=False, default=1.0)
    top_k = v.get(sampling, "top_k", "config.sampling", "int", required=False, default=0)
    top_p = v.get(sampling, "top_p", "config.sampling", "num", required=False, default=1.0)
    if temperature < 0:
        raise v.fail("config.sampling.temperature", "must be >= 0")
    if top_k < 0:
        raise v.fail("config.sampling.top_k", "must be >= 0")
    if not 0 < top_p <= 1:
        raise v.fail("config.sampling.top_p", "must lie in (0, 1]")
    k = v.get(cfg, "k", "config", "int")
    max_new = v.get(cfg, "max_new_tokens", "config", "int")
    if k < 1:
        raise v.fail("config.k", "must be >= 1")
    if max_new < 0:
        raise v.fail("config.max_new_tokens", "must be >= 0")
    models = v.get(d, "models", "", "obj", required=False, default={})
    storage = v.get(d, "storage", "", "obj", required=False, default={})
    top_n = v.get(storage, "top_n", "storage", "int", required=False, default=DEFAULT_TOP_N)
    if top_n < 1:
        raise v.fail("storage.top_n", "must be >= 1")
    full_dtype = v.get(storage, "full_dtype", "storage", "str", required=False, default="float32", choices=tuple(FULL_DTYPES))

    def name(key: str) -> str | None:
        return v.get(models, key, "models", "str", required=False, nullable=True)

    row = {
        "run_id": run_id or rid,
        "status": "interrupted",
        "stop_reason": None,
        "error": None,
        "started_at": v.get(d, "started_at", "", "num", required=False, default=time.time()),
        "ended_at": None,
        "heartbeat_at": None,
        "writer_host": None,
        "writer_pid": None,
        "prompt_ids": prompt,
        "prompt_text": v.get(d, "prompt_text", "", "str", required=False, nullable=True),
        "max_new_tokens": max_new,
        "k": k,
        "temperature": temperature,
        "top_k": top_k,
        "top_p": top_p,
        "seed": v.get(cfg, "seed", "config", "int", required=False, default=0),
        "eos_token_id": v.token(cfg, "eos_token_id", "config", vocab, required=False, nullable=True),
        "proposer": v.get(cfg, "proposer", "config", "str", required=False, default="external"),
        "proposer_params": v.get(cfg, "proposer_params", "config", "obj", required=False, default={}),
        "device": v.get(cfg, "device", "config", "str", required=False, default="unknown"),
        "dtype": v.get(cfg, "dtype", "config", "str", required=False, default="unknown"),
        "vocab_size": vocab,
        "use_cache": v.get(cfg, "use_cache", "config", "bool", required=False, default=True),
        "fault": v.get(cfg, "fault", "config", "str", required=False, nullable=True),
        "target_name": name("target_name") or "",
        "target_hash": name("target_hash"),
        "draft_name": name("draft_name"),
        "draft_hash": name("draft_hash"),
        "tokenizer_name": name("tokenizer_name"),
        "tokenizer_hash": name("tokenizer_hash"),
        "library_versions": v.get(d, "library_versions", "", "obj", required=False, default=None),
        "extra": v.get(d, "extra", "", "obj", required=False, default={}),
        "top_n": top_n,
        "full_vectors": v.get(storage, "full_vectors", "storage", "bool", required=False, default=False),
        "full_dtype": full_dtype,
        "n_rounds": 0,
        "drafted": 0,
        "accepted": 0,
        "new_tokens": [],
        "wall_s": None,
    }
    if row["library_versions"] is None:
        row["library_versions"] = {"imported_with": current_versions()}
    return _Run(vocab=vocab, top_n=top_n, full_dtype=full_dtype, greedy=temperature == 0, prompt_len=len(prompt),
                max_new_tokens=max_new, row=row)


def _dist(v: _V, value: Any, path: str, run: _Run, *, nullable: bool = True) -> tuple[bytes | None, bytes | None, np.ndarray | None]:
    """(top blob, full blob, full vector if given) of a distribution object."""
    if value is None:
        if nullable:
            return None, None, None
        raise v.fail(path, "must not be null (expected a distribution object)")
    d = v.obj(value, path)
    vocab = run.vocab
    full_vec: np.ndarray | None = None
    full_blob: bytes | None = None
    full = d.get("full")
    if isinstance(full, list):
        if len(full) != vocab:
            raise v.fail(f"{path}.full", f"expected {vocab} probabilities (the vocabulary size), got {len(full)}")
        for i, x in enumerate(full):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
                raise v.fail(f"{path}.full[{i}]", f"expected a finite probability >= 0, got {_kind(x)}")
        full_vec = np.asarray(full, dtype=np.float64)
        full_blob = encode_full(full_vec, run.full_dtype)
    elif isinstance(full, dict):
        dtype = v.get(full, "dtype", f"{path}.full", "str", choices=tuple(FULL_DTYPES))
        data = v.get(full, "zlib_base64", f"{path}.full", "str")
        try:
            compressed = base64.b64decode(data.encode("ascii"), validate=True)
            raw = zlib.decompress(compressed)
        except (binascii.Error, ValueError, zlib.error) as exc:
            raise v.fail(f"{path}.full.zlib_base64", f"not base64 of zlib-compressed data ({exc})") from None
        if len(raw) != vocab * _ITEMSIZE[dtype]:
            raise v.fail(f"{path}.full.zlib_base64", f"decodes to {len(raw) // _ITEMSIZE[dtype]} {dtype} values, expected {vocab}")
        stored = np.frombuffer(raw, dtype="<f4" if dtype == "float32" else "<f8")
        full_vec = stored.astype(np.float64)
        full_blob = encode_full_values(stored, dtype)
        if not np.isfinite(full_vec).all() or (full_vec < 0).any():
            raise v.fail(f"{path}.full", "holds negative or non-finite probabilities")
    elif full is not None:
        raise v.fail(f"{path}.full", f"expected null, an array of {vocab} numbers or an object, got {_kind(full)}")
    if "top_ids" in d or "top_probs" in d or full_vec is None:
        ids = v.get(d, "top_ids", path, "ints")
        probs = v.get(d, "top_probs", path, "list")
        if len(ids) != len(probs):
            raise v.fail(f"{path}.top_probs", f"has {len(probs)} entries but top_ids has {len(ids)}")
        if not ids:
            raise v.fail(f"{path}.top_ids", "is empty: a distribution needs at least its most probable token")
        seen = set()
        for i, (t, p) in enumerate(zip(ids, probs)):
            if not 0 <= t < vocab:
                raise v.fail(f"{path}.top_ids[{i}]", f"token id {t} outside the vocabulary [0, {vocab})")
            if t in seen:
                raise v.fail(f"{path}.top_ids[{i}]", f"token id {t} appears twice")
            seen.add(t)
            p = v.check(p, f"{path}.top_probs[{i}]", "num")
            if not 0 <= p <= 1 + 1e-6:
                raise v.fail(f"{path}.top_probs[{i}]", f"probability {p!r} outside [0, 1]")
        ids, probs = np.asarray(ids, dtype=np.int64), np.asarray(probs, dtype=np.float64)
    else:
        ids, probs = top_entries(full_vec, run.top_n)
    stats = _stats(v, d, path, vocab, probs, full_vec)
    return encode_top_arrays(ids, probs, stats), full_blob, full_vec


_STATS_FIELDS = VectorStats._fields


def _stats(v: _V, d: dict, path: str, vocab: int, top_probs: np.ndarray, full_vec: np.ndarray | None) -> VectorStats | None:
    """The whole-vector stats of a distribution object: as given (all three fields or none),
    else computed from its full vector, else None."""
    given = [k for k in _STATS_FIELDS if d.get(k) is not None]
    if not given:
        return None if full_vec is None else VectorStats.of(full_vec)
    if len(given) < len(_STATS_FIELDS):
        missing = next(k for k in _STATS_FIELDS if k not in given)
        raise v.fail(f"{path}.{missing}", f"missing: {', '.join(_STATS_FIELDS)} are given together")
    stats = VectorStats(v.get(d, "support", path, "int"), v.get(d, "minimum", path, "num"), v.get(d, "total", path, "num"))
    positive = int(np.count_nonzero(top_probs > 0))
    if not positive <= stats.support <= vocab:
        raise v.fail(f"{path}.support", f"{stats.support} is outside [{positive}, {vocab}] (the positive top entries, the vocabulary)")
    if (stats.support == vocab) != (stats.minimum > 0) or (top_probs.size and stats.minimum > float(top_probs.min())):
        raise v.fail(f"{path}.minimum", f"{stats.minimum!r} cannot be the smallest entry of a vector with {stats.support} of "
                                        f"{vocab} entries > 0 and these top entries")
    if full_vec is not None:
        # a float32 full vector may have flushed entries below 1.4e-45 to 0: fewer > 0
        computed = VectorStats.of(full_vec)
        if not computed.support <= stats.support or not np.allclose(computed[1:], stats[1:], rtol=0, atol=1e-6):
            raise v.fail(path, f"support/minimum/total {tuple(stats)} disagree with the full vector's {tuple(computed)}")
    return stats


def _round(v: _V, d: dict, run: _Run, expected_index: int) -> None:
    vocab = run.vocab
    index = v.get(d, "index", "", "int")
    if index != expected_index:
        raise v.fail("index", f"expected round {expected_index} (rounds must be consecutive from 0), got {index}")
    emitted_before = v.get(d, "emitted_before", "", "int", required=False, default=len(run.tokens))
    if emitted_before != len(run.tokens):
        raise v.fail("emitted_before", f"earlier rounds emitted {len(run.tokens)} tokens, the line says {emitted_before}")
    raw_nodes = v.get(d, "nodes", "", "list")
    nodes = []
    first_rejected = None
    for i, raw in enumerate(raw_nodes):
        path = f"nodes[{i}]"
        n = v.obj(raw, path)
        ni = v.get(n, "index", path, "int", required=False, default=i)
        if ni != i:
            raise v.fail(f"{path}.index", f"expected {i} (nodes in index order), got {ni}")
        token = v.token(n, "token", path, vocab)
        parent = v.get(n, "parent", path, "int", required=False, default=i - 1)
        if not -1 <= parent < i:
            raise v.fail(f"{path}.parent", f"must be -1 or an earlier node index, got {parent}")
        depth = v.get(n, "depth", path, "int", required=False, default=i + 1)
        status = v.get(n, "status", path, "str", choices=("accepted", "rejected", "unvisited"))
        if status == "rejected" and first_rejected is None:
            first_rejected = i
        p_top, p_full, p_vec = _dist(v, n.get("p"), f"{path}.p", run, nullable=False)
        q_top, q_full, q_vec = _dist(v, n.get("q"), f"{path}.q", run)
        ids, probs = decode_top(p_top)
        default_p = float(p_vec[token]) if p_vec is not None else float(dict(zip(ids.tolist(), probs.tolist())).get(token, 0.0))
        p_token = v.get(n, "p_token", path, "num", required=False, default=default_p)
        default_q = None
        if q_vec is not None:
            default_q = float(q_vec[token])
        elif q_top is not None:
            qi, qp = decode_top(q_top)
            default_q = float(dict(zip(qi.tolist(), qp.tolist())).get(token, 0.0))
        q_token = v.get(n, "q_token", path, "num", required=False, default=default_q, nullable=True)
        ratio_default = (p_token / q_token) if q_token else None
        overlap_default = float(np.minimum(p_vec, q_vec).sum()) if p_vec is not None and q_vec is not None else None
        u = v.get(n, "u", path, "num", required=False, nullable=True)
        if u is not None and not 0 <= u < 1:
            raise v.fail(f"{path}.u", f"a uniform draw lies in [0, 1), got {u!r}")
        nodes.append({
            "run_id": run.row["run_id"],
            "round_index": index,
            "node_index": i,
            "token": token,
            "parent": parent,
            "depth": depth,
            "status": status,
            "u": u,
            "p_token": p_token,
            "q_token": q_token,
            "ratio": v.get(n, "ratio", path, "num", required=False, default=ratio_default, nullable=True),
            "overlap": v.get(n, "overlap", path, "num", required=False, default=overlap_default, nullable=True),
            "target_argmax": v.token(n, "target_argmax", path, vocab, required=False,
                                     default=int(np.argmax(p_vec)) if p_vec is not None else int(ids[0])),
            "p_top": p_top,
            "q_top": q_top,
            "p_full": p_full,
            "q_full": q_full,
        })
    emitted = []
    for i, raw in enumerate(v.get(d, "emitted", "", "list")):
        path = f"emitted[{i}]"
        e = v.obj(raw, path)
        node = v.get(e, "node", path, "int", required=False, nullable=True)
        if node is not None and not 0 <= node < len(nodes):
            raise v.fail(f"{path}.node", f"refers to node {node}, the round has {len(nodes)} nodes")
        draw = v.get(e, "draw", path, "num", required=False, nullable=True)
        emitted.append([v.token(e, "token", path, vocab), v.get(e, "kind", path, "str", choices=("accepted", "repaired", "bonus")), node, draw])
    res_top, res_full, _ = _dist(v, d.get("residual"), "residual", run)
    bonus_top, bonus_full, _ = _dist(v, d.get("bonus_p"), "bonus_p", run)
    prefix_default = run.prompt_len + len(run.tokens)
    k = v.get(d, "k", "", "int", required=False, default=max(1, len(nodes)))

    def cache(key: str, nullable: bool) -> tuple:
        c = v.get(d, key, "", "obj", required=False, nullable=True)
        if c is None:
            if nullable:
                return None, None, None, None
            return 0, 0, 0, []
        return (v.get(c, "before", key, "int"), v.get(c, "peak", key, "int"), v.get(c, "after", key, "int"),
                v.get(c, "pending", key, "ints", required=False, default=[]))

    tc = cache("target_cache", False)
    dc = cache("draft_cache", True)
    timings = v.get(d, "timings", "", "obj", required=False, default={})
    row = {
        "run_id": run.row["run_id"],
        "round_index": index,
        "prefix_len": v.get(d, "prefix_len", "", "int", required=False, default=prefix_default),
        "emitted_before": emitted_before,
        "remaining_budget": v.get(d, "remaining_budget", "", "int", required=False, default=run.max_new_tokens - len(run.tokens)),
        "k": k,
        "greedy": v.get(d, "greedy", "", "bool", required=False, default=run.greedy),
        "n_drafted": len(nodes),
        "n_accepted": sum(1 for n in nodes if n["status"] == "accepted"),
        "draft_tokens": [n["token"] for n in nodes],
        "emitted": emitted,
        "eos": v.get(d, "eos", "", "bool", required=False, default=False),
        "budget_stop": v.get(d, "budget_stop", "", "bool", required=False, default=False),
        "bonus_withheld": v.get(d, "bonus_withheld", "", "bool", required=False, default=False),
        "rejected_node": v.get(d, "rejected_node", "", "int", required=False, default=first_rejected, nullable=True),
        "residual_mass": v.get(d, "residual_mass", "", "num", required=False, nullable=True),
        "residual_top": res_top,
        "residual_full": res_full,
        "bonus_top": bonus_top,
        "bonus_full": bonus_full,
        "tc_before": tc[0], "tc_peak": tc[1], "tc_after": tc[2], "tc_pending": tc[3],
        "dc_before": dc[0], "dc_peak": dc[1], "dc_after": dc[2], "dc_pending": dc[3],
        "draft_s": v.get(timings, "draft_s", "timings", "num", required=False, default=0.0),
        "verify_s": v.get(timings, "verify_s", "timings", "num", required=False, default=0.0),
        "bookkeeping_s": v.get(timings, "bookkeeping_s", "timings", "num", required=False, default=0.0),
        "draft_forwards": v.get(d, "draft_forwards", "", "int", required=False, default=0),
        "target_forwards": v.get(d, "target_forwards", "", "int", required=False, default=1),
    }
    if row["rejected_node"] is not None and not 0 <= row["rejected_node"] < len(nodes):
        raise v.fail("rejected_node", f"refers to node {row['rejected_node']}, the round has {len(nodes)} nodes")
    run.rounds.append(row)
    run.nodes.extend(nodes)
    run.tokens.extend(e[0] for e in emitted)
    run.row["drafted"] += row["n_drafted"]
    run.row["accepted"] += row["n_accepted"]


def _end(v: _V, d: dict, run: _Run) -> None:
    status = v.get(d, "status", "", "str", choices=_RUN_STATUSES)
    run.row["stop_reason"] = v.get(d, "stop_reason", "", "str", required=False, nullable=True, choices=_STOP_REASONS + (None,))
    run.row["error"] = v.get(d, "error", "", "str", required=False, nullable=True)
    run.row["ended_at"] = v.get(d, "ended_at", "", "num", required=False, nullable=True)
    run.row["wall_s"] = v.get(d, "wall_s", "", "num", required=False, nullable=True)
    tokens = v.get(d, "new_tokens", "", "ints", required=False, default=None, nullable=True)
    if tokens is not None and tokens != run.tokens:
        raise v.fail("new_tokens", f"differ from the tokens the rounds emitted ({len(tokens)} vs {len(run.tokens)} tokens)")
    if status == "running":  # nobody writes an imported run: it was cut off
        status = "interrupted"
        run.row["error"] = run.row["error"] or "imported from a trace of a run in progress"
    run.row["status"] = status
    run.end = d


def read_trace(source: str | os.PathLike | IO[str], run_id: str | None = None) -> _Run:
    """Parse and validate a JSONL trace (path or text file object) into table rows."""
    fh: IO[str]
    close = False
    if isinstance(source, (str, os.PathLike)):
        fh = open(source, "r", encoding="utf-8")
        close = True
    else:
        fh = source
    try:
        run: _Run | None = None
        line_no = 0
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            v = _V(line_no)
            try:
                d = json.loads(line)
            except json.JSONDecodeError as exc:
                raise v.fail("", f"not valid JSON ({exc.msg} at column {exc.colno})") from None
            d = v.obj(d, "")
            if run is None:
                run = _header(v, d, run_id)
                continue
            if run.end is not None:
                raise v.fail("record", "nothing may follow the end record")
            record = v.get(d, "record", "", "str", choices=("round", "end"))
            if record == "round":
                _round(v, d, run, len(run.rounds))
            else:
                _end(v, d, run)
        if run is None:
            raise TraceFormatError(max(line_no, 1), "", "the file is empty: expected a run header on line 1")
        if run.end is None:
            run.row["status"] = "interrupted"
            run.row["error"] = "the trace has no end record (cut off)"
        run.row["n_rounds"] = len(run.rounds)
        run.row["new_tokens"] = list(run.tokens)
        return run
    except UnicodeDecodeError as exc:
        raise TraceFormatError(line_no + 1, "", f"not UTF-8 text ({exc.reason})") from None
    finally:
        if close:
            fh.close()


def import_run(store: TraceStore, source: str | os.PathLike | IO[str], *, run_id: str | None = None) -> str:
    """Validate a JSONL trace and insert it as one run (all or nothing); return its run id.

    run_id renames the run (e.g. to import the same file twice)."""
    run = read_trace(source, run_id)
    rid = run.row["run_id"]
    with translate_errors(f"importing run {rid}"):
        with store.transaction() as conn:
            if conn.execute(select(runs_table.c.run_id).where(runs_table.c.run_id == rid)).first():
                raise RunExistsError(f"a run with id {rid} is already in the store; import it under another id (--run-id)")
            conn.execute(insert(runs_table).values(**run.row))
            for start in range(0, len(run.rounds), 500):
                conn.execute(insert(rounds_table), run.rounds[start:start + 500])
            for start in range(0, len(run.nodes), 2000):
                conn.execute(insert(nodes_table), run.nodes[start:start + 2000])
    return rid
