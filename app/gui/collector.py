"""Python's cyclic garbage collector, run on the GUI thread only while a window lives.

Python collects garbage in whichever thread happens to allocate when a generation's count
passes its threshold. When that is the decoder's worker thread and the garbage holds Qt
objects (a menu or a widget whose wrapper sat in a reference cycle), their C++ destructors
run on the worker thread; they take Qt's locks and then need the interpreter lock, which the
GUI thread may hold while it waits on one of those locks: both threads stop for good. (Seen
in the SmolLM2 walk test: the worker parsing a tokenizer's JSON triggered a collection that
destroyed a QMenu while the GUI thread was deleting another.)

So while a window lives, automatic collection is off and a timer on the GUI thread collects
each generation when its count passes the threshold Python would have used: the same
collections, only never on another thread. Reference counting, which frees almost
everything, is untouched. When the last window closes, automatic collection comes back as
it was.
"""

from __future__ import annotations

import gc

from PySide6.QtCore import QObject, QTimer

CHECK_MS = 250  # how often the GUI thread looks at the counts (a collection takes about a millisecond)


class _Collector(QObject):
    def __init__(self) -> None:
        super().__init__()
        self.users = 0
        self.was_enabled = gc.isenabled()
        self.timer = QTimer(self)
        self.timer.setInterval(CHECK_MS)
        self.timer.timeout.connect(self.collect)

    def collect(self) -> None:
        """Collect the oldest generation whose count passed its threshold, as Python would."""
        counts, thresholds = gc.get_count(), gc.get_threshold()
        for generation in (2, 1, 0):
            if thresholds[generation] and counts[generation] > thresholds[generation]:
                gc.collect(generation)
                return


_collector: _Collector | None = None


def acquire() -> None:
    """A window opens: collect on the GUI thread from now on (call it from the GUI thread)."""
    global _collector
    if _collector is None:
        _collector = _Collector()
    if _collector.users == 0:
        _collector.was_enabled = gc.isenabled()
        gc.disable()
        _collector.timer.start()
    _collector.users += 1


def release() -> None:
    """A window closed: the last one gives collection back to Python as it found it."""
    if _collector is None or _collector.users == 0:
        return
    _collector.users -= 1
    if _collector.users == 0:
        _collector.timer.stop()
        if _collector.was_enabled:
            gc.enable()
