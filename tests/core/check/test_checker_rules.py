"""Checker rules that the earlier checker lacked: each test builds a round with one realistic
bug (as that buggy decoder would have recorded it) and shows the finding; the unchanged
round passes. Also: root causes first, and the end record against the rounds."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.check.checker import check_report, check_run, group_findings
from specscope.core.faults.zoo import faulty_decoder
from specscope.core.records import EmittedToken, RunEnd
from specscope.core.sampling.draws import draw_mismatch
from specscope.core.sampling.partial import VectorStats
from specscope.storage.codec import PartialDistribution
from tests.tiny_models import noisy_copy, tiny_lm

T1 = SamplingConfig(temperature=1.0)
GREEDY = SamplingConfig(temperature=0)


@pytest.fixture(scope="module")
def models():
    target = tiny_lm("llama", vocab=64, seed=0, init_range=0.3)
    return target, noisy_copy(target, 0.3)


def rules(findings):
    return {f.rule for f in findings}


def run_with(models, cfg, want, seeds=range(60), k=4, max_new=30, draft=None):
    """The first run (and round) of a clean decoder where want(round) holds."""
    target, noisy = models
    dec = SpeculativeDecoder(target, DraftModelProposer(draft if draft is not None else noisy), k=k, sampling=cfg)
    for seed in seeds:
        out = dec.generate([1, 2, 3, 4, seed % 64], max_new, seed=seed)
        for i, r in enumerate(out.rounds):
            if want(r):
                assert check_run(out.config, out.rounds) == []
                return out, i
    raise AssertionError("no such round in the runs tried")


def with_round(out, i, rnd):
    return out.rounds[:i] + [rnd] + out.rounds[i + 1 :]


def partial(dist, n, stats=True, extra=()):
    dist = np.asarray(dist, dtype=np.float64)
    order = np.argsort(-dist, kind="stable")[:n]
    ids = np.unique(np.concatenate([order, np.asarray(extra, dtype=np.int64)]))
    values = np.zeros_like(dist)
    values[ids] = dist[ids]
    return PartialDistribution(values, ids, VectorStats.of(dist) if stats else None)


# ---------------------------------------------------------------- draws replayed


def test_a_repair_that_is_not_what_its_draw_selects_is_flagged(models):
    out, i = run_with(models, T1, lambda r: r.repair is not None and np.count_nonzero(r.residual > 0) > 1)
    rnd = out.rounds[i]
    repair = rnd.repair
    # the residual's most likely token (an argmax taken instead of a sample), or another
    # token with residual mass: both pass the residual rules, only the draw shows the bug
    other = next(int(t) for t in np.argsort(-rnd.residual) if rnd.residual[t] > 0 and t != repair.token)
    emitted = tuple(dataclasses.replace(e, token=other) if e.kind == "repaired" else e for e in rnd.emitted)
    broken = dataclasses.replace(rnd, emitted=emitted)
    findings = check_run(out.config, with_round(out, i, broken)[: i + 1])
    assert [f.rule for f in findings if f.round == i] == ["draw"], [str(f) for f in findings]
    assert f"selects token {repair.token}" in findings[0].message


def test_a_bonus_drawn_from_the_wrong_row_is_flagged(models):
    out, i = run_with(models, T1, lambda r: r.bonus is not None and np.count_nonzero(r.bonus_p > 0) > 1)
    rnd = out.rounds[i]
    other = next(int(t) for t in np.argsort(-rnd.bonus_p) if t != rnd.bonus.token)
    emitted = tuple(dataclasses.replace(e, token=other) if e.kind == "bonus" else e for e in rnd.emitted)
    findings = check_run(out.config, with_round(out, i, dataclasses.replace(rnd, emitted=emitted))[: i + 1])
    assert rules(findings) == {"draw"}


def test_draw_replay_on_top_n_proves_what_the_stored_entries_allow():
    dist = np.array([0.05, 0.4, 0.05, 0.3, 0.2])  # CDF in id order: .05 .45 .50 .80 1.0
    top2 = partial(dist, 2)  # known: ids 1 (0.4) and 3 (0.3); missing mass 0.3
    assert draw_mismatch(dist, 1, 0.3, 1e-9) is None
    assert "selects token 3" in draw_mismatch(dist, 1, 0.7, 1e-9)
    # top-N: u=0.7 -> x=0.7; before id 1 at least 0 and at most 0.3 unknown + 0.4 -> 0.7: not provable
    assert draw_mismatch(top2, 1, 0.69, 1e-9) is None
    # ... but u=0.95 is beyond anything id 1 can reach (0 + 0.3 + 0.4)
    assert "a later token is selected" in draw_mismatch(top2, 1, 0.95, 1e-9)
    # and id 4 cannot be chosen by u=0.5: ids 1 and 3 before it already hold 0.7
    assert "an earlier token is selected" in draw_mismatch(top2, 4, 0.5, 1e-9)


def test_top_n_draw_replay_flags_a_repair_in_a_top_n_trace(models):
    out, i = run_with(models, T1, lambda r: r.repair is not None and np.count_nonzero(r.residual > 0) > 3)
    rnd = out.rounds[i]
    res = np.asarray(rnd.residual)
    x = rnd.repair.draw
    cdf = np.cumsum(res)
    # a token whose whole CDF interval lies far from the draw, kept in the top-N list
    far = next(int(t) for t in np.argsort(-res) if res[t] > 0 and (cdf[t] < x - 0.05 or cdf[t] - res[t] > x + 0.05))
    top_n = partial(res, 3, extra=[far])
    nodes = tuple(
        dataclasses.replace(n, p=partial(n.p, 3, extra=[n.token]), q=partial(n.q, 3, extra=[n.token]))
        for n in rnd.nodes
    )
    clean = dataclasses.replace(rnd, nodes=nodes, residual=partial(res, 3, extra=[rnd.repair.token]))
    assert "draw" not in rules(check_run(out.config, with_round(out, i, clean)[: i + 1]))
    emitted = tuple(dataclasses.replace(e, token=far) if e.kind == "repaired" else e for e in rnd.emitted)
    broken = dataclasses.replace(clean, emitted=emitted, residual=top_n)
    assert "draw" in rules(check_run(out.config, with_round(out, i, broken)[: i + 1]))


# ---------------------------------------------------------------- bonus owed, withheld


def test_a_missing_bonus_is_a_finding(models):
    target, _ = models
    out, i = run_with(models, T1, lambda r: r.bonus is not None and r.accepted >= 1, draft=noisy_copy(target, 0.02))
    rnd = out.rounds[i]
    broken = dataclasses.replace(rnd, emitted=rnd.emitted[:-1])
    findings = check_run(out.config, out.rounds[:i] + [broken])
    assert any("no bonus token was emitted" in f.message for f in findings), [str(f) for f in findings]


def test_bonus_withheld_must_agree_with_the_budget(models):
    target, _ = models
    out, i = run_with(models, GREEDY, lambda r: r.bonus is not None, draft=noisy_copy(target, 0.02))
    rnd = out.rounds[i]
    lying = dataclasses.replace(rnd, bonus_withheld=True)
    findings = check_run(out.config, with_round(out, i, lying))
    assert [f.rule for f in findings] == ["round-structure"] and "bonus_withheld" in findings[0].message


# ---------------------------------------------------------------- greedy and residual facts on top-N


def test_greedy_argmax_is_checked_from_the_stored_top_1(models):
    out, i = run_with(models, GREEDY, lambda r: r.accepted >= 1)
    rnd = out.rounds[i]
    node = rnd.nodes[0]
    p = np.asarray(node.p).copy()
    runner_up = int(np.argsort(-p)[1])
    p[[node.token, runner_up]] = p[[runner_up, node.token]]  # the accepted token is now second
    nodes = (dataclasses.replace(node, p=partial(p, 4, extra=[node.token]), p_token=float(p[node.token])),) + rnd.nodes[
        1:
    ]
    findings = check_run(out.config, with_round(out, i, dataclasses.replace(rnd, nodes=nodes)))
    assert "greedy" in rules(findings)
    assert any("is not the argmax of p" in f.message for f in findings)


def test_residual_facts_are_checked_on_top_n_traces(models):
    out, i = run_with(models, T1, lambda r: r.repair is not None)
    rnd = out.rounds[i]
    res = np.asarray(rnd.residual)
    for stats, words in (
        (VectorStats(int((res > 0).sum()), -0.01, 1.0), "negative entry"),
        (VectorStats(int((res > 0).sum()), 0.0, 0.93), "sums to 0.93"),
    ):
        ids = np.argsort(-res)[:3]
        values = np.zeros_like(res)
        values[ids] = res[ids]
        broken = dataclasses.replace(rnd, residual=PartialDistribution(values, ids, stats))
        findings = check_run(out.config, with_round(out, i, broken)[: i + 1])
        assert any(f.rule == "residual" and words in f.message for f in findings), [str(f) for f in findings]


def test_a_negative_entry_is_named_as_such(models):
    out, i = run_with(models, T1, lambda r: len(r.nodes) > 0)
    rnd = out.rounds[i]
    node = rnd.nodes[0]
    q = np.asarray(node.q).copy()
    low = int(np.argmin(np.where(q > 0, q, 2)))
    q[low] = -0.001
    nodes = (dataclasses.replace(node, q=q),) + rnd.nodes[1:]
    findings = check_run(out.config, with_round(out, i, dataclasses.replace(rnd, nodes=nodes)))
    assert any("q has a negative entry" in f.message for f in findings), [str(f) for f in findings]


# ---------------------------------------------------------------- how the run ends


def test_the_end_record_must_agree_with_the_rounds(models):
    target, draft = models
    out = SpeculativeDecoder(target, DraftModelProposer(draft), k=3, sampling=T1).generate([1, 2, 3], 20, seed=1)
    n = len(out.new_tokens)
    assert check_run(out.config, out.rounds, end=RunEnd("completed", "budget", n)) == []
    early = check_run(out.config, out.rounds[:-1], end=RunEnd("completed", "budget", None))
    assert [f.rule for f in early] == ["run-end"] and "stopped early" in early[0].message
    miscounted = check_run(out.config, out.rounds, end=RunEnd("completed", "budget", n + 3))
    assert [f.rule for f in miscounted] == ["run-end"]
    no_eos = check_run(out.config, out.rounds, end=RunEnd("completed", "eos", n))
    assert [f.rule for f in no_eos] == ["run-end"]
    assert check_run(out.config, out.rounds[:-1], end=RunEnd("interrupted", "cancelled", None)) == []


# ---------------------------------------------------------------- root cause first


def test_one_wrong_crop_is_one_cause_with_follow_on_findings(models):
    target, draft = models
    dec = faulty_decoder("target-crop-off-by-one", target, DraftModelProposer(draft), k=4, sampling=GREEDY)
    for seed in range(20):
        out = dec.generate([1, 2, 3, 4, seed], 40, seed=seed)
        if dec.fault_rounds and dec.fault_rounds[0] < len(out.rounds) - 3:
            break
    findings = check_run(out.config, out.rounds)
    groups = group_findings(findings)
    assert groups[0].cause.round == dec.fault_rounds[0] and groups[0].cause.rule == "target-cache"
    assert len(groups) == 1 and len(groups[0].follow_on) == len(findings) - 1 >= 2
    assert "follow-on" in groups[0].summary()


def test_a_dropped_round_is_one_finding_that_names_both_causes(models):
    target, draft = models
    out = SpeculativeDecoder(target, DraftModelProposer(draft), k=3, sampling=T1).generate([1, 2, 3], 40, seed=3)
    assert len(out.rounds) > 6
    dropped = out.rounds[:3] + out.rounds[4:]
    findings = check_run(out.config, dropped)
    assert {f.round for f in findings} == {4}, [str(f) for f in findings]
    assert any("a round is missing" in f.message for f in findings)
    assert len(group_findings(findings)) == 1


# ---------------------------------------------------------------- fields a trace did not record


def test_unrecorded_fields_skip_their_rules_and_say_so(models):
    out, _ = run_with(models, T1, lambda r: r.repair is not None)
    minimal = dataclasses.replace(
        out.config, unrecorded=frozenset({"u", "draw", "target_cache", "eos", "budget_stop", "bonus_withheld"})
    )
    stripped = [
        dataclasses.replace(
            r,
            nodes=tuple(dataclasses.replace(n, u=None) for n in r.nodes),
            emitted=tuple(EmittedToken(e.token, e.kind, e.node, None) for e in r.emitted),
            budget_stop=False,
            bonus_withheld=False,
            eos=False,
        )
        for r in out.rounds
    ]
    report = check_report(minimal, stripped)
    assert report.findings == []
    assert {"acceptance-draw", "draw", "target-cache", "budget"} <= set(report.not_checked)
    assert "not recorded" in report.not_checked["acceptance-draw"]
    # the same stripped rounds in a trace that claims to record everything are findings
    assert check_run(out.config, stripped)
