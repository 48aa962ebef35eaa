"""The distribution blobs, the arrays read back from them, and what the store keeps of a vector.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specscope.core.records import Round
from specscope.core.sampling.dists import DEFAULT_TOP_N as DEFAULT_TOP_N  # re-exported
from specscope.core.sampling.dists import TOP_K_COVER_MAX as TOP_K_COVER_MAX  # re-exported
from specscope.core.sampling.dists import TopDistribution
from specscope.core.sampling.dists import covering_top_n as covering_top_n  # re-exported
from specscope.core.sampling.partial import VectorStats, vector_stats

# Full vectors are kept by default up to this vocabulary (byte- and character-level
# tokenizers; 4 KB a float32 vector). Above it a round's full vectors outweigh its top-N
# ~40x (145 KB vs 3.5 KB a round at V=4096, k=4) and cost 2-3x the top-N's recording time,
# while the top-N with the whole-vector stats keeps every checker rule working.
FULL_VECTORS_AUTO_MAX_VOCAB = 1024
FULL_DTYPES = {"float32": b"4", "float64": b"8"}
_DTYPE_OF_CODE: dict[bytes, np.dtype[Any]] = {b"4": np.dtype("<f4"), b"8": np.dtype("<f8")}
# Distributions per vectorised pass: 1 MB of float64 at V=4096, a core's L2 cache here
# (writer encoding in real traced runs: 0.132-0.136 ms a round, 0.144-0.145 ms with 64).
ENCODE_CHUNK = 32
ZLIB_LEVEL = 1  # JSONL export: float vectors barely compress further at higher levels; level 1 is ~2x faster


# ---------------------------------------------------------------------------- arrays


Top = tuple[np.ndarray, np.ndarray]  # ids and probabilities of a top-N blob, in its order


class PartialDistribution(np.ndarray):
    """A full-vocabulary array of which only `known_ids` hold real values (others are 0).

    `top` is the top-N (ids, probabilities) it was read from, in the blob's order: storing
    the array again (the row builder) writes that top-N and `stats` unchanged. Arrays made
    from it (views, copies, results of operations) have top None."""

    partial = True
    known_ids: np.ndarray
    stats: VectorStats | None
    top: Top | None

    def __new__(
        cls, values: np.ndarray, known_ids: np.ndarray, stats: VectorStats | None = None, top: Top | None = None
    ) -> PartialDistribution:
        obj = np.asarray(values, dtype=np.float64).view(cls)
        obj.known_ids = np.asarray(known_ids, dtype=np.int64)
        obj.stats = stats
        obj.top = top
        return obj

    def __array_finalize__(self, obj: Any) -> None:
        self.known_ids = getattr(obj, "known_ids", np.zeros(0, dtype=np.int64))
        self.stats = getattr(obj, "stats", None)
        self.top = None

    @property
    def missing_mass(self) -> float:
        """Probability mass not accounted for by the known entries (>= 0)."""
        total = 1.0 if self.stats is None else self.stats.total
        return max(0.0, total - float(np.asarray(self).sum()))

    def __reduce__(self) -> tuple[Any, ...]:  # pickle as (values, known_ids, stats, top)
        return (PartialDistribution, (np.asarray(self), self.known_ids, self.stats, self.top))


class StoredFullDistribution(np.ndarray):
    """A full vector read back from a store, with the whole vector's exact `stats` from its
    top-N blob. float32 storage flushes entries below 1.4e-45 to 0 (an unfiltered q at a low
    temperature has such entries), so support and minimum counted from the stored values
    could be wrong; the saved stats are those of the float64 vector the decoder recorded.
    `top` (the stored top-N, exact float64) and `full_dtype` (the dtype the vector was
    stored in) let the row builder store it again unchanged.
    Only the array as loaded carries them: its views and the results of operations on it
    have stats, top and full_dtype None (their stats are computed from their values)."""

    partial = False
    stats: VectorStats | None
    top: Top | None
    full_dtype: str | None

    def __new__(
        cls, values: np.ndarray, stats: VectorStats | None, top: Top | None = None, full_dtype: str | None = None
    ) -> StoredFullDistribution:
        obj = np.asarray(values, dtype=np.float64).view(cls)
        obj.stats = stats
        obj.top = top
        obj.full_dtype = full_dtype
        return obj

    def __array_finalize__(self, obj: Any) -> None:
        self.stats = None
        self.top = None
        self.full_dtype = None

    def __reduce__(self) -> tuple[Any, ...]:  # pickle as (values, stats, top, full_dtype)
        return (StoredFullDistribution, (np.asarray(self), self.stats, self.top, self.full_dtype))


# Distributions that carry their own top-N and whole-vector facts (read back from a store or
# a trace file, or a decoder's TopDistribution): stored again as they are.
_STORED_FORMS = (PartialDistribution, StoredFullDistribution, TopDistribution)


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
        kept: bytes = values[nonzero].tobytes()
        return (
            b"S"
            + code
            + int(values.size).to_bytes(4, "little")
            + np.packbits(nonzero, bitorder="little").tobytes()
            + kept
        )
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
    nonzero = np.unpackbits(
        np.frombuffer(blob, dtype=np.uint8, count=mask_end - 6, offset=6), count=size, bitorder="little"
    ).astype(bool)
    values = np.zeros(size, dtype=_DTYPE_OF_CODE[code])
    values[nonzero] = np.frombuffer(blob, dtype=_DTYPE_OF_CODE[code], offset=mask_end)
    return dtype, values.tobytes()


def decode_full_as(blob: bytes) -> tuple[str, np.ndarray]:
    """(the dtype it was stored in, the whole vector as float64) of a full-vector blob."""
    dtype, raw = full_raw(blob)
    return dtype, np.frombuffer(raw, dtype=_DTYPE_OF_CODE[FULL_DTYPES[dtype]]).astype(np.float64)


def decode_full(blob: bytes) -> np.ndarray:
    return decode_full_as(blob)[1]


def rebuild(top: bytes, full: bytes | None, vocab_size: int, exact: Mapping[int, float] | None = None) -> np.ndarray:
    """The in-memory distribution from its blobs (see the module docstring)."""
    ids, probs, stats = decode_top_stats(top)
    if full is not None:
        dtype, out = decode_full_as(full)
        out[ids] = probs
        for i, v in (exact or {}).items():
            out[i] = v
        return out if stats is None else StoredFullDistribution(out, stats, (ids, probs), dtype)
    out = np.zeros(vocab_size, dtype=np.float64)
    out[ids] = probs
    known = set(ids.tolist())
    for i, v in (exact or {}).items():
        out[i] = v
        known.add(i)
    return PartialDistribution(out, np.array(sorted(known), dtype=np.int64), stats, (ids, probs))


_FRAME = struct.Struct("<I")


def pack_blobs(blobs: Sequence[bytes | None]) -> bytes:
    """Several distribution blobs in one column (a tree round's residual updates): uint32
    count, uint32 length of each (0 = none), then the blobs in order."""
    parts = [b or b"" for b in blobs]
    head = _FRAME.pack(len(parts)) + b"".join(_FRAME.pack(len(b)) for b in parts)
    return head + b"".join(parts)


def unpack_blobs(packed: bytes) -> list[bytes | None]:
    """The blobs of pack_blobs (None where none was stored)."""
    if len(packed) < 4:
        raise ValueError("not a packed list of distribution blobs")
    count = _FRAME.unpack_from(packed, 0)[0]
    at = 4 + 4 * count
    if len(packed) < at:
        raise ValueError("not a packed list of distribution blobs (truncated header)")
    out: list[bytes | None] = []
    for i in range(count):
        size = _FRAME.unpack_from(packed, 4 + 4 * i)[0]
        out.append(bytes(packed[at : at + size]) if size else None)
        at += size
    if at != len(packed):
        raise ValueError("not a packed list of distribution blobs (lengths disagree with its size)")
    return out


# ---------------------------------------------------------------------------- rows


@dataclass(frozen=True)
class VectorPolicy:
    """What the store keeps of each distribution."""

    top_n: int = DEFAULT_TOP_N
    full: bool = False
    full_dtype: str = "float32"

    @classmethod
    def for_vocab(
        cls, vocab_size: int, top_n: int = DEFAULT_TOP_N, full: bool | None = None, full_dtype: str = "float32"
    ) -> VectorPolicy:
        if full is None:
            full = 0 < vocab_size <= FULL_VECTORS_AUTO_MAX_VOCAB
        if full_dtype not in FULL_DTYPES:
            raise ValueError(f"full_dtype must be one of {sorted(FULL_DTYPES)}, got {full_dtype!r}")
        if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
            raise ValueError(f"top_n must be an integer >= 1, got {top_n!r}")
        return cls(top_n=top_n, full=bool(full), full_dtype=full_dtype)

    def encode(self, dists: Sequence[np.ndarray]) -> tuple[list[bytes], list[bytes | None]]:
        """Top-N blobs and (when kept) full-vector blobs of many distributions of one
        vocabulary. Plain arrays (the decoder's) are encoded in vectorised passes of at most
        ENCODE_CHUNK rows; arrays read back from a store or a trace file (PartialDistribution,
        StoredFullDistribution) keep the top-N and facts they were read with."""
        stored = [i for i, d in enumerate(dists) if isinstance(d, _STORED_FORMS)]
        if not stored:
            return self._encode_arrays(dists)
        plain = [i for i, d in enumerate(dists) if not isinstance(d, _STORED_FORMS)]
        tops: list[bytes] = [b""] * len(dists)
        fulls: list[bytes | None] = [None] * len(dists)
        for i, top, full in zip(plain, *self._encode_arrays([dists[i] for i in plain])):
            tops[i], fulls[i] = top, full
        for i in stored:
            tops[i], fulls[i] = self._encode_stored(dists[i])
        return tops, fulls

    def _encode_stored(self, dist: np.ndarray) -> tuple[bytes, bytes | None]:
        top = getattr(dist, "top", None)
        ids, probs = top if top is not None else top_entries(dist, self.top_n)
        full = None
        if self.full and not is_partial(dist):
            full = encode_full(dist, getattr(dist, "full_dtype", None) or self.full_dtype)
        return encode_top_arrays(ids, probs, vector_stats(dist)), full

    def _encode_arrays(self, dists: Sequence[np.ndarray]) -> tuple[list[bytes], list[bytes | None]]:
        tops: list[bytes] = []
        fulls: list[bytes | None] = []
        for lo in range(0, len(dists), ENCODE_CHUNK):
            stacked = np.stack([np.asarray(d, dtype=np.float64) for d in dists[lo : lo + ENCODE_CHUNK]])
            minima = stacked.min(axis=1)
            stats = zip(_supports(stacked, minima), minima.tolist(), stacked.sum(axis=1).tolist())
            tops.extend(
                encode_top_arrays(ids, probs, st) for (ids, probs), st in zip(top_rows(stacked, self.top_n), stats)
            )
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
