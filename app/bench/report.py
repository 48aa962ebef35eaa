"""A bench's samples turned into rows: overall, per prompt kind, and the raw numbers.

Per repetition, a method's wall time is its sum over the prompts (of one kind, or all);
speedups are ratios of paired repetitions (same repetition, same machine state), reported as
median and min-max. Decode rates leave out each run's first emission (the prefill lives
there): (tokens - first tokens) / (wall - time to first tokens), summed over the prompts.

The cost-model prediction uses only the same run's measured quantities, in units of one
plain target decoding step (the plain method's mean target forward on the same prompts):

    predicted speedup = E / (n c + v)

    E  expected tokens per round = 1 + sum_i S_i, S_i the fraction of all rounds whose first
       i proposals were accepted (= the mean accepted length). Rounds that drafted fewer
       than i tokens, e.g. prompt lookup finding no match, count as not surviving position i.
    n  mean drafted tokens per round (no-match rounds of prompt lookup included as 0).
    c  the proposer's cost per drafted token: draft-model forward time for a proposer that
       runs a model; for one that does not (prompt lookup) its whole propose call.
    v  target verify forward / plain target step.
"""

from __future__ import annotations

import statistics
from typing import Any

from specscope.core.cost import expected_tokens_from_rounds, round_speedup

from .metrics import (
    RoundCounts,
    alpha_of,
    decode_split,
    llamacpp_acceptance,
    specscope_acceptance,
    summary,
    token_latencies,
    vllm_acceptance,
)


def _per_rep(samples: list[list[Any]], idx: list[int], fn) -> list[float]:
    return [fn([rep[i] for i in idx]) for rep in samples]


def _put(row: dict[str, Any], name: str, values: list[float]) -> None:
    s = summary(values)
    row.update({f"{name}_median": s["median"], f"{name}_min": s["min"], f"{name}_max": s["max"]})


def _decode_rate(samples: list[Any]) -> float:
    parts = [decode_split(s.wall_s, len(s.tokens), s.emissions) for s in samples]
    seconds = sum(p[2] for p in parts)
    return sum(p[1] for p in parts) / seconds if seconds > 0 else 0.0


