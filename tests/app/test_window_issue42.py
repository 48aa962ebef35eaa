"""Issue 42 (the window with a real model): a failed start keeps the run on screen, the wheel
never turns a field of a scrolling panel, the words say what is loaded and what a round did."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import configure, wait_idle


def test_a_failed_start_keeps_the_previous_run_and_its_title(qtbot, make_window, tmp_path):
    """Item 8: a start that fails (a checkpoint folder whose weights are corrupt) wiped the
    timeline, tree and inspector to "No rounds yet", and the title named the run that never
    started."""
    w = make_window(record=False)
    configure(w, max_new_tokens="8")
    assert w.start_run()
    wait_idle(qtbot, w)
    rounds, title = len(w.model.rounds), w.windowTitle()
    assert rounds and "live:" in title
    w.model.select(1)
    bad = tmp_path / "bad-checkpoint"
    bad.mkdir()
    (bad / "config.json").write_text("{ this is not json")
    w.run_panel.set_texts({"proposer": f"draft:{bad}"})
    assert w.start_run()
    qtbot.waitUntil(lambda: w.error_box is not None and w.error_box.isVisible(), timeout=20000)
    qtbot.wait(100)
    assert len(w.model.rounds) == rounds and w.model.stop_reason is not None
    assert w.timeline.model is w.model and w.timeline.model.rounds
    assert w.windowTitle() == title
    assert str(bad) not in w.windowTitle()
