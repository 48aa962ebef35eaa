"""The checker's rules, each named once: what it says, how bad a finding of it is, its family
and the checks that produce it.

Severity: WRONG_OUTPUT, the run's tokens (or their record) may be wrong; WASTED_WORK, the
output stays right but compute was spent for nothing. `specscope check` exits non-zero for
wrong output, and for wasted work only with --strict.

Family: findings of one family in later rounds usually follow from the first one (a cache
that went wrong once stays wrong; a missing round shifts every later prefix), so
core.check.checker.group_findings groups them under it; a rule without one is its own.

Checks: where a finding of the rule comes from. The round checks are the methods of
core.check.checker._RoundChecker that ROUND_CHECKS runs, in its order ("values": each tried
node's recorded scalars against its vectors; "shape": the round's walk, core.check.walk, one
proof for chains and trees, plus a tree's shape and layout, core.check.tree_rules); "stops"
and "end" are core.check.stop_rules and the end record's check, "recompute" the deep replay
(checker.recompute_findings), "engine-values" the non-finite probabilities an engine's capture
lists (core.check.engine_values).

Adding a rule: one Rule below, and the method that emits it (named in ROUND_CHECKS when it
is a new round check).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from specscope.core.check.engine_values import RULE as NONFINITE
from specscope.core.check.engine_values import SUMMARY as NONFINITE_SUMMARY

WRONG_OUTPUT = "wrong output"
WASTED_WORK = "wasted work"

# The round checks, in the order they run on each round (a finding's order within a round
# follows it): the shape-free rules apply to every round; `shape` runs those of its draft shape.
ROUND_CHECKS: tuple[str, ...] = (
    "continuity",
    "positions",
    "structure",
    "values",
    "shape",
    "sampler",
    "budget",
    "eos",
    "caches",
)
EVERY_CHECK: tuple[str, ...] = ROUND_CHECKS + ("stops", "end", "engine-values")


@dataclass(frozen=True)
class Rule:
    name: str
    text: str  # what the rule says holds
    severity: str  # WRONG_OUTPUT or WASTED_WORK
    checks: tuple[str, ...]  # the checks that produce its findings (see the module docstring)
    family: str = ""  # findings that follow from an earlier one of the family ("": the rule's own)


def _rules(*rules: Rule) -> dict[str, Rule]:
    registry: dict[str, Rule] = {}
    for rule in rules:
        if rule.name in registry:
            raise ValueError(f"checker rule {rule.name!r} is named twice")
        registry[rule.name] = rule
    return registry


W, X = WRONG_OUTPUT, WASTED_WORK

REGISTRY: dict[str, Rule] = _rules(
    Rule(
        "prefix-continuity",
        "each round starts from the previous round's prefix plus its emitted tokens",
        W,
        ("continuity",),
        family="cache",
    ),
    Rule(
        "budget",
        "the output never exceeds max_new_tokens, and the budget left is counted from the tokens emitted",
        W,
        ("continuity", "budget"),
    ),
    Rule(
        "draft-budget", "k is capped to the remaining budget (a longer draft is verified for nothing)", X, ("budget",)
    ),
    Rule("eos", "EOS ends the output at once: nothing after it, no round after it", W, ("eos",)),
    Rule(
        "round-structure",
        "accepted tokens follow one root path of the draft; one repair at the first rejection; "
        "a bonus only if all were accepted",
        W,
        ("structure", "shape"),
    ),
    Rule(
        "acceptance-draw",
        "a stochastic decision is accepted iff u < min(1, p'(x)/q(x)), and the recorded p(x), q(x) are their vectors'",
        W,
        ("values", "shape"),
    ),
    Rule("residual", "the repair is drawn from normalise(max(p - q, 0))", W, ("shape",)),
    Rule(
        "draw",
        "a sampled repair or bonus is the token its recorded draw selects by inverse CDF, in token-id order",
        W,
        ("shape",),
    ),
    Rule(
        "greedy", "greedy: accept iff the proposal is argmax p; repair and bonus are argmax p", W, ("values", "shape")
    ),
    Rule(
        "sampler",
        "recorded p and q are distributions consistent with the run's sampler",
        W,
        ("values", "shape", "sampler"),
    ),
    Rule(
        "target-cache",
        "the target cache holds exactly the accepted prefix (plus the recorded pending tokens)",
        W,
        ("shape", "caches"),
        family="cache",
    ),
    # a draft cache that kept a rejected suffix only makes later proposals worse: the target decides
    Rule("draft-cache", "the draft cache keeps nothing of a rejected suffix", X, ("caches",), family="cache"),
    Rule(
        "recompute",
        "recorded p equals a full recompute of the target over the recorded prefix",
        W,
        ("recompute",),
        family="cache",
    ),
    Rule("run-end", "the run's end record agrees with its rounds: stop reason, token count, status", W, ("end",)),
    Rule(
        "coupled",
        "a coupled round: accept iff the proposal is y_j = argmax log p + G_j (keys regenerated from the "
        "coupling seed and the output position); the repair and the bonus are y_j",
        W,
        ("shape",),
    ),
    Rule(
        "tree-walk",
        "a tree round's recorded facts are its walk's: the tried order at each node, the accepted path, "
        "where each residual update was made",
        W,
        ("shape",),
    ),
    Rule(
        "tree-layout",
        "tree nodes ran at position prefix length + depth - 1, each seeing only its ancestors",
        W,
        ("shape",),
    ),
    Rule(
        "tree-shape",
        "a tree keeps its declared shape: no more nodes than its budget, no node deeper than its depth, "
        "the children mode its spec allows",
        W,
        ("shape",),
    ),
    Rule(
        "distinct-siblings",
        "siblings drawn without replacement (children mode distinct, or topk) are distinct tokens",
        W,
        ("shape",),
    ),
    Rule(
        "position-limit",
        "no round reads a position past the target's position limit (max_position_embeddings)",
        W,
        ("positions",),
    ),
    # the checker cannot vouch for what it failed to check
    Rule(
        "internal",
        "the checker itself failed on a round: the rule named in the message was not checked there",
        W,
        EVERY_CHECK,
    ),
    # stop strings and sequences, finish reason, end count (core.check.stop_rules): output past
    # a stop, a wrong finish reason or count
    Rule(
        "stop-leak",
        "a stop string or token sequence ends the output at the token that completes it: nothing after "
        "it, in the round (accepted block, repair, bonus) or in a later round",
        W,
        ("stops",),
    ),
    Rule(
        "stop-flag", "a round records the stop its tokens complete, where they complete it, and no other", W, ("stops",)
    ),
    Rule(
        "stop-budget",
        "the budget is counted on the tokens up to the stop: budget_stop is not set by tokens past it",
        W,
        ("stops",),
    ),
    Rule(
        "finish-reason",
        "the run's finish reason is the one its tokens show: eos, stop, budget (or cancelled)",
        W,
        ("end",),
    ),
    Rule("end-count", "the end record counts the emitted tokens up to the stop or EOS, none past it", W, ("end",)),
    Rule(NONFINITE, NONFINITE_SUMMARY, W, ("engine-values",)),
)
del W, X


class _Column(Mapping[str, str]):
    """One column of the registry as a read-only mapping from rule name (RULES: the text,
    SEVERITY: the severity); it follows the registry."""

    def __init__(self, attribute: str):
        self._attribute = attribute

    def __getitem__(self, name: str) -> str:
        return str(getattr(REGISTRY[name], self._attribute))

    def __iter__(self) -> Iterator[str]:
        return iter(REGISTRY)

    def __len__(self) -> int:
        return len(REGISTRY)


RULES: Mapping[str, str] = _Column("text")
SEVERITY: Mapping[str, str] = _Column("severity")


def family_of(rule: str) -> str:
    """The family a finding of `rule` belongs to (its own name when it has none)."""
    known = REGISTRY.get(rule)
    return (known.family or rule) if known is not None else rule
