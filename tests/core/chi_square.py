"""Shared machinery of the chi-square tests (test_distribution, test_tree_distribution,
test_coupling): the tiny target/draft pair they enumerate exactly, the decoder's outputs
counted over many seeds on every core, and the pooled goodness-of-fit test.

One `generate` on the 5-token model costs a few milliseconds, nearly all of it transformers'
per-forward overhead, so a test's thousands of seeds are what its time is. The seeds are
independent (a run's output depends on its seed alone), so they are split into chunks run by
worker processes and the chunks' counts summed: the counts, hence the p-value, are the same
whatever the number of workers, and the same as one loop over the seeds in this process.
"""

from __future__ import annotations

import atexit
import functools
import os
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

from scipy.stats import chisquare

from tests.tiny_models import noisy_copy, tiny_lm

VOCAB = 5
CHUNK = 250  # seeds a task: small enough to balance two workers, large enough to cost nothing
WORKERS_ENV = "SPECSCOPE_TEST_WORKERS"  # 1: every seed in the test's own process


@functools.cache
def stat_models():
    """The target and a far-off draft (many rejections and repairs), built from fixed seeds:
    every process that asks builds the same weights."""
    target = tiny_lm("gpt2", vocab=VOCAB, seed=0, init_range=1.0, layers=1, hidden=16)
    return target, noisy_copy(target, 1.0)


def _workers() -> int:
    wanted = os.environ.get(WORKERS_ENV)
    if wanted:
        return max(1, int(wanted))
    return min(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)  # one thread a process: the processes are the parallelism


@functools.cache
def _pool(workers: int) -> ProcessPoolExecutor:
    # spawn: a fork of a process holding torch's thread pools (and maybe Qt) is not safe
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"), initializer=_init_worker)
    atexit.register(pool.shutdown, cancel_futures=True)
    return pool


def _count(draw: Callable, spec, seeds: Sequence[int]) -> Counter:
    return Counter(draw(spec, seeds))


def count_outputs(draw: Callable[[object, Sequence[int]], Iterable[Hashable]], spec, samples: int) -> Counter:
    """How often each output comes out of `draw(spec, seeds)` over the seeds 0..samples-1.

    `draw` must be a module-level function (workers import it by name) and `spec` picklable;
    `draw` yields one output per seed, which must depend on that seed alone."""
    chunks = [range(start, min(start + CHUNK, samples)) for start in range(0, samples, CHUNK)]
    workers = _workers()
    if workers == 1 or len(chunks) == 1:
        parts = [_count(draw, spec, chunk) for chunk in chunks]
    else:
        parts = list(_pool(workers).map(_count, [draw] * len(chunks), [spec] * len(chunks), chunks))
    total = sum(parts, Counter())
    assert total.total() == samples
    return total


def fit_pvalue(counts: Counter, expected: dict[Hashable, float]) -> float:
    """Chi-square p-value of `counts` against the exact distribution `expected`. Cells with
    small expectations (< 5) are pooled so the chi-square approximation holds."""
    samples = counts.total()
    impossible = [out for out in counts if expected.get(out, 0) <= 0]
    assert not impossible, f"emitted {impossible}, which have probability 0 under the target"
    big = [s for s, p in expected.items() if p * samples >= 5]
    observed = [counts.get(s, 0) for s in big]
    wanted = [expected[s] * samples for s in big]
    rest_observed, rest_wanted = samples - sum(observed), samples - sum(wanted)
    if rest_wanted > 0:
        observed.append(rest_observed)
        wanted.append(rest_wanted)
    return chisquare(observed, wanted).pvalue
