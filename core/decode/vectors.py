"""What a Round record keeps of the round's device rows, for every draft shape.

The p rows (one per node's parent and the bonus position: p[j + 1] is the row after node j,
p[0] the one at the prefix), the q rows, every residual update p' of the walk, the final p'
and the residual stay on the model's device as float64 tensors. The record gets them as full
host vectors or (the decoder's `vectors` setting, core.sampling.dists) as TopDistributions
that keep the entries the checker reads: each row's argmax, the tokens proposed from it and
the token drawn from it; each p' after a rejection keeps every child of its node. Plus each
node's scalars (p(x), q(x), sum min(p, q)) and each update's mass, computed on the device
and moved to the host together. A chain is the tree whose node i has parent i - 1: its rows
are p[i] for node i and p[n] for the bonus.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from specscope.core.draft.trees import node_depths
from specscope.core.records import DraftNode, ResidualUpdate
from specscope.core.sampling.dists import RowFacts, compact_rows, host_rows, sparse_entries
from specscope.core.verify.chain import Verdict, VerifyTask


class RoundVectors:
    """The round's rows as the record keeps them (see the module docstring)."""

    def __init__(
        self,
        task: VerifyTask,
        verdict: Verdict,
        parents: tuple[int, ...],
        full: bool,
        top_n: int,
        sparse: bool = False,
        q_facts: RowFacts | None = None,
        p_facts: RowFacts | None = None,
        walk_facts: bool = True,
    ):
        """`walk_facts`: whether the record keeps the walk's residual updates and final p'
        (a tree round's TreeInfo; a chain round records its residual only)."""
        self.task, self.verdict, self.parents = task, verdict, parents
        n = len(task.tokens)
        p, q = task.p, task.q
        updates = list(verdict.updates) if walk_facts else []
        final = verdict.final_p if walk_facts and not task.greedy else None
        singles = [u.p_after for u in updates] + ([final] if final is not None else [])
        singles += [verdict.residual] if verdict.residual is not None else []
        blocks = [p] + ([q] if q is not None else []) + ([_stacked(singles, p.device)] if singles else [])
        extras = self._extra_ids(updates, final is not None)
        # `sparse` (SamplingConfig.sparse_rows): every row has about top-k nonzeros; q's
        # nonzero entries serve its record and sum min(p, q) (core.sampling.row_ops)
        self.q_entries = sparse_entries(q, q_facts) if sparse and q is not None else None
        facts = [p_facts] + ([q_facts] if q is not None else []) + ([None] if singles else [])
        entries = [None] + ([self.q_entries] if q is not None else []) + ([None] if singles else [])
        kept: list[Any] = []  # host rows: numpy vectors or TopDistributions
        for block, known, found in zip(blocks, facts, entries):  # block by block: no copy of the rows into one tensor
            if full:
                kept.extend(host_rows(block))
            else:
                kept.extend(
                    compact_rows(
                        block,
                        top_n,
                        extras[len(kept) : len(kept) + block.shape[0]],
                        sparse=sparse,
                        facts=known,
                        entries=found,
                    )
                )
        self.p_rows = kept[: n + 1]
        at = n + 1 + (n if q is not None else 0)
        self.q_rows = kept[n + 1 : at] if q is not None else None
        masses = _host_floats([u.mass for u in updates], p.device)
        self.updates = [dataclasses.replace(u, p_after=k, mass=m) for u, k, m in zip(updates, kept[at:], masses)]
        self.final = kept[at + len(updates)] if final is not None else None
        self.residual = kept[-1] if verdict.residual is not None else None
        self.bonus_p = self.p_rows[self.leaf + 1] if self._owes_bonus() else None
        self.scalars = self._node_scalars(n)

    @property
    def leaf(self) -> int:
        """The last accepted node (-1: none, the prefix)."""
        return self.verdict.path[-1] if self.verdict.path else -1

    def _owes_bonus(self) -> bool:
        """Whether the leaf's row was the bonus row: a bonus was drawn from it, or the budget
        withheld one at a leaf without children (a chain: every draft token accepted)."""
        verdict = self.verdict
        if any(e.kind == "bonus" for e in verdict.emitted):
            return True
        return verdict.bonus_withheld and self.leaf not in self.parents

    def _extra_ids(self, updates: list[ResidualUpdate], has_final: bool) -> list[list[int]]:
        """Entries each row keeps besides its top-N: the target's argmax, the tokens proposed
        from the row, the token drawn from it (repair, bonus); each p' its node's children."""
        task, verdict = self.task, self.verdict
        tail = verdict.emitted[-1] if verdict.emitted and verdict.emitted[-1].kind != "accepted" else None
        drawn = [tail.token] if tail is not None else []
        p_extra = [[int(a)] for a in task.argmax]
        for token, parent in zip(task.tokens, self.parents):
            p_extra[parent + 1].append(token)
        p_extra[self.leaf + 1] += drawn
        q_extra = [[t] for t in task.tokens] if task.q is not None else []
        siblings = {u.parent: [t for t, par in zip(task.tokens, self.parents) if par == u.parent] for u in updates}
        return (
            p_extra
            + q_extra
            + [siblings[u.parent] + drawn for u in updates]
            + ([drawn] if has_final else [])
            + ([drawn] if verdict.residual is not None else [])
        )

    def _node_scalars(self, n: int) -> np.ndarray:
        """(n, 3) host array: each node's p(x) in its parent's row, q(x) and sum min(p, q)
        (NaN without q), from the full device rows."""
        task = self.task
        if n == 0:
            return np.zeros((0, 3))
        p, q = task.p, task.q
        rows = torch.as_tensor([par + 1 for par in self.parents], dtype=torch.long, device=p.device)
        tokens = torch.as_tensor(list(task.tokens), dtype=torch.long, device=p.device)
        p_tok = p[rows, tokens]
        if q is None:
            nan = torch.full_like(p_tok, float("nan"))
            return torch.stack([p_tok, nan, nan], dim=1).cpu().numpy()
        q_tok = q[torch.arange(n, device=p.device), tokens]
        if self.q_entries is not None:  # sparse q: min(p, q) is 0 off q's nonzero entries
            row_t, ids_t = self.q_entries
            both = torch.minimum(p[rows[row_t], ids_t], q[row_t, ids_t])
            overlap = torch.zeros(n, dtype=p.dtype, device=p.device).index_add_(0, row_t, both)
        else:  # row by row: each row's minimum stays in cache for its sum (q's rows are cold by now)
            overlap = torch.stack([torch.minimum(p[par + 1], q[i]).sum() for i, par in enumerate(self.parents)])
        return torch.stack([p_tok, q_tok, overlap], dim=1).cpu().numpy()

    def nodes(self, confidence: tuple[float, ...] | None = None) -> tuple[DraftNode, ...]:
        """The draft as recorded: each node with p (its parent's row), q, the decision, the
        checker's scalars and the proposer's confidence in its token (Draft.confidence)."""
        task, verdict = self.task, self.verdict
        has_q = self.q_rows is not None
        out = []
        for i, (token, depth) in enumerate(zip(task.tokens, node_depths(self.parents))):
            row = self.parents[i] + 1  # the target row this node is judged against
            p_token, q_token, overlap = (float(x) for x in self.scalars[i])
            out.append(
                DraftNode(
                    index=i,
                    token=token,
                    parent=self.parents[i],
                    depth=depth,
                    p=self.p_rows[row],
                    q=self.q_rows[i] if self.q_rows is not None else None,
                    status=verdict.statuses[i],
                    u=verdict.draws[i],
                    p_token=p_token,
                    q_token=q_token if has_q else None,
                    ratio=(p_token / q_token) if has_q and q_token else None,
                    overlap=overlap if has_q else None,
                    target_argmax=int(task.argmax[row]),
                    confidence=None if confidence is None else float(confidence[i]),
                )
            )
        return tuple(out)


def _stacked(rows: list[Any], device: torch.device) -> torch.Tensor:
    """One (m, V) device block of single rows (a seam, the fault zoo's, may hand back host arrays)."""
    on_device = [torch.as_tensor(r, dtype=torch.float64).to(device) for r in rows]
    return on_device[0].reshape(1, -1) if len(on_device) == 1 else torch.stack(on_device)


def _host_floats(values: list[Any], device: torch.device) -> list[float]:
    """Scalars (device tensors or host numbers) as host floats, in one transfer."""
    if not values:
        return []
    return torch.stack([torch.as_tensor(v, dtype=torch.float64).to(device).reshape(()) for v in values]).tolist()
