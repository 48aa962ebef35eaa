"""Child process of the kill -9 test: records synthetic rounds until it is killed.

Prints "ready <run_id> <writer process pid or 0>" once the run exists, then "<index> <monotonic time>" after each
write() returns. CLOCK_MONOTONIC is system-wide, so the parent can compare times.
"""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from specscope.storage import TraceStore, TraceWriter
from tests.storage.helpers import synthetic_config, synthetic_rounds


def main(path: str, flush_interval: float, mode: str) -> None:
    store = TraceStore(path)
    config = synthetic_config(vocab=256)
    rounds = synthetic_rounds(config, 2000)
    writer = TraceWriter(store, config, flush_interval=flush_interval, mode=mode)
    assert writer.mode == mode
    print("ready", config.run_id, writer._backend.service.pid if mode == "process" else 0, flush=True)
    for r in rounds:
        writer.write(r)
        print(r.index, time.monotonic(), flush=True)
        time.sleep(0.004)
    time.sleep(60)  # never finish: the parent kills us


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), sys.argv[3])
