"""How a recorded generate() shares the process with its consumer and with other runs.

Only one generate() computes at a time in a process (COMPUTE). A run holds the lock with
its own torch random state (a Baton) while it computes, and gives both up while its
consumer handles a round, so two runs stepped in turn (compare lanes) draw exactly what each
draws alone. A stepped run's rounds cross from the generate() thread to the consumer
through a one-slot Channel; a drained run calls its consumer in the generate() thread and
needs no channel.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, cast

import torch
from transformers import StoppingCriteria

COMPUTE = threading.Lock()  # one generate() computing at a time
DONE = object()  # the channel's end-of-run item


class Baton:
    """COMPUTE plus this run's torch random state: released (state saved) while the run
    waits for its consumer, taken back (state restored) after."""

    def __init__(self) -> None:
        self.state: Any = None
        self.held = False

    def take(self) -> None:
        COMPUTE.acquire()
        self.held = True
        if self.state is not None:
            cpu, cuda = self.state
            torch.set_rng_state(cpu)
            if cuda is not None:
                torch.cuda.set_rng_state_all(cuda)

    def give(self) -> None:
        if not self.held:
            return
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        self.state = (torch.get_rng_state(), cuda)
        self.held = False
        COMPUTE.release()


class Channel:
    """One slot between the generate() thread and the consumer."""

    def __init__(self) -> None:
        self.slot: queue.Queue[Any] = queue.Queue(maxsize=1)
        self.cancelled = threading.Event()
        self.baton = Baton()

    def put(self, item: Any) -> None:
        self.baton.give()
        try:
            while not self.cancelled.is_set():
                try:
                    self.slot.put(item, timeout=0.05)
                    return
                except queue.Full:
                    continue
        finally:
            self.baton.take()

    def get(self) -> Any:
        while True:
            try:
                return self.slot.get(timeout=0.05)
            except queue.Empty:
                if self.cancelled.is_set():
                    return DONE

    def empty(self) -> bool:
        return self.slot.empty()

    def cancel(self) -> None:
        self.cancelled.set()


class CancelCriterion(StoppingCriteria):
    """A stopping criterion that is false until `cancelled` is set: generate() then ends
    after the round in progress."""

    def __init__(self, cancelled: threading.Event):
        self.cancelled = cancelled

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        done = torch.full((input_ids.shape[0],), self.cancelled.is_set(), dtype=torch.bool, device=input_ids.device)
        return cast(torch.BoolTensor, done)  # StoppingCriteria's return type: torch's legacy BoolTensor class


class FlagCriterion(StoppingCriteria):
    """A stopping criterion that is true once `flag()` is (the recorder's stop match)."""

    def __init__(self, flag: Callable[[], bool]):
        self.flag = flag

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        done = torch.full((input_ids.shape[0],), bool(self.flag()), dtype=torch.bool, device=input_ids.device)
        return cast(torch.BoolTensor, done)  # StoppingCriteria's return type: torch's legacy BoolTensor class


class StopCriterion(StoppingCriteria):
    """A stopping criterion for an unrecorded generate() with stops: it checks every new token
    in order (core.decode.stops: the tracker's rule, EOS first) and turns true once one
    completes a stop. transformers may have added tokens past it in the same round: `end`
    says where the output ends (the new tokens up to and including the first EOS or the
    token that completes a stop), None: at neither."""

    def __init__(self, tracker: Any, start: int, eos_ids: frozenset[int]):
        self.tracker, self.start, self.eos_ids = tracker, start, eos_ids
        self.seen = 0  # new tokens checked so far
        self.end: int | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        for token in input_ids[0, self.start + self.seen :].tolist():
            self.seen += 1
            if self.end is not None:
                continue
            if token in self.eos_ids or self.tracker.check([token]) is not None:
                self.end = self.seen
            else:
                self.tracker.commit([token])
        done = torch.full((input_ids.shape[0],), self.end is not None, dtype=torch.bool, device=input_ids.device)
        return cast(torch.BoolTensor, done)  # StoppingCriteria's return type: torch's legacy BoolTensor class
