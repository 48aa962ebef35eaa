"""Every numeric bound of a setting, defined once, with the one message a bad value gets.

A bound says what can matter, so that no value a front end accepts can exhaust memory or time
before it is refused (issue 43 item 6): a draft length by the longest draft a trace may hold, a
prompt-lookup n-gram by what its index can keep (it holds every n-gram length from min to max
for each context position, so its memory grows with max_ngram squared), a tree by its node
budget, a top-N by the largest vocabulary a trace may hold (and, once the vocabulary is known,
it is cut to it), threads by a machine's cores, bench repetitions and prompts by what a
benchmark ever needs. Integers that only name things (seeds, ids, run limits) are bounded by
the store's columns.

The CLI (app/cli/options.py: its flags), the window (app/gui/model/settings.py), the proposer
spec (core/draft/registry.py: its integer parameters), tree specs (core/draft/trees.py) and the
JSONL reader (storage/jsonl) take their limits from `BOUNDS`; `IntBound.problem` is the message.
Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

INT32_MAX = 2**31 - 1  # the store's INTEGER columns (k, max_new_tokens, top_k, eos id, top_n) on every database
INT64_MAX = 2**63 - 1  # the store's seed column (BIGINT); numpy's default_rng wants a seed >= 0
MAX_K = 4096  # the longest draft (or largest tree budget) a trace may hold (storage/jsonl's import limit)
MAX_VOCAB_SIZE = 2**24  # a vocabulary the checker can hold as dense float64 vectors (128 MiB each)
MAX_TOP_N = MAX_VOCAB_SIZE  # a top-N past the vocabulary keeps the whole vocabulary
MAX_NGRAM = 64  # prompt lookup: the index keeps every n-gram of length min..max at every position
MAX_TREE_NODES = 256  # a tree wider (or deeper, or with more children per node) is almost surely a typo
MAX_THREADS = 256  # torch CPU threads: more than any machine this runs on has cores
MAX_REPS = 1000  # bench: timed repetitions of each row
MAX_PROMPTS = 10_000  # bench: prompts of each kind (there are far fewer bundled)


@dataclass(frozen=True)
class IntBound:
    """A whole number in [lo, hi]; `why` (when given) says what the upper bound stands for."""

    lo: int
    hi: int
    why: str = ""

    def problem(self, value: object) -> str | None:
        """The message for `value` (None when it is within the bound), without the field's name:
        the caller puts its own name for the field before it."""
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be a whole number, got {value!r}"
        if value < self.lo:
            return f"must be at least {self.lo}, got {value}"
        if value > self.hi:
            why = f" ({self.why})" if self.why else ""
            return f"must be at most {self.hi}{why}, got {value}"
        return None


# setting -> its bound; the keys are RunSettings' fields, the proposer spec's parameters
# ("max_ngram"), the tree spec's ("tree_nodes") and the front ends' own numbers ("threads", "reps")
BOUNDS: dict[str, IntBound] = {
    "k": IntBound(1, MAX_K),
    "top_k": IntBound(0, INT32_MAX),
    "seed": IntBound(0, INT64_MAX),
    "max_new_tokens": IntBound(1, INT32_MAX),
    "top_n": IntBound(1, MAX_TOP_N, "the largest vocabulary a trace may hold"),
    "coupling_seed": IntBound(0, INT64_MAX),
    "token_id": IntBound(0, INT32_MAX),
    "max_ngram": IntBound(1, MAX_NGRAM, "the n-gram index grows with its square"),
    "min_ngram": IntBound(1, MAX_NGRAM, "the n-gram index grows with its square"),
    "tree_depth": IntBound(1, MAX_TREE_NODES, "a tree's node budget"),
    "tree_topk": IntBound(1, MAX_TREE_NODES, "a tree's node budget"),
    "threads": IntBound(1, MAX_THREADS),
    "reps": IntBound(1, MAX_REPS),
    "prompts": IntBound(1, MAX_PROMPTS),
    # the trace commands' numbers: a round index, entries listed, runs listed
    "round": IntBound(0, INT32_MAX),
    "top": IntBound(0, MAX_TOP_N),
    "limit": IntBound(0, INT64_MAX),
    # what a recorded trace may hold (storage/jsonl): a run's budget may be 0 there
    "vocab_size": IntBound(1, MAX_VOCAB_SIZE),
    "trace_max_new_tokens": IntBound(0, INT64_MAX),
}
ANY_INT = IntBound(-INT64_MAX - 1, INT64_MAX)  # an integer option with no bound of its own: the store's 64 bits
