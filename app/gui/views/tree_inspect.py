"""A token-tree node as the inspector shows it (pure: numpy and the core records).

A tree node x is judged against p', its parent's running target distribution at the moment
x was tried: the parent's p after the residual updates of the siblings rejected before it
(core.verify.tree). `node_residuals` gives that p', the q row x was proposed from (its
parent context's q), and every residual update at the parent, from:

- the round's own record (`rnd.tree`: the tried order and each update), for rounds held in
  memory (a live run);
- else the stored p and q rows, replaying the updates with core.verify.tree's rule (a
  replayed trace, which keeps the nodes' p and q but not the updates), when they are full
  vectors and the children mode is known;
- else nothing: the view says "not stored" and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from html import escape
from typing import Any

import numpy as np

from specscope.app.gui.model.traces import as_partial
from specscope.core.records import Round
from specscope.core.sampling.dists import TopDistribution
from specscope.core.sampling.partial import entry_known, is_full
from specscope.core.verify.chain import residual_distribution
from specscope.core.verify.tree import CHILDREN_MODES, child_proposal

RECORDED = "recorded"
# what a child's acceptance test divides by, per children mode (core.verify.tree)
Q_C = {"sampled": "q", "distinct": "q without the earlier siblings, renormalised", "topk": "the point mass on x"}
RECOMPUTED = "recomputed from the stored p and q"


@dataclass(frozen=True)
class SiblingUpdate:
    """p' at the parent after the rejection of `child` (the `rank`-th tried)."""

    child: int
    token: int
    rank: int
    mass: float | None
    p_after: np.ndarray | None


@dataclass(frozen=True)
class NodeResiduals:
    index: int
    parent: int  # -1 = the committed prefix
    tried: tuple[int, ...]  # the parent's children in the order tried
    rank: int | None  # this node's 1-based place in `tried`; None: not tried
    p_prime: np.ndarray | None  # p' when this node was tried (None: not tried, or not stored)
    q: np.ndarray | None  # this node's q row (its parent context's q)
    updates: tuple[SiblingUpdate, ...]  # every residual update at the parent, in order
    source: str  # RECORDED | RECOMPUTED | "greedy: ..." | "not stored: ..."
    accept_p: float | None = None  # min(1, p'(x) / q_c(x)): the probability this node was accepted with
    mode: str | None = None  # the children mode its q_c follows

    @property
    def stored(self) -> bool:
        return self.source in (RECORDED, RECOMPUTED)


def is_tree(r: Round) -> bool:
    return any(n.parent != n.index - 1 for n in r.nodes)


def children_mode(params: Mapping[str, Any] | None) -> str | None:
    """The run's children mode from its proposer params (None when they do not say)."""
    params = params or {}
    mode = params.get("children")
    if mode is None and params.get("tree"):
        mode = "topk"  # the proposer's default
    return str(mode) if mode in CHILDREN_MODES else None


def _dense(d: Any) -> Any:
    return as_partial(d) if isinstance(d, TopDistribution) else d


def _tried(r: Round, parent: int) -> tuple[int, ...]:
    tree = getattr(r, "tree", None)
    for node, kids in getattr(tree, "tried", None) or ():
        if node == parent:
            return tuple(kids)
    # the tried order is index order, and an untried sibling comes after every tried one
    return tuple(n.index for n in r.nodes if n.parent == parent and n.status != "unvisited")


def node_residuals(r: Round, index: int, mode: str | None) -> NodeResiduals:
    """What the inspector shows for tree node `index` of round `r` (see the module doc)."""
    node = r.nodes[index]
    tried = _tried(r, node.parent)
    rank = tried.index(index) + 1 if index in tried else None
    base = dict(index=index, parent=node.parent, tried=tried, rank=rank, q=_dense(node.q))
    if r.greedy:
        return NodeResiduals(
            **base,
            p_prime=_dense(node.p),
            updates=(),
            source="greedy: the target's argmax decides, p′ is never updated",
        )
    mode = getattr(getattr(r, "tree", None), "children", None) or mode
    recorded = _recorded_updates(r, node.parent, tried)
    if recorded is not None and all(u.p_after is not None for u in recorded):
        updates, source = recorded, RECORDED
    else:  # not recorded, or recorded without the vectors (a store may keep the masses only)
        updates, source = _replayed_updates(r, node.parent, tried, mode)
        if updates is None:
            return NodeResiduals(**base, p_prime=None, updates=(), source=source, mode=mode)
    p_prime = None
    if rank is not None:
        p_prime = _dense(node.p) if rank == 1 else (updates[rank - 2].p_after if len(updates) >= rank - 1 else None)
    earlier = [r.nodes[c] for c in tried[: (rank or 1) - 1]]
    return NodeResiduals(
        **base,
        p_prime=p_prime,
        updates=updates,
        source=source,
        mode=mode,
        accept_p=_accept_p(p_prime, base["q"], mode, earlier, node.token),
    )


