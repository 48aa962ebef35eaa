"""EAGLE, Medusa and MTP heads run through vLLM's own `eagle`, `medusa` and `mtp` methods
(`--engine vllm`) and through specscope's engine from one folder in vLLM's format (random heads
for the bundled target, written tensor by tensor under vLLM's names; for MTP a tiny dense
ERNIE-4.5 target carrying its MTP module: tests/core/head_checkpoints.py): greedy float32
output equal, the drafts of every round that starts at the same context equal (vLLM's head is
specscope's), every round stored, no wrong-output finding. Skipped, with the reason, where
vLLM's venv is absent (`specscope vllm setup`). One vLLM start per test (about 40 s of it on
this project's machine is vLLM loading)."""

from __future__ import annotations

import pytest
import torch

from specscope.core import SamplingConfig, SpeculativeDecoder
from specscope.core.check.checker import WRONG_OUTPUT, check_report
from specscope.core.draft.registry import build_proposer
from specscope.core.engines.vllm.engine import VllmRun, run_driver, traces, write_traces
from specscope.core.engines.vllm.setup import default_venv, installed_vllm, venv_python
from specscope.core.loading.models import bundled_path
from specscope.storage import TraceStore
from specscope.storage.jsonl.transfer import import_run
from tests.core.head_checkpoints import write_ernie_mtp_target, write_vllm_eagle, write_vllm_medusa

PYTHON = venv_python(default_venv())
VLLM = installed_vllm(PYTHON) if PYTHON.is_file() else None
pytestmark = pytest.mark.skipif(VLLM is None, reason=f"no vLLM venv at {default_venv()}: run `specscope vllm setup`")
NEW = 24
K = 3
WRITERS = {"eagle": write_vllm_eagle, "medusa": write_vllm_medusa}


@pytest.fixture(scope="module")
def target():
    """The bundled target (a small Llama, head_dim 64) in float32, and its folder."""
    from transformers import AutoModelForCausalLM

    from specscope.core.loading.models import load_tokenizer

    folder = bundled_path("target")
    tokenizer = load_tokenizer(folder)
    prompts = [tokenizer.encode(text) for text in ("def fibonacci(n):\n", "import os\nimport sys\n")]
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return folder, model, prompts


def _specscope(model, spec, prompt):
    """specscope's greedy output and {context length: drafted tokens} of its drafting rounds."""
    out = SpeculativeDecoder(model, build_proposer(spec), k=K, sampling=SamplingConfig(temperature=0)).generate(
        prompt, NEW
    )
    return out.new_tokens, {r.prefix_len: tuple(n.token for n in r.nodes) for r in out.rounds if r.nodes}


def _ernie(tmp_path):
    """A dense ERNIE-4.5 target whose checkpoint holds its MTP module: vLLM's `mtp` reads it there."""
    from transformers import AutoModelForCausalLM

    folder = write_ernie_mtp_target(tmp_path / "ernie")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return folder, model, [[5, 6, 7, 8, 5, 6, 7], [100, 200, 300, 400]]


@pytest.mark.parametrize("kind", [*sorted(WRITERS), "mtp"])
def test_head_greedy_equals_specscope_and_checks_clean(tmp_path, target, kind):
    if kind == "mtp":
        folder, model, prompts = _ernie(tmp_path)
        head, path = folder, None  # vLLM: the target's own MTP layers; specscope: mtp:TARGET
    else:
        folder, model, prompts = target
        head = path = WRITERS[kind](tmp_path / kind, model)
    run = VllmRun(
        target=str(folder),
        prompts=prompts,
        proposer_kind=kind,
        proposer_path=None if path is None else str(path),
        k=K,
        max_new_tokens=NEW,
    )
    run.threads = 1
    captured, results, timing = run_driver(run, work=tmp_path)
    assert run.notes == []  # the format both read alike
    lines = traces(run, captured, results, timing["vllm"], timing["generate_s"])
    store = TraceStore(str(tmp_path / "vllm.sqlite"))
    aligned = same = 0
    for prompt, path, trace in zip(prompts, write_traces(lines, tmp_path), lines):
        run_id = import_run(store, path)
        info = store.get_run(run_id)
        assert store.count_rounds(run_id) == len(trace) - 2  # every round stored
        report = check_report(info.config, store.iter_rounds(run_id), end=info.end)
        assert not report.of_severity(WRONG_OUTPUT), [str(f) for f in report.of_severity(WRONG_OUTPUT)]
        want, drafts = _specscope(model, f"{kind}:{head}", prompt)
        assert store.new_tokens(run_id) == want
        for r in store.iter_rounds(run_id):
            if r.nodes and r.prefix_len in drafts:
                aligned += 1
                same += tuple(n.token for n in r.nodes) == drafts[r.prefix_len]
        assert trace[0]["config"]["proposer"] == f"vllm-{kind}"
    store.close()
    # vLLM's head drafts what specscope's drafts from the same context (float32; kernels differ)
    assert aligned >= NEW and same >= 0.9 * aligned, (same, aligned)
