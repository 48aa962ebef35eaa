"""Issue 32 item 7: `specscope run --fault NAME` says whether and where the fault fired, and
when it never did, which setting makes it fire (for eos-leak: an EOS id the run meets)."""

import json

import pytest

from tests.app.cli.test_run import base_args, checkpoints, run_cli  # noqa: F401 (checkpoints is a fixture)


def _fault_run(capsys, checkpoints, *extra, budget=24):
    code, out, err = run_cli(capsys, *base_args(checkpoints), "--max-new", budget, "--json", *extra)
    assert code == 0, err
    return json.loads(out)["fault"]


@pytest.mark.parametrize("fault,flag", [("eos-leak", "--eos-id"), ("budget-overshoot", "--max-new")])
def test_a_fault_that_never_fired_says_so_and_the_suggested_setting_fires_it(capsys, checkpoints, fault, flag):
    # a budget whose last round rejects a draft (budget-overshoot cannot fire there)
    silent, budget = next(
        (r, n)
        for n in range(24, 34)
        if not (
            r := _fault_run(capsys, checkpoints, "--fault", fault, "--eos-id", "none", "--temperature", "1", budget=n)
        )["fired"]
    )
    assert silent["fired_rounds"] == []
    ((key, value),) = silent["to_fire"]["settings"].items()
    # the text report: never fired, and the flag to pass
    code, _, err = run_cli(
        capsys, *base_args(checkpoints), "--max-new", budget, "--fault", fault, "--eos-id", "none", "--temperature", "1"
    )
    assert code == 0 and f"fault {fault} never fired" in err and f"run again with {flag} {value}" in err
    budget = value if flag == "--max-new" else budget
    eos = ["--eos-id", str(value)] if flag == "--eos-id" else ["--eos-id", "none"]
    fired = _fault_run(capsys, checkpoints, "--fault", fault, "--temperature", "1", *eos, budget=budget)
    assert fired["fired"] and fired["fired_rounds"] and fired["to_fire"] is None
    code, _, err = run_cli(
        capsys, *base_args(checkpoints), "--max-new", budget, "--fault", fault, "--temperature", "1", *eos
    )
    assert f"fault {fault} fired in" in err and f"{fired['fired_rounds'][0]}" in err


def test_a_greedy_run_of_a_sampling_fault_is_told_to_sample(capsys, checkpoints):
    report = _fault_run(capsys, checkpoints, "--fault", "resample-p")
    assert not report["fired"] and report["to_fire"]["settings"] == {"temperature": 1.0}
    assert "rejection" in report["fires_when"]


def test_the_window_says_a_replayed_fault_never_fired(qtbot, make_window, hub, tmp_path):
    """Where the GUI shows a fault run (a replayed trace), 'no findings' alone hid that the
    injected fault never fired."""
    from specscope.core import DraftModelProposer
    from specscope.core.faults.zoo import faulty_decoder
    from specscope.storage import TraceStore, TraceWriter

    target, _ = hub.target("cpu")
    decoder = faulty_decoder("eos-leak", target, DraftModelProposer(hub.draft("draft-small", "cpu")), k=4, seed=0)
    path = tmp_path / "fault.sqlite"
    with TraceStore(path) as store:
        config = decoder.run_config([1, 2, 3, 4, 5], 12)
        with TraceWriter(store, config) as writer:
            writer.record(decoder.rounds([1, 2, 3, 4, 5], 12, config=config))
    assert decoder.fault_rounds == []  # no EOS id: eos-leak cannot fire
    w = make_window(store_path=str(tmp_path / "other.sqlite"))
    assert w.open_trace(str(path), run_id=config.run_id)
    qtbot.waitUntil(lambda: w.replay.loaded_all, timeout=20000)
    qtbot.waitUntil(lambda: "eos-leak" in w.findings.status.text(), timeout=20000)
    text = w.findings.status.text()
    assert "no findings" in text and "never fired" in text and "specscope run --fault eos-leak" in text


@pytest.mark.parametrize("fault", ["stop-last-token", "budget-before-stop", "stop-per-token"])
def test_a_stop_fault_without_stops_is_given_the_stop_that_fires_it(capsys, fault, tmp_path):
    """A run with no stops never fires a stop fault; the report names the stop (and, for
    budget-before-stop, the budget) that does, and the run with them fires at a round the
    checker flags first."""
    from specscope.app.cli import main
    from specscope.core.check.checker import check_report, first_bad_round
    from specscope.core.loading import models as loading
    from specscope.storage import TraceStore

    if not loading.bundled_available():
        pytest.skip("needs the bundled models (stop strings need a tokenizer)")
    base = [
        "run",
        "--draft",
        "small",
        "--prompt",
        "def fibonacci(n):",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--fault",
        fault,
    ]

    def report(*extra):
        assert main([*base, "--max-new", "40", "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)["fault"]

    silent = report()
    assert not silent["fired"] and silent["to_fire"] is not None
    settings = silent["to_fire"]["settings"]
    flags = []
    for seq in settings.get("stop_ids", []):
        flags += ["--stop-ids", ",".join(str(t) for t in seq)]
    for text in settings.get("stop_strings", []):
        flags += ["--stop", text]
    if "max_new_tokens" in settings:
        flags += ["--max-new", str(settings["max_new_tokens"])]  # the later --max-new wins
    assert flags and set(settings) <= {"stop_ids", "stop_strings", "max_new_tokens"}
    # the text report names the same flags
    assert main([*base, "--max-new", "40"]) == 0
    err = capsys.readouterr().err
    assert "never fired" in err and "run again with --" in err and (flags[1] in err or repr(flags[1]) in err)
    db = tmp_path / "fault.sqlite"
    fired = report(*flags, "--db", str(db))
    assert fired["fired"] and fired["fired_rounds"] and fired["to_fire"] is None
    with TraceStore(db) as store:
        (info,) = store.list_runs()
        findings = check_report(info.config, store.load_rounds(info.run_id, full=True), end=info.end).findings
    assert first_bad_round(findings) == fired["fired_rounds"][0]
