"""Issue 43 in the window: every way it opens a store reads a read-only one (items 3), and a
store written by a newer specscope is read and said, never recorded into (item 2)."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent
from PySide6.QtWidgets import QInputDialog, QMessageBox

from specscope.app.gui.controllers import trace_dialogs
from specscope.app.gui.sessions.worker import PAUSED
from specscope.storage import SCHEMA_VERSION
from tests.app.cli.test_reliability_stores import _as_nobody, digest, files_in
from tests.app.gui.controllers.test_replay_panel import _stored_runs
from tests.app.helpers import configure, wait_idle


def _chattr(flag: str, *paths: Path) -> bool:
    try:
        return subprocess.run(["chattr", flag, *map(str, paths)], capture_output=True).returncode == 0
    except OSError:
        return False


@pytest.fixture
def read_only_store(hub, tmp_path):
    """A store of two runs that nobody, root included, can write: the file and its folder
    immutable (chattr +i), as on a read-only mount: SQLite cannot open it read-write nor
    create its -wal or -shm files beside it."""
    made = tmp_path / "made.sqlite"
    run_ids = _stored_runs(hub, made)
    folder = tmp_path / "ro"
    folder.mkdir()
    db = folder / "ro.sqlite"
    shutil.copy(made, db)
    if not _chattr("+i", db, folder):
        pytest.skip("chattr +i is not available here (needs root and a file system that keeps the flag)")
    before = (digest(db), files_in(folder))
    try:
        yield db, run_ids
        assert (digest(db), files_in(folder)) == before
    finally:
        _chattr("-i", db, folder)


def pick_in_order(monkeypatch, run_ids):
    """The run pickers answer A, B; the diff's result is kept instead of shown."""
    picks = iter(run_ids)
    monkeypatch.setattr(trace_dialogs, "pick_run", lambda *a, **k: next(picks))
    labels = iter([0, 1])
    monkeypatch.setattr(
        QInputDialog,
        "getItem",
        staticmethod(lambda parent, title, label, items, current, editable: (items[next(labels)], True)),
    )
    shown = []
    monkeypatch.setattr(QMessageBox, "information", staticmethod(lambda parent, title, text: shown.append(text)))
    return shown


def open_by_file_menu(window, path, monkeypatch):
    monkeypatch.setattr(window.traces, "choose_file", lambda title: str(path))
    window.traces.open_trace_dialog()


