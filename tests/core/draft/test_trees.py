"""Tree specs, the tree attention mask and positions (checked on three architectures)."""

import re

import pytest
import torch
from transformers import DynamicCache

from specscope.core.draft.trees import (
    MAX_NODES,
    TreeSpecError,
    ancestor_matrix,
    candidate_count,
    node_depths,
    parse_tree,
    select_dynamic,
    tree_mask,
    tree_positions,
)
from tests.tiny_models import ARCHITECTURES, tiny_lm


def test_static_branching():
    spec = parse_tree("3,2,1,1")
    assert spec.kind == "static" and spec.nodes == 3 + 6 + 6 + 6 and spec.depth == 4
    assert spec.slots[:5] == ((-1, 0), (-1, 1), (-1, 2), (0, 0), (0, 1))
    assert spec.children_counts()[-1] == 3 and spec.children_counts()[0] == 2
    cut = parse_tree("3,2,1,1,nodes=8")
    assert cut.nodes == 8 and cut.slots == spec.slots[:8] and cut.depth == 2


def test_explicit_paths():
    spec = parse_tree("paths:0;1;0.0;0.1;0.0.0")
    assert spec.slots == ((-1, 0), (-1, 1), (0, 0), (0, 1), (2, 0))
    assert spec.depth == 3 and spec.nodes == 5
    assert parse_tree("paths:0;1;0.0,nodes=2").slots == ((-1, 0), (-1, 1))


def test_dynamic():
    spec = parse_tree("dynamic:nodes=16,depth=5,topk=4")
    assert (spec.kind, spec.nodes, spec.depth, spec.topk) == ("dynamic", 16, 5, 4)
    assert not spec.nodes_by_cost


def test_dynamic_nodes_by_cost_caps_at_every_candidate():
    spec = parse_tree("dynamic:depth=4,nodes=auto,topk=3")
    assert spec.nodes_by_cost and (spec.depth, spec.topk) == (4, 3)
    assert spec.nodes == candidate_count(4, 3) == 3 + 3 * 9
    assert parse_tree("dynamic:nodes=auto,depth=8,topk=8").nodes == MAX_NODES  # the cap of any tree


@pytest.mark.parametrize(
    "text, says",
    [
        ("3,2,1,nodes=auto", "dynamic trees"),
        ("paths:0;1,nodes=auto", "dynamic trees"),
        ("dynamic:nodes=auto,nodes=4,depth=3,topk=2", "nodes once"),
        ("dynamic:nodes=auto,depth=3", "topk=N"),
        ("dynamic:depth=3,topk=2", "nodes=N|auto"),
    ],
)
def test_nodes_auto_errors_say_what_to_write(text, says):
    with pytest.raises(TreeSpecError, match=re.escape(says)):
        parse_tree(text)


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty"),
        ("3,x", "integer"),
        ("3,0", ">= 1"),
        ("3,2,size=4", "unexpected 'size=4'"),
        ("paths:0;0.1", "elder sibling 0.0"),
        ("paths:1.0;0", "needs its parent 1"),
        ("paths:0;a", "dot-separated"),
        ("dynamic:nodes=16,depth=5", "topk=N"),
        ("dynamic:nodes=0,depth=5,topk=2", ">= 1"),
        ("bushy:3", "unknown kind"),
        ("16,16,16", "at most"),
    ],
)
def test_bad_specs_say_what_is_wrong(text, message):
    with pytest.raises(TreeSpecError, match=message):
        parse_tree(text)


def test_depths_ancestors_positions():
    parents = (-1, -1, 0, 0, 2)
    assert node_depths(parents) == [1, 1, 2, 2, 3]
    seen = ancestor_matrix(parents)
    assert seen[4].tolist() == [True, False, True, False, True]
    assert seen[1].tolist() == [False, True, False, False, False]  # no sibling visible
    assert tree_positions(parents, 10) == [10, 10, 11, 11, 12]
    with pytest.raises(ValueError):
        node_depths((1, -1))


def test_mask_layout():
    mask = tree_mask(ancestor_matrix((-1, -1, 0)), cached=2, pending=2, dtype=torch.float32, device="cpu")
    allowed = (mask[0, 0] == 0).int().tolist()
    assert allowed == [
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0, 1, 0],
        [1, 1, 1, 1, 1, 0, 1],
    ]


def test_dynamic_selection_keeps_ancestors():
    # Candidate 3's parent 1 scores below 2, but a child cannot come without its parent.
    assert select_dynamic([-0.1, -0.9, -0.5, -0.2], [-1, -1, 0, 1], 2) == [0, 2]
    assert select_dynamic([-0.1, -0.9, -0.5, -0.2], [-1, -1, 0, 1], 3) == [0, 1, 3]
    assert select_dynamic([-0.1, -0.9, -0.5, -0.95], [-1, -1, 0, 1], 2) == [0, 2]
    assert select_dynamic([-0.1, -0.9, -0.5, -0.95], [-1, -1, 0, 1], 3) == [0, 1, 2]
    assert select_dynamic([-0.1, -0.3, -0.2], [-1, 0, 0], 10) == [0, 1, 2]


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_tree_forward_equals_each_path_recomputed(arch):
    """One forward over pending tokens + a tree with the 4D mask and depth positions gives,
    at every node, the logits of a plain forward over prefix + that node's path."""
    model = tiny_lm(arch, seed=1, init_range=0.3, dtype=torch.float64)
    prefix = [5, 9, 2, 7, 1]
    cached = 3  # the cache already holds the first 3 prefix tokens; 2 are pending
    tokens = [11, 12, 13, 14, 15, 16]
    parents = (-1, -1, 0, 0, 1, 2)
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(torch.tensor([prefix[:cached]]), cache=cache, use_cache=True)
        pending = prefix[cached:]
        positions = list(range(cached, len(prefix))) + tree_positions(parents, len(prefix))
        mask = tree_mask(ancestor_matrix(parents), cached, len(pending), torch.float64, "cpu")
        out = model(
            torch.tensor([pending + tokens]),
            cache=cache,
            use_cache=True,
            attention_mask=mask,
            position_ids=torch.tensor([positions]),
        )
        for i in range(len(tokens)):
            path, node = [], i
            while node >= 0:
                path.insert(0, tokens[node])
                node = parents[node]
            full = model(torch.tensor([prefix + path])).logits[0, -1]
            torch.testing.assert_close(out.logits[0, len(pending) + i], full, atol=1e-9, rtol=0)
        # The root row (last pending token) is the prefix's next-token distribution.
        torch.testing.assert_close(
            out.logits[0, len(pending) - 1], model(torch.tensor([prefix])).logits[0, -1], atol=1e-9, rtol=0
        )
