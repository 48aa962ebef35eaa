"""Pure numbers for `specscope bench`: per-round counts, acceptance metrics under specscope's,
vLLM's and llama.cpp's definitions, the latency split (time to first tokens, decode rate),
and the cost-model explanation. No torch, no models: the tests compute these by hand.

Definitions (the projects' own code, read for this module):

- specscope (DESIGN.md): accepted length of a round = accepted drafts + 1 (the repair or the
  bonus), averaged over every round, rounds that drafted nothing included (as 1);
  acceptance rate = accepted drafts / drafted tokens.
- vLLM (vllm/v1/spec_decode/metrics.py, scheduler update_from_output): a "draft" is a step
  whose scheduled draft is non-empty; num_accepted = sampled tokens - 1, counted before the
  stop check trims the output at EOS. Mean acceptance length = 1 + accepted / drafts ("by
  convention including the bonus token"); per-position acceptance rate[i] = drafts with more
  than i accepted tokens / drafts (not conditional on reaching position i); draft acceptance
  rate = accepted / drafted tokens.
- llama.cpp (examples/speculative, speculative-simple): n_drafted adds every drafted token,
  n_accept adds the accepted drafts (ids.size() - 1: the target's own token is not counted);
  the loop breaks at EOS only after counting, so drafts after an accepted EOS that the
  target also agrees with count. accept = n_accept / n_drafted.

specscope's verifier stops at an accepted EOS, so the drafts after it are never tested.
In greedy mode the round still holds the target's argmax at every drafted position (one
forward scores them all), so the drafts vLLM and llama.cpp would also have accepted after
the EOS are known and counted for them; in sampled mode they are not (no draw was made),
and the number of such rounds is reported as `eos_rounds_unresolved`.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class RoundCounts:
    """What the metrics need of one round (a chain draft)."""

    drafted: int
    accepted: int  # accepted draft tokens (up to and including an accepted EOS)
    visited: int  # draft positions tested: accepted + 1 when a rejection ended the round
    emitted: int
    eos_accepted: bool = False  # an accepted draft token was EOS (the round ended there)
    after_eos: int | None = 0  # further drafts the target agreed with after that EOS; None = unknown
    overlap_sum: float | None = None  # sum over visited nodes of sum_x min(p, q); None in greedy mode
    draft_s: float = 0.0  # the round's propose call

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def counts_of(rnd: Any, eos: int | None) -> RoundCounts:
    """RoundCounts of a core Round record (the full vectors are not kept)."""
    nodes = rnd.nodes
    statuses = [n.status for n in nodes]
    accepted = statuses.count("accepted")
    visited = accepted + statuses.count("rejected")
    eos_at = next(
        (i for i, n in enumerate(nodes) if n.status == "accepted" and eos is not None and n.token == eos), None
    )
    after: int | None = 0
    if eos_at is not None and eos_at + 1 < len(nodes):
        after = None
        if rnd.greedy:  # the target's argmax was scored at every position: count on as vLLM would
            after = 0
            for n in nodes[eos_at + 1 :]:
                if n.token != n.target_argmax:
                    break
                after += 1
    overlaps = [n.overlap for n in nodes if n.status != "unvisited" and n.overlap is not None]
    return RoundCounts(
        drafted=len(nodes),
        accepted=accepted,
        visited=visited,
        emitted=len(rnd.emitted),
        eos_accepted=eos_at is not None,
        after_eos=after,
        overlap_sum=float(sum(overlaps)) if overlaps else None,
        draft_s=float(rnd.timings.draft_s),
    )


def specscope_acceptance(rounds: Sequence[RoundCounts], k: int) -> dict[str, Any]:
    """specscope's own columns: mean accepted length over all rounds, acceptance rate, and
    per position the conditional rate (accepted / reached) and the survival (accepted / rounds)."""
    if not rounds:
        raise ValueError("no rounds to measure")
    drafted = sum(r.drafted for r in rounds)
    accepted = sum(r.accepted for r in rounds)
    reached = [sum(1 for r in rounds if r.visited > i) for i in range(k)]
    passed = [sum(1 for r in rounds if r.accepted > i) for i in range(k)]
    return {
        "rounds": len(rounds),
        "drafted": drafted,
        "accepted": accepted,
        "mean_accepted_length": sum(r.accepted + 1 for r in rounds) / len(rounds),
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "acceptance_by_position": [passed[i] / reached[i] if reached[i] else 0.0 for i in range(k)],
        "survival_by_position": [passed[i] / len(rounds) for i in range(k)],
    }


def _accepted_as_counted_elsewhere(r: RoundCounts) -> int:
    """Accepted drafts as vLLM and llama.cpp count them: on past an accepted EOS."""
    return r.accepted + (r.after_eos or 0)


def vllm_acceptance(rounds: Sequence[RoundCounts], k: int) -> dict[str, Any]:
    """vLLM's SpecDecodingLogging numbers from per-round counts (see the module docstring)."""
    drafts = [r for r in rounds if r.drafted > 0]
    n = len(drafts)
    accepted = [_accepted_as_counted_elsewhere(r) for r in drafts]
    drafted = sum(r.drafted for r in drafts)
    return {
        "num_drafts": n,
        "num_draft_tokens": drafted,
        "num_accepted_tokens": sum(accepted),
        "mean_acceptance_length": 1 + sum(accepted) / n if n else 1.0,
        "per_position_acceptance_rate": [sum(1 for a in accepted if a > i) / n if n else 0.0 for i in range(k)],
        "draft_acceptance_rate": sum(accepted) / drafted if drafted else None,
        "eos_rounds_unresolved": sum(1 for r in drafts if r.after_eos is None),
    }