def open_by_drop(window, path, monkeypatch):
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path))])
    window.dropEvent(
        QDropEvent(
            QPointF(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier
        )
    )


def open_by_command(window, path, monkeypatch):
    """`specscope open FILE`: the CLI's check, then launch() opens it in the window (here the
    test's window, whose event loop already runs)."""
    import specscope.app.gui as gui
    from specscope.app.cli import main

    def launch(trace_path=None, run_id=None, **_):
        return 0 if window.open_trace(str(trace_path), run_id=run_id) else 1

    monkeypatch.setattr(gui, "launch", launch)
    assert main(["open", str(path)]) == 0


@pytest.mark.parametrize("way", [open_by_file_menu, open_by_drop, open_by_command], ids=lambda f: f.__name__)
def test_every_way_of_opening_a_run_reads_a_read_only_store(qtbot, make_window, read_only_store, monkeypatch, way):
    db, run_ids = read_only_store
    window = make_window(record=False)
    pick_in_order(monkeypatch, run_ids)
    way(window, db, monkeypatch)
    qtbot.waitUntil(lambda: window.replay.loaded_all, timeout=30000)
    assert window.last_error is None
    assert window.mode == "replay" and window.model.config.run_id == run_ids[0] and window.model.rounds


def test_compare_and_diff_two_runs_read_a_read_only_store(qtbot, make_window, read_only_store, monkeypatch):
    db, run_ids = read_only_store
    window = make_window(record=False)
    shown = pick_in_order(monkeypatch, run_ids)
    assert window.traces.compare_stored_dialog(str(db)) is True
    assert window.last_error is None
    text = window.traces.diff_runs_dialog(str(db))
    assert window.last_error is None and text and shown == [text]


@pytest.mark.skipif(not hasattr(os, "fork") or os.geteuid() != 0, reason="needs root to become nobody")
def test_the_windows_store_opener_reads_a_store_as_nobody(hub, tmp_path):
    """What every window path opens a store with, as user nobody on a 0444 file in a 0555 folder."""
    from specscope.app.gui.model.traces import TraceLibrary

    made = tmp_path / "made.sqlite"
    run_ids = _stored_runs(hub, made)
    folder = Path(tempfile.mkdtemp(prefix="specscope-ro-"))
    try:
        db = folder / "store.sqlite"
        shutil.copy(made, db)
        os.chmod(db, 0o444)
        os.chmod(folder, 0o555)
        before, listing = digest(db), files_in(folder)

        def read(argv):
            library = TraceLibrary(str(db))
            try:
                runs = sorted(r.run_id for r in library.runs())
                n = sum(len(library.rounds(r)) for r in runs)
                library.diff(*runs)
            finally:
                library.close()
            os.write(1, f"{runs == sorted(run_ids)} {n > 0}\n".encode())  # fd 1: the pipe (sys.stdout is pytest's)
            return 0

        code, out = _as_nobody_calling(read)
        # the forked child may also print Qt's offscreen-plugin notes: the answer is the last line
        assert code == 0 and out.split()[-2:] == ["True", "True"], out
        assert digest(db) == before and files_in(folder) == listing
    finally:
        os.chmod(folder, 0o755)
        shutil.rmtree(folder)


def _as_nobody_calling(fn):
    """_as_nobody with `fn` in the place of main()."""
    from tests.app.cli import test_reliability_stores as rs

    saved = rs.main
    rs.main = fn
    try:
        return _as_nobody([])
    finally:
        rs.main = saved


# ---------------------------------------------------------------------------- 2. a newer store


def _bump(path: Path) -> None:
    con = sqlite3.connect(path)
    con.execute("INSERT INTO schema_version VALUES (?, 'from a newer specscope', 0)", (SCHEMA_VERSION + 1,))
    con.execute("ALTER TABLE rounds ADD COLUMN energy REAL")
    con.commit()
    con.close()


def test_the_window_replays_a_newer_store_and_says_so(qtbot, make_window, hub, tmp_path, monkeypatch):
    db = tmp_path / "newer.sqlite"
    run_ids = _stored_runs(hub, db)
    _bump(db)
    before = digest(db)
    window = make_window(record=False)
    shown = pick_in_order(monkeypatch, run_ids + run_ids)
    assert window.open_trace(str(db))
    qtbot.waitUntil(lambda: window.replay.loaded_all, timeout=30000)
    note = window.traces.newer_note
    assert note and f"schema version {SCHEMA_VERSION + 1}; this one knows {SCHEMA_VERSION}" in note
    assert "newer specscope" in window.statusBar().currentMessage() or window.last_error is None
    window.traces.newer_note = None
    assert window.traces.compare_stored_dialog(str(db)) and window.traces.newer_note == note
    window.traces.newer_note = None
    assert window.traces.diff_runs_dialog(str(db)) and shown and window.traces.newer_note == note
    assert digest(db) == before


def test_the_window_does_not_record_into_a_newer_store(qtbot, make_window, hub, tmp_path):
    db = tmp_path / "newer.sqlite"
    _stored_runs(hub, db, seeds=(0,))
    _bump(db)
    before = digest(db)
    window = make_window(store_path=str(db))
    configure(window, max_new_tokens="6")
    assert window.start_run()
    wait_idle(qtbot, window)
    assert window.last_error and "not being recorded" in window.last_error
    assert "newer than this specscope knows" in window.last_error
    assert window.model.rounds  # the run itself went on
    assert digest(db) == before


# ---------------------------------------------------------------------------- 1. a locked store


def _record_while_locked(qtbot, make_window, tmp_path, monkeypatch, hold_s: float, **env):
    import sys

    from tests.app.cli.test_store_reliability import HOLDER

    for key, value in {"SPECSCOPE_BUSY_TIMEOUT_S": "0.3", **env}.items():
        monkeypatch.setenv(key, value)
    db = tmp_path / "locked.sqlite"
    window = make_window(store_path=str(db))
    said = []
    window.live.activity.connect(said.append)
    configure(window, max_new_tokens="40")
    # Paused after one round until the holder has the lock: a holder that raced a running run
    # could miss it on a loaded machine (every round stored before the holder's first look).
    assert window.start_run(run=False)
    qtbot.waitUntil(lambda: window.live.state == PAUSED, timeout=60000)
    window.live.step()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(db), str(hold_s)], stdout=subprocess.PIPE, text=True)
    locked = []
    threading.Thread(target=lambda: locked.append(holder.stdout.readline()), daemon=True).start()
    try:
        qtbot.waitUntil(lambda: bool(locked), timeout=60000)
        window.live.resume()
        wait_idle(qtbot, window, timeout=60000)
        qtbot.waitUntil(lambda: window.live.recording.store is not None, timeout=5000)
    finally:
        holder.communicate(timeout=60)
    return window, db, said


