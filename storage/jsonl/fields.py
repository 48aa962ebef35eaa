"""The field checks of a JSONL trace line: the bounds every field must keep, JSON decoding that
refuses what the store cannot hold (integers past 64 bits, NaN, deep nesting), and `FieldReader`, the
typed field reader whose errors name the line and the dotted path of the field.

storage.jsonl.read parses validated fields into the core records; this module knows nothing
of records (docs/trace-format.md, *Bounds*).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, Literal, overload

from specscope.core.settings.bounds import INT64_MAX, MAX_K, MAX_TOP_N, MAX_VOCAB_SIZE, IntBound  # noqa: F401 (re-exported)
from specscope.storage.errors import TraceFormatError

# ---------------------------------------------------------------------------- bounds
# The bounds a run's settings also keep are the settings model's (core.settings.bounds): the
# vocabulary, k (draft length / tree budget, nodes per round, node depth) and top-N.
INT64_MIN = -(2**63)  # SQLite INTEGER
MAX_RUN_ID_CHARS = 64
MAX_NAME_CHARS = 4096  # names, hashes, paths, devices: no control characters
MAX_TEXT_CHARS = 1_000_000  # prompt_text, error: free text
MAX_FREE_JSON_CHARS = 1_000_000  # extra, proposer_params, library_versions, serialised
MAX_FREE_JSON_DEPTH = 32  # nesting inside a free-form object
MIN_TIME, MAX_TIME = 0.0, 253402214400.0  # 1970-01-01 .. 9999-12-31T00:00Z: datetime formats it in any time zone
_INT_CHARS = 20  # "-" and 19 digits: longer integer literals cannot fit in 64 bits


# ============================================================================ validation


class _BigInt:
    """An integer literal too long for 64 bits, kept as its digit count (json's parse_int
    hook): int() of more than 4300 digits raises a ValueError that names neither line nor
    field, and huge ints cost quadratic time to convert."""

    __slots__ = ("digits",)

    def __init__(self, literal: str):
        self.digits = len(literal.lstrip("-"))


def _parse_int(literal: str) -> int | _BigInt:
    return int(literal) if len(literal) <= _INT_CHARS else _BigInt(literal)


def loads_line(line: str) -> Any:
    return json.loads(line, parse_int=_parse_int)


def deep_field(line: str) -> str:
    """Where a line nests too deeply for json.loads: the object keys leading to the first
    container nested deeper than MAX_FREE_JSON_DEPTH (at most 4 of them, up to the first
    array), or "" when the scan cannot tell. Runs only on that error, in one pass."""
    stack: list[list[Any]] = []  # [is_object, key or array index]
    last = ""
    i, n = 0, len(line)
    while i < n:
        ch = line[i]
        if ch == '"':
            j = i + 1
            while True:
                j = line.find('"', j)
                if j < 0:
                    return ""
                k = j  # an escaped quote has an odd number of backslashes before it
                while line[k - 1] == "\\":
                    k -= 1
                if (j - k) % 2 == 0:
                    break
                j += 1
            last = line[i + 1 : j]
            i = j
        elif ch in "{[":
            stack.append([ch == "{", None if ch == "{" else 0])
            if len(stack) > MAX_FREE_JSON_DEPTH + 1:
                parts: list[str] = []
                for is_obj, key in stack[:4]:  # a container holds its current key: its child's name
                    if not is_obj or key is None:
                        break
                    try:
                        parts.append(_key(json.loads(f'"{key}"')))
                    except ValueError:
                        parts.append(_key(key))
                return ".".join(parts)
        elif ch in "}]":
            if stack:
                stack.pop()
        elif ch == ":" and stack and stack[-1][0]:
            stack[-1][1] = last
        elif ch == "," and stack and not stack[-1][0]:
            stack[-1][1] += 1
        i += 1
    return ""


def _is_control(ch: str) -> bool:
    return ch < " " or "\x7f" <= ch <= "\x9f"


def control_char(s: str) -> str | None:
    """The first control character of s (C0, DEL, C1), if any."""
    for ch in s:
        if _is_control(ch):
            return ch
    return None


_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "num": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v), "a finite number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "blob": (lambda v: isinstance(v, str), "a string"),  # encoded data: bounded where it is decoded
    "obj": (lambda v: isinstance(v, dict), "an object"),
    "list": (lambda v: isinstance(v, list), "an array"),
    "ints": (lambda v: isinstance(v, list), "an array of integers"),
    "any": (lambda v: True, "anything"),
}


class FieldReader:
    """Field access with errors that name the line and the field."""

    def __init__(self, line: int):
        self.line = line

    def fail(self, path: str, message: str) -> TraceFormatError:
        return TraceFormatError(self.line, path, message)

    def obj(self, value: Any, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(path, f"expected an object, got {kind_of(value)}")
        return value

    def get(
        self,
        d: dict[str, Any],
        key: str,
        path: str,
        kind: str,
        *,
        required: bool = True,
        default: Any = None,
        nullable: bool = False,
        choices: tuple[Any, ...] | None = None,
    ) -> Any:
        full = f"{path}.{key}" if path else key
        if key not in d:
            if required:
                raise self.fail(full, "missing")
            return default
        return self.check(d[key], full, kind, nullable=nullable, choices=choices)

    def check(
        self, v: Any, path: str, kind: str, *, nullable: bool = False, choices: tuple[Any, ...] | None = None
    ) -> Any:
        if v is None:
            if nullable:
                return None
            raise self.fail(path, f"must not be null (expected {kind})")
        ok, expected = _KINDS[kind]
        if not ok(v):
            if isinstance(v, _BigInt) and kind == "int":
                raise self.fail(
                    path, f"an integer of {v.digits} digits is out of range (integers must fit in signed 64 bits)"
                )
            raise self.fail(path, f"expected {expected}, got {kind_of(v)}")
        if kind == "int":
            if not INT64_MIN <= v <= INT64_MAX:
                raise self.fail(path, f"{v} is out of range (integers must fit in signed 64 bits)")
        elif kind == "num":
            v = float(v)
        elif kind == "ints":
            for i, x in enumerate(v):
                self.check(x, f"{path}[{i}]", "int")
        elif kind == "str" and choices is None:
            self.name(v, path)
        if choices is not None and v not in choices:
            raise self.fail(path, f"expected one of {'|'.join(map(str, choices))}, got {kind_of(v)}")
        return v

    def name(self, s: str, path: str, limit: int = MAX_NAME_CHARS, control: bool = False) -> str:
        """A bounded string; ids and names (control=False) without control characters."""
        if len(s) > limit:
            raise self.fail(path, f"a string of {len(s)} characters, at most {limit} allowed")
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as exc:  # "\ud800" in JSON: SQLite cannot store it
            raise self.fail(path, f"not valid Unicode (a lone surrogate U+{ord(s[exc.start]):04X})") from None
        if not control:
            ch = control_char(s)
            if ch is not None:
                raise self.fail(path, f"contains the control character U+{ord(ch):04X} (not allowed in ids and names)")
        return s

    def text(self, d: dict[str, Any], key: str, path: str = "") -> str | None:
        """Optional free text (newlines allowed), bounded."""
        full = f"{path}.{key}" if path else key
        v = d.get(key)
        if v is None:
            return None
        if not isinstance(v, str):
            raise self.fail(full, f"expected a string, got {kind_of(v)}")
        return self.name(v, full, MAX_TEXT_CHARS, control=True)

    def within(self, d: dict[str, Any], key: str, path: str, bound: IntBound, **kw: Any) -> Any:
        """An integer field within a bound of the settings model (core.settings.bounds)."""
        return self.bounded(d, key, path, bound.lo, bound.hi, **kw)

    def bounded(self, d: dict[str, Any], key: str, path: str, lo: int, hi: int, **kw: Any) -> Any:
        """An integer field within [lo, hi]."""
        v = self.get(d, key, path, "int", **kw)
        if v is not None and not lo <= v <= hi:
            raise self.fail(f"{path}.{key}" if path else key, f"{v} is outside [{lo}, {hi}]")
        return v

    @overload
    def time(self, d: dict[str, Any], key: str, *, default: float, nullable: Literal[False] = False) -> float: ...
    @overload
    def time(self, d: dict[str, Any], key: str, *, default: Any = None, nullable: bool = False) -> float | None: ...
    def time(self, d: dict[str, Any], key: str, *, default: Any = None, nullable: bool = False) -> float | None:
        """A UTC unix time that datetime can format: years 1970..9999."""
        v: float | None = self.get(d, key, "", "num", required=False, default=default, nullable=nullable)
        if v is not None and not MIN_TIME <= v <= MAX_TIME:
            raise self.fail(key, f"{v!r} is not a unix time between 1970 and 9999 ({MIN_TIME:.0f}..{MAX_TIME:.0f})")
        return v

    def free(self, d: dict[str, Any], key: str, path: str, default: Any) -> Any:
        """A free-form JSON object (extra, proposer_params, library_versions): finite numbers,
        64-bit integers, nesting and size bounded. Walked without recursion."""
        full = f"{path}.{key}" if path else key
        value = self.get(d, key, path, "obj", required=False, default=default, nullable=default is None)
        if value is None:
            return None
        stack: list[tuple[Any, str, int]] = [(value, full, 0)]
        while stack:
            x, where, depth = stack.pop()
            if isinstance(x, dict):
                if depth >= MAX_FREE_JSON_DEPTH:
                    raise self.fail(where, f"nested deeper than {MAX_FREE_JSON_DEPTH} levels")
                stack.extend((item, f"{where}.{_key(k)}", depth + 1) for k, item in x.items())
            elif isinstance(x, list):
                if depth >= MAX_FREE_JSON_DEPTH:
                    raise self.fail(where, f"nested deeper than {MAX_FREE_JSON_DEPTH} levels")
                stack.extend((item, f"{where}[{i}]", depth + 1) for i, item in enumerate(x))
            elif isinstance(x, _BigInt):
                raise self.fail(
                    where, f"an integer of {x.digits} digits is out of range (integers must fit in signed 64 bits)"
                )
            elif isinstance(x, float) and not math.isfinite(x):
                raise self.fail(where, f"{x!r} is not a finite number (NaN and Infinity are not JSON)")
            elif isinstance(x, int) and not isinstance(x, bool) and not INT64_MIN <= x <= INT64_MAX:
                raise self.fail(where, f"{x} is out of range (integers must fit in signed 64 bits)")
        size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
        if size > MAX_FREE_JSON_CHARS:
            raise self.fail(full, f"{size} characters of JSON, at most {MAX_FREE_JSON_CHARS} allowed")
        return value

    def token(
        self,
        d: dict[str, Any],
        key: str,
        path: str,
        vocab: int,
        *,
        required: bool = True,
        default: Any = None,
        nullable: bool = False,
    ) -> Any:
        v = self.get(d, key, path, "int", required=required, default=default, nullable=nullable)
        if v is not None and not 0 <= v < vocab:
            raise self.fail(f"{path}.{key}" if path else key, f"token id {v} outside the vocabulary [0, {vocab})")
        return v


def _key(k: str) -> str:
    """A free-form key as a (short) part of a field path."""
    return k if len(k) <= 40 else k[:40] + "..."


def kind_of(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, _BigInt):
        return f"an integer of {v.digits} digits"
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