def llamacpp_acceptance(rounds: Sequence[RoundCounts]) -> dict[str, Any]:
    """llama.cpp's speculative example: n_drafted, n_accept and accept = n_accept / n_drafted."""
    n_drafted = sum(r.drafted for r in rounds)
    n_accept = sum(_accepted_as_counted_elsewhere(r) for r in rounds)
    return {
        "n_drafted": n_drafted,
        "n_accept": n_accept,
        "draft_acceptance_rate": n_accept / n_drafted if n_drafted else None,
        "eos_rounds_unresolved": sum(1 for r in rounds if r.drafted and r.after_eos is None),
    }


def alpha_of(rounds: Sequence[RoundCounts]) -> float | None:
    """The cost model's alpha over the visited draft positions: mean sum_x min(p, q) where q
    was recorded (sampled), else the fraction of visited positions accepted (greedy, where
    the proposal is a point mass and acceptance is that position's min(p, q) in {0, 1})."""
    visited = sum(r.visited for r in rounds)
    if not visited:
        return None
    if all(r.overlap_sum is not None for r in rounds if r.visited):
        return sum(r.overlap_sum or 0.0 for r in rounds) / visited
    return sum(r.accepted for r in rounds) / visited


# --------------------------------------------------------------------------- latency


def token_latencies(emissions: Sequence[tuple[float, int]]) -> list[float]:
    """Per emitted token, the time since the previous emission divided by the tokens that
    emission brought (a round's tokens arrive together). `emissions` = (seconds since the
    call started, tokens) in order."""
    out: list[float] = []
    last = 0.0
    for t, n in emissions:
        if n > 0:
            out.extend([(t - last) / n] * n)
        last = t
    return out


def first_emission(emissions: Sequence[tuple[float, int]]) -> tuple[float, int]:
    """(time to the first emitted tokens, how many tokens came with it)."""
    for t, n in emissions:
        if n > 0:
            return t, n
    return 0.0, 0


def decode_split(wall_s: float, tokens: int, emissions: Sequence[tuple[float, int]]) -> tuple[float, int, float]:
    """(time to first tokens, decode tokens, decode seconds): the decode part is everything
    after the first emission, so the prompt's forward (inside the first step or round) is
    not in it."""
    ttft, first = first_emission(emissions)
    return ttft, tokens - first, max(wall_s - ttft, 0.0)


def summary(values: Sequence[float]) -> dict[str, float]:
    """Median with the min-max interval of the repetitions."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


# --------------------------------------------------------------------------- cost model


def explain(row: dict[str, Any]) -> str:
    """Why a measured row is slower than plain decoding, in the cost model's terms."""
    e, n, c, v = (row.get(key) for key in ("expected_tokens_per_round", "mean_drafted_per_round", "cost_c", "cost_v"))
    if None in (e, n, c, v):
        return (
            "transformers' generate() is timed as a whole (no forward timings inside it): c and v are not "
            "measured; the specscope row with the same proposer and k has them"
        )
    cost = n * c + v
    if e < cost:
        return (
            f"a round yields E = {e:.2f} tokens but costs n c + v = {n:.2f} x {c:.3f} + {v:.2f} = {cost:.2f} "
            "plain steps"
        )
    return (
        f"the model predicts {e / cost:.2f}x (E = {e:.2f} > n c + v = {cost:.2f}); the rest is orchestration "
        f"({100 * row.get('orchestration_share', 0.0):.0f}% of wall time) and per-round costs it leaves out"
    )
