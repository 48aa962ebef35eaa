"""scripts/measure_coupling.py on a small size: coupled lanes stay aligned over the whole
budget, uncoupled ones part, and the report and JSON hold every row."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from specscope.core.loading.models import bundled_available

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "measure_coupling.py"


def _script():
    spec = importlib.util.spec_from_file_location("measure_coupling", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_divergence_and_alignment_measures():
    m = _script()
    assert m.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert m.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert m.first_divergence([1, 2], [1, 2, 3]) == 2
    assert m.aligned_fraction([1, 2, 3, 4], [1, 5, 3, 4]) == 0.75


@pytest.mark.skipif(not bundled_available(), reason="needs the bundled models")
def test_measure_coupling_runs_end_to_end(tmp_path):
    out = tmp_path / "coupling.json"
    result = _script().main(["--prompts", "2", "--max-new", "10", "--seeds", "0", "--json", str(out)])
    rows = result["rows"]
    assert len(rows) == 2 * 2 * 2  # prompts x lane pairs x (uncoupled, coupled)
    coupled = [r for r in rows if r["coupled"]]
    assert all(r["first_divergence"] is None and r["aligned"] == 1.0 for r in coupled)
    assert any(r["first_divergence"] is not None for r in rows if not r["coupled"])
    assert json.loads(out.read_text())["rows"] == rows
    assert "### draft vs lookup" in result["report"] and "### k=2 vs k=4" in result["report"]
