"""The run panel's Tree menu: whole specs in its popup however narrow the panel (elided, the
two dynamic trees read alike: "dynamic:no…"), and the cost-chosen tree among its choices."""

from __future__ import annotations

from specscope.app.gui.views.runpanel import RunPanelWidget


def test_the_tree_menu_shows_whole_specs_and_offers_a_tree_chosen_by_cost(qtbot):
    panel = RunPanelWidget()
    qtbot.addWidget(panel)
    panel.resize(300, 600)
    menu = panel.tree
    items = [menu.itemText(i) for i in range(menu.count())]
    assert "dynamic:nodes=auto,depth=6,topk=3" in items
    metrics = menu.view().fontMetrics()
    assert menu.view().minimumWidth() >= max(metrics.horizontalAdvance(t) for t in items)
    panel.set_texts({"prompt": "1 2 3", "proposer": "eagle3"})
    menu.setEditText("dynamic:nodes=auto,depth=6,topk=3")
    assert panel.validate_quietly().proposer == "eagle3:tree=dynamic:nodes=auto,depth=6,topk=3"
