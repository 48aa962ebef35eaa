"""`specscope run --tree SPEC --children MODE` and tree specs in --proposer."""

import json

from specscope.core.draft.registry import parse_spec
from tests.app.cli.test_run import base_args, checkpoints, run_cli  # noqa: F401  (the tiny checkpoints fixture)


def test_registry_keeps_a_tree_spec_as_one_value():
    spec = parse_spec("draft:small,tree=dynamic:nodes=16,depth=5,topk=4,children=topk")
    assert spec.params == {"tree": "dynamic:nodes=16,depth=5,topk=4", "children": "topk"}
    assert parse_spec(str(spec)) == spec
    assert parse_spec("draft:tree=3,2,1,nodes=4").params == {"tree": "3,2,1,nodes=4"}


def test_run_with_a_tree(capsys, checkpoints):
    greedy = None
    for tree, children, temperature in (
        ("3,2,1", "topk", "0"),
        ("dynamic:nodes=8,depth=3,topk=2", None, "0"),
        ("2,2", "sampled", "1"),
        ("2,2", "distinct", "1"),
    ):
        extra = ["--tree", tree, "--max-new", "16", "--temperature", temperature, "--json"]
        if children:
            extra += ["--children", children]
        code, out, err = run_cli(capsys, *base_args(checkpoints), *extra)
        assert code == 0, err
        summary = json.loads(out)
        assert len(summary["new_tokens"]) == 16 and summary["target_forward_passes"] == summary["rounds"]
        if temperature == "0":  # greedy: every tree gives the chain's output
            greedy = greedy or summary["new_tokens"]
            assert summary["new_tokens"] == greedy
    code, out, _ = run_cli(capsys, *base_args(checkpoints), "--max-new", "16", "--json")
    assert json.loads(out)["new_tokens"] == greedy


def test_tree_flag_errors_are_one_line(capsys, checkpoints):
    cases = [
        (["--tree", "3,x"], "branching factor must be an integer"),
        (["--tree", "dynamic:nodes=8,depth=3,topk=2", "--children", "sampled"], "children='topk'"),
        (["--children", "sampled"], "pass --tree"),
        (["--tree", "2,2", "--proposer", "lookup"], "applies to a draft model or head"),
        (["--tree", "2,2", "--proposer", "draft:tree=3,3"], "set tree twice"),
    ]
    for extra, message in cases:
        args = base_args(checkpoints)
        if "--proposer" in extra:
            args = [a for a in args]
            i = args.index("--draft")
            del args[i : i + 2]
        code, _, err = run_cli(capsys, *args, *extra)
        assert code == 2 and message in err and "Traceback" not in err, (extra, err)


def test_faults_lists_the_tree_faults_and_run_injects_one(capsys, checkpoints, tmp_path):
    code, out, _ = run_cli(capsys, "faults")
    assert code == 0 and "tree-sibling-mask" in out and "tree-stale-residual" in out
    db = tmp_path / "t.sqlite"
    code, _, err = run_cli(
        capsys,
        *base_args(checkpoints),
        "--tree",
        "3,2,1",
        "--max-new",
        "24",
        "--fault",
        "tree-positions-by-index",
        "--db",
        db,
    )
    assert code == 0, err
    code, out, _ = run_cli(capsys, "check", db, "--recompute")
    assert code == 1 and "recompute" in out
