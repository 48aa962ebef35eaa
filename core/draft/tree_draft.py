"""Growing a draft tree: one draft step per depth, tree attention. The selection (which
candidates are expanded, which children each gets, which are kept) is the same whatever
runs the steps: a draft model here (`ModelGrowth`), a draft head in core.draft.heads.trees.

The first forward runs the pending context and gives q at the prefix; each later depth runs
one forward over the nodes being expanded, each attending the prefix and its ancestors
(which earlier depths put in the draft cache), at position prefix length + depth - 1.
Children are chosen by the tree's children mode (core.verify.tree): i.i.d. draws from q,
draws without replacement, or the top-k tokens of q (greedy runs always take the top-k).
Nodes come out breadth first, siblings in the order they were chosen: the order the
verifier tries them.

The q rows stay on the draft model's device as float64 torch tensors (core.sampling.device):
choosing children reads a few entries of a row (the top-k's cut, a draw's inverse CDF), and
only the chosen tokens and their q values cross to the host.

Between rounds the draft cache holds the committed prefix only: `keep_path`
keeps the accepted path's rows (gathered by index) and drops every other node.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np
import torch

from specscope.core.decode.kv import CachedLM
from specscope.core.decode.layout import keep_positions, masked_feed
from specscope.core.draft.trees import SLOT_ROOT, TreeSpec, select_dynamic
from specscope.core.sampling.device import process_logits_torch
from specscope.core.sampling.reference import SamplingConfig
from specscope.core.sampling.row_ops import row_topk
from specscope.core.verify.chain import draw_token


def choose_children(
    mode: str, q: torch.Tensor, count: int, greedy: bool, rng: np.random.Generator
) -> tuple[list[int], list[float]]:
    """(children tokens in the order chosen, the uniforms drawn), from a float64 q row."""
    q = torch.as_tensor(q)
    if greedy or mode == "topk":
        return _top_tokens(q, count), []
    tokens: list[int] = []
    draws: list[float] = []
    left = q.clone()
    for _ in range(count):
        if not bool(left.sum() > 0):
            break  # without replacement: the support is used up
        u = float(rng.random())
        token = draw_token(q if mode == "sampled" else left, u)
        tokens.append(token)
        draws.append(u)
        if mode == "distinct":
            left[token] = 0.0
    return tokens, draws


def _top_tokens(q: torch.Tensor, count: int) -> list[int]:
    """The `count` most probable tokens with q > 0, ties by the lower token id (as argmax and
    a stable descending sort). One top-(count + 1) read of the row; only where the count-th
    value is tied with the next does a second pass take the tied entries by ascending id."""
    vocab = q.shape[-1]
    count = min(count, vocab)
    if count <= 0:
        return []
    top_values, top_ids = row_topk(q.reshape(1, -1), min(count + 1, vocab))
    values, ids = top_values[0].tolist(), top_ids[0].tolist()
    if len(values) > count and values[count] == values[count - 1] > 0:
        cut = values[count - 1]  # tied across the boundary: every entry at or above it, by id
        ids_t = torch.nonzero(q >= cut).flatten()  # ascending ids
        order = torch.sort(-q[ids_t], stable=True).indices[:count]
        return ids_t[order].tolist()
    ranked = sorted(zip(values[:count], ids[:count]), key=lambda vi: (-vi[0], vi[1]))
    return [t for v, t in ranked if v > 0]


@dataclass
class _Node:
    token: int
    parent: int  # candidate index; -1 = the prefix
    depth: int
    q: torch.Tensor  # the row it was chosen from (float64, the draft model's device)
    score: float = 0.0  # cumulative draft log-probability
    slot: int = SLOT_ROOT  # static: the spec slot it fills


class TreeGrowth:
    """One round's growth, whatever runs the draft: the candidates chosen so far, the
    uniforms drawn, the forwards spent and each expanded candidate's draft cache row. A
    subclass says how q rows come: `expand(frontier)` runs one step over candidates of one
    depth and returns q after each (a draft model: `ModelGrowth`; a draft head:
    core.draft.heads.trees). grow_static / grow_dynamic choose; they start from the root's q."""

    source = "the draft model"  # who produced the logits, for the non-finite refusal

    def __init__(self, prefix_len: int, sampling: SamplingConfig, rng: np.random.Generator):
        self.prefix_len, self.sampling, self.rng = prefix_len, sampling, rng
        self.nodes: list[_Node] = []
        self.rows: dict[int, int] = {}  # expanded candidate -> draft cache row (-1: none kept)
        self.draws: list[float] = []
        self.forwards = 0

    def expand(self, frontier: list[int]) -> list[torch.Tensor]:
        raise NotImplementedError

    def _q(self, logits: torch.Tensor) -> torch.Tensor:
        # one read: a NaN or inf makes the sum non-finite (a finite row can overflow it, hence the full look then)
        if not bool(torch.isfinite(logits.sum())) and not bool(torch.isfinite(logits).all()):
            raise ValueError(f"{self.source} produced non-finite logits; refusing to propose")
        return process_logits_torch(logits, self.sampling, checked=True)

    def _ancestors(self, c: int) -> list[int]:
        out = []
        while c >= 0:
            out.append(c)
            c = self.nodes[c].parent
        return out

    def visibility(self, frontier: list[int], cached: int, prefix_rows: int) -> np.ndarray:
        """(frontier, cached + frontier) bool: the columns each frontier candidate attends when
        it is appended after `cached` cache rows: the first `prefix_rows` (the committed
        prefix), its ancestors' rows and itself."""
        allowed = np.zeros((len(frontier), cached + len(frontier)), dtype=bool)
        allowed[:, :prefix_rows] = True
        for j, c in enumerate(frontier):
            for a in self._ancestors(self.nodes[c].parent):
                allowed[j, self.rows[a]] = True
            allowed[j, cached + j] = True
        return allowed

    def confidence(self, kept: list[int]) -> tuple[float, ...]:
        """Each kept candidate's draft confidence (the drafter's T=1 probability for its token);
        () when this growth does not know it."""
        return ()

    def add_children(self, parent: int, q: torch.Tensor, count: int, mode: str, slots: Sequence[int] = ()) -> None:
        tokens, draws = choose_children(mode, q, count, self.sampling.greedy, self.rng)
        self.draws.extend(draws)
        depth = 1 if parent < 0 else self.nodes[parent].depth + 1
        base = 0.0 if parent < 0 else self.nodes[parent].score
        probs = q[torch.as_tensor(tokens, dtype=torch.long, device=q.device)].tolist() if tokens else []
        for j, (t, q_t) in enumerate(zip(tokens, probs)):
            score = base + (math.log(q_t) if q_t > 0 else -math.inf)
            self.nodes.append(_Node(t, parent, depth, q, score, slots[j] if slots else SLOT_ROOT))


