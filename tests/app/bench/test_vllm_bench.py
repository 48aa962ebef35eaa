"""`specscope bench --engine vllm` with vLLM itself (app/bench/vllm.py, engine.py's
VllmBenchServer): the vLLM row's vLLM is started before the bench runs and its calls are timed
interleaved with the in-process rows, in the same rotating order; its greedy output is
compared with specscope's decoder; closing the server ends vLLM's processes. Skipped, with
the reason, where vLLM's venv is absent (`specscope vllm setup`)."""

from __future__ import annotations

import pytest
import torch

from specscope.app.bench.measurement import Bench
from specscope.app.bench.vllm import annotate, vllm_methods
from specscope.core import SamplingConfig
from specscope.core.engines.vllm.setup import default_venv, installed_vllm, venv_python
from specscope.core.loading.models import bundled_path

PYTHON = venv_python(default_venv())
VLLM = installed_vllm(PYTHON) if PYTHON.is_file() else None
pytestmark = pytest.mark.skipif(VLLM is None, reason=f"no vLLM venv at {default_venv()}: run `specscope vllm setup`")


def test_vllm_rows_run_interleaved_with_the_in_process_rows():
    from transformers import AutoModelForCausalLM

    from specscope.core.loading.models import load_tokenizer

    folder = bundled_path("target")
    tokenizer = load_tokenizer(folder)
    prompts = [tokenizer.encode(t) for t in ("def add(a, b):\n    return a + b\n\ndef add(", "import os\nimport")]
    target = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    bench = Bench(
        target,
        {},
        prompts,
        ks=[2],
        max_new=12,
        reps=2,
        sampling=SamplingConfig(temperature=0.0),
        eos=None,
        device=torch.device("cpu"),
        include_transformers=False,
        include_traced=False,
        specs=["lookup"],
        warm_every_prompt=False,
    )
    methods, skipped, servers = vllm_methods(
        target_ref=None,
        draft_refs={},
        specs=["lookup", "draft:small,tree=2,1"],
        ks=[2],
        prompts=prompts,
        max_new=12,
        temperature=0.0,
        top_k=0,
        top_p=1.0,
        eos=None,
        threads=1,
        progress=lambda line: None,
    )
    try:
        assert [m.name for m in methods] == ["vllm lookup k=2"] and len(skipped) == 1 and "trees" in skipped[0]
        assert methods[0].engine_version == VLLM[1]
        calls: list[str] = []
        for m in bench.methods + methods:
            run = m.run

            def logged(prompt, run=run, name=m.name):
                calls.append(name)
                return run(prompt)

            m.run = logged
        bench.methods.extend(methods)
        bench.run()
    finally:
        for server in servers:
            server.close()
    assert all(server.proc.poll() is not None for server in servers)  # vLLM's processes ended
    # warm-up (1 prompt per method), then two repetitions over 2 prompts in a rotating order:
    # the vLLM row's calls sit between the in-process rows', not after them all
    names = [m.name for m in bench.methods]
    timed = calls[len(names) :]
    assert len(timed) == 2 * len(names) * len(prompts)
    first_vllm = timed.index("vllm lookup k=2")
    assert any(name != "vllm lookup k=2" for name in timed[first_vllm:])
    vllm = methods[0]
    assert len(vllm.samples) == 2 and all(len(rep) == len(prompts) for rep in vllm.samples)
    assert all(s.wall_s > 0 and len(s.tokens) == 12 for rep in vllm.samples for s in rep)
    rows = bench.rows()
    annotate(rows, bench.methods, greedy=True)
    row = next(r for r in rows if r["method"] == "vllm lookup k=2")
    assert row["vllm_version"] == VLLM[1] and row["specscope_twin"] == "specscope lookup k=2"
    assert row["greedy_identical_to_specscope"] is True  # float32 greedy: vLLM's output is specscope's
