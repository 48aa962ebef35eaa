"""Reading a JSONL trace (docs/trace-format.md): every line validated and parsed into the
core records (RunConfig, Round with its DraftNodes, EmittedTokens, CacheStates), which are
turned into table rows by the row builder that the TraceWriter uses (storage.rows).

A distribution object becomes a PartialDistribution (top-N entries only) or a
StoredFullDistribution (a full vector) that carries the top-N and whole-vector facts as the
file gives them, so the row builder stores them unchanged. The first error is reported as a
TraceFormatError with its 1-based line number and the dotted path of the field.
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
from typing import IO, Any, Callable

import numpy as np

from specscope.core.partial import VectorStats
from specscope.core.records import CacheState, DraftNode, EmittedToken, Round, RoundTimings, RunConfig
from specscope.core.sampling import SamplingConfig

from .codec import DEFAULT_TOP_N, FULL_DTYPES, PartialDistribution, StoredFullDistribution, VectorPolicy, top_entries
from .errors import TraceFormatError
from .info import ModelInfo, library_versions as current_versions
from .rows import rounds_to_rows, run_row

FORMAT_NAME = "specscope-trace"
FORMAT_VERSION = 1
_ITEMSIZE = {"float32": 4, "float64": 8}
_RUN_STATUSES = ("completed", "interrupted", "failed", "running")
_STOP_REASONS = ("eos", "budget", "cancelled", "running")


# ============================================================================ validation


_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "num": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v), "a finite number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "obj": (lambda v: isinstance(v, dict), "an object"),
    "list": (lambda v: isinstance(v, list), "an array"),
    "ints": (lambda v: isinstance(v, list), "an array of integers"),
    "any": (lambda v: True, "anything"),
}


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
        ok, expected = _KINDS[kind]
        if not ok(v):
            raise self.fail(path, f"expected {expected}, got {_kind(v)}")
        if kind == "num":
            v = float(v)
        elif kind == "ints":
            for i, x in enumerate(v):
                self.check(x, f"{path}[{i}]", "int")
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
class ParsedTrace:
    """A validated trace as table rows: the run row, then rounds and draft_nodes rows."""

    config: RunConfig
    policy: VectorPolicy  # top-N as the header says; full vectors wherever the file has them
    row: dict
    rounds: list[dict] = field(default_factory=list)
    nodes: list[dict] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    end: dict | None = None

    @property
    def vocab(self) -> int:
        return self.config.vocab_size

    def add(self, rnd: Round) -> None:
        """Store one parsed round through the row builder."""
        rows, nodes = rounds_to_rows([rnd], self.policy)
        self.rounds.extend(rows)
        self.nodes.extend(nodes)
        self.tokens.extend(rnd.tokens)
        self.row["drafted"] += rows[0]["n_drafted"]
        self.row["accepted"] += rows[0]["n_accepted"]



# ============================================================================ header


def _header(v: _V, d: dict, run_id: str | None) -> ParsedTrace:
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
    sampling = _sampling(v, v.get(cfg, "sampling", "config", "obj", required=False, default={}))
    models = v.get(d, "models", "", "obj", required=False, default={})
    storage = v.get(d, "storage", "", "obj", required=False, default={})
    policy = _policy(v, storage)
    started_at = v.get(d, "started_at", "", "num", required=False, default=time.time())
    prompt_text = v.get(d, "prompt_text", "", "str", required=False, nullable=True)
    config = _config(v, cfg, models, run_id or rid, tuple(prompt), sampling)
    names = {key: v.get(models, key, "models", "str", required=False, nullable=True)
             for key in ("target_hash", "tokenizer_name", "tokenizer_hash", "draft_hash")}
    versions = v.get(d, "library_versions", "", "obj", required=False, default=None)
    row = run_row(config, status="interrupted", started_at=started_at, models=ModelInfo(**names),
                  library_versions=versions if versions is not None else {"imported_with": current_versions()},
                  top_n=policy.top_n, full_dtype=policy.full_dtype, prompt_text=prompt_text,
                  extra=v.get(d, "extra", "", "obj", required=False, default={}),
                  full_vectors=v.get(storage, "full_vectors", "storage", "bool", required=False, default=False))
    return ParsedTrace(config=config, policy=policy, row=row)


def _sampling(v: _V, sampling: dict) -> SamplingConfig:
    temperature = v.get(sampling, "temperature", "config.sampling", "num", required=False, default=1.0)
    top_k = v.get(sampling, "top_k", "config.sampling", "int", required=False, default=0)
    top_p = v.get(sampling, "top_p", "config.sampling", "num", required=False, default=1.0)
    if temperature < 0:
        raise v.fail("config.sampling.temperature", "must be >= 0")
    if top_k < 0:
        raise v.fail("config.sampling.top_k", "must be >= 0")
    if not 0 < top_p <= 1:
        raise v.fail("config.sampling.top_p", "must lie in (0, 1]")
    return SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)


def _policy(v: _V, storage: dict) -> VectorPolicy:
    top_n = v.get(storage, "top_n", "storage", "int", required=False, default=DEFAULT_TOP_N)
    if top_n < 1:
        raise v.fail("storage.top_n", "must be >= 1")
    full_dtype = v.get(storage, "full_dtype", "storage", "str", required=False, default="float32", choices=tuple(FULL_DTYPES))
    return VectorPolicy(top_n=top_n, full=True, full_dtype=full_dtype)


def _config(v: _V, cfg: dict, models: dict, run_id: str, prompt: tuple[int, ...], sampling: SamplingConfig) -> RunConfig:
    vocab = cfg["vocab_size"]
    k = v.get(cfg, "k", "config", "int")
    max_new = v.get(cfg, "max_new_tokens", "config", "int")
    if k < 1:
        raise v.fail("config.k", "must be >= 1")
    if max_new < 0:
        raise v.fail("config.max_new_tokens", "must be >= 0")
    return RunConfig(
        run_id=run_id,
        prompt_ids=prompt,
        max_new_tokens=max_new,
        k=k,
        sampling=sampling,
        seed=v.get(cfg, "seed", "config", "int", required=False, default=0),
        eos_token_id=v.token(cfg, "eos_token_id", "config", vocab, required=False, nullable=True),
        proposer=v.get(cfg, "proposer", "config", "str", required=False, default="external"),
        proposer_params=v.get(cfg, "proposer_params", "config", "obj", required=False, default={}),
        device=v.get(cfg, "device", "config", "str", required=False, default="unknown"),
        dtype=v.get(cfg, "dtype", "config", "str", required=False, default="unknown"),
        vocab_size=vocab,
        use_cache=v.get(cfg, "use_cache", "config", "bool", required=False, default=True),
        fault=v.get(cfg, "fault", "config", "str", required=False, nullable=True),
        target_name=v.get(models, "target_name", "models", "str", required=False, nullable=True) or "",
        draft_name=v.get(models, "draft_name", "models", "str", required=False, nullable=True),
    )


# ============================================================================ distributions


def _dist(v: _V, value: Any, path: str, run: ParsedTrace, *, nullable: bool = True) -> np.ndarray | None:
    """A distribution object as an array that keeps its top-N and facts (None for null)."""
    if value is None:
        if nullable:
            return None
        raise v.fail(path, "must not be null (expected a distribution object)")
    d = v.obj(value, path)
    full_vec, dtype = _full(v, d, path, run)
    if "top_ids" in d or "top_probs" in d or full_vec is None:
        ids, probs = _top(v, d, path, run.vocab)
    else:
        ids, probs = top_entries(full_vec, run.policy.top_n)
    stats = _stats(v, d, path, run.vocab, probs, full_vec)
    if full_vec is not None:
        return StoredFullDistribution(full_vec, stats, (ids, probs), dtype)
    values = np.zeros(run.vocab, dtype=np.float64)
    values[ids] = probs
    return PartialDistribution(values, np.sort(ids), stats, (ids, probs))


def _full(v: _V, d: dict, path: str, run: ParsedTrace) -> tuple[np.ndarray | None, str | None]:
    """The full vector of a distribution object, if it has one, and the dtype to store it in."""
    vocab = run.vocab
    full = d.get("full")
    if isinstance(full, list):
        if len(full) != vocab:
            raise v.fail(f"{path}.full", f"expected {vocab} probabilities (the vocabulary size), got {len(full)}")
        for i, x in enumerate(full):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
                raise v.fail(f"{path}.full[{i}]", f"expected a finite probability >= 0, got {_kind(x)}")
        return np.asarray(full, dtype=np.float64), run.policy.full_dtype
    if isinstance(full, dict):
        dtype = v.get(full, "dtype", f"{path}.full", "str", choices=tuple(FULL_DTYPES))
        data = v.get(full, "zlib_base64", f"{path}.full", "str")
        try:
            compressed = base64.b64decode(data.encode("ascii"), validate=True)
            raw = zlib.decompress(compressed)
        except (binascii.Error, ValueError, zlib.error) as exc:
            raise v.fail(f"{path}.full.zlib_base64", f"not base64 of zlib-compressed data ({exc})") from None
        if len(raw) != vocab * _ITEMSIZE[dtype]:
            raise v.fail(f"{path}.full.zlib_base64", f"decodes to {len(raw) // _ITEMSIZE[dtype]} {dtype} values, expected {vocab}")
        full_vec = np.frombuffer(raw, dtype="<f4" if dtype == "float32" else "<f8").astype(np.float64)
        if not np.isfinite(full_vec).all() or (full_vec < 0).any():
            raise v.fail(f"{path}.full", "holds negative or non-finite probabilities")
        return full_vec, dtype
    if full is not None:
        raise v.fail(f"{path}.full", f"expected null, an array of {vocab} numbers or an object, got {_kind(full)}")
    return None, None


def _top(v: _V, d: dict, path: str, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """The top entries a distribution object lists, in its order."""
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
    return np.asarray(ids, dtype=np.int64), np.asarray(probs, dtype=np.float64)


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


# ============================================================================ rounds


def _round(v: _V, d: dict, run: ParsedTrace, expected_index: int) -> None:
    index = v.get(d, "index", "", "int")
    if index != expected_index:
        raise v.fail("index", f"expected round {expected_index} (rounds must be consecutive from 0), got {index}")
    emitted_before = v.get(d, "emitted_before", "", "int", required=False, default=len(run.tokens))
    if emitted_before != len(run.tokens):
        raise v.fail("emitted_before", f"earlier rounds emitted {len(run.tokens)} tokens, the line says {emitted_before}")
    nodes = tuple(_node(v, raw, i, run) for i, raw in enumerate(v.get(d, "nodes", "", "list")))
    emitted = _emitted(v, d, len(nodes), run.vocab)
    residual = _dist(v, d.get("residual"), "residual", run)
    bonus_p = _dist(v, d.get("bonus_p"), "bonus_p", run)
    k = v.get(d, "k", "", "int", required=False, default=max(1, len(nodes)))
    target_cache = _cache_state(v, d, "target_cache") or CacheState(before=0, peak=0, after=0, pending=())
    draft_cache = _cache_state(v, d, "draft_cache")
    timings = v.get(d, "timings", "", "obj", required=False, default={})
    first_rejected = next((n.index for n in nodes if n.status == "rejected"), None)
    rnd = Round(
        run_id=run.config.run_id,
        index=index,
        prefix_len=v.get(d, "prefix_len", "", "int", required=False, default=len(run.config.prompt_ids) + len(run.tokens)),
        emitted_before=emitted_before,
        remaining_budget=v.get(d, "remaining_budget", "", "int", required=False,
                               default=run.config.max_new_tokens - len(run.tokens)),
        k=k,
        greedy=v.get(d, "greedy", "", "bool", required=False, default=run.config.sampling.greedy),
        nodes=nodes,
        bonus_p=bonus_p,
        residual=residual,
        emitted=emitted,
        eos=v.get(d, "eos", "", "bool", required=False, default=False),
        budget_stop=v.get(d, "budget_stop", "", "bool", required=False, default=False),
        bonus_withheld=v.get(d, "bonus_withheld", "", "bool", required=False, default=False),
        rejected_node=v.get(d, "rejected_node", "", "int", required=False, default=first_rejected, nullable=True),
        residual_mass=v.get(d, "residual_mass", "", "num", required=False, nullable=True),
        target_cache=target_cache,
        draft_cache=draft_cache,
        timings=RoundTimings(**{key: v.get(timings, key, "timings", "num", required=False, default=0.0)
                                for key in ("draft_s", "verify_s", "bookkeeping_s")}),
        draft_forwards=v.get(d, "draft_forwards", "", "int", required=False, default=0),
        target_forwards=v.get(d, "target_forwards", "", "int", required=False, default=1),
    )
    if rnd.rejected_node is not None and not 0 <= rnd.rejected_node < len(nodes):
        raise v.fail("rejected_node", f"refers to node {rnd.rejected_node}, the round has {len(nodes)} nodes")
    run.add(rnd)


def _node(v: _V, raw: Any, i: int, run: ParsedTrace) -> DraftNode:
    path = f"nodes[{i}]"
    n = v.obj(raw, path)
    ni = v.get(n, "index", path, "int", required=False, default=i)
    if ni != i:
        raise v.fail(f"{path}.index", f"expected {i} (nodes in index order), got {ni}")
    token = v.token(n, "token", path, run.vocab)
    parent = v.get(n, "parent", path, "int", required=False, default=i - 1)
    if not -1 <= parent < i:
        raise v.fail(f"{path}.parent", f"must be -1 or an earlier node index, got {parent}")
    depth = v.get(n, "depth", path, "int", required=False, default=i + 1)
    status = v.get(n, "status", path, "str", choices=("accepted", "rejected", "unvisited"))
    p = _dist(v, n.get("p"), f"{path}.p", run, nullable=False)
    q = _dist(v, n.get("q"), f"{path}.q", run)
    assert p is not None
    p_token = v.get(n, "p_token", path, "num", required=False, default=float(p[token]))
    q_token = v.get(n, "q_token", path, "num", required=False, default=None if q is None else float(q[token]), nullable=True)
    both_full = q is not None and not (p.partial or q.partial)  # type: ignore[attr-defined]
    u = v.get(n, "u", path, "num", required=False, nullable=True)
    if u is not None and not 0 <= u < 1:
        raise v.fail(f"{path}.u", f"a uniform draw lies in [0, 1), got {u!r}")
    return DraftNode(
        index=i,
        token=token,
        parent=parent,
        depth=depth,
        p=p,
        q=q,
        status=status,
        u=u,
        p_token=p_token,
        q_token=q_token,
        ratio=v.get(n, "ratio", path, "num", required=False, default=(p_token / q_token) if q_token else None, nullable=True),
        overlap=v.get(n, "overlap", path, "num", required=False, nullable=True,
                      default=float(np.minimum(np.asarray(p), np.asarray(q)).sum()) if both_full else None),
        target_argmax=v.token(n, "target_argmax", path, run.vocab, required=False,
                              default=int(np.argmax(np.asarray(p))) if not p.partial else int(p.top[0][0])),  # type: ignore[attr-defined]
    )


def _emitted(v: _V, d: dict, n_nodes: int, vocab: int) -> tuple[EmittedToken, ...]:
    out = []
    for i, raw in enumerate(v.get(d, "emitted", "", "list")):
        path = f"emitted[{i}]"
        e = v.obj(raw, path)
        node = v.get(e, "node", path, "int", required=False, nullable=True)
        if node is not None and not 0 <= node < n_nodes:
            raise v.fail(f"{path}.node", f"refers to node {node}, the round has {n_nodes} nodes")
        draw = v.get(e, "draw", path, "num", required=False, nullable=True)
        out.append(EmittedToken(token=v.token(e, "token", path, vocab), node=node, draw=draw,
                                kind=v.get(e, "kind", path, "str", choices=("accepted", "repaired", "bonus"))))
    return tuple(out)


def _cache_state(v: _V, d: dict, key: str) -> CacheState | None:
    c = v.get(d, key, "", "obj", required=False, nullable=True)
    if c is None:
        return None
    return CacheState(before=v.get(c, "before", key, "int"), peak=v.get(c, "peak", key, "int"),
                      after=v.get(c, "after", key, "int"),
                      pending=tuple(v.get(c, "pending", key, "ints", required=False, default=[])))


def _end(v: _V, d: dict, run: ParsedTrace) -> None:
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


def read_trace(source: str | os.PathLike | IO[str], run_id: str | None = None) -> ParsedTrace:
    """Parse and validate a JSONL trace (path or text file object) into table rows."""
    fh: IO[str]
    close = False
    if isinstance(source, (str, os.PathLike)):
        fh = open(source, "r", encoding="utf-8")
        close = True
    else:
        fh = source
    try:
        run: ParsedTrace | None = None
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
