"""The PySide6 6.12 None-refcount workaround (see specscope.app.gui._compat)."""

import sys

import pytest


def test_void_calls_cannot_free_none():
    pytest.importorskip("PySide6")
    import specscope.app.gui  # noqa: F401  (the guard runs on import)
    from specscope.app.gui._compat import guard_none_refcount, leaks_none_refs

    if leaks_none_refs() and sys.version_info < (3, 12):
        assert guard_none_refcount()
        assert sys.getrefcount(None) > 2**39
    from PySide6.QtGui import QColor

    color = QColor()
    for _ in range(200_000):  # would abort the interpreter without the guard
        color.setRed(1)
