"""Rounds without their distributions, kept column by column (pure: no Qt, no SQL).

A slim Round as Python objects costs a few kilobytes (the Round, its DraftNodes,
EmittedTokens, CacheStates, their dicts and boxed numbers); a replay of a million rounds
would need gigabytes. CompactRounds keeps each field of the records in a typed array
(`array`: 8 bytes a number, 1 a flag, a code a string) and rebuilds the slim Round when
it is read, so it is a Sequence[Round] the views index as before.

The fields come from the dataclasses themselves (a new scalar field of Round or DraftNode is
kept without a change here); values of a type no array holds are kept as objects.
"""

from __future__ import annotations

import dataclasses
from array import array
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from specscope.core.records import CacheState, DraftNode, EmittedToken, Round, RoundTimings


class _Column:
    """One field's values: a typed array (ints, floats, flags, string codes, tuples of ints)
    with a None mask; anything else as a list of objects."""

    __slots__ = ("codes", "kind", "names", "none", "offsets", "values")

    def __init__(self) -> None:
        self.kind: str | None = None
        self.values: Any = []  # the placeholders of leading Nones until the kind is known
        self.none = bytearray()
        self.codes: dict[str, int] = {}
        self.names: list[str] = []
        self.offsets = array("q", [0])

    @staticmethod
    def _kind_of(v: Any) -> str:
        if isinstance(v, (bool, np.bool_)):
            return "bool"
        if isinstance(v, (int, np.integer)):
            return "int"
        if isinstance(v, (float, np.floating)):
            return "float"
        if isinstance(v, str):
            return "str"
        if isinstance(v, tuple) and all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in v):
            return "ints"
        return "obj"

    def _start(self, kind: str) -> None:
        old = len(self.none)
        self.kind = kind
        self.values = {
            "bool": array("b"),
            "int": array("q"),
            "float": array("d"),
            "str": array("i"),
            "ints": array("q"),
            "obj": [],
        }[kind]
        if kind == "ints":
            self.offsets = array("q", [0] * (old + 1))
        elif kind == "obj":
            self.values.extend([None] * old)
        else:
            self.values.extend([0] * old)

    def _to_objects(self) -> None:
        items = [self.get(i) for i in range(len(self.none))]
        self.kind, self.values = "obj", items

    def append(self, v: Any) -> None:
        kind = self.kind
        t = type(v)
        if (t is float and kind == "float") or (t is int and kind == "int") or (t is bool and kind == "bool"):
            self.none.append(0)  # the common case first: a value of the column's own type
            self.values.append(v)
            return
        if v is None:
            self.none.append(1)
            if self.kind is None:
                return
            self._put_default()
            return
        kind = self._kind_of(v)
        if self.kind is None:
            self._start(kind)
        elif kind != self.kind:
            if self.kind == "int" and kind == "float":
                self.values = array("d", self.values)
                self.kind = "float"
            elif not (self.kind == "float" and kind == "int"):
                self._to_objects()
        self.none.append(0)
        if self.kind == "str":
            code = self.codes.get(v)
            if code is None:
                code = self.codes[v] = len(self.names)
                self.names.append(v)
            self.values.append(code)
        elif self.kind == "ints":
            self.values.extend(int(x) for x in v)
            self.offsets.append(len(self.values))
        elif self.kind == "obj":
            self.values.append(v)
        elif self.kind == "float":
            self.values.append(float(v))
        else:  # int, bool
            self.values.append(int(v))

    def extend(self, values: list) -> None:
        """Many values at once: one typed extend when they all have the column's type (or
        are None)."""
        start = 0
        while self.kind is None and start < len(values):  # leading Nones, then the kind
            self.append(values[start])
            start += 1
        if start:
            values = values[start:]
        kind = self.kind
        expected = {"float": float, "int": int, "bool": bool, "str": str}.get(kind or "")
        if expected is None or not all(v is None or type(v) is expected for v in values):
            for v in values:
                self.append(v)
            return
        self.none.extend(bytes(v is None for v in values))
        if kind == "str":
            for v in set(values) - {None} - self.codes.keys():
                self.codes[v] = len(self.names)
                self.names.append(v)
            codes = self.codes
            values = [0 if v is None else codes[v] for v in values]
        elif None in values:
            values = [0 if v is None else v for v in values]
        self.values.extend(values)

    def _put_default(self) -> None:
        if self.kind == "ints":
            self.offsets.append(len(self.values))
        elif self.kind == "obj":
            self.values.append(None)
        else:
            self.values.append(0)

    def get(self, i: int) -> Any:
        if self.none[i]:
            return None
        kind = self.kind
        if kind == "bool":
            return bool(self.values[i])
        if kind == "str":
            return self.names[self.values[i]]
        if kind == "ints":
            return tuple(self.values[self.offsets[i] : self.offsets[i + 1]])
        return self.values[i]

    def nbytes(self) -> int:
        if self.kind == "obj":
            return 8 * len(self.values)
        size = len(self.none) + (self.values.itemsize * len(self.values) if self.kind else 0)
        return size + (self.offsets.itemsize * len(self.offsets) if self.kind == "ints" else 0)