def test_a_window_run_outlasts_a_locked_store_and_says_it_waits(qtbot, make_window, tmp_path, monkeypatch):
    window, db, said = _record_while_locked(qtbot, make_window, tmp_path, monkeypatch, 3)
    run_id = window.model.config.run_id
    qtbot.waitUntil(lambda: window.live.recording.store.get_run(run_id).status == "completed", timeout=30000)
    assert window.live.recording.store.count_rounds(run_id) == len(window.model.rounds)
    assert any("is locked by another connection" in text for text in said), said
    assert window.last_error is None


def test_past_the_wait_the_window_names_the_file_the_run_went_to(qtbot, make_window, tmp_path, monkeypatch):
    window, db, said = _record_while_locked(qtbot, make_window, tmp_path, monkeypatch, 6, SPECSCOPE_LOCK_WAIT_S="1")
    qtbot.waitUntil(lambda: window.last_error is not None, timeout=30000)
    [spilled] = tmp_path.glob("locked.sqlite.*.jsonl")
    assert str(spilled) in window.last_error and "specscope import" in window.last_error
    from specscope.storage import TraceStore, import_run

    with TraceStore(tmp_path / "other.sqlite") as other:
        run_id = import_run(other, spilled)
        assert other.count_rounds(run_id) == len(window.model.rounds)


def test_a_store_locked_when_the_run_starts_sends_the_window_run_to_a_file(qtbot, make_window, tmp_path, monkeypatch):
    """A lock met as the run starts ends as one met later: the run is recorded to the file the
    window names, not lost ("not being recorded"), and import puts it in the store."""
    from specscope.storage import TraceStore, import_run
    from tests.storage.writer.test_locked_store import hold_lock

    monkeypatch.setenv("SPECSCOPE_BUSY_TIMEOUT_S", "0.3")
    monkeypatch.setenv("SPECSCOPE_LOCK_WAIT_S", "1")
    db = tmp_path / "locked.sqlite"
    TraceStore(db).close()
    window = make_window(store_path=str(db))
    said = []
    window.live.activity.connect(said.append)
    configure(window, max_new_tokens="20")
    holder = hold_lock(db, 120)
    try:
        assert window.start_run()
        wait_idle(qtbot, window, timeout=60000)
        qtbot.waitUntil(lambda: window.last_error is not None, timeout=30000)
    finally:
        holder.kill()
        holder.wait(10)
    [spilled] = tmp_path.glob("locked.sqlite.*.jsonl")
    assert "not being recorded" not in window.last_error
    assert str(spilled) in window.last_error and "specscope import" in window.last_error, window.last_error
    assert any(f"goes to {spilled}" in text for text in said), said
    with TraceStore(db) as store:
        run_id = import_run(store, spilled)
        assert run_id == window.model.config.run_id
        assert store.count_rounds(run_id) == len(window.model.rounds) > 0
