"""The bench's position limits at the boundary (tests/core/decode/test_position_limits.py has the
decoder's, the engine's and the factory's)."""

from __future__ import annotations

import pytest
import torch

from specscope.app.bench import Bench
from specscope.core import SamplingConfig
from specscope.core.decode.factory import SettingsError
from tests.core.decode.test_position_limits import LIMIT, PROMPT, gpt2

GREEDY = SamplingConfig(temperature=0)


def test_the_bench_refuses_its_transformers_lookup_rows_past_the_limit():
    """The bench's own transformers prompt-lookup row needs the k - 2 positions too; its
    speculative rows fit at prompt + budget == limit."""
    fits = LIMIT - len(PROMPT)
    common = dict(
        ks=[4], reps=1, sampling=GREEDY, eos=None, device=torch.device("cpu"), specs=["lookup"], include_traced=False
    )
    with pytest.raises(SettingsError, match="transformers' prompt lookup with k=4"):
        Bench(gpt2(LIMIT), {}, [PROMPT], max_new=fits, **common)
    bench = Bench(gpt2(LIMIT), {}, [PROMPT], max_new=fits - 2, **common)
    bench.run()
    assert all(len(s.tokens) == fits - 2 for m in bench.methods for rep in m.samples for s in rep)
