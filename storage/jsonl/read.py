"""Reading a JSONL trace (docs/trace-format.md): every line validated (storage.jsonl.fields) and parsed into the
core records (RunConfig, Round with its DraftNodes, EmittedTokens, CacheStates), which are
turned into table rows by the row builder that the TraceWriter uses (storage.rows).

A distribution object becomes a PartialDistribution (top-N entries only) or a
StoredFullDistribution (a full vector) that carries the top-N and whole-vector facts as the
file gives them, so the row builder stores them unchanged. The first error is reported as a
TraceFormatError with its 1-based line number and the dotted path of the field.

Every field is bounded by what the store and the checker can hold (docs/trace-format.md,
*Bounds*): integers fit in signed 64 bits (tighter for the vocabulary, k, depth and top-N),
times are finite and formattable, free-form objects are finite JSON of bounded depth and size,
strings are bounded and ids/names carry no control characters, and an encoded full vector may
not inflate beyond what its vocabulary implies. A hostile file fails with one line naming the
line and the field, whatever it holds.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import json
import math
import os
import time
import zlib
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

from specscope.core.decode.stops import StopMatch
from specscope.core.records import (
    CacheState,
    DraftNode,
    EmittedToken,
    ResidualUpdate,
    Round,
    RoundTimings,
    RunConfig,
    TreeRound,
)
from specscope.core.sampling.partial import VectorStats, entry_known
from specscope.core.sampling.reference import SamplingConfig
from specscope.core.settings.bounds import BOUNDS, MAX_K
from specscope.core.settings.vocab import CHILDREN_MODES, RUN_STATUSES, STOP_KINDS, STOP_REASONS
from specscope.storage.codec import (
    DEFAULT_TOP_N,
    FULL_DTYPES,
    PartialDistribution,
    StoredFullDistribution,
    VectorPolicy,
    top_entries,
)
from specscope.storage.errors import TraceFormatError
from specscope.storage.info import ModelInfo
from specscope.storage.info import library_versions as current_versions
from specscope.storage.jsonl.fields import (
    MAX_FREE_JSON_DEPTH,
    MAX_RUN_ID_CHARS,
    MAX_TIME,
    FieldReader,
    control_char,
    deep_field,
    kind_of,
    loads_line,
)
from specscope.storage.rows import rounds_to_rows, run_row, tree_record

FORMAT_NAME = "specscope-trace"
FORMAT_VERSION = 2  # 2: a tree round's "tree" object (tried order, residual updates, layout)
_ITEMSIZE = {"float32": 4, "float64": 8}
# Optional fields a trace may leave out; the header's `unrecorded` lists them, and a line that
# omits one adds it (docs/trace-format.md, "Which rules each optional field enables").
UNRECORDABLE = (
    "u",
    "draw",
    "q",
    "p_token",
    "q_token",
    "eos",
    "budget_stop",
    "bonus_withheld",
    "target_cache",
    "k",
    "updates",
    "kept_rows",
    "eos_token_id",
)


class TraceSink:
    """Where read_trace hands the rows as it parses (import_run: the database, one
    transaction). header() once, after the header line; batch() whenever BATCH_ROUNDS rounds
    are pending and once at the end: it takes run.rounds, run.nodes and run.tokens and
    empties them, so a long trace is held one batch at a time."""

    def header(self, run: ParsedTrace) -> None:
        pass

    def batch(self, run: ParsedTrace) -> None:
        pass


BATCH_ROUNDS = 500  # rounds parsed before the sink takes them


@dataclass
class ParsedTrace:
    """A validated trace as table rows: the run row, then rounds and draft_nodes rows.

    rounds, nodes and tokens are the rows and tokens not yet taken by the sink (all of them
    when read_trace has no sink); n_rounds and n_tokens count every one parsed."""

    config: RunConfig
    policy: VectorPolicy  # top-N as the header says; full vectors wherever the file has them
    row: dict[str, Any]
    rounds: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    end: dict[str, Any] | None = None
    unrecorded: set[str] = field(default_factory=set)  # optional fields some line left out
    n_rounds: int = 0
    n_tokens: int = 0
    sink: TraceSink | None = None
    # the emitted tokens' digest: the end record's token list is compared with it, not with a
    # list of every token
    token_digest: Any = field(default_factory=hashlib.sha256)

    @property
    def vocab(self) -> int:
        return self.config.vocab_size

    def add(self, rnd: Round) -> None:
        """Store one parsed round through the row builder."""
        rows, nodes = rounds_to_rows([rnd], self.policy)
        self.rounds.extend(rows)
        self.nodes.extend(nodes)
        tokens = rnd.tokens
        self.tokens.extend(tokens)
        self.token_digest.update(np.asarray(tokens, dtype="<i8").tobytes())
        self.n_rounds += 1
        self.n_tokens += len(tokens)
        self.row["drafted"] += rows[0]["n_drafted"]
        self.row["accepted"] += rows[0]["n_accepted"]
        if self.sink is not None and len(self.rounds) >= BATCH_ROUNDS:
            self.sink.batch(self)


# ============================================================================ header


def _header(v: FieldReader, d: dict[str, Any], run_id: str | None) -> ParsedTrace:
    fmt = v.get(d, "format", "", "str")
    if fmt != FORMAT_NAME:
        raise v.fail("format", f"expected {FORMAT_NAME!r}, got {kind_of(fmt)}: not a specscope trace")
    version = v.get(d, "version", "", "int")
    if version > FORMAT_VERSION or version < 1:
        raise v.fail(
            "version", f"format version {version} is not supported (this specscope reads versions 1..{FORMAT_VERSION})"
        )
    v.get(d, "record", "", "str", choices=("run",))
    rid = v.get(d, "run_id", "", "str")
    if not rid or len(rid) > MAX_RUN_ID_CHARS:
        raise v.fail("run_id", f"must be a non-empty string of at most {MAX_RUN_ID_CHARS} characters")
    if run_id is not None and (not run_id or len(run_id) > MAX_RUN_ID_CHARS or control_char(run_id) is not None):
        raise v.fail(
            "run_id", f"the new id (--run-id) must have 1 to {MAX_RUN_ID_CHARS} characters and no control characters"
        )
    cfg = v.get(d, "config", "", "obj")
    vocab = v.within(cfg, "vocab_size", "config", BOUNDS["vocab_size"])
    prompt = v.get(d, "prompt_ids", "", "ints")
    for i, t in enumerate(prompt):
        if not 0 <= t < vocab:
            raise v.fail(f"prompt_ids[{i}]", f"token id {t} outside the vocabulary [0, {vocab})")
    sampling = _sampling(v, v.get(cfg, "sampling", "config", "obj", required=False, default={}))
    models = v.get(d, "models", "", "obj", required=False, default={})
    storage = v.get(d, "storage", "", "obj", required=False, default={})
    policy = _policy(v, storage)
    started_at = v.time(d, "started_at", default=time.time())
    prompt_text = v.text(d, "prompt_text")
    config = _config(v, cfg, models, run_id or rid, tuple(prompt), sampling)
    stops = _stops(v, d, vocab)
    if stops is not None:
        config = dataclasses.replace(config, **stops)
    declared = v.get(d, "unrecorded", "", "list", required=False, default=[])
    for i, name in enumerate(declared):
        if name not in UNRECORDABLE:
            raise v.fail(f"unrecorded[{i}]", f"expected one of {'|'.join(UNRECORDABLE)}, got {kind_of(name)}")
    names = {
        key: v.get(models, key, "models", "str", required=False, nullable=True)
        for key in ("target_hash", "tokenizer_name", "tokenizer_hash", "draft_hash")
    }
    versions = v.free(d, "library_versions", "", default=None)
    row = run_row(
        config,
        status="interrupted",
        started_at=started_at,
        models=ModelInfo(**names),
        library_versions=versions if versions is not None else {"imported_with": current_versions()},
        top_n=policy.top_n,
        full_dtype=policy.full_dtype,
        prompt_text=prompt_text,
        extra=v.free(d, "extra", "", default={}),
        full_vectors=v.get(storage, "full_vectors", "storage", "bool", required=False, default=False),
    )
    if stops is None:  # a trace that does not say how its run could stop: the stop rules do not run
        row["stops"] = None
    # no EOS id anywhere in the header: unknown (not "no EOS"); an explicit null says there is none
    eos_unknown = "eos_token_id" not in cfg and not (stops and stops["eos_token_ids"])
    return ParsedTrace(
        config=config,
        policy=policy,
        row=row,
        unrecorded=set(declared)
        | ({"stops"} if stops is None else set())
        | ({"eos_token_id"} if eos_unknown else set()),
    )


def _stops(v: FieldReader, d: dict[str, Any], vocab: int) -> dict[str, Any] | None:
    """The header's `stops` (EOS ids, stop strings, stop token sequences) as RunConfig
    fields; None when the header has none."""
    raw = v.get(d, "stops", "", "obj", required=False, nullable=True)
    if raw is None:
        return None
    eos = v.get(raw, "eos_token_ids", "stops", "ints", required=False, default=[])
    strings = v.get(raw, "strings", "stops", "list", required=False, default=[])
    seqs = v.get(raw, "ids", "stops", "list", required=False, default=[])
    for i, t in enumerate(eos):
        if not 0 <= t < vocab:
            raise v.fail(f"stops.eos_token_ids[{i}]", f"token id {t} outside the vocabulary [0, {vocab})")
    for i, text in enumerate(strings):
        if not isinstance(text, str) or not text or len(text) > 1000:
            raise v.fail(f"stops.strings[{i}]", "expected a non-empty string of at most 1000 characters")
    for i, seq in enumerate(seqs):
        if (
            not isinstance(seq, list)
            or not seq
            or len(seq) > MAX_K
            or any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab for t in seq)
        ):
            raise v.fail(f"stops.ids[{i}]", f"expected a non-empty list of token ids in [0, {vocab})")
    return dict(eos_token_ids=tuple(eos), stop_strings=tuple(strings), stop_ids=tuple(tuple(s) for s in seqs))


def _round_stop(v: FieldReader, d: dict[str, Any], run: ParsedTrace, n_emitted: int) -> dict[str, Any]:
    """A round's `stop` (the stop its last token completed) and `pieces` (each token's text)."""
    if "stop" not in d and (run.config.stop_strings or run.config.stop_ids):
        run.unrecorded.add("stop")
    raw = v.get(d, "stop", "", "obj", required=False, nullable=True)
    stop = None
    if raw is not None:
        kind = v.get(raw, "kind", "stop", "str", choices=STOP_KINDS)
        index = v.get(raw, "index", "stop", "int")
        position = v.get(raw, "position", "stop", "int")
        if not 0 <= position < n_emitted:
            raise v.fail("stop.position", f"expected an emitted token's index in [0, {n_emitted}), got {position}")
        stop = StopMatch(kind, index, position)
    pieces = v.get(d, "pieces", "", "list", required=False, nullable=True)
    if pieces is not None and (len(pieces) != n_emitted or not all(isinstance(p, str) for p in pieces)):
        raise v.fail("pieces", f"expected {n_emitted} strings (one per emitted token)")
    return dict(stop=stop, pieces=None if pieces is None else tuple(pieces))


def _sampling(v: FieldReader, sampling: dict[str, Any]) -> SamplingConfig:
    temperature = v.get(sampling, "temperature", "config.sampling", "num", required=False, default=1.0)
    top_k = v.within(sampling, "top_k", "config.sampling", BOUNDS["top_k"], required=False, default=0)
    top_p = v.get(sampling, "top_p", "config.sampling", "num", required=False, default=1.0)
    if temperature < 0:
        raise v.fail("config.sampling.temperature", "must be >= 0")
    if not 0 < top_p <= 1:
        raise v.fail("config.sampling.top_p", "must lie in (0, 1]")
    return SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)


def _policy(v: FieldReader, storage: dict[str, Any]) -> VectorPolicy:
    top_n = v.within(storage, "top_n", "storage", BOUNDS["top_n"], required=False, default=DEFAULT_TOP_N)
    full_dtype = v.get(
        storage, "full_dtype", "storage", "str", required=False, default="float32", choices=tuple(FULL_DTYPES)
    )
    return VectorPolicy(top_n=top_n, full=True, full_dtype=full_dtype)


def _config(
    v: FieldReader,
    cfg: dict[str, Any],
    models: dict[str, Any],
    run_id: str,
    prompt: tuple[int, ...],
    sampling: SamplingConfig,
) -> RunConfig:
    vocab = cfg["vocab_size"]
    k = v.within(cfg, "k", "config", BOUNDS["k"])
    max_new = v.within(cfg, "max_new_tokens", "config", BOUNDS["trace_max_new_tokens"])
    return RunConfig(
        run_id=run_id,
        prompt_ids=prompt,
        max_new_tokens=max_new,
        k=k,
        sampling=sampling,
        seed=v.get(cfg, "seed", "config", "int", required=False, default=0),
        eos_token_id=v.token(cfg, "eos_token_id", "config", vocab, required=False, nullable=True),
        proposer=v.get(cfg, "proposer", "config", "str", required=False, default="external"),
        proposer_params=v.free(cfg, "proposer_params", "config", default={}),
        device=v.get(cfg, "device", "config", "str", required=False, default="unknown"),
        dtype=v.get(cfg, "dtype", "config", "str", required=False, default="unknown"),
        vocab_size=vocab,
        use_cache=v.get(cfg, "use_cache", "config", "bool", required=False, default=True),
        fault=v.get(cfg, "fault", "config", "str", required=False, nullable=True),
        position_limit=v.bounded(cfg, "position_limit", "config", 1, 2**62, required=False, nullable=True),
        target_name=v.get(models, "target_name", "models", "str", required=False, nullable=True) or "",
        draft_name=v.get(models, "draft_name", "models", "str", required=False, nullable=True),
    )


# ============================================================================ distributions


def _dist(v: FieldReader, value: Any, path: str, run: ParsedTrace, *, nullable: bool = True) -> np.ndarray | None:
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


def _full(v: FieldReader, d: dict[str, Any], path: str, run: ParsedTrace) -> tuple[np.ndarray | None, str | None]:
    """The full vector of a distribution object, if it has one, and the dtype to store it in."""
    vocab = run.vocab
    full = d.get("full")
    if isinstance(full, list):
        if len(full) != vocab:
            raise v.fail(f"{path}.full", f"expected {vocab} probabilities (the vocabulary size), got {len(full)}")
        for i, x in enumerate(full):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
                raise v.fail(f"{path}.full[{i}]", f"expected a finite probability >= 0, got {kind_of(x)}")
        return np.asarray(full, dtype=np.float64), run.policy.full_dtype
    if isinstance(full, dict):
        dtype = v.get(full, "dtype", f"{path}.full", "str", choices=tuple(FULL_DTYPES))
        data = v.get(full, "zlib_base64", f"{path}.full", "blob")
        where = f"{path}.full.zlib_base64"
        expected = vocab * _ITEMSIZE[dtype]
        if len(data) > 4 * (2 * expected + 1024) // 3 + 4:  # far beyond any zlib stream of that many bytes
            raise v.fail(where, f"{len(data)} characters of base64, too long for {vocab} {dtype} values")
        try:
            compressed = base64.b64decode(data.encode("ascii"), validate=True)
            inflate = zlib.decompressobj()
            raw = inflate.decompress(compressed, expected + 1)  # never more than the vocabulary implies
        except (binascii.Error, ValueError, zlib.error) as exc:
            raise v.fail(where, f"not base64 of zlib-compressed data ({exc})") from None
        if len(raw) > expected:
            raise v.fail(where, f"inflates beyond the {expected} bytes of {vocab} {dtype} values")
        if not inflate.eof:
            raise v.fail(where, "not base64 of zlib-compressed data (incomplete zlib stream)")
        if len(raw) != expected:
            raise v.fail(where, f"decodes to {len(raw) // _ITEMSIZE[dtype]} {dtype} values, expected {vocab}")
        full_vec = np.frombuffer(raw, dtype="<f4" if dtype == "float32" else "<f8").astype(np.float64)
        if not np.isfinite(full_vec).all() or (full_vec < 0).any():
            raise v.fail(f"{path}.full", "holds negative or non-finite probabilities")
        return full_vec, dtype
    if full is not None:
        raise v.fail(f"{path}.full", f"expected null, an array of {vocab} numbers or an object, got {kind_of(full)}")
    return None, None


def _top(v: FieldReader, d: dict[str, Any], path: str, vocab: int) -> tuple[np.ndarray, np.ndarray]:
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


def _stats(
    v: FieldReader, d: dict[str, Any], path: str, vocab: int, top_probs: np.ndarray, full_vec: np.ndarray | None
) -> VectorStats | None:
    """The whole-vector stats of a distribution object: as given (all three fields or none),
    else computed from its full vector, else None."""
    given = [k for k in _STATS_FIELDS if d.get(k) is not None]
    if not given:
        return None if full_vec is None else VectorStats.of(full_vec)
    if len(given) < len(_STATS_FIELDS):
        missing = next(k for k in _STATS_FIELDS if k not in given)
        raise v.fail(f"{path}.{missing}", f"missing: {', '.join(_STATS_FIELDS)} are given together")
    stats = VectorStats(
        v.get(d, "support", path, "int"), v.get(d, "minimum", path, "num"), v.get(d, "total", path, "num")
    )
    positive = int(np.count_nonzero(top_probs > 0))
    if not positive <= stats.support <= vocab:
        raise v.fail(
            f"{path}.support",
            f"{stats.support} is outside [{positive}, {vocab}] (the positive top entries, the vocabulary)",
        )
    if (stats.support == vocab) != (stats.minimum > 0) or (top_probs.size and stats.minimum > float(top_probs.min())):
        raise v.fail(
            f"{path}.minimum",
            f"{stats.minimum!r} cannot be the smallest entry of a vector with {stats.support} of "
            f"{vocab} entries > 0 and these top entries",
        )
    if full_vec is not None:
        # a float32 full vector may have flushed entries below 1.4e-45 to 0: fewer > 0
        computed = VectorStats.of(full_vec)
        if not computed.support <= stats.support or not np.allclose(computed[1:], stats[1:], rtol=0, atol=1e-6):
            raise v.fail(
                path, f"support/minimum/total {tuple(stats)} disagree with the full vector's {tuple(computed)}"
            )
    return stats


# ============================================================================ rounds


def _round(v: FieldReader, d: dict[str, Any], run: ParsedTrace, expected_index: int) -> None:
    index = v.get(d, "index", "", "int")
    if index != expected_index:
        raise v.fail("index", f"expected round {expected_index} (rounds must be consecutive from 0), got {index}")
    emitted_before = v.get(d, "emitted_before", "", "int", required=False, default=run.n_tokens)
    if emitted_before != run.n_tokens:
        raise v.fail("emitted_before", f"earlier rounds emitted {run.n_tokens} tokens, the line says {emitted_before}")
    raw_nodes = v.get(d, "nodes", "", "list")
    if len(raw_nodes) > MAX_K:
        raise v.fail("nodes", f"{len(raw_nodes)} nodes, at most {MAX_K} allowed")
    nodes: tuple[DraftNode, ...] = ()
    for i, raw in enumerate(raw_nodes):  # a node's default depth is its parent's + 1
        nodes += (_node(v, raw, i, run, nodes),)
    emitted = _emitted(v, d, nodes, run)
    residual = _dist(v, d.get("residual"), "residual", run)
    bonus_p = _dist(v, d.get("bonus_p"), "bonus_p", run)
    if "k" not in d:  # the default is a length, not the decoder's budget: no rule relies on it
        run.unrecorded.add("k")
    k = v.bounded(d, "k", "", 0, MAX_K, required=False, default=max(1, len(nodes)))
    if "target_cache" not in d:
        run.unrecorded.add("target_cache")
    target_cache = _cache_state(v, d, "target_cache") or CacheState(before=0, peak=0, after=0, pending=())
    flags = _flags(v, d, run, nodes, emitted)
    draft_cache = _cache_state(v, d, "draft_cache")
    timings = v.get(d, "timings", "", "obj", required=False, default={})
    first_rejected = next((n.index for n in nodes if n.status == "rejected"), None)
    rnd = Round(
        run_id=run.config.run_id,
        index=index,
        prefix_len=v.get(d, "prefix_len", "", "int", required=False, default=len(run.config.prompt_ids) + run.n_tokens),
        emitted_before=emitted_before,
        remaining_budget=v.get(
            d, "remaining_budget", "", "int", required=False, default=run.config.max_new_tokens - run.n_tokens
        ),
        k=k,
        greedy=v.get(d, "greedy", "", "bool", required=False, default=run.config.sampling.greedy),
        nodes=nodes,
        bonus_p=bonus_p,
        residual=residual,
        emitted=emitted,
        **flags,
        rejected_node=v.get(d, "rejected_node", "", "int", required=False, default=first_rejected, nullable=True),
        residual_mass=v.get(d, "residual_mass", "", "num", required=False, nullable=True),
        target_cache=target_cache,
        draft_cache=draft_cache,
        timings=RoundTimings(
            **{
                key: v.get(timings, key, "timings", "num", required=False, default=0.0)
                for key in ("draft_s", "verify_s", "bookkeeping_s")
            }
        ),
        draft_forwards=v.get(d, "draft_forwards", "", "int", required=False, default=0),
        target_forwards=v.get(d, "target_forwards", "", "int", required=False, default=1),
        **_round_stop(v, d, run, len(emitted)),
    )
    if rnd.rejected_node is not None and not 0 <= rnd.rejected_node < len(nodes):
        raise v.fail("rejected_node", f"refers to node {rnd.rejected_node}, the round has {len(nodes)} nodes")
    raw_tree = v.get(d, "tree", "", "obj", required=False, nullable=True)
    if raw_tree is not None:
        fields = {f.name: getattr(rnd, f.name) for f in dataclasses.fields(Round)}
        rnd = TreeRound(**fields, tree=_tree(v, raw_tree, rnd, run))
    run.add(rnd)


def _tree(v: FieldReader, d: dict[str, Any], rnd: Round, run: ParsedTrace) -> Any:
    """A round's "tree" object (format version 2) as a TreeInfo; node indices must refer to
    the round's nodes."""
    n = len(rnd.nodes)

    def nodes_of(value: list[Any], path: str, lo: int = 0) -> list[int]:
        for i, x in enumerate(value):
            if not lo <= x < n:
                raise v.fail(f"{path}[{i}]", f"refers to node {x}, the round has {n} nodes")
        return value

    spec = v.get(d, "spec", "tree", "str", required=False, default="")
    children = v.get(d, "children", "tree", "str", choices=CHILDREN_MODES)
    path = nodes_of(v.get(d, "path", "tree", "ints"), "tree.path")
    tried = []
    for key in ("updates", "kept_rows"):  # their defaults ([]) are facts when given: noted when left out
        if key not in d:
            run.unrecorded.add(key)
    raw_tried, raw_updates = (
        v.get(d, "tried", "tree", "list"),
        v.get(d, "updates", "tree", "list", required=False, default=[]),
    )
    if len(raw_tried) > n + 1 or len(raw_updates) > n:
        raise v.fail(
            "tree",
            f"{len(raw_tried)} tried lists and {len(raw_updates)} updates for {n} nodes (at most one "
            "per node reached and one per rejected node)",
        )
    for i, item in enumerate(raw_tried):
        where = f"tree.tried[{i}]"
        if not isinstance(item, list) or len(item) != 2:
            raise v.fail(where, f"expected [node, [children...]], got {kind_of(item)}")
        node = v.check(item[0], f"{where}[0]", "int")
        nodes_of([node], f"{where}[0]", lo=-1)
        tried.append([node, nodes_of(v.check(item[1], f"{where}[1]", "ints"), f"{where}[1]")])
    updates = [
        _tree_update(v, v.obj(u, f"tree.updates[{i}]"), f"tree.updates[{i}]", n, run) for i, u in enumerate(raw_updates)
    ]
    positions = v.get(d, "positions", "tree", "ints", required=False, default=[])
    visible = v.get(d, "visible", "tree", "list", required=False, default=[])
    for key, value in (("positions", positions), ("visible", visible)):
        if value and len(value) != n:
            raise v.fail(f"tree.{key}", f"has {len(value)} entries, the round has {n} nodes")
    visible = [
        nodes_of(v.check(row, f"tree.visible[{i}]", "ints"), f"tree.visible[{i}]") for i, row in enumerate(visible)
    ]
    facts = {
        "spec": spec,
        "children": children,
        "path": path,
        "tried": tried,
        "positions": positions,
        "visible": visible,
        "kept_rows": v.get(d, "kept_rows", "tree", "ints", required=False, default=[]),
    }
    bonus = None if rnd.greedy else rnd.bonus_p
    return tree_record(facts, updates, rnd.emitted, bonus)


