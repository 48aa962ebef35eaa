"""Issue 32 item 8: the main window appears before torch and transformers are imported (the
worker thread imports them and loads the models), a Run asked for meanwhile waits, and
quitting skips the interpreter's teardown without losing a trace writer's rounds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# Builds MainWindow offscreen with torch and transformers unimportable; reports what the GUI
# thread tried to import, what the window said before and after its first event-loop ticks.
BLOCKED_WINDOW = textwrap.dedent(r"""
    import importlib.abc, json, sys, threading, time, traceback

    attempts = []  # (thread name, module, where)

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("torch", "transformers"):
                attempts.append((threading.current_thread().name, name, "".join(traceback.format_stack(limit=8))))
                raise ImportError("blocked " + name)

    sys.meta_path.insert(0, Block())

    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    app = QApplication([])
    from specscope.app.gui import configure_plots
    configure_plots()
    from specscope.app.gui.main_window import MainWindow, flush_events

    proposer = sys.argv[2]
    settings = QSettings(sys.argv[1], QSettings.Format.IniFormat)
    if proposer:
        settings.setValue("run/proposer", proposer)
    window = MainWindow(settings=settings, record=False)
    window.show()
    before = {"status": window.statusBar().currentMessage(), "panel": window.run_panel.state_label.text()}
    deadline = time.time() + 60
    while time.time() < deadline and not window.statusBar().currentMessage().startswith("Models not preloaded"):
        flush_events(0.05)
    flush_events(0.3)  # a few more ticks: the window redraws with the worker's answer
    main = threading.main_thread().name
    print("RESULT " + json.dumps({
        "visible": window.isVisible(),
        "before": before,
        "after": {"status": window.statusBar().currentMessage(), "panel": window.run_panel.state_label.text()},
        "gui_thread": [where for thread, _, where in attempts if thread == main],
        "worker_tried": sorted({name for thread, name, _ in attempts if thread != main}),
        "torch_loaded": "torch" in sys.modules,
    }), flush=True)
    window.close()