def _accept_p(p_prime, q, mode: str | None, earlier: list, token: int) -> float | None:
    """min(1, p'(x) / q_c(x)): from full rows as the walk computes it, else from the entries
    a top-N record keeps (each p' keeps its node's children; each sibling's q row, the same
    row, keeps its own token); None when the mode or an entry is missing."""
    if p_prime is None or mode is None or not entry_known(p_prime, token):
        return None
    if mode != "topk" and (q is None or not entry_known(q, token)):
        return None
    tokens = [n.token for n in earlier]
    if mode == "topk":
        q_c = 1.0
    elif is_full(q):
        try:
            q_c = float(child_proposal(mode, np.asarray(q, dtype=np.float64), tokens, token)[token])
        except ValueError:
            return None
    elif mode == "sampled":
        q_c = float(q[token])
    else:  # distinct: q without the earlier siblings, renormalised (q sums to 1)
        if not all(n.q is not None and entry_known(n.q, n.token) for n in earlier):
            return None
        rest = 1.0 - sum(float(n.q[n.token]) for n in earlier)
        q_c = float(q[token]) / rest if rest > 0 else 0.0
    return float(min(1.0, float(p_prime[token]) / q_c)) if q_c > 0 else None


def _recorded_updates(r: Round, parent: int, tried: tuple[int, ...]) -> tuple[SiblingUpdate, ...] | None:
    tree = getattr(r, "tree", None)
    if tree is None or getattr(tree, "updates", None) is None:
        return None
    rank_of = {child: i + 1 for i, child in enumerate(tried)}
    return tuple(
        SiblingUpdate(
            u.child,
            r.nodes[u.child].token,
            rank_of.get(u.child, 0),
            None if u.mass is None else float(u.mass),
            _dense(u.p_after),
        )
        for u in tree.updates
        if u.parent == parent
    )


def _replayed_updates(r: Round, parent: int, tried: tuple[int, ...], mode: str | None):
    """(updates, source) replayed from the stored rows, or (None, why not)."""
    if mode is None:
        return None, "not stored: the run does not name its children mode"
    rows = [r.nodes[c] for c in tried]
    if not rows:
        return (), RECOMPUTED
    if not all(is_full(n.p) and is_full(n.q) for n in rows):
        return None, "not stored: the trace kept top-N rows only (the residual needs full p and q)"
    p_prime = np.asarray(rows[0].p, dtype=np.float64)  # every sibling was judged against the parent's p
    out, tokens = [], []
    for rank, n in enumerate(rows, 1):
        if n.status != "rejected":
            break
        q_c = child_proposal(mode, np.asarray(n.q, dtype=np.float64), tokens, n.token)
        try:
            p_prime, mass = residual_distribution(p_prime, q_c)
        except ArithmeticError:
            return None, "not stored: the stored p and q leave no residual mass"
        tokens.append(n.token)
        out.append(SiblingUpdate(n.index, n.token, rank, float(mass), p_prime))
    return tuple(out), RECOMPUTED


def top_entries(dist: np.ndarray | None, token_text, n: int = 3) -> str:
    """ "“a” .42, “b” .21" for the `n` most probable tokens of a distribution."""
    if dist is None:
        return "—"
    arr = np.asarray(dist, dtype=np.float64)
    ids = np.argsort(-arr, kind="stable")[:n]
    return ", ".join(f"“{escape(str(token_text(int(t))))}” {arr[t]:.3g}" for t in ids if arr[t] > 0)


def updates_html(view: NodeResiduals, token_text) -> str:
    """The residual updates at the node's parent, one line each, this node's turn marked."""
    where = "the prefix" if view.parent < 0 else f"node {view.parent}"
    if not view.stored:
        return f"residual updates at {where}: <i>{escape(view.source)}</i>"
    if view.source.startswith("greedy"):
        return f"tree node: tried #{view.rank} at {where} · {escape(view.source)}"
    order = f"tried #{view.rank} of {len(view.tried)}" if view.rank else "not tried"
    lines = [
        f"tree node {order} at {where}; p′ = p′ of {where} when it was tried "
        f"({'recorded' if view.source == RECORDED else escape(view.source)})"
    ]

    lines.append(f"&nbsp;&nbsp;p′₀ = p at {where}")
    for u in view.updates:
        mark = " ← this node" if u.child == view.index else ""
        lines.append(
            f"&nbsp;&nbsp;✗ #{u.rank} “{escape(str(token_text(u.token)))}” (node {u.child}) → p′{u.rank}: "
            f"mass kept {'—' if u.mass is None else f'{u.mass:.4g}'}; "
            f"top {top_entries(u.p_after, token_text)}{mark}"
        )
    if not view.updates:
        lines.append("&nbsp;&nbsp;no sibling rejected here: p′ stayed p")
    return "<br>".join(lines)


def decision_html(view: NodeResiduals, node: Any, token_text) -> str | None:
    """The tree node's acceptance test in words (its p'(x) and q_c, not its parent's first p)."""
    if view.accept_p is None or node.u is None or view.p_prime is None:
        return None
    rel = "&lt;" if node.status == "accepted" else "≥"
    x = int(node.token)
    return (
        f"draft “{escape(str(token_text(x)))}” (id {x}): p′(x) = {float(view.p_prime[x]):.4g}, "
        f"q(x) = {node.q_token if node.q_token is None else f'{node.q_token:.4g}'} — "
        f"u = {node.u:.4g} {rel} min(1, p′(x)/q_c(x)) = {view.accept_p:.4g} → {node.status} "
        f"(q_c = {Q_C.get(view.mode or '', 'q')})"
    )