def _tree_update(v: FieldReader, u: dict[str, Any], path: str, n: int, run: ParsedTrace) -> ResidualUpdate:
    parent = v.get(u, "parent", path, "int")
    child = v.get(u, "child", path, "int")
    if not -1 <= parent < n or not 0 <= child < n:
        raise v.fail(path, f"parent {parent} / child {child} do not refer to the round's {n} nodes")
    ids = v.get(u, "exact_ids", path, "ints", required=False, default=[])
    probs = v.get(u, "exact_probs", path, "list", required=False, default=[])
    if len(ids) != len(probs):
        raise v.fail(f"{path}.exact_probs", f"has {len(probs)} entries but exact_ids has {len(ids)}")
    exact: dict[int, float] = {}
    for i, (t, x) in enumerate(zip(ids, probs)):
        if not 0 <= t < run.vocab:
            raise v.fail(f"{path}.exact_ids[{i}]", f"token id {t} outside the vocabulary [0, {run.vocab})")
        x = v.check(x, f"{path}.exact_probs[{i}]", "num")
        if not 0 <= x <= 1 + 1e-6:
            raise v.fail(f"{path}.exact_probs[{i}]", f"probability {x!r} outside [0, 1]")
        exact[t] = x
    p_after = _dist(v, u.get("p_after"), f"{path}.p_after", run)
    if p_after is not None and exact:
        p_after = _with_exact(p_after, exact)
    return ResidualUpdate(
        parent=parent, child=child, p_after=p_after, mass=v.get(u, "mass", path, "num", required=False, nullable=True)
    )


