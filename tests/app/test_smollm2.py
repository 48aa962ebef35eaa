"""The real SmolLM2-135M-Instruct (fetched from the package registry, converted once and kept
in the cache): greedy speculative decoding equals plain greedy decoding for 32 tokens on three
chat prompts (a question, a summary, code: resources/prompts/chat.json), with prompt lookup, a draft and a token tree, and the stored runs check clean.

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
from specscope.core.loading.chat import chat_prompt_ids, chat_prompts, turn_end_id  # noqa: E402

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


def test_speculative_greedy_equals_plain_greedy_on_smollm2_and_checks_clean(smollm2, tmp_path, capsys):
    import torch

    from specscope.core import DraftModelProposer, PromptLookupProposer, SamplingConfig, SpeculativeDecoder, plain_generate
    from specscope.core.loading import load_models
    from specscope.storage import TraceStore, record

    torch.set_num_threads(2)
    draft_dir = _early_exit_draft(smollm2, tmp_path / "draft")
    pair = load_models(target="smollm2", draft=str(draft_dir), device="cpu")  # the tokenizer contract is checked
    greedy = SamplingConfig(temperature=0.0)
    proposers = {"lookup": lambda: PromptLookupProposer(),
                 "draft": lambda: DraftModelProposer(pair.draft),
                 "draft tree 2,2,1": lambda: DraftModelProposer(pair.draft, tree="2,2,1")}
    prompts = [chat_prompts(kind)[0] for kind in ("chat", "summary", "code")]
    eos = turn_end_id(pair.target, pair.tokenizer)
    db = tmp_path / "runs.sqlite"
    with TraceStore(db) as store:
        for prompt in prompts:
            ids = chat_prompt_ids(pair.tokenizer, prompt.user, prompt.system)
            plain = plain_generate(pair.target, ids, NEW_TOKENS, greedy, eos_token_id=eos).new_tokens
            for name, make in proposers.items():
                decoder = SpeculativeDecoder(pair.target, make(), k=4, sampling=greedy, eos_token_id=eos)
                assert record(store, decoder, ids, NEW_TOKENS).new_tokens == plain, (name, prompt.name)
    assert main(["check", str(db)]) == 0
    report = capsys.readouterr().out
    assert report.count("no findings") == len(prompts) * len(proposers), report


def test_the_cli_decodes_a_chat_prompt_with_the_fetched_model(smollm2, capsys):
    assert main(["run", "--target", "smollm2", "--proposer", "lookup", "--chat", "--prompt",
                 "What is the capital of France?", "--max-new", "16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "Paris" in out["text"] and out["stop_reason"] == "eos"
