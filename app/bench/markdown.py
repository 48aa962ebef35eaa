"""BENCHMARKS.md from a bench's results: the tables, the definitions, the slow settings.

Regenerating keeps two hand-maintained parts of the file verbatim: the block between
SCALE_BEGIN and SCALE_END (written by scripts/measure_scale.py) and everything from
NOTES_MARKER to the end (hand-written analysis).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .metrics import explain

NOTES_MARKER = "<!-- notes: kept when the bench rewrites this file -->"
SCALE_BEGIN = "<!-- scale:begin -->"
SCALE_END = "<!-- scale:end -->"
SCALE_PLACEHOLDER = (
    f"{SCALE_BEGIN}\n## Scale\n\n_Not measured yet: `python scripts/measure_scale.py` writes this "
    f"section; `specscope bench --markdown` keeps it as it is._\n{SCALE_END}"
)


def _f(value: Any, fmt: str = ".2f", suffix: str = "") -> str:
    return "" if value is None else f"{value:{fmt}}{suffix}"


def _interval(r: dict[str, Any], key: str, fmt: str = ".1f", suffix: str = "") -> str:
    if f"{key}_median" not in r:
        return ""
    return f"{r[key + '_median']:{fmt}}{suffix} ({r[key + '_min']:{fmt}}-{r[key + '_max']:{fmt}})"


def _name(r: dict[str, Any]) -> str:
    name = r["method"]
    same = r.get("greedy_identical_to_specscope")
    if same is not None:  # a vLLM row (app/bench/vllm.py), greedy
        diff = r.get("first_difference") or {}
        name += (
            " (greedy = specscope)"
            if same
            else f" (greedy differs from specscope: prompt {diff.get('prompt')}, token {diff.get('token')})"
        )
    if "tracing_overhead_median" in r:
        name += (
            f" (overhead {100 * r['tracing_overhead_median']:+.1f}%, {100 * r['tracing_overhead_min']:+.1f}.."
            f"{100 * r['tracing_overhead_max']:+.1f}%"
        )
        if "tracing_overhead_rounds_median" in r:
            name += (
                f"; rounds alone {100 * r['tracing_overhead_rounds_median']:+.1f}%, writer start + final flush "
                f"{r['tracing_writer_ms_median']:.1f} ms a run"
            )
        name += ")"
    return name


def _table(head: list[str], lines: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(cells) + " |" for cells in lines]
    return "\n".join(out)


def format_table(rows: list[dict[str, Any]]) -> str:
    """The main table: whole runs and the decode part, acceptance, orchestration, prediction."""
    head = [
        "method",
        "tokens/s (median, min-max)",
        "speedup vs plain",
        "decode tokens/s",
        "decode speedup",
        "mean acc. len",
        "acc. rate",
        "orchestration",
        "predicted speedup",
    ]
    return _table(
        head,
        [
            [
                _name(r),
                _interval(r, "tokens_per_s"),
                _interval(r, "speedup", ".2f", "x"),
                _interval(r, "decode_tokens_per_s"),
                _interval(r, "decode_speedup", ".2f", "x"),
                _f(r.get("mean_accepted_length")),
                _f(r.get("acceptance_rate")),
                _f(100 * r["orchestration_share"], ".1f", "%") if "orchestration_share" in r else "",
                _f(r.get("predicted_speedup"), ".2f", "x"),
            ]
            for r in rows
        ],
    )


def kind_table(rows: list[dict[str, Any]], kinds: list[str]) -> str:
    """Speedup and acceptance of every method on each prompt kind."""
    head = ["method"] + [f"{kind}: speedup (decode speedup), mean acc. len" for kind in kinds]
    lines = []
    for r in rows:
        cells = [r["method"]]
        for kind in kinds:
            b = r.get("by_kind", {}).get(kind)
            if not b:
                cells.append("")
                continue
            acc = f", {b['mean_accepted_length']:.2f}" if "mean_accepted_length" in b else ""
            cells.append(f"{b['speedup_median']:.2f}x ({b['decode_speedup_median']:.2f}x){acc}")
        lines.append(cells)
    return _table(head, lines)


def prefill_table(rows: list[dict[str, Any]]) -> str:
    head = ["method", "prefill target ms", "prefill draft ms", "time to first tokens ms", "decode tokens/s"]
    return _table(
        head,
        [
            [
                r["method"],
                _interval(r, "prefill_target_ms", ".2f"),
                _interval(r, "prefill_draft_ms", ".2f"),
                _interval(r, "ttft_ms", ".2f"),
                _interval(r, "decode_tokens_per_s"),
            ]
            for r in rows
        ],
    )


def memory_table(rows: list[dict[str, Any]]) -> str:
    cuda = any("cuda_max_allocated_mb" in r.get("memory", {}) for r in rows)
    head = [
        "method",
        "weights MB",
        "RSS after imports MB",
        "RSS with models MB",
        "peak RSS while decoding MB",
        "decoding added MB",
    ] + (["CUDA max allocated MB"] if cuda else [])
    lines = []
    for r in rows:
        m = r.get("memory")
        if not m:
            continue
        if "error" in m:
            lines.append([r["method"], f"not measured: {m['error']}"] + [""] * (len(head) - 2))
            continue
        cells = [
            r["method"],
            _f(m["weights_mb"], ".1f"),
            _f(m["rss_start_mb"], ".0f"),
            _f(m["rss_loaded_mb"], ".0f"),
            _f(m["peak_rss_mb"], ".0f"),
            _f(m["peak_rss_mb"] - m["rss_loaded_mb"], ".0f"),
        ]
        lines.append(cells + ([_f(m.get("cuda_max_allocated_mb"), ".1f")] if cuda else []))
    return _table(head, lines) if lines else "_Not measured in this run (`--no-memory`)._"


def acceptance_table(rows: list[dict[str, Any]]) -> str:
    head = [
        "method",
        "specscope: mean acc. len / acc. rate",
        "vLLM: mean acceptance length",
        "vLLM: per-position acceptance rate",
        "vLLM: draft acceptance rate",
        "llama.cpp: n_accept / n_drafted = accept",
    ]
    lines = []
    for r in rows:
        if "vllm" not in r:
            continue
        v, lc = r["vllm"], r["llamacpp"]
        unresolved = v["eos_rounds_unresolved"]
        lines.append(
            [
                r["method"] + (f" ({unresolved} EOS rounds unresolved)" if unresolved else ""),
                f"{r['mean_accepted_length']:.2f} / {r['acceptance_rate']:.3f}",
                f"{v['mean_acceptance_length']:.2f}",
                ", ".join(f"{x:.3f}" for x in v["per_position_acceptance_rate"]),
                _f(v["draft_acceptance_rate"], ".3f"),
                f"{lc['n_accept']} / {lc['n_drafted']} = "
                + _f(lc["draft_acceptance_rate"] and 100 * lc["draft_acceptance_rate"], ".1f", "%"),
            ]
        )
    return _table(head, lines)


def slow_settings(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The speculative settings (mode, method, prompt kind) whose median speedup over plain
    decoding is below 1: one entry for a method slow on every kind, else one per slow kind.
    Traced rows are left out (their cost is the recording, not the speculation)."""
    out = []
    for mode, rows in results["modes"].items():
        for r in rows:
            if r["family"] in ("plain", "traced") or r["method"].endswith("traced+stored"):
                continue
            kinds = r.get("by_kind", {})
            slow = [kind for kind, b in kinds.items() if b["speedup_median"] < 1.0]
            if r["speedup_median"] < 1.0 and (not kinds or len(slow) == len(kinds)):
                out.append({"mode": mode, "method": r["method"], "kind": "every kind", **_without_nested(r)})
                continue
            out += [
                {"mode": mode, "method": r["method"], "kind": kind, **_without_nested(kinds[kind])} for kind in slow
            ]
    return out