def _with_exact(dist: np.ndarray, exact: dict[int, float]) -> np.ndarray:
    """The distribution with the entries the trace gives exactly (as the store rebuilds them)."""
    ids = np.fromiter(exact, dtype=np.int64)
    dist[ids] = np.fromiter(exact.values(), dtype=np.float64)
    if isinstance(dist, PartialDistribution):
        dist.known_ids = np.union1d(dist.known_ids, ids)
    return dist


def _node(v: FieldReader, raw: Any, i: int, run: ParsedTrace, before: tuple[DraftNode, ...]) -> DraftNode:
    path = f"nodes[{i}]"
    n = v.obj(raw, path)
    ni = v.get(n, "index", path, "int", required=False, default=i)
    if ni != i:
        raise v.fail(f"{path}.index", f"expected {i} (nodes in index order), got {ni}")
    token = v.token(n, "token", path, run.vocab)
    parent = v.get(n, "parent", path, "int", required=False, default=i - 1)
    if not -1 <= parent < i:
        raise v.fail(f"{path}.parent", f"must be -1 or an earlier node index, got {parent}")
    parent_depth = before[parent].depth if parent >= 0 else 0
    depth = v.bounded(n, "depth", path, 0, MAX_K, required=False, default=parent_depth + 1)
    if depth != parent_depth + 1:  # the views and the shape rules read it: it must follow the parents
        raise v.fail(
            f"{path}.depth",
            f"{depth}, but its parent ({'the prefix' if parent < 0 else f'node {parent}'}) "
            f"is at depth {parent_depth}: a node's depth is its parent's + 1",
        )
    status = v.get(n, "status", path, "str", choices=("accepted", "rejected", "unvisited"))
    p = _dist(v, n.get("p"), f"{path}.p", run, nullable=False)
    q = _dist(v, n.get("q"), f"{path}.q", run)
    assert p is not None
    _note_left_out(n, status, token, p, q, run)
    # left out and not in the vector: unknown. q_token is then null; p_token (a non-null
    # column) keeps 0 as a placeholder, which the store does not read back as an entry of p
    # once the run declares p_token unrecorded (storage.rows.rows_to_round)
    # an explicit null is unknown, as a left-out value is
    p_known = entry_known(p, token)
    p_token = _probability(v, n, "p_token", path)
    if p_token is None:
        p_token = float(p[token]) if p_known else 0.0
    q_token = _probability(v, n, "q_token", path)
    if q_token is None and q is not None and entry_known(q, token):
        q_token = float(q[token])
    if n.get("p_token") is None and not p_known:
        run.unrecorded.add("p_token")
    both_full = q is not None and not (p.partial or q.partial)  # type: ignore[attr-defined]
    u = v.get(n, "u", path, "num", required=False, nullable=True)
    if u is not None and not 0 <= u < 1:
        raise v.fail(f"{path}.u", f"a uniform draw lies in [0, 1), got {u!r}")
    confidence = v.get(n, "confidence", path, "num", required=False, nullable=True)  # left out: unknown
    if confidence is not None and not 0 <= confidence <= 1:
        raise v.fail(f"{path}.confidence", f"a probability lies in [0, 1], got {confidence!r}")
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
        ratio=_probability(
            v,
            n,
            "ratio",
            path,
            hi=math.inf,
            default=(p_token / q_token) if q_token and (n.get("p_token") is not None or p_known) else None,
        ),
        overlap=_probability(
            v, n, "overlap", path, default=float(np.minimum(np.asarray(p), np.asarray(q)).sum()) if both_full else None
        ),
        target_argmax=v.token(n, "target_argmax", path, run.vocab, required=False, default=_argmax(p)),
        confidence=confidence,
    )


