"""Fixtures for the core tests (tiny random-initialised models, no downloads)."""

import pytest

from tests.tiny_models import noisy_copy, tiny_lm


@pytest.fixture(scope="session")
def llama_pair():
    target = tiny_lm("llama", seed=0, init_range=0.3)
    return target, noisy_copy(target, 0.3)
