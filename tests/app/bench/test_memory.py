"""Per-method memory: each method measured in a child process that loads only its models."""

import json
import subprocess
import sys

import pytest

from specscope.app.bench.memory import measure_all
from specscope.core.loading import models as loading

pytestmark = pytest.mark.skipif(not loading.bundled_available(), reason="needs the bundled models")


def _spec(method, family, draft=None, specs=(), traced=False):
    return {
        "method": method,
        "mode": "greedy",
        "temperature": 0.0,
        "target_ref": None,
        "draft_label": draft,
        "draft_ref": draft,
        "device": "cpu",
        "dtype": None,
        "threads": 1,
        "k": 2,
        "max_new": 4,
        "eos": 0,
        "prompts": [[100, 200, 300, 400, 500]],
        "specs": list(specs),
        "include_transformers": family == "transformers",
        "include_traced": traced,
    }


def test_each_method_in_its_own_child(tmp_path):
    plain, spec, bad = measure_all(
        [
            _spec("plain (KV cache)", "plain"),
            _spec("specscope draft-small k=2", "specscope", "small", ["draft:small"]),
            _spec("no such method", "plain"),
        ]
    )
    for m in (plain, spec):
        assert "error" not in m, m
        assert 0 < m["rss_start_mb"] < m["rss_loaded_mb"] <= m["peak_rss_mb"]
        assert m["models_and_run_mb"] == pytest.approx(m["peak_rss_mb"] - m["rss_start_mb"])
        assert (
            m["decoding_added_mb"] == pytest.approx(m["peak_rss_mb"] - m["rss_loaded_mb"])
            and m["decoding_added_mb"] >= 0
        )
        assert m["hwm_reset"] is True  # Linux: the high-water mark was reset after loading
    # float32 in memory: the target's 7.9M parameters, plus the draft's 1.9M for the draft method
    assert 30 < plain["weights_mb"] < 33 and 7 < spec["weights_mb"] - plain["weights_mb"] < 8
    assert bad["error"].startswith("ValueError: no method 'no such method'")
    assert spec["spec"]["method"] == "specscope draft-small k=2"  # kept beside the result, to repeat it
    # ... which a reader repeats in a fresh interpreter
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(plain["spec"]))
    out = subprocess.run(
        [sys.executable, "-m", "specscope.app.bench.memory", str(path)], capture_output=True, text=True, check=True
    )
    again = json.loads(out.stdout)
    assert (
        again["weights_mb"] == pytest.approx(plain["weights_mb"]) and again["peak_rss_mb"] > again["rss_loaded_mb"] - 1
    )
