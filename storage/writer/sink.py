"""RunSink: the database half of a TraceWriter.

It turns batches of rounds into rows (rows.rounds_to_rows, the row builder) and commits them, together with
the run's aggregates and heartbeat, in one transaction. Every commit only appends: the rounds,
their nodes, one run_tokens chunk with the tokens they emitted, and an UPDATE of the run row
that increments its counters, so a commit costs the same at round 10 and at round 10 million. The writer's thread
uses it in the
recording process; the writer process (writer_child) uses the same class on its own engine.
"""

from __future__ import annotations

import json
import operator
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import JSON, Engine, Table, bindparam, insert, update

from specscope.core.records import Round
from specscope.storage.codec import VectorPolicy
from specscope.storage.errors import TraceStoreError
from specscope.storage.rows import rounds_to_rows, token_chunk
from specscope.storage.schema import nodes_table, rounds_table, runs_table, tokens_table
from specscope.storage.transactions import busy_timeout_ms, is_busy, transaction, translate_errors
from specscope.storage.writer.spill import Spill

LOCK_WAIT_ENV = "SPECSCOPE_LOCK_WAIT_S"
LOCK_WAIT_S = 300.0  # how long a writer keeps rounds for a locked store before it writes them to a file
RETRY_WAIT_MS = 1000  # how long each try waits for the lock once the store has made the writer wait
MAX_WAITING_BYTES = 1 << 30  # ... or until the rounds it keeps in memory hold this many bytes


def lock_wait_s() -> float:
    """The writer's wait for a locked store: $SPECSCOPE_LOCK_WAIT_S seconds, else LOCK_WAIT_S
    (a value that is not a number >= 0 is a TraceStoreError)."""
    text = os.environ.get(LOCK_WAIT_ENV, "").strip()
    if not text:
        return LOCK_WAIT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise TraceStoreError(f"{LOCK_WAIT_ENV} must be a number of seconds >= 0, got {text!r}")
    return value


@dataclass(frozen=True)
class LockWait:
    """Where a writer stands with a locked store (what its on_wait callback is told).

    state: "waiting" (rounds kept in memory, retrying), "resumed" (the lock cleared: every
    kept round is stored), "spilled" (it gave up on the store: the run goes to `path`)."""

    run_id: str
    state: str
    waited_s: float
    limit_s: float
    rounds_waiting: int  # rounds kept in memory, not in the store yet
    rounds_stored: int  # rounds in the store
    path: str | None = None  # the JSONL file of a spilled run
    rounds_in_file: int = 0
    reason: str = ""

    def describe(self, where: str) -> str:
        """One line for a person: what the writer does about the lock on `where`."""
        n = self.rounds_waiting
        if self.state == "waiting":
            return (
                f"{where} is locked by another connection ({self.reason or 'database is locked'}): waited "
                f"{self.waited_s:.0f} s of {self.limit_s:.0f} s, {n} round{'' if n == 1 else 's'} kept in memory "
                f"until it clears"
            )
        if self.state == "resumed":
            return f"{where} is free again after {self.waited_s:.1f} s: every kept round is stored"
        n = self.rounds_in_file
        return (
            f"{where} stayed locked for {self.waited_s:.0f} s: the run goes to {self.path} instead "
            f"({n} round{'' if n == 1 else 's'} so far)"
        )


# The run row's update as a statement with parameters (compiled once per key set, cached),
# not .values(**values), which builds and compiles a new statement at every flush. The
# counters are incremented in SQL: the statement's size does not depend on the run's length.
_UPDATE_RUN = (
    update(runs_table)
    .where(runs_table.c.run_id == bindparam("_run_id"))
    .values(
        n_rounds=runs_table.c.n_rounds + bindparam("_d_rounds"),
        drafted=runs_table.c.drafted + bindparam("_d_drafted"),
        accepted=runs_table.c.accepted + bindparam("_d_accepted"),
        n_new_tokens=runs_table.c.n_new_tokens + bindparam("_d_tokens"),
    )
)


