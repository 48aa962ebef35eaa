"""The checker's proof of a tree round from its recorded tree facts (TreeInfo: the tried
order, every residual update p', the path), for rounds in memory and rounds read back from
a store or a JSONL trace alike.

The walk is retraced from the prefix with the recorded values, never with values it
computes itself: at each node its children must have been tried in index order, each tried
child's decision must be what its recorded draw u gives against the recorded running p'
(the node's p for the first child, then the p' recorded after each rejection), each
recorded p' must be normalise(max(p' - q_c, 0)) of the one before it, the repair must be
what its draw selects from the last p' (the bonus from the leaf's p), and the path, the
emitted tokens and bonus_withheld must be the walk's.

With full vectors every step is proved exactly (to the checker's tolerance). With top-N
records (vocabularies above 4096 tokens, core.sampling.dists) the decisions are still exact: they
read only p'(child), which every p' record keeps for each child of its node, and the
child's q(token) scalars. A residual update is proved at the entries stored for p', q and
the update (the siblings' tokens, the top-N, the drawn token) given its recorded mass, and
the mass itself where exact scalars give it: at the first rejection at a node it is
sum(p) - sum min(p, q) (the node's exact overlap), for a top-k child it is sum(p') - p'(c).
What stays unproved is the mass of a later sampled/distinct update and the entries outside
the stored ones; the report's not_checked says so. Draws from a top-N p' are proved as
core.sampling.draws proves them for chains (an impossible draw is a finding; a possible one is
consistent, not proved).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specscope.core.sampling.draws import draw_mismatch
from specscope.core.sampling.partial import entry_known, is_full, known_ids, max_abs_diff, vector_stats
from specscope.core.verify.chain import residual_distribution
from specscope.core.verify.tree import child_proposal, children_of

PARTLY_PROVED = (
    "partly, from top-N records: each tree p' update is proved at the entries stored for p', q and it "
    "(the siblings' tokens, the top-N, the drawn token) and by its mass where exact scalars give it (the "
    "first rejection at a node: sum p - overlap; every top-k rejection: sum p' - p'(child)); the mass of a "
    "later sampled/distinct update and the entries outside the stored ones need full vectors"
)


class _Stop(Exception):
    """A finding was reported; what follows in the round depends on it."""


def prove_tree_round(chk: Any) -> None:
    """The walk of a round that carries its TreeInfo (chk.rnd.tree), proved step by step."""
    walk = _Walk(chk)
    before = len(chk.sink)
    try:
        walk.run()
    except _Stop:
        if len(chk.sink) == before and not chk.config.sampling.greedy:  # stopped where the record left a value out
            for rule in ("residual", "draw"):
                chk.not_checked.setdefault(
                    rule,
                    "a tree walk stopped where its record left out what the next step "
                    "needs (see tree-walk): the updates and draws after it are not checked",
                )
        return
    if walk.partly and not chk.config.sampling.greedy:
        chk.not_checked.setdefault("residual", PARTLY_PROVED)


class _Walk:
    def __init__(self, chk: Any):
        self.chk, self.rnd, self.tree = chk, chk.rnd, chk.rnd.tree
        self.greedy = chk.config.sampling.greedy
        self.nodes = self.rnd.nodes
        self.kids = children_of(tuple(n.parent for n in self.nodes))
        self.pending = list(self.tree.updates)  # consumed in walk order
        self.tol = max(chk.tol, 1e-9)
        self.partly = False
        self._why = ""  # the last decision's numbers, for its message

    def fail(self, rule: str, message: str, node: int | None = None, position: int | None = None) -> None:
        self.chk.add(rule, message, position, node)
        raise _Stop

    def unknown(self, rule: str, why: str) -> None:
        """The record leaves out what the next step needs: the rest of the round is not
        checked (and the report says so), never judged with a default."""
        self.chk.not_checked.setdefault(rule, why)
        raise _Stop

    def known(self, c: Any, field: str) -> float | None:
        """p(token) or q(token) of node c: the recorded scalar, or the vector's entry when the
        trace left the scalar out; None (not 0) when neither holds it."""
        dist, value = (c.p, c.p_token) if field == "p_token" else (c.q, c.q_token)
        if field in self.chk.config.unrecorded and (dist is None or not entry_known(dist, c.token)):
            return None
        return None if value is None else float(value)

    def _scalar(self, c: Any, field: str) -> float:
        """known(c, field), or the round stops being checked (a finding when the trace records
        the field elsewhere)."""
        dist, value = (c.p, c.p_token) if field == "p_token" else (c.q, c.q_token)
        if field in self.chk.config.unrecorded and (dist is None or not entry_known(dist, c.token)):
            self.unknown("tree-walk", f"a tried child's {field} was not recorded and its vector does not hold it")
        if value is None:
            if self.chk.recorded(field, "tree-walk"):
                self.fail("tree-walk", f"node {c.index} was tried but its {field} was not recorded", node=c.index)
            raise _Stop
        return float(value)

    def run(self) -> None:
        rnd, tried = self.rnd, dict(self.tree.tried)
        node, path, out, visited = -1, [], 0, []
        while True:
            if out >= rnd.remaining_budget:  # the budget cuts the path here: no repair, no bonus
                # (unless an EOS or stop the trace does not name ended the run's last token first)
                ended_unknown = self.chk.is_last and self._stop_unrecorded() and getattr(rnd, "stop", None) is None
                if not rnd.bonus_withheld and not ended_unknown and self.chk.recorded("bonus_withheld", "tree-walk"):
                    self.fail("tree-walk", "the budget is spent after the accepted path, but bonus_withheld is false")
                break
            kids = self.kids[node]
            accepted, running = self._try_children(node, kids)
            visited.append(node)
            want = tuple(kids[: kids.index(accepted) + 1] if accepted is not None else kids)
            if tuple(tried.get(node, ())) != want:
                self.fail(
                    "tree-walk",
                    f"at node {node} the recorded tried order is {list(tried.get(node, ()))}, the walk "
                    f"tries {list(want)} (children in index order, up to the accepted one)",
                    node=node,
                )
            if accepted is None:
                self._tail(node, kids, running, out)
                out += 1
                break
            path.append(accepted)
            self._emitted(out, self.nodes[accepted].token, "accepted", accepted)
            out += 1
            stop = getattr(rnd, "stop", None)
            if self.nodes[accepted].token in self.chk.config.eos_ids or (stop is not None and stop.position == out - 1):
                break
            if (
                stop is None
                and out == len(rnd.emitted) < rnd.remaining_budget
                and self.chk.is_last
                and self._stop_unrecorded()
            ):
                self.chk.not_checked.setdefault(
                    "tree-walk",
                    "a round's tokens end where a stop the trace does not record "
                    "may have ended them: the rest of its walk is not checked",
                )
                break
            node = accepted
        self._leftovers(path, out, visited, tried)

    def _stop_unrecorded(self) -> bool:
        """Whether a stop may have ended this round without the trace saying so."""
        return self.chk.config.end_unknown is not None

    def _try_children(self, node: int, kids: list[int]) -> tuple[int | None, Any]:
        """Each child in order against the running p'; (the accepted child or None, the final p')."""
        running = self.nodes[kids[0]].p if kids else self.rnd.bonus_p
        tried_tokens: list[int] = []
        tried_q: list[float] = []
        for at, child in enumerate(kids):
            c = self.nodes[child]
            ok = self._decision(c, running, at == 0, tried_q)
            if c.status != ("accepted" if ok else "rejected"):
                self.fail(
                    "tree-walk",
                    f"node {child} (token {c.token}) is {c.status}, the walk makes it "
                    f"{'accepted' if ok else 'rejected'}{self._why}",
                    node=child,
                )
            if ok:
                return child, running
            if not self.greedy:
                running = self._update(node, c, running, at == 0, tried_tokens, tried_q)
            tried_tokens.append(c.token)
            tried_q.append(c.q_token if c.q_token is not None else 0.0)
        return None, running

    def _decision(self, c: Any, running: Any, first: bool, tried_q: list[float]) -> bool:
        """Whether the walk accepts child c: greedy, the target argmax; else u < min(1, p'(c)/q_c(c))."""
        if self.greedy:
            self._why = f" (target argmax {c.target_argmax})"
            return bool(c.token == c.target_argmax)
        if c.u is None:
            if self.chk.recorded("u", "tree-walk"):
                self.fail("tree-walk", f"node {c.index} was tried but has no recorded draw u", node=c.index)
            raise _Stop
        p_c = self._scalar(c, "p_token") if first else self._entry(running, c.token, c.index)
        q_c = self._q_c(c, tried_q)
        threshold = min(1.0, p_c / q_c) if q_c > 0 else 0.0
        self._why = f" with u={c.u:.6g} against min(1, p'(x)/q_c(x)) = {p_c:.6g}/{q_c:.6g}"
        if abs(c.u - threshold) <= self.tol:  # too close to call in float: either decision is consistent
            return bool(c.status == "accepted")
        return bool(c.u < threshold)

    def _entry(self, dist: Any, token: int, node: int) -> float:
        if dist is None:
            self.unknown(
                "tree-walk",
                "a later sibling's decision needs the p' after the earlier rejections, which the "
                "trace did not record (tree.updates or their p_after)",
            )
        if not entry_known(dist, token):
            self.unknown(
                "tree-walk",
                "a later sibling's decision needs p'(its token), which the recorded p' does not hold (exact_ids)",
            )
        return float(dist[token])

    def _q_c(self, c: Any, tried_q: list[float]) -> float:
        """q_c(c): the proposal probability of child c given the siblings tried before it."""
        mode = self.tree.children
        if mode == "topk":
            return 1.0
        q_token = self._scalar(c, "q_token")
        if mode == "sampled":
            return q_token
        stats = vector_stats(c.q)
        remaining = (stats.total if stats is not None else 1.0) - sum(tried_q)
        return q_token / remaining if remaining > 0 else float("inf")

    def _update(
        self, node: int, c: Any, running: Any, first: bool, tried_tokens: list[int], tried_q: list[float]
    ) -> Any:
        """The recorded p' after child c's rejection, proved against the running p'; returns it."""
        if not self.pending and "updates" in self.chk.config.unrecorded:
            self.partly = True
            self.chk.not_checked.setdefault("residual", "the tree's residual updates (tree.updates) were not recorded")
            return None
        if not self.pending or (self.pending[0].parent, self.pending[0].child) != (node, c.index):
            self.fail(
                "residual",
                f"child {c.index} of node {node} was rejected but the next recorded residual update "
                + (
                    f"is at node {self.pending[0].parent} after child {self.pending[0].child}"
                    if self.pending
                    else "is missing"
                ),
                node=c.index,
            )
        upd = self.pending.pop(0)
        if upd.p_after is None or running is None:
            self.partly = True
            return upd.p_after
        if is_full(upd.p_after) and is_full(running) and (self.tree.children == "topk" or is_full(c.q)):
            self._full_update(node, c, running, tried_tokens, upd)
        else:
            self._partial_update(node, c, running, first, tried_tokens, tried_q, upd)
        return upd.p_after

    def _full_update(self, node: int, c: Any, running: Any, tried_tokens: list[int], upd: Any) -> None:
        row = np.asarray(running, dtype=np.float64)
        q_row = np.asarray(c.q, dtype=np.float64) if c.q is not None else np.zeros_like(row)
        q_c = child_proposal(self.tree.children, q_row, tried_tokens, c.token)
        try:
            expected, mass = residual_distribution(row, q_c)
        except ArithmeticError:
            self.fail(
                "residual",
                f"child {c.index} of node {node} was rejected although max(p' - q, 0) has no mass",
                node=c.index,
            )
        diff = float(np.max(np.abs(np.asarray(upd.p_after, dtype=np.float64) - expected)))
        if diff > self.tol:
            self.fail(
                "residual",
                f"after child {c.index} of node {node} was rejected, p' was not updated to "
                f"{self._rule} (max diff {diff:.3g})",
                node=c.index,
            )
        if upd.mass is not None and abs(float(upd.mass) - float(mass)) > self.tol:
            self.fail(
                "residual",
                f"the residual mass recorded after child {c.index} of node {node} is "
                f"{float(upd.mass):.6g}, sum max(p' - q_c, 0) = {float(mass):.6g}",
                node=c.index,
            )

    @property
    def _rule(self) -> str:
        return {
            "sampled": "normalise(max(p' - q, 0))",
            "distinct": "normalise(max(p' - q_c, 0)), q_c = q without the earlier siblings, renormalised",
            "topk": "p' with the child's entry zeroed, renormalised",
        }[self.tree.children]

    def _partial_update(
        self,
        node: int,
        c: Any,
        running: Any,
        first: bool,
        tried_tokens: list[int],  # long: mass, facts and entries of one top-N update, each with its message
        tried_q: list[float],
        upd: Any,
    ) -> None:
        mode, p_after = self.tree.children, upd.p_after
        p_c = self._scalar(c, "p_token") if first else self._entry(running, c.token, c.index)
        run_stats = vector_stats(running)
        total = run_stats.total if run_stats is not None else 1.0
        if mode == "topk":
            expected_mass = total - p_c
        elif first and c.overlap is not None:
            expected_mass = total - c.overlap  # sum max(p - q, 0) = sum p - sum min(p, q)
        else:
            expected_mass = None
            self.partly = True
        if upd.mass is None:
            self.partly = True
            return
        mass = float(upd.mass)
        if expected_mass is not None and abs(mass - expected_mass) > self.tol:
            source = "sum p' - p'(child)" if mode == "topk" else "sum p - overlap"
            self.fail(
                "residual",
                f"the residual mass recorded after child {c.index} of node {node} is {mass:.6g}, "
                f"not {expected_mass:.6g} ({source}): p' was not updated to {self._rule}",
                node=c.index,
            )
        if not mass > 0:
            self.fail(
                "residual",
                f"child {c.index} of node {node} was rejected but the recorded residual mass is {mass:.6g}",
                node=c.index,
            )
        stats = vector_stats(p_after)
        if stats is not None and (stats.minimum < 0 or abs(stats.total - 1.0) > 1e-6):
            self.fail(
                "residual",
                f"the p' recorded after child {c.index} of node {node} is not a distribution "
                f"(sum {stats.total:.6g}, smallest entry {stats.minimum:.3g})",
                node=c.index,
            )
        q_known = self._q_entries(c, tried_tokens, tried_q, running)
        p_known = {t: float(running[t]) for t in q_known if entry_known(running, t)}
        if first:  # the node's p row: its children's p(token) scalars are exact entries of it
            p_known.update(
                {n.token: x for n in self.nodes if n.parent == c.parent and (x := self.known(n, "p_token")) is not None}
            )
        p_known[c.token] = p_c
        for t in sorted(set(q_known) & set(p_known)):
            if not entry_known(p_after, t):
                continue
            want = max(p_known[t] - q_known[t], 0.0) / mass
            if abs(float(p_after[t]) - want) > self.tol:
                self.fail(
                    "residual",
                    f"after child {c.index} of node {node} was rejected, p'({t}) = "
                    f"{float(p_after[t]):.6g}, {self._rule} gives {want:.6g}",
                    node=c.index,
                )
        self.partly = True  # the entries outside the stored ones stay unproved

    def _q_entries(self, c: Any, tried_tokens: list[int], tried_q: list[float], running: Any) -> dict[int, float]:
        """q_c at the tokens where it is known: for a point mass, every token p' has an entry
        for (and the siblings'); else q's stored entries and the siblings' q(token)."""
        mode = self.tree.children
        siblings = [n for n in self.nodes if n.parent == c.parent]
        if mode == "topk":
            ids = known_ids(running)
            tokens = {n.token for n in siblings} | (set(ids.tolist()) if ids is not None else set())
            return {t: (1.0 if t == c.token else 0.0) for t in tokens}
        q = c.q
        values: dict[int, float] = {}
        if q is not None:
            ids = known_ids(q)
            for t in ids.tolist() if ids is not None else range(len(q)):
                values[int(t)] = float(q[t])
        for n in siblings:
            x = self.known(n, "q_token")
            if x is not None:
                values[n.token] = x
        if mode == "distinct":
            stats = vector_stats(q)
            remaining = (stats.total if stats is not None else 1.0) - sum(tried_q)
            values = {t: (0.0 if t in tried_tokens else v / remaining) for t, v in values.items()}
        return values

    def _emitted(self, at: int, token: int, kind: str, node: int | None) -> Any:
        emitted = self.rnd.emitted
        if at >= len(emitted):
            self.fail(
                "tree-walk",
                f"the walk emits {kind} token {token} (node {node}) here, the round emitted {len(emitted)} tokens",
                position=self.chk.position_of(len(emitted)),
            )
        e = emitted[at]
        if (e.kind, e.node) != (kind, node) or (kind == "accepted" and e.token != token):
            self.fail(
                "tree-walk",
                f"emitted {e.kind} {e.token} (node {e.node}) where the walk emits {kind} "
                f"{'token ' + str(token) + ' ' if kind == 'accepted' else ''}(node {node})",
                position=self.chk.position_of(at),
            )
        return e

    def _tail(self, node: int, kids: list[int], running: Any, at: int) -> None:
        """The repair (every child failed) or the bonus (no children), from the final p'."""
        kind, owner = ("repaired", kids[-1]) if kids else ("bonus", None)
        e = self._emitted(at, -1, kind, owner)
        pos = self.chk.position_of(at)
        if self.greedy:
            want = self.nodes[kids[0]].target_argmax if kids else _argmax(self.rnd.bonus_p)
            if want is not None and e.token != want:
                self.fail("tree-walk", f"greedy {kind} {e.token} is not the target argmax {want}", position=pos)
            return
        if running is not None and entry_known(running, e.token) and not float(running[e.token]) > 0:
            source = f"the final p' at node {node}" if kids else "the leaf's p"
            self.fail(
                "residual" if kids else "sampler",
                f"{kind} {e.token} has probability {float(running[e.token]):.3g} "
                f"in {source}: it cannot have been drawn from it",
                node=owner,
                position=pos,
            )
        if kids and self.rnd.residual is not None and running is not None:
            diff = max_abs_diff(self.rnd.residual, running)
            if diff > self.tol:
                self.fail(
                    "residual",
                    f"the recorded repair distribution is not the final p' at node {node} (max diff {diff:.3g})",
                    node=owner,
                )
        if e.draw is None:
            self.chk.recorded("draw", "draw")
            self.chk.not_checked.setdefault("draw", "a sampled repair or bonus has no recorded draw")
            return
        if running is None:
            self.chk.not_checked.setdefault(
                "draw", "the distribution a tree repair or bonus was drawn from was not recorded"
            )
            return
        problem = draw_mismatch(running, e.token, e.draw, self.chk.tol)
        if problem:
            source = f"the final p' at node {node}" if kids else "the leaf's p"
            self.fail("draw", f"{kind} {e.token} from {source}: {problem}", node=owner, position=pos)

    def _leftovers(self, path: list[int], out: int, visited: list[int], tried: dict[int, Any]) -> None:
        rnd = self.rnd
        if out < len(rnd.emitted):
            self.fail(
                "tree-walk",
                f"the round emitted {len(rnd.emitted)} tokens, the walk stops after {out}",
                position=self.chk.position_of(out),
            )
        if out < rnd.remaining_budget and rnd.bonus_withheld and self.chk.recorded("bonus_withheld", "tree-walk"):
            self.fail("tree-walk", "bonus_withheld is true but the budget was not spent")
        if tuple(self.tree.path) != tuple(path):
            self.fail("tree-walk", f"the recorded accepted path is {list(self.tree.path)}, the walk's is {path}")
        extra = sorted(set(tried) - set(visited))
        if extra:
            self.fail(
                "tree-walk",
                f"a tried order is recorded at node {extra[0]}, which the walk never reaches",
                node=extra[0],
            )
        if self.pending:
            u = self.pending[0]
            self.fail(
                "residual",
                f"a residual update is recorded at node {u.parent} after child {u.child}, which the "
                "walk does not reject",
                node=u.child,
            )
        reached = {c for node in visited for c in tried.get(node, ())}
        for n in self.nodes:
            if n.index not in reached and n.status != "unvisited":
                self.fail("tree-walk", f"node {n.index} is {n.status} but the walk never tries it", node=n.index)


def _argmax(dist: Any) -> int | None:
    if dist is None:
        return None
    ids = known_ids(dist)
    values = np.asarray(dist)
    if ids is None:
        return int(np.argmax(values))
    return int(ids[int(np.argmax(values[ids]))]) if ids.size else None
