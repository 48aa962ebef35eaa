"""SQLAlchemy 2.0 models of the trace store (dialect-neutral: SQLite by default, any URL works).

Tables
  schema_version  one row per applied migration (the highest version is the schema's)
  runs            one row per run: full RunConfig, model identities, library versions,
                  status and liveness (writer host/pid/heartbeat), aggregates
  rounds          one row per Round; everything but the per-node data; timeline columns
                  (n_drafted, n_accepted, draft_tokens, emitted) so a timeline never reads
                  the distributions; a tree round's facts (schema version 4: tree,
                  tree_top, tree_full)
  draft_nodes     one row per DraftNode, with p/q as top-N blobs and optional full blobs
  run_tokens      the run's new tokens in chunks (schema version 3): each commit appends one
                  chunk (int32 little-endian), so recording never rewrites the token list

Times are UTC unix seconds (float). Distribution blobs are described in storage/codec.py
and docs/trace-format.md.
"""

from __future__ import annotations

from typing import Any, ClassVar, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Double,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from specscope.core.settings.vocab import RUN_STATUSES  # noqa: F401 (the words of runs.status, defined once)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        float: Double(),
        dict[str, Any]: JSON(none_as_null=True),
        list[Any]: JSON(none_as_null=True),
        bytes: LargeBinary(),
    }


class SchemaVersion(Base):
    __tablename__ = "schema_version"

    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    description: Mapped[str] = mapped_column(String(200))
    applied_at: Mapped[float]


class RunRow(Base):
    __tablename__ = "runs"

    run_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    status: Mapped[str] = mapped_column(String(16))
    stop_reason: Mapped[str | None] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[float]
    ended_at: Mapped[float | None]
    # liveness of the writer: a 'running' run whose writer is gone is marked interrupted
    heartbeat_at: Mapped[float | None]
    writer_host: Mapped[str | None] = mapped_column(String(255))
    writer_pid: Mapped[int | None] = mapped_column(Integer)

    prompt_ids: Mapped[list[Any]]
    prompt_text: Mapped[str | None] = mapped_column(Text)
    # RunConfig
    max_new_tokens: Mapped[int] = mapped_column(Integer)
    k: Mapped[int] = mapped_column(Integer)
    temperature: Mapped[float]
    top_k: Mapped[int] = mapped_column(Integer)
    top_p: Mapped[float]
    seed: Mapped[int] = mapped_column(BigInteger)
    eos_token_id: Mapped[int | None] = mapped_column(Integer)
    proposer: Mapped[str] = mapped_column(String(64))
    proposer_params: Mapped[dict[str, Any]]
    device: Mapped[str] = mapped_column(String(64))
    dtype: Mapped[str] = mapped_column(String(32))
    vocab_size: Mapped[int] = mapped_column(Integer)
    use_cache: Mapped[bool] = mapped_column(Boolean)
    fault: Mapped[str | None] = mapped_column(String(64))
    # optional trace fields the run's trace did not record (schema version 2; null = none)
    unrecorded: Mapped[list[Any] | None]
    # the most positions the target reads (schema version 5; null = not recorded)
    position_limit: Mapped[int | None] = mapped_column(BigInteger)
    # model identities (names from the RunConfig; hashes passed in by the caller)
    target_name: Mapped[str] = mapped_column(String(512))
    target_hash: Mapped[str | None] = mapped_column(String(128))
    draft_name: Mapped[str | None] = mapped_column(String(512))
    draft_hash: Mapped[str | None] = mapped_column(String(128))
    tokenizer_name: Mapped[str | None] = mapped_column(String(512))
    tokenizer_hash: Mapped[str | None] = mapped_column(String(128))
    library_versions: Mapped[dict[str, Any]]
    # schema version 5: the run's EOS ids and stops ({"eos_token_ids", "strings", "ids"});
    # null = a run written before stops were recorded (the checker's stop rules do not run)
    stops: Mapped[dict[str, Any] | None]
    extra: Mapped[dict[str, Any]]
    # what the storage layer persisted
    top_n: Mapped[int] = mapped_column(Integer)
    full_vectors: Mapped[bool] = mapped_column(Boolean)
    full_dtype: Mapped[str] = mapped_column(String(16))
    # aggregates, incremented by the writer at every flush (UPDATE ... SET n = n + delta)
    n_rounds: Mapped[int] = mapped_column(Integer, default=0)
    drafted: Mapped[int] = mapped_column(Integer, default=0)
    accepted: Mapped[int] = mapped_column(Integer, default=0)
    n_new_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # schema <= 2 kept the whole token list here (rewritten at every commit); from version 3
    # it is always [] and the tokens are in run_tokens
    new_tokens: Mapped[list[Any]]
    wall_s: Mapped[float | None]

    rounds: Mapped[list[RoundRow]] = relationship(
        back_populates="run", cascade="all, delete-orphan", passive_deletes=True, order_by="RoundRow.round_index"
    )

    __table_args__ = (
        Index("ix_runs_status", "status"),
        Index("ix_runs_started_at", "started_at"),
    )


