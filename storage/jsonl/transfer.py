"""The JSONL trace format (docs/trace-format.md): export a stored run, import a file.

Line 1 is the run header, then one line per round in order, then (optionally) one end line.
Both directions stream: export reads the run in batches of rounds and token chunks; import
validates each line as it reads it (storage.jsonl.read parses the lines into core records and
rows) and inserts the rows in batches, all in a single transaction, so a failed import leaves
the store unchanged and a long trace is never held whole. The first error is reported as a TraceFormatError with its
1-based line number and the dotted path of the field.
"""

from __future__ import annotations

import base64
import json
import math
import os
import zlib
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any

from sqlalchemy import insert, select, update

from specscope.storage.codec import ZLIB_LEVEL, decode_top_stats, full_raw, unpack_blobs
from specscope.storage.errors import RunExistsError, TraceStoreError
from specscope.storage.jsonl.read import FORMAT_NAME, FORMAT_VERSION, ParsedTrace, TraceSink, read_trace
from specscope.storage.outputs import write_atomically
from specscope.storage.rows import StoredRow, chunk_tokens, token_chunk
from specscope.storage.schema import nodes_table, rounds_table, runs_table, tokens_table
from specscope.storage.store import TraceStore
from specscope.storage.transactions import translate_errors

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "ParsedTrace",
    "export_run",
    "header_json",
    "import_run",
    "iter_export",
    "open_jsonl",
    "read_trace",
    "round_json",
]


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False, ensure_ascii=False)


def _line(obj: dict[str, Any], what: str) -> str:
    """One exported line; a value JSON cannot hold (NaN or Infinity, which import refuses but
    an older specscope let in) fails with the record and field instead of a bare ValueError."""
    try:
        return _dumps(obj)
    except ValueError:
        field = _bad_field(obj)
        raise TraceStoreError(
            f"cannot export {what}: field {field!r} holds NaN or Infinity, which the trace format does not allow"
        ) from None


def _bad_field(obj: Any, path: str = "") -> str:
    """The first field of a record that JSON cannot write (walked only on that error)."""
    stack: list[tuple[Any, str]] = [(obj, path)]
    while stack:
        x, where = stack.pop()
        if isinstance(x, dict):
            stack.extend((v, f"{where}.{k}" if where else str(k)) for k, v in reversed(list(x.items())))
        elif isinstance(x, list):
            stack.extend((v, f"{where}[{i}]") for i, v in reversed(list(enumerate(x))))
        elif isinstance(x, float) and not math.isfinite(x):
            return where
    return path


# ============================================================================ export


def _dist_json(top: bytes | None, full: bytes | None) -> dict[str, Any] | None:
    if top is None:
        return None
    ids, probs, stats = decode_top_stats(top)
    out: dict[str, Any] = {"top_ids": ids.tolist(), "top_probs": probs.tolist(), "full": None}
    if stats is not None:
        out.update(stats._asdict())
    if full is not None:
        compressed = full[2:] if full[:1] == b"F" else zlib.compress(full_raw(full)[1], ZLIB_LEVEL)
        out["full"] = {
            "dtype": "float32" if full[1:2] == b"4" else "float64",
            "zlib_base64": base64.b64encode(compressed).decode("ascii"),
        }
    return out


def _cache_json(before: Any, peak: Any, after: Any, pending: Any) -> dict[str, Any] | None:
    if before is None:
        return None
    return {"before": before, "peak": peak, "after": after, "pending": list(pending or [])}


def header_json(run: StoredRow) -> dict[str, Any]:
    header = {
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
        "models": {
            key: run[key]
            for key in ("target_name", "target_hash", "draft_name", "draft_hash", "tokenizer_name", "tokenizer_hash")
        },
        "library_versions": run["library_versions"],
        "extra": run["extra"],
        "storage": {"top_n": run["top_n"], "full_vectors": bool(run["full_vectors"]), "full_dtype": run["full_dtype"]},
    }
    if run.get("position_limit") is not None:  # stores before schema 5 and other decoders' traces may not know it
        header["config"]["position_limit"] = run["position_limit"]
    if run.get("unrecorded"):  # only traces of other decoders leave optional fields out
        header["unrecorded"] = [name for name in run["unrecorded"] if name not in ("stops", "stop")]
    if run.get("stops") is not None:  # runs stored before schema version 5 did not record their stops
        header["stops"] = run["stops"]
    return header


