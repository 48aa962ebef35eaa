"""One speculative round over a draft TREE (the decoder's tree branch).

draft tree (the proposer, one draft forward per depth) -> one target forward over the
pending context and every node (4D mask: each node sees the prefix and its ancestors;
position = prefix length + depth - 1) -> the TreeVerifier's walk -> both caches keep
exactly the accepted path (rows gathered by index) -> one TreeRound record.

As in a chain round (core.decoder), the p and q rows, every residual update p' and the draws
stay on the model's device as float64 torch tensors; the record gets the node scalars and
top-N TopDistributions (core.dists.compact_rows) in one transfer each, or the full rows
when the decoder keeps full vectors.

The target-cache contract is the chain's: after the round the cache holds the committed
context minus its pending tail (the repair or bonus), so the next forward starts from the
same logical prefix as a full recompute.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from specscope.core.sampling.device import target_rows
from specscope.core.sampling.dists import compact_rows, host_rows
from specscope.core.decode.kv import CachedLM
from specscope.core.records import CacheState, DraftNode, RoundTimings, TreeInfo, TreeRound  # noqa: F401 (TreeInfo, TreeRound re-exported)
from specscope.core.decode.tree_kv import keep_positions, masked_feed
from specscope.core.verify.tree import TreeTask, TreeVerdict, TreeVerifier, check_children_mode
from specscope.core.draft.trees import ancestor_matrix, context_and_tree, node_depths, tree_positions


class TreeLayout:
    """How a tree is laid out for the target: each node's visible nodes, its position, and
    the cache rows kept after the walk. The decoder's seam (`decoder.tree_layout`); the fault
    zoo replaces it."""

    def visible(self, parents: tuple[int, ...]) -> np.ndarray:
        return ancestor_matrix(parents)

    def positions(self, parents: tuple[int, ...], prefix_len: int) -> list[int]:
        return tree_positions(parents, prefix_len)

    def kept_rows(self, prefix_len: int, path: list[int], parents: tuple[int, ...]) -> list[int]:
        return [prefix_len + i for i in path]


def is_tree_proposer(proposer: Any) -> bool:
    return getattr(proposer, "tree", None) is not None


def tree_round(dec: Any, run_id: str, index: int, context: list[int], emitted_before: int, budget: int,
               rng: np.random.Generator) -> TreeRound:
    """One tree round of SpeculativeDecoder `dec` (its target, proposer, caches, sampling)."""
    clock, lm = dec.stopwatch, dec.target_lm
    remaining = budget - emitted_before
    prefix_len = len(context)
    target_before = lm.processed

    t0 = clock.now()
    draft = dec.proposer.propose(context, remaining, dec.sampling, rng)  # k = the depth cap for trees
    _check_draft(dec, draft)
    t1 = clock.now()
    layout = getattr(dec, "tree_layout", None) or TreeLayout()
    visible = layout.visible(draft.parents)
    positions = layout.positions(draft.parents, prefix_len)
    logits = _verify_forward(dec, lm, context, draft.tokens, visible, positions)  # (n + 1, V) on the model's device
    target_peak = lm.processed
    t2 = clock.now()

    rows = target_rows(logits, dec.sampling)  # float64, on the logits' device; checks the logits are finite
    p = rows.p
    q = None if draft.q is None else torch.as_tensor(draft.q, dtype=torch.float64).to(p.device)
    task = TreeTask(tokens=draft.tokens, q=q, p=p, argmax=rows.argmax, greedy=dec.sampling.greedy,
                    eos_token_id=dec.eos_token_id, remaining=remaining, parents=draft.parents,
                    # unnamed: the point-mass rule, exact however the children were picked
                    children=check_children_mode(draft.children or "topk"))
    verifier = getattr(dec, "tree_verifier", None) or TreeVerifier()
    verdict = verifier.verify(task, rng)
    path = list(getattr(verdict, "path", []))
    committed = prefix_len + len(path)
    kept = layout.kept_rows(prefix_len, path, draft.parents)
    _keep_target_path(dec, lm, prefix_len, kept, committed)
    if hasattr(dec.proposer, "keep_path"):
        dec.proposer.keep_path(path)
    draft_after = dec.proposer.observe(committed)
    final_context = context + [e.token for e in verdict.emitted]
    target_cache = _state(target_before, target_peak, lm.processed, final_context)
    draft_cache = None
    if draft.cache_before is not None and draft_after is not None:
        peak = draft.cache_peak if draft.cache_peak is not None else draft.cache_before
        draft_cache = _state(draft.cache_before, peak, draft_after, final_context)
    facts = dict(positions=tuple(positions), kept_rows=tuple(kept),
                 visible=tuple(tuple(int(j) for j in np.flatnonzero(row)) for row in visible))
    vectors = _Kept(dec, task, verdict)
    t3 = clock.now()
    return _record(dec, run_id, index, prefix_len, emitted_before, remaining, budget, task, verdict, draft,
                   target_cache, draft_cache, RoundTimings(draft_s=t1 - t0, verify_s=t2 - t1, bookkeeping_s=t3 - t2),
                   facts, vectors)


def _check_draft(dec: Any, draft: Any) -> None:
    node_depths(draft.parents)  # parents before children
    for t in draft.tokens:
        if not 0 <= t < dec.vocab_size:
            raise ValueError(f"proposer {dec.proposer.name!r} proposed token {t} outside the vocabulary")


def _verify_forward(dec: Any, lm: CachedLM, context: list[int], tokens: tuple[int, ...], visible: np.ndarray,
                    node_positions: list[int]) -> torch.Tensor:
    """One target forward over the pending context + every node; logits at the prefix and after
    each node (kept on the model's device)."""
    pending = dec.target_cache.pending(lm, context)
    cached = lm.processed
    allowed = context_and_tree(cached, len(pending), visible)
    positions = list(range(cached, cached + len(pending))) + list(node_positions)
    return masked_feed(lm, pending + list(tokens), positions, allowed, keep=len(tokens) + 1)


def _keep_target_path(dec: Any, lm: CachedLM, prefix_len: int, rows: list[int], committed: int) -> None:
    """The target cache keeps the prefix and the accepted nodes' rows, in path order."""
    if lm.cache is None:
        return
    if not keep_positions(lm, prefix_len, rows):
        lm.crop(prefix_len)  # cannot gather: the path is recomputed as pending tokens
    dec.target_cache.crop(lm, committed)


def _state(before: int, peak: int, after: int, final_context: list[int]) -> CacheState:
    return CacheState(before=before, peak=peak, after=after, pending=tuple(final_context[after:]))


class _Kept:
    """What the record keeps of the round's device rows: the full host vectors, or (the decoder's
    `vectors` setting, core.dists) TopDistributions keeping the entries the checker reads:
    each row's argmax, the tokens proposed from it and the token drawn from it; each p'
    after a rejection keeps every child of its node and the drawn token. Plus each node's
    scalars and each update's mass, computed on the device and moved together."""

    def __init__(self, dec: Any, task: TreeTask, verdict: TreeVerdict):
        n = len(task.tokens)
        device = task.p.device
        updates = list(getattr(verdict, "updates", ()))
        final = getattr(verdict, "final_p", None) if not task.greedy else None
        singles = [u.p_after for u in updates] + ([final] if final is not None else [])
        singles += [verdict.residual] if verdict.residual is not None else []
        blocks = [task.p] + ([task.q] if task.q is not None else [])
        if singles:  # a seam (the fault zoo) may hand back host arrays
            blocks.append(torch.stack([torch.as_tensor(r, dtype=torch.float64).to(device) for r in singles]))
        extras = self._extra_ids(task, verdict, updates, final is not None)
        sparse = dec.sampling.sparse_rows  # a top-k filter: every row has few nonzeros
        kept: list = []
        for block in blocks:  # block by block, one transfer each (as a chain round)
            if dec.full_vectors:
                kept.extend(host_rows(block))
            else:
                kept.extend(compact_rows(block, dec.top_n, extras[len(kept): len(kept) + block.shape[0]], sparse=sparse))
        masses = _host_floats([u.mass for u in updates], device)
        self.p = kept[: n + 1]
        at = n + 1 + (n if task.q is not None else 0)
        self.q = kept[n + 1: at] if task.q is not None else None
        self.updates = [dataclasses.replace(u, p_after=k, mass=m) for u, k, m in zip(updates, kept[at:], masses)]
        at += len(updates)
        self.final = kept[at] if final is not None else None
        self.residual = kept[-1] if verdict.residual is not None else None
        self.scalars = _node_scalars(task)

    @staticmethod
    def _extra_ids(task: TreeTask, verdict: TreeVerdict, updates: list, has_final: bool) -> list[list[int]]:
        n = len(task.tokens)
        tail = verdict.emitted[-1] if verdict.emitted and verdict.emitted[-1].kind != "accepted" else None
        drawn = [tail.token] if tail is not None else []
        p_extra = [[int(task.argmax[j])] for j in range(n + 1)]
        for i, token in enumerate(task.tokens):
            p_extra[task.parents[i] + 1].append(token)
        leaf = verdict.path[-1] if getattr(verdict, "path", None) else -1
        p_extra[leaf + 1] += drawn
        q_extra = [[t] for t in task.tokens] if task.q is not None else []
        siblings = {u.parent: [task.tokens[i] for i, par in enumerate(task.parents) if par == u.parent] for u in updates}
        # each p' keeps its node's children's entries: the next sibling is judged against it
        return (p_extra + q_extra + [siblings[u.parent] + drawn for u in updates] + ([drawn] if has_final else [])
                + ([drawn] if verdict.residual is not None else []))


def _host_floats(values: list, device: torch.device) -> list[float]:
    """Scalars (device tensors or host numbers) as host floats, in one transfer."""
    if not values:
        return []
    return torch.stack([torch.as_tensor(v, dtype=torch.float64).to(device).reshape(()) for v in values]).tolist()


def _node_scalars(task: TreeTask) -> np.ndarray:
    """(n, 3) host array: each node's p(x) in its parent's row, q(x) and sum min(p, q) (NaN
    without q), from the full device rows."""
    n = len(task.tokens)
    if n == 0:
        return np.zeros((0, 3))
    device = task.p.device
    rows = torch.as_tensor([par + 1 for par in task.parents], dtype=torch.long, device=device)
    tokens = torch.as_tensor(list(task.tokens), dtype=torch.long, device=device)
    p_tok = task.p[rows, tokens]
    if task.q is None:
        nan = torch.full_like(p_tok, float("nan"))
        return torch.stack([p_tok, nan, nan], dim=1).cpu().numpy()
    q_tok = task.q[torch.arange(n, device=device), tokens]
    overlap = torch.minimum(task.p.index_select(0, rows), task.q).sum(dim=-1)
    return torch.stack([p_tok, q_tok, overlap], dim=1).cpu().numpy()


def _nodes(task: TreeTask, verdict: TreeVerdict, kept: _Kept) -> tuple[DraftNode, ...]:
    """Scalars from the full rows; the vectors as kept."""
    depths = node_depths(task.parents)
    nodes = []
    for i, token in enumerate(task.tokens):
        row = task.parents[i] + 1  # the target row this node is judged against
        p_token, q_token, overlap = (float(x) for x in kept.scalars[i])
        has_q = task.q is not None
        nodes.append(DraftNode(
            index=i, token=token, parent=task.parents[i], depth=depths[i], p=kept.p[row],
            q=kept.q[i] if kept.q is not None else None,
            status=verdict.statuses[i], u=verdict.draws[i], p_token=p_token, q_token=q_token if has_q else None,
            ratio=(p_token / q_token) if has_q and q_token else None,
            overlap=overlap if has_q else None,
            target_argmax=int(task.argmax[row]),
        ))
    return tuple(nodes)


def _record(dec, run_id, index, prefix_len, emitted_before, remaining, budget, task, verdict, draft,
            target_cache, draft_cache, timings, facts, kept) -> TreeRound:
    path = tuple(getattr(verdict, "path", ()))
    bonus = any(e.kind == "bonus" for e in verdict.emitted)
    leaf = path[-1] if path else -1
    info = TreeInfo(
        spec=str(getattr(dec.proposer, "tree", "")),
        children=task.children,
        path=path,
        tried=tuple((node, tuple(kids)) for node, kids in getattr(verdict, "tried", {}).items()),
        updates=tuple(kept.updates),
        final_p=kept.final,
        **facts,
    )
    return TreeRound(
        run_id=run_id, index=index, prefix_len=prefix_len, emitted_before=emitted_before,
        remaining_budget=remaining, k=max(node_depths(task.parents), default=0), greedy=task.greedy,
        nodes=_nodes(task, verdict, kept),
        bonus_p=kept.p[leaf + 1] if bonus else None,
        rejected_node=verdict.rejected_node, residual=kept.residual, residual_mass=verdict.residual_mass,
        emitted=tuple(verdict.emitted), eos=verdict.eos,
        budget_stop=emitted_before + len(verdict.emitted) >= budget, bonus_withheld=verdict.bonus_withheld,
        target_cache=target_cache, draft_cache=draft_cache, timings=timings,
        draft_forwards=draft.forwards, target_forwards=1, tree=info,
    )
