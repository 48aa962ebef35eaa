"""Issue 18's GUI, driven through the real window on the bundled (tiny) models: a token tree
chosen in the run panel runs, its nodes inspect as p' against q, the timeline counts the
discarded nodes, the plots show accepted length per round and acceptance by depth; a bad
tree spec is explained next to its field and starts nothing; compare lanes run trees."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt

from specscope.app.gui.sessions.worker import IDLE
from specscope.app.gui.views.tree_inspect import is_tree, node_residuals
from tests.app.helpers import configure, wait_idle


def test_a_tree_from_the_run_panel_runs_and_inspects(qtbot, window):
    configure(window, temperature="1.0", max_new_tokens="24", seed="3")
    panel = window.run_panel
    panel.tree.setEditText("3,2,1")
    panel.children_mode.setCurrentText("sampled")
    qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    wait_idle(qtbot, window)
    model = window.model
    assert window.last_error is None and model.stop_reason == "budget"
    assert model.config.proposer_params["tree"] == "3,2,1"
    assert model.config.proposer_params["children"] == "sampled"
    rounds = [model.full_round(i) for i in range(len(model.rounds))]
    assert all(is_tree(r) for r in rounds if r.nodes)
    # a node tried after a rejected sibling: the inspector plots p' (not its parent's p) against its q
    r, child = next((r, kids[1]) for r in rounds for _, kids in r.tree.tried if len(kids) > 1)
    model.select(r.index, -1)
    window.tree.click_node(f"n{child}")
    assert model.selected == (r.index, child)
    values = window.inspector.values
    view = node_residuals(r, child, "sampled")
    ids = values["tokens"]
    np.testing.assert_allclose(values["p"], view.p_prime[ids])
    np.testing.assert_allclose(values["q"], r.nodes[child].q[ids])
    assert values["tree"]["rank"] == 2 and values["tree"]["updates"]
    assert "p′₀ = p at" in values["header"]
    # the timeline: the accepted path, then one badge counting the discarded nodes
    tl = window.timeline
    badges = {model.cells.round[cell]: count for cell, (_, count) in tl.badges.items()}
    assert badges[r.index] == len(r.nodes) - len(r.tree.path)
    badge = next(cell for cell in tl.badges if model.cells.round[cell] == r.index)
    assert f"{badges[r.index]} discarded" in tl.tooltip_for(badge)
    tl.click_cell(badge)  # selects the round's first rejected node
    assert model.selected == (r.index, min(n.index for n in r.nodes if n.status == "rejected"))
    # the plots: accepted length per round and acceptance by depth (accepted / tried)
    plots = window.plots
    plots.refresh()
    assert plots.tree_mode and len(plots.len_scatter.data) == len(model.rounds)
    depths = plots.pos_bars.opts["height"]
    tried = np.zeros(3)
    accepted = np.zeros(3)
    for rr in rounds:
        for n in rr.nodes:
            if n.status != "unvisited":
                tried[n.depth - 1] += 1
                accepted[n.depth - 1] += n.status == "accepted"
    reached = int(np.flatnonzero(tried)[-1]) + 1
    np.testing.assert_allclose(depths, (accepted / np.maximum(tried, 1))[:reached])
    assert "acceptance by depth" in plots.plots["positions"].titleLabel.text


def test_a_bad_tree_spec_is_explained_and_starts_nothing(qtbot, window):
    configure(window)
    panel = window.run_panel
    panel.tree.setEditText("3,x")
    qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    qtbot.wait(200)
    assert "branching factor" in panel.errors["tree"].text()
    assert window.live.state == IDLE and len(window.model.rounds) == 0
    # issue 32: the message wraps and shows whole (a one-line label had cut it)
    assert panel.errors["tree"].height() >= panel.errors["tree"].heightForWidth(panel.errors["tree"].width())
    # a dynamic tree with sampled children: the proposer's own rule, next to the children field
    panel.tree.setEditText("dynamic:nodes=16,depth=5,topk=4")
    panel.children_mode.setCurrentText("sampled")
    panel.validate()
    assert not panel.errors["tree"].text() and "topk" in panel.errors["children"].text()


def test_prompt_lookup_cannot_grow_trees(qtbot, window):
    panel = window.run_panel
    configure(window, proposer="lookup")
    assert not panel.tree.isEnabled() and not panel.children_mode.isEnabled()
    configure(window, proposer="draft:small")
    assert panel.tree.isEnabled()
    assert not panel.children_mode.isEnabled()  # a chain: no siblings to choose
    panel.tree.setEditText("3,2,1")
    assert panel.children_mode.isEnabled()
    assert panel.texts()["proposer"] == "draft:small,tree=3,2,1"


@pytest.mark.parametrize(
    "side,spec,tree",
    [
        (0, "draft:small,tree=2,1,1,1", "2,1,1,1"),
        (1, "draft:small,tree=dynamic:nodes=16,depth=5,topk=4", "dynamic:nodes=16,depth=5,topk=4"),
    ],
)
def test_compare_lanes_offer_and_run_trees(qtbot, window, side, spec, tree):
    configure(window, max_new_tokens="12")
    combo = window.compare.proposers[side]
    index = combo.findData(spec)
    assert index >= 0, "the lane's menu offers the tree"
    combo.setCurrentIndex(index)
    window.runs.start_compare()
    qtbot.waitUntil(
        lambda: (
            all(r.stop_reason for r in window.compare_session.results) and window.compare_controller.state == "idle"
        ),
        timeout=60000,
    )
    model = window.compare_session.models[side]
    assert model.config.proposer_params["tree"] == tree
    assert any(is_tree(r) for r in model.rounds)


def test_a_replayed_tree_run_inspects_and_plots_as_it_ran(qtbot, make_window, tmp_path):
    """The trace keeps the nodes' p and q: a replay shows the same p' for a node (from the
    stored updates, or replayed from p and q when the trace keeps none) and the same plots."""
    store = tmp_path / "trees.sqlite"
    window = make_window(store_path=str(store))
    configure(window, temperature="1.0", max_new_tokens="20", seed="3")
    window.run_panel.tree.setEditText("3,2,1")
    window.run_panel.children_mode.setCurrentText("distinct")
    qtbot.mouseClick(window.run_panel.run_button, Qt.MouseButton.LeftButton)
    wait_idle(qtbot, window)
    live = window.model
    run_id = live.config.run_id
    rounds = [live.full_round(i) for i in range(len(live.rounds))]
    r, child = next((r, kids[1]) for r in rounds for _, kids in r.tree.tried if len(kids) > 1)
    live_p = node_residuals(r, child, "distinct").p_prime
    live_depths = live.metrics.per_position().copy()
    assert window.open_trace(str(store), run_id=run_id)
    qtbot.waitUntil(lambda: window.replay.loaded_all, timeout=30000)
    replay = window.model
    panel = window.run_panel  # Run reproduces the replayed tree
    assert (panel.tree.currentText(), panel.children_mode.currentText()) == ("3,2,1", "distinct")
    assert replay.config.run_id == run_id and len(replay.rounds) == len(rounds)
    replay.select(r.index, child)
    values = window.inspector.values
    assert values["tree"]["source"] in ("recorded", "recomputed from the stored p and q"), values["tree"]
    np.testing.assert_allclose(values["p"], live_p[values["tokens"]], atol=1e-9)
    assert "p′₀ = p at" in values["header"]
    window.plots.refresh()
    assert window.plots.tree_mode
    np.testing.assert_allclose(replay.metrics.per_position(), live_depths)
    assert window.timeline.badges
