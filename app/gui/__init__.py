"""specscope.app.gui: the Qt inspector (PySide6 + pyqtgraph).

    from specscope.app.gui import launch
    launch()                      # the main window with the bundled models
    launch("traces.sqlite")       # replay a saved trace

Views (*View / *Widget) receive a RunModel and subscribe to it; the decoder runs in a
worker thread (worker.py) and talks to the GUI only through queued signals.
"""

from __future__ import annotations

import logging
import sys
from typing import Sequence

from ._compat import guard_none_refcount

__all__ = ["launch", "create_app"]

log = logging.getLogger(__name__)

# Must run before any painting: see _compat (PySide6 6.12.0 + CPython 3.11 refcount bug).
guard_none_refcount()


def create_app(argv: Sequence[str] | None = None):
    """The QApplication (created once), with the organisation/app names QSettings uses."""
    from PySide6.QtWidgets import QApplication

    from .main_window import APPLICATION, ORGANIZATION

    app = QApplication.instance()
    if app is None:
        app = QApplication(list(argv) if argv is not None else [sys.argv[0] if sys.argv else "specscope"])
    app.setOrganizationName(ORGANIZATION)
    app.setApplicationName(APPLICATION)
    app.setApplicationDisplayName("specscope")
    import pyqtgraph as pg

    pg.setConfigOptions(antialias=True, background="w", foreground="#333333")
    return app


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


def launch(trace_path: str | None = None, argv: Sequence[str] | None = None, run_id: str | None = None,
           threads: int | None = None) -> int:
    """Open the main window (replaying `trace_path`, run `run_id` when given, else asking
    which run); `threads` sets the run panel's torch threads; return the exit code."""
    app = create_app(argv)
    from .main_window import MainWindow

    window = MainWindow()
    if threads:
        window.run_panel.set_field("threads", str(threads))
    window.show()
    _install_excepthook(window)
    if trace_path:
        from PySide6.QtCore import QTimer

        QTimer.singleShot(0, lambda: window.open_trace(str(trace_path), run_id=run_id))
    code = app.exec()
    return int(code)
