"""The trace checker: proves each round of a run right, or says where and why it is wrong.

It reads only the records (RunConfig + Rounds), so it works on traces from any decoder that
writes the specscope format. Distributions rebuilt from a top-N save carry a `partial`
attribute and a `known_ids` array; rules that need a full vector skip them, and rules
that need one entry use it only when that entry is known.

`recompute_findings` is the optional deep replay: with the target model at hand it
recomputes p for every round by a full forward over the recorded prefix, which catches
stale-cache bugs whose traces look self-consistent.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from specscope.core.check.coupled import coupling_of
from specscope.core.check.engine_values import nonfinite_findings
from specscope.core.check.rules import REGISTRY, ROUND_CHECKS, RULES, SEVERITY, WASTED_WORK, WRONG_OUTPUT, family_of  # noqa: F401 (RULES, SEVERITY, WASTED_WORK re-exported)
from specscope.core.check.stop_rules import StopRules
from specscope.core.check.tree_rules import check_tree_round, children_mode, is_tree_round, recompute_rows
from specscope.core.check.walk import prove_walk
from specscope.core.records import DraftNode, Round, RunConfig, RunEnd
from specscope.core.sampling.partial import VectorStats, entry_known, known_ids, max_abs_diff, vector_stats

DEFAULT_TOL = 1e-6


@dataclass(frozen=True)
class Finding:
    run_id: str
    round: int
    position: int | None  # output position (index among the new tokens), when one token is concerned
    rule: str
    message: str
    node: int | None = None

    @property
    def severity(self) -> str:
        """WRONG_OUTPUT or WASTED_WORK (core.check.rules: every rule declares one)."""
        return REGISTRY[self.rule].severity

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "severity": self.severity}

    def __str__(self) -> str:
        where = f"round {self.round}"
        if self.position is not None:
            where += f", position {self.position}"
        if self.node is not None:
            where += f", node {self.node}"
        return f"[{self.rule}] {where}: {self.message}"


@dataclass(frozen=True)
class FindingGroup:
    """A cause and the findings that follow from it (or repeat it) in later rounds."""

    cause: Finding
    follow_on: tuple[Finding, ...] = ()

    @property
    def rounds(self) -> tuple[int, int]:
        last = self.follow_on[-1].round if self.follow_on else self.cause.round
        return self.cause.round, last

    def summary(self) -> str:
        if not self.follow_on:
            return str(self.cause)
        first, last = self.rounds
        return f"{self.cause}  (+{len(self.follow_on)} follow-on finding(s) in rounds {first}-{last})"

    def to_dict(self) -> dict[str, Any]:
        return {"cause": self.cause.to_dict(), "follow_on": [f.to_dict() for f in self.follow_on]}


def group_findings(findings: Sequence[Finding]) -> list[FindingGroup]:
    """Root causes first: the first finding of each rule family is a cause; later findings of
    the same family follow on from it. Groups are ordered by their cause's round."""
    causes: dict[str, Finding] = {}
    follow: dict[str, list[Finding]] = {}
    for f in sorted(findings, key=lambda f: f.round):  # stable: a round keeps its rule order
        family = family_of(f.rule)
        if family in causes:
            follow[family].append(f)
        else:
            causes[family], follow[family] = f, []
    groups = [FindingGroup(cause, tuple(follow[family])) for family, cause in causes.items()]
    return sorted(groups, key=lambda g: g.cause.round)


@dataclass
class CheckReport:
    """What check_report() found, and which rules it could not run and why."""

    findings: list[Finding]
    not_checked: dict[str, str]  # rule -> why (an optional field the trace did not record)

    @property
    def groups(self) -> list[FindingGroup]:
        return group_findings(self.findings)

    def of_severity(self, severity: str) -> list[Finding]:
        return [f for f in self.findings if f.severity == severity]


def internal_finding(run_id: str, round_index: int, what: str, exc: BaseException) -> Finding:
    """A check that raised: named as the checker's own failure (its exception's type, never
    its text, is in the message), so it is not mistaken for a finding about the decoder."""
    return Finding(
        run_id,
        round_index,
        None,
        "internal",
        f"the checker failed while checking {what} ({type(exc).__name__}): it is not checked here; "
        "this is a bug in the checker, not necessarily in the decoder",
    )


