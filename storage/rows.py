"""The row builder: core records <-> table rows, in one place for every writer.

TraceWriter (thread or process) and JSONL import store rounds through rounds_to_rows and
runs through run_row; the read API turns rows back into records with rows_to_round,
run_info and round_summary. A new column is mapped here, in both directions.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeAlias, cast

import numpy as np
from sqlalchemy import RowMapping

from specscope.core.decode.stops import StopMatch
from specscope.core.records import (
    CacheState,
    DraftNode,
    EmittedToken,
    ResidualUpdate,
    Round,
    RoundTimings,
    RunConfig,
    TreeInfo,
    TreeRound,
)
from specscope.core.sampling.partial import entry_known
from specscope.core.sampling.reference import SamplingConfig
from specscope.storage.codec import VectorPolicy, pack_blobs, rebuild, unpack_blobs
from specscope.storage.info import ModelInfo, RoundSummary, RunInfo

# a stored row: a plain dict, or a result row's mapping as SQLAlchemy returns it (whose keys are
# typed column-or-name, so it is no Mapping[str, Any] to mypy)
StoredRow: TypeAlias = Mapping[str, Any] | RowMapping

# ---------------------------------------------------------------------------- runs


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def run_row(
    config: RunConfig,
    *,
    status: str,
    started_at: float,
    models: ModelInfo,
    library_versions: Mapping[str, Any],
    top_n: int,
    full_vectors: bool,
    full_dtype: str,
    prompt_text: str | None = None,
    extra: Mapping[str, Any] | None = None,
    writer_host: str | None = None,
    writer_pid: int | None = None,
) -> dict[str, Any]:
    """A new run's row (no rounds yet)."""
    s: SamplingConfig = config.sampling
    return {
        "run_id": config.run_id,
        "status": status,
        "stop_reason": None,
        "error": None,
        "started_at": float(started_at),
        "ended_at": None,
        "heartbeat_at": float(started_at) if status == "running" else None,
        "writer_host": writer_host,
        "writer_pid": writer_pid,
        "prompt_ids": [int(t) for t in config.prompt_ids],
        "prompt_text": prompt_text,
        "max_new_tokens": int(config.max_new_tokens),
        "k": int(config.k),
        "temperature": float(s.temperature),
        "top_k": int(s.top_k),
        "top_p": float(s.top_p),
        "seed": int(config.seed),
        "eos_token_id": None if config.eos_token_id is None else int(config.eos_token_id),
        "proposer": config.proposer,
        "proposer_params": _json_safe(dict(config.proposer_params)),
        "device": config.device,
        "dtype": config.dtype,
        "vocab_size": int(config.vocab_size),
        "use_cache": bool(config.use_cache),
        "fault": config.fault,
        "unrecorded": sorted(config.unrecorded) or None,
        "stops": None if "stops" in config.unrecorded else stops_json(config),
        "position_limit": config.position_limit,
        "target_name": models.target_name if models.target_name is not None else config.target_name,
        "target_hash": models.target_hash,
        "draft_name": models.draft_name if models.draft_name is not None else config.draft_name,
        "draft_hash": models.draft_hash,
        "tokenizer_name": models.tokenizer_name,
        "tokenizer_hash": models.tokenizer_hash,
        "library_versions": _json_safe(dict(library_versions)),
        "extra": _json_safe(dict(extra or {})),
        "top_n": int(top_n),
        "full_vectors": bool(full_vectors),
        "full_dtype": full_dtype,
        "n_rounds": 0,
        "drafted": 0,
        "accepted": 0,
        "n_new_tokens": 0,
        "new_tokens": [],  # schema <= 2 only; the tokens are appended to run_tokens
        "wall_s": None,
    }


def run_config(r: StoredRow) -> RunConfig:
    return RunConfig(
        run_id=r["run_id"],
        prompt_ids=tuple(r["prompt_ids"]),
        max_new_tokens=r["max_new_tokens"],
        k=r["k"],
        sampling=SamplingConfig(temperature=float(r["temperature"]), top_k=int(r["top_k"]), top_p=float(r["top_p"])),
        seed=r["seed"],
        eos_token_id=r["eos_token_id"],
        proposer=r["proposer"],
        proposer_params=dict(r["proposer_params"] or {}),
        target_name=r["target_name"],
        draft_name=r["draft_name"],
        device=r["device"],
        dtype=r["dtype"],
        vocab_size=r["vocab_size"],
        use_cache=bool(r["use_cache"]),
        fault=r["fault"],
        **_stops_fields(r.get("stops")),
        position_limit=r.get("position_limit"),
        unrecorded=frozenset(r.get("unrecorded") or ()) | ({"stops"} if r.get("stops") is None else set()),
    )


