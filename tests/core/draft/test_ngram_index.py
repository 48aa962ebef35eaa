"""Prompt lookup's n-gram index gives what a scan of the whole context gives."""

from __future__ import annotations

import numpy as np
import pytest

from specscope.core.draft.ngram_index import NgramIndex


def scan(context: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The definition: the latest earlier occurrence (with a token after it) of the longest
    suffix n-gram, by comparing every window."""
    length = len(context)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = context[length - n :]
        for s in range(length - 1 - n, -1, -1):
            if context[s : s + n] == suffix:
                return context[s + n : s + n + k]
    return []


@pytest.mark.parametrize("vocab", [2, 5, 50])
@pytest.mark.parametrize("ngrams", [(1, 1), (1, 3), (2, 4)])
def test_index_matches_the_scan_as_the_context_grows(vocab, ngrams):
    rng = np.random.default_rng(vocab)
    min_n, max_n = ngrams
    index = NgramIndex(min_n, max_n)
    context = rng.integers(0, vocab, size=3).tolist()
    for _ in range(300):
        k = int(rng.integers(1, 6))
        assert index.lookup(context, k) == scan(context, k, min_n, max_n), context
        context = context + rng.integers(0, vocab, size=int(rng.integers(1, 5))).tolist()


def test_a_context_that_does_not_extend_the_index_rebuilds_it():
    index = NgramIndex(1, 3)
    assert index.lookup([1, 2, 3, 1, 2], 2) == [3, 1]
    # A shorter, different context (another run without reset): the answer of a fresh scan.
    assert index.lookup([7, 8, 7], 2) == scan([7, 8, 7], 2, 1, 3) == [8, 7]
    assert index.lookup([9, 9, 9, 9], 3) == scan([9, 9, 9, 9], 3, 1, 3)


def test_short_contexts_propose_nothing():
    index = NgramIndex(1, 3)
    assert index.lookup([4], 3) == []
    assert index.lookup([4, 5], 3) == []
