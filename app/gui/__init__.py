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
from collections.abc import Sequence
from typing import Any, NoReturn

from ._compat import guard_none_refcount
from .startup import mark

__all__ = ["create_app", "launch", "missing_xcb_cursor", "missing_xcb_packages"]

# The system libraries Qt's xcb platform plugin (libqxcb.so and libQt6XcbQpa) links against, by
# soname, with the Debian/Ubuntu package that ships each. Any one missing and Qt says only that it
# "could not load the Qt platform plugin xcb" (naming libxcb-cursor0 however the plugin failed).
XCB_PLUGIN_LIBRARIES = (
    ("libxcb-cursor.so.0", "libxcb-cursor0"),
    ("libxcb-icccm.so.4", "libxcb-icccm4"),
    ("libxcb-keysyms.so.1", "libxcb-keysyms1"),
    ("libxcb-image.so.0", "libxcb-image0"),
    ("libxcb-render-util.so.0", "libxcb-render-util0"),
    ("libxcb-util.so.1", "libxcb-util1"),
    ("libxcb-randr.so.0", "libxcb-randr0"),
    ("libxcb-shape.so.0", "libxcb-shape0"),
    ("libxcb-shm.so.0", "libxcb-shm0"),
    ("libxcb-sync.so.1", "libxcb-sync1"),
    ("libxcb-xfixes.so.0", "libxcb-xfixes0"),
    ("libxcb-render.so.0", "libxcb-render0"),
    ("libxcb-xkb.so.1", "libxcb-xkb1"),
    ("libxcb.so.1", "libxcb1"),
    ("libX11-xcb.so.1", "libx11-xcb1"),
    ("libX11.so.6", "libx11-6"),
    ("libxkbcommon.so.0", "libxkbcommon0"),
    ("libxkbcommon-x11.so.0", "libxkbcommon-x11-0"),
    ("libGL.so.1", "libgl1"),
    ("libglib-2.0.so.0", "libglib2.0-0"),
)

log = logging.getLogger(__name__)

# Must run before any painting: see _compat (PySide6 6.12.0 + CPython 3.11 refcount bug).
guard_none_refcount()


def missing_xcb_packages() -> list[str]:
    """The Debian/Ubuntu packages Qt's xcb platform plugin needs that this machine lacks, in
    XCB_PLUGIN_LIBRARIES' order; empty off Linux, on Wayland, offscreen or without a display
    (xcb is not what Qt tries there). A fresh Debian lacks libxcb-cursor0; a minimal one lacks
    libxcb-icccm4 and libxcb-keysyms1 too, and Qt then names libxcb-cursor0 all the same."""
    platform = os.environ.get("QT_QPA_PLATFORM", "")
    if not sys.platform.startswith("linux") or (platform and not platform.startswith("xcb")):
        return []
    if not platform and (os.environ.get("WAYLAND_DISPLAY") or not os.environ.get("DISPLAY")):
        return []
    import ctypes

    missing = []
    for soname, package in XCB_PLUGIN_LIBRARIES:
        try:
            ctypes.CDLL(soname)
        except OSError:
            missing.append(package)
    return missing


def missing_xcb_cursor() -> bool:
    """Whether Qt's xcb platform plugin will fail for want of libxcb-cursor0 (Qt 6.5 and later)."""
    return "libxcb-cursor0" in missing_xcb_packages()


def xcb_fix(packages: Sequence[str]) -> str:
    """The one command that installs `packages`."""
    return "sudo apt-get install " + " ".join(packages)


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
    from .sessions.worker import decoder_threads_running

    if decoder_threads_running():
        # a decoder thread left inside a model load or torch's import (quitting does not wait
        # for it): PySide's exit handler would destroy its QThread while it runs, which aborts
        # the process, so only the exit work that matters runs: the recordings' last rounds
        # and ends, and logging's flush
        import logging

        from specscope.storage.writer.api import finish_forgotten_writers

        finish_forgotten_writers()
        logging.shutdown()
    else:
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed or absent: nothing left to write
            pass
    os._exit(code)


def launch(
    trace_path: str | None = None,
    argv: Sequence[str] | None = None,
    run_id: str | None = None,
    threads: int | None = None,
) -> int:
    """Open the main window (replaying `trace_path`, run `run_id` when given, else asking
    which run); `threads` sets the run panel's torch threads. Once the window has closed
    (its recordings finished), the process ends with the exit code (end_process); only a
    refusal to start returns one."""
    missing = missing_xcb_packages()
    if missing:
        print(
            f"specscope: Qt's xcb platform plugin needs {', '.join(missing)}, which "
            f"{'is' if len(missing) == 1 else 'are'} not installed; install "
            f"{'it' if len(missing) == 1 else 'them'} with: {xcb_fix(missing)}",
            file=sys.stderr,
        )
        return 1
    mark("launch-called")
    app = create_app(argv, plots=False)
    starting = starting_window()
    mark("starting-window-shown")  # visible at once: pyqtgraph and the window take a second or two on a busy machine
    configure_plots()
    from .main_window import (
        MainWindow,  # imports neither torch nor transformers (tests/app/gui/sessions/test_fast_window.py)
    )

    mark("imports-done")
    window = MainWindow()
    window.quick_quit = True  # end_process ends the process after the close: a preload need not finish
    if threads:
        window.run_panel.set_field("threads", str(threads))
    window.show()
    mark("main-window-shown")
    starting.close()
    _install_excepthook(window)
    if trace_path:
        from PySide6.QtCore import QTimer

        # The trace first, then the models: the preload's torch import (which holds the GIL
        # for seconds) ran beside the run picker's reading and kept it off screen 13 s after
        # the window on a busy machine; a replay needs no model.
        window.defer_preload = True

        def open_then_preload() -> None:
            try:
                window.open_trace(str(trace_path), run_id=run_id)
            finally:
                window.defer_preload = False
                if not window.closed:
                    window.start_preload()

        QTimer.singleShot(0, open_then_preload)
    code = int(app.exec())
    if not window.closed:  # the application quit without closing the window: finish its runs and recordings
        window.close()
    end_process(code)