def stops_json(config: RunConfig) -> dict[str, Any]:
    """What a run records of how it may end besides the budget (runs.stops, the JSONL header's
    `stops`)."""
    return {
        "eos_token_ids": [int(t) for t in config.eos_token_ids],
        "strings": list(config.stop_strings),
        "ids": [[int(t) for t in seq] for seq in config.stop_ids],
    }


def _stops_fields(stops: Mapping[str, Any] | None) -> dict[str, Any]:
    if not stops:
        return {}
    return dict(
        eos_token_ids=tuple(int(t) for t in stops.get("eos_token_ids") or ()),
        stop_strings=tuple(str(s) for s in stops.get("strings") or ()),
        stop_ids=tuple(tuple(int(t) for t in seq) for seq in stops.get("ids") or ()),
    )


def round_stop_json(rnd: Round) -> dict[str, Any] | None:
    """rounds.stop: the stop the round completed and its tokens' text; None when neither."""
    stop, pieces = getattr(rnd, "stop", None), getattr(rnd, "pieces", None)
    if stop is None and pieces is None:
        return None
    return {"match": None if stop is None else stop.to_dict(), "pieces": None if pieces is None else list(pieces)}


def round_stop_fields(data: Mapping[str, Any] | None) -> dict[str, Any]:
    match, pieces = (data or {}).get("match"), (data or {}).get("pieces")
    return dict(
        stop=None if match is None else StopMatch.from_dict(match),
        pieces=None if pieces is None else tuple(str(p) for p in pieces),
    )


def run_info(r: StoredRow) -> RunInfo:
    return RunInfo(
        run_id=r["run_id"],
        status=r["status"],
        stop_reason=r["stop_reason"],
        error=r["error"],
        started_at=r["started_at"],
        ended_at=r["ended_at"],
        heartbeat_at=r["heartbeat_at"],
        writer_host=r["writer_host"],
        writer_pid=r["writer_pid"],
        config=run_config(r),
        prompt_text=r["prompt_text"],
        models=ModelInfo(
            target_name=r["target_name"],
            target_hash=r["target_hash"],
            draft_name=r["draft_name"],
            draft_hash=r["draft_hash"],
            tokenizer_name=r["tokenizer_name"],
            tokenizer_hash=r["tokenizer_hash"],
        ),
        library_versions=dict(r["library_versions"] or {}),
        extra=dict(r["extra"] or {}),
        top_n=r["top_n"],
        full_vectors=bool(r["full_vectors"]),
        full_dtype=r["full_dtype"],
        n_rounds=r["n_rounds"],
        drafted=r["drafted"],
        accepted=r["accepted"],
        n_new_tokens=int(r["n_new_tokens"] or 0),
        wall_s=r["wall_s"],
    )


# ---------------------------------------------------------------------------- token chunks


def token_chunk(run_id: str, start: int, tokens: Sequence[int]) -> dict[str, Any]:
    """A run_tokens row: tokens [start, start + len(tokens)) of the run, int32 little-endian."""
    return {
        "run_id": run_id,
        "start": int(start),
        "n_tokens": len(tokens),
        "tokens": np.asarray(tokens, dtype="<i4").tobytes(),
    }


def chunk_tokens(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype="<i4").astype(np.int64)


# ---------------------------------------------------------------------------- rounds -> rows


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def _pending(c: CacheState | None) -> list[int] | None:
    return None if c is None else [int(x) for x in c.pending]


