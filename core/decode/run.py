"""A run in progress: iterate it for its rounds, read its result when it is done.

`SpeculativeDecoder.rounds()` is a plain generator whose return value is the
GenerationResult; every consumer (CLI printer, trace writer, Qt worker, scripts) used to
write its own `next()`/`StopIteration` loop to get at that value. A RunHandle does it once.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator

from specscope.core.records import GenerationResult, Round, RunConfig


class RunHandle(Iterator[Round]):
    """Wraps a rounds() generator. `for rnd in run: ...` steps it; `run.result` is the
    GenerationResult once the generator has returned; `run.drain()` runs it to the end;
    `run.close()` cancels it after the round in progress."""

    def __init__(self, rounds: Generator[Round, None, GenerationResult], config: RunConfig | None = None):
        self._rounds = rounds
        self.config = config
        self.result: GenerationResult | None = None
        self.rounds_seen = 0

    def __iter__(self) -> RunHandle:
        return self

    def __next__(self) -> Round:
        if self.result is not None:
            raise StopIteration
        try:
            rnd = next(self._rounds)
        except StopIteration as stop:
            self.result = stop.value
            raise StopIteration from None
        self.rounds_seen += 1
        return rnd

    @property
    def done(self) -> bool:
        return self.result is not None

    def step(self) -> Round | None:
        """The next round, or None when the run has ended (then `result` is set)."""
        return next(self, None)

    def drain(self, each: Callable[[Round], None] | None = None) -> GenerationResult:
        """Run to the end, calling `each(round)` per round; the generator is closed (the run
        cancelled) if `each` raises."""
        try:
            for rnd in self:
                if each is not None:
                    each(rnd)
        except BaseException:
            self.close()
            raise
        assert self.result is not None, "a rounds() generator must return its GenerationResult"
        return self.result

    def close(self) -> None:
        """Cancel: the decoder stops after the round in progress (a no-op once finished)."""
        self._rounds.close()


def as_run(rounds: RunHandle | Generator[Round, None, GenerationResult]) -> RunHandle:
    """A RunHandle for a handle or a bare rounds() generator."""
    return rounds if isinstance(rounds, RunHandle) else RunHandle(rounds)
