"""The window refuses what the CLI refuses: a prompt plus budget past the models' position
limit (max_position_embeddings) is refused under the field, and no run starts (the window's
decoder comes from core.decode.factory, as the CLI's does)."""

from __future__ import annotations

from specscope.app.gui.sessions.worker import IDLE
from tests.app.helpers import configure


def test_a_budget_past_the_position_limit_is_refused_under_the_field(qtbot, window, hub):
    limit = hub.target("cpu")[0].config.max_position_embeddings  # 4096 for the tiny models
    configure(window, max_new_tokens="100000")  # a 12-token prompt: 100012 positions
    assert window.start_run()  # the fields alone are fine: the limit is the models'
    label = window.run_panel.errors["max_new_tokens"]
    qtbot.waitUntil(lambda: label.text() != "", timeout=30000)
    qtbot.waitUntil(lambda: window.live.state == IDLE, timeout=30000)
    text = label.text()
    assert "needs 100012 positions" in text and f"at most {limit} (max_position_embeddings)" in text
    assert text.endswith(f"max new tokens must be at most {limit - 12}")
    assert window.last_error == text and "Cannot run" in window.statusBar().currentMessage()
    # nothing prepared, decoded or recorded
    assert window.model.config is None and len(window.model.rounds) == 0 and window.live.recorded_path is None
    configure(window, max_new_tokens=str(limit - 12))
    window.run_panel.validate()  # editing clears the refusal; the largest budget runs
    assert label.text() == ""


def test_a_nan_or_negative_value_gets_the_clis_message(qtbot, window):
    configure(window, temperature="nan", top_p="-1", seed="-1")
    assert not window.start_run()
    errors = {key: window.run_panel.errors[key].text() for key in ("temperature", "top_p", "seed")}
    assert errors == {
        "temperature": "temperature must be a finite number, got nan",
        "top_p": "top-p must lie in (0, 1] (1 = off), got -1",
        "seed": "seed must be at least 0, got -1",
    }
