"""Every rule the checker can emit declares a severity (wrong output or wasted work); a rule
that raises becomes a named internal finding and the other rules and rounds are still
checked; an end line without a stop reason is unknown, not wrong."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from specscope.core.check import checker as checker_module
from specscope.core.check.checker import RULES, SEVERITY, WASTED_WORK, WRONG_OUTPUT, check_report
from specscope.core.records import RunEnd

CHECK_DIR = Path(checker_module.__file__).parent
# every way a rule name reaches a Finding: chk.add("rule", ...), self.fail("rule", ...),
# Finding(..., "rule", ...)
_EMITS = re.compile(r"""(?:\badd|\bfail)\(\s*"([a-z-]+)\"""")
_FINDINGS = re.compile(r"""\bFinding\(\s*[^"()]*?"([a-z-]+)\"""", re.S)


def emitted_rule_names() -> set[str]:
    names: set[str] = set()
    for path in CHECK_DIR.glob("*.py"):
        text = path.read_text()
        names |= set(_EMITS.findall(text)) | set(_FINDINGS.findall(text))
    return names


def test_every_rule_the_checker_can_emit_has_a_severity():
    emitted = emitted_rule_names()
    assert {
        "budget",
        "draft-budget",
        "tree-walk",
        "residual",
        "run-end",
        "internal",
        "recompute",
    } <= emitted  # the scan finds them
    assert emitted <= set(SEVERITY), sorted(emitted - set(SEVERITY))
    assert set(SEVERITY) == set(RULES)
    assert set(SEVERITY.values()) == {WRONG_OUTPUT, WASTED_WORK}


def _chain_run(max_new=12, seed=0):
    from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
    from tests.tiny_models import noisy_copy, tiny_lm

    target = tiny_lm("llama", vocab=64, seed=0, init_range=0.3)
    dec = SpeculativeDecoder(
        target, DraftModelProposer(noisy_copy(target, 0.3)), k=4, sampling=SamplingConfig(temperature=1.0)
    )
    return dec.generate([1, 2, 3, 4], max_new, seed=seed)


@pytest.fixture(scope="module")
def run():
    return _chain_run()


def test_a_rule_that_raises_is_an_internal_finding_and_the_rest_is_still_checked(run, monkeypatch):
    def broken(self):
        if self.rnd.index == 1:
            return None > 0  # TypeError: '>' not supported between instances of 'NoneType' and 'int'

    monkeypatch.setattr(checker_module._RoundChecker, "sampler", broken)
    report = check_report(run.config, run.rounds)
    assert [f.rule for f in report.findings] == ["internal"]
    internal = report.findings[0]
    assert internal.round == 1 and internal.severity == WRONG_OUTPUT
    assert "not supported" not in internal.message and "'sampler'" in internal.message
    assert "TypeError" in internal.message and "bug in the checker" in internal.message
    assert "internal: sampler" in report.not_checked
    # a real fault in a later round is still found: the other rules and rounds went on
    import dataclasses

    rounds = list(run.rounds)
    rounds[2] = dataclasses.replace(rounds[2], remaining_budget=rounds[2].remaining_budget + 5)
    found = check_report(run.config, rounds).findings
    assert {(f.round, f.rule) for f in found} >= {(1, "internal"), (2, "budget")}


def test_draft_past_the_budget_is_wasted_work(run):
    import dataclasses

    last = run.rounds[-1]
    rounds = list(run.rounds[:-1]) + [dataclasses.replace(last, k=last.remaining_budget + 2)]
    found = check_report(run.config, rounds).findings
    assert [(f.rule, f.severity) for f in found] == [("draft-budget", WASTED_WORK)]
    assert found[0].to_dict()["severity"] == WASTED_WORK


def test_an_end_line_without_a_stop_reason_is_not_checked_not_wrong(run):
    n = len(run.new_tokens)
    report = check_report(run.config, run.rounds, end=RunEnd("completed", None, n))
    assert report.findings == [] and "run-end" in report.not_checked
    wrong = check_report(run.config, run.rounds, end=RunEnd("completed", "eos", n))
    assert [f.rule for f in wrong.findings] == ["run-end"] and "run-end" not in wrong.not_checked


def test_the_first_round_past_the_position_limit_is_flagged(run):
    import dataclasses

    assert run.config.position_limit == 512  # the tiny target's max_position_embeddings, recorded
    assert check_report(run.config, run.rounds).findings == []
    prompt = len(run.config.prompt_ids)
    limit = prompt + 6  # the run emitted 12 tokens: it passes this limit once
    found = check_report(dataclasses.replace(run.config, position_limit=limit), run.rounds).findings
    assert [(f.rule, f.position, f.severity) for f in found] == [("position-limit", 6, WRONG_OUTPUT)]
    crossing = next(r for r in run.rounds if r.prefix_len + len(r.emitted) > limit)
    assert found[0].round == crossing.index
    unknown = check_report(dataclasses.replace(run.config, position_limit=None), run.rounds)
    assert unknown.findings == [] and "position-limit" in unknown.not_checked
