"""Checkpoints specscope cannot decode are said plainly (issue 33, case 9): an
encoder-decoder (T5) or an image model (ViT) is refused in one line that says specscope decodes
causal language models; a config asking for remote code (auto_map) loads with the stock
class and a warning that its code was not run."""

from __future__ import annotations

import json
import logging

import pytest
from transformers import T5Config, T5ForConditionalGeneration, ViTConfig, ViTModel

from specscope.core.loading.models import CheckpointError, load_model
from tests.tiny_models import tiny_lm


@pytest.mark.parametrize(
    "make, shape",
    [
        (
            lambda: T5ForConditionalGeneration(
                T5Config(vocab_size=32, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2)
            ),
            "an encoder-decoder model",
        ),
        (
            lambda: ViTModel(
                ViTConfig(
                    hidden_size=16,
                    num_hidden_layers=1,
                    num_attention_heads=2,
                    intermediate_size=32,
                    image_size=8,
                    patch_size=4,
                )
            ),
            "not a causal language model",
        ),
    ],
)
def test_a_model_that_is_not_a_causal_lm_is_refused_in_one_line(tmp_path, make, shape):
    make().save_pretrained(tmp_path / "m")
    with pytest.raises(CheckpointError) as err:
        load_model(tmp_path / "m", device="cpu")
    message = str(err.value)
    assert "\n" not in message and shape in message and "specscope decodes causal language models" in message
    assert len(message) < 400  # not transformers' list of every configuration class


def test_remote_code_is_not_run_and_the_class_used_is_said(tmp_path, caplog):
    folder = tmp_path / "m"
    tiny_lm("llama", vocab=32, hidden=16, layers=1).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "modeling_evil.py").write_text("raise SystemExit('remote code ran')\n")
    with caplog.at_level(logging.WARNING):
        model = load_model(folder, device="cpu")
    assert type(model).__name__ == "LlamaForCausalLM"
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("modeling_evil.EvilForCausalLM" in m and "not run" in m and "LlamaForCausalLM" in m for m in said), said


def test_a_remote_only_model_type_is_refused(tmp_path):
    folder = tmp_path / "m"
    tiny_lm("llama", vocab=32, hidden=16, layers=1).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="evil", auto_map={"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"})
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"does not know .* never runs a checkpoint's own code"):
        load_model(folder, device="cpu")
