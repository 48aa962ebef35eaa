"""Recording appends: a commit writes the new rounds, one token chunk and a run-row UPDATE
whose size does not depend on how long the run already is (schema 3). Asserted on the
statements and bytes each commit sends to the database, not on timing."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event

from specscope.storage import TraceStore, TraceWriter
from tests.storage.helpers import synthetic_config, synthetic_rounds


def _size(params: Any) -> int:
    """Bytes of the parameters of one execution (numbers count 8)."""
    if params is None:
        return 0
    if isinstance(params, (str, bytes)):
        return len(params)
    if isinstance(params, memoryview):
        return params.nbytes
    if isinstance(params, dict):
        return sum(_size(v) for v in params.values())
    if isinstance(params, (list, tuple)):
        return sum(_size(v) for v in params)
    return 8


class Statements:
    """Every statement sent to the engine, with its table and parameter bytes."""

    def __init__(self, engine: Any):
        self.seen: list[tuple[str, int]] = []
        event.listen(engine, "before_cursor_execute", self.on_execute)

    def on_execute(self, conn: Any, cursor: Any, statement: str, params: Any, context: Any, executemany: bool) -> None:
        self.seen.append((" ".join(statement.split()), _size(params)))

    def take(self) -> list[tuple[str, int]]:
        out, self.seen = self.seen, []
        return out


def _writes(statements: list[tuple[str, int]]) -> list[tuple[str, int]]:
    return [(s, n) for s, n in statements if s.split()[0] in ("INSERT", "UPDATE", "DELETE")]


@pytest.mark.parametrize("mode", ["thread"])
def test_each_commit_appends_and_its_size_does_not_grow_with_the_run(tmp_path, mode):
    config = synthetic_config(run_id="long", greedy=True)
    rounds = synthetic_rounds(config, 60)
    with TraceStore(tmp_path / "s.sqlite") as store:
        spy = Statements(store.engine)
        per_commit: list[list[tuple[str, int]]] = []
        with TraceWriter(store, config, mode=mode, flush_interval=0.01) as writer:
            spy.take()
            for rnd in rounds:
                writer.write(rnd)
                writer.flush()  # one commit per round
                per_commit.append(_writes(spy.take()))
        per_commit = [c for c in per_commit if c]
        assert len(per_commit) == len(rounds)
        tables = [sorted({s.split()[1 if s.startswith("UPDATE") else 2] for s, _ in c}) for c in per_commit]
        assert all(t == ["draft_nodes", "rounds", "run_tokens", "runs"] for t in tables), tables[:3]
        for c in per_commit:
            updates = [(s, n) for s, n in c if s.startswith("UPDATE runs")]
            assert len(updates) == 1 and "new_tokens =" not in updates[0][0]
        # the run row's UPDATE and the token chunk cost the same at the last commit as at the
        # first: nothing of the earlier rounds is sent again
        run_update = [next(n for s, n in c if s.startswith("UPDATE runs")) for c in per_commit]
        assert max(run_update) == min(run_update)
        chunk = [sum(n for s, n in c if s.startswith("INSERT INTO run_tokens")) for c in per_commit]
        assert [n - 8 * 2 - len("long") for n in chunk] == [4 * len(r.emitted) for r in rounds]
        info = store.get_run("long")
        assert info.n_rounds == 60 and info.n_new_tokens == sum(len(r.emitted) for r in rounds)
        assert info.drafted == sum(len(r.nodes) for r in rounds)
        assert info.accepted == sum(1 for r in rounds for n in r.nodes if n.status == "accepted")
        assert store.new_tokens("long") == [e.token for r in rounds for e in r.emitted]
        with store.engine.connect() as conn:
            n_chunks = conn.exec_driver_sql("SELECT count(*) FROM run_tokens").scalar()
        assert n_chunks == sum(1 for r in rounds if r.emitted)


def test_token_chunks_read_in_batches(tmp_path):
    """new_tokens() reads the chunks a batch at a time, in order, across many commits."""
    config = synthetic_config(run_id="chunks")
    rounds = synthetic_rounds(config, 30)
    with TraceStore(tmp_path / "s.sqlite") as store:
        with TraceWriter(store, config, flush_interval=0.01) as writer:
            for rnd in rounds:
                writer.write(rnd)
                writer.flush()
        chunks = list(store.token_chunks("chunks", batch=4))
        assert len(chunks) == 30
        assert [int(t) for c in chunks for t in c] == [e.token for r in rounds for e in r.emitted]
        store.delete_run("chunks")
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM run_tokens").scalar() == 0
