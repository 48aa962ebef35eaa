"""The checker's rules for tree rounds (core.check.checker calls them for a round whose draft is
not a chain).

A round that carries its tree facts (TreeInfo: recorded by the decoder, kept by the store
and by JSONL version 2) is proved step by step from them by core.check.walk, with full
vectors or top-N records. A round without them (a JSONL version-1 trace) is replayed as
follows. The walk is replayed from the trace alone: the p row each node was judged against, the q
row it was chosen from, the children mode (the run's proposer_params), each tried child's
recorded u and the repair/bonus draw go through the production TreeVerifier.walk with a
chooser that answers from the record. Every tried child's decision against its running p',
every residual update, the accepted path, the repair/bonus and the emitted tokens are then
compared with what was recorded; the first difference is the finding. The node positions,
mask rows and kept cache rows are proved wherever they were recorded.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from specscope.core.check.walk import prove_walk
from specscope.core.draft.trees import ancestor_matrix, node_depths
from specscope.core.sampling.partial import is_full
from specscope.core.sampling.reference import sample_from
from specscope.core.settings.vocab import CHILDREN_MODES
from specscope.core.verify.chain import VerifyTask
from specscope.core.verify.tree import TreeVerifier, check_children_mode


class _Unreplayable(Exception):
    """The trace lacks what the replay needs (`field`, a draw): not checked when the trace
    declares the field unrecorded, a finding when it records it elsewhere."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


UNKNOWN_TOKEN = -1  # a replayed repair or bonus whose distribution the trace did not record


class _ReplayChooser:
    """Answers the walk's decisions from the recorded draws."""

    def __init__(self, rnd: Any):
        self.u = {n.index: n.u for n in rnd.nodes}
        tail = [e for e in rnd.emitted if e.kind in ("repaired", "bonus")]
        self.draw = tail[0].draw if tail else None
        self.thresholds: dict[int, float] = {}

    def accept(self, probability: Any, node: int) -> tuple[bool, float | None]:
        u = self.u.get(node)
        if u is None:
            raise _Unreplayable(f"node {node} must be tried, but it has no recorded draw u", "u")
        self.thresholds[node] = float(probability)
        return u < probability, u

    def sample(self, dist: np.ndarray | None, node: int) -> tuple[int, float | None]:
        if self.draw is None or dist is None:  # no draw, or no leaf p (bonus_p): the token cannot be replayed
            return UNKNOWN_TOKEN, self.draw
        return sample_from(dist, self.draw), self.draw


def _task(chk: Any, mode: str) -> VerifyTask:
    rnd = chk.rnd
    nodes = rnd.nodes
    n = len(nodes)
    parents = tuple(int(x.parent) for x in nodes)
    rows: list[Any] = [None] * (n + 1)
    argmax = np.full(n + 1, -1)
    for x in nodes:
        rows[x.parent + 1] = x.p
        argmax[x.parent + 1] = x.target_argmax
    path = [x.index for x in nodes if x.status == "accepted"]
    leaf = path[-1] if path else -1
    if rnd.bonus_p is not None and rows[leaf + 1] is None:
        rows[leaf + 1] = rnd.bonus_p
        argmax[leaf + 1] = int(np.argmax(rnd.bonus_p))
    greedy = chk.config.sampling.greedy
    q = None if greedy else [x.q for x in nodes]
    return VerifyTask(
        tokens=tuple(int(x.token) for x in nodes),
        q=cast("np.ndarray | None", q),  # the walk only indexes the rows: the recorded ones, None where absent
        p=cast("np.ndarray", rows),
        argmax=argmax,
        greedy=greedy,
        eos_token_id=chk.config.eos_token_id,
        more_eos=chk.config.eos_ids,
        remaining=rnd.remaining_budget,
        stops=RecordedStop(getattr(rnd, "stop", None), _unrecorded_stop_end(chk)),
        parents=parents,
        children=check_children_mode(mode),
    )


def _unrecorded_stop_end(chk: Any) -> int | None:
    """Where an unrecorded stop may have ended the round (its last recorded token), or None
    when the trace says which stops the run had (and so whether this round met one)."""
    config, rnd = chk.config, chk.rnd
    unknown = config.end_unknown is not None
    ended_early = len(rnd.emitted) < rnd.remaining_budget  # a round that spent the budget ended by it
    return len(rnd.emitted) if unknown and ended_early and getattr(rnd, "stop", None) is None and chk.is_last else None