def _probability(
    v: FieldReader, d: dict[str, Any], key: str, path: str, default: Any = None, hi: float = 1 + 1e-6
) -> Any:
    """An optional probability-like number (null: unknown), within [0, hi]."""
    x = v.get(d, key, path, "num", required=False, nullable=True, default=default)
    if x is not None and not 0 <= x <= hi:
        raise v.fail(f"{path}.{key}" if path else key, f"{x!r} is outside [0, {hi:g}]")
    return x


def _flags(
    v: FieldReader, d: dict[str, Any], run: ParsedTrace, nodes: tuple[DraftNode, ...], emitted: tuple[EmittedToken, ...]
) -> dict[str, Any]:
    """eos, budget_stop, bonus_withheld: as the line says, or, when it leaves one out, what
    the round's tokens imply (and the field is noted unrecorded, so no rule relies on it)."""
    eos_id = run.config.eos_token_id
    tokens = [e.token for e in emitted]
    all_accepted = all(n.status == "accepted" for n in nodes) and not any(e.kind != "accepted" for e in emitted)
    implied = {
        "eos": eos_id is not None and eos_id in tokens,
        "budget_stop": run.n_tokens + len(tokens) >= run.config.max_new_tokens,
        "bonus_withheld": all_accepted
        and (eos_id is None or eos_id not in tokens)
        and len(tokens) >= run.config.max_new_tokens - run.n_tokens,
    }
    out = {}
    for name, value in implied.items():
        if name not in d:
            run.unrecorded.add(name)
        out[name] = v.get(d, name, "", "bool", required=False, default=value)
    return out


