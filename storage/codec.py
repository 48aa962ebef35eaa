"""Round records <-> table rows, and the distribution blobs.

Distribution blobs (little-endian, self-describing by their first byte):

  top-N   b"N" + uint32 support + float64 minimum + float64 total (the whole vector's
          count of entries > 0, smallest entry and sum: enough for the checker's sampler
          rules without the full vector) + int32[n] ids + float64[n] probabilities;
          b"T" + int32[n] ids + float64[n] probabilities: the same without the whole-vector
          facts (stores written before they were kept, JSONL lines that do not give them)
          the n most probable tokens with p > 0 (n <= top_n), by descending probability,
          ties by ascending id; probabilities are the exact float64 values
  full    the whole vector in a storage dtype (dtype code b"4" float32 | b"8" float64),
          in one of three forms:
          b"R" + code + the values                                   dense vectors
          b"S" + code + uint32 V + bitmap of the nonzero entries (V bits, least significant
                 bit first) + the nonzero values in id order         sparse vectors (at
                 least half the entries 0: filtered, one-hot and residual vectors)
          b"F" + code + zlib(values)                                 read only (stores
                 written before the S/R forms; JSONL keeps zlib as its interchange encoding)
          The writer uses no zlib: it saves ~8% of the bundled models' dense float32 p and q
          (lzma 16%) at 0.15-0.2 ms of CPU a vector on the hot path (BENCHMARKS.md).

Loading a round without full vectors rebuilds full-vocabulary arrays from the top-N: the
top-N entries (and the proposed token's p_token/q_token, which are always stored) hold
their exact values and every other entry is 0. Such arrays are `PartialDistribution`
instances (a numpy subclass) whose `.partial` is True; `.known_ids` are the ids with a known
value, `.stats` the whole vector's VectorStats (None from a b"T" blob) and `.missing_mass`
= total - sum(known values) (total = 1 without stats). Arrays rebuilt from full vectors are
full (`is_partial()` is False); with float32 storage their top-N and proposed-token entries
are restored to the exact float64 values, and next to a b"N" blob they are
`StoredFullDistribution` arrays whose `.stats` are the exact whole-vector facts (float32
may have flushed entries below 1.4e-45 to 0).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from specscope.core.partial import VectorStats
from specscope.core.records import CacheState, DraftNode, EmittedToken, Round, RoundTimings

DEFAULT_TOP_N = 20
TOP_K_COVER_MAX = 256  # runs with a top-k filter below this keep at least top-k + 1 entries


def covering_top_n(top_n: int, top_k: int) -> int:
    """The N to store for a run with a top-k filter: at least top-k + 1 (for top-k below
    TOP_K_COVER_MAX), so that a top-N trace still shows whether q and p were filtered (the
    checker's sampler rule needs the entry ranked top-k + 1)."""
    return max(top_n, top_k + 1) if 0 < top_k < TOP_K_COVER_MAX else top_n
# Full vectors are kept by default up to this vocabulary (byte- and character-level
# tokenizers; 4 KB a float32 vector). Above it a round's full vectors outweigh its top-N
# ~40x (145 KB vs 3.5 KB a round at V=4096, k=4) and cost 2-3x the top-N's recording time,
# while the top-N with the whole-vector stats keeps every checker rule working.
FULL_VECTORS_AUTO_MAX_VOCAB = 1024
FULL_DTYPES = {"float32": b"4", "float64": b"8"}
_DTYPE_OF_CODE = {b"4": np.dtype("<f4"), b"8": np.dtype("<f8")}
# Distributions per vectorised pass: 1 MB of float64 at V=4096, a core's L2 cache here
# (writer encoding in real traced runs: 0.132-0.136 ms a round, 0.144-0.145 ms with 64).
ENCODE_CHUNK = 32
ZLIB_LEVEL = 1  # JSONL export: float vectors barely compress further at higher levels; level 1 is ~2x faster


# ---------------------------------------------------------------------------- arrays


class PartialDistribution(np.ndarray):
    """A full-vocabulary array of which only `known_ids` hold real values (others are 0)."""

    partial = True

    def __new__(cls, values: np.ndarray, known_ids: np.ndarray, stats: VectorStats | None = None):
        obj = np.asarray(values, dtype=np.float64).view(cls)
        obj.known_ids = np.asarray(known_ids, dtype=np.int64)
        obj.stats = stats
        return obj

    def __array_finalize__(self, obj: Any) -> None:
        self.known_ids = getattr(obj, "known_ids", np.zeros(0, dtype=np.int64))
        self.stats = getattr(obj, "stats", None)

    @property
    def missing_mass(self) -> float:
        """Probability mass not accounted for by the known entries (>= 0)."""
        total = 1.0 if self.stats is None else self.stats.total
        return max(0.0, total - float(np.asarray(self).sum()))

    def __reduce__(self):  # pickle as (values, known_ids, stats)
        return (PartialDistribution, (np.asarray(self), self.known_ids, self.stats))


class StoredFullDistribution(np.ndarray):
    """A full vector read back from a store, with the whole vector's exact `stats` from its
    top-N blob. float32 storage flushes entries below 1.4e-45 to 0 (an unfiltered q at a low
    temperature has such entries), so support and minimum counted from the stored values
    could be wrong; the saved stats are those of the float64 vector the decoder recorded.
    Only the array as loaded carries them: its views and the results of operations on it
    have stats None (their stats are computed from their values)."""

    partial = False

    def __new__(cls, values: np.ndarray, stats: VectorStats):
        obj = np.asarray(values, dtype=np.float64).view(cls)
        obj.stats = stats
        return obj

    def __array_finalize__(self, obj: Any) -> None:
        self.stats = None

    def __reduce__(self):  # pickle as (values, stats)
        return (StoredFullDistribution, (np.asarray(self), self.stats))


def is_partial(array: np.ndarray | None) -> bool:
    """True for a distribution rebuilt from its top-N only."""
    return bool(getattr(array, "partial", False))


def round_is_partial(rnd: Round) -> bool:
    """True when any distribution of the round was rebuilt from top-N only."""
    arrays = [rnd.bonus_p, rnd.residual] + [a for n in rnd.nodes for a in (n.p, n.q)]
    return any(is_partial(a) for a in arrays)


# ---------------------------------------------------------------------------- blobs


_TINY = np.finfo(np.float64).tiny


def top_rows(dists: np.ndarray, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per row of an (m, V) array: ids and probabilities of the n most probable positive
    entries, by descending probability, ties by ascending id (vectorised over the rows)."""
    dists = np.asarray(dists, dtype=np.float64)
    m, vocab = dists.shape
    if vocab < 4 * n or m > 65535:  # row numbers are kept as uint16
        return _top_rows_by_sorting(dists, n)
    # The writer's hot path. The n-th largest of the maxima of disjoint groups of entries is
    # a threshold that at least n entries reach (each of those n maxima is one), and in
    # practice only a few more: the rows' candidates are the entries at or above it, and an
    # ordering of the few candidates (row, then descending probability, then ascending id)
    # yields the exact top n, ties included. About twice as fast as a per-row partition.
    maxima = _group_maxima(dists, 2 * n)
    kth = np.partition(maxima, maxima.shape[1] - n, axis=1)[:, maxima.shape[1] - n]
    kth = np.maximum(kth, _TINY)  # zero entries are never kept
    flat = np.flatnonzero(dists >= kth[:, None])  # row-major: by row, then ascending id
    rows = (flat // vocab).astype(np.uint16)
    ids = flat % vocab
    vals = dists.reshape(-1)[flat]
    by_value = np.argsort(-vals, kind="stable")  # keeps ascending ids among equal values
    order = by_value[np.argsort(rows[by_value], kind="stable")]
    rows, ids, vals = rows[order], ids[order], vals[order]
    counts = np.bincount(rows, minlength=m)
    rank = np.arange(len(rows)) - (np.cumsum(counts) - counts)[rows]
    keep = rank < n
    ids, vals = ids[keep].astype(np.int64), vals[keep]
    taken = np.minimum(counts, n)
    if (taken == n).all():
        return list(zip(ids.reshape(m, n), vals.reshape(m, n)))
    ends = np.cumsum(taken).tolist()
    return [(ids[a:b], vals[a:b]) for a, b in zip([0] + ends[:-1], ends)]


def _group_maxima(dists: np.ndarray, groups: int) -> np.ndarray:
    """Per row, the maxima of between `groups` and 2*`groups` disjoint groups of entries
    (halves folded onto each other; an odd last column joins group 0)."""
    folded = dists
    while folded.shape[1] >= 2 * groups:
        half = folded.shape[1] // 2
        nxt = np.maximum(folded[:, :half], folded[:, half : 2 * half])
        if folded.shape[1] % 2:
            np.maximum(nxt[:, 0], folded[:, -1], out=nxt[:, 0])
        folded = nxt
    return folded


def _top_rows_by_sorting(dists: np.ndarray, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """top_rows for small vocabularies: a full lexicographic sort of every row."""
    m, vocab = dists.shape
    cand = np.broadcast_to(np.arange(vocab), (m, vocab))
    order = np.lexsort((cand, -dists), axis=-1)[:, :n]
    ids = np.take_along_axis(cand, order, axis=1)
    vals = np.take_along_axis(dists, order, axis=1)
    positive = vals > 0
    if positive.all():
        return list(zip(ids.astype(np.int64), vals))
    return [(ids[i][positive[i]].astype(np.int64), vals[i][positive[i]]) for i in range(m)]


def top_entries(dist: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Ids and probabilities of the n most probable positive entries (desc prob, asc id)."""
    return top_rows(np.asarray(dist, dtype=np.float64)[None, :], n)[0]


_STATS = struct.Struct("<Idd")


def encode_top_arrays(ids: np.ndarray, probs: np.ndarray, stats: tuple[int, float, float] | None = None) -> bytes:
    """A top-N blob; with the whole vector's (support, minimum, total) a b"N" blob."""
    tail = np.asarray(ids, dtype="<i4").tobytes() + np.asarray(probs, dtype="<f8").tobytes()
    return b"T" + tail if stats is None else b"N" + _STATS.pack(*stats) + tail


def encode_top(dist: np.ndarray, n: int) -> bytes:
    """The top-N blob of one distribution, with its whole-vector stats."""
    return encode_top_arrays(*top_entries(dist, n), VectorStats.of(dist))


def decode_top_stats(blob: bytes) -> tuple[np.ndarray, np.ndarray, VectorStats | None]:
    """Ids, probabilities and (b"N" blobs) the whole-vector stats of a top-N blob."""
    form = blob[:1]
    start = 1 + _STATS.size if form == b"N" else 1
    if form not in (b"T", b"N") or len(blob) < start or (len(blob) - start) % 12:
        raise ValueError("not a top-N distribution blob")
    n = (len(blob) - start) // 12
    ids = np.frombuffer(blob, dtype="<i4", count=n, offset=start).astype(np.int64)
    probs = np.frombuffer(blob, dtype="<f8", count=n, offset=start + 4 * n).astype(np.float64)
    stats = VectorStats(*_STATS.unpack_from(blob, 1)) if form == b"N" else None
    return ids, probs, stats


def decode_top(blob: bytes) -> tuple[np.ndarray, np.ndarray]:
    ids, probs, _ = decode_top_stats(blob)
    return ids, probs


def _full_blob(values: np.ndarray, code: bytes, nonzero: np.ndarray, count: int) -> bytes:
    if 2 * count <= values.size:
        return (b"S" + code + int(values.size).to_bytes(4, "little") + np.packbits(nonzero, bitorder="little").tobytes()
                + values[nonzero].tobytes())
    return b"R" + code + values.tobytes()


def encode_full_values(values: np.ndarray, dtype: str) -> bytes:
    """The full-vector blob of one 1-D vector already in the storage dtype (little-endian)."""
    nonzero = values != 0
    return _full_blob(values, FULL_DTYPES[dtype], nonzero, int(np.count_nonzero(nonzero)))


def encode_full(dist: np.ndarray, dtype: str = "float32") -> bytes:
    """The full-vector blob of one distribution, stored in `dtype`."""
    return encode_full_values(np.asarray(dist).astype(_DTYPE_OF_CODE[FULL_DTYPES[dtype]]), dtype)


def full_raw(blob: bytes) -> tuple[str, bytes]:
    """(dtype name, little-endian bytes of the whole vector) of a full-vector blob."""
    form, code = blob[:1], blob[1:2]
    if len(blob) < 2 or form not in (b"F", b"R", b"S") or code not in _DTYPE_OF_CODE:
        raise ValueError("not a full-vector distribution blob")
    dtype = "float32" if code == b"4" else "float64"
    if form == b"F":
        return dtype, zlib.decompress(blob[2:])
    if form == b"R":
        return dtype, bytes(blob[2:])
    size = int.from_bytes(blob[2:6], "little")
    mask_end = 6 + (size + 7) // 8
    nonzero = np.unpackbits(np.frombuffer(blob, dtype=np.uint8, count=mask_end - 6, offset=6), count=size,
                            bitorder="little").astype(bool)
    values = np.zeros(size, dtype=_DTYPE_OF_CODE[code])
    values[nonzero] = np.frombuffer(blob, dtype=_DTYPE_OF_CODE[code], offset=mask_end)
    return dtype, values.tobytes()


def decode_full(blob: bytes) -> np.ndarray:
    dtype, raw = full_raw(blob)
    return np.frombuffer(raw, dtype=_DTYPE_OF_CODE[FULL_DTYPES[dtype]]).astype(np.float64)


def rebuild(top: bytes, full: bytes | None, vocab_size: int, exact: Mapping[int, float] | None = None) -> np.ndarray:
    """The in-memory distribution from its blobs (see the module docstring)."""
    ids, probs, stats = decode_top_stats(top)
    if full is not None:
        out = decode_full(full)
        out[ids] = probs
        for i, v in (exact or {}).items():
            out[i] = v
        return out if stats is None else StoredFullDistribution(out, stats)
    out = np.zeros(vocab_size, dtype=np.float64)
    out[ids] = probs
    known = set(ids.tolist())
    for i, v in (exact or {}).items():
        out[i] = v
        known.add(i)
    return PartialDistribution(out, np.array(sorted(known), dtype=np.int64), stats)


# ---------------------------------------------------------------------------- rows


@dataclass(frozen=True)
class VectorPolicy:
    """What the store keeps of each distribution."""

    top_n: int = DEFAULT_TOP_N
    full: bool = False
    full_dtype: str = "float32"

    @classmethod
    def for_vocab(cls, vocab_size: int, top_n: int = DEFAULT_TOP_N, full: bool | None = None, full_dtype: str = "float32") -> "VectorPolicy":
        if full is None:
            full = 0 < vocab_size <= FULL_VECTORS_AUTO_MAX_VOCAB
        if full_dtype not in FULL_DTYPES:
            raise ValueError(f"full_dtype must be one of {sorted(FULL_DTYPES)}, got {full_dtype!r}")
        if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
            raise ValueError(f"top_n must be an integer >= 1, got {top_n!r}")
        return cls(top_n=top_n, full=bool(full), full_dtype=full_dtype)

    def encode(self, dists: Sequence[np.ndarray]) -> tuple[list[bytes], list[bytes | None]]:
        """Top-N blobs and (when kept) full-vector blobs of many distributions of one
        vocabulary, in vectorised passes of at most ENCODE_CHUNK rows."""
        tops: list[bytes] = []
        fulls: list[bytes | None] = []
        for lo in range(0, len(dists), ENCODE_CHUNK):
            stacked = np.stack([np.asarray(d, dtype=np.float64) for d in dists[lo : lo + ENCODE_CHUNK]])
            minima = stacked.min(axis=1)
            stats = zip(_supports(stacked, minima), minima.tolist(), stacked.sum(axis=1).tolist())
            tops.extend(encode_top_arrays(ids, probs, st) for (ids, probs), st in zip(top_rows(stacked, self.top_n), stats))
            if not self.full:
                fulls.extend([None] * len(stacked))
                continue
            code = FULL_DTYPES[self.full_dtype]
            values = stacked.astype(_DTYPE_OF_CODE[code], copy=False)
            nonzero = values != 0
            counts = np.count_nonzero(nonzero, axis=1).tolist()
            fulls.extend(_full_blob(values[i], code, nonzero[i], counts[i]) for i in range(len(values)))
        return tops, fulls


def _supports(dists: np.ndarray, minima: np.ndarray) -> list[int]:
    """Entries > 0 per row; counted only in rows whose minimum is not positive (dense rows,
    the common case at temperature 1, are all support)."""
    support = np.full(len(dists), dists.shape[1], dtype=np.int64)
    rows = np.flatnonzero(minima <= 0)
    if rows.size:
        support[rows] = np.count_nonzero(dists[rows] > 0, axis=1)
    return support.tolist()


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def round_to_rows(rnd: Round, policy: VectorPolicy, run_id: str | None = None) -> tuple[dict, list[dict]]:
    """One Round -> (rounds row, draft_nodes rows), keyed by column name."""
    rows, nodes = rounds_to_rows([rnd], policy, run_id)
    return rows[0], nodes


def rounds_to_rows(rounds: Sequence[Round], policy: VectorPolicy, run_id: str | None = None) -> tuple[list[dict], list[dict]]:
    """Rounds -> (rounds rows, draft_nodes rows), with the distributions of all of them
    encoded together (the writer converts everything queued in a flush interval at once)."""
    dists: list[np.ndarray] = []

    def slot(dist: np.ndarray | None) -> int | None:
        if dist is None:
            return None
        dists.append(dist)
        return len(dists) - 1

    slots = [(slot(r.residual), slot(r.bonus_p), [(slot(n.p), slot(n.q)) for n in r.nodes]) for r in rounds]
    tops, fulls = policy.encode(dists)

    def top(i: int | None) -> bytes | None:
        return None if i is None else tops[i]

    def full(i: int | None) -> bytes | None:
        return None if i is None else fulls[i]

    round_rows: list[dict] = []
    node_rows: list[dict] = []
    for rnd, (residual, bonus, node_slots) in zip(rounds, slots):
        rid = run_id or rnd.run_id
        tc, dc, t = rnd.target_cache, rnd.draft_cache, rnd.timings
        index = int(rnd.index)
        round_rows.append({
            "run_id": rid,
            "round_index": index,
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
            "residual_top": top(residual),
            "residual_full": full(residual),
            "bonus_top": top(bonus),
            "bonus_full": full(bonus),
            "tc_before": int(tc.before),
            "tc_peak": int(tc.peak),
            "tc_after": int(tc.after),
            "tc_pending": [int(x) for x in tc.pending],
            "dc_before": None if dc is None else int(dc.before),
            "dc_peak": None if dc is None else int(dc.peak),
            "dc_after": None if dc is None else int(dc.after),
            "dc_pending": None if dc is None else [int(x) for x in dc.pending],
            "draft_s": float(t.draft_s),
            "verify_s": float(t.verify_s),
            "bookkeeping_s": float(t.bookkeeping_s),
            "draft_forwards": int(rnd.draft_forwards),
            "target_forwards": int(rnd.target_forwards),
        })
        node_rows.extend(
            {
                "run_id": rid,
                "round_index": index,
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
                "p_top": tops[p],
                "q_top": top(q),
                "p_full": fulls[p],
                "q_full": full(q),
            }
            for n, (p, q) in zip(rnd.nodes, node_slots)
        )
    return round_rows, node_rows


def _cache(before: Any, peak: Any, after: Any, pending: Any) -> CacheState | None:
    if before is None:
        return None
    return CacheState(before=int(before), peak=int(peak), after=int(after), pending=tuple(int(x) for x in pending or ()))


def rows_to_round(row: Mapping[str, Any], node_rows: Sequence[Mapping[str, Any]], vocab_size: int, full: bool = True) -> Round:
    """Rebuild a core Round. With full=False (or no stored full vectors) the distributions
    are PartialDistribution arrays built from the top-N."""

    def dist(top: bytes | None, fullblob: bytes | None, exact: Mapping[int, float] | None = None) -> np.ndarray | None:
        if top is None:
            return None
        return rebuild(top, fullblob if full else None, vocab_size, exact)

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
                p=dist(n["p_top"], n.get("p_full"), {token: n["p_token"]}),
                q=dist(n["q_top"], n.get("q_full"), None if q_token is None else {token: q_token}),
                status=n["status"],
                u=n["u"],
                p_token=n["p_token"],
                q_token=q_token,
                ratio=n["ratio"],
                overlap=n["overlap"],
                target_argmax=int(n["target_argmax"]),
            )
        )
    return Round(
        run_id=row["run_id"],
        index=int(row["round_index"]),
        prefix_len=int(row["prefix_len"]),
        emitted_before=int(row["emitted_before"]),
        remaining_budget=int(row["remaining_budget"]),
        k=int(row["k"]),
        greedy=bool(row["greedy"]),
        nodes=tuple(nodes),
        bonus_p=dist(row["bonus_top"], row.get("bonus_full")),
        rejected_node=row["rejected_node"],
        residual=dist(row["residual_top"], row.get("residual_full")),
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
    )


def emitted_tokens(items: Iterable[Sequence[Any]]) -> tuple[EmittedToken, ...]:
    return tuple(EmittedToken(token=int(t), kind=kind, node=node, draw=draw) for t, kind, node, draw in items)