def _without_nested(stats: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in stats.items() if k not in ("by_kind", "raw", "memory")}


def slow_table(results: dict[str, Any]) -> str:
    slow = slow_settings(results)
    if not slow:
        return "_Every measured setting was at least as fast as plain decoding in this run._"
    head = ["temperature", "method", "prompts", "measured speedup", "predicted", "E", "n", "c", "v", "alpha", "why"]
    return _table(
        head,
        [
            [
                "0 (greedy)" if s["mode"] == "greedy" else "1 (sampled)",
                s["method"],
                s["kind"],
                _interval(s, "speedup", ".2f", "x"),
                _f(s.get("predicted_speedup"), ".2f", "x"),
                _f(s.get("expected_tokens_per_round")),
                _f(s.get("mean_drafted_per_round")),
                _f(s.get("cost_c"), ".3f"),
                _f(s.get("cost_v")),
                _f(s.get("alpha")),
                explain(s),
            ]
            for s in slow
        ],
    )


DEFINITIONS = """\
**Batch size 1.** Every method decodes one sequence at a time: specscope's decoder and
transformers' assisted generation (and prompt lookup) are batch-1 algorithms, and so is the
plain baseline. Nothing here says how speculation behaves in a batched server, where the
target's verify forward is no longer almost free.

**Prefill and decode.** *Prefill* is one forward of the prompt through a model with an empty
KV cache (the target, and the draft for methods that run one), timed in the method's own
slot of every repetition, after its run, as llama.cpp's speculative example encodes the
prompt in both models before decoding. Inside a method the prompt's forward is fused with
its first step or round, so the method's own *time to first tokens* (prefill + first step
or round) is shown too. *Decode tokens/s* leaves out each run's first emission: (tokens -
first emission's tokens) / (wall - time to first tokens), summed over the prompts, so no
prompt forward is in it. Prompt lengths are in the table of prompts.

**Memory.** Per method and temperature (`--quick`: the first temperature only), a child process (forked from a \
server that has only
imported torch and transformers) loads just the models the method runs, the kernel's
high-water mark is reset (`/proc/self/clear_refs`), the method decodes every prompt once,
and VmHWM is read: *peak RSS while decoding*. *Weights* are the parameters' bytes (float32
in memory). Loading also imports the model classes' modules and leaves allocator slack, so
*RSS with models* - *RSS after imports* is more than the weights; *decoding added* = the
peak - the RSS with models: KV caches, activations, the decoder's records. On CUDA,
`torch.cuda.max_memory_allocated` (weights + caches + activations) is reported beside it. The JSON keeps each child's
spec; `python -m specscope.app.bench.memory SPEC.json` repeats one in a fresh interpreter.

**Acceptance under other projects' names**, computed from the raw per-round counts in the
JSON (`rounds.drafted`, `rounds.accepted`, ...):

- specscope: *mean accepted length* = mean over all rounds of (accepted drafts + 1), rounds
  that drafted nothing (prompt lookup without a match) included as 1; *acceptance rate* =
  accepted drafts / drafted tokens.
- vLLM (`vllm/v1/spec_decode/metrics.py`): only steps with a non-empty draft count as
  drafts; *mean acceptance length* = 1 + accepted / drafts, the 1 being the target's own
  token (bonus or recovered), counted in every draft; *per-position acceptance rate* [i] =
  drafts with more than i accepted tokens / drafts (not conditional on reaching position
  i); *draft acceptance rate* = accepted / drafted tokens.
- llama.cpp (`examples/speculative`): *accept* = n_accept / n_drafted, n_accept counting
  accepted drafts only (the target's own token is not counted), n_drafted every drafted
  token.
- EOS inside the accepted prefix: vLLM counts acceptance before its stop check and
  llama.cpp breaks at EOS after counting, so both count the drafts after an accepted EOS
  that the target also agrees with; specscope stops at the EOS and counts only up to it.
  In greedy mode the target's argmax is recorded at every drafted position, so those drafts
  are counted for vLLM and llama.cpp; in sampled mode they were never tested, and such
  rounds are flagged as unresolved (counted up to the EOS).

**Cost model.** E / (n c + v) in units of one plain target step, from the same run: E =
expected tokens per round (= mean accepted length), n = mean drafted tokens per round, c =
the proposer's cost per drafted token, v = a verify forward / a plain step, alpha = mean
sum min(p, q) over the tested draft positions (greedy: the fraction of tested positions
accepted). Speculation pays when E > n c + v.

**The JSON** (`--json`, schema `specscope-bench/2`): `prompts` (name, kind, tokens);
`modes.greedy|sampled`: one row per method with the medians and min-max above, `by_kind`
(the same per prompt kind), `vllm` and `llamacpp`, `memory` (with the child's `spec`), and
`raw[repetition][prompt]`: `wall_s`, `ttft_s`, `prefill_target_s`, `prefill_draft_s`,
`token_latencies_s` (per token: its emission's interval / the tokens it brought),
`emissions` ([seconds since the call began, tokens]) and `rounds` (per round: `drafted`,
`accepted`, `accepted_length`, `visited`, `emitted`, `eos_accepted`, `after_eos`), from
which every number above can be recomputed."""


