"""`specscope bench --engine vllm`'s rows without vLLM (app/bench/vllm.py): rounds from vLLM's
own per-step counts, which specs vLLM runs, the greedy comparison with specscope's decoder,
and the rows the report makes of them. The vLLM run itself: tests/core/engines/vllm."""

from __future__ import annotations

from specscope.app.bench.markdown import format_table
from specscope.app.bench.measurement import Method, Sample
from specscope.app.bench.report import bench_rows
from specscope.app.bench.vllm import annotate, first_difference, vllm_rounds, vllm_specs


def _never(prompt):
    raise AssertionError("not run")


def test_rounds_from_vllms_counts_with_the_undrafted_steps():
    # 12 tokens: the prefill's 1, then drafting steps emitting 3 and 5, then 3 steps that drafted nothing
    rounds = vllm_rounds({"per_step_drafted": [4, 4], "per_step_accepted": [2, 4]}, 12)
    assert [(r.drafted, r.accepted, r.visited, r.emitted) for r in rounds] == [
        (4, 2, 3, 3),
        (4, 4, 4, 5),
        (0, 0, 0, 1),
        (0, 0, 0, 1),
        (0, 0, 0, 1),
    ]
    # the budget cut the last step: nothing is inferred past the tokens vLLM returned
    assert len(vllm_rounds({"per_step_drafted": [4], "per_step_accepted": [4]}, 3)) == 1
    assert vllm_rounds(None, 1) == []


def test_vllm_runs_lookup_and_drafts_and_says_why_not_the_rest():
    ours, skipped = vllm_specs(["lookup:max_ngram=4", "draft:small", "draft:small,tree=3,2,1", "eagle3"])
    assert ours == ["lookup:max_ngram=4", "draft:small"]
    assert len(skipped) == 2 and "trees" in skipped[0] and "eagle3" in skipped[1]


def test_first_difference():
    assert first_difference([[1, 2, 3], [4]], [[1, 2, 3], [4]]) is None
    assert first_difference([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 6]]) == (1, 1)
    assert first_difference([[1, 2, 3]], [[1, 2]]) == (0, 2)


def _method(name, family, k, tokens, rounds=None, spec=None):
    m = Method(name, family, k, _never, spec=spec)
    m.samples = [[Sample(list(t), 1.0, rounds=list(rounds or [])) for t in tokens]]
    return m


class _Bench:
    def __init__(self, methods):
        self.methods, self.prompts, self.kinds = methods, [[1, 2], [3]], ["copy", "novel"]


def test_rows_say_whether_greedy_output_equals_specscope():
    plain = _method("plain (KV cache)", "plain", None, [[5, 6, 7], [8, 9]])
    ours = _method("specscope lookup k=4", "specscope", 4, [[5, 6, 7], [8, 9]], spec="lookup")
    rounds = vllm_rounds({"per_step_drafted": [4], "per_step_accepted": [1]}, 3)
    same = _method("vllm lookup k=4", "vllm", 4, [[5, 6, 7], [8, 9]], rounds, spec="lookup")
    other = _method("vllm draft-small k=4", "vllm", 4, [[5, 6, 7], [8, 1]], rounds, spec="draft:small")
    twin = _method("specscope draft-small k=4", "specscope", 4, [[5, 6, 7], [8, 9]], spec="draft:small")
    same.engine_version = "0.32.0"
    methods = [plain, ours, twin, same, other]
    rows = bench_rows(_Bench(methods))
    annotate(rows, methods, greedy=True)
    by = {r["method"]: r for r in rows}
    assert by["vllm lookup k=4"]["greedy_identical_to_specscope"] is True
    assert by["vllm lookup k=4"]["vllm_version"] == "0.32.0"
    assert by["vllm lookup k=4"]["mean_accepted_length"] == 2.0  # one round: 1 accepted + 1
    assert by["vllm draft-small k=4"]["greedy_identical_to_specscope"] is False
    assert by["vllm draft-small k=4"]["first_difference"] == {"prompt": 1, "token": 1}
    assert "specscope lookup k=4" in by and "greedy_identical_to_specscope" not in by["specscope lookup k=4"]
    table = format_table(rows)
    assert "vllm lookup k=4 (greedy = specscope)" in table
    assert "vllm draft-small k=4 (greedy differs from specscope: prompt 1, token 1)" in table
    annotate(rows, methods, greedy=False)
    assert by["vllm lookup k=4"]["greedy_identical_to_specscope"] is None
