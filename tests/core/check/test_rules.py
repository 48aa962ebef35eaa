"""core.check.rules: every checker rule is named once, with its severity, family and the
checks that produce it, and those checks exist."""

from __future__ import annotations

import pytest

from specscope.core.check import checker
from specscope.core.check.rules import (
    EVERY_CHECK,
    REGISTRY,
    ROUND_CHECKS,
    RULES,
    SEVERITY,
    WASTED_WORK,
    WRONG_OUTPUT,
    Rule,
    _rules,
    family_of,
)


def test_each_rule_names_its_severity_and_the_checks_that_produce_it():
    producers = set(EVERY_CHECK) | {"recompute"}
    for rule in REGISTRY.values():
        assert rule.severity in (WRONG_OUTPUT, WASTED_WORK), rule.name
        assert rule.checks and set(rule.checks) <= producers, rule.name
    assert all(callable(getattr(checker._RoundChecker, name, None)) for name in ROUND_CHECKS)


def test_the_tables_callers_read_are_columns_of_the_registry():
    assert list(RULES) == list(SEVERITY) == list(REGISTRY)
    assert SEVERITY["draft-cache"] == WASTED_WORK and RULES["eos"] == REGISTRY["eos"].text
    assert checker.Finding("r", 0, None, "draft-budget", "m").severity == WASTED_WORK


def test_families_group_the_cache_rules_and_leave_the_others_alone():
    assert {family_of(n) for n in ("target-cache", "draft-cache", "recompute", "prefix-continuity")} == {"cache"}
    assert family_of("eos") == "eos" and family_of("no-such-rule") == "no-such-rule"


def test_a_rule_cannot_be_named_twice():
    with pytest.raises(ValueError, match="named twice"):
        _rules(Rule("eos", "a", WRONG_OUTPUT, ("eos",)), Rule("eos", "b", WRONG_OUTPUT, ("eos",)))
