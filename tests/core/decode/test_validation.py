"""Bad input gets a clear ValueError, never a wrong answer."""

import pytest
import torch

from specscope.core import DraftModelProposer, PromptLookupProposer, SamplingConfig, SpeculativeDecoder
from tests.tiny_models import tiny_lm


@pytest.fixture(scope="module")
def target():
    return tiny_lm("llama", seed=0)


@pytest.fixture(scope="module")
def decoder(target):
    return SpeculativeDecoder(target, DraftModelProposer(tiny_lm("llama", seed=1)), k=2)


@pytest.mark.parametrize(
    "prompt, message",
    [
        ([], "empty"),
        ([1, -2, 3], "outside the vocabulary"),
        ([1, 64], "outside the vocabulary"),
        ([1, 2.5], "not an integer"),
        ([True, 2], "not an integer"),
        (torch.tensor([[1, 2], [3, 4]]), "shape"),
        (torch.tensor([1.0, 2.0]), "integer token ids"),
        (torch.zeros((1, 0), dtype=torch.long), "empty"),
    ],
)
def test_bad_prompts(decoder, prompt, message):
    with pytest.raises(ValueError, match=message):
        decoder.generate(prompt, 4)


def test_long_tensor_prompts_are_accepted(decoder):
    a = decoder.generate(torch.tensor([[5, 6, 7]]), 5).new_tokens
    b = decoder.generate([5, 6, 7], 5).new_tokens
    assert a == b and len(a) == 5


@pytest.mark.parametrize("k", [0, -1, 1.5, True])
def test_bad_k(target, k):
    with pytest.raises(ValueError, match="k"):
        SpeculativeDecoder(target, PromptLookupProposer(), k=k)


@pytest.mark.parametrize("max_new", [-1, 2.0])
def test_bad_budget(decoder, max_new):
    with pytest.raises(ValueError, match="max_new_tokens"):
        decoder.generate([1, 2], max_new)


@pytest.mark.parametrize("eos", [-1, 64, 3.0])
def test_bad_eos(target, eos):
    with pytest.raises(ValueError, match="eos_token_id"):
        SpeculativeDecoder(target, PromptLookupProposer(), eos_token_id=eos)


def test_vocabulary_mismatch_is_refused(target):
    with pytest.raises(ValueError, match="vocabularies differ"):
        SpeculativeDecoder(target, DraftModelProposer(tiny_lm("llama", vocab=65)), k=2)


@pytest.mark.parametrize("where", ["target", "draft"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_non_finite_logits_are_refused(where, temperature):
    healthy, broken = tiny_lm("llama", seed=0), tiny_lm("llama", seed=0)
    with torch.no_grad():
        broken.lm_head.weight[3, 0] = float("nan")
    target, draft = (broken, healthy) if where == "target" else (healthy, broken)
    dec = SpeculativeDecoder(target, DraftModelProposer(draft), k=2, sampling=SamplingConfig(temperature=temperature))
    with pytest.raises(ValueError, match="non-finite"):
        dec.generate([1, 2, 3], 4)


@pytest.mark.parametrize("kwargs", [dict(max_ngram=0), dict(min_ngram=0), dict(max_ngram=2, min_ngram=3)])
def test_bad_lookup_settings(kwargs):
    with pytest.raises(ValueError, match="ngram"):
        PromptLookupProposer(**kwargs)
