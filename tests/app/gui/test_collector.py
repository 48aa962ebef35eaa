"""While a window lives, Python's cyclic garbage is collected on the GUI thread only: a
collection on the decoder's thread destroyed Qt objects there and deadlocked the window
against the GUI thread (the SmolLM2 walk hung for good in the suite)."""

from __future__ import annotations

import gc
import threading

from specscope.app.gui import collector


def _cycles(n: int) -> None:
    for _ in range(n):
        a: list = []
        a.append(a)  # garbage only the cyclic collector frees


def test_a_worker_threads_garbage_is_collected_on_the_gui_thread(window, qtbot):
    gui = threading.get_ident()
    collected_on: list[int] = []

    def note(phase: str, info: dict) -> None:
        if phase == "start":
            collected_on.append(threading.get_ident())

    gc.callbacks.append(note)
    try:
        worker = threading.Thread(target=_cycles, args=(50 * gc.get_threshold()[0],))
        worker.start()
        worker.join()
        qtbot.waitUntil(lambda: gui in collected_on, timeout=5000)
    finally:
        gc.callbacks.remove(note)
    assert set(collected_on) == {gui}  # none on the worker thread
    assert gc.get_count()[0] <= gc.get_threshold()[0] + 5000  # and the garbage did not pile up


def test_the_last_window_closed_gives_collection_back(make_window):
    assert gc.isenabled()
    first, second = make_window(), make_window()
    assert not gc.isenabled()
    first.close()
    assert not gc.isenabled()  # one window still open
    second.close()
    assert gc.isenabled()
    collector.release()  # an extra release changes nothing
    assert gc.isenabled()
