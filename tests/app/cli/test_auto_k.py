"""`specscope run --k auto`: recorded with its policy and measured verify cost, each round's
chosen k stored and shown by `specscope show` (the k column, `--round`), refused in one line
where it cannot run."""

from __future__ import annotations

import re

import pytest

from specscope.app.cli import main
from specscope.storage import TraceStore
from tests.tiny_models import save_pair


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return save_pair(tmp_path_factory.mktemp("ckpt"), noise=0.05)


def cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_auto_k_run_records_and_shows_each_rounds_k(capsys, checkpoints, tmp_path):
    target, draft = checkpoints
    db = tmp_path / "t.sqlite"
    args = ["run", "--target", target, "--draft", draft, "--prompt-ids", "1,2,3,4,1,2", "--device", "cpu"]
    code, _, err = cli(capsys, *args, "--max-new", "30", "--k", "auto", "--db", db)
    assert code == 0, err
    with TraceStore(str(db), readonly=True) as store:
        (info,) = store.list_runs()
        params = info.config.proposer_params
        assert params["k_policy"] == "auto" and params["k_max"] == 8 and info.config.k == 8
        assert set(params["verify_ms"]) == {str(n) for n in range(1, 10)}
        ks = [r.k for r in store.round_summaries(info.run_id)]
        drafted = [r.drafted for r in store.round_summaries(info.run_id)]
    assert ks == drafted and all(1 <= k <= 8 for k in ks)
    code, out, _ = cli(capsys, "show", db, "last")
    assert code == 0 and "k=auto, at most 8" in out
    rows = [line.split() for line in out.splitlines() if re.match(r"\s+\d+\s+\d+\s+\d+\s+\d+/", line)]
    assert [int(row[2]) for row in rows] == ks  # the k column: each round's chosen length
    code, out, _ = cli(capsys, "show", db, "last", "--round", "1")
    assert code == 0 and f"k={ks[1]}," in out


def test_a_bad_k_word_is_one_usage_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--prompt-ids", "1,2", "--k", "fast"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--k: a whole number or auto, got 'fast'" in err and "Traceback" not in err


def test_auto_k_with_transformers_prompt_lookup_is_refused_in_one_line(capsys, checkpoints):
    target, _ = checkpoints
    argv = ["run", "--target", target, "--prompt-ids", "1,2", "--k", "auto", "--engine", "transformers"]
    code, _, err = cli(capsys, *argv, "--proposer", "lookup")
    assert code == 2 and "auto: transformers' prompt lookup drafts a fixed length" in err and "Traceback" not in err
