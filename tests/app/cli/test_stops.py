"""`specscope run --stop/--stop-ids/--eos`: the run ends where the core's stop rule says, the
JSON and the end line say why, and bad values are one line."""

from __future__ import annotations

import json

import pytest

from specscope.app.cli import main
from specscope.core.loading import models as loading

pytestmark = pytest.mark.skipif(not loading.bundled_available(), reason="needs the bundled models")

BASE = ["run", "--proposer", "lookup", "--prompt", "def fibonacci(n):\n", "--max-new", "24", "--device", "cpu"]


def run_json(capsys, *argv) -> dict:
    assert main([*BASE, "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_stop_ids_and_stop_text_end_the_output(capsys):
    plain = run_json(capsys)
    tokens = plain["new_tokens"]
    assert plain["stop_reason"] in ("budget", "eos") and len(tokens) > 6
    seq = tokens[4:6]
    end = next(j for j in range(1, len(tokens)) if tokens[j - 1 : j + 1] == seq)
    cut = run_json(capsys, "--stop-ids", "4095,4095,4095", "--stop-ids", ",".join(map(str, seq)))
    assert cut["new_tokens"] == tokens[: end + 1] and cut["stop_reason"] == "stop"
    text = plain["text"]
    stop = text[len(text) // 3 : len(text) // 3 + 2]
    if stop.strip():
        by_text = run_json(capsys, "--stop", stop)
        assert by_text["stop_reason"] == "stop" and stop in by_text["text"]
        assert (
            len(by_text["new_tokens"]) < len(tokens) and by_text["new_tokens"] == tokens[: len(by_text["new_tokens"])]
        )
    assert main([*BASE, "--stop-ids", ",".join(map(str, seq))]) == 0
    assert "stop: stop" in capsys.readouterr().err  # the end line's finish reason


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--stop-ids", "1,,2"], "--stop-ids"),
        (["--eos", "2,x"], "--eos-id"),
        (["--stop", ""], "--stop"),
        (["--system", "hi"], "--system"),
    ],
)
def test_bad_stop_values_are_one_line(capsys, argv, words):
    assert main([*BASE, *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0] and "Traceback" not in err[0]