def _argmax(p: np.ndarray) -> int:
    """The most probable token of a distribution, from its values (ties: the lowest id), not
    from the order another writer listed its top entries in."""
    if not p.partial:  # type: ignore[attr-defined]
        return int(np.argmax(np.asarray(p)))
    ids, probs = p.top  # type: ignore[attr-defined]
    return int(min(zip(ids.tolist(), probs.tolist()), key=lambda e: (-e[1], e[0]))[0])


def _note_left_out(
    n: dict[str, Any], status: str, token: int, p: np.ndarray, q: np.ndarray | None, run: ParsedTrace
) -> None:
    """Optional node fields this line leaves out where a rule would need them."""
    if run.config.sampling.greedy or status == "unvisited":
        return
    # left out or null: unknown, never a default
    if n.get("u") is None:
        run.unrecorded.add("u")
    if q is None:
        run.unrecorded.add("q")
    if n.get("p_token") is None and not entry_known(p, token):
        run.unrecorded.add("p_token")
    if n.get("q_token") is None and (q is None or not entry_known(q, token)):
        run.unrecorded.add("q_token")


def _emitted(
    v: FieldReader, d: dict[str, Any], nodes: tuple[DraftNode, ...], run: ParsedTrace
) -> tuple[EmittedToken, ...]:
    """The emitted tokens. A left-out `node` is what the format defines: the j-th accepted
    token is the j-th accepted node, a repair replaces the last rejected node (a chain's only
    one; a tree's walk tries nodes in index order, so the rejection it stopped at is the last),
    a bonus has none. A left-out `draw` of a sampled repair or bonus is noted unrecorded."""
    accepted = [n.index for n in nodes if n.status == "accepted"]
    rejected = max((n.index for n in nodes if n.status == "rejected"), default=None)
    stochastic = not run.config.sampling.greedy
    out: list[EmittedToken] = []
    for i, raw in enumerate(v.get(d, "emitted", "", "list")):
        path = f"emitted[{i}]"
        e = v.obj(raw, path)
        kind = v.get(e, "kind", path, "str", choices=("accepted", "repaired", "bonus"))
        n_acc = sum(1 for x in out if x.kind == "accepted")
        implied = (
            accepted[n_acc]
            if kind == "accepted" and n_acc < len(accepted)
            else rejected
            if kind == "repaired"
            else None
        )
        node = v.get(e, "node", path, "int", required=False, nullable=True, default=implied)
        if node is not None and not 0 <= node < len(nodes):
            raise v.fail(f"{path}.node", f"refers to node {node}, the round has {len(nodes)} nodes")
        if stochastic and kind != "accepted" and e.get("draw") is None:
            run.unrecorded.add("draw")
        draw = v.get(e, "draw", path, "num", required=False, nullable=True)
        if draw is not None and not 0 <= draw < 1:
            raise v.fail(f"{path}.draw", f"a uniform draw lies in [0, 1), got {draw!r}")
        out.append(EmittedToken(token=v.token(e, "token", path, run.vocab), node=node, draw=draw, kind=kind))
    return tuple(out)


