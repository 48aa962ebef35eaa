"""Position limits at the boundary: prompt + max_new == max_position_embeddings runs, one more
is refused before decoding, by the factory (naming the flag) and by the decoder and the
transformers engine themselves (the Python API without the factory). The models are GPT-2s,
whose learned positions fail with an IndexError at the first position past the limit: a
run that reads one position too many cannot pass quietly."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from specscope.core import DraftModelProposer, PromptLookupProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.check.checker import check_report
from specscope.core.decode.factory import Models, RunSettings, SettingsError, build_decoder, run_config
from specscope.core.engines import TransformersEngine
from specscope.core.records import RunEnd

LIMIT = 24
PROMPT = [1, 2, 3, 1, 2, 3]  # repeats: prompt lookup finds candidates
GREEDY = SamplingConfig(temperature=0)


def gpt2(positions: int, noise: float = 0.0) -> torch.nn.Module:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=64,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=positions,
            initializer_range=0.3,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        )
    ).eval()
    if noise:
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn(param.shape, generator=gen) * noise)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


@pytest.fixture(scope="module")
def models():
    return Models(gpt2(LIMIT), target_name="target24", draft=gpt2(LIMIT, noise=0.05), draft_name="draft24")


SHAPES = [
    ("specscope", "draft", 4),
    ("specscope", "draft", 1),
    ("specscope", "draft:d,tree=3,2,1", 4),
    ("specscope", "draft:d,tree=2,2,2,2,2,2", 4),
    ("specscope", "draft:d,tree=dynamic:nodes=12,depth=8,topk=3", 4),
    ("specscope", "lookup", 4),
    ("transformers", "draft", 4),
    ("transformers", "draft", 1),
]


@pytest.mark.parametrize("engine, spec, k", SHAPES)
def test_the_last_position_runs_and_one_more_is_refused(models, engine, spec, k):
    fits = LIMIT - len(PROMPT)
    settings = RunSettings(proposer=spec, engine=engine, k=k, temperature=0, max_new_tokens=fits, eos_disabled=True)
    decoder = build_decoder(settings, models)
    config = run_config(decoder, settings, models, PROMPT)
    assert config.position_limit == LIMIT
    out = decoder.start(PROMPT, fits, config=config, keep_rounds=True).drain()
    assert len(out.new_tokens) == fits and out.stop_reason == "budget"
    end = RunEnd("completed", out.stop_reason, len(out.new_tokens))
    assert [f for f in check_report(out.config, out.rounds, end=end).findings if f.rule != "acceptance-draw"] == []
    over = RunSettings(proposer=spec, engine=engine, k=k, temperature=0, max_new_tokens=fits + 1, eos_disabled=True)
    with pytest.raises(SettingsError) as caught:
        run_config(decoder, over, models, PROMPT, names={"max_new_tokens": "--max-new"})
    assert caught.value.errors["max_new_tokens"].endswith(f"--max-new must be at most {fits}")
    with pytest.raises(ValueError, match=f"needs {LIMIT + 1} positions, but .* reads at most {LIMIT}"):
        decoder.run_config(PROMPT, fits + 1)  # the Python API without the factory refuses it too


@pytest.mark.parametrize("k", [3, 4, 6])
def test_transformers_prompt_lookup_reads_k_minus_2_positions_past_the_budget(models, k):
    """transformers' prompt lookup caps its candidates by the input's length, not by the
    budget: the run is refused where its verify forward would pass the limit, and runs where
    it would not."""
    extra = k - 2
    fits = LIMIT - len(PROMPT) - extra
    settings = RunSettings(
        proposer="lookup", engine="transformers", k=k, temperature=0, max_new_tokens=fits + 1, eos_disabled=True
    )
    decoder = build_decoder(settings, models)
    with pytest.raises(SettingsError) as caught:
        run_config(decoder, settings, models, PROMPT)
    assert f"+{extra}: transformers' prompt lookup with k={k}" in caught.value.errors["max_new_tokens"]
    with pytest.raises(ValueError, match="transformers' prompt lookup"):
        decoder.run_config(PROMPT, fits + 1)
    for prompt in (PROMPT, [1, 1, 1, 1, 1, 1], [5, 9, 5, 9, 5, 9]):  # other matches, other rounds near the end
        out = decoder.generate(prompt, fits)
        assert len(out.new_tokens) == fits


def test_a_draft_with_a_smaller_limit_sets_it_in_every_front(models):
    short = Models(models.target, target_name="target24", draft=gpt2(16, noise=0.05), draft_name="draft16")
    fits = 16 - len(PROMPT)
    for engine in ("specscope", "transformers"):
        settings = RunSettings(
            proposer="draft", engine=engine, k=4, temperature=0, max_new_tokens=fits + 1, eos_disabled=True
        )
        decoder = build_decoder(settings, short)
        with pytest.raises(SettingsError, match="draft16 reads at most 16"):
            run_config(decoder, settings, short, PROMPT)
        with pytest.raises(ValueError, match="draft16 reads at most 16"):
            decoder.run_config(PROMPT, fits + 1)
        assert len(decoder.generate(PROMPT, fits).new_tokens) == fits
    direct = SpeculativeDecoder(short.target, DraftModelProposer(short.draft, label="draft16"), k=4, sampling=GREEDY)
    with pytest.raises(ValueError, match="draft16 reads at most 16"):
        direct.generate(PROMPT, fits + 1)
    assert len(
        SpeculativeDecoder(short.target, PromptLookupProposer(), k=4, sampling=GREEDY)
        .generate(PROMPT, LIMIT - len(PROMPT))
        .new_tokens
    ) == LIMIT - len(PROMPT)  # no draft model: the target's limit
    engine = TransformersEngine(short.target, draft=short.draft, k=4, sampling=GREEDY, draft_name="draft16")
    with pytest.raises(ValueError, match="draft16 reads at most 16"):
        engine.generate(PROMPT, fits + 1)
