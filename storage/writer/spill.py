"""Where a run's rounds go when its store stays locked: a JSONL trace next to the store.

A RunSink whose store is locked by another process keeps its rounds in memory and retries
(storage.writer.sink). When the lock does not clear within the writer's wait
(SPECSCOPE_LOCK_WAIT_S), when the rounds kept in memory grow past MAX_WAITING_BYTES, or when
the recording is interrupted while it waits, it gives up on the store and writes the whole
run to a Spill instead: the header and the rounds the store already holds (read from the
store: SQLite's write-ahead log lets a reader in while another connection holds the write
lock), then the waiting rounds, then every later round and the end record. A store locked
past the wait when the run starts never gets the run row: the file then starts from the row
the writer built (nothing is read from the store) and holds every round. The file is the
JSONL trace format (docs/trace-format.md): `specscope import FILE --db STORE --run-id NEW`
takes it (without --run-id when the store holds none of the run).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select

from specscope.storage.rows import chunk_tokens
from specscope.storage.schema import runs_table, tokens_table

SPILL_SUFFIX = ".jsonl"


def spill_path(store_path: str | None, run_id: str) -> Path:
    """A new file for the run's rounds: beside the store (STORE.RUNID.jsonl), else in the
    current folder, else in the temporary folder, whichever can be written first."""
    name = f"{Path(store_path).name}.{run_id}" if store_path else f"specscope-run-{run_id}"
    folders = ([Path(store_path).parent] if store_path else []) + [Path.cwd(), Path(tempfile.gettempdir())]
    for folder in folders:
        if not os.access(folder, os.W_OK):
            continue
        for n in range(100):
            path = folder / (name + (f"-{n}" if n else "") + SPILL_SUFFIX)
            if not path.exists():
                return path
    raise OSError(f"no folder to write the rounds of run {run_id} to (tried {', '.join(map(str, folders))})")


class Spill:
    """A run written as a JSONL trace, its first rounds copied from the store; or, given the
    `run` row that the store never got (it was locked when the run started), from that row
    with no rounds yet."""

    def __init__(self, engine: Engine, run_id: str, store_path: str | None, run: Mapping[str, Any] | None = None):
        from specscope.storage.jsonl.transfer import header_json

        self.run_id = run_id
        self.path = spill_path(store_path, run_id)
        self.rounds = 0  # rounds in the file
        self.copied = 0  # ... of which the store already held
        self.tokens: list[int] = []
        self._fh = open(self.path, "x", encoding="utf-8")  # noqa: SIM115 - held for the spill's life (appended by write), closed on failure below
        try:
            if run is None:
                self._copy(engine)
            else:  # the store holds nothing of the run: nothing to read (which its lock might refuse as well)
                self._run = dict(run)
                self._fh.write(_dumps(header_json(self._run)) + "\n")
            self._fh.flush()
        except BaseException:
            self._fh.close()
            raise

    def _copy(self, engine: Engine) -> None:
        """The header and the rounds that the store holds."""
        from specscope.storage.jsonl.transfer import header_json, round_lines

        with engine.connect() as conn:  # a read: the write lock does not stop it (WAL)
            run = conn.execute(select(runs_table).where(runs_table.c.run_id == self.run_id)).one()._mapping
            self._run = dict(run)
            self._fh.write(_dumps(header_json(run)) + "\n")
            for line in round_lines(conn, self.run_id):
                self._fh.write(line + "\n")
                self.copied += 1
            for row in conn.execute(
                select(tokens_table.c.tokens).where(tokens_table.c.run_id == self.run_id).order_by(tokens_table.c.start)
            ):
                self.tokens.extend(int(t) for t in chunk_tokens(row.tokens))
        self.rounds = self.copied

    def write(
        self, round_rows: Sequence[Mapping[str, Any]], node_rows: Sequence[Mapping[str, Any]], tokens: Sequence[int]
    ) -> None:
        """Append rounds as the writer built their rows."""
        from specscope.storage.jsonl.transfer import round_line

        nodes: dict[int, list[Any]] = {}
        for n in node_rows:
            nodes.setdefault(n["round_index"], []).append(n)
        for r in round_rows:
            self._fh.write(round_line(r, nodes.get(r["round_index"], []), self.run_id) + "\n")
        self.rounds += len(round_rows)
        self.tokens.extend(int(t) for t in tokens)
        self._fh.flush()

    def close(self, final: Mapping[str, Any] | None) -> None:
        """Write the end record (`final`: status, stop_reason, error, ended_at, wall_s) and
        close; None leaves the run without one (it reads as not finished)."""
        from specscope.storage.jsonl.transfer import end_line

        if self._fh.closed:
            return
        try:
            if final is not None:
                run = {**self._run, "stop_reason": None, "error": None, "wall_s": None, **final}
                self._fh.write(end_line(run, self.tokens) + "\n")
            self._fh.flush()
            os.fsync(self._fh.fileno())
        finally:
            self._fh.close()


def _dumps(obj: Any) -> str:
    from specscope.storage.jsonl.transfer import _line

    return _line(obj, "its header")
