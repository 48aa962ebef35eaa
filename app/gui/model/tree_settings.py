"""Token-tree choices of the run panel and the compare lanes (pure: no Qt).

A tree is part of the proposer spec (`draft:small,tree=3,2,1,children=sampled`, see
core.registry), as on the command line. The run panel edits it as two fields, the tree and
the children mode, folded into the spec it validates (`fold_tree`) and split out of a spec
it is given (`split_tree`); a compare lane picks a whole spec from the proposer menu, where
`TREE_CHOICES` add tree entries. The folded spec is checked by the core's RunSettings
(core.decode.settings), with the parser the CLI and the proposer use, so the panel says what
the CLI would.
"""

from __future__ import annotations

from dataclasses import replace

from specscope.core.draft.registry import KINDS, ProposerSpec, SpecError, parse_spec
from specscope.core.verify.tree import CHILDREN_MODES

CHAIN = "chain"  # the tree field's text for "no tree": a chain of k tokens
DEFAULT_CHILDREN = "topk"
# The tree field's menu; any other spec can be typed.
TREE_EXAMPLES = (CHAIN, "2,1,1,1", "3,2,1,1", "3,2,1,1,nodes=12", "paths:0;1;0.0;0.1;0.0.0",
                 "dynamic:nodes=16,depth=5,topk=4")
# Compare-lane menu entries (the bench's tree rows): (tree, children, label suffix).
TREE_CHOICES = (("2,1,1,1", DEFAULT_CHILDREN, "static tree 2,1,1,1 (8 nodes)"),
                ("dynamic:nodes=16,depth=5,topk=4", DEFAULT_CHILDREN, "dynamic tree (16 nodes)"))


def grows_trees(spec: str) -> bool:
    """Whether the proposer a spec names can draft a tree (its kind takes a `tree`)."""
    try:
        kind = KINDS[parse_spec(spec).kind]
    except (SpecError, KeyError):
        return False
    return kind.param("tree") is not None


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


def tree_choice_specs(kind: str, model: str) -> list[tuple[str, str]]:
    """(spec, label) of the tree menu entries for one model of a kind that grows trees."""
    out = []
    for tree, children, label in TREE_CHOICES:
        params = {"tree": tree} if children == DEFAULT_CHILDREN else {"tree": tree, "children": children}
        out.append((str(ProposerSpec(kind, model, params)), f"{kind} model: {model}, {label}"))
    return out


def describe_tree(spec: str) -> str | None:
    """"tree 3,2,1 (sampled)" for a tree spec, None for a chain."""
    _, tree, children = split_tree(spec)
    return None if tree == CHAIN else f"tree {tree} ({children})"


__all__ = ["CHAIN", "CHILDREN_MODES", "DEFAULT_CHILDREN", "TREE_CHOICES", "TREE_EXAMPLES", "describe_tree", "fold_tree",
           "grows_trees", "is_chain", "split_tree", "tree_choice_specs"]
