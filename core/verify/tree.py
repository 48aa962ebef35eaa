"""Exact verification of a token tree (SpecInfer / SpecTr-Sequoia / EAGLE top-k children).

The walk starts at the committed prefix (node -1). At each node its children are tried in
their recorded order (their index order in the draft), each against the running target
distribution p' of that node, with the proposal `q_c` the child was chosen from:

- "sampled"  (children i.i.d. from q, SpecInfer):   q_c = q
- "distinct" (children without replacement, SpecTr/Sequoia): q_c = q with the tokens of the
             siblings tried before it removed, renormalised
- "topk"     (deterministic children, EAGLE):        q_c = the point mass on the child

A child x is accepted with probability min(1, p'(x) / q_c(x)); on rejection
p' <- normalise(max(p' - q_c, 0)) before the next sibling (for a point mass this zeroes x
and renormalises). An accepted child becomes the current node; when every child failed,
one token is drawn from the final p' (the repair); at a node without children the bonus is
drawn from its p. Greedy follows the target argmax. EOS on an emitted token ends the round;
the budget cuts the path (the bonus only where the budget allows).

Row layout, the chain's: p[0] is the target distribution at the prefix, p[i + 1] the one
after node i; q[i] the draft distribution node i was chosen from (its parent's row).

The maths uses only elementwise operations that numpy arrays and torch tensors share, and the
chooser's decisions, so the one `walk` runs on float64 torch rows on the model's device in the
decoder (the residual updates and draws stay there; only the two entries each acceptance test
reads cross to the host), on float64 numpy rows in the checker's replay, and on object arrays
of fractions.Fraction in the exact oracle (tests/core/verify/test_tree_oracle.py), where a chooser
enumerates every decision exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from specscope.core.records import EmittedToken, ResidualUpdate
from specscope.core.sampling.tensors import is_tensor
from specscope.core.settings.vocab import CHILDREN_MODES
from specscope.core.verify.chain import (
    ResidualRule,
    Rows,
    Verdict,
    VerifyTask,
    acceptance_probability,
    draw_token,
    mark_end,
    residual_distribution,
    stale_residual,
)


def check_children_mode(mode: str) -> str:
    if mode not in CHILDREN_MODES:
        raise ValueError(f"children must be one of {', '.join(CHILDREN_MODES)}, got {mode!r}")
    return mode


def children_of(parents: tuple[int, ...]) -> dict[int, list[int]]:
    """Node -> its children in index order (the tried order); -1 is the prefix."""
    kids: dict[int, list[int]] = {-1: []}
    for i, parent in enumerate(parents):
        if not -1 <= parent < i:
            raise ValueError(f"node {i} has parent {parent}: a parent must be -1 or an earlier node")
        kids.setdefault(parent, []).append(i)
        kids.setdefault(i, [])
    return kids


def child_proposal(mode: str, q_row: Rows, tried: list[int], token: int) -> Rows:
    """The distribution the child `token` was proposed from, given the siblings tried before it."""
    if mode == "sampled":
        return q_row
    if mode == "topk":
        point = 0 * q_row
        point[token] = point[token] + 1  # keeps the element type (Fraction or float)
        return point
    if token in tried:
        raise ValueError(f"children drawn without replacement repeat token {token}")
    remaining = q_row.clone() if is_tensor(q_row) else q_row.copy()
    for t in tried:
        remaining[t] = 0 * remaining[t]
    mass = remaining.sum()
    if not mass > 0:
        raise ValueError("children drawn without replacement outnumber the proposal's support")
    return remaining / mass


def entries(p: Any, q: Any, token: int) -> tuple[Any, Any]:
    """(p[token], q[token]): host floats from device rows in one transfer; the elements
    themselves (floats, Fractions) from arrays."""
    if is_tensor(p):
        import torch

        p_x, q_x = torch.stack([p[token], q[token].to(p.device)]).tolist()
        return p_x, q_x
    return p[token], q[token]


class Chooser(Protocol):
    """Makes the walk's random decisions: (decision, the draw behind it or None). `node` is
    the child being tried, or the node whose repair/bonus is drawn (-1 = the prefix)."""

    def accept(self, probability: Any, node: int) -> tuple[bool, float | None]: ...

    def sample(self, dist: np.ndarray, node: int) -> tuple[int, float | None]: ...


@dataclass
class RngChooser:
    """The decoder's chooser: one uniform per decision, inverse-CDF sampling."""

    rng: np.random.Generator

    def accept(self, probability: Any, node: int) -> tuple[bool, float | None]:
        u = float(self.rng.random())
        return u < probability, u

    def sample(self, dist: np.ndarray, node: int) -> tuple[int, float | None]:
        u = float(self.rng.random())
        return draw_token(dist, u), u


# A Verdict carries the path, the tried order and the residual updates for every shape.
TreeVerdict = Verdict


