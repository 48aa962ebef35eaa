"""The exact rational oracle for token trees.

For each children mode, every tree shape up to 3 children x depth 2 and several random
rational target/draft tables over a small vocabulary: every draft tree the proposer could
build is enumerated with its exact probability, and the production TreeVerifier.walk is
run on Fraction arrays with a chooser that enumerates every accept/reject decision and
every repair/bonus draw exactly. The round's output, completed by sampling the target,
must have exactly the target's law over 3-token continuations. The same enumeration must
catch a verifier whose residual is not updated after a rejection.
"""

import itertools
import random
from collections import defaultdict
from fractions import Fraction

import numpy as np
import pytest

from specscope.core.verify.tree import CHILDREN_MODES, STALE_RESIDUAL, TreeTask, TreeVerifier

LENGTH = 3  # continuations compared: depth 2 + the repair/bonus


def random_table(vocab: int, rng: random.Random, zeros: bool) -> np.ndarray:
    while True:
        weights = [rng.randint(0 if zeros else 1, 4) for _ in range(vocab)]
        if sum(weights) > 0:
            return np.array([Fraction(w, sum(weights)) for w in weights], dtype=object)


def tables(vocab: int, seed: int):
    """p for every context up to length 2, q for every context up to length 1."""
    rng = random.Random(seed)
    zeros = seed % 2 == 1  # half the tables have zero entries (disjoint supports)
    contexts = [c for n in range(LENGTH) for c in itertools.product(range(vocab), repeat=n)]
    p = {c: random_table(vocab, rng, zeros) for c in contexts}
    q = {c: random_table(vocab, rng, zeros) for c in contexts if len(c) < 2}
    return p, q


# A shape is a tuple of child shapes: ((), ()) = two leaves under the prefix.
def uniform_shape(b1: int, b2: int) -> tuple:
    return tuple(tuple(() for _ in range(b2)) for _ in range(b1))


SHAPES = {f"{b1}x{b2}": uniform_shape(b1, b2) for b1 in (1, 2, 3) for b2 in (0, 1, 2, 3)}
SHAPES.update({"ragged": ((), ((), ()), ((),)), "one-deep": (((), (), ()), ())})


def child_draws(mode: str, q: np.ndarray, count: int):
    """(children tokens in drawn order, probability) for `count` children from q."""
    vocab = len(q)
    if mode == "sampled":
        for toks in itertools.product(range(vocab), repeat=count):
            w = np.prod([q[t] for t in toks]) if toks else Fraction(1)
            if w > 0:
                yield toks, w
    elif mode == "topk":
        yield tuple(sorted(range(vocab), key=lambda t: (-q[t], t))[:count]), Fraction(1)
    else:  # without replacement; fewer children when the support runs out

        def rec(toks, w, left):
            support = [t for t in range(vocab) if q[t] > 0 and t not in toks]
            if left == 0 or not support:
                yield toks, w
                return
            rest = 1 - sum(q[t] for t in toks)
            for t in support:
                yield from rec(toks + (t,), w * q[t] / rest, left - 1)

        yield from rec((), Fraction(1), count)


def drafts(shape: tuple, mode: str, q_of: dict):
    """Every draft tree (nodes in breadth-first order) with its exact probability."""

    def rec(queue, nodes, weight):
        if not queue:
            yield nodes, weight
            return
        (parent, ctx, sub), rest = queue[0], queue[1:]
        for toks, w in child_draws(mode, q_of[ctx], len(sub)):
            new = [(t, parent, ctx) for t in toks]
            start = len(nodes)
            more = [(start + j, ctx + (t,), sub[j]) for j, t in enumerate(toks) if sub[j]]
            yield from rec(rest + more, nodes + new, weight * w)

    yield from rec([(-1, (), shape)], [], Fraction(1))


class Branch(Exception):
    def __init__(self, options):
        self.options = options


class ScriptedChooser:
    """Replays a decision script; at the first decision past it, raises its options."""

    def __init__(self, script):
        self.script = list(script)
        self.weight = Fraction(1)

    def _next(self, options):
        if not self.script:
            raise Branch(options)
        choice, w = self.script.pop(0)
        self.weight *= w
        return choice

    def accept(self, probability, node=None):
        return self._next([(True, probability), (False, 1 - probability)]), None

    def sample(self, dist, node=None):
        total = dist.sum()
        return self._next([(t, dist[t] / total) for t in range(len(dist))]), None