def round_to_rows(
    rnd: Round, policy: VectorPolicy, run_id: str | None = None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One Round -> (rounds row, draft_nodes rows), keyed by column name."""
    rows, nodes = rounds_to_rows([rnd], policy, run_id)
    return rows[0], nodes


class _Blobs:
    """The distributions of many rounds, encoded together (VectorPolicy.encode)."""

    def __init__(self, rounds: Sequence[Round], policy: VectorPolicy):
        self._dists: list[np.ndarray] = []
        self._slots: dict[int, int] = {}  # id(array) -> index; the arrays stay alive in _dists
        for r in rounds:
            tree = getattr(r, "tree", None)
            updates = tree.updates if tree is not None else ()
            for dist in (
                r.residual,
                r.bonus_p,
                *(a for n in r.nodes for a in (n.p, n.q)),
                *(u.p_after for u in updates),
            ):
                if dist is not None and id(dist) not in self._slots:
                    self._slots[id(dist)] = len(self._dists)
                    self._dists.append(dist)
        self._tops, self._fulls = policy.encode(self._dists)

    def top(self, dist: np.ndarray | None) -> bytes | None:
        return None if dist is None else self._tops[self._slots[id(dist)]]

    def full(self, dist: np.ndarray | None) -> bytes | None:
        return None if dist is None else self._fulls[self._slots[id(dist)]]


def rounds_to_rows(
    rounds: Sequence[Round], policy: VectorPolicy, run_id: str | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rounds -> (rounds rows, draft_nodes rows), with the distributions of all of them
    encoded together (the writer converts everything queued in a flush interval at once)."""
    blobs = _Blobs(rounds, policy)
    round_rows: list[dict[str, Any]] = []
    node_rows: list[dict[str, Any]] = []
    for rnd in rounds:
        rid = run_id or rnd.run_id
        round_rows.append(_round_row(rnd, rid, blobs))
        node_rows.extend(_node_row(n, rid, int(rnd.index), blobs) for n in rnd.nodes)
    return round_rows, node_rows


def _round_row(rnd: Round, run_id: str, blobs: _Blobs) -> dict[str, Any]:
    tc, dc, t = rnd.target_cache, rnd.draft_cache, rnd.timings
    return {
        "run_id": run_id,
        "round_index": int(rnd.index),
        "prefix_len": int(rnd.prefix_len),
        "emitted_before": int(rnd.emitted_before),
        "remaining_budget": int(rnd.remaining_budget),
        "k": int(rnd.k),
        "greedy": bool(rnd.greedy),
        "n_drafted": len(rnd.nodes),
        "n_accepted": sum(1 for n in rnd.nodes if n.status == "accepted"),
        "draft_tokens": [int(n.token) for n in rnd.nodes],
        "emitted": [[int(e.token), e.kind, _opt_int(e.node), _opt_float(e.draw)] for e in rnd.emitted],
        "eos": bool(rnd.eos),
        "budget_stop": bool(rnd.budget_stop),
        "bonus_withheld": bool(rnd.bonus_withheld),
        "rejected_node": _opt_int(rnd.rejected_node),
        "residual_mass": _opt_float(rnd.residual_mass),
        "residual_top": blobs.top(rnd.residual),
        "residual_full": blobs.full(rnd.residual),
        "bonus_top": blobs.top(rnd.bonus_p),
        "bonus_full": blobs.full(rnd.bonus_p),
        **_tree_columns(rnd, blobs),
        "tc_before": int(tc.before),
        "tc_peak": int(tc.peak),
        "tc_after": int(tc.after),
        "tc_pending": _pending(tc),
        "dc_before": None if dc is None else int(dc.before),
        "dc_peak": None if dc is None else int(dc.peak),
        "dc_after": None if dc is None else int(dc.after),
        "dc_pending": _pending(dc),
        "draft_s": float(t.draft_s),
        "verify_s": float(t.verify_s),
        "bookkeeping_s": float(t.bookkeeping_s),
        "draft_forwards": int(rnd.draft_forwards),
        "target_forwards": int(rnd.target_forwards),
        "stop": round_stop_json(rnd),
    }


def _tree_columns(rnd: Round, blobs: _Blobs) -> dict[str, Any]:
    """rounds.tree (the TreeInfo facts as JSON), tree_top and tree_full (each update's p')."""
    tree = getattr(rnd, "tree", None)
    if tree is None:
        return {"tree": None, "tree_top": None, "tree_full": None}
    drawn = [int(e.token) for e in rnd.emitted if e.kind != "accepted"]
    updates = []
    for u in tree.updates:
        # the entries the checker reads exactly: the node's children (judged against this
        # p') and the token drawn from it; the top-N blob alone may not hold them
        tokens = sorted({int(n.token) for n in rnd.nodes if n.parent == u.parent} | set(drawn))
        exact = [t for t in tokens if u.p_after is not None and entry_known(u.p_after, t)]
        updates.append(
            {
                "parent": int(u.parent),
                "child": int(u.child),
                "mass": _opt_float(u.mass),
                "exact_ids": exact,
                "exact_probs": [float(u.p_after[t]) for t in exact],
            }
        )
    facts = {
        "spec": str(tree.spec),
        "children": str(tree.children),
        "path": [int(i) for i in tree.path],
        "tried": [[int(node), [int(c) for c in kids]] for node, kids in tree.tried],
        "updates": updates,
        "positions": [int(x) for x in tree.positions],
        "visible": [[int(j) for j in row] for row in tree.visible],
        "kept_rows": [int(x) for x in tree.kept_rows],
    }
    stored = [u.p_after for u in tree.updates if u.p_after is not None]
    if not stored:
        return {"tree": facts, "tree_top": None, "tree_full": None}
    fulls = [blobs.full(d) for d in stored]
    return {
        "tree": facts,
        "tree_top": pack_blobs([blobs.top(d) for d in stored]),
        "tree_full": pack_blobs(fulls) if any(f is not None for f in fulls) else None,
    }


def _node_row(n: DraftNode, run_id: str, round_index: int, blobs: _Blobs) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "round_index": round_index,
        "node_index": int(n.index),
        "token": int(n.token),
        "parent": int(n.parent),
        "depth": int(n.depth),
        "status": n.status,
        "u": _opt_float(n.u),
        "p_token": float(n.p_token),
        "q_token": _opt_float(n.q_token),
        "ratio": _opt_float(n.ratio),
        "overlap": _opt_float(n.overlap),
        "target_argmax": int(n.target_argmax),
        "confidence": _opt_float(getattr(n, "confidence", None)),
        "p_top": blobs.top(n.p),
        "q_top": blobs.top(n.q),
        "p_full": blobs.full(n.p),
        "q_full": blobs.full(n.q),
    }


