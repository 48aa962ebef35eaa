"""`specscope diverge` end to end on tiny local checkpoints: live and stored runs, JSON, errors."""

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


def models(checkpoints):
    target, draft = checkpoints
    return ["--target", target, "--draft", draft, "--prompt-ids", "1,2,3,4,1,2", "--device", "cpu", "--max-new", "12"]


def test_identical_live_run(capsys, checkpoints):
    code, out, _ = run_cli(capsys, "diverge", *models(checkpoints))
    assert code == 0 and "identical to plain greedy decoding (12 tokens, float32)" in out


def test_a_fault_is_a_logic_bug_with_the_checker_s_word(capsys, checkpoints):
    code, out, _ = run_cli(capsys, "diverge", *models(checkpoints), "--fault", "target-crop-off-by-one", "--json")
    assert code == 1
    report = json.loads(out)
    assert report["logic_bugs"] == 1 and report["near_ties"] == 0
    (d,) = report["comparisons"]
    assert d["verdict"] == "logic bug" and d["findings"][0]["rule"] == "target-cache"
    assert d["margin"] > 2 * d["logit_diff"]
    code, out, _ = run_cli(
        capsys, "diverge", *models(checkpoints), "--fault", "tree-positions-by-index", "--tree", "2,1", "--max-new", "4"
    )
    assert code == 1 and "LOGIC BUG" in out and "checker:" in out and "[tree-layout]" in out


def test_stored_runs_and_their_errors(capsys, checkpoints, tmp_path):
    target, draft = checkpoints
    db = tmp_path / "t.sqlite"
    recorded = {}
    for temperature in ("0", "1"):
        code, out, _ = run_cli(
            capsys,
            "run",
            "--target",
            target,
            "--draft",
            draft,
            "--prompt-ids",
            "1,2,3,4",
            "--device",
            "cpu",
            "--max-new",
            "10",
            "--temperature",
            temperature,
            "--json",
            "--db",
            db,
        )
        assert code == 0
        recorded[temperature] = json.loads(out)["run_id"]
    code, out, _ = run_cli(capsys, "diverge", "--db", db, "--run", recorded["0"][:10], "--json")
    assert code == 0
    (d,) = json.loads(out)["comparisons"]
    assert d["verdict"] == "identical" and len(d["plain"]) == 10
    code, _, err = run_cli(capsys, "diverge", "--db", db, "--run", recorded["1"])
    assert code == 2 and "only defined at temperature 0" in err and "Traceback" not in err
    code, _, err = run_cli(capsys, "diverge", "--db", db, "--run", "nosuchrun")
    assert code == 2 and "no run 'nosuchrun'" in err
    code, _, err = run_cli(capsys, "diverge", "--db", db, "--run", recorded["0"], "--target", tmp_path / "missing")
    assert code == 2 and "not found" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(capsys, "diverge", "--run", recorded["0"])
    assert code == 2 and "--db" in err
    code, _, err = run_cli(capsys, "diverge", "--db", db)
    assert code == 2 and "--run" in err
    code, _, err = run_cli(capsys, "diverge", "--db", db, "--run", recorded["0"], "--prompt", "x")
    assert code == 2 and "--prompt sets up a new run" in err


def test_a_stored_run_refuses_a_target_that_reads_fewer_positions(capsys, checkpoints, tmp_path):
    """The reference decodes the run's whole budget: --target with a smaller
    max_position_embeddings than prompt + budget is refused in one line, nothing decoded."""
    import shutil

    target, draft = checkpoints
    db = tmp_path / "t.sqlite"
    code, out, _ = run_cli(
        capsys,
        "run",
        "--target",
        target,
        "--draft",
        draft,
        "--prompt-ids",
        "1,2,3,4",
        "--device",
        "cpu",
        "--max-new",
        "10",
        "--json",
        "--db",
        db,
    )
    assert code == 0
    run_id = json.loads(out)["run_id"]
    short = tmp_path / "short"
    shutil.copytree(target, short)
    config = json.loads((short / "config.json").read_text())
    config["max_position_embeddings"] = 13
    (short / "config.json").write_text(json.dumps(config))
    code, _, err = run_cli(capsys, "diverge", "--db", db, "--run", run_id, "--target", short)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "needs 14 positions" in err and "reads at most 13 (max_position_embeddings)" in err
