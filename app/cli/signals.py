"""Ctrl-C and SIGTERM during `specscope run`: a round is counted, kept and shown whole or not at all."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


class Cancelled(KeyboardInterrupt):
    """Raised in the main thread by `specscope run`'s SIGTERM handler: the run ends as after
    Ctrl-C (cancelled, what was decoded stored), and the exit status is 128 + the signal."""

    def __init__(self, signum: int):
        import signal

        super().__init__(f"cancelled by {signal.Signals(signum).name}")
        self.signum = signum


def interrupt_status(exc: BaseException) -> int:
    """The conventional exit status after an interrupt: 130 for SIGINT (Ctrl-C), 143 for SIGTERM."""
    import signal

    return 128 + int(getattr(exc, "signum", signal.SIGINT))


class _RunSignals:
    """Ctrl-C and SIGTERM while `specscope run` decodes: SIGTERM raises Cancelled as Ctrl-C
    raises KeyboardInterrupt, except while a decoded round is being stored and printed
    (`whole_round`): then the signal waits for the round's end, so that a round is counted,
    kept and shown entirely or not at all."""

    def __init__(self) -> None:
        self.holding = False
        self.pending: int | None = None

    def handler(self, signum: int, frame: Any) -> None:
        if self.holding:
            self.pending = signum
            return
        self.interrupt(signum)

    @staticmethod
    def interrupt(signum: int) -> None:
        import signal

        raise Cancelled(signum) if signum == signal.SIGTERM else KeyboardInterrupt

    @contextlib.contextmanager
    def whole_round(self) -> Iterator[None]:
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
        if self.pending is not None:
            signum, self.pending = self.pending, None
            self.interrupt(signum)


@contextlib.contextmanager
def run_signals() -> Iterator[_RunSignals]:
    """Installs _RunSignals' handler for SIGTERM, and for SIGINT where Python's own handler
    is in place (an ignored Ctrl-C stays ignored), in the main thread (elsewhere no handler
    can be set and nothing changes); the previous handlers are restored after."""
    import signal
    import threading

    signals = _RunSignals()
    if threading.current_thread() is not threading.main_thread():
        yield signals
        return
    wanted = [signal.SIGTERM] + (
        [signal.SIGINT] if signal.getsignal(signal.SIGINT) is signal.default_int_handler else []
    )
    previous = {signum: signal.signal(signum, signals.handler) for signum in wanted}
    try:
        yield signals
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
