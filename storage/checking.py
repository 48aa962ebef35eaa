"""One stored run checked as `specscope check` checks it, for every front end: the CLI's report,
the window's findings panel and its run picker's counts read this one function, so they say
the same (issue 42)."""

from __future__ import annotations

from typing import Any


def check_stored_run(
    store: Any,
    run_id: str,
    tol: float | None = None,
    rounds: Any = None,
    info: Any = None,
    counted: list[int] | None = None,
) -> Any:
    """The CheckReport of one stored run: what `specscope check` prints and the window's
    findings panel and run picker show (one function, so both say the same): every round
    rule and the run's end record (its stop reason and token count: the [end-count] and
    finish-reason rules). `rounds`: the run's rounds as the caller reads them (default: the
    store's, streamed); `counted[0]` counts the rounds read, when the caller counts them. A
    run the store cannot hand over whole is reported as an internal finding at the round
    it reached."""
    from specscope.core.check.checker import DEFAULT_TOL, CheckReport, check_report, internal_finding

    info = info if info is not None else store.get_run(run_id)
    counted = counted if counted is not None else [0]

    def counting() -> Any:
        for rnd in store.iter_rounds(run_id, full=True):
            counted[0] += 1
            yield rnd

    try:
        return check_report(
            info.config,
            rounds if rounds is not None else counting(),
            tol=DEFAULT_TOL if tol is None else tol,
            end=info.end,
        )
    except Exception as exc:  # noqa: BLE001 - one run the store cannot hand over must not stop the check of the others
        where = f"the store's round {counted[0]}"
        return CheckReport(
            [internal_finding(run_id, counted[0], where, exc)],
            {"internal": f"reading the run stopped at round {counted[0]}: later rounds not checked"},
        )
