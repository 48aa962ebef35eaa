"""Issue 32 item 7: `specscope run --fault NAME` says whether and where the fault fired, and
when it never did, which setting makes it fire (for eos-leak: an EOS id the run meets)."""

import json

import pytest

from .test_cli import base_args, checkpoints, run_cli  # noqa: F401 (checkpoints is a fixture)


def _fault_run(capsys, checkpoints, *extra, budget=24):
    code, out, err = run_cli(capsys, *base_args(checkpoints), "--max-new", budget, "--json", *extra)
    assert code == 0, err
    return json.loads(out)["fault"]


@pytest.mark.parametrize("fault,flag", [("eos-leak", "--eos-id"), ("budget-overshoot", "--max-new")])
def test_a_fault_that_never_fired_says_so_and_the_suggested_setting_fires_it(capsys, checkpoints, fault, flag):
    # a budget whose last round rejects a draft (budget-overshoot cannot fire there)
    silent, budget = next((r, n) for n in range(24, 34)
                          if not (r := _fault_run(capsys, checkpoints, "--fault", fault, "--eos-id", "none",
                                                  "--temperature", "1", budget=n))["fired"])
    assert silent["fired_rounds"] == []
    (key, value), = silent["to_fire"]["settings"].items()
    # the text report: never fired, and the flag to pass
    code, _, err = run_cli(capsys, *base_args(checkpoints), "--max-new", budget, "--fault", fault, "--eos-id", "none",
                           "--temperature", "1")
    assert code == 0 and f"fault {fault} never fired" in err and f"run again with {flag} {value}" in err
    budget = value if flag == "--max-new" else budget
    eos = ["--eos-id", str(value)] if flag == "--eos-id" else ["--eos-id", "none"]
    fired = _fault_run(capsys, checkpoints, "--fault", fault, "--temperature", "1", *eos, budget=budget)
    assert fired["fired"] and fired["fired_rounds"] and fired["to_fire"] is None
    code, _, err = run_cli(capsys, *base_args(checkpoints), "--max-new", budget, "--fault", fault, "--temperature", "1",
                           *eos)
    assert f"fault {fault} fired in" in err and f"{fired['fired_rounds'][0]}" in err


def test_a_greedy_run_of_a_sampling_fault_is_told_to_sample(capsys, checkpoints):
    report = _fault_run(capsys, checkpoints, "--fault", "resample-p")
    assert not report["fired"] and report["to_fire"]["settings"] == {"temperature": 1.0}
    assert "rejection" in report["fires_when"]