def tree_json(r: Mapping[str, Any]) -> dict[str, Any] | None:
    """A tree round's "tree" object (format version 2): the rounds.tree facts, each residual
    update with its p' as a distribution object."""
    facts = r["tree"]
    if facts is None:
        return None
    tops = unpack_blobs(r["tree_top"]) if r["tree_top"] is not None else []
    fulls = unpack_blobs(r["tree_full"]) if r["tree_full"] is not None else [None] * len(tops)
    updates = []
    for i, u in enumerate(facts["updates"]):
        p_after = _dist_json(tops[i], fulls[i]) if i < len(tops) else None
        updates.append(
            {
                "parent": u["parent"],
                "child": u["child"],
                "mass": u["mass"],
                "p_after": p_after,
                "exact_ids": list(u["exact_ids"]),
                "exact_probs": list(u["exact_probs"]),
            }
        )
    return {
        "spec": facts["spec"],
        "children": facts["children"],
        "path": list(facts["path"]),
        "tried": [[node, list(kids)] for node, kids in facts["tried"]],
        "updates": updates,
        "positions": list(facts.get("positions", [])),
        "visible": [list(v) for v in facts.get("visible", [])],
        "kept_rows": list(facts.get("kept_rows", [])),
    }


def round_json(r: Mapping[str, Any], nodes: list[Mapping[str, Any]]) -> dict[str, Any]:
    out = _round_json(r, nodes)
    tree = tree_json(r)
    if tree is not None:  # chains' lines stay as version 1 wrote them
        out["tree"] = tree
    return out


def _round_json(r: Mapping[str, Any], nodes: list[Mapping[str, Any]]) -> dict[str, Any]:
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
                **({"confidence": n["confidence"]} if n["confidence"] is not None else {}),
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
        **_stop_json(r.get("stop")),
    }


def _stop_json(stop: Mapping[str, Any] | None) -> dict[str, Any]:
    """A round's `stop` (null when none) and, when recorded, its `pieces`."""
    stop = stop or {}
    out: dict[str, Any] = {"stop": stop.get("match")}
    if stop.get("pieces") is not None:
        out["pieces"] = stop["pieces"]
    return out


def end_json(run: StoredRow, new_tokens: list[int] | None = None) -> dict[str, Any]:
    return {
        "record": "end",
        "status": run["status"],
        "stop_reason": run["stop_reason"],
        "error": run["error"],
        "ended_at": run["ended_at"],
        "wall_s": run["wall_s"],
        "new_tokens": list(run["new_tokens"] or []) if new_tokens is None else new_tokens,
    }


_TOKENS_PLACEHOLDER = '"new_tokens":[]'


def _end_line(conn: Any, run: StoredRow, what: str, batch: int = 64) -> str:
    """The end line, its token list written from the run's token chunks as text: the one
    record that grows with the run (a few bytes per token), never a list of ints."""
    line = _line(end_json(run, []), what)
    parts: list[str] = []
    start = 0
    while True:
        rows = conn.execute(
            select(tokens_table.c.start, tokens_table.c.tokens)
            .where(tokens_table.c.run_id == run["run_id"], tokens_table.c.start >= start)
            .order_by(tokens_table.c.start)
            .limit(batch)
        ).all()
        for row in rows:
            tokens = chunk_tokens(row.tokens)
            if len(tokens):
                parts.append(",".join(map(str, tokens.tolist())))
            start = int(row.start) + len(tokens)
        if len(rows) < batch:
            break
    if not parts:  # a store of schema <= 2 migrated in place keeps none in the row
        return line
    head, tail = line.split(_TOKENS_PLACEHOLDER, 1)
    return f'{head}"new_tokens":[{",".join(parts)}]{tail}'


def iter_export(store: TraceStore, run_id: str, batch_size: int = 256) -> Iterator[str]:
    """The lines (without newlines) of a run's JSONL export. A run still being written is
    exported as far as it is committed, without an end line."""
    run_id = store.resolve_run_id(run_id)
    with translate_errors(f"exporting run {run_id}"), store.engine.connect() as conn:
        run = conn.execute(select(runs_table).where(runs_table.c.run_id == run_id)).one()._mapping
        yield _line(header_json(run), f"run {run_id}: its header")
        yield from round_lines(conn, run_id, batch_size)
        if run["status"] != "running":
            yield _end_line(conn, run, f"run {run_id}: its end record")


def round_lines(conn: Any, run_id: str, batch_size: int = 256) -> Iterator[str]:
    """The round lines of a stored run, read `batch_size` rounds at a time on `conn`."""
    start = 0
    while True:
        rows = [
            r._mapping
            for r in conn.execute(
                select(rounds_table)
                .where(rounds_table.c.run_id == run_id, rounds_table.c.round_index >= start)
                .order_by(rounds_table.c.round_index)
                .limit(batch_size)
            )
        ]
        if not rows:
            return
        hi = rows[-1]["round_index"]
        nodes: dict[int, list[Any]] = {}
        for n in conn.execute(
            select(nodes_table)
            .where(nodes_table.c.run_id == run_id, nodes_table.c.round_index >= start, nodes_table.c.round_index <= hi)
            .order_by(nodes_table.c.round_index, nodes_table.c.node_index)
        ):
            nodes.setdefault(n.round_index, []).append(n._mapping)
        for r in rows:
            yield round_line(r, nodes.get(r["round_index"], []), run_id)
        start = hi + 1