class RecordedStop:
    """The replayed walk ends where the round records its stop (core.check.stop_rules proves
    the record from the tokens); where the trace does not record its stops, the run's last
    round may have ended at one: the walk ends where its tokens end (`unknown_end`), and
    `assumed` says so, for the report's not-checked list."""

    def __init__(self, stop: Any, unknown_end: int | None = None):
        self.stop = stop
        self.unknown_end = unknown_end
        self.assumed = False

    def check(self, round_tokens: Any) -> Any:
        if self.stop is not None:
            return self.stop if len(round_tokens) - 1 == self.stop.position else None
        if self.unknown_end is not None and len(round_tokens) == self.unknown_end:
            self.assumed = True
            return "an unrecorded stop"
        return None


def children_mode(config: Any, rnd: Any) -> str | None:
    """How the round's siblings were chosen: its tree facts say, else the run's
    proposer_params; None when neither records it (a sampled walk then cannot be replayed)."""
    tree = getattr(rnd, "tree", None)
    if tree is not None:
        recorded: str | None = tree.children
        return recorded
    mode = config.proposer_params.get("children")  # free-form: a mode specscope does not know is no mode
    if isinstance(mode, str) and mode in CHILDREN_MODES:
        return mode
    return None


def tree_spec_of(config: Any, rnd: Any) -> str | None:
    """The tree spec the round declares (its tree facts, else the run's proposer_params)."""
    tree = getattr(rnd, "tree", None)
    spec = tree.spec if tree is not None and tree.spec else config.proposer_params.get("tree")
    return str(spec) if spec else None


def _shape(chk: Any, depths: list[int]) -> None:
    """The declared shape: no more nodes than the spec's budget, none deeper than its depth,
    no node with more children than the spec gives a node of its depth, and a dynamic tree's
    children are its top-k (never sampled)."""
    from specscope.core.draft.trees import TreeSpecError, _depths_of_slots, parse_tree

    rnd, text = chk.rnd, tree_spec_of(chk.config, chk.rnd)
    if text is None:
        chk.not_checked.setdefault("tree-shape", "the trace declares no tree spec (tree.spec or proposer_params.tree)")
        return
    try:
        spec = parse_tree(text)
    except TreeSpecError:
        chk.not_checked.setdefault("tree-shape", f"the declared tree spec {text!r} is not one specscope reads")
        return
    nodes, deepest = len(rnd.nodes), max(depths, default=0)
    if nodes > spec.nodes:
        chk.add("tree-shape", f"{nodes} nodes, but the tree {text!r} has a budget of {spec.nodes}")
    if deepest > spec.depth:
        at = depths.index(deepest)
        chk.add(
            "tree-shape",
            f"node {at} is at depth {deepest}, but the tree {text!r} is at most {spec.depth} deep",
            node=at,
        )
    if spec.kind == "dynamic":
        mode = children_mode(chk.config, rnd)
        if mode is not None and mode != "topk":
            chk.add(
                "tree-shape",
                f"a dynamic tree ({text!r}) keeps the most probable candidates, so its children are "
                f"its top-k, but the round's children are {mode}",
            )
        widest = {d: spec.topk for d in range(spec.depth + 1)}
    else:
        slot_depths = [0] + _depths_of_slots(spec.slots)  # slot -1 (the prefix) at index 0
        widest = {}
        for parent, _ in spec.slots:
            d = slot_depths[parent + 1]
            widest[d] = max(widest.get(d, 0), sum(1 for p, _ in spec.slots if p == parent))
    kids: dict[int, int] = {}
    for n in rnd.nodes:
        kids[n.parent] = kids.get(n.parent, 0) + 1
    for parent, count in sorted(kids.items()):
        depth = depths[parent] if parent >= 0 else 0
        if count > widest.get(depth, 0):
            chk.add(
                "tree-shape",
                f"{'the prefix' if parent < 0 else f'node {parent}'} has {count} children, but the "
                f"tree {text!r} gives a node at depth {depth} at most {widest.get(depth, 0)}",
                node=None if parent < 0 else parent,
            )
            break


def _distinct_siblings(chk: Any) -> bool:
    """Siblings drawn without replacement (distinct) or taken as the top-k are distinct
    tokens; False (after the finding) when some repeat, so the walk is not replayed."""
    mode = children_mode(chk.config, chk.rnd)
    if mode is None:
        chk.not_checked.setdefault(
            "distinct-siblings",
            "the trace does not say how a tree's siblings were chosen "
            "(tree.children or proposer_params.children): whether they must be distinct is "
            "not checked",
        )
    if mode not in ("distinct", "topk"):
        return True
    seen: dict[tuple[int, int], int] = {}
    for n in chk.rnd.nodes:
        first = seen.setdefault((n.parent, n.token), n.index)
        if first != n.index:
            chk.add(
                "distinct-siblings",
                f"node {n.index} repeats token {n.token} of its sibling {first}, but siblings "
                f"of a {mode} tree are drawn without replacement",
                node=n.index,
            )
            chk.not_checked.setdefault(
                "tree-walk",
                "a round whose siblings repeat a token where they may not is "
                "not replayed (its distinct-siblings finding says why)",
            )
            return False
    return True


