"""`specscope bench`: the decoder against plain decoding and transformers' own assisted
generation, and the cost of tracing.

Method: one warm-up pass of every method over every prompt, then `reps` repetitions in
which the methods run interleaved (the order rotates each repetition), so slow drifts of
the machine hit every method alike. Each repetition's wall time of a method is its sum
over the prompts; speedups are ratios of paired repetitions (same repetition, same
machine state), reported as median and min-max. In greedy mode every method's output
must equal plain greedy decoding token for token, or the bench fails.

Wall time is split into draft-model forwards, target forwards and orchestration
(everything that is not a model forward: sampling, verification, cache crops, Python).

The cost-model prediction uses only the same run's measured quantities, in units of one
plain target decoding step (the plain method's mean target forward):

    predicted speedup = E / (n c + v)

    E  expected tokens per round = 1 + sum_i S_i, S_i the fraction of all rounds whose first
       i proposals were accepted (= the mean accepted length). Rounds that drafted fewer
       than i tokens, e.g. prompt lookup finding no match and drafting nothing, count as
       not surviving position i, so they are not left out of E.
    n  mean drafted tokens per round (k for a draft model, less at the budget's end; for
       prompt lookup the measured mean, no-match rounds included as 0).
    c  the proposer's cost per drafted token: draft-model forward time for a proposer
       that runs a model; for one that does not (prompt lookup) its whole propose call
       (the n-gram search and building q), from the rounds' draft timings. n c is thus
       the proposer's measured cost per round, also in rounds that drafted nothing.
    v  target verify forward / plain target step.

The remaining gap between predicted and measured speedup is orchestration (sampling,
verification, crops, records) and the per-round cost a zero-length draft still pays.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from specscope.core import SamplingConfig, SpeculativeDecoder
from specscope.core.baseline import plain_generate
from specscope.core.cost import expected_tokens_from_rounds, round_speedup
from specscope.core.records import Round
from specscope.core.registry import KINDS, SpecError, build_proposer, parse_spec


class BenchError(Exception):
    """The bench cannot vouch for its numbers (e.g. a greedy output mismatch)."""


@dataclass
class Sample:
    tokens: list[int]
    wall_s: float
    target_forward_s: float = 0.0
    target_forwards: int = 0
    draft_forward_s: float = 0.0
    draft_forwards: int = 0
    rounds: list[Round] = field(default_factory=list)


@dataclass
class Method:
    name: str
    family: str  # plain | specscope | transformers | traced
    k: int | None
    run: Callable[[list[int]], Sample]
    untraced: str | None = None  # for a traced method: the name of the same method untraced
    samples: list[list[Sample]] = field(default_factory=list)  # [rep][prompt]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(device: torch.device, fn: Callable[[], Any]) -> tuple[Any, float]:
    _sync(device)
    start = time.perf_counter()
    out = fn()
    _sync(device)
    return out, time.perf_counter() - start


def default_specs(drafts: Sequence[str], extra: Sequence[str] | None = None) -> list[str]:
    """The proposer specs a bench runs: every kind with a model over each named draft
    (draft:NAME), then `extra`, or else every registered kind without a model at its defaults."""
    with_model = [f"{kind.name}:{name}" for kind in KINDS.values() if kind.needs_model for name in drafts]
    return with_model + list(extra if extra is not None else [k.name for k in KINDS.values() if not k.needs_model])


def method_name(spec: str) -> str:
    """A spec's name in the bench tables: "draft-small" for draft:small, else the spec."""
    parsed = parse_spec(spec)
    return f"{parsed.kind}-{parsed.arg}" if KINDS[parsed.kind].needs_model else str(parsed)


