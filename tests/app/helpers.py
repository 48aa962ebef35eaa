"""Helpers shared by the GUI tests."""

from __future__ import annotations

from specscope.app.gui.sessions.worker import IDLE


def configure(window, **texts):
    """Fill the run panel (defaults: short greedy run of the tiny models)."""
    base = {
        "prompt": "1 2 3 4 5 6 7 8 1 2 3 4",
        "proposer": "draft-small",
        "k": "4",
        "temperature": "0",
        "top_k": "0",
        "top_p": "1.0",
        "seed": "0",
        "max_new_tokens": "24",
        "eos": "none",
        "device": "cpu",
    }
    base.update({k: str(v) for k, v in texts.items()})
    window.run_panel.set_texts(base)


def wait_idle(qtbot, window, timeout=30000):
    qtbot.waitUntil(lambda: window.live.state == IDLE and window.model.stop_reason is not None, timeout=timeout)
