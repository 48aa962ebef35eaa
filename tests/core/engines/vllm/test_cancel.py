"""run_driver ends vLLM's processes when the run is cancelled (the window's Stop, or the window
closing while vLLM runs): the driver and everything it started (its process group). Before,
subprocess.run waited for vLLM to finish and a closed window left it running, orphaned.
No vLLM needed: a stand-in venv whose python starts a child and sleeps."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from specscope.core.engines.vllm.engine import VllmEngineError, VllmRun, run_driver


@pytest.mark.skipif(os.name != "posix", reason="process groups are POSIX")
def test_cancel_ends_the_driver_and_its_children(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    pids = tmp_path / "pids"
    python = venv / "bin" / "python"
    python.write_text(f"#!/bin/sh\nsleep 300 &\necho $$ $! > {pids}\nwait\n")
    python.chmod(0o755)
    (tmp_path / "target").mkdir()
    (tmp_path / "work").mkdir()
    run = VllmRun(target=str(tmp_path / "target"), prompts=[[1, 2]], proposer_kind="lookup")
    started = time.monotonic()
    with pytest.raises(VllmEngineError, match="cancelled"):
        run_driver(run, venv=venv, work=tmp_path / "work", cancelled=lambda: time.monotonic() - started > 1.0)
    assert time.monotonic() - started < 20
    for pid in map(int, pids.read_text().split()):
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            # a zombie child of an ended parent is reaped by init: look at its state
            try:
                if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
                    break
            except OSError:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"process {pid} still runs after the cancel")
