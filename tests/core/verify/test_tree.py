"""TreeVerifier on float arrays: what it records, greedy, EOS, budget, and a chi-square
test of sampled tree rounds against the exact target law at three sampler settings."""

import itertools
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import chisquare

from specscope.core.sampling.reference import SamplingConfig, process_logits, sample_from
from specscope.core.verify.tree import (
    CHILDREN_MODES,
    STALE_RESIDUAL,
    TreeTask,
    TreeVerifier,
    child_proposal,
    children_of,
)
from tests.core.verify.test_tree_oracle import ScriptedChooser

ALPHA = 1e-3


def frac(*xs):
    return np.array([Fraction(x) for x in xs], dtype=object)


def simple_task(**kw):
    # Three children of the prefix (tokens 0, 1, 2); node 1 has a child (token 3).
    base = dict(
        tokens=(0, 1, 2, 3), parents=(-1, -1, -1, 1), greedy=False, eos_token_id=None, remaining=4, children="sampled"
    )
    base.update(kw)
    p = np.array([[0.1, 0.2, 0.3, 0.4], [0.25] * 4, [0.7, 0.1, 0.1, 0.1], [0.25] * 4, [0.0, 0.0, 0.5, 0.5]])
    q = np.array([[0.4, 0.3, 0.2, 0.1]] * 3 + [[0.1, 0.1, 0.1, 0.7]])
    base.setdefault("p", p)
    base.setdefault("q", q)
    base.setdefault("argmax", p.argmax(axis=-1))
    return TreeTask(**base)


class Fixed:
    """A chooser with fixed decisions (accepts in order, then samples tokens)."""

    def __init__(self, accepts, samples=()):
        self.accepts, self.samples = list(accepts), list(samples)

    def accept(self, probability, node=None):
        return self.accepts.pop(0), 0.5

    def sample(self, dist, node=None):
        return self.samples.pop(0), 0.25


def test_children_and_tried_order():
    assert children_of((-1, -1, 0, 0, 1)) == {-1: [0, 1], 0: [2, 3], 1: [4], 2: [], 3: [], 4: []}
    with pytest.raises(ValueError, match="earlier node"):
        children_of((-1, 2, 0))


def test_walk_records_tried_order_draws_residuals_and_path():
    task = simple_task()
    verdict = TreeVerifier().walk(task, Fixed([False, True, True], samples=[2]))
    assert verdict.tried == {-1: [0, 1], 1: [3]}
    assert verdict.statuses == ["rejected", "accepted", "unvisited", "accepted"]
    assert verdict.draws == [0.5, 0.5, None, 0.5]
    assert verdict.path == [1, 3]
    # One residual update at the prefix, after child 0 was rejected.
    (update,) = verdict.updates
    assert (update.parent, update.child) == (-1, 0)
    np.testing.assert_allclose(update.p_after, [0, 0, 0.1, 0.3] / np.float64(0.4))
    assert update.mass == pytest.approx(0.4)
    # All accepted down to a leaf: the bonus from the leaf's row.
    assert [(e.token, e.kind) for e in verdict.emitted][:2] == [(1, "accepted"), (3, "accepted")]
    assert verdict.emitted[2].kind == "bonus" and verdict.rejected_node is None


def test_every_child_rejected_repairs_from_the_final_residual():
    task = simple_task(tokens=(0, 1, 0, 3))  # i.i.d. children may repeat a token
    verdict = TreeVerifier().walk(task, Fixed([False, False, False], samples=[3]))
    assert [u.child for u in verdict.updates] == [0, 1, 2]
    # After rejecting 0 then 1 then 0 again, p' keeps only what q cannot cover.
    assert verdict.final_p[0] == 0 and verdict.final_p[1] == 0
    assert verdict.rejected_node == 2 and verdict.emitted[-1].kind == "repaired"
    assert verdict.path == []


def test_proposal_per_mode():
    q = frac("1/2", "1/4", "1/4")
    assert list(child_proposal("sampled", q, [0], 1)) == list(q)
    assert list(child_proposal("distinct", q, [0], 1)) == [0, Fraction(1, 2), Fraction(1, 2)]
    assert list(child_proposal("topk", q, [0], 2)) == [0, 0, 1]
    with pytest.raises(ValueError, match="repeat"):
        child_proposal("distinct", q, [1], 1)