def walk_law(verifier, task):
    """Exact law of the emitted tokens of one round."""
    law = defaultdict(Fraction)
    stack = [[]]
    while stack:
        script = stack.pop()
        chooser = ScriptedChooser(script)
        try:
            verdict = verifier.walk(task, chooser)
        except Branch as b:
            stack.extend(script + [(c, w)] for c, w in b.options if w > 0)
            continue
        law[tuple(e.token for e in verdict.emitted)] += chooser.weight
    return law


def task_for(nodes, p_of, q_of, vocab, mode, remaining=LENGTH, eos=None):
    """The TreeTask of one draft: p after the prefix and after each node, q of each parent."""
    tokens = tuple(t for t, _, _ in nodes)
    p_rows = np.array([p_of[()]] + [p_of[ctx + (t,)] for t, _, ctx in nodes], dtype=object)
    q_rows = np.array([q_of[ctx] for _, _, ctx in nodes], dtype=object).reshape(len(nodes), vocab)
    return TreeTask(
        tokens=tokens,
        q=q_rows,
        p=p_rows,
        argmax=np.zeros(len(nodes) + 1, dtype=int),
        greedy=False,
        eos_token_id=eos,
        remaining=remaining,
        parents=tuple(par for _, par, _ in nodes),
        children=mode,
    )


def round_law(verifier, shape, mode, p_of, q_of, vocab, verify_as=None):
    """Exact law of the completed 3-token continuation after one tree round (children
    drawn by `mode`, verified by the rule of `verify_as`, default the same mode)."""
    out = defaultdict(Fraction)
    for nodes, weight in drafts(shape, mode, q_of):
        task = task_for(nodes, p_of, q_of, vocab, verify_as or mode)
        for emitted, w in walk_law(verifier, task).items():
            for tail in itertools.product(range(vocab), repeat=LENGTH - len(emitted)):
                seq, prob = emitted, weight * w
                for t in tail:
                    prob *= p_of[seq][t]
                    seq = seq + (t,)
                if prob:
                    out[seq] += prob
    return out


def target_law(p_of, vocab):
    law = {}
    for seq in itertools.product(range(vocab), repeat=LENGTH):
        law[seq] = np.prod([p_of[seq[:i]][seq[i]] for i in range(LENGTH)])
    return {s: w for s, w in law.items() if w}


def vocab_for(shape) -> int:
    # Three tokens wherever the enumeration stays small, two for the widest shapes.
    nodes = len(shape) + sum(len(c) for c in shape)
    return 3 if nodes <= 6 else 2


@pytest.mark.parametrize("mode", CHILDREN_MODES)
@pytest.mark.parametrize("shape_name", list(SHAPES))
def test_tree_round_emits_exactly_the_target_law(mode, shape_name):
    shape = SHAPES[shape_name]
    vocab = vocab_for(shape)
    for seed in range(3 if vocab == 3 else 2):
        p_of, q_of = tables(vocab, seed)
        law = round_law(TreeVerifier(), shape, mode, p_of, q_of, vocab)
        assert sum(law.values()) == 1
        assert dict(law) == target_law(p_of, vocab), (mode, shape_name, seed)


@pytest.mark.parametrize("mode", CHILDREN_MODES)
def test_stale_residual_is_detected(mode):
    caught = []
    for shape_name in ("2x0", "3x0", "2x1", "ragged"):
        shape = SHAPES[shape_name]
        for seed in range(4):
            p_of, q_of = tables(3, seed)
            law = round_law(STALE_RESIDUAL, shape, mode, p_of, q_of, 3)
            caught.append(dict(law) != target_law(p_of, 3))
    assert sum(caught) >= len(caught) // 2, caught


@pytest.mark.parametrize("drawn", ["sampled", "distinct"])
def test_the_point_mass_rule_is_exact_however_children_were_drawn(drawn):
    """The top-k rule (accept c with p'(c)) treats the children as given: exact for sampled
    children too (the decoder's rule for a draft that names no mode), only less efficient."""
    for shape_name in ("2x1", "ragged"):
        p_of, q_of = tables(3, 2)
        law = round_law(TreeVerifier(), SHAPES[shape_name], drawn, p_of, q_of, 3, verify_as="topk")
        assert dict(law) == target_law(p_of, 3)
