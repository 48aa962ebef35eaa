"""launch() as the CLI calls it, drag-and-drop, EOS marking and exports."""

from __future__ import annotations

from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent

from tests.app.helpers import configure, wait_idle


def test_eos_ends_the_run_and_is_marked(qtbot, window):
    configure(window, max_new_tokens="30")
    window.start_run()
    wait_idle(qtbot, window)
    out = window.model.output_tokens
    eos = out[6]
    first = out.index(eos)
    configure(window, max_new_tokens="30", eos=str(eos))
    window.start_run()
    wait_idle(qtbot, window)
    model = window.model
    assert model.stop_reason == "eos"
    assert model.output_tokens == out[: first + 1]  # greedy: same tokens, cut at EOS
    last = model.cells.cell(model.cells.out_cell[-1])
    assert last.eos and last.token == eos
    assert sum(model.cells.eos) == 1
    assert "EOS" in window.timeline.tooltip_for(model.cells.out_cell[-1])


def test_export_views_and_jsonl(qtbot, window, tmp_path):
    configure(window, max_new_tokens="12")
    window.start_run()
    wait_idle(qtbot, window)
    written = window.exports.export_all(str(tmp_path))
    names = {p.rsplit("specscope-", 1)[1] for p in written}
    assert {"window.png", "timeline.png", "inspector.png", "tree.png", "plots.png"} <= names
    assert all((tmp_path / f"specscope-{n}").stat().st_size > 1000 for n in names)
    assert window.exports.export_jsonl(str(tmp_path / "run.jsonl"))
    assert (tmp_path / "run.jsonl").read_text().count("\n") >= len(window.model.rounds)


def test_drop_a_trace_file_opens_it(qtbot, make_window, tmp_path):
    store = str(tmp_path / "dropped.sqlite")
    w = make_window(store_path=store)
    configure(w, max_new_tokens="12")
    w.start_run()
    wait_idle(qtbot, w)
    r = make_window(store_path=str(tmp_path / "other.sqlite"))
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(store)])
    event = QDropEvent(
        QPointF(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier
    )
    r.dropEvent(event)
    qtbot.waitUntil(lambda: r.replay.loaded_all, timeout=20000)
    assert r.mode == "replay" and r.model.output_tokens == w.model.output_tokens


LAUNCH_SCRIPT = r"""
import sys
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication
import specscope.app.gui as gui
from specscope.app.gui import main_window as mw
from tests.tiny_hub import TinyModelHub

mw.ModelHub = TinyModelHub  # the tiny models, not the bundled ones
store = sys.argv[1]
gui.create_app()  # timers need the application; launch() reuses it

def check():
    wins = [w for w in QApplication.topLevelWidgets() if isinstance(w, mw.MainWindow) and w.isVisible()]
    if wins and wins[0].replay.loaded_all:
        w = wins[0]
        print("RESULT", w.mode, len(w.model.rounds), w.session.trace_path == store, flush=True)
        w.close()  # the last window: the application quits
    else:
        QTimer.singleShot(50, check)

QTimer.singleShot(50, check)
QTimer.singleShot(60000, QApplication.quit)
sys.exit(gui.launch(store))
"""


def test_launch_opens_a_trace_and_returns_the_exit_code(qtbot, make_window, tmp_path):
    """launch() runs its own event loop, so it runs in a child process (a finished
    QApplication.exec() would stop this process's later event loops)."""
    import os
    import subprocess
    import sys

    store = str(tmp_path / "launch.sqlite")
    w = make_window(store_path=store)
    configure(w, max_new_tokens="10")
    w.start_run()
    wait_idle(qtbot, w)
    env = dict(
        os.environ,
        QT_QPA_PLATFORM="offscreen",
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        SPECSCOPE_DB=str(tmp_path / "launch-default.sqlite"),
    )
    proc = subprocess.run(
        [sys.executable, "-c", LAUNCH_SCRIPT, store],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
    )  # in the checkout: the script imports the tests' tiny hub
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    assert line.split()[1:] == ["replay", str(len(w.model.rounds)), "True"]