class ModelGrowth(TreeGrowth):
    """A draft model's growth: its first forward runs the pending context and gives q at the
    prefix; each later depth one masked forward over the frontier (module docstring)."""

    def __init__(self, lm: CachedLM, prefix_len: int, sampling: SamplingConfig, rng: np.random.Generator):
        super().__init__(prefix_len, sampling, rng)
        self.lm = lm
        self.context_tokens: list[int] = []  # the first forward's tokens (refed without a cache)
        # expanded candidate (-1: the prefix) -> its logits row and their logsumexp (float64):
        # a node's confidence is one entry of its parent's row
        self._logits: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _keep_logits(self, candidates: list[int], logits: torch.Tensor) -> None:
        norms = torch.logsumexp(logits.double(), dim=-1)
        for j, c in enumerate(candidates):
            self._logits[c] = (logits[j], norms[j])

    def confidence(self, kept: list[int]) -> tuple[float, ...]:
        if not kept:
            return ()
        entries = []
        for c in kept:
            logits, norm = self._logits[self.nodes[c].parent]
            entries.append(logits[self.nodes[c].token].double() - norm)
        return tuple(torch.stack(entries).exp().tolist())

    def root_q(self, pending: list[int]) -> torch.Tensor:
        self.context_tokens = pending
        logits = self.lm.feed(pending, keep=1)[0]
        self.forwards += 1
        q = self._q(logits)  # checks the logits are finite first
        self._keep_logits([-1], logits.reshape(1, -1))
        return q

    def expand(self, frontier: list[int]) -> list[torch.Tensor]:
        """One forward over the candidates `frontier` (all of one depth); q after each."""
        if self.lm.cache is not None:
            start = self.lm.processed
            allowed = self.visibility(frontier, start, self.prefix_len)
            logits = masked_feed(
                self.lm,
                [self.nodes[c].token for c in frontier],
                [self.prefix_len + self.nodes[c].depth - 1 for c in frontier],
                allowed,
                keep=len(frontier),
            )
            self.rows.update({c: start + j for j, c in enumerate(frontier)})
        else:
            logits = self._uncached(frontier)
        self.forwards += 1
        qs = list(self._q(logits))
        self._keep_logits(frontier, logits)
        return qs

    def _uncached(self, frontier: list[int]) -> torch.Tensor:
        """Without a cache: the whole context, every expanded node so far and the frontier."""
        fed = list(self.rows) + frontier
        local = {c: j for j, c in enumerate(fed)}
        ctx = self.context_tokens
        n = len(fed)
        allowed = np.zeros((len(ctx) + n, len(ctx) + n), dtype=bool)
        allowed[: len(ctx), : len(ctx)] = np.tril(np.ones((len(ctx), len(ctx)), dtype=bool))
        allowed[len(ctx) :, : len(ctx)] = True
        for j, c in enumerate(fed):
            for a in self._ancestors(c):
                allowed[len(ctx) + j, len(ctx) + local[a]] = True
        positions = list(range(len(ctx))) + [self.prefix_len + self.nodes[c].depth - 1 for c in fed]
        tokens = list(ctx) + [self.nodes[c].token for c in fed]
        self.rows.update({c: -1 for c in frontier})  # expanded (no cache rows to keep)
        return masked_feed(self.lm, tokens, positions, allowed, keep=len(frontier))