def _mean_ms(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return 1000 * sum(vals) / len(vals) if vals else None


def timing_stats(m: Any, plain: Any, idx: list[int], prompt_tokens: list[int]) -> dict[str, Any]:
    """Wall, tokens/s, decode tokens/s, time to first tokens, prefill, speedups, for the prompts `idx`."""
    row: dict[str, Any] = {"prompts": len(idx), "prompt_tokens": [prompt_tokens[i] for i in idx]}
    walls = _per_rep(m.samples, idx, lambda ss: sum(s.wall_s for s in ss))
    tokens = _per_rep(m.samples, idx, lambda ss: sum(len(s.tokens) for s in ss))
    plain_walls = _per_rep(plain.samples, idx, lambda ss: sum(s.wall_s for s in ss))
    decode = _per_rep(m.samples, idx, _decode_rate)
    plain_decode = _per_rep(plain.samples, idx, _decode_rate)
    row["tokens"] = int(tokens[0]) if tokens else 0
    row["wall_s_median"] = statistics.median(walls)
    _put(row, "tokens_per_s", [t / w for t, w in zip(tokens, walls)])
    _put(row, "speedup", [p / w for p, w in zip(plain_walls, walls)])
    _put(row, "decode_tokens_per_s", decode)
    _put(row, "decode_speedup", [d / p if p else 0.0 for d, p in zip(decode, plain_decode)])
    _put(
        row,
        "ttft_ms",
        _per_rep(
            m.samples,
            idx,
            lambda ss: _mean_ms([decode_split(s.wall_s, len(s.tokens), s.emissions)[0] for s in ss]) or 0.0,
        ),
    )
    _put(
        row, "prefill_target_ms", _per_rep(m.samples, idx, lambda ss: _mean_ms([s.prefill_target_s for s in ss]) or 0.0)
    )
    if m.draft is not None:
        _put(
            row,
            "prefill_draft_ms",
            _per_rep(m.samples, idx, lambda ss: _mean_ms([s.prefill_draft_s for s in ss]) or 0.0),
        )
    return row


def shares(samples: list[Any]) -> dict[str, float]:
    wall = sum(s.wall_s for s in samples)
    tf = sum(s.target_forward_s for s in samples)
    df = sum(s.draft_forward_s for s in samples)
    return {
        "target_forward_share": tf / wall,
        "draft_forward_share": df / wall,
        "orchestration_share": max(0.0, 1 - (tf + df) / wall),
    }


def acceptance(rounds: list[RoundCounts], k: int) -> dict[str, Any]:
    """specscope's own columns at the top level, and the other projects' under their names."""
    out = specscope_acceptance(rounds, k)
    out["alpha"] = alpha_of(rounds)
    out["vllm"] = vllm_acceptance(rounds, k)
    out["llamacpp"] = llamacpp_acceptance(rounds)
    return out


def cost_stats(rounds: list[RoundCounts], samples: list[Any], plain_tok: float) -> dict[str, Any]:
    """c, v, E, n and the predicted speedup (module docstring)."""
    drafted = sum(r.drafted for r in rounds)
    t_fwd = sum(s.target_forward_s for s in samples) / max(1, sum(s.target_forwards for s in samples))
    if sum(s.draft_forwards for s in samples):  # a draft model: its forwards are the proposal cost
        proposer_s = sum(s.draft_forward_s for s in samples)
    else:  # no model (prompt lookup): the whole propose call is the proposal cost
        proposer_s = sum(r.draft_s for r in rounds)
    expected = expected_tokens_from_rounds([r.accepted for r in rounds])
    mean_drafted = drafted / len(rounds)
    c = (proposer_s / drafted) / plain_tok if drafted else 0.0
    v = t_fwd / plain_tok
    per_round = proposer_s / len(rounds) / plain_tok  # = n c (also when n = 0)
    return {
        "mean_drafted_per_round": mean_drafted,
        "cost_c": c,
        "cost_v": v,
        "proposer_cost_per_round": per_round,
        "expected_tokens_per_round": expected,
        "predicted_speedup": expected / (per_round + v) if not drafted else round_speedup(expected, mean_drafted, c, v),
    }


def method_stats(m: Any, plain: Any, idx: list[int], prompt_tokens: list[int], twin: Any = None) -> dict[str, Any]:
    row = timing_stats(m, plain, idx, prompt_tokens)
    samples = [rep[i] for rep in m.samples for i in idx]
    has_timings = sum(s.target_forwards for s in samples) > 0
    if has_timings:
        row.update(shares(samples))
    rounds = [r for s in samples for r in s.rounds]
    if rounds:
        # k auto: as long as the longest round drafted (each round's own length is in its counts)
        row.update(acceptance(rounds, m.k if isinstance(m.k, int) else max(1, max(r.drafted for r in rounds))))
        plain_samples = [rep[i] for rep in plain.samples for i in idx]
        plain_tok = sum(s.target_forward_s for s in plain_samples) / max(
            1, sum(s.target_forwards for s in plain_samples)
        )
        if has_timings and plain_tok > 0:
            row.update(cost_stats(rounds, samples, plain_tok))
    if twin is not None:
        walls = _per_rep(m.samples, idx, lambda ss: sum(s.wall_s for s in ss))
        base = _per_rep(twin.samples, idx, lambda ss: sum(s.wall_s for s in ss))
        _put(row, "tracing_overhead", [w / b - 1 for w, b in zip(walls, base)])
        # the same without the writer's start and final flush (a fixed cost per run, two
        # commits, that a 24-token --quick run weighs as much as its rounds): what recording
        # costs per round (issue 41)
        fixed = _per_rep(m.samples, idx, lambda ss: sum(s.writer_s or 0.0 for s in ss))
        if any(fixed):
            _put(row, "tracing_overhead_rounds", [(w - f) / b - 1 for w, f, b in zip(walls, fixed, base)])
            _put(row, "tracing_writer_ms", [1e3 * f / len(idx) for f in fixed])
    return row


def _r(x: float) -> float:
    return round(x, 7)


def raw_samples(m: Any, kinds: list[str]) -> list[list[dict[str, Any]]]:
    """Every repetition's every run: per-token latencies, emissions and per-round counts."""
    out = []
    for rep in m.samples:
        runs = []
        for i, s in enumerate(rep):
            ttft, decode_tokens, decode_s = decode_split(s.wall_s, len(s.tokens), s.emissions)
            run: dict[str, Any] = {
                "prompt": i,
                "kind": kinds[i],
                "tokens": len(s.tokens),
                "wall_s": _r(s.wall_s),
                "ttft_s": _r(ttft),
                "decode_tokens": decode_tokens,
                "decode_s": _r(decode_s),
                "prefill_target_s": None if s.prefill_target_s is None else _r(s.prefill_target_s),
                "prefill_draft_s": None if s.prefill_draft_s is None else _r(s.prefill_draft_s),
                "token_latencies_s": [_r(x) for x in token_latencies(s.emissions)],
                "emissions": [[_r(t), n] for t, n in s.emissions],
            }
            if s.rounds:
                run["rounds"] = {
                    key: [getattr(r, key) for r in s.rounds]
                    for key in ("drafted", "accepted", "visited", "emitted", "eos_accepted", "after_eos")
                }
                run["rounds"]["accepted_length"] = [r.accepted + 1 for r in s.rounds]
            runs.append(run)
        out.append(runs)
    return out


def bench_rows(bench: Any) -> list[dict[str, Any]]:
    """One row per method: overall stats, `by_kind` stats and `raw` samples."""
    plain = bench.methods[0]
    by_name = {m.name: m for m in bench.methods}
    prompt_tokens = [len(p) for p in bench.prompts]
    every = list(range(len(bench.prompts)))
    kinds = list(dict.fromkeys(bench.kinds))
    rows = []
    for m in bench.methods:
        twin = by_name.get(m.untraced) if m.untraced else None
        row: dict[str, Any] = {"method": m.name, "family": m.family, "k": m.k, "draft": m.draft}
        row.update(method_stats(m, plain, every, prompt_tokens, twin))
        row["by_kind"] = {
            kind: method_stats(m, plain, [i for i in every if bench.kinds[i] == kind], prompt_tokens, twin)
            for kind in kinds
        }
        row["raw"] = raw_samples(m, bench.kinds)
        rows.append(row)
    return rows