# ---------------------------------------------------------------------------- rows -> rounds


def _cache(before: Any, peak: Any, after: Any, pending: Any) -> CacheState | None:
    if before is None:
        return None
    return CacheState(
        before=int(before), peak=int(peak), after=int(after), pending=tuple(int(x) for x in pending or ())
    )


def emitted_tokens(items: Iterable[Sequence[Any]]) -> tuple[EmittedToken, ...]:
    return tuple(EmittedToken(token=int(t), kind=kind, node=node, draw=draw) for t, kind, node, draw in items)


def _round_fields(row: StoredRow) -> dict[str, Any]:
    """The Round fields of a rounds row that are not distributions or nodes."""
    return dict(
        run_id=row["run_id"],
        index=int(row["round_index"]),
        prefix_len=int(row["prefix_len"]),
        emitted_before=int(row["emitted_before"]),
        remaining_budget=int(row["remaining_budget"]),
        k=int(row["k"]),
        greedy=bool(row["greedy"]),
        rejected_node=row["rejected_node"],
        residual_mass=row["residual_mass"],
        emitted=emitted_tokens(row["emitted"]),
        eos=bool(row["eos"]),
        budget_stop=bool(row["budget_stop"]),
        bonus_withheld=bool(row["bonus_withheld"]),
        target_cache=_cache(row["tc_before"], row["tc_peak"], row["tc_after"], row["tc_pending"]),
        draft_cache=_cache(row["dc_before"], row["dc_peak"], row["dc_after"], row["dc_pending"]),
        timings=RoundTimings(draft_s=row["draft_s"], verify_s=row["verify_s"], bookkeeping_s=row["bookkeeping_s"]),
        draft_forwards=int(row["draft_forwards"]),
        target_forwards=int(row["target_forwards"]),
        **round_stop_fields(row.get("stop")),
    )


def round_summary(row: StoredRow) -> Any:  # a RoundSummary: made by make_dataclass, so no static type
    return RoundSummary(
        **_round_fields(row),
        drafted=row["n_drafted"],
        accepted=row["n_accepted"],
        draft_tokens=tuple(row["draft_tokens"]),
    )


