"""scripts/measure_scale_storage.py on a small size: its rounds are real decoder rounds
repeated into a run the checker finds consistent, and its steps and table run end to end."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from specscope.core.check.checker import check_report
from specscope.core.records import RunEnd

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "measure_scale_storage.py"


@pytest.fixture(scope="module")
def scale():
    spec = importlib.util.spec_from_file_location("specscope_measure_scale_storage", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_repeated_real_rounds_make_a_consistent_run(scale):
    base, config = scale.real_rounds(40)
    config, rounds = scale.cycled(base, config, 500)
    rounds = list(rounds)
    assert [r.index for r in rounds] == list(range(500))
    assert sum(len(r.emitted) for r in rounds) == config.max_new_tokens and rounds[-1].budget_stop
    report = check_report(config, rounds, end=RunEnd("completed", "budget", config.max_new_tokens))
    assert report.findings == [], [str(f) for f in report.findings[:3]]


def test_the_steps_and_the_table_run(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--sizes",
            "300",
            "600",
            "--steps",
            "record",
            "check",
            "export",
            "import",
            "--real-rounds",
            "40",
            "--out",
            str(tmp_path),
            "--markdown",
            str(tmp_path / "f.md"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    table = (tmp_path / "f.md").read_text()
    for step in ("record", "check", "export", "import"):
        assert f"| {step} |" in table
    assert "check findings 0" in table and "600 rounds" in table