def _cache_state(v: FieldReader, d: dict[str, Any], key: str) -> CacheState | None:
    c = v.get(d, key, "", "obj", required=False, nullable=True)
    if c is None:
        return None
    return CacheState(
        before=v.get(c, "before", key, "int"),
        peak=v.get(c, "peak", key, "int"),
        after=v.get(c, "after", key, "int"),
        pending=tuple(v.get(c, "pending", key, "ints", required=False, default=[])),
    )


def _end(v: FieldReader, d: dict[str, Any], run: ParsedTrace) -> None:
    status = v.get(d, "status", "", "str", choices=RUN_STATUSES)
    run.row["stop_reason"] = v.get(
        d, "stop_reason", "", "str", required=False, nullable=True, choices=STOP_REASONS + (None,)
    )
    run.row["error"] = v.text(d, "error")
    run.row["ended_at"] = v.time(d, "ended_at", nullable=True)
    wall_s = v.get(d, "wall_s", "", "num", required=False, nullable=True)
    if wall_s is not None and not 0 <= wall_s <= MAX_TIME:
        raise v.fail("wall_s", f"{wall_s!r} is outside [0, {MAX_TIME:.0f}] seconds")
    run.row["wall_s"] = wall_s
    tokens = v.get(d, "new_tokens", "", "ints", required=False, default=None, nullable=True)
    if tokens is not None and (
        len(tokens) != run.n_tokens
        or hashlib.sha256(np.asarray(tokens, dtype="<i8").tobytes()).digest() != run.token_digest.digest()
    ):
        raise v.fail(
            "new_tokens", f"differ from the tokens the rounds emitted ({len(tokens)} vs {run.n_tokens} tokens)"
        )
    if status == "running":  # nobody writes an imported run: it was cut off
        status = "interrupted"
        run.row["error"] = run.row["error"] or "imported from a trace of a run in progress"
    run.row["status"] = status
    run.end = d


