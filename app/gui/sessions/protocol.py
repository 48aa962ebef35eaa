"""What the window calls on a session. Every session (live, replay, compare) says its state in
words for the status bar (`Session`); the two that fill the Inspect tab (live and replay) also
take the run keys the window routes to the active one and hand their stored run to the checker
and the exports (`InspectSession`). The window holds the active one as an `InspectSession`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol


class Session(Protocol):
    """What the window asks of every session (live, replay, compare)."""

    def status_words(self) -> str:
        """The session's state in words, for the status bar."""
        ...


class InspectSession(Session, Protocol):
    """A session that fills the Inspect tab's RunModel (live, replay): the window routes Run,
    Step, Space, Right and Play to the active one; `start(run)` starts a live run from the
    run panel."""

    shows_run_state: bool  # the run panel shows this session's state and activity

    @property
    def trace_path(self) -> str | None: ...

    def run_key(self, start: Callable[[bool], Any]) -> None: ...

    def step_key(self, start: Callable[[bool], Any]) -> None: ...

    def space_key(self, start: Callable[[bool], Any]) -> None: ...

    def browses(self) -> bool:
        """Whether Right moves the selection instead of stepping."""
        ...

    def can_play(self) -> bool:
        """Whether the navigator may play the rounds back."""
        ...

    def rounds_for_checking(self) -> Iterable[Any]: ...

    def store_and_run(self) -> tuple[Any, str] | None:
        """(trace store, run id) of the run shown when it is stored."""
        ...