# Every VerifyTask has its parents (a chain's when it names none): the name tree code uses.
TreeTask = VerifyTask


@dataclass(frozen=True)
class TreeVerifier:
    """The exact rule over any draft: a tree, or a chain (the tree whose node i has parent
    i - 1), through the one `walk`. `residual` is the update after a rejection (a seam: the
    fault zoo replaces it). A verifier with another rule overrides the three steps the walk
    asks of it: `_decide` (a child's acceptance), `_update` (p' after a rejection) and
    `_draw` (the repair or the bonus); core.verify.coupling.CoupledVerifier does."""

    residual: ResidualRule = field(default=residual_distribution, kw_only=True)

    def verify(self, task: VerifyTask, rng: np.random.Generator) -> Verdict:
        verdict = self.walk(task, RngChooser(rng))
        verdict.residual_mass = None if verdict.residual_mass is None else float(verdict.residual_mass)
        return verdict

    def walk(self, task: VerifyTask, chooser: Chooser) -> Verdict:
        """The whole walk from the prefix; decisions come from `chooser`."""
        check_children_mode(task.children)
        n = len(task.tokens)
        kids = children_of(task.parents)
        verdict = Verdict(statuses=["unvisited"] * n, draws=[None] * n, emitted=[])
        node = -1
        while True:
            if len(verdict.emitted) >= task.remaining:  # the budget cuts the path here
                verdict.bonus_withheld = True
                return verdict
            accepted = self._try_children(task, node, kids[node], verdict, chooser)
            if accepted is None:
                self._finish(task, node, kids[node], verdict, chooser)
                return verdict
            verdict.path.append(accepted)
            token = task.tokens[accepted]
            verdict.emitted.append(EmittedToken(token, "accepted", accepted))
            if mark_end(task, verdict):
                return verdict
            node = accepted

    def _try_children(
        self, task: VerifyTask, node: int, kids: list[int], verdict: Verdict, chooser: Chooser
    ) -> int | None:
        """Try `node`'s children in order; the accepted one, or None (final p' in verdict)."""
        p_prime = task.p[node + 1]
        verdict.final_p = p_prime
        if kids:
            verdict.tried[node] = []
        tried_tokens: list[int] = []
        for child in kids:
            token = task.tokens[child]
            verdict.tried[node].append(child)
            ok, q_c = self._decide(task, node, child, p_prime, tried_tokens, verdict, chooser)
            if ok:
                verdict.statuses[child] = "accepted"
                return child
            verdict.statuses[child] = "rejected"
            tried_tokens.append(token)
            if not task.greedy:
                p_prime = self._update(node, child, p_prime, q_c, verdict)
        return None

    def _decide(
        self,
        task: VerifyTask,
        node: int,
        child: int,
        p_prime: Any,
        tried_tokens: list[int],
        verdict: Verdict,
        chooser: Chooser,
    ) -> tuple[bool, Any]:
        """Whether `child` is accepted against the running p' of `node`, and the proposal q_c
        it was judged with (None when greedy). Records the draw behind the decision."""
        token = task.tokens[child]
        if task.greedy:
            return token == int(task.argmax[node + 1]), None
        q_rows: Rows = task.q  # not greedy: the task has its q rows
        q_c = child_proposal(task.children, q_rows[child], tried_tokens, token)
        ok, verdict.draws[child] = chooser.accept(acceptance_probability(*entries(p_prime, q_c, token)), child)
        return ok, q_c

    def _update(self, node: int, child: int, p_prime: Any, q_c: Any, verdict: Verdict) -> Any:
        """p' after `child` was rejected: the residual rule; every update is recorded."""
        p_prime, mass = self.residual(p_prime, q_c)
        verdict.updates.append(ResidualUpdate(node, child, p_prime, mass))
        verdict.final_p = p_prime
        verdict.residual, verdict.residual_mass = p_prime, mass
        return p_prime

    def _draw(
        self, task: VerifyTask, node: int, kids: list[int], verdict: Verdict, chooser: Chooser
    ) -> tuple[int, float | None]:
        """The repair (every child of `node` failed) or the bonus (it has none): from the final p'."""
        if task.greedy:
            return int(task.argmax[node + 1]), None
        return chooser.sample(verdict.final_p, node)

    def _finish(self, task: VerifyTask, node: int, kids: list[int], verdict: Verdict, chooser: Chooser) -> None:
        """Every child of `node` failed (the repair) or it has none (the bonus)."""
        token, draw = self._draw(task, node, kids, verdict, chooser)
        if kids:
            verdict.rejected_node = kids[-1]
            verdict.emitted.append(EmittedToken(token, "repaired", kids[-1], draw))
        else:
            verdict.emitted.append(EmittedToken(token, "bonus", None, draw))
        mark_end(task, verdict)


# The stale-residual bug (core.verify.chain.stale_residual) in the walk: the oracle's negative control.
STALE_RESIDUAL = TreeVerifier(residual=stale_residual)
