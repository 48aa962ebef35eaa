"""Keep freed row-sized memory in the process instead of returning it to the kernel.

A round at a real vocabulary allocates and frees dozens of 1-10 MB tensors on the host
(float64 rows of 152k tokens are 1.2 MB). glibc's malloc serves blocks that size with
mmap, or from a heap it trims as soon as a few MB at its top are free, so nearly every
row is fresh memory and costs ~300 page faults to touch: measured, that was a quarter of
the decoder's bookkeeping at 152k tokens (docs/scale.md). Raising the mmap and trim
thresholds (what PyTorch's CPU tuning guides do with jemalloc or tcmalloc) lets those
blocks be reused. The cost is bounded: at most TRIM_THRESHOLD of freed memory stays mapped,
and blocks above MMAP_THRESHOLD (model weights) still come from mmap and go back on free.

The decoder calls `tune_allocator()` once per process; SPECSCOPE_MALLOC_TUNING=0 in the
environment leaves malloc as it is. On anything but glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

MMAP_THRESHOLD = 64 << 20  # bytes: blocks up to this size come from the heap and are reused
TRIM_THRESHOLD = 256 << 20  # bytes of free heap top kept before any is returned
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)

_state: dict[str, bool] = {}


def tune_allocator() -> bool:
    """Raise glibc malloc's mmap and trim thresholds (once); True when they are set."""
    if "tuned" in _state:
        return _state["tuned"]
    _state["tuned"] = tuned = _apply()
    return tuned


def _apply() -> bool:
    if os.environ.get("SPECSCOPE_MALLOC_TUNING", "1").strip() in ("0", "off", "no", "false"):
        log.debug("malloc tuning off (SPECSCOPE_MALLOC_TUNING)")
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        _ = libc.gnu_get_libc_version  # glibc only: mallopt's numbers differ elsewhere
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    log.debug(
        "malloc thresholds: mmap %d MB, trim %d MB (%s)",
        MMAP_THRESHOLD >> 20,
        TRIM_THRESHOLD >> 20,
        "set" if ok else "refused",
    )
    return ok