def check_tree_round(chk: Any) -> None:
    """The shape, decisions, residual updates, path, repair/bonus and layout of one tree round."""
    rnd = chk.rnd
    try:
        depths = node_depths([n.parent for n in rnd.nodes])
    except ValueError:
        return  # round-structure reports a parent that does not precede its child
    _shape(chk, depths)
    if not _distinct_siblings(chk):
        _layout(chk)
        return
    if getattr(rnd, "tree", None) is not None:  # the tried order and every p' were recorded (core.check.walk)
        prove_walk(chk, chk.rnd.tree)
        _layout(chk)
        return
    greedy = chk.config.sampling.greedy
    mode = children_mode(chk.config, rnd)
    vectors = [n.p for n in rnd.nodes] + ([] if greedy else [n.q for n in rnd.nodes])
    if not greedy and not all(v is not None and is_full(v) for v in vectors):
        _not_replayed(
            chk,
            "a tree round without its recorded tree facts (tried order, p' updates: JSONL version 1) "
            "is replayed from full p and q vectors; the trace stored top-N only",
        )
        return
    if mode is None and not greedy:
        _not_replayed(
            chk,
            "a sampled tree round without its tree facts, in a run that does not record its children "
            "mode (proposer_params.children: sampled, distinct or topk), cannot be replayed",
        )
        return
    chooser = _ReplayChooser(rnd)
    task = _task(chk, mode or "topk")
    try:
        verdict = TreeVerifier().walk(task, chooser)
    except _Unreplayable as exc:
        if exc.field not in chk.config.unrecorded:  # the trace records it elsewhere: its absence here is the fault
            chk.add("tree-walk", f"the tree walk cannot be replayed from the trace: {exc}")
            _layout(chk)
        else:
            _not_replayed(chk, f"a tree round could not be replayed: {exc}")
        return
    if task.stops.assumed:
        chk.not_checked.setdefault(
            "tree-walk",
            "the run's last round ends where a stop the trace does not record may "
            "have ended it: its walk is replayed up to its last recorded token only",
        )
    _compare(chk, verdict, chooser)
    _layout(chk)


def _not_replayed(chk: Any, why: str) -> None:
    """The walk (its decisions, and so its residual updates and draws) cannot be replayed."""
    for rule in ("tree-walk", "residual", "draw"):
        chk.not_checked.setdefault(rule, why)
    _layout(chk)


def _compare(chk: Any, verdict: Any, chooser: _ReplayChooser) -> None:
    rnd = chk.rnd
    for n in rnd.nodes:
        want = verdict.statuses[n.index]
        if n.status != want:
            where = chooser.thresholds.get(n.index)
            against = f" with u={n.u:.6g} against the running min(1, p'/q)={where:.6g}" if where is not None else ""
            chk.add(
                "tree-walk",
                f"node {n.index} (token {n.token}) is {n.status}, the walk makes it {want}{against}",
                node=n.index,
            )
            return  # everything after the first difference follows from it
    got = [(e.token, e.kind, e.node) for e in rnd.emitted]
    want = [(e.token, e.kind, e.node) for e in verdict.emitted]
    if want and want[-1][0] == UNKNOWN_TOKEN and len(got) == len(want):  # no draw, or no distribution, for it
        if chooser.draw is None and "draw" not in chk.config.unrecorded and not chk.config.sampling.greedy:
            chk.add(
                "tree-walk",
                f"a {want[-1][1]} token is due, but no draw was recorded for it",
                chk.position_of(len(want) - 1),
            )
            return
        rules = ("tree-walk", "draw") + (("residual",) if want[-1][1] == "repaired" and rnd.residual is None else ())
        for rule in rules:  # the final p' shows only through the repair's draw when the residual is not recorded
            chk.not_checked.setdefault(
                rule,
                "a tree round's repair or bonus token: its draw or the distribution it "
                "was drawn from (bonus_p) was not recorded",
            )
        want[-1] = (got[-1][0],) + want[-1][1:]
    if got != want:
        at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        chk.add(
            "tree-walk",
            f"emitted {got[at:]} where the walk emits {want[at:]} (repair from the final p' after "
            "the rejections at its node; bonus from the leaf's p)",
            chk.position_of(at),
        )
        return
    if rnd.bonus_withheld != verdict.bonus_withheld and chk.recorded("bonus_withheld", "tree-walk"):
        chk.add("tree-walk", f"bonus_withheld is {rnd.bonus_withheld}, the walk says {verdict.bonus_withheld}")
    if verdict.residual is not None and rnd.residual is not None and is_full(rnd.residual):
        diff = float(np.max(np.abs(np.asarray(rnd.residual, dtype=np.float64) - verdict.residual)))
        if diff > max(chk.tol, 1e-9):
            chk.add(
                "residual",
                f"the recorded repair distribution is not the final p' of the walk (max diff {diff:.3g})",
                node=verdict.rejected_node,
            )