def scale_block(old: str) -> str | None:
    """The scale section of an earlier file, markers included, or None."""
    start = old.find(SCALE_BEGIN)
    end = old.find(SCALE_END, start)
    if start < 0 or end < 0:
        return None
    return old[start : end + len(SCALE_END)]


def generated_text(results: dict[str, Any]) -> list[str]:  # long: the file's fixed outline, one section after another
    m, s = results["machine"], results["settings"]
    kinds = list(dict.fromkeys(p["kind"] for p in results.get("prompts", [])))
    lines = [
        "# Benchmarks",
        "",
        f"Command: `{results['command']}` (regenerates this file; `--from-json FILE` rewrites it from saved results).",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch threads {m['torch_threads']}, device {m['device']}"
        + (f" ({m['gpu']})" if "gpu" in m else "")
        + (f", few-row linear kernel {m['few_rows_kernel']}" if "few_rows_kernel" in m else "")
        + f"; Python {m['python']}, torch {m['torch']}, transformers {m['transformers']}.",
        "",
        f"Settings: k in {s['ks']}, {s['max_new']} new tokens per prompt, {s['reps']} interleaved repetitions after a "
        f"warm-up, batch size {s.get('batch_size', 1)}. Intervals are min-max over the repetitions.",
        "",
        DEFINITIONS,
        "",
        "## Prompts",
        "",
        _table(
            ["prompt", "kind", "prompt tokens", "what"],
            [[p["name"], p["kind"], str(p["tokens"]), p.get("description", "")] for p in results.get("prompts", [])],
        ),
        "",
    ]
    for mode, rows in results["modes"].items():
        lines += [
            f"## {mode}",
            "",
            format_table(rows),
            "",
            f"### {mode}: per prompt kind",
            "",
            kind_table(rows, kinds),
            "",
            f"### {mode}: prefill and decode",
            "",
            prefill_table(rows),
            "",
            f"### {mode}: memory",
            "",
            memory_table(rows),
            "",
            f"### {mode}: acceptance under vLLM's and llama.cpp's definitions",
            "",
            acceptance_table(rows),
            "",
        ]
    lines += [
        "## When speculation does not pay",
        "",
        "Settings measured slower than plain decoding on this machine (median of the paired repetitions "
        "below 1), over all prompts and per prompt kind, with the cost model's terms from the same runs.",
        "",
        slow_table(results),
        "",
    ]
    return lines


def is_bench_markdown(path: Path) -> bool:
    """A file this bench wrote (its title, or a section it keeps), which --markdown updates."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read(1 << 20)
    except OSError:
        return False
    return text.startswith("# Benchmarks\n") or NOTES_MARKER in text or SCALE_BEGIN in text


def write_markdown(path: Path, results: dict[str, Any]) -> None:
    """Write the generated sections; keep the scale block and the notes of an existing file."""
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    notes = old[old.index(NOTES_MARKER) :] if NOTES_MARKER in old else ""
    head = old[: old.index(NOTES_MARKER)] if NOTES_MARKER in old else old
    scale = scale_block(head)
    lines = generated_text(results)
    if scale is not None or scale_block(notes) is None:  # a scale block inside the notes stays there, once
        lines += [scale if scale is not None else SCALE_PLACEHOLDER, ""]
    path.write_text("\n".join(lines) + ("\n" + notes if notes else ""), encoding="utf-8")
