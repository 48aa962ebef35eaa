"""scripts/measure_acceptance.py on the bundled target: tokens per target pass per spec and kind,
prompt lookup first counted, and a spec that does not parse refused in one line."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from specscope.core.loading.models import bundled_available

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "measure_acceptance.py"
pytestmark = pytest.mark.skipif(not bundled_available(), reason="needs the bundled models")


def _script():
    spec = importlib.util.spec_from_file_location("measure_acceptance", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rows_per_spec_with_every_kind(capsys):
    assert _script().main(["eagle3", "eagle3,lookup=2", "--k", "2", "--max-new", "12"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "tokens per target pass" in line]
    assert [r.split()[0] for r in rows] == ["eagle3", "eagle3,lookup=2"]
    for row in rows:
        value = float(row.split("tokens per target pass")[1].split()[0])
        assert 1.0 <= value <= 3.0  # k = 2: at most 2 accepted + 1 a pass
        assert "copy" in row and "novel" in row


def test_a_bad_spec_is_one_line(capsys):
    assert _script().main(["eagle3,lookup=0", "--max-new", "4"]) == 2
    assert "lookup must be an n-gram length" in capsys.readouterr().err
