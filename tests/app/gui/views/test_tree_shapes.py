"""The draft-tree view on a real token tree: every node under its parent, the tried order
and draw of each tried node, the repair under the last rejected sibling, the nodes off the
accepted path counted in the title."""

from specscope.app.gui.model.runmodel import RunModel
from specscope.app.gui.views.tree import DraftTreeView, build_tree, tree_notes
from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from tests.tiny_models import noisy_copy, tiny_lm


def tree_run():
    target = tiny_lm("llama", seed=3, init_range=0.3)
    dec = SpeculativeDecoder(
        target,
        DraftModelProposer(noisy_copy(target, 0.3), tree="3,2,1", children="sampled"),
        sampling=SamplingConfig(temperature=1.0),
        seed=5,
    )
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
    for _parent, kids in r.tree.tried:
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


def dynamic_tree_run():
    target = tiny_lm("llama", seed=3, init_range=0.3)
    dec = SpeculativeDecoder(
        target,
        DraftModelProposer(noisy_copy(target, 0.3), tree="dynamic:nodes=16,depth=5,topk=4"),
        sampling=SamplingConfig(temperature=0),
        seed=5,
    )
    return dec.generate([3, 9, 27, 17], 24)


def test_a_16_node_dynamic_tree_fills_a_1024x700_pane_readably_and_zooms_with_ctrl_wheel(qtbot):
    """Issue 42 item 10: in the tree pane of a 1024x700 window (about 680 x 210 px) a 16-node
    dynamic tree was drawn sideways in the left third with 7 px labels and scrolled; no zoom."""
    from PySide6.QtCore import QPoint, QPointF, Qt
    from PySide6.QtGui import QFontMetricsF, QWheelEvent
    from PySide6.QtWidgets import QApplication

    from specscope.app.gui import theme

    out = dynamic_tree_run()
    model = RunModel()
    model.begin(out.config)
    model.extend(out.rounds)
    view = DraftTreeView(model)
    qtbot.addWidget(view)
    view.resize(680, 260)
    view.show()
    qtbot.waitExposed(view)
    index = max(range(len(out.rounds)), key=lambda i: len(out.rounds[i].nodes))
    assert len(out.rounds[index].nodes) == 16
    view.show_round(index, -1)
    qtbot.wait(50)
    vp = view.view.viewport().rect()
    drawn = view.view.mapFromScene(view.scene.itemsBoundingRect()).boundingRect()
    assert vp.contains(drawn), (drawn, vp)  # whole, no scrolling
    assert drawn.width() > vp.width() * 0.6 or drawn.height() > vp.height() * 0.6  # fills the pane
    label_px = QFontMetricsF(theme.mono_font(10)).height() * view.scale()
    assert label_px >= 9, label_px  # readable

    def wheel(ctrl: bool, notches: int) -> None:
        centre = QPointF(view.view.viewport().rect().center())
        mods = Qt.KeyboardModifier.ControlModifier if ctrl else Qt.KeyboardModifier.NoModifier
        QApplication.sendEvent(
            view.view.viewport(),
            QWheelEvent(
                centre,
                QPointF(view.view.viewport().mapToGlobal(centre.toPoint())),
                QPoint(0, 0),
                QPoint(0, 120 * notches),
                Qt.MouseButton.NoButton,
                mods,
                Qt.ScrollPhase.NoScrollPhase,
                False,
            ),
        )

    fitted = view.scale()
    wheel(False, 1)
    assert view.scale() == fitted  # the wheel alone does not zoom
    wheel(True, 2)
    assert view.scale() > fitted * 1.2
    wheel(True, -4)
    assert view.scale() < fitted
    view.reset_zoom()
    assert abs(view.scale() - fitted) < 1e-6
