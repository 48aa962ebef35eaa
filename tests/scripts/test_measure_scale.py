"""scripts/measure_scale.py on a small size: one run per sampler setting through the public
API, every column of the table and the JSON (memory marks, the wall, CPU and forward windows,
the bookkeeping share) filled with sane values."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_measure_scale_reports_every_column(tmp_path):
    out = tmp_path / "scale.json"
    cmd = [
        sys.executable,
        str(REPO / "scripts" / "measure_scale.py"),
        "--rounds",
        "160",
        "--vocab",
        "4096",
        "--target-layers",
        "1",
        "--threads",
        "1",
        "--modes",
        "greedy",
        "t1",
        "--json",
        str(out),
        "--markdown",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| greedy |" in done.stdout and "| t1 |" in done.stdout and "CPU ratio" in done.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [r["mode"] for r in rows] == ["greedy", "t1"]
    for r in rows:
        assert r["rounds"] == 160 and r["tokens"] >= 160
        assert 0 < r["bookkeeping_share"] < 1
        assert r["rss_mb_at_100"] > 0 and r["rss_mb_at_end"] >= r["rss_mb_at_100"]
        for key in ("ms_per_round", "cpu_ms_per_round", "forward_ms_per_round"):
            early, late = r[key + "_50_150"], r[key + "_last_100"]
            assert early > 0 and late > 0
        assert r["forward_ms_per_round_50_150"] < r["ms_per_round_50_150"]
        assert r["steal_jiffies_last_100"] >= 0


def test_measure_scale_takes_a_real_target_with_a_random_draft_of_its_vocabulary(tmp_path):
    import os

    import pytest

    pytest.importorskip("gguf")
    sys.path.insert(0, str(REPO))
    from tests.gguf_files import tokenizer_metadata, write_tiny_llama

    model = write_tiny_llama(tmp_path / "tiny.gguf", context=2048)  # the prompt and 110 rounds of up to 5 tokens
    vocab = len(tokenizer_metadata()[0])
    out = tmp_path / "scale.json"
    cmd = [
        sys.executable,
        str(REPO / "scripts" / "measure_scale.py"),
        "--target",
        str(model),
        "--rounds",
        "110",
        "--threads",
        "1",
        "--modes",
        "greedy",
        "--json",
        str(out),
        "--markdown",
    ]
    env = {**os.environ, "SPECSCOPE_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"Vocabulary {vocab:,}," in done.stdout  # the real target's vocabulary, not the default 151,936
    row = json.loads(out.read_text())["rows"][0]
    assert row["rounds"] == 110 and row["growth_kb_per_round"] is not None and 0 < row["bookkeeping_share"] < 1
