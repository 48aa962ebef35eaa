"""Fixtures for the GUI tests: real window, real (tiny) models, QSettings in a tmp dir."""

from __future__ import annotations

import pytest


@pytest.fixture
def gui_env(tmp_path, monkeypatch):
    """QSettings and the default trace store never touch the user's home."""
    pytest.importorskip("PySide6")
    pytest.importorskip("pytestqt")
    from PySide6.QtCore import QSettings

    import specscope.app.gui  # noqa: F401  (applies the PySide6 None-refcount guard first)

    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp_path / "qsettings"))
    monkeypatch.setenv("SPECSCOPE_DB", str(tmp_path / "default-traces.sqlite"))


@pytest.fixture(scope="session")
def hub():
    """Tiny random Llama target + two perturbed drafts, built once for the session."""
    pytest.importorskip("PySide6")
    from tests.tiny_hub import TinyModelHub

    return TinyModelHub()


@pytest.fixture(scope="session")
def bundled_hub():
    """The bundled models (target, drafts, the EAGLE-3 head's target), loaded once."""
    pytest.importorskip("PySide6")
    from specscope.app.gui.sessions.hub import ModelHub

    hub = ModelHub()
    if hub.missing:
        pytest.skip("the bundled models are not installed")
    return hub


@pytest.fixture
def settings_file(gui_env, tmp_path):
    from PySide6.QtCore import QSettings

    return QSettings(str(tmp_path / "specscope.ini"), QSettings.Format.IniFormat)


@pytest.fixture
def make_window(qtbot, hub, settings_file, tmp_path):
    from specscope.app.gui import create_app
    from specscope.app.gui.main_window import MainWindow

    create_app()
    made = []

    def make(record: bool = True, settings=None, store_path=None):
        w = MainWindow(
            hub=hub,
            settings=settings or settings_file,
            record=record,
            store_path=store_path or str(tmp_path / "traces.sqlite"),
        )
        qtbot.addWidget(w)
        w.resize(1400, 900)
        w.show()
        made.append(w)
        return w

    yield make
    for w in made:
        dispose(w)


def dispose(window) -> None:
    """Close a window and let Qt delete it now, then collect Python's garbage at this quiet
    point: a collection that otherwise fell in the middle of building the next window once
    finalised a closed window's pyqtgraph items there and crashed the interpreter."""
    import gc

    import shiboken6
    from PySide6.QtCore import QCoreApplication, QEvent

    if shiboken6.isValid(window):
        window.close()
        window.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    QCoreApplication.processEvents()
    gc.collect()


@pytest.fixture
def window(make_window):
    return make_window()
