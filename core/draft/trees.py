"""Draft tree shapes, and the attention mask and positions a tree is run with.

A tree spec is a short string:

    3,2,1,1                        static: 3 children of the prefix, 2 under each, then 1, 1
    3,2,1,1,nodes=12               the same, cut to its first 12 nodes (breadth first)
    paths:0;0.0;1;0.1;0.0.0        explicit paths (Medusa-style choices): each path is the
                                   ranks of its nodes among their siblings, dot-separated
    dynamic:nodes=16,depth=5,topk=4
                                   EAGLE-2: at each depth expand the `topk` best frontier nodes
                                   by cumulative draft log-probability, `topk` children each;
                                   keep the `nodes` best of all candidates
    dynamic:nodes=auto,depth=5,topk=4
                                   the same, the number kept chosen each round by cost: as many
                                   of the best candidates as maximise the expected tokens per
                                   second (core.decode.draft_length.CostPolicy.tree_budget): a chain when
                                   the draft is sure, wider where it is not

A static shape is a list of slots (parent slot, rank) in breadth-first order; rank r is the
r-th child drawn (or the r-th most probable for top-k children). A rank r > 0 needs its
sibling r - 1, and a path needs its parent: children are tried in drawn order, so every
drawn child is in the tree.

Tree attention: each node attends the committed prefix and its ancestors (itself included);
its position is prefix length + depth - 1, where it would sit in the accepted sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from specscope.core.settings.bounds import BOUNDS, MAX_TREE_NODES
from specscope.core.verify.tree import check_children_mode

if TYPE_CHECKING:
    import torch

MAX_NODES = MAX_TREE_NODES  # a tree wider than this is almost surely a typo
SLOT_ROOT = -1


class TreeSpecError(ValueError):
    """A tree spec that cannot be parsed; the message says what to write."""


@dataclass(frozen=True)
class TreeSpec:
    kind: str  # "static" | "dynamic"
    text: str
    slots: tuple[tuple[int, int], ...] = ()  # static: (parent slot, rank), breadth first
    nodes: int = 0  # node budget
    depth: int = 0  # maximum depth
    topk: int = 0  # dynamic: frontier width and children per expanded node
    nodes_by_cost: bool = False  # dynamic nodes=auto: each round keeps what pays (`nodes` is then the cap)

    def __str__(self) -> str:
        return self.text

    def children_counts(self) -> dict[int, int]:
        """Static: slot -> number of child slots (the prefix is SLOT_ROOT)."""
        counts: dict[int, int] = {}
        for parent, _ in self.slots:
            counts[parent] = counts.get(parent, 0) + 1
        return counts


def _positive_int(value: str, what: str, text: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise TreeSpecError(f"tree {text!r}: {what} must be an integer, got {value!r}") from None
    if number < 1:
        raise TreeSpecError(f"tree {text!r}: {what} must be >= 1, got {number}")
    bound = BOUNDS.get(f"tree_{what}")  # depth, topk: a dynamic tree's growth (the node budget: _check_size)
    if bound is not None and (problem := bound.problem(number)) is not None:
        raise TreeSpecError(f"tree {text!r}: {what} {problem}")
    return number


def _options(items: list[str], allowed: tuple[str, ...], text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in allowed:
            raise TreeSpecError(
                f"tree {text!r}: unexpected {item.strip()!r} (allowed: {', '.join(k + '=N' for k in allowed)})"
            )
        out[key] = _positive_int(value.strip(), key, text)
    return out


def parse_tree(text: str | TreeSpec) -> TreeSpec:
    """Parse a tree spec (see the module docstring); errors say what to write."""
    if isinstance(text, TreeSpec):
        return text
    text = str(text).strip()
    if not text:
        raise TreeSpecError("an empty tree spec: write e.g. 3,2,1 or dynamic:nodes=16,depth=5,topk=4")
    head, colon, rest = text.partition(":")
    if colon and head.strip() == "dynamic":
        items = [i for i in rest.split(",") if i.strip()]
        by_cost = [i for i in items if i.replace(" ", "") == "nodes=auto"]
        opts = _options([i for i in items if i not in by_cost], ("nodes", "depth", "topk"), text)
        missing = [k for k in ("nodes", "depth", "topk") if k not in opts and not (k == "nodes" and by_cost)]
        if missing:
            needs = ", ".join(m + ("=N|auto" if m == "nodes" else "=N") for m in missing)
            raise TreeSpecError(f"tree {text!r}: dynamic trees need {needs}")
        if (by_cost and "nodes" in opts) or len(by_cost) > 1:
            raise TreeSpecError(f"tree {text!r}: give nodes once (a number, or auto)")
        depth, topk = opts["depth"], opts["topk"]
        nodes = min(candidate_count(depth, topk), MAX_NODES) if by_cost else opts["nodes"]
        _check_size(nodes, text)
        return TreeSpec("dynamic", text, nodes=nodes, depth=depth, topk=topk, nodes_by_cost=bool(by_cost))
    if colon and head.strip() == "paths":
        items = rest.split(",")
        opts = _options(_static_nodes(items[1:], text), ("nodes",), text)
        slots = _slots_from_paths(items[0], text)
    elif colon:
        raise TreeSpecError(f"tree {text!r}: unknown kind {head.strip()!r} (use B1,B2,..., paths:... or dynamic:...)")
    else:
        items = text.split(",")
        branching = [i for i in items if "=" not in i]
        opts = _options(_static_nodes([i for i in items if "=" in i], text), ("nodes",), text)
        slots = _slots_from_branching([_positive_int(b.strip(), "a branching factor", text) for b in branching], text)
    if "nodes" in opts:
        slots = slots[: opts["nodes"]]  # breadth first: parents stay before their children
    _check_size(len(slots), text)
    depth = max(_depths_of_slots(slots))
    return TreeSpec("static", text, slots=tuple(slots), nodes=len(slots), depth=depth)


def candidate_count(depth: int, topk: int) -> int:
    """How many candidates a dynamic tree grows at most: topk at depth 1, topk x topk below."""
    return topk + (depth - 1) * topk * topk


def _static_nodes(items: list[str], text: str) -> list[str]:
    if any(i.replace(" ", "") == "nodes=auto" for i in items):
        raise TreeSpecError(
            f"tree {text!r}: nodes=auto applies to dynamic trees (a static tree keeps every slot): "
            "write e.g. dynamic:nodes=auto,depth=5,topk=4"
        )
    return items


def tree_options(tree: Any, children: str) -> tuple[Any, str]:
    """The parsed tree spec (None for a chain) and the children mode, checked together: what
    DraftModelProposer accepts, for any front end that validates before building one."""
    check_children_mode(children)
    if tree is None:
        return None, children
    spec = parse_tree(tree)
    if spec.kind == "dynamic" and children != "topk":
        raise ValueError(
            "a dynamic tree keeps the most probable candidates, so its children are the top-k "
            "tokens: use children='topk' (sampled children pruned by value are not exact)"
        )
    return spec, children


def _check_size(nodes: int, text: str) -> None:
    if nodes > MAX_NODES:
        raise TreeSpecError(f"tree {text!r} has {nodes} nodes; at most {MAX_NODES} (add nodes=N to cut it)")


def _slots_from_branching(branching: list[int], text: str) -> list[tuple[int, int]]:
    if not branching:
        raise TreeSpecError(f"tree {text!r}: give at least one branching factor, e.g. 3,2,1")
    slots: list[tuple[int, int]] = []
    level = [SLOT_ROOT]
    for b in branching:
        nxt = []
        for parent in level:
            for rank in range(b):
                nxt.append(len(slots))
                slots.append((parent, rank))
                _check_size(len(slots), text)
        level = nxt
    return slots


def _slots_from_paths(body: str, text: str) -> list[tuple[int, int]]:
    paths: set[tuple[int, ...]] = set()
    for raw in body.split(";"):
        raw = raw.strip()
        if not raw:
            continue
        try:
            path = tuple(int(r) for r in raw.split("."))
        except ValueError:
            raise TreeSpecError(f"tree {text!r}: path {raw!r} must be dot-separated ranks like 0.1.0") from None
        if any(r < 0 for r in path):
            raise TreeSpecError(f"tree {text!r}: path {raw!r} has a negative rank")
        paths.add(path)
    if not paths:
        raise TreeSpecError(f"tree {text!r}: give at least one path, e.g. paths:0;1;0.0")
    for path in paths:
        if len(path) > 1 and path[:-1] not in paths:
            raise TreeSpecError(f"tree {text!r}: path {_dotted(path)} needs its parent {_dotted(path[:-1])}")
        if path[-1] > 0 and path[:-1] + (path[-1] - 1,) not in paths:
            raise TreeSpecError(
                f"tree {text!r}: path {_dotted(path)} needs its elder sibling "
                f"{_dotted(path[:-1] + (path[-1] - 1,))} (children are tried in drawn order)"
            )
    ordered = sorted(paths, key=lambda p: (len(p), p))
    index = {p: i for i, p in enumerate(ordered)}
    return [(index[p[:-1]] if len(p) > 1 else SLOT_ROOT, p[-1]) for p in ordered]


def _dotted(path: tuple[int, ...]) -> str:
    return ".".join(map(str, path))


def _depths_of_slots(slots: list[tuple[int, int]] | tuple[tuple[int, int], ...]) -> list[int]:
    depths: list[int] = []
    for parent, _ in slots:
        depths.append(1 if parent == SLOT_ROOT else depths[parent] + 1)
    return depths or [0]


# ---------------------------------------------------------------------------- masks and positions


def node_depths(parents: tuple[int, ...] | list[int]) -> list[int]:
    """Depth of each node (1 = a child of the prefix); parents come before children."""
    depths: list[int] = []
    for i, parent in enumerate(parents):
        if not -1 <= parent < i:
            raise ValueError(f"node {i} has parent {parent}: a parent must be -1 or an earlier node")
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return depths


def ancestor_matrix(parents: tuple[int, ...] | list[int]) -> np.ndarray:
    """(n, n) bool: [i, j] is True when node j is node i or one of its ancestors."""
    n = len(parents)
    node_depths(parents)  # validates the order
    seen = np.eye(n, dtype=bool)
    for i, parent in enumerate(parents):
        if parent >= 0:
            seen[i] |= seen[parent]
    return seen


def tree_positions(parents: tuple[int, ...] | list[int], prefix_len: int) -> list[int]:
    """Position ids of the nodes: prefix length + depth - 1."""
    return [prefix_len + d - 1 for d in node_depths(parents)]


def context_and_tree(cached: int, pending: int, visible: np.ndarray) -> np.ndarray:
    """(pending + n, cached + pending + n) bool: which columns each row of one forward sees.

    Rows: `pending` context tokens (causal), then n tree nodes; columns: the `cached`
    positions already in the KV cache, the pending tokens, the nodes. A node sees the whole
    context and the nodes `visible` (n, n) marks: its ancestors and itself.
    """
    n = visible.shape[0]
    allowed = np.zeros((pending + n, cached + pending + n), dtype=bool)
    allowed[:, :cached] = True
    allowed[:pending, cached : cached + pending] = np.tril(np.ones((pending, pending), dtype=bool))
    allowed[pending:, cached : cached + pending] = True
    allowed[pending:, cached + pending :] = visible
    return allowed


def additive_mask(allowed: np.ndarray, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """(rows, cols) bool -> the (1, 1, rows, cols) additive mask: 0 where allowed, else the
    dtype's minimum (transformers passes a 4D mask through as it is; eager and SDPA
    attention both add it to the scores)."""
    import torch  # here: the checker reads trees without importing torch

    mask = torch.zeros((1, 1) + allowed.shape, dtype=dtype, device=device)
    mask[0, 0][~torch.from_numpy(np.ascontiguousarray(allowed)).to(device)] = torch.finfo(dtype).min
    return mask


def tree_mask(
    visible: np.ndarray, cached: int, pending: int, dtype: torch.dtype, device: torch.device | str
) -> torch.Tensor:
    """The additive 4D mask of a forward over `pending` context tokens and a tree."""
    return additive_mask(context_and_tree(cached, pending, visible), dtype, device)


def select_dynamic(scores: list[float], parents: list[int], budget: int) -> list[int]:
    """EAGLE-2's final selection: the `budget` candidates with the best cumulative
    log-probability (ties: the earlier candidate), closed under ancestors, in candidate
    order (so parents stay before their children)."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    keep: set[int] = set()
    for i in order:
        if len(keep) >= budget:
            break
        chain = []
        node = i
        while node >= 0 and node not in keep:
            chain.append(node)
            node = parents[node]
        if len(keep) + len(chain) <= budget:
            keep.update(chain)
    return sorted(keep)
