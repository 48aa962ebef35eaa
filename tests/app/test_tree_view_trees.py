"""The draft-tree view on a real token tree: every node under its parent, the tried order
and draw of each tried node, the repair under the last rejected sibling, the nodes off the
accepted path counted in the title."""

from specscope.app.gui.model.runmodel import RunModel
from specscope.app.gui.views.tree import DraftTreeView, build_tree, tree_notes
from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder

from ..tiny_models import noisy_copy, tiny_lm


def tree_run():
    target = tiny_lm("llama", seed=3, init_range=0.3)
    dec = SpeculativeDecoder(target, DraftModelProposer(noisy_copy(target, 0.3), tree="3,2,1", children="sampled"),
                             sampling=SamplingConfig(temperature=1.0), seed=5)
    return dec.generate([3, 9, 27, 17], 30)


def test_tree_nodes_notes_and_repair():
    out = tree_run()
    # a round where a sibling was rejected and a later one tried
    r = next(r for r in out.rounds if any(len(kids) > 1 for _, kids in r.tree.tried))
    nodes = {n.key: n for n in build_tree(r, str, "x")}
    for n in r.nodes:
        assert nodes[f"n{n.index}"].parent == ("root" if n.parent < 0 else f"n{n.parent}")
        assert nodes[f"n{n.index}"].depth == n.depth
    notes = tree_notes(r)
    for parent, kids in r.tree.tried:
        for rank, child in enumerate(kids, 1):
            assert notes[child] == f"#{rank} u={r.nodes[child].u:.2f}"
    assert all(i not in notes for i, n in enumerate(r.nodes) if n.status == "unvisited")
    if r.repair is not None:
        rejected = r.nodes[r.repair.node]
        assert nodes["repair"].parent == ("root" if rejected.parent < 0 else f"n{rejected.parent}")
        assert "mass kept" in nodes[f"n{r.repair.node}"].tooltip


def test_the_view_draws_a_tree_round(qtbot):
    out = tree_run()
    model = RunModel()
    model.begin(out.config)
    model.extend(out.rounds)
    view = DraftTreeView(model)
    qtbot.addWidget(view)
    index = next(i for i, r in enumerate(out.rounds) if r.drafted - r.accepted > 0)
    view.show_round(index, -1)
    r = out.rounds[index]
    assert set(view.items) >= {f"n{n.index}" for n in r.nodes}
    assert f"{r.drafted - r.accepted} off the accepted path" in view.title.text()