class Bench:
    def __init__(self, target, drafts: dict[str, torch.nn.Module], prompts: Sequence[list[int]], *,
                 ks: Sequence[int], max_new: int, reps: int, sampling: SamplingConfig, eos: int | None,
                 device: torch.device, include_transformers: bool = True, include_traced: bool = True,
                 seed: int = 0, progress: Callable[[str], None] | None = None, specs: Sequence[str] | None = None):
        """`drafts` are the models that specs such as draft:NAME load by NAME; `specs` the
        proposers to run (default: default_specs(drafts))."""
        self.target, self.drafts, self.prompts = target, drafts, [list(p) for p in prompts]
        self.ks, self.max_new, self.reps = list(ks), max_new, reps
        self.sampling, self.eos, self.device, self.seed = sampling, eos, device, seed
        self.progress = progress or (lambda msg: None)
        self.specs = list(specs) if specs is not None else default_specs(list(drafts))
        self.methods: list[Method] = [Method("plain (KV cache)", "plain", None, self._plain)]
        for k in self.ks:
            for spec in self.specs:
                self.methods.append(Method(f"specscope {method_name(spec)} k={k}", "specscope", k, self._spec(spec, k)))
            if include_transformers:
                first = next(iter(drafts.items()), None)
                if first is not None:
                    self.methods.append(Method(f"transformers assisted draft-{first[0]} k={k}", "transformers", k, self._hf_assisted(first[1], k)))
                if sampling.greedy:
                    self.methods.append(Method(f"transformers lookup k={k}", "transformers", k, self._hf_lookup(k)))
        if include_traced and drafts:
            label = next(iter(drafts))
            k = self.ks[len(self.ks) // 2]
            twin = f"specscope draft-{label} k={k}"
            self.methods.append(Method(f"{twin} traced+stored", "traced", k,
                                       self._traced(f"draft:{label}", k), untraced=twin))
            if include_transformers:  # transformers' own generate(), recorded by the transformers engine
                twin = f"transformers assisted draft-{label} k={k}"
                self.methods.append(Method(f"{twin} traced+stored", "transformers", k,
                                           self._hf_traced(drafts[label], label, k), untraced=twin))

    # ------------------------------------------------------------------ runners

    def _plain(self, prompt: list[int]) -> Sample:
        res, wall = _timed(self.device, lambda: plain_generate(self.target, prompt, self.max_new, self.sampling, self.eos, self.seed))
        return Sample(res.new_tokens, wall, res.forward_s, res.forwards)

    def _load_draft(self, name: str) -> tuple[torch.nn.Module, str]:
        if name not in self.drafts:
            raise SpecError(f"the bench has no draft named {name!r} (drafts: {', '.join(self.drafts)})")
        return self.drafts[name], name

    def _decoder(self, spec: str, k: int) -> SpeculativeDecoder:
        proposer = build_proposer(spec, load_draft=self._load_draft)
        return SpeculativeDecoder(self.target, proposer, k=k, sampling=self.sampling, eos_token_id=self.eos, seed=self.seed)

    def _sample_from(self, dec: SpeculativeDecoder, result, wall: float) -> Sample:
        draft_lm = getattr(dec.proposer, "lm", None)
        return Sample(
            result.new_tokens, wall,
            dec.target_lm.forward_s, dec.target_lm.forwards,
            draft_lm.forward_s if draft_lm else 0.0, draft_lm.forwards if draft_lm else 0,
            list(result.rounds),
        )

    def _spec(self, spec: str, k: int) -> Callable[[list[int]], Sample]:
        dec = self._decoder(spec, k)

        def run(prompt: list[int]) -> Sample:
            result, wall = _timed(self.device, lambda: dec.generate(prompt, self.max_new))
            return self._sample_from(dec, result, wall)

        return run

    def _traced(self, spec: str, k: int) -> Callable[[list[int]], Sample]:
        return self._recorded(self._decoder(spec, k), self._sample_from)

    def _hf_traced(self, draft, label: str, k: int) -> Callable[[list[int]], Sample]:
        """transformers' assisted generate() recorded round by round into a store (the
        transformers engine, core/engines), beside the same call untraced."""
        from specscope.core.engines import TransformersEngine

        engine = TransformersEngine(self.target, kind="assisted", draft=draft, k=k, sampling=self.sampling,
                                    eos_token_id=self.eos, seed=self.seed, draft_name=label)
        return self._recorded(engine, lambda _engine, result, wall: Sample(result.new_tokens, wall))

    def _recorded(self, dec: Any, sample: Callable[[Any, Any, float], Sample]) -> Callable[[list[int]], Sample]:
        """Runs of `dec` (a decoder or an engine) written to a trace store as they decode."""
        from specscope.storage import TraceStore, TraceWriter

        if getattr(self, "_tmp", None) is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="specscope-bench-")
        store = TraceStore(Path(self._tmp.name) / "bench.sqlite")

        def record(prompt: list[int]):
            config = dec.run_config(prompt, self.max_new)
            with TraceWriter(store, config) as writer:
                return writer.record(dec.start(prompt, self.max_new, config=config))

        def run(prompt: list[int]) -> Sample:
            result, wall = _timed(self.device, lambda: record(prompt))
            return sample(dec, result, wall)

        return run

    def _hf_kwargs(self, prompt: list[int]) -> dict[str, Any]:
        ids = torch.tensor([prompt], device=self.device)
        kwargs: dict[str, Any] = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=self.max_new,
                                      eos_token_id=self.eos, pad_token_id=self.eos if self.eos is not None else 0)
        if self.sampling.greedy:
            kwargs["do_sample"] = False
        else:
            kwargs.update(do_sample=True, temperature=self.sampling.temperature, top_k=self.sampling.top_k or None,
                          top_p=self.sampling.top_p)
        return kwargs

    def _hf_generate(self, prompt: list[int], **extra: Any) -> Sample:
        kwargs = self._hf_kwargs(prompt)
        with torch.inference_mode():
            out, wall = _timed(self.device, lambda: self.target.generate(**kwargs, **extra))
        return Sample(out[0, len(prompt):].tolist(), wall)

    def _hf_assisted(self, draft, k: int) -> Callable[[list[int]], Sample]:
        def run(prompt: list[int]) -> Sample:
            cfg = draft.generation_config
            cfg.num_assistant_tokens, cfg.num_assistant_tokens_schedule, cfg.assistant_confidence_threshold = k, "constant", 0.0
            return self._hf_generate(prompt, assistant_model=draft)

        return run

    def _hf_lookup(self, k: int) -> Callable[[list[int]], Sample]:
        return lambda prompt: self._hf_generate(prompt, prompt_lookup_num_tokens=k)

    # ------------------------------------------------------------------ driving

    def run(self) -> None:
        torch.manual_seed(self.seed)
        self.progress(f"warm-up: {len(self.methods)} methods x {len(self.prompts)} prompts")
        for m in self.methods:
            for p in self.prompts:
                m.run(p)
        for rep in range(self.reps):
            shift = rep % len(self.methods)
            order = self.methods[shift:] + self.methods[:shift]
            for m in order:
                m.samples.append([m.run(p) for p in self.prompts])
            self.progress(f"repetition {rep + 1}/{self.reps} done")
        if self.sampling.greedy:
            self._check_identical()

    def _check_identical(self) -> None:
        reference = self.methods[0].samples[0]
        for m in self.methods[1:]:
            for rep in m.samples:
                for i, (ref, got) in enumerate(zip(reference, rep)):
                    if got.tokens != ref.tokens:
                        first = next((j for j, (a, b) in enumerate(zip(ref.tokens, got.tokens)) if a != b), min(len(ref.tokens), len(got.tokens)))
                        raise BenchError(
                            f"greedy output of '{m.name}' differs from plain decoding on prompt {i} at token {first}"
                        )

    # ------------------------------------------------------------------ report

    def rows(self) -> list[dict[str, Any]]:
        plain = self.methods[0]
        plain_walls = [sum(s.wall_s for s in rep) for rep in plain.samples]
        plain_tok = sum(s.target_forward_s for rep in plain.samples for s in rep) / max(1, sum(s.target_forwards for rep in plain.samples for s in rep))
        by_name = {m.name: m for m in self.methods}
        rows = []
        for m in self.methods:
            walls = [sum(s.wall_s for s in rep) for rep in m.samples]
            tokens = [sum(len(s.tokens) for s in rep) for rep in m.samples]
            tps = [t / w for t, w in zip(tokens, walls)]
            ratios = [pw / w for pw, w in zip(plain_walls, walls)]
            row: dict[str, Any] = {
                "method": m.name, "family": m.family, "k": m.k,
                "tokens": tokens[0] if tokens else 0,
                "wall_s_median": statistics.median(walls),
                "tokens_per_s_median": statistics.median(tps), "tokens_per_s_min": min(tps), "tokens_per_s_max": max(tps),
                "speedup_median": statistics.median(ratios), "speedup_min": min(ratios), "speedup_max": max(ratios),
            }
            all_samples = [s for rep in m.samples for s in rep]
            wall_total = sum(s.wall_s for s in all_samples)
            if m.family in ("specscope", "traced", "plain"):
                tf = sum(s.target_forward_s for s in all_samples)
                df = sum(s.draft_forward_s for s in all_samples)
                row.update(target_forward_share=tf / wall_total, draft_forward_share=df / wall_total,
                           orchestration_share=max(0.0, 1 - (tf + df) / wall_total))
            rounds = [r for s in all_samples for r in s.rounds]
            if rounds:
                row.update(self._spec_stats(m, rounds, all_samples, plain_tok))
            if m.untraced in by_name:
                base = [sum(s.wall_s for s in rep) for rep in by_name[m.untraced].samples]
                overhead = [w / b - 1 for w, b in zip(walls, base)]
                row.update(tracing_overhead_median=statistics.median(overhead), tracing_overhead_min=min(overhead),
                           tracing_overhead_max=max(overhead))
            rows.append(row)
        return rows

    def _spec_stats(self, m: Method, rounds: list[Round], samples: list[Sample], plain_tok: float) -> dict[str, Any]:
        drafted = sum(r.drafted for r in rounds)
        accepted = sum(r.accepted for r in rounds)
        k = m.k or 1
        visited = np.zeros(k)
        passed = np.zeros(k)
        for r in rounds:
            for n in r.nodes:
                if n.status != "unvisited" and n.depth <= k:
                    visited[n.depth - 1] += 1
                    passed[n.depth - 1] += n.status == "accepted"
        # Conditional acceptance per position (over the rounds that reached it), for people;
        # the prediction uses the survival over all rounds (see the module docstring).
        rates = [float(passed[i] / visited[i]) if visited[i] else 0.0 for i in range(k)]
        survival = [float(passed[i] / len(rounds)) for i in range(k)]
        expected = expected_tokens_from_rounds([r.accepted for r in rounds])
        t_fwd = sum(s.target_forward_s for s in samples) / max(1, sum(s.target_forwards for s in samples))
        d_calls = sum(s.draft_forwards for s in samples)
        if d_calls:  # a draft model: its forwards are the proposal cost
            proposer_s = sum(s.draft_forward_s for s in samples)
        else:  # no model (prompt lookup): the whole propose call is the proposal cost
            proposer_s = sum(r.timings.draft_s for r in rounds)
        mean_drafted = drafted / len(rounds)
        c = (proposer_s / drafted) / plain_tok if drafted else 0.0
        v = t_fwd / plain_tok
        proposer_per_round = proposer_s / len(rounds) / plain_tok  # = n c (also when n = 0)
        return {
            "mean_accepted_length": sum(r.accepted_length for r in rounds) / len(rounds),
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "acceptance_by_position": rates,
            "survival_by_position": survival,
            "mean_drafted_per_round": mean_drafted,
            "cost_c": c, "cost_v": v, "proposer_cost_per_round": proposer_per_round,
            "expected_tokens_per_round": expected,
            "predicted_speedup": expected / (proposer_per_round + v) if not drafted else round_speedup(expected, mean_drafted, c, v),
        }