class _SqliteInsert:
    """An executemany of plain tuples for one table on SQLite.

    The writer's hot path: SQLAlchemy's per-row parameter processing cost about as much CPU
    as encoding the distributions. The tuples are what SQLAlchemy would bind (JSON columns
    serialised with json.dumps, NULL for None); other dialects keep the Core insert."""

    def __init__(self, table: Table):
        self.columns = [c.name for c in table.columns]
        self.json_at = [i for i, c in enumerate(table.columns) if isinstance(c.type, JSON)]
        self.sql = f"INSERT INTO {table.name} ({', '.join(self.columns)}) VALUES ({', '.join('?' * len(self.columns))})"
        self.values: Callable[[Mapping[str, Any]], tuple[Any, ...]] = operator.itemgetter(*self.columns)

    def params(self, rows: Sequence[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
        out = []
        dumps = json.dumps
        for row in rows:
            values = list(self.values(row))
            for i in self.json_at:
                if values[i] is not None:
                    values[i] = dumps(values[i])
            out.append(tuple(values))
        return out


class RunSink:
    """Commits one run's rounds; keeps the aggregates stored in the run row current."""

    def __init__(
        self, engine: Engine, run_id: str, policy: VectorPolicy, started_at: float, lock_wait: float | None = None
    ):
        self.engine = engine
        self.run_id = run_id
        self.policy = policy
        self.started_at = started_at
        self.rounds_written = 0
        self.flushes = 0
        self.last_commit = time.monotonic()
        self.tokens_written = 0
        self._round_rows: list[dict[str, Any]] = []  # encoded, not yet committed
        self._node_rows: list[dict[str, Any]] = []
        self._new_tokens: list[int] = []
        self._fast = (
            (_SqliteInsert(rounds_table), _SqliteInsert(nodes_table)) if engine.dialect.name == "sqlite" else None
        )
        self.lock_wait = lock_wait_s() if lock_wait is None else float(lock_wait)
        self.waiting_since: float | None = None  # monotonic time of the first commit the lock refused
        self.waiting_bytes = 0  # blob bytes of the rounds kept while waiting
        self.give_up = False  # set to spill at the next commit that the lock refuses (an interrupted recording)
        self.spill: Spill | None = None
        self.busy_error = ""
        self.last_wait_s = 0.0  # how long the last wait for the lock lasted
        self.run_stored = True  # False: the store never got the run row (spill_from_start)

    def add(self, rounds: Sequence[Round]) -> None:
        """Encode rounds now; they are inserted by the next commit()."""
        round_rows, node_rows = rounds_to_rows(rounds, self.policy, self.run_id)
        if self.waiting_since is not None:
            self.waiting_bytes += sum(
                len(v) for row in (*round_rows, *node_rows) for v in row.values() if isinstance(v, bytes)
            )
        self._round_rows.extend(round_rows)
        self._node_rows.extend(node_rows)
        self._new_tokens.extend(e.token for r in rounds for e in r.emitted)

    @property
    def pending(self) -> int:
        """Rounds encoded but not committed yet."""
        return len(self._round_rows)

    def commit(self, rounds: Sequence[Round] = (), final: Mapping[str, Any] | None = None) -> bool:
        """Insert the pending rounds (and `rounds`) and update the run row (heartbeat,
        aggregates; `final` closes the run), in one transaction; True when done.

        A store locked by another connection past the busy timeout keeps the rounds pending
        and returns False (call again); past the lock wait (or with `give_up` set, or more
        than MAX_WAITING_BYTES waiting) the run goes to a Spill file, and so does every
        later commit. Any other database error raises."""
        if rounds:
            self.add(rounds)
        if self.spill is not None:
            self._to_spill(final)
            return True
        attempt = time.monotonic()
        try:
            self._commit(final)
        except TraceStoreError as exc:
            if not is_busy(exc):
                raise
            now = time.monotonic()
            if self.waiting_since is None:
                self.waiting_since = attempt
            self.busy_error = str(getattr(exc.__cause__, "orig", None) or exc)
            if self.give_up or now - self.waiting_since >= self.lock_wait or self.waiting_bytes > MAX_WAITING_BYTES:
                self.spill = Spill(self.engine, self.run_id, _store_file(self.engine))
                self._to_spill(final)
                return True
            return False
        if self.waiting_since is not None:
            self.last_wait_s = time.monotonic() - self.waiting_since
        self.waiting_since, self.waiting_bytes = None, 0
        return True

    def spill_from_start(self, row: Mapping[str, Any], waited_s: float, reason: str) -> None:
        """The store stayed locked past the writer's wait when the run started, so it never got
        the run row (`row`): the whole run goes to a Spill from that row, as a run whose store
        stays locked later does, instead of being lost."""
        self.run_stored = False
        self.busy_error = reason
        self.last_wait_s = waited_s
        self.spill = Spill(self.engine, self.run_id, _store_file(self.engine), run=row)

    def lock_state(self, state: str) -> LockWait:
        """What an on_wait callback is told (see LockWait)."""
        spill = self.spill
        waited = self.waited_s() if self.waiting_since is not None else self.last_wait_s
        return LockWait(
            self.run_id,
            state,
            waited,
            self.lock_wait,
            self.pending,
            self.rounds_written,
            str(spill.path) if spill is not None else None,
            spill.rounds if spill is not None else 0,
            self.busy_error,
        )

    def waited_s(self) -> float:
        return 0.0 if self.waiting_since is None else time.monotonic() - self.waiting_since

    def _to_spill(self, final: Mapping[str, Any] | None) -> None:
        assert self.spill is not None
        self.spill.write(self._round_rows, self._node_rows, self._new_tokens)
        self._round_rows, self._node_rows, self._new_tokens = [], [], []
        if final is not None:
            now = time.time()
            self.spill.close({"ended_at": now, "wall_s": now - self.started_at, **final})
            self._mark_spilled()
        self.last_commit = time.monotonic()

    def _mark_spilled(self) -> None:
        """Best effort, one short try: the store's copy of the run ends as interrupted, its
        error naming the file that holds the whole run (else the next writer to open the
        store marks it interrupted once this process has gone)."""
        assert self.spill is not None
        if not self.run_stored:  # nothing of the run to mark
            return
        why = (
            f"the store was locked ({self.busy_error}) for longer than the writer waits: all "
            f"{self.spill.rounds} rounds of the run are in {self.spill.path} (specscope import)"
        )
        try:
            with transaction(self.engine, 500) as conn:
                conn.execute(
                    update(runs_table)
                    .where(runs_table.c.run_id == self.run_id, runs_table.c.status == "running")
                    .values(status="interrupted", error=why, ended_at=time.time())
                )
        except Exception:  # noqa: BLE001 - still locked: the file says it all
            pass

    def _commit(self, final: Mapping[str, Any] | None) -> None:
        round_rows, node_rows, tokens = self._round_rows, self._node_rows, self._new_tokens
        now = time.time()
        values: dict[str, Any] = {
            "heartbeat_at": now,
            "_d_rounds": len(round_rows),
            "_d_drafted": sum(row["n_drafted"] for row in round_rows),
            "_d_accepted": sum(row["n_accepted"] for row in round_rows),
            "_d_tokens": len(tokens),
        }
        if final is not None:
            values.update(final)
            values["ended_at"] = now
            values.setdefault("wall_s", now - self.started_at)
        # while the store is locked, each try waits a second at most, so that the wait is told as it goes
        retry_ms = min(RETRY_WAIT_MS, busy_timeout_ms()) if self.waiting_since is not None else None
        with translate_errors(f"writing run {self.run_id}"), transaction(self.engine, retry_ms) as conn:
            for table, rows, fast in (
                (rounds_table, round_rows, self._fast and self._fast[0]),
                (nodes_table, node_rows, self._fast and self._fast[1]),
            ):
                if not rows:
                    continue
                if fast is not None:
                    conn.exec_driver_sql(fast.sql, fast.params(rows))
                else:
                    conn.execute(insert(table), rows)
            if tokens:
                conn.execute(insert(tokens_table), token_chunk(self.run_id, self.tokens_written, tokens))
            conn.execute(_UPDATE_RUN, {"_run_id": self.run_id, **values})
        self._round_rows, self._node_rows, self._new_tokens = [], [], []
        self.rounds_written += len(round_rows)
        self.tokens_written += len(tokens)
        self.flushes += 1
        self.last_commit = time.monotonic()

    def mark(self, status: str, error: str) -> bool:
        """Close the run with `status` and `error` without writing rounds (best effort):
        False when that could not be stored (the database itself may be what failed, a full
        disk for one)."""
        if not self.run_stored:  # the store never got the run (its file has what there is)
            return False
        now = time.time()
        try:
            with transaction(self.engine) as conn:
                conn.execute(
                    update(runs_table)
                    .where(runs_table.c.run_id == self.run_id, runs_table.c.status == "running")
                    .values(status=status, error=error, ended_at=now, heartbeat_at=now)
                )
        except Exception:  # noqa: BLE001 - best effort: the database itself may be what failed, in any way
            return False
        return True


def _store_file(engine: Engine) -> str | None:
    """The SQLite file of `engine` (None for a server or in memory)."""
    if engine.dialect.name != "sqlite":
        return None
    db = engine.url.database
    return db if db and db != ":memory:" and not db.startswith("file:") else None


class WaitReports:
    """Tells a writer's on_wait callback how a wait for a locked store goes: at its start and
    then every EVERY_S while it lasts, when it ends, and when the run goes to a file."""

    EVERY_S = 2.0

    def __init__(self, on_wait: Callable[[LockWait], None] | None):
        self.on_wait = on_wait
        self.waiting = False
        self.spilled = False
        self._last = 0.0

    def after(self, sink: RunSink, stored: bool) -> None:
        """After each commit() of `sink` (stored: what it returned)."""
        if sink.spill is not None:
            if not self.spilled:
                self.spilled = True
                self.tell(sink.lock_state("spilled"))
            return
        now = time.monotonic()
        if not stored:
            if not self.waiting or now - self._last >= self.EVERY_S:
                self.waiting, self._last = True, now
                self.tell(sink.lock_state("waiting"))
        elif self.waiting:
            self.waiting = False
            self.tell(sink.lock_state("resumed"))

    def tell(self, state: LockWait) -> None:
        if self.on_wait is None:
            return
        try:
            self.on_wait(state)
        except Exception:
            import logging

            logging.getLogger(__name__).exception("on_wait failed")
