"""specscope.app.gui: the Qt inspector (PySide6 + pyqtgraph).

    from specscope.app.gui import launch
    launch()                      # the main window with the bundled models
    launch("traces.sqlite")       # replay a saved trace

Views (*View / *Widget) receive a RunModel and subscribe to it; the decoder runs in a
worker thread (worker.py) and talks to the GUI only through queued signals.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, NoReturn, Sequence

from ._compat import guard_none_refcount
from .startup import mark

__all__ = ["launch", "create_app", "missing_xcb_cursor"]

XCB_FIX = "sudo apt-get install libxcb-cursor0"

log = logging.getLogger(__name__)

# Must run before any painting: see _compat (PySide6 6.12.0 + CPython 3.11 refcount bug).
guard_none_refcount()


def missing_xcb_cursor() -> bool:
    """Whether Qt's xcb platform plugin will fail for want of libxcb-cursor (Qt 6.5 and later
    need it; a fresh Debian lacks it, and Qt then only says it "could not load the Qt platform
    plugin xcb")."""
    platform = os.environ.get("QT_QPA_PLATFORM", "")
    if not sys.platform.startswith("linux") or (platform and not platform.startswith("xcb")):
        return False
    if not platform and (os.environ.get("WAYLAND_DISPLAY") or not os.environ.get("DISPLAY")):
        return False  # Wayland, or no display at all: xcb is not what Qt tries
    import ctypes

    try:
        ctypes.CDLL("libxcb-cursor.so.0")
    except OSError:
        return True
    return False


def create_app(argv: Sequence[str] | None = None, plots: bool = True):
    """The QApplication (created once), with the organisation/app names QSettings uses;
    pyqtgraph configured too unless `plots` is False (launch does it after showing the
    start-up window: importing pyqtgraph takes a second or two)."""
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance()
    if app is None:
        app = QApplication(list(argv) if argv is not None else [sys.argv[0] if sys.argv else "specscope"])
    app.setOrganizationName("specscope")  # main_window's ORGANIZATION and APPLICATION
    app.setApplicationName("specscope")
    app.setApplicationDisplayName("specscope")
    if plots:
        configure_plots()
    return app


def configure_plots() -> None:
    import pyqtgraph as pg

    pg.setConfigOptions(antialias=True, background="w", foreground="#333333")


def starting_window() -> Any:
    """A small window shown the moment Qt is up, saying what start-up is doing; the main
    window (built without torch and transformers: its worker thread imports them and loads
    the models once the window is on screen) replaces it a second or two later."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QApplication, QLabel

    label = QLabel()
    label.setWindowTitle("specscope")
    label.setAlignment(Qt.AlignmentFlag.AlignCenter)
    label.setMinimumSize(420, 120)
    label.setStyleSheet("font-size: 11pt; padding: 16px;")

    def say(text: str) -> None:
        label.setText(f"<b>specscope</b> is starting…<br>{text}")
        label.repaint()
        QApplication.processEvents()

    label.say = say  # type: ignore[attr-defined]
    label.show()
    say("building the window (the models load next, in the background)")
    return label


def _install_excepthook(window) -> None:
    """Uncaught exceptions in GUI callbacks become an error dialog, never a dead window."""
    import traceback

    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        if issubclass(exc_type, KeyboardInterrupt):
            previous(exc_type, exc, tb)
            return
        details = "".join(traceback.format_exception(exc_type, exc, tb))
        log.error("unexpected error\n%s", details)
        try:
            window.show_error(f"Unexpected error: {exc_type.__name__}: {exc}", details)
        except Exception:  # noqa: BLE001 - the window may be gone
            previous(exc_type, exc, tb)

    sys.excepthook = hook


def end_process(code: int) -> NoReturn:
    """Exit now, skipping the interpreter's teardown: freeing torch's, transformers' and Qt's
    modules and objects took 2-3 s after the window closed. What the teardown would have done
    that matters is done first: the atexit handlers (the trace writers' last rounds and
    finish, storage.writer.api; logging's flush), waiting for non-daemon threads, flushing
    stdout and stderr."""
    import atexit
    import threading

    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed or absent: nothing left to write
            pass
    os._exit(code)


def launch(trace_path: str | None = None, argv: Sequence[str] | None = None, run_id: str | None = None,
           threads: int | None = None) -> int:
    """Open the main window (replaying `trace_path`, run `run_id` when given, else asking
    which run); `threads` sets the run panel's torch threads. Once the window has closed
    (its recordings finished), the process ends with the exit code (end_process); only a
    refusal to start returns one."""
    if missing_xcb_cursor():
        print("specscope: Qt's xcb platform plugin needs libxcb-cursor0, which is not installed; install it "
              f"with: {XCB_FIX}", file=sys.stderr)
        return 1
    mark("launch-called")
    app = create_app(argv, plots=False)
    starting = starting_window()
    mark("starting-window-shown")  # visible at once: pyqtgraph and the window take a second or two on a busy machine
    configure_plots()
    from .main_window import MainWindow  # imports neither torch nor transformers (tests/app/test_fast_window.py)

    mark("imports-done")
    window = MainWindow()
    if threads:
        window.run_panel.set_field("threads", str(threads))
    window.show()
    mark("main-window-shown")
    starting.close()
    _install_excepthook(window)
    if trace_path:
        from PySide6.QtCore import QTimer

        QTimer.singleShot(0, lambda: window.open_trace(str(trace_path), run_id=run_id))
    code = int(app.exec())
    if not window.closed:  # the application quit without closing the window: finish its runs and recordings
        window.close()
    end_process(code)
