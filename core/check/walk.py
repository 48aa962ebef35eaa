"""The checker's proof of a round's walk, for every draft shape: a chain is the width-1 tree
whose node i has parent i - 1, and goes through the same proof.

A tree round carries its tree facts (TreeInfo: the tried order, every residual update p', the
path); a chain round's facts follow from its record (`chain_facts`: each visited node tried
alone at its parent, the one update at the first rejection is the recorded residual). Rounds
in memory and rounds read back from a store or a JSONL trace alike.

The walk is retraced from the prefix with the recorded values, never with values it
computes itself where the record holds them: at each node its children must have been tried
in index order, each tried child's decision must be what its recorded draw u gives against the
recorded running p' (the node's p for the first child, then the p' recorded after each
rejection; greedy: the target's argmax), each recorded p' must be normalise(max(p' - q_c, 0))
of the one before it, the repair must be what its draw selects from the last p' (the bonus
from the leaf's p), and the path, the emitted tokens and bonus_withheld must be the walk's.
Where the record leaves an update out but holds full p and q, the update is computed from them
(it is what the rule defines), so the repair's draw is still replayed.

With full vectors every step is proved exactly (to the checker's tolerance). With top-N
records (vocabularies above 4096 tokens, core.sampling.dists) the decisions are still exact: they
read only p'(child), which every p' record keeps for each child of its node, and the
child's q(token) scalars. A residual update is proved at the entries stored for p', q and
the update (the siblings' tokens, the top-N, the drawn token) given its recorded mass, and
the mass itself where exact scalars give it: at the first rejection at a node it is
sum(p) - sum min(p, q) (the node's exact overlap), for a top-k child it is sum(p') - p'(c).
What stays unproved is the mass of a later sampled/distinct update and the entries outside
the stored ones; the report's not_checked says so. Draws from a top-N p' are proved as
core.sampling.draws proves them (an impossible draw is a finding; a possible one is
consistent, not proved).

Rule names say what is wrong, whatever the shape: a decision (acceptance-draw, or greedy), an
update (residual), a draw (draw), the emitted tokens against the walk's (round-structure), and,
for recorded tree facts only, the facts against the walk (tree-walk).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specscope.core.check.coupled import coupled_pick_text, coupled_verdict
from specscope.core.records import ResidualUpdate, TreeInfo
from specscope.core.sampling.draws import draw_mismatch
from specscope.core.sampling.partial import entry_known, is_full, known_ids, max_abs_diff, vector_stats
from specscope.core.verify.chain import residual_distribution
from specscope.core.verify.tree import child_proposal, children_of

PARTLY_PROVED = (
    "partly, from top-N records: each p' update is proved at the entries stored for p', q and it "
    "(the siblings' tokens, the top-N, the drawn token) and by its mass where exact scalars give it (the "
    "first rejection at a node: sum p - overlap; every top-k rejection: sum p' - p'(child)); the mass of a "
    "later sampled/distinct update and the entries outside the stored ones need full vectors"
)


class _Stop(Exception):
    """A finding was reported; what follows in the round depends on it."""


def chain_facts(rnd: Any, residual: bool = True) -> TreeInfo:
    """A chain round's walk facts, from its record: each visited node was tried alone at its
    parent, the accepted ones are the path, and (`residual`: a rejection against p/q, not a
    greedy or coupled one) the first rejection's update is the recorded repair distribution
    (rnd.residual, rnd.residual_mass; None where not recorded)."""
    visited = [n for n in rnd.nodes if n.status != "unvisited"]
    rejected = next((n for n in visited if n.status == "rejected"), None)
    updates = (
        ()
        if rejected is None or not residual
        else (ResidualUpdate(rejected.parent, rejected.index, rnd.residual, rnd.residual_mass),)
    )
    return TreeInfo(
        spec="",
        children="sampled",  # a chain's draft token is drawn from q (a point mass for lookup)
        path=tuple(n.index for n in visited if n.status == "accepted"),
        tried=tuple((n.parent, (n.index,)) for n in visited),
        updates=updates,
        final_p=None,
    )


def prove_walk(chk: Any, facts: TreeInfo | None = None, coupling: Any = None) -> None:
    """The walk of one round, proved step by step: from its recorded tree facts, or (None) from
    the facts of a chain (chain_facts), which the walk does not compare with itself. With a
    `coupling` (core.verify.coupling, a coupled chain) each decision, the repair and the bonus
    are the target's coupled pick instead of a draw against p'/q (core.check.coupled)."""
    derived = facts is None
    if facts is None:  # greedy and coupled chains repair with the target's pick, not from a residual
        facts = chain_facts(chk.rnd, residual=not chk.config.sampling.greedy and coupling is None)
    walk = _Walk(chk, facts, derived, coupling)
    before = len(chk.sink)
    try:
        walk.run()
    except _Stop:
        if len(chk.sink) == before and not chk.config.sampling.greedy:  # stopped where the record left a value out
            for rule in ("residual", "draw"):
                chk.not_checked.setdefault(
                    rule,
                    "a walk stopped where its record left out what the next step "
                    "needs (see acceptance-draw / tree-walk): the updates and draws after it are not checked",
                )
        return
    if walk.partly and not chk.config.sampling.greedy:
        chk.not_checked.setdefault("residual", PARTLY_PROVED)


class _Walk:
    def __init__(self, chk: Any, facts: TreeInfo, derived: bool, coupling: Any = None):
        self.chk, self.rnd, self.tree = chk, chk.rnd, facts
        self.derived = derived  # facts taken from the record itself (a chain): not compared with the walk
        self.greedy = chk.config.sampling.greedy
        self.nodes = self.rnd.nodes
        self.kids = children_of(tuple(n.parent for n in self.nodes))
        self.pending = list(self.tree.updates)  # consumed in walk order
        self.tol = max(chk.tol, 1e-9)
        self.partly = False
        self._why = ""  # the last decision's numbers, for its message
        self.coupling = coupling  # a coupled chain's keys (core.verify.coupling.Coupling), else None
        self.ended = False  # the walk ended at an accepted EOS or a recorded stop

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
        if field in self.chk.config.unrecorded:
            return float(dist[c.token]) if dist is not None and entry_known(dist, c.token) else None
        return None if value is None else float(value)

    def _scalar(self, c: Any, field: str) -> float:
        """known(c, field), or the round stops being checked (a finding when the trace records
        the field elsewhere)."""
        dist, value = (c.p, c.p_token) if field == "p_token" else (c.q, c.q_token)
        if field in self.chk.config.unrecorded:
            if dist is None or not entry_known(dist, c.token):
                self.unknown(
                    "acceptance-draw", f"a tried node's {field} was not recorded and its vector does not hold it"
                )
            return float(dist[c.token])
        if value is None:
            self.fail("acceptance-draw", f"node {c.index} was tried but its {field} was not recorded", node=c.index)
        return float(value)

    def run(self) -> None:
        rnd, tried = self.rnd, dict(self.tree.tried)
        node, path, out, visited = -1, [], 0, []
        while True:
            if out >= rnd.remaining_budget:  # the budget cuts the path here: no repair, no bonus
                # bonus_withheld: the whole draft path was accepted and its bonus withheld; a budget
                # that cuts the path before its last draft (an engine that drafts past the budget)
                # withholds none. Unless an EOS or stop the trace does not name ended the last token.
                withheld = not self.kids[node]
                ended_unknown = self.chk.is_last and self._stop_unrecorded() and getattr(rnd, "stop", None) is None
                if (
                    rnd.bonus_withheld != withheld
                    and not ended_unknown
                    and self.chk.recorded("bonus_withheld", "round-structure")
                ):
                    self.fail(
                        "round-structure",
                        f"the budget is spent after {out} token(s), "
                        + (
                            "the whole draft path accepted, but bonus_withheld is false"
                            if withheld
                            else "before the draft path's end, but bonus_withheld is true (no bonus was owed)"
                        ),
                    )
                break
            kids = self.kids[node]
            if self.derived and kids and self.nodes[kids[0]].status == "unvisited" and out == len(rnd.emitted):
                break  # a chain whose record ends before its next draft (a stop; the stop rules judge it)
            accepted, running = self._try_children(node, kids)
            visited.append(node)
            want = tuple(kids[: kids.index(accepted) + 1] if accepted is not None else kids)
            if not self.derived and tuple(tried.get(node, ())) != want:
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
                self.ended = True
                break
            if (
                stop is None
                and out == len(rnd.emitted) < rnd.remaining_budget
                and self.chk.is_last
                and self._stop_unrecorded()
            ):
                self.chk.not_checked.setdefault(
                    "round-structure",
                    "the run's last round: its tokens end where a stop the trace does not record "
                    "may have ended them, so what the walk owes after them (a bonus, bonus_withheld) is not checked",
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
            if c.status == "unvisited":
                self.fail(
                    "round-structure",
                    f"node {child} (token {c.token}) is unvisited, but the walk tries it "
                    + ("first at its parent" if at == 0 else "after its earlier siblings were rejected"),
                    node=child,
                )
            ok = self._decision(c, running, at == 0, tried_q)
            if c.status != ("accepted" if ok else "rejected"):
                self.fail(
                    "coupled" if self.coupling is not None else "greedy" if self.greedy else "acceptance-draw",
                    f"proposal {c.token} (node {child}) was {c.status}, the walk {'accepts' if ok else 'rejects'} "
                    f"it{self._why}",
                    node=child,
                )
            if ok:
                return child, running
            if not self.greedy and self.coupling is None:  # a coupled repair is the pick from p itself
                running = self._update(node, c, running, at == 0, tried_tokens, tried_q)
            tried_tokens.append(c.token)
            tried_q.append(c.q_token if c.q_token is not None else 0.0)
        return None, running

    def _decision(self, c: Any, running: Any, first: bool, tried_q: list[float]) -> bool:
        """Whether the walk accepts child c: greedy, the target argmax; else u < min(1, p'(c)/q_c(c))."""
        if self.greedy:
            self._why = f": the target argmax is {c.target_argmax}"
            return bool(c.token == c.target_argmax)
        if self.coupling is not None:
            position = self.rnd.emitted_before + c.depth - 1  # the output position the decoder keyed it by
            verdict = coupled_verdict(self.chk, self.coupling, c.p, c.token, position)
            self._why = f": the target's coupled pick (argmax log p + G) at output position {position} is " + (
                coupled_pick_text(self.chk, self.coupling, c.p, position) if c.p is not None else "unknown"
            )
            return bool(c.status == "accepted") if verdict is None else verdict  # None: the record cannot tell
        if c.u is None:
            if self.chk.recorded("u", "acceptance-draw"):
                self.fail("acceptance-draw", f"node {c.index} was tried but has no recorded draw u", node=c.index)
            # the trace records no draws (not_checked says so): the walk follows the recorded
            # decision, so what does not depend on u (updates, the repair's support) is still proved
            return bool(c.status == "accepted")
        p_c = self._scalar(c, "p_token") if first else self._entry(running, c.token, c.index)
        q_c = self._q_c(c, tried_q)
        threshold = min(1.0, p_c / q_c) if q_c > 0 else 0.0
        self._why = f" with u={c.u:.6g} against min(1, p'(x)/q(x)) = min(1, {p_c:.6g}/{q_c:.6g})"
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
        if c.q is None and self.tree.children != "topk" and self.chk.recorded("q", "residual"):
            self.fail("residual", f"a stochastic rejection (node {c.index}) has no recorded q", node=c.index)
        if upd.p_after is None and running is not None and is_full(running) and self._full_q(c):
            return self._computed_update(node, c, running, tried_tokens)
        if upd.p_after is None or running is None:
            self.partly = True
            return upd.p_after
        if is_full(upd.p_after) and is_full(running) and (self.tree.children == "topk" or is_full(c.q)):
            self._full_update(node, c, running, tried_tokens, upd)
        else:
            self._partial_update(node, c, running, first, tried_tokens, tried_q, upd)
        return upd.p_after

    def _full_q(self, c: Any) -> bool:
        return self.tree.children == "topk" or (c.q is not None and is_full(c.q))

    def _residual_of(self, node: int, c: Any, running: Any, tried_tokens: list[int]) -> tuple[np.ndarray, float]:
        """normalise(max(p' - q_c, 0)) and its mass, from full rows; a finding when it has no mass."""
        row = np.asarray(running, dtype=np.float64)
        q_row = np.asarray(c.q, dtype=np.float64) if c.q is not None else np.zeros_like(row)
        q_c = child_proposal(self.tree.children, q_row, tried_tokens, c.token)
        try:
            expected, mass = residual_distribution(row, q_c)
        except ArithmeticError:
            self.fail(
                "residual",
                f"proposal {c.token} (node {c.index}) was rejected although max(p' - q, 0) has no mass",
                node=c.index,
            )
        return expected, float(mass)

    def _computed_update(self, node: int, c: Any, running: Any, tried_tokens: list[int]) -> np.ndarray:
        """The update the record leaves out, from the full p' and q it holds (what the rule defines)."""
        expected, _ = self._residual_of(node, c, running, tried_tokens)
        return expected

    def _full_update(self, node: int, c: Any, running: Any, tried_tokens: list[int], upd: Any) -> None:
        expected, mass = self._residual_of(node, c, running, tried_tokens)
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
            source = "sum p' - p'(child)" if mode == "topk" else "1 - sum min(p, q), the node's overlap"
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
        if stats is not None and stats.minimum < 0:
            self.fail(
                "residual",
                f"the p' recorded after child {c.index} of node {node} was rejected has a negative entry "
                f"({stats.minimum:.3g}): max(p' - q, 0) has none",
                node=c.index,
            )
        if stats is not None and abs(stats.total - 1.0) > 1e-6:
            self.fail(
                "residual",
                f"the p' recorded after child {c.index} of node {node} was rejected sums to {stats.total:.6g}, "
                "not 1: it was not normalised by its mass",
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
            self.fail("round-structure", self._missing(kind, token, node), position=self.chk.position_of(len(emitted)))
        e = emitted[at]
        if (e.kind, e.node) != (kind, node) or (kind == "accepted" and e.token != token):
            self.fail(
                "round-structure",
                f"emitted {e.kind} {e.token} (node {e.node}) where the walk emits {kind} "
                f"{'token ' + str(token) + ' ' if kind == 'accepted' else ''}(node {node})",
                position=self.chk.position_of(at),
            )
        return e

    def _missing(self, kind: str, token: int, node: int | None) -> str:
        n = len(self.rnd.emitted)
        if kind == "bonus":
            return (
                f"all {n} drafts on the accepted path were accepted with budget left and no EOS, "
                "but no bonus token was emitted"
            )
        if kind == "repaired":
            return f"node {node} was rejected but no repair token was emitted after the {n} accepted"
        return f"the walk accepts node {node} (token {token}), but the round emitted only {n} token(s)"

    def _tail(self, node: int, kids: list[int], running: Any, at: int) -> None:
        """The repair (every child failed) or the bonus (no children), from the final p'."""
        kind, owner = ("repaired", kids[-1]) if kids else ("bonus", None)
        e = self._emitted(at, -1, kind, owner)
        pos = self.chk.position_of(at)
        if self.greedy:
            self._greedy_tail(kind, e.token, kids, pos, owner)
            return
        if self.coupling is not None:
            self._coupled_tail(kind, e.token, running, at, owner)
            return
        source = f"the final p' at node {node}" if kids else "the leaf's p"
        if running is not None and entry_known(running, e.token) and not float(running[e.token]) > 0:
            self.fail(
                "residual" if kids else "sampler",
                f"{kind} {e.token} has probability {float(running[e.token]):.3g} "
                f"in {source}: it cannot have been drawn from it",
                node=owner,
                position=pos,
            )
        if kids and running is None:
            self._repair_outside_residual(self.nodes[kids[0]], e.token, pos, alone=len(kids) == 1, owner=kids[-1])
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
                "draw", "the distribution a repair or bonus was drawn from was not recorded"
            )
            return
        problem = draw_mismatch(running, e.token, e.draw, self.chk.tol)
        if problem:
            self.fail("draw", f"{kind} {e.token} from {source}: {problem}", node=owner, position=pos)

    def _coupled_tail(self, kind: str, token: int, dist: Any, at: int, owner: int | None) -> None:
        """A coupled round's repair or bonus is the target's coupled pick y_j at its output position."""
        position = self.rnd.emitted_before + at
        if coupled_verdict(self.chk, self.coupling, dist, token, position) is False:
            self.fail(
                "coupled",
                f"{kind} {token} is not the target's coupled pick y_j at output position {position} "
                f"({coupled_pick_text(self.chk, self.coupling, dist, position)}): a coupled round emits y_j",
                node=owner,
                position=self.chk.position_of(at),
            )

    def _greedy_tail(self, kind: str, token: int, kids: list[int], pos: int, owner: int | None) -> None:
        """Greedy: the repair is the target's argmax at the rejected position, the bonus the
        argmax of the leaf's p (a tie within the tolerance is either)."""
        if kids:
            want = self.nodes[kids[0]].target_argmax
            if token != want:
                self.fail("greedy", f"repair {token} is not the target argmax {want}", node=owner, position=pos)
            return
        dist = self.rnd.bonus_p
        best = _argmax(dist)
        if dist is None or best is None or token == best:
            return
        if not entry_known(dist, token) or float(dist[best]) > float(dist[token]) + self.tol:
            self.fail(
                "greedy", f"bonus {token} is not the argmax {best} of the target's last conditional", position=pos
            )

    def _repair_outside_residual(self, c: Any, token: int, pos: int, alone: bool, owner: int) -> None:
        """The final p' at a node, left out of the record: the repair must still be a token the
        node's p gives mass (no update adds any), and, after the one update of a node with one
        child (c), a token where p > q (max(p - q, 0) holds no other)."""
        if c.p is not None and entry_known(c.p, token) and not float(c.p[token]) > 0:
            self.fail(
                "residual",
                f"repair {token} has p=0: no residual max(p' - q, 0) holds it",
                node=owner,
                position=pos,
            )
        if not alone or self.tree.children == "topk":
            return
        if c.p is None or c.q is None or not (entry_known(c.p, token) and entry_known(c.q, token)):
            return
        gap = float(c.p[token]) - float(c.q[token])
        if gap <= 0:
            self.fail(
                "residual",
                f"repair {token} has p-q={gap:.3g} <= 0: it cannot come from the residual max(p-q, 0)",
                node=c.index,
                position=pos,
            )

    def _leftovers(self, path: list[int], out: int, visited: list[int], tried: dict[int, Any]) -> None:
        rnd = self.rnd
        # tokens past an EOS, a stop or the budget are the eos, stop and budget rules' findings
        if out < len(rnd.emitted) and out < rnd.remaining_budget and not self.ended:
            self.fail(
                "round-structure",
                f"the round emitted {len(rnd.emitted)} tokens, the walk stops after {out}",
                position=self.chk.position_of(out),
            )
        if out < rnd.remaining_budget and rnd.bonus_withheld and self.chk.recorded("bonus_withheld", "round-structure"):
            self.fail("round-structure", "bonus_withheld is true but the budget was not spent")
        if self.derived:  # a chain's facts are its record: round-structure checks its shape
            return
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
