"""The window routes Run, Step, Space, P and Right to the active session (no mode checks):
the same keys step a paused live run and browse a replayed one."""

from __future__ import annotations

from PySide6.QtCore import Qt

from tests.app.gui.sessions.test_replay import record_live
from tests.app.helpers import configure, wait_idle


def test_keys_go_to_the_active_session(qtbot, make_window, tmp_path):
    store_path = str(tmp_path / "live.sqlite")
    w = make_window(store_path=store_path)
    configure(w, max_new_tokens="12")
    w.runs.step()  # live, idle: Step starts a run paused after round 0
    qtbot.waitUntil(lambda: w.live.state == "paused" and len(w.model.rounds) == 1, timeout=20000)
    assert w.session is w.live and w.session.shows_run_state and w.session.trace_path == w.live.recorded_path
    w.runs.step_or_next()  # paused live run: Right steps one round
    qtbot.waitUntil(lambda: len(w.model.rounds) == 2, timeout=20000)
    w.runs.stop()
    qtbot.waitUntil(lambda: w.live.state == "idle", timeout=20000)
    run_id, rounds = record_live(qtbot, w, max_new_tokens="24")

    r = make_window(store_path=str(tmp_path / "other.sqlite"))
    assert r.open_trace(store_path, run_id=run_id)
    qtbot.waitUntil(lambda: r.replay.loaded_all, timeout=20000)
    assert r.session is r.replay and not r.session.shows_run_state and r.session.trace_path == store_path
    r.model.select(0)
    r.runs.step_or_next()  # replay: Right browses, it starts nothing
    assert r.model.selected[0] == 1 and r.live.state == "idle"
    r.action("run.play").trigger()  # replay: P plays the stored rounds
    assert r.replay.playing
    r.action("run.play").trigger()
    assert not r.replay.playing
    qtbot.mouseClick(r.run_panel.run_button, Qt.MouseButton.LeftButton)  # Run from replay: a new live run
    wait_idle(qtbot, r)
    assert r.session is r.live and r.model.config.run_id != run_id