def test_topk_rejection_zeroes_the_child_and_renormalises():
    p = np.array([frac("1/2", "1/4", "1/4"), frac(0, 0, 1), frac(1, 0, 0)], dtype=object)
    q = np.array([frac(1, 0, 0), frac(1, 0, 0)], dtype=object)
    task = TreeTask(
        tokens=(0, 1),
        parents=(-1, -1),
        q=q,
        p=p,
        argmax=np.zeros(3, dtype=int),
        greedy=False,
        eos_token_id=None,
        remaining=3,
        children="topk",
    )
    chooser = ScriptedChooser([(False, Fraction(1, 2)), (False, Fraction(1, 2)), (2, Fraction(1))])
    verdict = TreeVerifier().walk(task, chooser)
    assert [list(u.p_after) for u in verdict.updates] == [[0, Fraction(1, 2), Fraction(1, 2)], [0, 0, 1]]
    assert verdict.emitted[0].token == 2


def test_greedy_follows_the_target_argmax():
    task = simple_task(greedy=True, q=None)
    # argmax at the prefix is 3 (no child has it): children 0, 1, 2 are rejected, repair 3.
    verdict = TreeVerifier().verify(task, np.random.default_rng(0))
    assert verdict.statuses[:3] == ["rejected"] * 3 and [e.token for e in verdict.emitted] == [3]
    p = simple_task().p.copy()
    p[0] = [0.1, 0.6, 0.2, 0.1]  # now child 1 matches, then its child 3 vs argmax of row 2
    task = simple_task(greedy=True, q=None, p=p, argmax=p.argmax(axis=-1))
    verdict = TreeVerifier().verify(task, np.random.default_rng(0))
    assert verdict.path == [1] and verdict.statuses == ["rejected", "accepted", "unvisited", "rejected"]
    assert [(e.token, e.kind) for e in verdict.emitted] == [(1, "accepted"), (0, "repaired")]
    assert verdict.draws == [None] * 4


def test_eos_on_an_interior_node_ends_the_round():
    task = simple_task(eos_token_id=1)
    verdict = TreeVerifier().walk(task, Fixed([False, True]))
    assert verdict.eos and [e.token for e in verdict.emitted] == [1]
    assert verdict.statuses[3] == "unvisited"  # nothing below EOS is tried


def test_budget_cuts_the_path_and_withholds_the_bonus():
    verdict = TreeVerifier().walk(simple_task(remaining=1), Fixed([False, True]))
    assert [e.token for e in verdict.emitted] == [1] and verdict.bonus_withheld
    assert verdict.statuses[3] == "unvisited"
    verdict = TreeVerifier().walk(simple_task(remaining=2), Fixed([False, True, True]))
    assert [e.kind for e in verdict.emitted] == ["accepted", "accepted"] and verdict.bonus_withheld


def chain_rule(task, rng):
    """The chain rule of Leviathan et al. written out for this test (the reference the walk
    must match on a chain): accept x_i iff u < min(1, p_i(x)/q_i(x)); at the first rejection
    the repair from normalise(max(p_i - q_i, 0)); all accepted, the bonus from p_n."""
    emitted, statuses, draws = [], ["unvisited"] * len(task.tokens), [None] * len(task.tokens)
    for i, x in enumerate(task.tokens):
        u = float(rng.random())
        draws[i] = u
        if u < min(1.0, task.p[i][x] / task.q[i][x]):
            statuses[i] = "accepted"
            emitted.append((x, "accepted", i))
            continue
        statuses[i] = "rejected"
        residual = np.maximum(task.p[i] - task.q[i], 0)
        emitted.append((sample_from(residual / residual.sum(), float(rng.random())), "repaired", i))
        return emitted, statuses, draws
    emitted.append((sample_from(task.p[len(task.tokens)], float(rng.random())), "bonus", None))
    return emitted, statuses, draws