""")


def _blocked_window(tmp_path, proposer: str = "") -> dict:
    env = dict(
        os.environ,
        QT_QPA_PLATFORM="offscreen",
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        SPECSCOPE_DB=str(tmp_path / "default.sqlite"),
    )
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED_WINDOW, str(tmp_path / "specscope.ini"), proposer],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(line.removeprefix("RESULT "))


@pytest.mark.parametrize("proposer", ["", "lookup:max_ngram=4", "draft:small,tree=3,2,1,children=sampled"])
def test_the_main_window_shows_without_torch_or_transformers(tmp_path, proposer):
    """The window waited 5 s for torch and transformers: every GUI module reached them through
    core.loading and the proposer registry (and the panel's check built a lookup proposer)."""
    pytest.importorskip("PySide6")
    result = _blocked_window(tmp_path, proposer)
    assert result["visible"]
    assert result["gui_thread"] == [], "the GUI thread imported torch or transformers:\n" + "\n".join(
        result["gui_thread"]
    )
    assert "loading models" in result["before"]["panel"].lower()
    assert result["before"]["status"].startswith("Loading models: torch, then the")
    # the worker thread is where torch loads: here it could not, and the window says so
    assert "torch" in result["worker_tried"] and not result["torch_loaded"]
    assert result["after"]["status"].startswith("Models not preloaded: blocked torch")
    assert "loading models" not in result["after"]["panel"].lower()


def test_a_run_asked_for_before_the_models_load_runs(qtbot, make_window):
    """Run in the window's first moments (no event processed yet, no model preloaded): the
    run waits in the worker's queue and completes."""
    from tests.app.helpers import configure, wait_idle

    window = make_window()
    configure(window, max_new_tokens="8")
    assert window.start_run()
    wait_idle(qtbot, window)
    assert window.model.stop_reason == "budget" and len(window.model.output_tokens) == 8


class _UnlistedDevicesHub:
    """The tiny hub before torch is imported: only cpu known until the worker lists the devices."""

    def __init__(self, hub, found: tuple[str, ...]):
        self._hub, self._found, self.listed = hub, found, False

    def __getattr__(self, name):
        return getattr(self._hub, name)

    @property
    def devices_known(self) -> bool:
        return self.listed

    def devices(self) -> tuple[str, ...]:
        return self._found if self.listed else ("cpu",)


@pytest.mark.parametrize("found", [("cpu", "cuda", "cuda:0"), ("cpu",)])
def test_a_run_on_a_device_not_yet_listed_waits_for_the_list(make_window, monkeypatch, found):
    """A remembered cuda device cannot be checked before torch loads: the Run waits for the
    worker's device list, then starts, or is refused under the field as before."""
    from tests.app.helpers import configure

    window = make_window(record=False)
    window.hub = _UnlistedDevicesHub(window.hub, found)
    configure(window, device="cuda")
    started = []
    monkeypatch.setattr(window.live, "start", lambda settings, run=True: started.append((settings.device, run)))
    assert window.start_run()
    assert started == [] and "once torch has loaded" in window.statusBar().currentMessage()
    window.hub.listed = True
    window._on_devices(found)
    if "cuda" in found:
        assert started == [("cuda", True)] and window.run_panel.device.findText("cuda:0") >= 0
    else:
        assert started == [] and "not available" in window.run_panel.errors["device"].text()


END_PROCESS_SCRIPT = textwrap.dedent(r"""
    import sys
    from specscope.storage import TraceStore, TraceWriter
    from specscope.app.gui import end_process
    from tests.storage.helpers import synthetic_config, synthetic_rounds

    config = synthetic_config(run_id="end-process-run")
    store = TraceStore(sys.argv[1])
    writer = TraceWriter(store, config, flush_interval=30)  # nothing flushed before the exit
    for rnd in synthetic_rounds(config, 9):
        writer.write(rnd)
    print("written", flush=True)
    end_process(3)
""")


def test_ending_the_process_keeps_a_writers_pending_rounds(tmp_path):
    """Quitting skips the interpreter's teardown (2-3 s of freeing torch and Qt): the trace
    writer's queued rounds must still reach the store, its run marked interrupted."""
    from specscope.storage import TraceStore

    path = tmp_path / "pending.sqlite"
    done = subprocess.run(
        [sys.executable, "-c", END_PROCESS_SCRIPT, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(Path(__file__).resolve().parents[4]),  # the repository
    )
    assert done.returncode == 3, done.stderr[-2000:]
    assert "written" in done.stdout  # flushed before the exit
    with TraceStore(path) as store:
        info = store.get_run("end-process-run")
        assert store.count_rounds("end-process-run") == 9
    assert info.status == "interrupted"


def test_the_tokenizer_is_not_held_up_by_a_model_load_under_another_key():
    """`specscope open TRACE` asks for the tokenizer on the GUI thread while the worker loads
    the target: one lock for every cached value froze the window for the whole load."""
    import threading

    from specscope.app.gui.sessions.hub import ModelHub

    hub = ModelHub()
    loading_started, release = threading.Event(), threading.Event()

    def slow_model():
        loading_started.set()
        release.wait(10)
        return "model"

    worker = threading.Thread(target=lambda: hub.cached(("target", "slow"), slow_model))
    worker.start()
    assert loading_started.wait(10)
    got = []
    asker = threading.Thread(target=lambda: got.append(hub.cached(("tokenizer", "fast"), lambda: "tokenizer")))
    try:
        asker.start()
        asker.join(3)
        assert got == ["tokenizer"]  # answered while the model was still loading
    finally:
        release.set()
        worker.join(10)
    made = []
    assert hub.cached(("target", "slow"), lambda: made.append(1)) == "model" and not made  # made once


def test_a_fresh_tiny_hub_makes_its_target_and_drafts_without_hanging():
    """The tiny drafts are made from the tiny target: with one non-re-entrant lock per key, a
    value that asked for its own key while being made hung the preload thread for ever (CI
    timed out, and a window closed over the hung thread aborted the interpreter)."""
    import threading

    from tests.tiny_hub import TinyModelHub

    hub = TinyModelHub()
    got = {}

    def load():
        got["target"] = hub.target("cpu")[0]
        got["small"] = hub.draft("small", "cpu")
        got["tiny"] = hub.draft("tiny", "cpu")

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    loader.join(120)
    assert not loader.is_alive(), "the tiny hub hung while making its models"
    assert got["target"] is hub.target("cpu")[0]  # cached, made once
    assert got["small"] is not got["target"] and got["tiny"] is not got["small"]


def test_a_value_that_asks_for_its_own_key_while_being_made_does_not_hang():
    import threading

    from specscope.app.gui.sessions.hub import ModelHub

    hub = ModelHub()
    got = []
    asker = threading.Thread(
        target=lambda: got.append(hub.cached(("k",), lambda: hub.cached(("k",), lambda: "inner"))), daemon=True
    )
    asker.start()
    asker.join(10)
    assert got == ["inner"]


CLOSE_DURING_LOAD = r"""
import gc, threading
from PySide6.QtCore import QCoreApplication
from specscope.app.gui.sessions.hub import ModelHub
from specscope.app.gui.sessions.worker import RunController

app = QCoreApplication([])
started, release = threading.Event(), threading.Event()

class SlowHub(ModelHub):
    def detect_devices(self):
        return ["cpu"]
    def target(self, device, name=""):
        started.set()
        release.wait(20)  # a model load nothing can interrupt
        raise RuntimeError("load abandoned")

controller = RunController(SlowHub())
controller.preload("cpu")
assert started.wait(20)
controller.close(timeout_ms=200)
del controller
gc.collect()
print("survived the close", flush=True)
from specscope.app.gui.sessions import worker
release.set()  # the load ends; the kept thread then finishes (the app itself ends with os._exit)
assert all(thread.wait(20000) for thread, _ in worker._STILL_RUNNING)
"""


def test_closing_while_the_worker_is_still_loading_does_not_abort_the_process(tmp_path):
    """A window closed during a model load that outlasted the close's wait destroyed the
    running QThread: Qt aborted the process (the clean-clone CI under load, SIGABRT)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", CLOSE_DURING_LOAD],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "QT_QPA_PLATFORM": "offscreen"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "survived the close" in done.stdout
