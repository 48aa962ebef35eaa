"""`specscope run --coupled SEED`: two proposers, one output; recorded, checked, and the
coupled fault flagged; bad combinations are one-line errors."""

import json

import pytest

from specscope.app.cli import main
from tests.tiny_models import save_pair


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return save_pair(tmp_path_factory.mktemp("ckpt"), noise=0.3)


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def base(checkpoints, *more):
    target, draft = checkpoints
    return [
        "run",
        "--target",
        target,
        "--draft",
        draft,
        "--prompt-ids",
        "1,2,3,4,1,2",
        "--device",
        "cpu",
        "--max-new",
        "24",
        "--temperature",
        "1",
        "--eos-id",
        "none",
        *more,
    ]


def test_coupled_runs_of_two_proposers_emit_the_same_tokens(capsys, checkpoints, tmp_path):
    db = tmp_path / "c.sqlite"
    _, a, _ = run_cli(capsys, *base(checkpoints, "--coupled", "5", "--json", "--db", db))
    target, _ = checkpoints
    lookup = [
        "run",
        "--target",
        target,
        "--proposer",
        "lookup",
        "--prompt-ids",
        "1,2,3,4,1,2",
        "--device",
        "cpu",
        "--max-new",
        "24",
        "--temperature",
        "1",
        "--eos-id",
        "none",
        "--k",
        "2",
    ]
    _, b, _ = run_cli(capsys, *lookup, "--coupled", "5", "--json", "--db", db)
    _, c, _ = run_cli(capsys, *lookup, "--json")
    a, b, c = (json.loads(x) for x in (a, b, c))
    assert a["new_tokens"] == b["new_tokens"] != c["new_tokens"]
    code, out, _ = run_cli(capsys, "check", db)
    assert code == 0 and "no findings" in out


def test_the_coupled_fault_is_flagged(capsys, checkpoints, tmp_path):
    db = tmp_path / "f.sqlite"
    run_cli(
        capsys, *base(checkpoints, "--coupled", "5", "--fault", "coupled-draft-pick", "--db", db, "--vectors", "full")
    )
    code, out, _ = run_cli(capsys, "check", db)
    assert code != 0 and "[coupled]" in out


@pytest.mark.parametrize(
    "extra,words",
    [
        (("--coupled", "-1"), "--coupled must be at least 0"),
        (("--coupled", "1", "--tree", "2,1"), "tree"),
        (("--coupled", "1", "--engine", "transformers"), "specscope engine"),
        (("--fault", "coupled-draft-pick"), "coupled run"),
    ],
)
def test_bad_combinations_are_one_line_errors(capsys, checkpoints, extra, words):
    code, _, err = run_cli(capsys, *base(checkpoints, *extra))
    assert code != 0 and words in err and "Traceback" not in err


def test_coupled_at_temperature_zero_is_a_note(capsys, checkpoints):
    args = base(checkpoints, "--coupled", "1", "--json")
    args[args.index("--temperature") + 1] = "0"
    code, out, err = run_cli(capsys, *args)
    assert code == 0 and "no effect at temperature 0" in err
