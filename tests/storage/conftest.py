"""Fixtures for the storage tests: tiny random models, real decoder runs, a fresh store."""

from __future__ import annotations

import pytest

from specscope.core import DraftModelProposer, PromptLookupProposer, SamplingConfig, SpeculativeDecoder
from specscope.storage import TraceStore, record
from tests.tiny_models import noisy_copy, tiny_lm

PROMPT = [5, 9, 14, 5, 9, 3, 7]


@pytest.fixture(scope="session")
def models():
    target = tiny_lm("llama", vocab=64, seed=0, layers=2, init_range=0.3)
    return target, noisy_copy(target, 0.05)


@pytest.fixture(scope="session")
def make_decoder(models):
    target, draft = models

    def make(kind: str = "sampled", k: int = 4, eos: int | None = None, seed: int = 3) -> SpeculativeDecoder:
        if kind == "lookup":
            proposer = PromptLookupProposer()
        else:
            proposer = DraftModelProposer(draft, label="tiny-draft")
        sampling = SamplingConfig(temperature=0.0) if kind == "greedy" else SamplingConfig(temperature=0.9, top_k=40)
        return SpeculativeDecoder(
            target, proposer, k=k, sampling=sampling, eos_token_id=eos, seed=seed, target_name="tiny-target"
        )

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
        results["sampled"] = record(
            s,
            make_decoder("sampled"),
            PROMPT,
            48,
            keep_rounds=True,
            model_info={"target_hash": "sha256:t", "draft_hash": "sha256:d"},
        )
        results["greedy"] = record(s, make_decoder("greedy"), PROMPT, 40, keep_rounds=True)
        results["lookup"] = record(
            s, make_decoder("lookup"), PROMPT * 2, 24, keep_rounds=True, full_vectors=False, top_n=5
        )
    return path, results
