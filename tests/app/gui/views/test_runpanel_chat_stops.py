"""The run panel's chat checkbox, system text and stop fields reach the settings every front
end uses (core.decode.settings.RunSettings)."""

from specscope.app.gui.views.runpanel import RunPanelWidget


def test_chat_and_stop_fields_fill_the_settings(qtbot):
    panel = RunPanelWidget()
    qtbot.addWidget(panel)
    panel.set_texts({"prompt": "What is the capital of France?"})
    assert not panel.system.isEnabled()
    panel.chat.setChecked(True)
    assert panel.system.isEnabled()
    panel.system.setText("Answer in one word.")
    panel.stop_strings.setPlainText("Paris\n\\n\\n")
    panel.stop_ids.setText("5,6; 9")
    settings = panel.validate_quietly()
    assert settings is not None and settings.chat and settings.system == "Answer in one word."
    assert settings.stop_strings == ("Paris", "\n\n") and settings.stop_ids == ((5, 6), (9,))
    panel.stop_ids.setText("5,x")
    result = panel.validate()
    assert not result.ok and "stop token sequences" in panel.errors["stop_ids"].text()
    panel.set_texts({"chat": "", "stop_ids": ""})
    assert not panel.chat.isChecked() and panel.validate_quietly().chat is False