# --------------------------------------------------------------------------- CLI


def add_bench_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark the decoder against plain decoding and transformers' assisted generation",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--quick", action="store_true", help="a short version: 2 prompts, k=4, 3 repetitions, 48 tokens")
    p.add_argument("--json", action="store_true", help="print machine-readable results")
    p.add_argument("--markdown", default=None, metavar="FILE", help="write the tables (with machine and versions) to FILE")
    p.add_argument("--target", default=None, help="target checkpoint (default: bundled)")
    p.add_argument("--draft", action="append", default=None, metavar="DRAFT",
                   help="'small', 'tiny' or a checkpoint path; repeat for several (default: small and tiny)")
    p.add_argument("--proposer", action="append", default=None, metavar="SPEC",
                   help="a proposer spec without a model to bench besides the drafts, e.g. lookup:max_ngram=4; repeat "
                        "for several (default: every registered kind without a model, at its defaults)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--dtype", default=None, choices=("float32", "float16", "bfloat16"))
    p.add_argument("--k", default=None, help="comma-separated draft lengths (default: 2,4,6; quick: 4)")
    p.add_argument("--max-new", type=int, default=None, help="tokens per prompt (default: 128; quick: 48)")
    p.add_argument("--reps", type=int, default=None, help="timed repetitions (default: 5; quick: 3)")
    p.add_argument("--prompts", type=int, default=None, help="use the first N bundled example prompts (default: all; quick: 2)")
    p.add_argument("--mode", choices=("greedy", "sampled", "both"), default="both", help="default: both")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--no-transformers", action="store_true", help="skip transformers' generate()")
    p.set_defaults(func=cmd_bench)


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    quick = args.quick
    ks = [int(k) for k in args.k.split(",")] if args.k else ([4] if quick else [2, 4, 6])
    return dict(
        ks=ks,
        max_new=args.max_new or (48 if quick else 128),
        reps=args.reps or (3 if quick else 5),
        n_prompts=args.prompts or (2 if quick else None),
    )