class _RoundChecker:
    """Checks one round. Each round check is a method named in ROUND_CHECKS (core.check.rules);
    adding a rule = its Rule in core.check.rules.REGISTRY and the method that emits it."""

    def __init__(
        self,
        config: RunConfig,
        rnd: Round,
        out_start: int,
        tol: float,
        sink: list[Finding],
        *,
        position: int = 0,
        previous: Round | None = None,
        is_last: bool = False,
        caches: bool = True,
        not_checked: dict[str, str] | None = None,
    ):
        self.config, self.rnd, self.out_start, self.tol, self.sink = config, rnd, out_start, tol, sink
        self.position = position  # where the round stands in the run (0-based)
        self.previous = previous  # the round before it, if any
        self.is_last = is_last
        self.check_caches = caches
        self.not_checked = not_checked if not_checked is not None else {}
        self.prefix_broken = False  # set by continuity(): a round may be missing before this one

    def add(self, rule: str, message: str, position: int | None = None, node: int | None = None) -> None:
        self.sink.append(Finding(self.config.run_id, self.rnd.index, position, rule, message, node))

    def recorded(self, field: str, rule: str) -> bool:
        """Whether the trace recorded `field`; if not, note once that `rule` skipped it."""
        if field not in self.config.unrecorded:
            return True
        self.not_checked.setdefault(rule, f"field '{field}' not recorded")
        return False

    def position_of(self, emitted_index: int) -> int:
        return self.out_start + emitted_index

    # ---------------------------------------------------------------- structure (every shape)

    def structure(self) -> None:
        """What holds for every draft shape: parents precede their children, the accepted
        nodes are one root path and are what was emitted, at most one token follows them."""
        rnd = self.rnd
        nodes = rnd.nodes
        path: list[int] = []
        for n in nodes:
            if n.parent >= n.index or n.parent < -1:
                self.add(
                    "round-structure", f"node {n.index} has parent {n.parent}, which does not precede it", node=n.index
                )
            if n.status == "accepted":
                parent_ok = n.parent == -1 or (n.parent < len(nodes) and nodes[n.parent].status == "accepted")
                if not parent_ok:
                    self.add(
                        "round-structure",
                        f"node {n.index} was accepted although its parent {n.parent} was not",
                        node=n.index,
                    )
                path.append(n.index)
        depths = [nodes[i].depth for i in path]
        if len(set(depths)) != len(depths):
            self.add("round-structure", "accepted nodes do not form one root path (two accepted at the same depth)")
        rejected = [n.index for n in nodes if n.status == "rejected"]
        if rnd.rejected_node is not None and rnd.rejected_node not in rejected:
            self.add(
                "round-structure", f"round names node {rnd.rejected_node} as rejected but its status is not 'rejected'"
            )
        for i, n in enumerate(nodes):  # a child is visited only after its parent was accepted
            if n.parent == i - 1 and i > 0 and n.status != "unvisited" and nodes[i - 1].status != "accepted":
                self.add(
                    "round-structure", f"node {i} was visited after node {i - 1} was {nodes[i - 1].status}", node=i
                )
        self._emitted_follow(path)
        kinds = [e.kind for e in rnd.emitted]
        if "repaired" in kinds and not rejected:
            self.add(
                "round-structure",
                "a repair token was emitted although no draft token was rejected",
                self.position_of(kinds.index("repaired")),
            )

    def _emitted_follow(self, path: list[int]) -> None:
        """The accepted tokens come first and are the accepted path's; one repair or bonus at most after them."""
        rnd, nodes = self.rnd, self.rnd.nodes
        kinds = [e.kind for e in rnd.emitted]
        accepted_emitted = [e for e in rnd.emitted if e.kind == "accepted"]
        n_acc = len(accepted_emitted)
        if kinds[:n_acc] != ["accepted"] * n_acc:
            self.add("round-structure", f"emitted kinds out of order: {kinds}")
        for j, e in enumerate(accepted_emitted):
            if j >= len(path):
                self.add(
                    "round-structure",
                    "an accepted token was emitted with no accepted draft node behind it",
                    self.position_of(j),
                )
                break
            node = nodes[path[j]]
            if e.node != node.index or e.token != node.token:
                self.add(
                    "round-structure",
                    f"accepted token {e.token} does not match the proposed token {node.token} of node {node.index}",
                    self.position_of(j),
                    node.index,
                )
        if n_acc < len(path):
            self.add("round-structure", f"{len(path)} nodes accepted but only {n_acc} accepted tokens emitted")
        tail = rnd.emitted[n_acc:]
        if len(tail) > 1:
            self.add(
                "round-structure",
                f"{len(tail)} tokens follow the accepted ones; at most one repair or bonus may",
                self.position_of(n_acc + 1),
            )

    # ---------------------------------------------------------------- the walk (every shape)

    def shape(self) -> None:
        """The round's walk, proved by one proof for every shape (core.check.walk): a tree adds
        its shape, layout and recorded facts (core.check.tree_rules); a chain is the width-1 tree
        its record describes, decided by draws against p/q or, coupled, by the target's coupled
        pick (its Gumbel keys regenerated from the run's coupling seed: core.check.coupled)."""
        if is_tree_round(self.config, self.rnd):
            check_tree_round(self)
        else:
            prove_walk(self, coupling=coupling_of(self.config))

    # ---------------------------------------------------------------- recorded values (every shape)

    def values(self) -> None:
        """What each tried node's record must agree with, whatever the shape: its p(x) and q(x)
        scalars with its vectors, a q(x) > 0 for a token drawn from q, and (greedy) a target
        argmax that is the argmax of p, and an accepted proposal that is it."""
        greedy = self.config.sampling.greedy
        drawn = self._children_mode() in ("sampled", "distinct")  # a point mass (topk) may have q(x) = 0
        for n in self.rnd.nodes:
            if n.status == "unvisited":
                continue
            p_x = self._entry_or_scalar(n.p, n.token, n.p_token, "p_token")
            self._agrees(n, "p", n.p, p_x)
            if greedy:
                self._greedy_argmax(n, p_x)
                continue
            q_x = self._entry_or_scalar(n.q, n.token, n.q_token, "q_token")
            if q_x is None:
                continue
            if drawn and q_x <= 0:
                self.add("sampler", f"proposal {n.token} has q(x)=0: it cannot have been drawn from q", node=n.index)
            self._agrees(n, "q", n.q, q_x)

    def _children_mode(self) -> str | None:
        if not is_tree_round(self.config, self.rnd):
            return "sampled"
        return children_mode(self.config, self.rnd)

    def _entry_or_scalar(self, dist: np.ndarray | None, token: int, recorded: float | None, field: str) -> float | None:
        """p(x) or q(x): the recorded scalar, or the vector's entry when the trace left the scalar out."""
        if field not in self.config.unrecorded:
            return recorded
        return float(dist[token]) if dist is not None and entry_known(dist, token) else None

    def _agrees(self, n: DraftNode, name: str, dist: np.ndarray | None, scalar: float | None) -> None:
        if scalar is None or dist is None or not entry_known(dist, n.token):
            return
        entry = float(dist[n.token])
        if abs(entry - scalar) > self.tol:
            self.add(
                "acceptance-draw",
                f"recorded {name}(x)={scalar:.6g} differs from the {name} vector ({entry:.6g})",
                node=n.index,
            )

    def _greedy_argmax(self, n: DraftNode, p_x: float | None) -> None:
        best = _largest(n.p)
        if best is None:
            return
        best_id, best_p = best
        # an argmax outside the stored entries cannot be compared: top-N keeps the largest
        # entries, but an exact extra entry of a lower rank may be stored too
        argmax_p = float(n.p[n.target_argmax]) if entry_known(n.p, n.target_argmax) else None
        if argmax_p is not None and best_p > argmax_p + self.tol:
            self.add(
                "greedy",
                f"recorded argmax {n.target_argmax} is not the argmax of p ({best_id}, p={best_p:.6g})",
                node=n.index,
            )
        elif n.status == "accepted" and p_x is not None and best_p > p_x + self.tol:
            self.add(
                "greedy",
                f"accepted proposal {n.token} has p={p_x:.6g}, but token {best_id} has p={best_p:.6g}: "
                "it was not the argmax",
                node=n.index,
            )

    # ---------------------------------------------------------------- sampler

    def sampler(self) -> None:
        cfg = self.config.sampling
        for n in self.rnd.nodes:
            if cfg.greedy:
                # a greedy decision reads only the target's argmax: a q that another decoder
                # logged anyway (its draft's softmax) is information, not a sign of sampling
                continue
            for name, dist in (("q", n.q), ("p", n.p)):
                if dist is None:
                    if name == "q" and n.status != "unvisited":
                        self.recorded("q", "sampler")  # the filters on q: not checked, and said so
                    continue
                # the whole-vector rules need the vector's stats: a full vector, or a top-N
                # save that kept them (older saves: only the top-k rule applies)
                stats = vector_stats(dist)
                if stats is not None and not self._is_distribution(name, stats, n.index):
                    continue
                self._top_k(name, dist, n.index)
                if stats is not None:
                    self._top_p(name, stats, np.asarray(dist).shape[-1], n.index)

    def _is_distribution(self, name: str, stats: VectorStats, node: int) -> bool:
        if stats.minimum < 0:
            self.add(
                "sampler",
                f"{name} has a negative entry ({stats.minimum:.3g}): not a probability distribution",
                node=node,
            )
            return False
        if abs(stats.total - 1.0) > 1e-6:
            self.add("sampler", f"{name} sums to {stats.total:.6g}, not 1: not a probability distribution", node=node)
            return False
        return True

    def _top_p(self, name: str, stats: VectorStats, vocab: int, node: int) -> None:
        cfg = self.config.sampling
        # A full support can only survive top-p if dropping the least likely token
        # would leave less than top_p of the mass.
        if (
            cfg.top_p < 1.0
            and (not cfg.top_k or cfg.top_k >= vocab)
            and stats.support == vocab
            and stats.minimum <= 1.0 - cfg.top_p
        ):
            self.add(
                "sampler",
                f"{name} keeps all {vocab} tokens under top-p={cfg.top_p:g}, though a smaller set reaches the mass",
                node=node,
            )

    def _top_k(self, name: str, dist: np.ndarray, node: int) -> None:
        """Under top-k, the entry ranked k + 1 must be 0 unless it ties with the one ranked k
        (the filter keeps ties). A distribution rebuilt from a top-N save knows its N
        largest entries (plus exact extras at lower ranks), which decides this when N > k."""
        k = self.config.sampling.top_k
        if not k:
            return
        ids = known_ids(dist)
        values = np.asarray(dist) if ids is None else np.asarray(dist)[ids]
        with_mass = int(np.count_nonzero(values > 0))
        if with_mass <= k:  # nothing beyond the k-th (and no sort of a whole vocabulary)
            return
        ranked = np.sort(values)[::-1]
        if ranked[k] < ranked[k - 1]:
            if ids is None:
                message = f"{name} has {with_mass} tokens with mass but top-k is {k}"
            else:
                message = (
                    f"{name} has mass on more than top-k={k} tokens (the {k + 1}th largest of its stored "
                    f"entries is {ranked[k]:.3g})"
                )
            self.add("sampler", message, node=node)

    # ---------------------------------------------------------------- budget, EOS

    def positions(self) -> None:
        """The first round whose tokens need more positions than the target reads (the front
        ends refuse such runs: core.decode.factory.check_positions); unknown without a limit."""
        limit, rnd = self.config.position_limit, self.rnd
        if limit is None:
            self.not_checked.setdefault("position-limit", "the run records no position limit for its target")
            return
        needed = rnd.prefix_len + len(rnd.emitted)
        if rnd.prefix_len <= limit < needed:
            self.add(
                "position-limit",
                f"the round's tokens need {needed} positions, but the target reads at most {limit} "
                "(max_position_embeddings): what it decodes past that is not a model's output",
                self.position_of(limit - rnd.prefix_len),
            )

    def continuity(self) -> None:
        rnd, emitted = self.rnd, self.out_start
        prompt_len = len(self.config.prompt_ids)
        expected = self.previous.index + 1 if self.previous is not None else 0
        if rnd.index != expected:
            self.add(
                "prefix-continuity",
                f"round index {rnd.index} where {expected} was expected: "
                "a round is missing from the trace, or rounds are out of order",
            )
        if rnd.emitted_before != emitted or rnd.prefix_len != prompt_len + emitted:
            self.prefix_broken = True
            self.add(
                "prefix-continuity",
                f"round starts from a prefix of {rnd.prefix_len} tokens ({rnd.emitted_before} emitted before), "
                f"but the prompt plus earlier rounds make {prompt_len + emitted} ({emitted} emitted): "
                "a round is missing from the trace, or a round's tokens were not counted",
            )
        if not self.prefix_broken and rnd.remaining_budget != self.config.max_new_tokens - emitted:
            self.add(
                "budget",
                f"remaining budget {rnd.remaining_budget} where {self.config.max_new_tokens - emitted} was left",
            )

    def budget(self) -> None:
        rnd, cfg = self.rnd, self.config
        emitted_total_after = self.out_start + len(rnd.emitted)
        deepest = _deepest(rnd.nodes)
        # a tree round's k is no draft length (specscope records the budget left, another decoder
        # may record its node budget): a tree wastes work only by drafting deeper than the budget
        chain = not is_tree_round(cfg, rnd)
        if chain and "k" not in cfg.unrecorded and rnd.k > rnd.remaining_budget:
            self.add(
                "draft-budget",
                f"draft length k={rnd.k} exceeds the remaining budget {rnd.remaining_budget}: "
                f"{rnd.k - rnd.remaining_budget} draft token(s) could never be emitted",
            )
        elif deepest > rnd.remaining_budget:
            self.add(
                "draft-budget",
                f"the draft reaches depth {deepest} with only {rnd.remaining_budget} token(s) left "
                "of the budget: its deepest tokens could never be emitted",
            )
        if len(rnd.emitted) > rnd.remaining_budget:
            self.add(
                "budget",
                f"{len(rnd.emitted)} tokens emitted with only {rnd.remaining_budget} left of "
                f"max_new_tokens={cfg.max_new_tokens}",
                self.position_of(rnd.remaining_budget),
            )
        if self.recorded("budget_stop", "budget") and rnd.budget_stop != (emitted_total_after >= cfg.max_new_tokens):
            self.add(
                "budget",
                f"budget_stop flag is {rnd.budget_stop} after {emitted_total_after} of {cfg.max_new_tokens} tokens",
            )

    def eos(self) -> None:
        rnd, eos, is_last_round = self.rnd, self.config.eos_ids, self.is_last
        if "eos_token_id" in self.config.unrecorded:
            self.not_checked.setdefault("eos", "the trace does not say which token is EOS (config.eos_token_id)")
            return
        if not eos:
            if rnd.eos:
                self.add("eos", "the round is flagged EOS but the run has no EOS token")
            return
        tokens = rnd.tokens
        if any(t in eos for t in tokens):
            at = next(i for i, t in enumerate(tokens) if t in eos)
            if at < len(tokens) - 1:
                self.add("eos", f"{len(tokens) - 1 - at} token(s) emitted after EOS", self.position_of(at + 1))
            if not rnd.eos and self.recorded("eos", "eos"):
                self.add("eos", "EOS was emitted but the round is not flagged as the end", self.position_of(at))
            if not is_last_round:
                self.add("eos", "the run went on after EOS", self.position_of(at))
        elif rnd.eos:
            self.add("eos", "the round is flagged EOS but emitted no EOS token")

    # ---------------------------------------------------------------- caches

    def caches(self) -> None:
        if not self.check_caches:
            return
        if self.recorded("target_cache", "target-cache"):
            self._target_cache()
        self._draft_cache()

    def _target_cache(self) -> None:
        rnd, previous = self.rnd, self.previous
        # with the prefix broken here, a missing round explains a cache mismatch as well
        # as a stale cache does: the message names both
        either = "; or a round is missing from the trace before this one" if self.prefix_broken else ""
        committed = rnd.prefix_len + rnd.accepted
        final_len = rnd.prefix_len + len(rnd.emitted)
        tc = rnd.target_cache
        if previous is not None and tc.before != previous.target_cache.after:
            self.add(
                "target-cache",
                f"target cache starts at {tc.before}, the previous round left "
                f"{previous.target_cache.after}: the cache changed between rounds{either}",
            )
        if tc.after > committed:
            self.add(
                "target-cache",
                f"target cache holds {tc.after} positions but only {committed} are accepted: "
                f"{tc.after - committed} entr{'y' if tc.after - committed == 1 else 'ies'} of the rejected suffix "
                "survived",
            )
        elif tc.after + len(tc.pending) != final_len:
            # a cache shorter than the accepted prefix is fine while the pending tokens cover
            # the gap (transformers leaves the last accepted token pending at EOS/budget)
            below = f", cropped below the accepted prefix {committed}" if tc.after < committed else ""
            self.add(
                "target-cache",
                f"cache length {tc.after} + pending {len(tc.pending)} != committed length {final_len}{below}",
            )

    def _run_over(self) -> bool:
        """The last round of a run that ended at EOS or the budget: no round reads the caches
        again (a decoder that trims its draft cache lazily, at the next round's start, as
        transformers does, leaves it untrimmed here)."""
        rnd = self.rnd
        ended = (
            self._eos_before_rejection()
            or len(rnd.emitted) >= rnd.remaining_budget
            or self.config.end_unknown is not None
        )
        return self.is_last and ended

    def _eos_before_rejection(self) -> bool:
        """The round ended at an EOS (any of the run's) or a recorded stop (stop_rules checks it)."""
        eos = self.config.eos_ids
        return getattr(self.rnd, "stop", None) is not None or any(e.token in eos for e in self.rnd.emitted)

    def _draft_cache(self) -> None:
        rnd, previous = self.rnd, self.previous
        either = "; or a round is missing from the trace before this one" if self.prefix_broken else ""
        committed = rnd.prefix_len + rnd.accepted
        dc = rnd.draft_cache
        if dc is None:
            self.not_checked.setdefault(
                "draft-cache",
                "the trace records no draft cache (a proposer without one, or a decoder that does not record it)",
            )
            return
        if previous is not None and previous.draft_cache is not None and dc.before != previous.draft_cache.after:
            self.add(
                "draft-cache",
                f"draft cache starts at {dc.before}, the previous round left "
                f"{previous.draft_cache.after}: the cache changed between rounds{either}",
            )
        if dc.after > committed and not self._run_over():
            self.add(
                "draft-cache",
                f"draft cache holds {dc.after} positions but only {committed} are accepted: the rejected suffix was "
                "not cropped",
            )


