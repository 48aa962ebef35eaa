"""The writer process: which mode a writer takes, the frames on its pipes, its failures."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from specscope.storage import TraceStore, TraceWriter, WriterError
from specscope.storage.writer.api import MODE_ENV, choose_mode
from specscope.storage.writer.frames import read_frame, write_frame
from specscope.storage.writer.process import writer_process
from tests.storage.helpers import assert_rounds_equal, synthetic_config, synthetic_rounds


def test_frames_round_trip_with_out_of_band_vectors():
    rounds = synthetic_rounds(synthetic_config(vocab=300), 3)
    strided = np.arange(20.0)[::3]  # not contiguous: travels in band
    stream = io.BytesIO()
    write_frame(stream, [("rounds", "r", rounds), ("x", strided)])
    write_frame(stream, [])
    stream.seek(0)
    (kind, run, back), (_, strided_back) = read_frame(stream)
    assert kind == "rounds" and run == "r"
    for a, b in zip(rounds, back):
        assert_rounds_equal(a, b, atol=0)
    assert np.array_equal(strided_back, strided)
    assert read_frame(stream) == [] and read_frame(stream) is None
    torn = io.BytesIO(stream.getvalue()[:40])
    with pytest.raises(EOFError):
        read_frame(torn)


def test_mode_choice(store, monkeypatch):
    monkeypatch.delenv(MODE_ENV, raising=False)
    assert choose_mode(store) == "thread"
    assert choose_mode(store, "process") == "process"
    with TraceStore("sqlite://") as memory:  # another process cannot open it
        assert choose_mode(memory, "process") == "thread"
    monkeypatch.setenv(MODE_ENV, "process")
    assert choose_mode(store) == "process"
    assert choose_mode(store, "thread") == "thread"  # an explicit mode wins
    monkeypatch.setenv(MODE_ENV, "fork")
    with pytest.raises(ValueError, match=MODE_ENV):
        choose_mode(store)
    with pytest.raises(ValueError, match="mode must be"):
        choose_mode(store, "green")


def test_one_writer_process_serves_concurrent_runs_in_two_stores(tmp_path):
    with TraceStore(tmp_path / "a.sqlite") as a, TraceStore(tmp_path / "b.sqlite") as b:
        ca, cb = synthetic_config(), synthetic_config(vocab=9000)
        ra, rb = synthetic_rounds(ca, 25), synthetic_rounds(cb, 7)
        wa = TraceWriter(a, ca, mode="process")
        wb = TraceWriter(b, cb, mode="process")
        assert wa._backend.service is wb._backend.service and wa._backend.service.pid != os.getpid()
        for i in range(25):
            wa.write(ra[i])
            if i < 7:
                wb.write(rb[i])
        wb.flush()
        assert wb.rounds_written == 7 and b.count_rounds(cb.run_id) == 7
        wb.finish("completed")
        wa.finish("completed")
        assert wa.rounds_written == 25
        for store, config, rounds in ((a, ca, ra), (b, cb, rb)):
            info = store.get_run(config.run_id)
            assert info.status == "completed" and info.n_rounds == len(rounds)
            assert info.writer_pid == os.getpid()  # the recording process, whose liveness matters
            for want, got in zip(rounds, store.load_rounds(config.run_id, full=True)):
                assert_rounds_equal(want, got, atol=1e-7 if info.full_vectors else 0, vectors=info.full_vectors)


def test_writer_process_killed_fails_the_run_and_the_next_writer_restarts_it(store):
    config = synthetic_config()
    rounds = synthetic_rounds(config, 5)
    writer = TraceWriter(store, config, mode="process")
    writer.write(rounds[0])
    writer.flush()
    old = writer._backend.service
    os.kill(old.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while writer.alive and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not writer.alive
    with pytest.raises(WriterError, match="writer process stopped"):
        writer.write(rounds[1])
    with pytest.raises(WriterError):
        writer.finish("completed")
    info = store.get_run(config.run_id)
    assert info.status == "failed" and "writer process stopped" in info.error and info.n_rounds == 1
    # a new writer gets a new writer process
    again = synthetic_config()
    with TraceWriter(store, again, mode="process") as fresh:
        assert fresh._backend.service is not old and fresh._backend.service.pid != old.pid
        fresh.write(synthetic_rounds(again, 1)[0])
    assert store.get_run(again.run_id).status == "completed"
    assert writer_process() is fresh._backend.service


def test_writer_process_imports_neither_torch_nor_qt():
    code = (
        "import sys, specscope.storage.writer.child\n"
        "print(sorted(m for m in ('torch', 'transformers', 'PySide6', 'specscope.app') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_writer_process_that_does_not_open_the_run_leaves_it_to_a_thread(store, monkeypatch):
    """The constructor waits until the writer process holds the run (so the flush promise
    starts at the first round). One that does not answer in time: the run is recorded from a
    thread, and the writer process, once it wakes, drops the run instead of marking it
    interrupted over the thread's result."""
    from specscope.storage.writer import backends

    service = writer_process()
    warm = synthetic_config()
    with TraceWriter(store, warm, mode="process") as w:
        assert w.mode == "process" and w._backend._opened.is_set()  # answered before returning
        w.write(synthetic_rounds(warm, 1)[0])
    monkeypatch.setattr(backends, "START_TIMEOUT_S", 1.0)
    config = synthetic_config()
    os.kill(service.pid, signal.SIGSTOP)
    try:
        writer = TraceWriter(store, config, mode="process")
    finally:
        os.kill(service.pid, signal.SIGCONT)
    assert writer.mode == "thread"
    for rnd in synthetic_rounds(config, 4):
        writer.write(rnd)
    writer.finish("completed")
    service.close()  # end of its input: it would mark every run it still holds interrupted
    info = store.get_run(config.run_id)
    assert info.status == "completed" and info.n_rounds == 4