def machine_info(device: torch.device) -> dict[str, Any]:
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "cpu": cpu, "cores": __import__("os").cpu_count(), "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "platform": platform.platform(), "device": str(device),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def format_table(rows: list[dict[str, Any]]) -> str:
    head = "| method | tokens/s (median, min-max) | speedup vs plain | mean acc. len | acc. rate | orchestration | predicted speedup |"
    out = [head, "|" + "---|" * 7]
    for r in rows:
        acc_len = f"{r['mean_accepted_length']:.2f}" if "mean_accepted_length" in r else ""
        acc = f"{r['acceptance_rate']:.2f}" if "acceptance_rate" in r else ""
        orch = f"{100 * r['orchestration_share']:.1f}%" if "orchestration_share" in r else ""
        pred = f"{r['predicted_speedup']:.2f}x" if "predicted_speedup" in r else ""
        name = r["method"]
        if "tracing_overhead_median" in r:
            name += f" (overhead {100 * r['tracing_overhead_median']:+.1f}%, {100 * r['tracing_overhead_min']:+.1f}..{100 * r['tracing_overhead_max']:+.1f}%)"
        out.append(
            f"| {name} | {r['tokens_per_s_median']:.1f} ({r['tokens_per_s_min']:.1f}-{r['tokens_per_s_max']:.1f}) "
            f"| {r['speedup_median']:.2f}x ({r['speedup_min']:.2f}-{r['speedup_max']:.2f}) | {acc_len} | {acc} | {orch} | {pred} |"
        )
    return "\n".join(out)