def rows_to_round(
    row: StoredRow,
    node_rows: Sequence[StoredRow],
    vocab_size: int,
    full: bool = True,
    vectors: bool = True,
    p_token_unrecorded: bool = False,
) -> Round:
    """Rebuild a core Round. With full=False (or no stored full vectors) the distributions
    are PartialDistribution arrays built from the top-N; with vectors=False (rows read
    without their blobs) they are None. The stored p_token is an exact entry of p, except a
    0 in a run whose trace left p_token out (the column's placeholder: p(token) unknown)."""

    def dist(r: StoredRow, name: str, exact: Mapping[int, float] | None = None) -> np.ndarray | None:
        # only the columns that were read are looked up (a missing key is slow on a Row)
        top = r[f"{name}_top"] if vectors else None
        if top is None:
            return None
        return rebuild(top, r[f"{name}_full"] if full else None, vocab_size, exact)

    nodes = []
    for n in sorted(node_rows, key=lambda r: r["node_index"]):
        token = int(n["token"])
        q_token = n["q_token"]
        nodes.append(
            DraftNode(
                index=int(n["node_index"]),
                token=token,
                parent=int(n["parent"]),
                depth=int(n["depth"]),
                # vectors=False: no distribution is read, p is None (a timeline's round; DraftNode.p
                # is typed for the rounds the decoder and checker use, which always hold one)
                p=cast(
                    np.ndarray,
                    dist(n, "p", None if p_token_unrecorded and n["p_token"] == 0 else {token: n["p_token"]}),
                ),
                q=dist(n, "q", None if q_token is None else {token: q_token}),
                status=n["status"],
                u=n["u"],
                p_token=n["p_token"],
                q_token=q_token,
                ratio=n["ratio"],
                overlap=n["overlap"],
                target_argmax=int(n["target_argmax"]),
                confidence=n["confidence"],
            )
        )
    fields = dict(**_round_fields(row), nodes=tuple(nodes), bonus_p=dist(row, "bonus"), residual=dist(row, "residual"))
    facts = row["tree"]
    if facts is None:
        return Round(**fields)
    tops = row["tree_top"] if vectors else None
    fulls = row["tree_full"] if vectors and full else None
    bonus = None if fields["greedy"] else fields["bonus_p"]
    return TreeRound(**fields, tree=tree_info(facts, tops, fulls, vocab_size, fields["emitted"], bonus))


def tree_info(
    facts: Mapping[str, Any],
    tops: bytes | None,
    fulls: bytes | None,
    vocab_size: int,
    emitted: Sequence[EmittedToken],
    bonus_p: np.ndarray | None,
) -> TreeInfo:
    """A TreeInfo from its stored facts (the rounds.tree JSON, or a JSONL round's "tree"
    without its distributions) and the updates' blobs (None: the p' vectors were not read).
    final_p is the last p' for a repair, the leaf's p for a bonus (pass bonus_p None for a
    greedy round: nothing is drawn), None otherwise."""
    top_blobs = unpack_blobs(tops) if tops is not None else []
    full_blobs = unpack_blobs(fulls) if fulls is not None else [None] * len(top_blobs)
    updates = []
    for i, u in enumerate(facts["updates"]):
        exact = dict(zip(u["exact_ids"], u["exact_probs"]))
        top = top_blobs[i] if i < len(top_blobs) else None
        p_after = rebuild(top, full_blobs[i], vocab_size, exact) if top is not None else None
        updates.append(ResidualUpdate(parent=int(u["parent"]), child=int(u["child"]), p_after=p_after, mass=u["mass"]))
    return tree_record(facts, updates, emitted, bonus_p)


def tree_record(
    facts: Mapping[str, Any],
    updates: Sequence[ResidualUpdate],
    emitted: Sequence[EmittedToken],
    bonus_p: np.ndarray | None,
) -> TreeInfo:
    """A TreeInfo from its facts and its updates with their p' already rebuilt."""
    tail = emitted[-1].kind if emitted and emitted[-1].kind != "accepted" else None
    final = updates[-1].p_after if tail == "repaired" and updates else bonus_p if tail == "bonus" else None
    return TreeInfo(
        spec=str(facts["spec"]),
        children=str(facts["children"]),
        path=tuple(int(i) for i in facts["path"]),
        tried=tuple((int(node), tuple(int(c) for c in kids)) for node, kids in facts["tried"]),
        updates=tuple(updates),
        final_p=final,
        positions=tuple(int(x) for x in facts.get("positions", ())),
        visible=tuple(tuple(int(j) for j in row) for row in facts.get("visible", ())),
        kept_rows=tuple(int(x) for x in facts.get("kept_rows", ())),
    )