def _largest(dist: np.ndarray | None) -> tuple[int, float] | None:
    """(id, value) of the largest entry: exact for full vectors and top-N saves alike."""
    if dist is None:
        return None
    ids = known_ids(dist)
    values = np.asarray(dist)
    if ids is not None:
        if not ids.size:
            return None
        at = int(ids[int(np.argmax(values[ids]))])
    else:
        at = int(np.argmax(values))
    return at, float(values[at])


def _deepest(nodes: Sequence[DraftNode]) -> int:
    """The depth of the deepest node, from the parents (a chain: its length); a parent that
    does not precede its child (round-structure's finding) counts as the prefix."""
    depth: list[int] = []
    for n in nodes:
        depth.append(depth[n.parent] + 1 if 0 <= n.parent < len(depth) else 1)
    return max(depth, default=0)


def check_report(
    config: RunConfig,
    rounds: Sequence[Round] | Iterable[Round],
    tol: float = DEFAULT_TOL,
    check_caches: bool | None = None,
    end: RunEnd | None = None,
) -> CheckReport:
    """Every violation of RULES in the run, in round order, and the rules it could not run.
    `end` is the run's end record, when the trace has one.

    `rounds` may be any iterable (a store's iter_rounds, a live generator): it is read once,
    in order, and only three rounds are held at a time (the one checked, the one before it
    and the one after it), so a run of any length is checked in bounded memory."""
    findings: list[Finding] = []
    not_checked: dict[str, str] = {}
    emitted = 0
    previous: Round | None = None
    last: Round | None = None
    caches = config.use_cache if check_caches is None else check_caches
    stops = StopRules(config, findings, not_checked, Finding)
    rounds = iter(rounds)
    rnd = next(rounds, None)
    i = 0
    while rnd is not None:
        following = next(rounds, None)  # one round ahead, so a round knows whether it is the last
        checker = _RoundChecker(
            config,
            rnd,
            emitted,
            tol,
            findings,
            position=i,
            previous=previous,
            is_last=following is None,
            caches=caches,
            not_checked=not_checked,
        )
        for name in ROUND_CHECKS:
            try:
                getattr(checker, name)()
            except Exception as exc:  # noqa: BLE001 - a checker bug of any kind: named, and the other rules and rounds go on
                findings.append(internal_finding(config.run_id, rnd.index, f"rule group '{name}'", exc))
                not_checked.setdefault(f"internal: {name}", f"the checker failed on round {rnd.index}")
        try:
            stops.round(rnd)
        except Exception as exc:  # noqa: BLE001 - a bug in the stop rules is a finding; the other rounds go on
            findings.append(internal_finding(config.run_id, rnd.index, "the stop rules", exc))
            not_checked.setdefault("internal: stops", f"the checker failed on round {rnd.index}")
        # after a broken prefix, later rounds are checked from the recorded one (one finding, not one per round)
        emitted = (rnd.emitted_before if checker.prefix_broken else emitted) + len(rnd.emitted)
        del checker  # it holds its round and the previous one: not kept while the next is read
        previous, last, rnd, i = rnd, rnd, following, i + 1
    findings.extend(nonfinite_findings(config, Finding))  # an engine's NaN/inf p or q, listed by its capture
    if end is not None:
        try:
            stops.end(end, last)
            _check_end(
                config, end, last, emitted, i, findings, not_checked, stopped=stops.at_stop or end.stop_reason == "stop"
            )
        except Exception as exc:  # noqa: BLE001 - a bug in the end-record rules is a finding, not a crash of the check
            findings.append(
                internal_finding(config.run_id, last.index if last is not None else 0, "the end record", exc)
            )
    return CheckReport(findings, not_checked)


