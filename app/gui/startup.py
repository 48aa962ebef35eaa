"""Start-up timing marks for scripts/measure_startup.py.

With SPECSCOPE_STARTUP_LOG=FILE set, the window appends one line per phase to FILE:
`EVENT WALL_CLOCK_SECONDS` (launch called, start-up window shown, imports done, main window shown,
models ready). With SPECSCOPE_STARTUP_QUIT=1 as well it closes itself once the models are
ready, so the script can time quitting too. Unset, it costs one environment lookup.
"""

from __future__ import annotations

import os
import time

LOG_VARIABLE = "SPECSCOPE_STARTUP_LOG"
QUIT_VARIABLE = "SPECSCOPE_STARTUP_QUIT"


def mark(event: str) -> None:
    path = os.environ.get(LOG_VARIABLE)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{event} {time.time():.4f}\n")


def quit_when_ready() -> bool:
    return bool(os.environ.get(LOG_VARIABLE)) and os.environ.get(QUIT_VARIABLE) == "1"
