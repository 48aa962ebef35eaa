"""A proposer whose draft tokens a test chooses, with a point-mass q like prompt lookup."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from specscope.core.draft.proposers import Draft, ProposerBase, chain_parents


class ScriptedProposer(ProposerBase):
    name = "scripted"
    spec = "scripted"
    label = None

    def __init__(self, script: Callable[[Sequence[int], int], list[int]], vocab_size: int):
        self.script = script
        self.vocab_size = vocab_size
        self.calls: list[tuple[int, int]] = []  # (context length, k) per round

    def bind(self, vocab_size: int, use_cache: bool) -> None:
        assert vocab_size == self.vocab_size

    def reset(self) -> None:
        self.calls.clear()

    @property
    def cache_length(self):
        return None

    def params(self):
        return {}

    def propose(self, context, k, sampling, rng):
        self.calls.append((len(context), k))
        tokens = list(self.script(list(context), k))[:k]
        q = None
        if not sampling.greedy and tokens:
            q = np.zeros((len(tokens), self.vocab_size))
            q[np.arange(len(tokens)), tokens] = 1.0
        return Draft(tokens=tuple(tokens), parents=chain_parents(len(tokens)), q=q)

    def observe(self, committed_len):
        return None
