"""Prompt lookup's n-gram index: the latest earlier occurrence of each n-gram, kept up to date
as the context grows, so a lookup costs O(max_ngram) instead of a scan of the context.

Rule (the same as a scan): for the longest n in [min_ngram, max_ngram] whose suffix n-gram
occurred earlier in the context with at least one token after it, copy up to k tokens that
followed its most recent such occurrence.

Between reset() calls the decoder's contexts extend each other (each round's context is
the previous one plus the emitted tokens). The index checks that at the last token it
indexed and rebuilds itself from scratch for a context that does not extend it.
"""

from __future__ import annotations

from collections.abc import Sequence


def check_ngram_range(min_ngram: int, max_ngram: int) -> None:
    """Raise ValueError unless 1 <= min_ngram <= max_ngram are integers (prompt lookup's parameters)."""
    if isinstance(max_ngram, bool) or not isinstance(max_ngram, int) or max_ngram < 1:
        raise ValueError(f"max_ngram must be an integer >= 1, got {max_ngram!r}")
    if isinstance(min_ngram, bool) or not isinstance(min_ngram, int) or not 1 <= min_ngram <= max_ngram:
        raise ValueError(f"min_ngram must be an integer in [1, max_ngram={max_ngram}], got {min_ngram!r}")


class NgramIndex:
    def __init__(self, min_ngram: int, max_ngram: int):
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.reset()

    def reset(self) -> None:
        self.tokens: list[int] = []
        # n -> {n-gram: start of its latest occurrence that has a token after it}
        self.latest: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(self.min_ngram, self.max_ngram + 1)}

    def lookup(self, context: Sequence[int], k: int) -> list[int]:
        self._extend(context)
        tokens = self.tokens
        length = len(tokens)
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            start = self.latest[n].get(tuple(tokens[length - n :]))
            if start is not None:
                return tokens[start + n : start + n + k]
        return []

    def _extend(self, context: Sequence[int]) -> None:
        old = len(self.tokens)
        if old and (len(context) < old or context[old - 1] != self.tokens[-1]):
            self.reset()  # not an extension of what was indexed
            old = 0
        if len(context) == old:
            return
        self.tokens.extend(int(t) for t in context[old:])
        tokens, length = self.tokens, len(self.tokens)
        for n, table in self.latest.items():
            # Occurrences with a token after them: starts s with s + n <= length - 1. Those
            # up to old - 1 - n were indexed before; later starts overwrite earlier ones.
            for s in range(max(0, old - n), length - n):
                table[tuple(tokens[s : s + n])] = s