def grow_static(g: TreeGrowth, spec: TreeSpec, mode: str, max_depth: int, root: torch.Tensor) -> list[int]:
    """Fill the spec's slots breadth first, down to max_depth, from the prefix's q row
    `root`; every candidate is kept."""
    kids: dict[int, list[int]] = {}
    for slot, (parent, _) in enumerate(spec.slots):
        kids.setdefault(parent, []).append(slot)
    g.add_children(-1, root, len(kids[SLOT_ROOT]), mode, kids[SLOT_ROOT])
    level = list(range(len(g.nodes)))
    for _ in range(2, max_depth + 1):
        frontier = [c for c in level if kids.get(g.nodes[c].slot)]
        if not frontier:
            break
        start = len(g.nodes)
        for c, q in zip(frontier, g.expand(frontier)):
            slots = kids[g.nodes[c].slot]
            g.add_children(c, q, len(slots), mode, slots)
        level = list(range(start, len(g.nodes)))
    return list(range(len(g.nodes)))


class TreePolicy(Protocol):
    """nodes=auto: what shapes a dynamic tree each round (core.decode.draft_length.CostPolicy;
    the decoder hands the run's policy to the proposer)."""

    def tree_width(self) -> int:
        """This round's width: frontier nodes expanded per depth, children each (<= topk)."""
        ...

    def tree_budget(self, scores: Sequence[float], parents: Sequence[int]) -> int:
        """How many of the grown candidates (cumulative log q, parent index) to keep."""
        ...


def grow_dynamic(
    g: TreeGrowth, spec: TreeSpec, max_depth: int, root: torch.Tensor, policy: TreePolicy | None = None
) -> list[int]:
    """EAGLE-2: from the prefix's q row `root`, expand the `topk` best frontier candidates by
    cumulative log q at each depth (`topk` children each, the top-k of q); keep the `nodes`
    best candidates overall. nodes=auto: the width (topk at most) and the count kept (the
    `nodes` cap at most) are the `policy`'s; without one, the spec's."""
    width, keep = spec.topk, spec.nodes
    by_cost = spec.nodes_by_cost and policy is not None
    if by_cost:
        width = max(1, min(int(cast(TreePolicy, policy).tree_width()), spec.topk))
    g.add_children(-1, root, width, "topk")
    level = list(range(len(g.nodes)))
    for _ in range(2, min(spec.depth, max_depth) + 1):
        frontier = sorted((c for c in level if g.nodes[c].score > -math.inf), key=lambda c: (-g.nodes[c].score, c))[
            :width
        ]
        if not frontier:
            break
        frontier.sort()  # candidate order: siblings stay together
        start = len(g.nodes)
        for c, q in zip(frontier, g.expand(frontier)):
            g.add_children(c, q, width, "topk")
        level = list(range(start, len(g.nodes)))
    scores, parents = [n.score for n in g.nodes], [n.parent for n in g.nodes]
    if by_cost:
        keep = max(1, min(int(cast(TreePolicy, policy).tree_budget(scores, parents)), spec.nodes))
    return select_dynamic(scores, parents, keep)


def finish(
    g: TreeGrowth, kept: list[int]
) -> tuple[tuple[int, ...], tuple[int, ...], list[torch.Tensor], dict[int, int]]:
    """Tokens, parents and q rows of the kept candidates (reindexed), and node -> cache row."""
    index = {c: i for i, c in enumerate(kept)}
    tokens = tuple(g.nodes[c].token for c in kept)
    parents = tuple(index[g.nodes[c].parent] if g.nodes[c].parent >= 0 else -1 for c in kept)
    rows = {index[c]: r for c, r in g.rows.items() if c in index and r >= 0}
    return tokens, parents, [g.nodes[c].q for c in kept], rows


def keep_path(lm: CachedLM, prefix_len: int, rows: dict[int, int], path: Sequence[int]) -> None:
    """After verification: the draft cache keeps the prefix and the accepted path's rows
    (as far as they were computed); a cache that cannot gather is cut to the prefix."""
    kept = []
    for node in path:
        if node not in rows:
            break
        kept.append(rows[node])
    if not keep_positions(lm, prefix_len, kept):
        lm.crop(prefix_len)