def read_trace(
    source: str | os.PathLike[str] | IO[str], run_id: str | None = None, sink: TraceSink | None = None
) -> ParsedTrace:  # long: one loop over the lines, its errors in one place
    """Parse and validate a JSONL trace (path or text file object) into table rows. Without
    a sink the result holds every row; with one, the sink takes them in batches as they are
    parsed (the file is read line by line: memory is bounded by a batch and the longest line)."""
    fh: IO[str]
    close = False
    if isinstance(source, (str, os.PathLike)):
        fh = open(source, encoding="utf-8")  # noqa: SIM115 - closed in the finally below, only when opened here (a caller's file stays open)
        close = True
    else:
        fh = source
    try:
        run: ParsedTrace | None = None
        line_no = 0
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            v = FieldReader(line_no)
            try:
                d = loads_line(line)
            except json.JSONDecodeError as exc:
                raise v.fail("", f"not valid JSON ({exc.msg} at column {exc.colno})") from None
            except RecursionError:
                raise v.fail(
                    deep_field(line),
                    f"JSON nested too deeply to parse (free-form objects may nest {MAX_FREE_JSON_DEPTH} levels)",
                ) from None
            d = v.obj(d, "")
            if run is None:
                run = _header(v, d, run_id)
                run.sink = sink
                if sink is not None:
                    sink.header(run)
                continue
            if run.end is not None:
                raise v.fail("record", "nothing may follow the end record")
            record = v.get(d, "record", "", "str", choices=("round", "end"))
            if record == "round":
                _round(v, d, run, run.n_rounds)
            else:
                _end(v, d, run)
        if run is None:
            raise TraceFormatError(max(line_no, 1), "", "the file is empty: expected a run header on line 1")
        if run.end is None:
            run.row["status"] = "interrupted"
            run.row["error"] = "the trace has no end record (cut off)"
        run.row["n_rounds"] = run.n_rounds
        run.row["n_new_tokens"] = run.n_tokens
        run.config = dataclasses.replace(run.config, unrecorded=frozenset(run.unrecorded))
        run.row["unrecorded"] = sorted(run.unrecorded) or None
        if sink is not None:
            sink.batch(run)
        return run
    except UnicodeDecodeError as exc:
        raise TraceFormatError(line_no + 1, "", f"not UTF-8 text ({exc.reason})") from None
    finally:
        if close:
            fh.close()
