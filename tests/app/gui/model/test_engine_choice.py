"""The run panel and each compare lane choose the engine: specscope or transformers' own
generate() recorded round by round (core.engines.TransformersEngine)."""

from __future__ import annotations

from PySide6.QtCore import Qt

from specscope.app.gui.model.settings import PanelSettings, validate
from specscope.app.gui.sessions.worker import PAUSED
from tests.app.helpers import configure, wait_idle


def test_settings_validate_the_engine():
    texts = PanelSettings(prompt="1 2").to_texts()
    assert validate(dict(texts, engine="transformers")).settings.engine == "transformers"
    assert validate(dict(texts, engine="vllm")).settings is not None or "specscope vllm setup" in validate(
        dict(texts, engine="vllm")
    ).errors.get("engine", "")  # the window runs vLLM where it is set up (sessions/vllm.py)
    assert "proposer" in validate(dict(texts, engine="transformers", proposer="lookup:min_ngram=2")).errors


def test_run_panel_runs_transformers_steps_and_stops(qtbot, window):
    configure(window, engine="transformers", max_new_tokens="400")
    qtbot.mouseClick(window.run_panel.step_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(window.model.rounds) == 1 and window.live.state == PAUSED, timeout=20000)
    assert window.model.config.proposer == "transformers-assisted"
    qtbot.mouseClick(window.run_panel.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(window.model.rounds) >= 3, timeout=20000)
    qtbot.mouseClick(window.run_panel.stop_button, Qt.MouseButton.LeftButton)
    wait_idle(qtbot, window)
    assert window.model.stop_reason == "cancelled"
    assert [r.index for r in window.model.rounds] == list(range(len(window.model.rounds)))


def test_compare_lanes_choose_their_engine(qtbot, window):
    configure(window, max_new_tokens="24", temperature="0")
    window.compare.set_side(0, "draft-small", 3)
    window.compare.set_side(1, "draft-small", 3)
    window.compare.engines[0].setCurrentText("transformers")
    qtbot.mouseClick(window.compare.compare_button, Qt.MouseButton.LeftButton)
    session = window.compare_session
    qtbot.waitUntil(
        lambda: all(r.stop_reason for r in session.results) and window.compare_controller.state == "idle", timeout=40000
    )
    a, b = session.models
    assert a.config.proposer == "transformers-assisted" and b.config.proposer != "transformers-assisted"
    assert a.output_tokens == b.output_tokens and len(a.output_tokens) == 24  # greedy: both equal plain greedy
