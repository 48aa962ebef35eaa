"""`specscope bench --json`: the schema of the results on tiny models, the raw samples from
which a reader can redo the statistics, and BENCHMARKS.md regenerated from them with its
scale and notes sections kept."""

import json
import statistics
from types import SimpleNamespace

import pytest
import torch

from specscope.app.bench import NOTES_MARKER, SCALE_BEGIN, SCALE_END, SCHEMA, Bench, write_markdown
from specscope.app.bench.command import new_results, select_prompts
from specscope.app.bench.metrics import RoundCounts, vllm_acceptance
from specscope.core import SamplingConfig
from tests.tiny_models import noisy_copy, tiny_lm

PROMPTS = [[1, 2, 3, 4, 1, 2, 3, 4], [7, 7, 8, 9]]
KINDS = ["copy", "novel"]
REPS = 2


@pytest.fixture(scope="module")
def results():
    target = tiny_lm("llama", seed=0, init_range=0.3)
    bench = Bench(
        target,
        {"near": noisy_copy(target, 0.05)},
        PROMPTS,
        ks=[2],
        max_new=8,
        reps=REPS,
        sampling=SamplingConfig(temperature=0),
        eos=None,
        device=torch.device("cpu"),
        kinds=KINDS,
    )
    bench.run()
    prompts = [SimpleNamespace(name=f"p{i}", kind=k, description="") for i, k in enumerate(KINDS)]
    machine = {
        "cpu": "x",
        "cores": 2,
        "torch_threads": 1,
        "device": "cpu",
        "python": "3",
        "torch": "2",
        "transformers": "5",
    }
    out = new_results(machine, {"ks": [2], "max_new": 8, "reps": REPS, "batch_size": 1}, prompts, PROMPTS)
    out["modes"]["greedy"] = bench.rows()
    return json.loads(json.dumps(out))  # what --json prints is plain JSON


TIMING_KEYS = ["tokens_per_s", "speedup", "decode_tokens_per_s", "decode_speedup", "ttft_ms", "prefill_target_ms"]


def _has_interval(row, name):
    return row[f"{name}_min"] <= row[f"{name}_median"] <= row[f"{name}_max"]


def test_top_level_and_rows(results):
    assert results["schema"] == SCHEMA and results["settings"]["batch_size"] == 1
    assert [p["tokens"] for p in results["prompts"]] == [8, 4] and [p["kind"] for p in results["prompts"]] == KINDS
    rows = results["modes"]["greedy"]
    names = [r["method"] for r in rows]
    assert names[0] == "plain (KV cache)" and "transformers assisted draft-near k=2 traced+stored" in names
    for r in rows:
        assert all(_has_interval(r, key) for key in TIMING_KEYS), r["method"]
        assert r["prompt_tokens"] == [8, 4]
        assert set(r["by_kind"]) == set(KINDS)
        assert r["by_kind"]["copy"]["prompt_tokens"] == [8] and r["by_kind"]["novel"]["prompts"] == 1
        assert all(_has_interval(r["by_kind"][k], key) for k in KINDS for key in TIMING_KEYS)
        assert ("prefill_draft_ms_median" in r) == (r["draft"] is not None), r["method"]
        assert len(r["raw"]) == REPS and all(len(rep) == len(PROMPTS) for rep in r["raw"])
    spec = next(r for r in rows if r["method"] == "specscope draft-near k=2")
    for key in ("mean_accepted_length", "acceptance_rate", "alpha", "cost_c", "cost_v", "predicted_speedup"):
        assert isinstance(spec[key], float), key
    assert set(spec["vllm"]) >= {"mean_acceptance_length", "per_position_acceptance_rate", "draft_acceptance_rate"}
    assert set(spec["llamacpp"]) >= {"n_drafted", "n_accept", "draft_acceptance_rate"}
    assert len(spec["vllm"]["per_position_acceptance_rate"]) == 2
    hf = next(r for r in rows if r["method"] == "transformers assisted draft-near k=2 traced+stored")
    assert "vllm" in hf and "tracing_overhead_median" in hf  # the engine's rounds give transformers' acceptance


def test_raw_samples_let_a_reader_redo_the_statistics(results):
    rows = {r["method"]: r for r in results["modes"]["greedy"]}
    spec, plain = rows["specscope draft-near k=2"], rows["plain (KV cache)"]
    for rep in spec["raw"]:
        for run in rep:
            assert len(run["token_latencies_s"]) == run["tokens"] == 8
            assert sum(run["token_latencies_s"]) == pytest.approx(run["emissions"][-1][0], abs=1e-5)
            assert run["ttft_s"] == run["emissions"][0][0] and run["decode_tokens"] == 8 - run["emissions"][0][1]
            rounds = run["rounds"]
            assert sum(rounds["emitted"]) == 8
            assert rounds["accepted_length"] == [a + 1 for a in rounds["accepted"]]
            assert run["prefill_target_s"] > 0 and run["prefill_draft_s"] > 0
    # vLLM's numbers again, from the raw per-round counts of every repetition
    counts = [
        RoundCounts(drafted=d, accepted=a, visited=v, emitted=e, eos_accepted=x, after_eos=t)
        for rep in spec["raw"]
        for run in rep
        for d, a, v, e, x, t in zip(
            *(run["rounds"][key] for key in ("drafted", "accepted", "visited", "emitted", "eos_accepted", "after_eos"))
        )
    ]
    assert vllm_acceptance(counts, k=2) == spec["vllm"]
    accepted = [a for rep in spec["raw"] for run in rep for a in run["rounds"]["accepted_length"]]
    assert spec["mean_accepted_length"] == pytest.approx(sum(accepted) / len(accepted))
    # the per-kind speedup is the median of paired repetitions' wall-time ratios on that kind's prompts
    ratios = [p[0]["wall_s"] / s[0]["wall_s"] for p, s in zip(plain["raw"], spec["raw"])]
    assert spec["by_kind"]["copy"]["speedup_median"] == pytest.approx(statistics.median(ratios), rel=1e-4)


