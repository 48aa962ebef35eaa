"""Torch's CPU thread count for decoding (used by the CLI and the app).

Torch's default takes every core; the app's GUI thread and the trace writer then compete
with it, and on a busy 2-core machine decoding was 7-56x slower than with one thread. The
default leaves one core to the rest where there are few."""

from __future__ import annotations

import os


def default_threads(cores: int | None = None) -> int:
    """One core for the GUI and the writer when there are up to 8, two beyond."""
    n = cores if cores is not None else (os.cpu_count() or 1)
    return max(1, n - 1) if n <= 8 else n - 2


def apply_threads(n: int | None) -> int:
    """Set torch's intra-op threads (None: the default); returns the value set."""
    import torch

    n = default_threads() if n is None else n
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n
