"""Token-tree choices of the run panel and the compare lanes, and a head's draw mode (pure: no Qt).

A tree is part of the proposer spec (`draft:small,tree=3,2,1,children=sampled`, see
core.draft.registry), as on the command line. The run panel edits it as two fields, the tree and
the children mode, folded into the spec it validates (`fold_tree`) and split out of a spec
it is given (`split_tree`); a compare lane picks a whole spec from the proposer menu, where
`TREE_CHOICES` add tree entries. The folded spec is checked by the core's RunSettings
(core.decode.settings), with the parser the CLI and the proposer use, so the panel says what
the CLI would. A draft head's `draw` (sampled | onehot: how a chain's tokens are drawn at
T > 0) is a third such field (`split_draw`, `fold_draw`).
"""

from __future__ import annotations

from dataclasses import replace

from specscope.core.draft.registry import KINDS, ProposerSpec, SpecError, parse_spec
from specscope.core.settings.vocab import CHILDREN_MODES, DEFAULT_CHILDREN, HEAD_DRAWS

CHAIN = "chain"  # the tree field's text for "no tree": a chain of k tokens
DRAW_MODES = HEAD_DRAWS  # a head's draw field; the first is the default
# The tree field's menu; any other spec can be typed.
TREE_EXAMPLES = (
    CHAIN,
    "2,1,1,1",
    "3,2,1,1",
    "3,2,1,1,nodes=12",
    "paths:0;1;0.0;0.1;0.0.0",
    "dynamic:nodes=16,depth=5,topk=4",
    "dynamic:nodes=auto,depth=6,topk=3",
)
# Compare-lane menu entries (the bench's tree rows): (tree, children, label suffix).
TREE_CHOICES = (
    ("2,1,1,1", DEFAULT_CHILDREN, "static tree 2,1,1,1 (8 nodes)"),
    ("dynamic:nodes=16,depth=5,topk=4", DEFAULT_CHILDREN, "dynamic tree (16 nodes)"),
    ("dynamic:nodes=auto,depth=6,topk=3", DEFAULT_CHILDREN, "dynamic tree (shape by cost; a chain if no tree pays)"),
)


def _kind_takes(spec: str, param: str) -> bool:
    """Whether the kind a spec names has the parameter `param` (False for a spec that does not parse)."""
    try:
        kind = KINDS[parse_spec(spec).kind]
    except (SpecError, KeyError):
        return False
    return kind.param(param) is not None


def grows_trees(spec: str) -> bool:
    """Whether the proposer a spec names can draft a tree (its kind takes a `tree`)."""
    return _kind_takes(spec, "tree")


def is_chain(text: str) -> bool:
    return text.strip().lower() in ("", CHAIN, "none")


def split_tree(spec: str) -> tuple[str, str, str]:
    """(spec without tree and children, tree text or CHAIN, children mode)."""
    try:
        parsed = parse_spec(spec)
    except SpecError:
        return spec, CHAIN, DEFAULT_CHILDREN
    params = dict(parsed.params)
    tree = params.pop("tree", None)
    children = params.pop("children", None)
    return str(replace(parsed, params=params)), str(tree) if tree else CHAIN, str(children or DEFAULT_CHILDREN)


def fold_tree(spec: str, tree: str, children: str) -> str:
    """The spec with the tree fields in it (unchanged for a chain or a kind without trees)."""
    if is_chain(tree) or not grows_trees(spec):
        return spec
    parsed = parse_spec(spec)  # parses: grows_trees said so
    params = {**parsed.params, "tree": tree.strip()}
    if children.strip() and children.strip() != DEFAULT_CHILDREN:
        params["children"] = children.strip()
    return str(replace(parsed, params=params))


def takes_draw(spec: str) -> bool:
    """Whether the proposer a spec names has a `draw` mode (the draft heads)."""
    return _kind_takes(spec, "draw")


def split_draw(spec: str) -> tuple[str, str]:
    """(spec without `draw`, the draw mode: DRAW_MODES[0] when the spec names none)."""
    try:
        parsed = parse_spec(spec)
    except SpecError:
        return spec, DRAW_MODES[0]
    params = dict(parsed.params)
    draw = str(params.pop("draw", None) or DRAW_MODES[0])
    return str(replace(parsed, params=params)), draw


def fold_draw(spec: str, draw: str) -> str:
    """The spec with its draw mode (unchanged for the default or a kind without one)."""
    draw = draw.strip()
    if not draw or draw == DRAW_MODES[0] or not takes_draw(spec):
        return spec
    parsed = parse_spec(spec)  # parses: takes_draw said so
    return str(replace(parsed, params={**parsed.params, "draw": draw}))


def tree_choice_specs(kind: str, model: str) -> list[tuple[str, str]]:
    """(spec, label) of the tree menu entries for one model of a kind that grows trees."""
    out = []
    for tree, children, label in TREE_CHOICES:
        params = {"tree": tree} if children == DEFAULT_CHILDREN else {"tree": tree, "children": children}
        out.append((str(ProposerSpec(kind, model, params)), f"{kind} model: {model}, {label}"))
    return out


def describe_tree(spec: str) -> str | None:
    """ "tree 3,2,1 (sampled)" for a tree spec, None for a chain."""
    _, tree, children = split_tree(spec)
    return None if tree == CHAIN else f"tree {tree} ({children})"


__all__ = [
    "CHAIN",
    "CHILDREN_MODES",
    "DEFAULT_CHILDREN",
    "DRAW_MODES",
    "TREE_CHOICES",
    "TREE_EXAMPLES",
    "describe_tree",
    "fold_draw",
    "fold_tree",
    "grows_trees",
    "is_chain",
    "split_draw",
    "split_tree",
    "takes_draw",
    "tree_choice_specs",
]
