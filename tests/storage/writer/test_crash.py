"""kill -9 of a recording process: at most the last flush interval is lost, the file is
intact, and the run ends up interrupted: marked by the writer process when only the
recording process died, or by the next open when no writer survived."""

from __future__ import annotations

import pytest

from specscope.storage import TraceStore
from tests.storage.killing import SCENARIOS, check_killed_run, kill_mid_run

SLACK = 0.35  # scheduling slack on a loaded CI machine (the commit itself takes time)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_kill_9_loses_at_most_the_last_flush_interval(tmp_path, scenario):
    path = str(tmp_path / "crash.sqlite")
    run_id, must_have = kill_mid_run(path, scenario, SLACK)
    check_killed_run(path, run_id, scenario, must_have)
    with TraceStore(path) as store:
        assert store.integrity_check() == ["ok"]
