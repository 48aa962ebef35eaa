"""Work around a refcount bug of PySide6/shiboken6 6.12.0 on CPython < 3.12.

That build returns None from every void-returning wrapped method (QPainter.setPen,
QObject.setObjectName, ...) without taking a reference, so each call lowers None's
reference count by one. On Python 3.12+ None is immortal and nothing happens; on 3.11 a
GUI that paints for a few seconds drives the count to zero and the interpreter aborts
with "Fatal Python error: none_dealloc". Painting pyqtgraph plots hits it within minutes.

`guard_none_refcount()` detects the bug with a few harmless calls and, only when it is
present, raises None's reference count by 2**40 so it can never reach zero. It is a no-op
on fixed versions and on Python 3.12+.
"""

from __future__ import annotations

import ctypes
import logging
import platform
import sys

log = logging.getLogger(__name__)

PIN = 1 << 40
_guarded = False


def leaks_none_refs() -> bool:
    """True when wrapped void methods drop a reference to None."""
    from PySide6.QtGui import QColor

    color = QColor()
    before = sys.getrefcount(None)
    for _ in range(64):
        color.setRed(1)
    return sys.getrefcount(None) < before - 32


def guard_none_refcount() -> bool:
    """Pin None when the bug is present; returns True when the guard is active."""
    global _guarded
    if _guarded:
        return True
    if sys.version_info >= (3, 12) or platform.python_implementation() != "CPython":
        return False
    try:
        if not leaks_none_refs():
            return False
        ctypes.c_ssize_t.from_address(id(None)).value += PIN
    except Exception:
        log.exception("could not apply the PySide6 None-refcount workaround")
        return False
    _guarded = True
    import PySide6

    log.info(
        "PySide6 %s drops references to None; pinned None (CPython %s)", PySide6.__version__, platform.python_version()
    )
    return True