class RoundRow(Base):
    __tablename__ = "rounds"

    run_id: Mapped[str] = mapped_column(String(64), ForeignKey("runs.run_id", ondelete="CASCADE"), primary_key=True)
    round_index: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    prefix_len: Mapped[int] = mapped_column(Integer)
    emitted_before: Mapped[int] = mapped_column(Integer)
    remaining_budget: Mapped[int] = mapped_column(Integer)
    k: Mapped[int] = mapped_column(Integer)
    greedy: Mapped[bool] = mapped_column(Boolean)
    # timeline columns (denormalised from nodes / emitted)
    n_drafted: Mapped[int] = mapped_column(Integer)
    n_accepted: Mapped[int] = mapped_column(Integer)
    draft_tokens: Mapped[list[Any]]
    emitted: Mapped[list[Any]]  # [[token, kind, node|null, draw|null], ...]
    eos: Mapped[bool] = mapped_column(Boolean)
    budget_stop: Mapped[bool] = mapped_column(Boolean)
    bonus_withheld: Mapped[bool] = mapped_column(Boolean)
    rejected_node: Mapped[int | None] = mapped_column(Integer)
    residual_mass: Mapped[float | None]
    residual_top: Mapped[bytes | None]
    residual_full: Mapped[bytes | None]
    bonus_top: Mapped[bytes | None]
    bonus_full: Mapped[bytes | None]
    # tree rounds (schema version 4; null for chains): the TreeInfo facts as JSON (spec,
    # children, path, tried, positions, visible, kept_rows, updates without their vectors)
    # and each update's p' as framed distribution blobs (codec.pack_blobs), in update order
    tree: Mapped[dict[str, Any] | None]
    tree_top: Mapped[bytes | None]
    tree_full: Mapped[bytes | None]
    # schema version 5: the stop the round's last token completed ({"kind", "index", "position"})
    # and, in a run with stop strings, each emitted token's text: {"match": ..., "pieces": [...]};
    # null = neither
    stop: Mapped[dict[str, Any] | None]
    # cache bookkeeping
    tc_before: Mapped[int] = mapped_column(Integer)
    tc_peak: Mapped[int] = mapped_column(Integer)
    tc_after: Mapped[int] = mapped_column(Integer)
    tc_pending: Mapped[list[Any]]
    dc_before: Mapped[int | None] = mapped_column(Integer)
    dc_peak: Mapped[int | None] = mapped_column(Integer)
    dc_after: Mapped[int | None] = mapped_column(Integer)
    dc_pending: Mapped[list[Any] | None]
    # timings and forward counts
    draft_s: Mapped[float]
    verify_s: Mapped[float]
    bookkeeping_s: Mapped[float]
    draft_forwards: Mapped[int] = mapped_column(Integer)
    target_forwards: Mapped[int] = mapped_column(Integer)

    run: Mapped[RunRow] = relationship(back_populates="rounds")

    __table_args__ = (Index("ix_rounds_run_eos", "run_id", "eos"),)


class NodeRow(Base):
    __tablename__ = "draft_nodes"

    run_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    round_index: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    node_index: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    token: Mapped[int] = mapped_column(Integer)
    parent: Mapped[int] = mapped_column(Integer)
    depth: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    u: Mapped[float | None]
    p_token: Mapped[float]
    q_token: Mapped[float | None]
    ratio: Mapped[float | None]
    overlap: Mapped[float | None]
    target_argmax: Mapped[int] = mapped_column(Integer)
    # schema version 7: the proposer's own probability for its token (untransformed softmax,
    # T=1); null = unknown (prompt lookup, the transformers engine, nodes written before it)
    confidence: Mapped[float | None]
    p_top: Mapped[bytes]
    q_top: Mapped[bytes | None]
    p_full: Mapped[bytes | None]
    q_full: Mapped[bytes | None]

    __table_args__ = (
        ForeignKeyConstraint(
            ["run_id", "round_index"],
            ["rounds.run_id", "rounds.round_index"],
            ondelete="CASCADE",
            name="fk_draft_nodes_round",
        ),
        Index("ix_draft_nodes_status", "run_id", "status"),
    )


class TokenChunkRow(Base):
    """A run's new tokens [start, start + n_tokens), appended by one commit."""

    __tablename__ = "run_tokens"

    run_id: Mapped[str] = mapped_column(String(64), ForeignKey("runs.run_id", ondelete="CASCADE"), primary_key=True)
    start: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)  # offset of the first token
    n_tokens: Mapped[int] = mapped_column(Integer)
    tokens: Mapped[bytes]  # int32 little-endian


# a declarative class's __table__ is typed FromClause (a mapping may target any selectable);
# these four map plain tables, which insert/update/delete and Table.create need
runs_table = cast(Table, RunRow.__table__)
rounds_table = cast(Table, RoundRow.__table__)
nodes_table = cast(Table, NodeRow.__table__)
tokens_table = cast(Table, TokenChunkRow.__table__)