def _check_end(
    config: RunConfig,
    end: RunEnd,
    last: Round | None,
    emitted: int,
    n_rounds: int,
    findings: list[Finding],
    not_checked: dict[str, str],
    stopped: bool = False,
) -> None:
    def add(message: str) -> None:
        findings.append(Finding(config.run_id, last.index if last is not None else 0, None, "run-end", message))

    ended_eos = last is not None and any(t in config.eos_ids for t in last.tokens)
    if end.new_tokens is not None and end.new_tokens != emitted:
        add(f"the end record counts {end.new_tokens} new tokens, the rounds emitted {emitted}")
    if end.status != "completed" or stopped:  # a stop's finish reason: core.check.stop_rules
        return
    if end.stop_reason is None:  # the format lets an end line leave it out: unknown, not wrong
        not_checked.setdefault("run-end", "the end record gives no stop_reason: why the run stopped is not checked")
    elif end.stop_reason == "eos" and "eos_token_id" in config.unrecorded:
        not_checked.setdefault("run-end", "the trace does not say which token is EOS: a stop at EOS is not checked")
    elif end.stop_reason == "eos" and not ended_eos:
        add("the run is marked as stopped at EOS, but its last round emitted no EOS")
    elif end.stop_reason == "budget" and emitted < config.max_new_tokens and not ended_eos:
        add(
            f"the run is marked as stopped by the budget after {emitted} of max_new_tokens={config.max_new_tokens} "
            "tokens, with no EOS: it stopped early"
        )
    elif end.stop_reason == "budget" and ended_eos:
        add("the run is marked as stopped by the budget, but it ended at EOS")
    elif end.stop_reason not in ("eos", "budget"):
        add(
            f"the run is marked completed with stop reason {end.stop_reason!r}: a completed run stops at EOS or the "
            "budget"
        )


