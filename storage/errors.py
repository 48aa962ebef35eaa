"""Errors raised by the trace store. Every one is a TraceStoreError, so callers (CLI, GUI)
can catch one class and show its message."""

from __future__ import annotations


class TraceStoreError(Exception):
    """Base class: something about the trace store or a trace file is wrong."""


class NotATraceStoreError(TraceStoreError):
    """The file is not an SQLite database, or an SQLite database without specscope's tables."""


class SchemaVersionError(TraceStoreError):
    """The store was written by a newer specscope (or its version table is unreadable)."""


class NewerStoreError(SchemaVersionError):
    """The store's schema version is newer than this specscope knows: nothing writes into it
    (readers read the tables and columns they know, and say that the store is newer)."""


class CorruptStoreError(TraceStoreError):
    """SQLite reports the database file as malformed."""


class RunNotFoundError(TraceStoreError, KeyError):
    """No run with that id (or id prefix) in the store."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "run not found"


class RunExistsError(TraceStoreError):
    """A run with that id is already stored."""


class WriterError(TraceStoreError):
    """The background writer failed; the message carries its exception."""


class TraceFormatError(TraceStoreError):
    """A JSONL trace line is invalid. `line` is 1-based, `field` a dotted path."""

    def __init__(self, line: int, field: str, message: str):
        self.line = line
        self.field = field
        self.message = message
        where = f"line {line}" + (f", field {field!r}" if field else "")
        super().__init__(f"{where}: {message}")