class _Table:
    """The records of one dataclass, field by field; `nested` fields hold records of another
    table (one each, or a tuple of them) and `dropped` fields are rebuilt as None."""

    def __init__(self, cls: type, nested: dict[str, _Table] | None = None, dropped: tuple[str, ...] = ()):
        self.cls = cls
        self.nested = nested or {}
        self.dropped = dropped
        self.fields = [f.name for f in dataclasses.fields(cls) if f.name not in self.nested and f.name not in dropped]
        self.columns = {name: _Column() for name in self.fields}
        self.links: dict[str, array] = {name: array("q") for name in self.nested}  # first row, or -1 for None
        self.counts: dict[str, array] = {
            name: array("i") for name in self.nested
        }  # -1: one record, else a tuple's length
        self.size = 0

    def append(self, obj: Any) -> None:
        for name in self.fields:
            self.columns[name].append(getattr(obj, name))
        for name, table in self.nested.items():
            value = getattr(obj, name)
            if value is None:
                self.links[name].append(-1)
                self.counts[name].append(-1)
            elif isinstance(value, tuple):
                self.links[name].append(table.size)
                self.counts[name].append(len(value))
                for item in value:
                    table.append(item)
            else:
                self.links[name].append(table.size)
                self.counts[name].append(-1)
                table.append(value)
        self.size += 1

    def extend(self, objs: list) -> None:
        """Many records at once, field by field (a typed extend per column)."""
        for name in self.fields:
            self.columns[name].extend([getattr(o, name) for o in objs])
        for name, table in self.nested.items():
            links, counts, children = self.links[name], self.counts[name], []
            first = table.size
            for o in objs:
                value = getattr(o, name)
                if value is None:
                    links.append(-1)
                    counts.append(-1)
                elif isinstance(value, tuple):
                    links.append(first + len(children))
                    counts.append(len(value))
                    children.extend(value)
                else:
                    links.append(first + len(children))
                    counts.append(-1)
                    children.append(value)
            table.extend(children)
        self.size += len(objs)

    def get(self, i: int) -> Any:
        kwargs = {name: self.columns[name].get(i) for name in self.fields}
        for name in self.dropped:
            kwargs[name] = None
        for name, table in self.nested.items():
            first, count = self.links[name][i], self.counts[name][i]
            if count >= 0:
                kwargs[name] = tuple(table.get(j) for j in range(first, first + count))
            else:
                kwargs[name] = None if first < 0 else table.get(first)
        return self.cls(**kwargs)

    def nbytes(self) -> int:
        own = sum(c.nbytes() for c in self.columns.values()) + 12 * self.size * len(self.nested)
        return own + sum(t.nbytes() for t in self.nested.values())


def _round_table(cls: type) -> _Table:
    return _Table(
        cls,
        nested={
            "nodes": _Table(DraftNode, dropped=("p", "q")),
            "emitted": _Table(EmittedToken),
            "target_cache": _Table(CacheState),
            "draft_cache": _Table(CacheState),
            "timings": _Table(RoundTimings),
        },
        dropped=("bonus_p", "residual"),
    )


class CompactRounds(Sequence):
    """A run's rounds, slim (no distributions), in typed arrays; `held` rounds (kept whole by
    the model, distributions and all) are returned as they were given."""

    def __init__(self) -> None:
        self._table: _Table | None = None
        self._tokens = array("q")  # every emitted token, in order: the output
        self._odd: dict[int, Round] = {}  # a round of another record type than the first
        self.held: dict[int, Round] = {}
        self._size = 0

    def append(self, r: Round, hold: bool = False) -> None:
        if self._table is None and all(hasattr(r, name) for name in ("nodes", "emitted", "timings")):
            self._table = _round_table(type(r))
        if self._table is not None and type(r) is self._table.cls:
            self._table.append(r)
        else:  # kept as a slim object
            self._odd[self._size] = dataclasses.replace(
                r, nodes=tuple(dataclasses.replace(n, p=None, q=None) for n in r.nodes), bonus_p=None, residual=None
            )
        if hold:
            self.held[self._size] = r
        self._tokens.extend(int(t) for t in r.tokens)
        self._size += 1

    def extend(self, rounds: list[Round], hold: list[bool] | None = None) -> None:
        """Many rounds at once (a replay batch): the same as append() one by one, faster."""
        if self._table is None and rounds:
            self.append(rounds[0], bool(hold and hold[0]))
            rounds, hold = rounds[1:], (hold[1:] if hold else None)
        if self._table is None or any(type(r) is not self._table.cls for r in rounds):
            for j, r in enumerate(rounds):
                self.append(r, bool(hold and hold[j]))
            return
        self._table.extend(rounds)
        for j, r in enumerate(rounds):
            if hold and hold[j]:
                self.held[self._size + j] = r
            self._tokens.extend(e.token for e in r.emitted)
        self._size += len(rounds)

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._size))]
        if i < 0:
            i += self._size
        if not 0 <= i < self._size:
            raise IndexError(f"round {i} out of range ({self._size} rounds)")
        got = self.held.get(i)
        if got is not None:
            return got
        odd = self._odd.get(i)
        if odd is not None:
            return odd
        return self._table.get(self._table_row(i))

    def _table_row(self, i: int) -> int:
        if not self._odd:
            return i
        return i - sum(1 for j in self._odd if j < i)

    def __iter__(self) -> Iterator[Round]:
        for i in range(self._size):
            yield self[i]

    @property
    def tokens(self) -> list[int]:
        """Every emitted token of the rounds, in order."""
        return self._tokens.tolist()

    def nbytes(self) -> int:
        """Bytes of the arrays (the held rounds and odd records not counted)."""
        table = self._table.nbytes() if self._table is not None else 0
        return table + self._tokens.itemsize * len(self._tokens)
