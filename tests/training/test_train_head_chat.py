"""training/train_head.py on a chat target with a large vocabulary: a random-initialised Llama
with 40,000 ids (more than int16 holds) and a chat template trains through the --smoke path on
its own chat answers, measures each held-out prompt kind, and writes a head that loads through
the proposer registry and decodes that target exactly."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from tests.training.scripts import load_script

VOCAB = 40_000  # top-K ids above 32,767 overflowed the int16 cache
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _module():
    return load_script("train_head", "specscope_train_head_chat")


@pytest.fixture(scope="module")
def chat_target(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    from specscope.core.loading import bundled_path, load_tokenizer

    folder = tmp_path_factory.mktemp("chat-target")
    tok = load_tokenizer(bundled_path("target"))
    tok.chat_template = TEMPLATE
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # make the large ids the likely ones, as a 49,152-token model's top-K holds them
        model.lm_head.weight[32_768:] *= 4
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(folder)
    return folder


def test_a_chat_target_with_a_large_vocabulary_trains_and_decodes_exactly(chat_target, tmp_path):
    from specscope.core import SamplingConfig, SpeculativeDecoder
    from specscope.core.decode.baseline import plain_generate
    from specscope.core.draft.registry import build_proposer
    from specscope.core.loading import load_model, load_tokenizer
    from specscope.core.loading.chat import chat_prompt_ids

    train_head = _module()
    out = tmp_path / "head"
    summary = train_head.main(
        [
            "--smoke",
            "--target",
            str(chat_target),
            "--out",
            str(out),
            "--threads",
            "1",
            "--steps",
            "10",
            "--eval-every",
            "10",
            "--draft-vocab",
            "2048",
        ]
    )
    config = json.loads((out / "config.json").read_text())
    record = config["specscope"]
    assert set(record["heldout"]) == {"text", "greedy-chat", "greedy-summary", "greedy-code", "sampled"}
    for kind in ("chat", "summary", "code"):
        assert 1.0 <= record["heldout"][f"greedy-{kind}"]["accepted_length"] <= 1 + train_head.SMOKE.depth
    assert config["vocab_size"] == VOCAB and summary["data"]["train_prompts_answered"]["greedy"] > 0
    assert summary["data"]["train_prompts_answered"]["sampled"] > 0
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        d2t = f.get_tensor("d2t")
    draft_ids = d2t + torch.arange(len(d2t))  # EAGLE-3's d2t holds offsets
    assert int(draft_ids.max()) > 32_767  # the large ids survived the cache and reached the draft vocabulary

    target = load_model(chat_target, device="cpu", dtype="float32")
    tok = load_tokenizer(chat_target)
    prompt = chat_prompt_ids(tok, "Write a Python function that reverses a string.")
    greedy = SamplingConfig(temperature=0)
    want = plain_generate(target, prompt, 24, greedy, None).new_tokens
    result = SpeculativeDecoder(target, build_proposer(f"eagle3:{out}"), k=4, sampling=greedy).generate(prompt, 24)
    assert result.new_tokens == want
