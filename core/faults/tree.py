"""The fault zoo's tree bugs (registered in core.faults.FAULTS).

Each wraps a tree seam of the decoder: the tree verifier (core.tree_verify) or the tree
layout (core.tree_decode.TreeLayout: mask rows, positions, kept cache rows), and calls
fire() in the rounds where it changed something.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from specscope.core.decode.tree_decode import TreeLayout
from specscope.core.verify.tree import TreeVerifier
from specscope.core.verify.chain import residual_distribution

Fire = Callable[[], None]


def _tree_stale_residual(seams: Any, fire: Fire) -> Any:
    """After a rejected sibling, p' is not updated: the next sibling and the repair see p."""

    def stale(p: np.ndarray, q: np.ndarray):
        right, _ = residual_distribution(p, q)
        if float(abs(right - p).max()) > 1e-9:  # disjoint p' and q: the update changes nothing (rows: arrays or tensors)
            fire()
        return p, p.sum()  # p' stays p, and so does its mass: the record is wrong only where the update was due

    return dataclasses.replace(seams, tree_verifier=TreeVerifier(residual=stale))


class _SiblingsSeeEachOther(TreeLayout):
    def __init__(self, fire: Fire):
        self.fire = fire

    def visible(self, parents: tuple[int, ...]) -> np.ndarray:
        right = super().visible(parents)
        wrong = right.copy()
        for i, parent in enumerate(parents):
            for j in range(i):
                if parents[j] == parent:
                    wrong[i, j] = True  # an elder sibling leaks into the node's attention
        if not np.array_equal(wrong, right):
            self.fire()
        return wrong


class _PositionsByIndex(TreeLayout):
    def __init__(self, fire: Fire):
        self.fire = fire

    def positions(self, parents: tuple[int, ...], prefix_len: int) -> list[int]:
        wrong = [prefix_len + i for i in range(len(parents))]
        if wrong != super().positions(parents, prefix_len):
            self.fire()
        return wrong


class _KeepsTheFirstBranch(TreeLayout):
    """Keeps the cache rows of the first child at each depth, whichever branch was accepted."""

    def __init__(self, fire: Fire):
        self.fire = fire

    def kept_rows(self, prefix_len: int, path: list[int], parents: tuple[int, ...]) -> list[int]:
        first: list[int] = []
        node = -1
        for _ in path:
            kids = [i for i, par in enumerate(parents) if par == node]
            node = kids[0]
            first.append(node)
        if first != list(path):
            self.fire()
        return [prefix_len + i for i in first]


def _tree_sibling_mask(seams: Any, fire: Fire) -> Any:
    return dataclasses.replace(seams, tree_layout=_SiblingsSeeEachOther(fire))


def _tree_positions_by_index(seams: Any, fire: Fire) -> Any:
    return dataclasses.replace(seams, tree_layout=_PositionsByIndex(fire))


def _tree_wrong_branch_kv(seams: Any, fire: Fire) -> Any:
    return dataclasses.replace(seams, tree_layout=_KeepsTheFirstBranch(fire))


# (name, summary, when it can fire, inject)
TREE_FAULTS: tuple[tuple[str, str, str, Callable[[Any, Fire], Any]], ...] = (
    ("tree-stale-residual", "a sibling's residual is not updated after a rejection (p' stays p)",
     "a tree draft, sampling, a rejected child", _tree_stale_residual),
    ("tree-sibling-mask", "the tree mask lets a node see its elder siblings",
     "a tree draft with two children at one node", _tree_sibling_mask),
    ("tree-wrong-branch-kv", "the target cache keeps the first branch's rows instead of the accepted path's",
     "a tree draft whose accepted path leaves the first child", _tree_wrong_branch_kv),
    ("tree-positions-by-index", "tree nodes get position prefix + node index instead of prefix + depth - 1",
     "a tree draft with two nodes at one depth", _tree_positions_by_index),
)
