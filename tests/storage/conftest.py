"""Fixtures for the storage tests: tiny random models, real decoder runs, a fresh store."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specscope.core import DraftModelProposer, PromptLookupProposer, SamplingConfig, SpeculativeDecoder
from specscope.storage import TraceStore, record

PROMPT = [5, 9, 14, 5, 9, 3, 7]


def tiny_llama(seed: int, layers: int = 2, vocab: int = 64) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      initializer_range=0.3, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(cfg).eval()


def noisy_copy(model: torch.nn.Module, noise: float = 0.05, seed: int = 1) -> torch.nn.Module:
    """A draft that mostly agrees with the target: its weights plus Gaussian noise."""
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * noise * param.std().clamp_min(1e-3))
    return draft


@pytest.fixture(scope="session")
def models():
    target = tiny_llama(0, 2)
    return target, noisy_copy(target)


@pytest.fixture(scope="session")
def make_decoder(models):
    target, draft = models

    def make(kind: str = "sampled", k: int = 4, eos: int | None = None, seed: int = 3) -> SpeculativeDecoder:
        if kind == "lookup":
            proposer = PromptLookupProposer()
        else:
            proposer = DraftModelProposer(draft, label="tiny-draft")
        sampling = SamplingConfig(temperature=0.0) if kind == "greedy" else SamplingConfig(temperature=0.9, top_k=40)
        return SpeculativeDecoder(target, proposer, k=k, sampling=sampling, eos_token_id=eos, seed=seed, target_name="tiny-target")

    return make


@pytest.fixture
def store(tmp_path):
    with TraceStore(tmp_path / "traces.sqlite") as s:
        yield s


@pytest.fixture(scope="session")
def recorded(tmp_path_factory, make_decoder):
    """One store holding a sampled, a greedy and a prompt-lookup run; with the in-memory results."""
    path = tmp_path_factory.mktemp("recorded") / "runs.sqlite"
    results = {}
    with TraceStore(path) as s:
        results["sampled"] = record(s, make_decoder("sampled"), PROMPT, 48, model_info={"target_hash": "sha256:t", "draft_hash": "sha256:d"})
        results["greedy"] = record(s, make_decoder("greedy"), PROMPT, 40)
        results["lookup"] = record(s, make_decoder("lookup"), PROMPT * 2, 24, full_vectors=False, top_n=5)
    return path, results
