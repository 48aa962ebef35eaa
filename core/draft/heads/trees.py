"""Draft heads growing token trees, with core.draft.tree_draft's selection (grow_static,
grow_dynamic, select_dynamic, choose_children): only the steps that give q rows differ.

A recurrent head (EAGLE, EAGLE-3, MTP): the round first feeds the real entries (the target's
features, core.draft.heads.base) and the prefix's q comes from the last one's output. A node
at depth d pairs its parent's output (the prefix's for d = 1) with its own token, at position
real + d - 1 (where a chain puts its d-th draft step); expanding one depth is one head step
over those frontier nodes, each attending the real entries, its ancestors' entries and
itself. Those entries are built from the head's outputs, so after the round the cache is
cropped back to the real entries (`RecurrentHeadProposer.keep_path`), as after a chain.

Medusa: head d's distribution is the same for every node at depth d + 1 (the heads read the
last feature only), so one pass over the heads gives every depth's q row, and each node's
children are chosen from its depth's row (top-k, or i.i.d. / without replacement: exact, as
for any q the children are drawn from).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specscope.core.draft.tree_draft import TreeGrowth
from specscope.core.sampling.reference import SamplingConfig


@dataclass(frozen=True)
class TreeAttention:
    """Where a head step's new entries sit when they are tree nodes: their rotary positions
    and the columns each attends (the real entries, its ancestors' entries, itself)."""

    positions: torch.Tensor  # (n,) long
    allowed: torch.Tensor  # (n, held + n) bool


class HeadGrowth(TreeGrowth):
    """A recurrent head's growth. `root` is the output at the last real entry; the cache then
    holds `real` entries built from the target's features."""

    def __init__(
        self,
        head: Any,
        root: torch.Tensor,
        vocab_size: int,
        prefix_len: int,
        sampling: SamplingConfig,
        rng: np.random.Generator,
    ):
        super().__init__(prefix_len, sampling, rng)
        self.head, self.vocab_size = head, vocab_size
        self.source = f"the {head.kind} head"
        self.real = head.length
        self.outputs: dict[int, torch.Tensor] = {-1: root}  # candidate (-1: the prefix) -> the head's output there
        self.logits: dict[int, torch.Tensor] = {}  # expanded candidate (-1: the prefix) -> its logits row

    def root_q(self) -> torch.Tensor:
        return self.head_q(self.outputs[-1][None], [-1])[0]

    def head_q(self, hidden: torch.Tensor, candidates: list[int]) -> torch.Tensor:
        """(n, H) outputs of `candidates` -> (n, V) float64 q over the target's vocabulary (a
        reduced draft vocabulary's rows placed at its target ids, zero elsewhere). The logits
        rows are kept: the kept nodes' confidences are read from them."""
        logits = self.head.logits(hidden)
        self.logits.update(zip(candidates, logits, strict=True))
        q = self._q(logits)
        to_target = self.head.draft_to_target
        if to_target is None:
            return q
        full = torch.zeros((q.shape[0], self.vocab_size), dtype=torch.float64, device=q.device)
        return full.index_copy_(1, to_target, q)

    def confidence(self, kept: list[int]) -> tuple[float, ...]:
        """The head's T=1 probability for each kept node's token, from its parent's output (one
        logits pass over the distinct parents; a reduced vocabulary's rows at their target ids)."""
        if not kept:
            return ()
        parents = sorted({self.nodes[c].parent for c in kept})
        probs = torch.softmax(torch.stack([self.logits[p] for p in parents]).double(), dim=-1)
        draft_ids = self.head.draft_ids()
        tokens = [self.nodes[c].token for c in kept]
        # a reduced vocabulary: each token's column in the head's rows (a token outside it: q = 0)
        cols = tokens if draft_ids is None else [draft_ids.get(t, -1) for t in tokens]
        rows = [parents.index(self.nodes[c].parent) for c in kept]
        padded = torch.cat([probs, probs.new_zeros((probs.shape[0], 1))], dim=1)  # column -1: zero
        index = torch.tensor(rows, dtype=torch.long, device=probs.device)
        return tuple(padded[index, torch.tensor(cols, dtype=torch.long, device=probs.device)].tolist())

    def expand(self, frontier: list[int]) -> list[torch.Tensor]:
        held = self.head.length
        device = self.outputs[-1].device
        allowed = torch.from_numpy(self.visibility(frontier, held, self.real)).to(device)
        positions = torch.tensor(
            [self.real + self.nodes[c].depth - 1 for c in frontier], dtype=torch.long, device=device
        )
        features = torch.stack([self.outputs[self.nodes[c].parent] for c in frontier])[None]
        tokens = torch.tensor([[self.nodes[c].token for c in frontier]], dtype=torch.long, device=device)
        out = self.head.step(features, tokens, from_target=False, at=TreeAttention(positions, allowed))[0]
        for j, c in enumerate(frontier):
            self.outputs[c], self.rows[c] = out[j], held + j
        self.forwards += 1
        return list(self.head_q(out, frontier))


class DepthRowsGrowth(TreeGrowth):
    """Medusa's growth: q rows by depth (row d for the children of a node at depth d, row 0
    for the prefix's), computed once; expanding a depth runs nothing."""

    def __init__(
        self, depth_logits: list[torch.Tensor], prefix_len: int, sampling: SamplingConfig, rng: np.random.Generator
    ):
        super().__init__(prefix_len, sampling, rng)
        self.source = "a medusa head"
        self.depth_logits = depth_logits
        self.by_depth: list[torch.Tensor] = list(self._q(torch.stack(depth_logits))) if depth_logits else []
        self.forwards = 1

    def root_q(self) -> torch.Tensor:
        return self.by_depth[0]

    def expand(self, frontier: list[int]) -> list[torch.Tensor]:
        return [self.by_depth[self.nodes[c].depth] for c in frontier]

    def confidence(self, kept: list[int]) -> tuple[float, ...]:
        """Head d's T=1 probability for each kept node's token at depth d + 1."""
        if not kept:
            return ()
        probs = torch.softmax(torch.stack(self.depth_logits).double(), dim=-1)
        return _entries(
            probs, None, probs.shape[-1], [self.nodes[c].depth - 1 for c in kept], [self.nodes[c].token for c in kept]
        )


def _entries(
    probs: torch.Tensor, to_target: torch.Tensor | None, vocab_size: int, rows: list[int], tokens: list[int]
) -> tuple[float, ...]:
    """probs[row, token] for each pair, in one transfer; rows over a reduced vocabulary are
    first placed at their target ids (`to_target`)."""
    if to_target is not None:
        probs = torch.zeros((probs.shape[0], vocab_size), dtype=torch.float64, device=probs.device).index_copy_(
            1, to_target, probs
        )
    index = torch.tensor(rows, dtype=torch.long, device=probs.device)
    cols = torch.tensor(tokens, dtype=torch.long, device=probs.device)
    return tuple(probs[index, cols].tolist())
