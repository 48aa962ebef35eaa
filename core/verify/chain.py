"""Verification: the rule of speculative sampling, and what a verifier is given and returns.

The three functions at the top use only elementwise numpy operations, so they work on
float arrays in the decoder and on object arrays of fractions.Fraction in the exact oracle
test. Below them, the seam: a Verifier turns one round's draft and target rows (a
VerifyTask) into a Verdict (statuses, draws, emitted tokens). The one walk that applies the
rule to a draft is core.verify.tree.TreeVerifier: a chain is the tree whose node i has
parent i - 1, and goes through the same walk.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias, cast

import numpy as np

from specscope.core.records import EmittedToken, NodeStatus, ResidualUpdate
from specscope.core.sampling.reference import sample_from
from specscope.core.sampling.tensors import is_tensor

# A distribution row or block of rows: a numpy array (float, or the exact oracle's arrays of
# fractions.Fraction) or a torch tensor (the decoder's rows, on the model's device). The same
# elementwise code runs on all of them, so the static type stays open.
Rows: TypeAlias = Any


def acceptance_probability(p_x: Any, q_x: Any) -> Any:
    """min(1, p(x) / q(x)) for a proposed token x with q(x) > 0 (floats, tensors' scalars or
    Fractions: the result is of the ratio's type)."""
    if not q_x > 0:
        raise ValueError("a proposed token must have positive proposal probability q(x)")
    ratio = p_x / q_x
    return ratio if ratio < 1 else type(ratio)(1)


def residual_distribution(p: Rows, q: Rows) -> tuple[Rows, Any]:
    """(normalised max(p - q, 0), its mass r). Never divides a zero residual.

    Works on float arrays, on object arrays of Fractions (the exact oracle) and on torch
    tensors (the decoder's rows, on the model's device)."""
    positive = (p - q).clamp_min(0) if is_tensor(p) else np.maximum(p - q, 0 * p)
    mass = positive.sum()
    if not mass > 0:
        raise ArithmeticError(
            "a draft token was rejected although max(p - q, 0) has zero mass: p and q are numerically inconsistent"
        )
    return positive / mass, mass


def draw_token(dist: Rows, u: float) -> int:
    """The inverse-CDF draw of `u` from a row: on its device for a tensor (the decoder's
    rows), with numpy for an array."""
    if is_tensor(dist):
        from specscope.core.sampling.device import sample_from_torch  # torch only where tensors are

        return sample_from_torch(dist, u)
    return sample_from(dist, u)


def emitted_distribution(p: Rows, q: Rows) -> Rows:
    """Exact distribution of the token one verification step emits when x ~ q is proposed.

    accepted mass min(p, q) plus the rejection mass spread over the residual; equals p
    whenever the rule is implemented right.
    """
    accepted = np.minimum(p, q)
    rejected = 1 - accepted.sum()
    if not rejected > 0:
        return accepted
    residual, _ = residual_distribution(p, q)
    return accepted + rejected * residual


# ---------------------------------------------------------------------------- the seam

# The one residual rule every verifier takes (a seam: the fault zoo replaces it): (p, q) ->
# (the distribution the repair is drawn from, its mass). The tree walk's (a chain's too).
ResidualRule = Callable[[Any, Any], "tuple[Any, Any]"]


def residual_of(p: Rows, q: Rows) -> tuple[Rows, float]:
    """residual_distribution with the mass as a float."""
    residual, mass = residual_distribution(p, q)
    return residual, float(mass)


def stale_residual(p: Any, q: Any) -> tuple[Any, Any]:
    """The stale-residual bug (the fault zoo's, and the oracles' negative control): the
    residual is not taken after a rejection, so the repair (and, in a tree, the next
    sibling) sees p itself."""
    return p, p.sum()


@dataclass(frozen=True)
class VerifyTask:
    """Everything a verifier needs to judge one round's draft: a tree, or a chain (the tree
    whose node i has parent i - 1, what a task without parents is)."""

    tokens: tuple[int, ...]  # the draft's nodes
    q: Rows | None  # (n, V) proposal rows; None when greedy
    p: Rows  # (n + 1, V) target rows after the sampling transforms (last: the bonus row)
    argmax: np.ndarray  # (n + 1,) argmax of the target logits at each position
    greedy: bool
    eos_token_id: int | None
    remaining: int  # tokens the budget still allows in this round
    position: int = 0  # output position of the first draft token (new tokens emitted before the round)
    more_eos: frozenset[int] = frozenset()  # the run's other EOS ids (a chat model's end of turn)
    stops: Any = None  # core.decode.stops.StopTracker: stop strings and token sequences; None = none
    # each node's parent (-1: the prefix); left out, a chain: node i's parent is i - 1
    parents: tuple[int, ...] = cast("tuple[int, ...]", None)  # None: a chain (set in __post_init__)
    children: str = "sampled"  # how siblings were chosen (core.verify.tree.CHILDREN_MODES)

    def __post_init__(self) -> None:
        if self.parents is None:
            object.__setattr__(self, "parents", tuple(range(-1, len(self.tokens) - 1)))

    def is_eos(self, token: int) -> bool:
        return token == self.eos_token_id or token in self.more_eos


@dataclass
class Verdict:
    """A verifier's decisions for one round: per node status and draw, what is emitted, the
    accepted path (node indices from the prefix; a chain's is 0, 1, ..., accepted - 1) and,
    for the tree walk, the order siblings were tried in and every residual update."""

    statuses: list[NodeStatus]
    draws: list[float | None]
    emitted: list[EmittedToken]
    rejected_node: int | None = None
    residual: Rows | None = None
    residual_mass: float | None = None
    eos: bool = False
    stop: Any = None  # core.decode.stops.StopMatch: a stop the last emitted token completed
    bonus_withheld: bool = False
    path: list[int] = field(default_factory=list)
    tried: dict[int, list[int]] = field(default_factory=dict)
    updates: list[ResidualUpdate] = field(default_factory=list)  # one per rejection in a tree
    final_p: Any = None  # the tree walk: the distribution the repair or bonus was drawn from

    @property
    def accepted(self) -> int:
        return self.statuses.count("accepted")


def mark_end(task: VerifyTask, verdict: Verdict) -> bool:
    """After each emitted token, in order: does it end the output (EOS first, then a stop)?
    Sets verdict.eos / verdict.stop. Runs before any budget check."""
    token = verdict.emitted[-1].token
    verdict.eos = task.is_eos(token)
    if not verdict.eos and task.stops is not None:
        verdict.stop = task.stops.check([e.token for e in verdict.emitted])
    return verdict.eos or verdict.stop is not None


class Verifier(Protocol):
    """Judges a draft against the target: decides, repairs or adds the bonus, and stops at
    EOS and at the budget. The decoder is given one (core.verify.tree.TreeVerifier by
    default; core.verify.coupling.CoupledVerifier for a coupled run)."""

    def verify(self, task: VerifyTask, rng: np.random.Generator) -> Verdict: ...