def test_a_chain_task_is_verified_as_a_chain():
    """A task without parents is a chain: the one walk applies the chain rule to it."""
    from specscope.core.verify.chain import VerifyTask

    p = np.array([[0.1, 0.9], [0.5, 0.5], [0.3, 0.7]])
    q = np.array([[0.5, 0.5], [0.9, 0.1]])
    task = VerifyTask(tokens=(1, 0), q=q, p=p, argmax=p.argmax(-1), greedy=False, eos_token_id=None, remaining=5)
    kinds = set()
    for seed in range(40):
        emitted, statuses, draws = chain_rule(task, np.random.default_rng(seed))
        b = TreeVerifier().verify(task, np.random.default_rng(seed))
        assert [(e.token, e.kind, e.node) for e in b.emitted] == emitted
        assert b.statuses == statuses and b.draws == draws
        assert b.path == list(range(b.accepted))
        kinds |= {e.kind for e in b.emitted}
    assert kinds == {"accepted", "repaired", "bonus"}  # the seeds reach every branch of the rule


# ---------------------------------------------------------------------------- chi-square

VOCAB = 5
SHAPE = (2, 2)  # 2 children of the prefix, 2 under each: 6 nodes, depth 2
LENGTH = 3
SAMPLES = 6000
SETTINGS = [
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.8, top_k=3),
    SamplingConfig(temperature=1.3, top_p=0.8),
]


def float_tables(cfg, seed=0):
    rng = np.random.default_rng(seed)
    contexts = [c for n in range(LENGTH) for c in itertools.product(range(VOCAB), repeat=n)]
    p = {c: process_logits(rng.normal(0, 1.5, VOCAB), cfg) for c in contexts}
    q = {c: process_logits(rng.normal(0, 1.5, VOCAB), cfg) for c in contexts if len(c) < 2}
    return p, q


def sample_children(mode, q, count, rng):
    if mode == "topk":
        return [int(t) for t in np.argsort(-q, kind="stable")[:count]]
    out, left = [], q.copy()
    for _ in range(count):
        if not left.sum() > 0:
            break
        t = sample_from(left, float(rng.random()))
        out.append(t)
        if mode == "distinct":
            left[t] = 0
    return out


def sampled_round(verifier, mode, p_of, q_of, rng):
    nodes = []  # (token, parent, ctx)
    for t in sample_children(mode, q_of[()], SHAPE[0], rng):
        nodes.append((t, -1, ()))
    for i in range(len(nodes)):
        ctx = (nodes[i][0],)
        nodes.extend((t, i, ctx) for t in sample_children(mode, q_of[ctx], SHAPE[1], rng))
    task = TreeTask(
        tokens=tuple(t for t, _, _ in nodes),
        parents=tuple(par for _, par, _ in nodes),
        q=np.array([q_of[ctx] for _, _, ctx in nodes]),
        p=np.array([p_of[()]] + [p_of[ctx + (t,)] for t, _, ctx in nodes]),
        argmax=np.zeros(len(nodes) + 1, dtype=int),
        greedy=False,
        eos_token_id=None,
        remaining=LENGTH,
        children=mode,
    )
    seq = tuple(e.token for e in verifier.verify(task, rng).emitted)
    while len(seq) < LENGTH:
        seq += (sample_from(p_of[seq], float(rng.random())),)
    return seq


def fit(verifier, mode, cfg):
    p_of, q_of = float_tables(cfg)
    expected = {
        s: float(np.prod([p_of[s[:i]][s[i]] for i in range(LENGTH)]))
        for s in itertools.product(range(VOCAB), repeat=LENGTH)
    }
    rng = np.random.default_rng(1)
    counts: dict = {}
    for _ in range(SAMPLES):
        s = sampled_round(verifier, mode, p_of, q_of, rng)
        assert expected[s] > 0, s
        counts[s] = counts.get(s, 0) + 1
    big = [s for s, p in expected.items() if p * SAMPLES >= 5]
    observed, wanted = [counts.get(s, 0) for s in big], [expected[s] * SAMPLES for s in big]
    if SAMPLES - sum(wanted) > 0:
        observed.append(SAMPLES - sum(observed))
        wanted.append(SAMPLES - sum(wanted))
    return chisquare(observed, wanted).pvalue


@pytest.mark.slow
@pytest.mark.parametrize("mode", CHILDREN_MODES)
@pytest.mark.parametrize("cfg", SETTINGS, ids=lambda c: c.describe())
def test_sampled_tree_rounds_follow_the_target_law(mode, cfg):
    assert fit(TreeVerifier(), mode, cfg) > ALPHA


@pytest.mark.slow
@pytest.mark.parametrize("mode", CHILDREN_MODES)
def test_chi_square_detects_a_stale_residual(mode):
    assert fit(STALE_RESIDUAL, mode, SETTINGS[0]) < ALPHA