def round_line(r: Mapping[str, Any], nodes: list[Mapping[str, Any]], run_id: str) -> str:
    """One round's line from its rows (as stored, or as the writer built them to insert)."""
    return _line(round_json(r, nodes), f"run {run_id}: round {r['round_index']}")


def end_line(run: Mapping[str, Any], new_tokens: list[int]) -> str:
    return _line(end_json(run, new_tokens), f"run {run['run_id']}: its end record")


def export_run(
    store: TraceStore,
    run_id: str,
    out: str | os.PathLike[str] | IO[str],
    *,
    overwrite: bool = False,
    on_round: Callable[[], None] | None = None,
) -> int:
    """Write a run as JSONL to a path (atomically) or a text file object; return the number
    of rounds written. A path that exists is replaced only with overwrite=True, and never
    when it is an SQLite database (a trace store: storage.outputs.check_output). on_round is
    called after each round written (a progress report)."""
    rounds = 0

    def write(fh: IO[str]) -> None:
        nonlocal rounds
        for line in iter_export(store, run_id):
            fh.write(line)
            fh.write("\n")
            if line.startswith('{"record":"round"'):
                rounds += 1
                if on_round is not None:
                    on_round()

    if isinstance(out, (str, os.PathLike)):
        with write_atomically(out, overwrite) as fh:
            write(fh)
    else:
        write(out)
    return rounds


# ============================================================================ import


class _StoreSink(TraceSink):
    """Inserts a trace's rows as read_trace parses them, inside the import's transaction.
    When the run id is taken it only lets the file be validated to the end (a format error
    is reported first, as when the whole file was read before anything was written)."""

    def __init__(self, conn: Any):
        self.conn = conn
        self.tokens_written = 0
        self.taken = False

    def header(self, run: ParsedTrace) -> None:
        rid = run.row["run_id"]
        self.taken = (
            self.conn.execute(select(runs_table.c.run_id).where(runs_table.c.run_id == rid)).first() is not None
        )
        if not self.taken:
            self.conn.execute(insert(runs_table), run.row)  # the counters and the end are set by finish()

    def batch(self, run: ParsedTrace) -> None:
        if not self.taken:
            for start in range(0, len(run.rounds), 500):
                self.conn.execute(insert(rounds_table), run.rounds[start : start + 500])
            for start in range(0, len(run.nodes), 2000):
                self.conn.execute(insert(nodes_table), run.nodes[start : start + 2000])
            if run.tokens:
                self.conn.execute(insert(tokens_table), token_chunk(run.row["run_id"], self.tokens_written, run.tokens))
        self.tokens_written += len(run.tokens)
        run.rounds, run.nodes, run.tokens = [], [], []

    def finish(self, run: ParsedTrace) -> None:
        rid = run.row["run_id"]
        if self.taken:
            raise RunExistsError(f"a run with id {rid} is already in the store; import it under another id (--run-id)")
        values = {k: v for k, v in run.row.items() if k != "run_id"}
        self.conn.execute(update(runs_table).where(runs_table.c.run_id == rid).values(**values))


def import_run(store: TraceStore, source: str | os.PathLike[str] | IO[str], *, run_id: str | None = None) -> str:
    """Validate a JSONL trace and insert it as one run (all or nothing); return its run id.

    The file is read line by line and its rows inserted in batches, in one transaction
    (memory: a batch of rounds and the longest line). run_id renames the run (e.g. to import
    the same file twice)."""
    name = source if isinstance(source, (str, os.PathLike)) else getattr(source, "name", "a trace")
    with translate_errors(f"importing {name}"), store.transaction() as conn:
        sink = _StoreSink(conn)
        run = read_trace(source, run_id, sink)
        sink.finish(run)
    run_id_read: str = run.row["run_id"]
    return run_id_read


def open_jsonl(source: str | os.PathLike[str] | IO[str], run_id: str | None = None) -> TraceStore:
    """An in-memory store holding one imported JSONL trace (e.g. a bundled sample)."""
    store = TraceStore("sqlite://")
    try:
        import_run(store, source, run_id=run_id)
    except BaseException:
        store.close()
        raise
    return store