def check_run(
    config: RunConfig,
    rounds: Sequence[Round] | Iterable[Round],
    tol: float = DEFAULT_TOL,
    check_caches: bool | None = None,
    end: RunEnd | None = None,
) -> list[Finding]:
    """Every violation of RULES in the run, in round order (check_report also says which
    rules could not run)."""
    return check_report(config, rounds, tol, check_caches, end).findings


def first_bad_round(findings: Sequence[Finding]) -> int | None:
    return min((f.round for f in findings), default=None)


def recompute_findings(config: RunConfig, rounds: Iterable[Round], target: Any, tol: float = 1e-4) -> list[Finding]:
    """Deep replay: recompute p for every node with a full target forward over the recorded
    prefix (no cache) and report the rounds whose recorded p differs beyond `tol`. `rounds`
    is read once, in order, one round held at a time."""
    findings: list[Finding] = []
    context = list(config.prompt_ids)
    for rnd in rounds:
        rows, bonus = recompute_rows(config, rnd, context, target)  # one plain forward per deepest path
        worst, where = 0.0, None
        for n in rnd.nodes:
            if n.status != "unvisited":
                d = max_abs_diff(n.p, rows[n.index])
                if d > worst:
                    worst, where = d, n.index
        if rnd.bonus_p is not None:
            d = max_abs_diff(rnd.bonus_p, bonus)
            if d > worst:
                worst, where = d, None
        if worst > tol:
            findings.append(
                Finding(
                    config.run_id,
                    rnd.index,
                    rnd.emitted_before,
                    "recompute",
                    f"recorded p differs from a full recompute of the target by {worst:.3g} (> {tol:g}): stale cache "
                    "state?",
                    where,
                )
            )
        context += rnd.tokens
    return findings
