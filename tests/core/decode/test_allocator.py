"""core.decode.allocator: the malloc thresholds are set once per process, and the opt-out works."""

import platform
import subprocess
import sys

import pytest

PROBE = """
import ctypes, os
from specscope.core.decode.allocator import tune_allocator
first = tune_allocator()
print(first, tune_allocator() == first)
"""


def _probe(env_value: str | None) -> str:
    import os

    env = dict(os.environ)
    env.pop("SPECSCOPE_MALLOC_TUNING", None)
    if env_value is not None:
        env["SPECSCOPE_MALLOC_TUNING"] = env_value
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt thresholds are glibc's")
def test_thresholds_are_set_once_on_glibc():
    assert _probe(None) == "True True"


def test_opt_out_leaves_malloc_alone():
    assert _probe("0") == "False True"
