"""A head folder checked against what vLLM 0.32 does with it, before vLLM starts
(core/engines/vllm/heads.py): vLLM's own format passes without a note; fc.bias (EAGLE) and
block biases without medusa_fc_bias (Medusa), which vLLM drops, are noted; a prefixed EAGLE
checkpoint, an EAGLE config saying bias: true (vLLM then adds attention biases), a Medusa
config without the heads' hidden size and k above the Medusa heads are refused in one line,
by the CLI too, without starting vLLM. No vLLM needed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from specscope.core.engines.vllm.engine import VllmEngineError, VllmRun, check_head
from specscope.core.engines.vllm.heads import HeadRefused, head_notes
from tests.core.head_checkpoints import write_eagle, write_medusa, write_vllm_eagle, write_vllm_medusa
from tests.tiny_models import tiny_lm


@pytest.fixture(scope="module")
def target():
    return tiny_lm("llama", seed=0, init_range=0.3, layers=2, vocab=64)


def test_vllm_format_heads_pass_without_a_note(target, tmp_path):
    assert head_notes("eagle", write_vllm_eagle(tmp_path / "e", target), 4) == []
    assert head_notes("medusa", write_vllm_medusa(tmp_path / "m", target, heads=3), 3) == []
    assert head_notes("medusa", write_vllm_medusa(tmp_path / "b", target, bias=True), 2) == []
    assert head_notes("eagle3", tmp_path / "anything", 4) == []


def test_what_vllm_drops_is_noted(target, tmp_path):
    folder = write_eagle(tmp_path / "e", target, bias=True)  # the EAGLE repository's fc.bias, and "bias": true
    with pytest.raises(HeadRefused, match=r"says bias: true, which vLLM 0\.32's Llama layer reads as attention biases"):
        head_notes("eagle", folder, 4)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "bias"}))
    (note,) = head_notes("eagle", folder, 4)
    assert "drops this checkpoint's fc.bias" in note
    folder = write_medusa(tmp_path / "m", target, heads=3)  # the Medusa repository's format: biased blocks
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "hidden_size": target.config.hidden_size}))
    (note,) = head_notes("medusa", folder, 3)
    assert "unless config.json says medusa_fc_bias: true" in note
    run = VllmRun(target="t", prompts=[[1]], proposer_kind="medusa", proposer_path=str(folder), k=3)
    check_head(run)
    assert run.notes == [note]


def test_what_vllm_cannot_run_as_specscope_reads_it_is_refused(target, tmp_path):
    folder = write_vllm_eagle(tmp_path / "e", target)
    weights = load_file(str(folder / "model.safetensors"))
    save_file({f"model.{k}": v for k, v in weights.items()}, str(folder / "model.safetensors"))
    with pytest.raises(HeadRefused, match=r"carry a `model\.` prefix"):
        head_notes("eagle", folder, 4)
    folder = write_medusa(tmp_path / "m", target, heads=3)
    with pytest.raises(HeadRefused, match=r"hidden_size is absent, the heads are 32 wide.*default 4096"):
        head_notes("medusa", folder, 3)
    folder = write_vllm_medusa(tmp_path / "v", target, heads=3)
    with pytest.raises(HeadRefused, match="--k 4 but the checkpoint has 3 heads"):
        head_notes("medusa", folder, 4)
    run = VllmRun(target="t", prompts=[[1]], proposer_kind="medusa", proposer_path=str(folder), k=5)
    with pytest.raises(VllmEngineError, match="--k 5 but the checkpoint has 3 heads"):
        check_head(run)


def test_a_torch_pickle_is_read_for_its_names(target, tmp_path):
    folder = write_vllm_eagle(tmp_path / "e", target)
    weights = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    torch.save({**weights, "fc.bias": torch.zeros(32)}, folder / "pytorch_model.bin")
    assert "fc.bias" in head_notes("eagle", folder, 4)[0]


def test_the_cli_refuses_before_vllm_starts(target, tmp_path):
    target.save_pretrained(tmp_path / "target")
    folder = write_vllm_medusa(tmp_path / "m", target, heads=2)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "specscope.app.cli",
            "run",
            "--engine",
            "vllm",
            "--target",
            str(tmp_path / "target"),
            "--proposer",
            f"medusa:{folder}",
            "--k",
            "3",
            "--prompt-ids",
            "1,2,3",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0 and "--k 3 but the checkpoint has 2 heads" in proc.stderr
    assert "Traceback" not in proc.stderr and "starting its engine" not in proc.stderr


def test_mtp_needs_a_target_whose_checkpoint_holds_mtp_layers(target, tmp_path):
    """vLLM 0.32 reads MTP layers from the target's own checkpoint, for the architectures it maps
    to an MTP model: a Llama target is refused before vLLM starts (vLLM itself would fail after
    its start with "Unsupported speculative method: 'mtp'"); a dense ERNIE-4.5 one passes."""
    from tests.core.head_checkpoints import write_ernie_mtp_target

    target.save_pretrained(tmp_path / "llama")
    run = VllmRun(target=str(tmp_path / "llama"), prompts=[[1]], proposer_kind="mtp", k=1)
    with pytest.raises(VllmEngineError, match=r"no Llama.*is a llama naming no MTP layers"):
        check_head(run)
    ernie = write_ernie_mtp_target(tmp_path / "ernie", hidden=64, vocab=64)
    run = VllmRun(target=str(ernie), prompts=[[1]], proposer_kind="mtp", k=3)
    check_head(run)
    assert run.notes == []


def test_an_unreadable_weight_file_is_one_line(target, tmp_path):
    folder = write_vllm_eagle(tmp_path / "e", target)
    (folder / "model.safetensors").write_bytes(b"\x01\x02")
    run = VllmRun(target="t", prompts=[[1]], proposer_kind="eagle", proposer_path=str(folder), k=3)
    with pytest.raises(VllmEngineError, match="cannot read the tensor names of") as exc:
        check_head(run)
    assert "\n" not in str(exc.value)
