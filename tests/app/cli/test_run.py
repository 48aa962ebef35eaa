"""The headless CLI end to end on tiny local checkpoints: run, record, check, diff, faults."""

import json

import pytest

from specscope.app.cli import main
from tests.tiny_models import save_pair


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return save_pair(tmp_path_factory.mktemp("ckpt"), noise=0.05)


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def base_args(checkpoints):
    target, draft = checkpoints
    return ["run", "--target", target, "--draft", draft, "--prompt-ids", "1,2,3,4,1,2", "--device", "cpu"]


def test_run_json_summary(capsys, checkpoints):
    code, out, _ = run_cli(capsys, *base_args(checkpoints), "--max-new", "20", "--k", "3", "--json")
    assert code == 0
    summary = json.loads(out)
    assert len(summary["new_tokens"]) == 20
    for key in (
        "rounds",
        "mean_accepted_length",
        "acceptance_rate",
        "target_forward_passes",
        "wall_s",
        "draft_s",
        "verify_s",
        "run_id",
    ):
        assert key in summary
    assert summary["target_forward_passes"] == summary["rounds"]
    assert 1.0 <= summary["mean_accepted_length"] <= 4.0


def test_run_hides_transformers_loading_bars_unless_verbose(capsys, checkpoints, monkeypatch):
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    hf_logging.enable_progress_bar()
    try:
        _, _, err = run_cli(capsys, "-v", *base_args(checkpoints), "--max-new", "4", "--json")
        assert "Loading weights" in err  # transformers draws them
        _, out, err = run_cli(capsys, *base_args(checkpoints), "--max-new", "4", "--json")
        assert "Loading weights" not in err and json.loads(out)["new_tokens"]
    finally:
        (hf_logging.enable_progress_bar if was_enabled else hf_logging.disable_progress_bar)()


def test_run_text_has_round_markers(capsys, checkpoints):
    code, out, err = run_cli(capsys, *base_args(checkpoints), "--max-new", "12", "--k", "2")
    assert code == 0
    assert out.count("|") >= 4  # one marker per round, at most 3 tokens per round
    assert "mean accepted length" in err


def test_record_check_and_diff(capsys, checkpoints, tmp_path):
    db = tmp_path / "t.sqlite"
    code, out, _ = run_cli(capsys, *base_args(checkpoints), "--max-new", "24", "--json", "--db", db)
    cached = json.loads(out)["run_id"]
    code, out, _ = run_cli(capsys, *base_args(checkpoints), "--max-new", "24", "--json", "--db", db, "--no-cache")
    reference = json.loads(out)["run_id"]
    code, out, _ = run_cli(capsys, "check", db)
    assert code == 0 and out.count("no findings") == 2
    code, out, _ = run_cli(
        capsys, "check", db, "--run", cached, "--recompute", "--target", checkpoints[0], "--device", "cpu"
    )
    assert code == 0, out
    code, out, _ = run_cli(capsys, "diff", db, cached, reference)
    assert code == 0 and "no divergence" in out


def test_fault_is_recorded_and_flagged(capsys, checkpoints, tmp_path):
    db = tmp_path / "f.sqlite"
    code, out, _ = run_cli(
        capsys,
        *base_args(checkpoints),
        "--max-new",
        "30",
        "--json",
        "--db",
        db,
        "--fault",
        "stale-draft-cache",
        "--temperature",
        "1",
    )
    assert code == 0
    code, out, _ = run_cli(capsys, "check", db, "--json")
    assert code == 0  # a stale draft cache wastes work; the target still decides every token
    report = json.loads(out)
    assert report["findings"] > 0 and report["wasted_work"] == report["findings"] and report["wrong_output"] == 0
    assert {(f["rule"], f["severity"]) for f in report["runs"][0]["findings"]} == {("draft-cache", "wasted work")}
    code, out, _ = run_cli(capsys, "check", db, "--strict")
    assert code == 1
    assert "wasted work: " in out and "wrong output" not in out


def test_run_records_top_n_only_when_asked(capsys, checkpoints, tmp_path):
    from specscope.storage import TraceStore

    db = tmp_path / "v.sqlite"
    code, out, _ = run_cli(
        capsys,
        *base_args(checkpoints),
        "--max-new",
        "16",
        "--json",
        "--db",
        db,
        "--vectors",
        "top",
        "--top-n",
        "5",
        "--temperature",
        "1",
        "--fault",
        "resample-p",
    )
    assert code == 0
    run_id = json.loads(out)["run_id"]
    with TraceStore(db) as store:
        (info,) = store.list_runs()
        assert info.run_id == run_id and info.top_n == 5 and not info.full_vectors
    code, out, _ = run_cli(capsys, "check", db, "--json")
    assert code == 1 and {f["rule"] for f in json.loads(out)["runs"][0]["findings"]} == {"residual"}
    code, _, err = run_cli(capsys, *base_args(checkpoints), "--db", tmp_path / "w.sqlite", "--top-n", "0")
    assert code == 2 and "--top-n must be at least 1" in err and not (tmp_path / "w.sqlite").exists()


def test_bad_input_is_one_line_not_a_traceback(capsys, checkpoints):
    code, _, err = run_cli(capsys, *base_args(checkpoints), "--k", "0")
    assert code == 2 and "k (draft length)" in err and "Traceback" not in err
    code, _, err = run_cli(capsys, *base_args(checkpoints)[:-4], "--prompt-ids", "1,99999", "--device", "cpu")
    assert code == 2 and "outside the vocabulary" in err
    code, _, err = run_cli(capsys, "run", "--target", "/nonexistent/model", "--prompt-ids", "1", "--proposer", "lookup")
    assert code == 2 and "nonexistent" in err
    code, _, err = run_cli(capsys, *base_args(checkpoints), "--fault", "no-such-bug")
    assert code == 2 and "unknown fault" in err
    code, _, err = run_cli(capsys, *base_args(checkpoints), "--top-p", "1.5")
    assert code == 2 and "--top-p must lie in (0, 1]" in err


def test_faults_lists_the_zoo(capsys):
    code, out, _ = run_cli(capsys, "faults")
    assert code == 0
    for name in ("eos-leak", "budget-overshoot", "resample-p", "raw-q", "stale-draft-cache", "target-crop-off-by-one"):
        assert name in out


def test_check_reports_root_causes_first(capsys, checkpoints, tmp_path):
    db = tmp_path / "g.sqlite"
    for seed in range(6):  # a run in which the crop fault fires before the last rounds
        code, out, _ = run_cli(
            capsys,
            *base_args(checkpoints),
            "--max-new",
            "40",
            "--json",
            "--db",
            db,
            "--fault",
            "target-crop-off-by-one",
            "--temperature",
            "1",
            "--seed",
            seed,
        )
        code, out, _ = run_cli(capsys, "check", db, "--run", json.loads(out)["run_id"], "--json")
        run = json.loads(out)["runs"][0]
        if len(run["findings"]) >= 3:
            break
    assert len(run["groups"]) == 1 and run["groups"][0]["cause"] == run["findings"][0]
    assert len(run["groups"][0]["follow_on"]) == len(run["findings"]) - 1
    code, out, _ = run_cli(capsys, "check", db, "--run", run["run_id"])
    assert code == 1 and "from 1 cause(s)" in out and "follow-on finding(s) (target-cache)" in out
    assert out.count("[target-cache]") == 1  # the cause; the rest counted
    code, out, _ = run_cli(capsys, "check", db, "--run", run["run_id"], "--all")
    assert out.count("[target-cache]") == len(run["findings"])
