"""Greedy speculative decoding reproduces transformers' own greedy generate exactly."""

import numpy as np
import pytest
import torch

from specscope.core import DraftModelProposer, PromptLookupProposer, SamplingConfig, SpeculativeDecoder
from tests.tiny_models import ARCHITECTURES, noisy_copy, tiny_lm

GREEDY = SamplingConfig(temperature=0)


def prompts(vocab: int, count: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        if i % 3 == 2:  # copy-heavy: a repeated motif, so prompt lookup finds matches
            motif = rng.integers(0, vocab, size=4).tolist()
            out.append(motif * 3 + motif[:2])
        else:
            out.append(rng.integers(0, vocab, size=int(rng.integers(1, 12))).tolist())
    return out


def reference_greedy(model, prompt, max_new, eos=None):
    ids = torch.tensor([prompt])
    gen = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=0,
    )
    return gen[0, len(prompt) :].tolist()


@pytest.fixture(scope="module", params=ARCHITECTURES)
def models(request):
    # float64 keeps near-ties of random logits from flipping between chunked and
    # token-by-token evaluation; the exactness being tested is the algorithm's.
    target = tiny_lm(request.param, seed=0, init_range=0.3, dtype=torch.float64)
    return request.param, target, noisy_copy(target, 0.05)


@pytest.mark.parametrize("k", [1, 2, 5])
def test_draft_model_greedy_equals_transformers_generate(models, k):
    arch, target, draft = models
    accepted = drafted = 0
    for prompt in prompts(64, 8, seed=k):
        expected = reference_greedy(target, prompt, 24)
        dec = SpeculativeDecoder(target, DraftModelProposer(draft), k=k, sampling=GREEDY)
        out = dec.generate(prompt, max_new_tokens=24)
        assert out.new_tokens == expected, (arch, k, prompt)
        accepted += out.summary.accepted
        drafted += out.summary.drafted
    # The check is only meaningful if drafts were both accepted and rejected.
    assert 0 < accepted < drafted


@pytest.mark.parametrize("k", [1, 2, 5])
def test_prompt_lookup_greedy_equals_transformers_generate(models, k):
    arch, target, _ = models
    accepted = 0
    for prompt in prompts(64, 8, seed=10 + k):
        expected = reference_greedy(target, prompt, 24)
        dec = SpeculativeDecoder(target, PromptLookupProposer(max_ngram=3), k=k, sampling=GREEDY)
        out = dec.generate(prompt, max_new_tokens=24)
        assert out.new_tokens == expected, (arch, k, prompt)
        accepted += out.summary.accepted
    assert accepted > 0


def test_greedy_with_eos_equals_transformers_generate(models):
    arch, target, draft = models
    for prompt in prompts(64, 6, seed=99):
        free_run = reference_greedy(target, prompt, 20)
        eos = free_run[len(free_run) // 2]  # a token the greedy run does emit
        expected = reference_greedy(target, prompt, 20, eos=eos)
        dec = SpeculativeDecoder(target, DraftModelProposer(draft), k=3, sampling=GREEDY, eos_token_id=eos)
        out = dec.generate(prompt, max_new_tokens=20)
        assert out.new_tokens == expected
        assert out.new_tokens[-1] == eos and out.stop_reason == "eos"


def test_plain_baseline_equals_transformers_generate(models):
    from specscope.core.decode.baseline import plain_generate

    arch, target, _ = models
    for prompt in prompts(64, 4, seed=5):
        result = plain_generate(target, prompt, 20, SamplingConfig(temperature=0))
        assert result.new_tokens == reference_greedy(target, prompt, 20)
        assert result.forwards == 20
