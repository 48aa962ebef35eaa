"""RunSink: the database half of a TraceWriter.

It turns batches of rounds into rows (rows.rounds_to_rows, the row builder) and commits them, together with
the run's aggregates and heartbeat, in one transaction. Every commit only appends: the rounds,
their nodes, one run_tokens chunk with the tokens they emitted, and an UPDATE of the run row
that increments its counters, so a commit costs the same at round 10 and at round 10 million. The writer's thread uses it in the
recording process; the writer process (writer_child) uses the same class on its own engine.
"""

from __future__ import annotations

import json
import operator
import time
from typing import Any, Callable, Mapping, Sequence

from sqlalchemy import JSON, Engine, Table, bindparam, insert, update

from specscope.core.records import Round

from specscope.storage.codec import VectorPolicy
from specscope.storage.rows import rounds_to_rows, token_chunk
from specscope.storage.schema import nodes_table, rounds_table, runs_table, tokens_table
from specscope.storage.transactions import transaction, translate_errors


# The run row's update as a statement with parameters (compiled once per key set, cached),
# not .values(**values), which builds and compiles a new statement at every flush. The
# counters are incremented in SQL: the statement's size does not depend on the run's length.
_UPDATE_RUN = update(runs_table).where(runs_table.c.run_id == bindparam("_run_id")).values(
    n_rounds=runs_table.c.n_rounds + bindparam("_d_rounds"),
    drafted=runs_table.c.drafted + bindparam("_d_drafted"),
    accepted=runs_table.c.accepted + bindparam("_d_accepted"),
    n_new_tokens=runs_table.c.n_new_tokens + bindparam("_d_tokens"),
)


class _SqliteInsert:
    """An executemany of plain tuples for one table on SQLite.

    The writer's hot path: SQLAlchemy's per-row parameter processing cost about as much CPU
    as encoding the distributions. The tuples are what SQLAlchemy would bind (JSON columns
    serialised with json.dumps, NULL for None); other dialects keep the Core insert."""

    def __init__(self, table: Table):
        self.columns = [c.name for c in table.columns]
        self.json_at = [i for i, c in enumerate(table.columns) if isinstance(c.type, JSON)]
        self.sql = (f"INSERT INTO {table.name} ({', '.join(self.columns)}) "
                    f"VALUES ({', '.join('?' * len(self.columns))})")
        self.values: Callable[[Mapping[str, Any]], tuple] = operator.itemgetter(*self.columns)

    def params(self, rows: Sequence[Mapping[str, Any]]) -> list[tuple]:
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

    def __init__(self, engine: Engine, run_id: str, policy: VectorPolicy, started_at: float):
        self.engine = engine
        self.run_id = run_id
        self.policy = policy
        self.started_at = started_at
        self.rounds_written = 0
        self.flushes = 0
        self.last_commit = time.monotonic()
        self.tokens_written = 0
        self._round_rows: list[dict] = []  # encoded, not yet committed
        self._node_rows: list[dict] = []
        self._new_tokens: list[int] = []
        self._fast = ((_SqliteInsert(rounds_table), _SqliteInsert(nodes_table))
                      if engine.dialect.name == "sqlite" else None)

    def add(self, rounds: Sequence[Round]) -> None:
        """Encode rounds now; they are inserted by the next commit()."""
        round_rows, node_rows = rounds_to_rows(rounds, self.policy, self.run_id)
        self._round_rows.extend(round_rows)
        self._node_rows.extend(node_rows)
        self._new_tokens.extend(e.token for r in rounds for e in r.emitted)

    @property
    def pending(self) -> int:
        """Rounds encoded but not committed yet."""
        return len(self._round_rows)

    def commit(self, rounds: Sequence[Round] = (), final: Mapping[str, Any] | None = None) -> None:
        """Insert the pending rounds (and `rounds`) and update the run row (heartbeat,
        aggregates; `final` closes the run), in one transaction."""
        if rounds:
            self.add(rounds)
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
        with translate_errors(f"writing run {self.run_id}"):
            with transaction(self.engine) as conn:
                for table, rows, fast in ((rounds_table, round_rows, self._fast and self._fast[0]),
                                          (nodes_table, node_rows, self._fast and self._fast[1])):
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
        now = time.time()
        try:
            with transaction(self.engine) as conn:
                conn.execute(update(runs_table).where(runs_table.c.run_id == self.run_id,
                                                      runs_table.c.status == "running").values(
                    status=status, error=error, ended_at=now, heartbeat_at=now))
        except Exception:
            return False
        return True