def _layout(chk: Any) -> None:
    """A round in memory: node positions, mask rows and the kept target cache rows."""
    rnd = chk.rnd
    tree = getattr(rnd, "tree", None)
    kept_known = tree is not None and "kept_rows" not in chk.config.unrecorded
    if not kept_known:
        chk.not_checked.setdefault(
            "target-cache",
            "a tree round records no kept cache rows (tree.kept_rows): which "
            "branch's rows the target cache kept is not checked",
        )
    if tree is None or (rnd.nodes and (not tree.positions or not tree.visible)):  # an empty tree has none to record
        chk.not_checked.setdefault(
            "tree-layout", "a tree round records no positions or mask rows (tree.positions, tree.visible)"
        )
    if tree is None:
        return
    parents = [n.parent for n in rnd.nodes]
    depths = node_depths(parents)
    for n, depth, pos in zip(rnd.nodes, depths, tree.positions):  # zip: nothing to check without positions
        if pos != rnd.prefix_len + depth - 1:
            chk.add(
                "tree-layout",
                f"node {n.index} at depth {depth} ran at position {pos}, not prefix length + depth "
                f"- 1 = {rnd.prefix_len + depth - 1}",
                node=n.index,
            )
            break
    seen = ancestor_matrix(parents)
    for n, row in zip(rnd.nodes, tree.visible):
        want = tuple(int(j) for j in np.flatnonzero(seen[n.index]))
        if tuple(row) != want:
            extra = sorted(set(row) - set(want))
            chk.add(
                "tree-layout",
                f"node {n.index}'s mask row sees nodes {list(row)}, not its ancestors {list(want)}"
                + (f" (also {extra}: not on its path)" if extra else ""),
                node=n.index,
            )
            break
    path = [n.index for n in rnd.nodes if n.status == "accepted"]
    kept, want_kept = tuple(tree.kept_rows), tuple(rnd.prefix_len + i for i in path)
    if kept_known and chk.rnd.target_cache.after > rnd.prefix_len and kept != want_kept:
        chk.add(
            "target-cache",
            f"the target cache kept rows {list(tree.kept_rows)} after the prefix, not the accepted "
            f"path's {[rnd.prefix_len + i for i in path]}: entries of another branch survived",
        )


def is_tree_round(config: Any, rnd: Any) -> bool:
    """A round of a tree draft: recorded as one, a run whose proposer drafts trees, or a
    draft that is not a chain."""
    return (
        getattr(rnd, "tree", None) is not None
        or bool(config.proposer_params.get("tree"))
        or any(n.parent != n.index - 1 for n in rnd.nodes)
    )


def recompute_rows(config: Any, rnd: Any, context: list[int], target: Any) -> tuple[dict[int, np.ndarray], Any]:
    """Deep replay of a round of any shape, independent of tree attention and of the caches:
    for each visited node, p from a plain forward over the context and its parent's path; the
    bonus row likewise after the accepted path. One forward per deepest path needed (a chain:
    one), whose rows serve every node on it. Returns (node -> fresh p, fresh bonus p or None)."""
    import torch

    from specscope.core.sampling.reference import process_logits

    parents = [n.parent for n in rnd.nodes]
    accepted = [n.index for n in rnd.nodes if n.status == "accepted"]
    wanted = {n.parent for n in rnd.nodes if n.status != "unvisited"}
    if rnd.bonus_p is not None:
        wanted.add(accepted[-1] if accepted else -1)
    device = next(target.parameters()).device
    after: dict[int, np.ndarray] = {}  # node -> p after it (-1: after the context)

    def path_to(node: int) -> list[int]:
        path: list[int] = []
        while node >= 0:
            path.insert(0, node)
            node = parents[node]
        return path

    for node in sorted(wanted, key=lambda n: -len(path_to(n))):  # deepest first: its rows serve its ancestors
        if node in after:
            continue
        path = path_to(node)
        tokens = context + [rnd.nodes[i].token for i in path]
        with torch.inference_mode():
            logits = target(torch.tensor([tokens], device=device)).logits[0, -(len(path) + 1) :]
        fresh = process_logits(logits.float().cpu().numpy(), config.sampling)
        for row, at in zip(fresh, [-1, *path]):
            after.setdefault(at, row)
    rows = {n.index: after[n.parent] for n in rnd.nodes if n.status != "unvisited"}
    bonus = after[accepted[-1] if accepted else -1] if rnd.bonus_p is not None else None
    return rows, bonus
