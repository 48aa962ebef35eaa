"""The fault zoo's layout bugs (listed in core.faults.zoo.FAULTS): each replaces one of the
three facts a tree layout (core.decode.layout.TreeLayout) rests on, the mask rows, the
positions or the kept cache rows, and calls fire() in the rounds where it changed something.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from specscope.core.decode.layout import TreeLayout

Fire = Callable[[], None]


@dataclass(frozen=True)
class _SiblingsSeeEachOther(TreeLayout):
    fire: Any = None

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


@dataclass(frozen=True)
class _PositionsByIndex(TreeLayout):
    fire: Any = None

    def positions(self, parents: tuple[int, ...], prefix_len: int) -> list[int]:
        wrong = [prefix_len + i for i in range(len(parents))]
        if wrong != super().positions(parents, prefix_len):
            self.fire()
        return wrong


@dataclass(frozen=True)
class _KeepsTheFirstBranch(TreeLayout):
    """Keeps the cache rows of the first child at each depth, whichever branch was accepted."""

    fire: Any = None

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


def _tree_layout(layout: Any, fault: str) -> TreeLayout:
    if not isinstance(layout, TreeLayout):
        raise ValueError(f"fault {fault!r} needs a tree proposer (a tree layout)")
    return layout


def sibling_mask(layout: Any, fire: Fire) -> TreeLayout:
    return _SiblingsSeeEachOther(_tree_layout(layout, "tree-sibling-mask").spec, fire)


def positions_by_index(layout: Any, fire: Fire) -> TreeLayout:
    return _PositionsByIndex(_tree_layout(layout, "tree-positions-by-index").spec, fire)


def wrong_branch_kv(layout: Any, fire: Fire) -> TreeLayout:
    return _KeepsTheFirstBranch(_tree_layout(layout, "tree-wrong-branch-kv").spec, fire)
