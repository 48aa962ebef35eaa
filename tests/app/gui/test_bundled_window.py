"""The window as `specscope` opens it: bundled models, an example prompt ready, one click on Run."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from specscope.core.decode.settings import SettingsError
from tests.app.helpers import wait_idle


def test_one_click_on_run_with_the_bundled_models(qtbot, bundled_hub, settings_file, tmp_path):
    from specscope.app.gui.main_window import MainWindow

    w = MainWindow(hub=bundled_hub, settings=settings_file, store_path=str(tmp_path / "t.sqlite"))
    qtbot.addWidget(w)
    w.show()
    panel = w.run_panel
    assert panel.texts()["prompt"].strip(), "an example prompt is ready"
    assert panel.example.count() > 1
    panel.example.setCurrentIndex(2)
    panel.example.activated.emit(2)
    assert panel.texts()["prompt"] == panel.example.itemData(2)
    panel.set_field("max_new_tokens", "24")
    qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    wait_idle(qtbot, w, timeout=60000)
    assert w.last_error is None
    m = w.model
    assert len(m.output_tokens) <= 24 and m.config.target_name
    # Token cells show the tokenizer's text, not ids.
    tok = bundled_hub.tokenizer()
    first = m.cells.cell(m.cells.out_cell[0])
    assert m.token_text(first.token) != str(first.token) or tok.decode([first.token]) == str(first.token)
    w.close()


def test_the_hub_finds_a_named_targets_bundled_draft_by_name(bundled_hub):
    # "smollm2-draft" (catalog.default_draft of smollm2) names the bundled folder, not a path in
    # the working directory; beside the bundled target the tokenizer contract refuses it
    with pytest.raises(SettingsError, match="its tokenizer differs"):
        bundled_hub.check_draft_tokenizer("smollm2-draft", bundled_hub.tokenizer())
