"""Coupled lanes: randomness shared by output position, and the drafter-invariant verifier.

Two speculative decoders with different proposers consume one random stream differently,
so at T > 0 their outputs part at the first token even when both are exact. Coupling
(Daliri, Musco, Suresh 2024, "Coupling without communication and drafter-invariant
speculative decoding") keys the randomness by (coupling seed, output position j) instead:

- G_j is a vector of independent standard Gumbel variables over the vocabulary, generated
  from a numpy Generator seeded with [seed, j] (any machine regenerates it; distinct
  positions are independent);
- the target's token at j is y_j = argmax_v log p_j(v) + G_j(v) over the support of p_j:
  by the Gumbel-max theorem an exact sample from p_j;
- a draft model proposes x_j = argmax_v log q_j(v) + G_j(v): an exact sample from q_j
  (q is still the proposal distribution it records); deterministic proposers propose as
  they always do;
- `CoupledVerifier` accepts x_j iff x_j == y_j and, at the first mismatch, emits y_j (the
  coupled repair, not a residual draw); when all are accepted the bonus is y_{j+n}.

Every emitted token is y_j, a function of the target's rows and the keyed randomness only:
the output follows the target exactly whatever the proposer, and two coupled lanes emit
the same tokens wherever their prefixes agree (up to float differences between the two
lanes' forwards). The price: a draft token is accepted with probability P(x_j == y_j),
which is at least (1 - d)/(1 + d) for d the total variation distance between p and q, below
the sum min(p, q) = 1 - d of the chain rule.

Greedy decoding has no randomness to share: there the verifier is the walk's argmax rule.

A chain is the tree whose node i has parent i - 1: `CoupledVerifier` is core.verify.tree's
walk with the coupled decision and repair (coupled lanes verify chains only).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specscope.core.sampling.tensors import is_tensor
from specscope.core.verify.chain import Verdict, VerifyTask
from specscope.core.verify.tree import TreeVerifier

COUPLED_VERIFIER = "coupled"  # what a run's proposer_params["verifier"] says


def gumbel_vector(seed: int, position: int, vocab_size: int) -> np.ndarray:
    """G_j: `vocab_size` standard Gumbel variables for output position `position`, the same
    on every machine (PCG64 seeded with the SeedSequence [seed, position])."""
    u = np.random.default_rng([int(seed), int(position)]).random(vocab_size)  # [0, 1)
    u = np.maximum(u, np.finfo(np.float64).tiny)  # u = 0 (probability 2^-53) would give -inf
    return -np.log(-np.log(u))


def check_coupling_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"the coupling seed must be an integer >= 0, got {seed!r}")
    return int(seed)


def gumbel_argmax(row: Any, gumbel: Any) -> int:
    """argmax over the support of `row` of log row(v) + G(v): a torch row (on its device,
    with `gumbel` a tensor there) or a numpy row."""
    if is_tensor(row):
        import torch

        scores = torch.where(row > 0, torch.log(row) + gumbel, torch.full_like(row, float("-inf")))
        return int(torch.argmax(scores))
    values = np.asarray(row, dtype=np.float64)
    with np.errstate(divide="ignore"):
        host_scores = np.where(values > 0, np.log(values) + gumbel, -np.inf)
    return int(np.argmax(host_scores))


@dataclass
class Coupling:
    """The shared randomness of one coupling seed: G_j for any output position j, the last
    few kept (a round reads k + 1 positions, the next round starts where it ended)."""

    seed: int
    keep: int = 32
    _cache: OrderedDict[tuple[int, int, str | None], Any] = field(default_factory=OrderedDict, repr=False)

    def __post_init__(self) -> None:
        self.seed = check_coupling_seed(self.seed)

    def gumbel(self, position: int, vocab_size: int, device: Any = None) -> Any:
        """G_j as a float64 numpy vector, or as a tensor on `device`."""
        key = (int(position), int(vocab_size), None if device is None else str(device))
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        g = gumbel_vector(self.seed, position, vocab_size)
        value: Any  # a numpy vector, or a tensor on `device`
        if device is None:
            value = g
        else:
            import torch

            value = torch.from_numpy(g).to(device)
        self._cache[key] = value
        if len(self._cache) > self.keep:
            self._cache.popitem(last=False)
        return value

    def pick(self, row: Any, position: int) -> int:
        """The coupled token of `row` at output position `position`: argmax log row + G_j."""
        vocab = int(row.shape[-1])
        device = row.device if is_tensor(row) else None
        return gumbel_argmax(row, self.gumbel(position, vocab, device))


@dataclass(frozen=True)
class CoupledVerifier(TreeVerifier):
    """The drafter-invariant verifier (see the module docstring): the tree walk with the
    coupled rule in its three steps. `emit` chooses the token emitted at a mismatch:
    "target" (y_j, exact) or, as a deliberate fault, "draft" (x_j with its own row's coupled
    pick: the draft's Gumbel argmax). Greedy runs share no randomness: the walk's argmax rule."""

    coupling: Coupling
    emit: str = "target"

    def _position(self, task: VerifyTask, verdict: Verdict) -> int:
        """The output position j of the token decided next (the tokens emitted before it)."""
        return task.position + len(verdict.path)

    def _decide(
        self, task: Any, node: int, child: int, p_prime: Any, tried_tokens: list[int], verdict: Verdict, chooser: Any
    ) -> tuple[bool, Any]:
        if task.greedy:
            return super()._decide(task, node, child, p_prime, tried_tokens, verdict, chooser)
        return task.tokens[child] == self.coupling.pick(task.p[node + 1], self._position(task, verdict)), None

    def _update(self, node: int, child: int, p_prime: Any, q_c: Any, verdict: Verdict) -> Any:
        return p_prime  # the coupled repair is y_j, no residual draw

    def _draw(self, task: Any, node: int, kids: list[int], verdict: Verdict, chooser: Any) -> tuple[int, float | None]:
        if task.greedy:
            return super()._draw(task, node, kids, verdict, chooser)
        draft = kids and self.emit == "draft" and task.q is not None
        row = task.q[kids[-1]] if draft else task.p[node + 1]
        return self.coupling.pick(row, self._position(task, verdict)), None


def coupling_seed_of(config: Any) -> int | None:
    """The coupling seed a run recorded (RunConfig.proposer_params), None for an uncoupled run."""
    params = getattr(config, "proposer_params", None) or {}
    if params.get("verifier") != COUPLED_VERIFIER:
        return None
    seed = params.get("coupling_seed")
    return int(seed) if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) else None


def coupled_params(coupling: Coupling | None, greedy: bool) -> dict[str, Any]:
    """What a run records of its coupling: nothing when uncoupled or greedy (no randomness)."""
    if coupling is None or greedy:
        return {}
    return {"verifier": COUPLED_VERIFIER, "coupling_seed": coupling.seed}