def cmd_bench(args: argparse.Namespace) -> int:
    from specscope.core import loading

    if args.threads:
        torch.set_num_threads(args.threads)
    settings = _settings(args)
    device = loading.resolve_device(args.device)
    draft_names = args.draft or ["small", "tiny"]
    pairs = {name: loading.load_models(target=args.target, draft=name, device=device, dtype=args.dtype) for name in draft_names}
    first = next(iter(pairs.values()))
    target, tokenizer = first.target, first.tokenizer
    drafts = {Path(name).name if "/" in name else name: p.draft for name, p in pairs.items()}
    prompts = [p.text for p in loading.example_prompts()]
    if settings["n_prompts"]:
        prompts = prompts[: settings["n_prompts"]]
    prompt_ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in prompts]
    eos = getattr(tokenizer, "eos_token_id", None)
    modes = ["greedy", "sampled"] if args.mode == "both" else [args.mode]
    info = machine_info(device)
    results: dict[str, Any] = {"machine": info, "settings": settings, "command": "specscope " + " ".join(sys.argv[1:]), "modes": {}}
    def say(msg: str) -> None:  # progress goes to stderr, also with --json
        print(msg, file=sys.stderr, flush=True)

    for mode in modes:
        sampling = SamplingConfig(temperature=0.0) if mode == "greedy" else SamplingConfig(temperature=1.0)
        say(f"== {mode}: {len(prompt_ids)} prompts, k in {settings['ks']}, {settings['max_new']} tokens, {settings['reps']} repetitions")
        bench = Bench(target, drafts, prompt_ids, ks=settings["ks"], max_new=settings["max_new"], reps=settings["reps"],
                      sampling=sampling, eos=eos, device=device, include_transformers=not args.no_transformers,
                      progress=say, specs=default_specs(list(drafts), args.proposer))
        try:
            bench.run()
        except BenchError as exc:
            print(f"specscope bench: {exc}", file=sys.stderr)
            return 1
        results["modes"][mode] = bench.rows()
        if not args.json:
            print(f"\n### {mode}\n")
            print(format_table(results["modes"][mode]))
    if args.json:
        print(json.dumps(results, indent=2))
    if args.markdown:
        write_markdown(Path(args.markdown), results)
        say(f"wrote {args.markdown}")
    return 0


NOTES_MARKER = "<!-- notes: kept when the bench rewrites this file -->"


def write_markdown(path: Path, results: dict[str, Any]) -> None:
    m = results["machine"]
    lines = [
        "# Benchmarks",
        "",
        f"Command: `{results['command']}`",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch threads {m['torch_threads']}, device {m['device']}"
        + (f" ({m['gpu']})" if "gpu" in m else "") + f"; Python {m['python']}, torch {m['torch']}, transformers {m['transformers']}.",
        "",
        f"Settings: k in {results['settings']['ks']}, {results['settings']['max_new']} new tokens per prompt, "
        f"{results['settings']['reps']} interleaved repetitions after a warm-up.",
        "",
    ]
    for mode, rows in results["modes"].items():
        lines += [f"## {mode}", "", format_table(rows), ""]
    # Hand-written analysis below the marker survives a rerun of the bench.
    kept = ""
    if path.exists():
        old = path.read_text(encoding="utf-8")
        if NOTES_MARKER in old:
            kept = old[old.index(NOTES_MARKER):]
    path.write_text("\n".join(lines) + ("\n" + kept if kept else ""), encoding="utf-8")
