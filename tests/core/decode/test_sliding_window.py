"""Sliding-window attention (Mistral, Gemma 2, Gemma 3): decoded exactly past the window.

transformers' own sliding-window cache keeps only the last `window` positions and cannot be
cropped once a draft runs past them; specscope keeps those layers whole and lets the mask apply
the window (core.decode.kv.growing_cache). Checked on random-initialised models whose window
(8) is far shorter than the run (20 prompt + 40 new tokens): greedy speculative decoding equals
plain greedy decoding and transformers' generate with its own cache, with the cache and with
every forward recomputed, for chains and token trees, with a draft that agrees with the
target (everything accepted: crops after long accepted blocks) and one that does not."""

from __future__ import annotations

import copy

import pytest
import torch

from specscope.core import DraftModelProposer, PromptLookupProposer, SamplingConfig, SpeculativeDecoder, plain_generate

WINDOW = 8
PROMPT = list(range(5, 25))
NEW = 40
GREEDY = SamplingConfig(temperature=0.0)


def _model(kind: str, layers: int, seed: int):
    from transformers import (
        Gemma2Config,
        Gemma2ForCausalLM,
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        MistralConfig,
        MistralForCausalLM,
    )

    torch.manual_seed(seed)
    common = dict(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=WINDOW,
        max_position_embeddings=512,
    )
    if kind == "mistral":
        model = MistralForCausalLM(MistralConfig(**common))
    elif kind == "gemma2":
        model = Gemma2ForCausalLM(Gemma2Config(head_dim=8, **common))
    else:
        types = ["sliding_attention"] * (layers - 1) + ["full_attention"]
        model = Gemma3ForCausalLM(Gemma3TextConfig(head_dim=8, layer_types=types, **common))
    return model.eval()


@pytest.fixture(scope="module", params=["mistral", "gemma2", "gemma3"])
def models(request):
    target = _model(request.param, 3, seed=0)
    reference = target.generate(
        torch.tensor([PROMPT]), max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0
    )[0, len(PROMPT) :].tolist()
    return request.param, target, reference


def test_plain_greedy_past_the_window_equals_transformers_generate(models):
    _, target, reference = models
    assert plain_generate(target, PROMPT, NEW, GREEDY).new_tokens == reference


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "recompute"])
@pytest.mark.parametrize("tree", [None, "2,2,1"], ids=["chain", "tree"])
@pytest.mark.parametrize("draft_kind", ["copy", "other"])
def test_speculative_greedy_past_the_window_equals_plain_greedy(models, draft_kind, tree, use_cache):
    kind, target, reference = models
    draft = copy.deepcopy(target) if draft_kind == "copy" else _model(kind, 2, seed=1)
    decoder = SpeculativeDecoder(
        target, DraftModelProposer(draft, tree=tree), k=4, sampling=GREEDY, use_cache=use_cache
    )
    result = decoder.generate(PROMPT, NEW)
    assert result.new_tokens == reference
    if draft_kind == "copy":  # whole blocks accepted: the caches were cropped past the window many times
        assert len(result.rounds) < NEW // 2


def test_prompt_lookup_past_the_window_equals_plain_greedy(models):
    _, target, reference = models
    decoder = SpeculativeDecoder(target, PromptLookupProposer(max_ngram=2), k=4, sampling=GREEDY)
    assert decoder.generate(PROMPT, NEW).new_tokens == reference


def test_a_model_whose_cache_cannot_be_rolled_back_is_refused_before_decoding():
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "lfm2",
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        layer_types=["conv", "full_attention"],
    )
    model = AutoModelForCausalLM.from_config(config).eval()
    with pytest.raises(ValueError, match="cannot decode 'lfm2' models: their LinearAttentionLayer") as err:
        SpeculativeDecoder(model, PromptLookupProposer())
    assert "\n" not in str(err.value)
