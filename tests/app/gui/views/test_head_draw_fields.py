"""A draft head's draw mode (sampled | onehot) from the window: the run panel's Draws field and
the compare lanes' menu, including a head checkpoint folder chosen for a lane."""

from __future__ import annotations

from specscope.app.gui.model.settings import PATH_ARG
from specscope.app.gui.views.runpanel import RunPanelWidget
from tests.core.head_checkpoints import write_eagle3
from tests.tiny_models import tiny_lm


def test_the_draws_field_applies_to_a_head_drafting_a_chain(qtbot, tmp_path):
    panel = RunPanelWidget()
    qtbot.addWidget(panel)
    panel.set_texts({"prompt": "1 2 3", "proposer": "draft:small"})
    assert not panel.draw.isEnabled()  # a draft model has no draw mode
    panel.set_texts({"proposer": "eagle3"})
    assert panel.draw.isEnabled() and panel.draw.currentText() == "sampled"
    panel.draw.setCurrentText("onehot")
    assert panel.texts()["proposer"] == "eagle3:draw=onehot"
    assert panel.validate_quietly().proposer == "eagle3:draw=onehot"
    panel.tree.setEditText("3,2,1")  # a tree's siblings follow Children: the draw mode is set aside
    assert not panel.draw.isEnabled() and panel.texts()["proposer"] == "eagle3:tree=3,2,1"
    panel.tree.setEditText("chain")
    assert panel.draw.isEnabled() and panel.texts()["proposer"] == "eagle3:draw=onehot"
    # a head checkpoint's spec (as a trace or the settings file gives it) fills folder and field
    write_eagle3(tmp_path, tiny_lm("llama", layers=4), draft_vocab=40)
    panel.set_texts({"proposer": f"eagle3:{tmp_path},draw=onehot"})
    assert panel.proposer.currentData() == f"eagle3:{PATH_ARG}" and panel.checkpoint.text() == str(tmp_path)
    assert panel.draw.currentText() == "onehot" and panel.texts()["proposer"] == f"eagle3:{tmp_path},draw=onehot"
    panel.set_texts({"proposer": "eagle3"})
    assert panel.draw.currentText() == "sampled" and panel.texts()["proposer"] == "eagle3"


def test_a_lane_asks_for_a_head_folder_and_keeps_its_choice_when_cancelled(window, tmp_path, monkeypatch):
    write_eagle3(tmp_path / "my-head", tiny_lm("llama", layers=4), draft_vocab=40)
    widget = window.compare
    combo = widget.proposers[0]
    widget.set_side(0, "eagle3:draw=onehot", 4)
    assert combo.currentText() == "eagle3: the target's trained head, one-hot drafts"
    asked: list[str] = []
    answers = iter([str(tmp_path / "my-head"), ""])
    monkeypatch.setattr(widget, "choose_checkpoint", lambda kind: asked.append(kind) or next(answers))
    entry = combo.findData(f"eagle3:{PATH_ARG}")
    assert entry >= 0 and combo.itemText(entry) == "eagle3: head checkpoint…"
    combo.setCurrentIndex(entry)
    combo.activated.emit(entry)  # what a click on the entry sends
    assert asked == ["eagle3"]
    assert widget.side_texts(0) == (f"eagle3:{tmp_path / 'my-head'}", "4")
    assert combo.currentText() == "eagle3 checkpoint my-head"
    combo.setCurrentIndex(entry)
    combo.activated.emit(entry)  # cancelled: the folder chosen before stays
    assert asked == ["eagle3", "eagle3"] and widget.side_texts(0)[0] == f"eagle3:{tmp_path / 'my-head'}"
    base = {
        "prompt": "1 2 3",
        "target": "",
        "engine": "specscope",
        "proposer": "draft:small",
        "checkpoint": "",
        "k": "4",
        "temperature": "0",
        "top_k": "0",
        "top_p": "1",
        "seed": "0",
        "max_new_tokens": "8",
        "eos": "auto",
        "device": "cpu",
        "threads": "1",
    }
    lanes = widget.lane_settings(base, ("cpu",))
    assert lanes is not None and lanes[0].proposer == f"eagle3:{tmp_path / 'my-head'}"