def test_markdown_sections_scale_block_and_notes(results, tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    write_markdown(path, results)
    text = path.read_text()
    for heading in (
        "## greedy",
        "### greedy: per prompt kind",
        "### greedy: prefill and decode",
        "### greedy: memory",
        "### greedy: acceptance under vLLM's and llama.cpp's definitions",
        "## When speculation does not pay",
        "**Batch size 1.**",
    ):
        assert heading in text, heading
    assert text.count(SCALE_BEGIN) == 1 and text.count(SCALE_END) == 1
    # the lead's scale section and hand-written notes survive a regeneration unchanged
    scale = f"{SCALE_BEGIN}\n## Scale\n\n| model | x |\n|---|---|\n| big | 1 |\n{SCALE_END}"
    start, end = text.index(SCALE_BEGIN), text.index(SCALE_END) + len(SCALE_END)
    path.write_text(text[:start] + scale + text[end:] + "\n" + NOTES_MARKER + "\n## Analysis\nhand-written\n")
    results = dict(results, command="specscope bench --reps 9")
    write_markdown(path, results)
    text = path.read_text()
    assert "--reps 9" in text and scale in text and text.count(SCALE_BEGIN) == 1
    assert text.count(NOTES_MARKER) == 1 and text.endswith("## Analysis\nhand-written\n")


def test_the_machine_line_says_what_the_linear_layers_ran_on(results, tmp_path):
    """On a CPU the results name the few-row kernel's state (core.kernels), and the file says it."""
    from specscope.app.bench.command import machine_info
    from specscope.core import kernels

    assert machine_info(torch.device("cpu"))["few_rows_kernel"] == kernels.kernel_status()
    path = tmp_path / "BENCHMARKS.md"
    write_markdown(path, dict(results, machine=dict(results["machine"], few_rows_kernel="off (no C compiler)")))
    assert ", few-row linear kernel off (no C compiler);" in path.read_text()


def test_prompt_selection_by_kind():
    prompts = [
        SimpleNamespace(name=n, kind=k) for n, k in [("a", "copy"), ("b", "copy"), ("c", "novel"), ("d", "prose")]
    ]
    assert [p.name for p in select_prompts(prompts, 1, None)] == ["a", "c", "d"]
    assert [p.name for p in select_prompts(prompts, None, ["copy"])] == ["a", "b"]
    with pytest.raises(ValueError, match="no bundled prompt of kind poetry"):
        select_prompts(prompts, None, ["poetry"])


def test_markdown_from_saved_results_and_bad_input(results, tmp_path, capsys):
    from specscope.app.cli import main

    saved, md = tmp_path / "bench.json", tmp_path / "BENCHMARKS.md"
    saved.write_text(json.dumps(results))
    assert main(["bench", "--from-json", str(saved), "--markdown", str(md)]) == 0
    assert "## When speculation does not pay" in md.read_text()
    assert capsys.readouterr().err.strip() == f"wrote {md}"
    other = tmp_path / "other.json"
    other.write_text('{"modes": {}}')
    for argv, message in (
        [["--from-json", str(other)], "is not a `specscope bench --json` result"],
        [["--kinds", "poetry"], "no bundled prompt of kind poetry"],
        [["--k", "2,x"], "--k takes comma-separated integers"],
    ):
        assert main(["bench", *argv]) == 1
        err = capsys.readouterr().err.strip()
        assert message in err and "Traceback" not in err and len(err.splitlines()) == 1, err


def test_chat_prompts_go_through_the_chat_template_and_stop_at_the_end_of_the_turn():
    from specscope.app.bench.command import _bench_prompts, _default_drafts, _encode_prompts
    from specscope.core.loading import bundled_path, load_tokenizer
    from specscope.core.loading.chat import chat_prompt_ids

    tok = load_tokenizer(bundled_path("target"))
    tok.chat_template = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}<|endoftext|>{% endfor %}[assistant]"
    other = 4000  # a merged token the template does not write
    assert tok.convert_ids_to_tokens(other) not in tok.chat_template
    target = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[other, 0]))  # 0 ends a turn
    prompts = _bench_prompts(chat=True)
    assert {p.kind for p in prompts} == {"chat", "summary", "code"}
    ids, eos = _encode_prompts(prompts[:2], True, target, tok)
    assert ids == [chat_prompt_ids(tok, p.user, p.system) for p in prompts[:2]] and eos == 0
    assert tok.decode(ids[1]).startswith("[system]")  # the second bundled chat prompt has a system turn
    plain_ids, plain_eos = _encode_prompts(_bench_prompts(chat=False)[:1], False, target, tok)
    assert plain_eos == tok.eos_token_id and not tok.decode(plain_ids[0]).startswith("[")
    assert _default_drafts("smollm2") == ["smollm2-draft"] and _default_drafts(None) == ["small", "tiny"]
