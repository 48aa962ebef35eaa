"""Write a specscope JSONL trace from another decoder's own loop: a few calls per round.

    with TraceFile("run.jsonl", prompt_ids=prompt, vocab_size=V, k=4, max_new_tokens=64,
                   temperature=1.0, eos_token_id=eos, proposer="my-decoder") as trace:
        ...                                    # your loop
        trace.round(draft=[t1, t2, t3],        # the proposed tokens (a chain)
                    statuses=["accepted", "accepted", "rejected"],
                    p=p_rows, q=q_rows,        # target / draft distributions per node
                    emitted=[(t1, "accepted"), (t2, "accepted"), (r, "repaired")],
                    u=[u1, u2, u3])            # optional: acceptance draws
    # `specscope import run.jsonl --db traces.sqlite` then `specscope check traces.sqlite`

Only what a round is given is written; the rest is the format's documented default, and
fields a decoder leaves out (draws, caches, flags) are declared unrecorded in the header,
so the checker skips the rules that need them and says so (docs/trace-format.md).
Distributions go out as full vectors when given as arrays of the vocabulary's length.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Sequence
from typing import IO, Any

import numpy as np

from specscope.storage.jsonl.read import FORMAT_NAME, FORMAT_VERSION
from specscope.storage.outputs import check_output

# Optional round fields this writer declares unrecorded until a round gives them.
OPTIONAL = ("u", "draw", "target_cache", "eos", "budget_stop", "bonus_withheld")


def _dist(values: Any) -> dict[str, Any] | None:
    if values is None:
        return None
    return {"full": [float(x) for x in np.asarray(values, dtype=np.float64).ravel()]}


class TraceFile:
    """A JSONL trace being written; see the module docstring. Use as a context manager or
    call close(status=...) yourself."""

    def __init__(
        self,
        path: str | os.PathLike[str] | IO[str],
        *,
        prompt_ids: Sequence[int],
        vocab_size: int,
        k: int,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        eos_token_id: int | None = None,
        proposer: str = "external",
        seed: int = 0,
        run_id: str | None = None,
        records: Sequence[str] = (),
    ):
        """`records` names the optional fields this decoder records every round (e.g.
        ("u", "draw") when it samples by inverse CDF from recorded uniforms); the others are
        declared unrecorded."""
        unknown = set(records) - set(OPTIONAL)
        if unknown:
            raise ValueError(f"unknown optional fields {sorted(unknown)}; known: {', '.join(OPTIONAL)}")
        self._own = isinstance(path, (str, os.PathLike))
        self._fh: IO[str]
        if isinstance(path, (str, os.PathLike)):
            check_output(path, overwrite=True)  # a trace file may replace a file, never a trace store
            self._fh = open(path, "w", encoding="utf-8")  # noqa: SIM115 - held for the writer's life, closed by close() when it owns the file
        else:
            self._fh = path
        self.index = 0
        self.new_tokens: list[int] = []
        self.eos_token_id = eos_token_id
        self.max_new_tokens = max_new_tokens
        self.closed = False
        header = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "record": "run",
            "run_id": run_id or uuid.uuid4().hex,
            "started_at": time.time(),
            "prompt_ids": [int(t) for t in prompt_ids],
            "config": {
                "vocab_size": int(vocab_size),
                "k": int(k),
                "max_new_tokens": int(max_new_tokens),
                "sampling": {"temperature": temperature, "top_k": top_k, "top_p": top_p},
                "seed": seed,
                "eos_token_id": eos_token_id,
                "proposer": proposer,
            },
            "unrecorded": [f for f in OPTIONAL if f not in records],
            # a TraceFile run ends at its EOS id or the budget only: it has no stop strings or sequences
            "stops": {"eos_token_ids": [], "strings": [], "ids": []},
        }
        self._write(header)

    def _write(self, obj: dict[str, Any]) -> None:
        self._fh.write(json.dumps(obj, allow_nan=False, separators=(",", ":")) + "\n")

    def round(
        self,
        *,
        draft: Sequence[int],
        statuses: Sequence[str],
        p: Sequence[Any],
        emitted: Sequence[tuple[int, str] | tuple[int, str, float | None]],
        q: Sequence[Any] | None = None,
        u: Sequence[float | None] | None = None,
        residual: Any = None,
        bonus_p: Any = None,
        parents: Sequence[int] | None = None,
        **extra_fields: Any,
    ) -> None:
        """One round: the draft (a chain, or a token tree given each node's parent, -1 = the
        prefix), each node's status and p (and q when sampled), the emitted tokens as
        (token, kind[, draw]). `extra_fields` are written as given (any round field of the
        format, e.g. target_cache={...}, eos=True, tree={...})."""
        if self.closed:
            raise ValueError("the trace is closed")
        if (
            len(statuses) != len(draft)
            or len(p) != len(draft)
            or (q is not None and len(q) != len(draft))
            or (parents is not None and len(parents) != len(draft))
        ):
            raise ValueError("draft, statuses, p (and q, parents) need one entry per draft token")
        nodes = []
        for i, token in enumerate(draft):
            node: dict[str, Any] = {"token": int(token), "status": statuses[i], "p": _dist(p[i])}
            if parents is not None:
                node["parent"] = int(parents[i])
            if q is not None:
                node["q"] = _dist(q[i])
            u_i = u[i] if u is not None else None
            if u_i is not None:
                node["u"] = float(u_i)
            nodes.append(node)
        out = []
        for item in emitted:
            token, kind = int(item[0]), item[1]
            entry: dict[str, Any] = {"token": token, "kind": kind}
            if len(item) > 2 and item[2] is not None:
                entry["draw"] = float(item[2])
            out.append(entry)
        record: dict[str, Any] = {"record": "round", "index": self.index, "nodes": nodes, "emitted": out}
        if residual is not None:
            record["residual"] = _dist(residual)
        if bonus_p is not None:
            record["bonus_p"] = _dist(bonus_p)
        record.update(extra_fields)
        self._write(record)
        self.index += 1
        self.new_tokens.extend(e["token"] for e in out)

    def close(self, status: str = "completed", stop_reason: str | None = None) -> None:
        """Write the end record: `stop_reason` defaults to eos when the output ends in EOS,
        else budget when it is full, else unknown (null: the decoder stopped for a reason of
        its own, which the end line does not guess)."""
        if self.closed:
            return
        if stop_reason is None and status == "completed":
            ended_eos = self.eos_token_id is not None and self.new_tokens[-1:] == [self.eos_token_id]
            full = len(self.new_tokens) >= self.max_new_tokens
            stop_reason = "eos" if ended_eos else "budget" if full else None
        self._write(
            {
                "record": "end",
                "status": status,
                "stop_reason": stop_reason,
                "ended_at": time.time(),
                "new_tokens": self.new_tokens,
            }
        )
        self.closed = True
        if self._own:
            self._fh.close()

    def __enter__(self) -> TraceFile:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.close(
                "failed" if exc_type is not KeyboardInterrupt else "interrupted",
                stop_reason="cancelled" if exc_type is KeyboardInterrupt else None,
            )
