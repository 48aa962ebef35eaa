"""The bench's methods and how each one is run and timed.

Method: one warm-up pass of every method over every prompt (--quick: the first prompt), then `reps` repetitions in
which the methods run interleaved (the order rotates each repetition), so slow drifts of
the machine hit every method alike. In greedy mode every method's output must equal plain
greedy decoding token for token, or the bench fails. Batch size is 1 throughout: specscope's
decoder and transformers' assisted generation both decode one sequence at a time.

Every run is timed as a whole and per emission: the time at which each step (plain
decoding, transformers' streamer) or round (speculative decoding) delivered its tokens.
After each run, in the method's own slot of the repetition, the prompt is fed once more
through each model the method uses (the target, and the draft when there is one) with an
empty KV cache and timed: the prefill, as llama.cpp's speculative example encodes the prompt
in both models before it decodes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specscope.core import SamplingConfig
from specscope.core.decode.baseline import plain_generate
from specscope.core.decode.factory import Models, RunSettings, build_decoder, check_positions
from specscope.core.decode.kv import CachedLM
from specscope.core.draft.proposers import TargetMismatch
from specscope.core.draft.registry import KINDS, SpecError, build_proposer, for_target, parse_spec
from specscope.core.settings.vocab import AutoK

from .metrics import RoundCounts, counts_of

Clock = Callable[[], float]


class BenchError(Exception):
    """The bench cannot vouch for its numbers (e.g. a greedy output mismatch)."""


@dataclass
class Sample:
    """One run of one method on one prompt."""

    tokens: list[int]
    wall_s: float
    target_forward_s: float = 0.0
    target_forwards: int = 0
    draft_forward_s: float = 0.0
    draft_forwards: int = 0
    rounds: list[RoundCounts] = field(default_factory=list)
    emissions: list[tuple[float, int]] = field(default_factory=list)  # (s since the call began, tokens)
    prefill_target_s: float | None = None
    prefill_draft_s: float | None = None
    # a recorded run: the writer's start (run row inserted and committed) plus its final
    # flush and close (finish_with), inside wall_s; the rest of wall_s is the rounds
    writer_s: float | None = None


@dataclass
class Method:
    name: str
    family: str  # plain | specscope | transformers | traced | vllm
    k: int | AutoK | None
    run: Callable[[list[int]], Sample]
    draft: str | None = None  # the draft model it runs, by the bench's name for it
    spec: str | None = None  # the proposer spec of a specscope method
    untraced: str | None = None  # for a traced method: the name of the same method untraced
    samples: list[list[Sample]] = field(default_factory=list)  # [rep][prompt]
    engine_version: str | None = None  # a vLLM row: vLLM's version (app/bench/vllm.py)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _clocked(device: torch.device, fn: Callable[[Clock], Any]) -> tuple[Any, float]:
    """Run fn(clock), clock() = seconds since the start (CUDA synchronised); (result, wall)."""
    _sync(device)
    start = time.perf_counter()

    def clock() -> float:
        _sync(device)
        return time.perf_counter() - start

    out = fn(clock)
    return out, clock()


class _Tap:
    """Counts and emission times of a run's rounds, taken as they pass (the decoder's result
    need not keep its rounds)."""

    def __init__(self, eos: int | None):
        self.eos, self.stamps, self.counts = eos, [], []

    def drain(self, handle: Any, clock: Clock, each: Callable[[Any], None] | None = None) -> Any:
        """Run `handle` to its end through its own drain(), noting each round (an engine
        drains in the caller's thread: core/engines), then `each(round)`; the result."""

        def note(rnd: Any) -> None:
            self.stamps.append((clock(), len(rnd.emitted)))
            self.counts.append(counts_of(rnd, self.eos))
            if each is not None:
                each(rnd)

        return handle.drain(note)


def default_specs(
    drafts: Sequence[str], extra: Sequence[str] | None = None, target: Any = None, target_name: str | None = None
) -> list[str]:
    """The proposer specs a bench runs: every kind with a model over each named draft
    (draft:NAME), then `extra`, or else every registered kind at its defaults that needs no
    model, and each head kind whose bundled head fits `target` (the bundled target's head, or
    the one a named target ships: catalog default_heads; a head kind without one needs a
    checkpoint folder)."""
    with_model = [f"{kind.name}:{name}" for kind in KINDS.values() if kind.needs_model for name in drafts]
    alone = [k.name for k in KINDS.values() if not k.needs_model and not k.takes_path]
    heads = [
        spec
        for spec in (
            str(for_target(k.name, target_name))
            for k in KINDS.values()
            if k.bundled_head or for_target(k.name, target_name).arg
        )
        if target is not None and bundled_head_fits(spec, target)
    ]
    return with_model + list(extra if extra is not None else alone + heads)


def bundled_head_fits(spec: str, target: Any) -> bool:
    """Whether a bundled head (`eagle3`, eagle3:eagle3-smollm2) can serve this target (hidden
    size, vocabulary, layers)."""
    try:
        build_proposer(spec).target_features(target)
    except (SpecError, TargetMismatch):
        return False
    return True


def method_name(spec: str) -> str:
    """A spec's name in the bench tables: "draft-small" for draft:small, "draft-small
    tree=3,2,1 topk" for a tree of it, else the spec."""
    parsed = parse_spec(spec)
    if not KINDS[parsed.kind].needs_model:
        return str(parsed)
    name = f"{parsed.kind}-{parsed.arg}"
    if parsed.params.get("tree"):
        name += f" tree={parsed.params['tree']} {parsed.params.get('children', 'topk')}"
    return name


def is_tree_spec(spec: str) -> bool:
    return bool(parse_spec(spec).params.get("tree"))


def _spec_draft(spec: str) -> str | None:
    parsed = parse_spec(spec)
    return str(parsed.arg) if KINDS[parsed.kind].needs_model else None


class Bench:
    def __init__(  # long: every measured method set up in one place, in the table's order
        self,
        target,
        drafts: dict[str, torch.nn.Module],
        prompts: Sequence[list[int]],
        *,
        ks: Sequence[int | AutoK],
        max_new: int,
        reps: int,
        sampling: SamplingConfig,
        eos: int | None,
        device: torch.device,
        include_transformers: bool = True,
        include_traced: bool = True,
        seed: int = 0,
        progress: Callable[[str], None] | None = None,
        specs: Sequence[str] | None = None,
        kinds: Sequence[str] | None = None,
        warm_every_prompt: bool = True,
    ):
        """`drafts` are the models that specs such as draft:NAME load by NAME; `specs` the
        proposers to run (default: default_specs(drafts)); `kinds` the kind of each prompt
        (copy, novel, ...; default: all "prompt"); `warm_every_prompt=False` warms each
        method up on the first prompt only (--quick)."""
        self.target, self.drafts, self.prompts = target, drafts, [list(p) for p in prompts]
        self.kinds = list(kinds) if kinds is not None else ["prompt"] * len(self.prompts)
        if len(self.kinds) != len(self.prompts):
            raise ValueError("one kind per prompt")
        self.ks, self.max_new, self.reps = list(ks), max_new, reps
        self.sampling, self.eos, self.device, self.seed = sampling, eos, device, seed
        self.progress = progress or (lambda msg: None)
        self.warm_prompts = self.prompts if warm_every_prompt else self.prompts[:1]
        self.specs = list(specs) if specs is not None else default_specs(list(drafts), target=target)
        self._prefill_lms: dict[str, CachedLM] = {}
        self.methods: list[Method] = [Method("plain (KV cache)", "plain", None, self._plain)]
        for k in self.ks:
            for spec in self.specs:
                if is_tree_spec(spec):  # a tree's size is its spec, not k: one row
                    if k == self.ks[0]:
                        self.methods.append(
                            Method(
                                f"specscope {method_name(spec)}",
                                "specscope",
                                None,
                                self._spec(spec, k),
                                draft=_spec_draft(spec),
                                spec=spec,
                            )
                        )
                    continue
                self.methods.append(
                    Method(
                        f"specscope {method_name(spec)} k={k}",
                        "specscope",
                        k,
                        self._spec(spec, k),
                        draft=_spec_draft(spec),
                        spec=spec,
                    )
                )
            if include_transformers and isinstance(k, int):  # transformers' rows take a fixed k
                first = next(iter(drafts.items()), None)
                if first is not None:
                    self.methods.append(
                        Method(
                            f"transformers assisted draft-{first[0]} k={k}",
                            "transformers",
                            k,
                            self._hf_assisted(first[1], k),
                            draft=first[0],
                        )
                    )
                if sampling.greedy:
                    self.methods.append(Method(f"transformers lookup k={k}", "transformers", k, self._hf_lookup(k)))
        if include_traced and drafts:
            label = next(iter(drafts))
            # a fixed k where there is one: auto's lengths follow the measured timings, so a traced
            # auto run and its untraced twin would not decode alike (measured: +35% "overhead")
            fixed: list[int | AutoK] = [k for k in self.ks if isinstance(k, int)] or list(self.ks)
            k = fixed[len(fixed) // 2]
            twin = f"specscope draft-{label} k={k}"
            self.methods.append(
                Method(
                    f"{twin} traced+stored",
                    "traced",
                    k,
                    self._traced(f"draft:{label}", k),
                    draft=label,
                    spec=f"draft:{label}",
                    untraced=twin,
                )
            )
            if include_transformers and isinstance(k, int):  # transformers' own generate(), recorded by it
                twin = f"transformers assisted draft-{label} k={k}"
                self.methods.append(
                    Method(
                        f"{twin} traced+stored",
                        "transformers",
                        k,
                        self._hf_traced(label, k),
                        draft=label,
                        untraced=twin,
                    )
                )

    # ------------------------------------------------------------------ runners

    def _plain(self, prompt: list[int]) -> Sample:
        """core's plain decoding; each target forward yields one token, so a forward hook
        stamps the emissions without touching the loop."""
        stamps: list[tuple[float, int]] = []

        def go(clock: Clock):
            hook = self.target.register_forward_hook(lambda *_: stamps.append((clock(), 1)))
            try:
                return plain_generate(self.target, prompt, self.max_new, self.sampling, self.eos, self.seed)
            finally:
                hook.remove()

        res, wall = _clocked(self.device, go)
        return Sample(res.new_tokens, wall, res.forward_s, res.forwards, emissions=stamps[: len(res.new_tokens)])

    def _settings(self, spec: str, k: int | AutoK, engine: str = "specscope") -> RunSettings:
        """A method's settings: the bench's sampler, EOS and seed with its proposer and k."""
        return RunSettings(
            proposer=spec,
            engine=engine,
            k=k,
            temperature=self.sampling.temperature,
            top_k=self.sampling.top_k,
            top_p=self.sampling.top_p,
            seed=self.seed,
            max_new_tokens=self.max_new,
            eos=self.eos,
            eos_disabled=self.eos is None,
        )

    def _models(self, spec: str) -> Models:
        """The target and the draft a method's spec names, by the bench's name for it."""
        name = parse_spec(spec).model_ref
        if name is not None and name not in self.drafts:
            raise SpecError(f"the bench has no draft named {name!r} (drafts: {', '.join(self.drafts)})")
        return Models(self.target, draft=self.drafts.get(name) if name else None, draft_name=name)

    def _decoder(self, spec: str, k: int | AutoK, engine: str = "specscope") -> Any:
        """A method's decoder (or transformers engine), made as the CLI and the window make theirs
        (core.decode.factory)."""
        settings, models = self._settings(spec, k, engine), self._models(spec)
        decoder = build_decoder(settings, models)
        if self.prompts:  # the longest prompt plus the budget within the models' positions
            check_positions(max(self.prompts, key=len), settings, models)
        return decoder

    def _sample_from(self, dec: Any, result, wall: float, tap: _Tap) -> Sample:
        """A Sample with the rounds reduced to their counts (the full vectors are dropped)."""
        target_lm = getattr(dec, "target_lm", None)
        draft_lm = getattr(getattr(dec, "proposer", None), "lm", None)
        draft_s, draft_forwards = (draft_lm.forward_s, draft_lm.forwards) if draft_lm else (0.0, 0)
        if getattr(target_lm, "hidden_layers", ()):  # a draft head: its propose calls are its forwards, one per token
            draft_s, draft_forwards = sum(c.draft_s for c in tap.counts), sum(c.drafted for c in tap.counts)
        return Sample(
            result.new_tokens,
            wall,
            target_lm.forward_s if target_lm else 0.0,
            target_lm.forwards if target_lm else 0,
            draft_s,
            draft_forwards,
            tap.counts,
            tap.stamps,
        )

    def _spec(self, spec: str, k: int | AutoK) -> Callable[[list[int]], Sample]:
        dec = self._decoder(spec, k)

        def run(prompt: list[int]) -> Sample:
            tap = _Tap(self.eos)
            result, wall = _clocked(self.device, lambda clock: tap.drain(dec.start(prompt, self.max_new), clock))
            return self._sample_from(dec, result, wall, tap)

        return run

    def _traced(self, spec: str, k: int | AutoK) -> Callable[[list[int]], Sample]:
        return self._recorded(self._decoder(spec, k))

    def _hf_traced(self, label: str, k: int) -> Callable[[list[int]], Sample]:
        """transformers' assisted generate() recorded round by round into a store (the
        transformers engine, core/engines), beside the same call untraced."""
        return self._recorded(self._decoder(f"draft:{label}", k, engine="transformers"))

    def _recorded(self, dec: Any) -> Callable[[list[int]], Sample]:
        """Runs of `dec` (a decoder or an engine) written to a trace store as they decode."""
        from specscope.storage import TraceStore, TraceWriter

        if getattr(self, "_tmp", None) is None:
            import tempfile

            self._tmp = tempfile.TemporaryDirectory(prefix="specscope-bench-")
        store = TraceStore(Path(self._tmp.name) / "bench.sqlite")

        def run(prompt: list[int]) -> Sample:
            tap = _Tap(self.eos)

            writer_s = 0.0

            def record(clock: Clock):
                nonlocal writer_s
                begun = clock()
                config = dec.run_config(prompt, self.max_new)
                with TraceWriter(store, config) as writer:
                    decoding = clock()
                    writer_s += decoding - begun
                    try:
                        result = tap.drain(dec.start(prompt, self.max_new, config=config), clock, writer.write)
                    except BaseException as exc:
                        writer.fail(exc)
                        raise
                    decoded = clock()
                    writer.finish_with(result)
                    writer_s += clock() - decoded
                    return result

            result, wall = _clocked(self.device, record)
            sample = self._sample_from(dec, result, wall, tap)
            sample.writer_s = writer_s
            return sample

        return run

    def _hf_kwargs(self, prompt: list[int]) -> dict[str, Any]:
        ids = torch.tensor([prompt], device=self.device)
        kwargs: dict[str, Any] = dict(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=self.max_new,
            eos_token_id=self.eos,
            pad_token_id=self.eos if self.eos is not None else 0,
        )
        if self.sampling.greedy:
            kwargs["do_sample"] = False
        else:
            kwargs.update(
                do_sample=True,
                temperature=self.sampling.temperature,
                top_k=self.sampling.top_k or None,
                top_p=self.sampling.top_p,
            )
        return kwargs

    def _hf_generate(self, prompt: list[int], **extra: Any) -> Sample:
        kwargs = self._hf_kwargs(prompt)

        def go(clock: Clock):
            streamer = _Streamer(clock)
            with torch.inference_mode():
                return self.target.generate(**kwargs, **extra, streamer=streamer), streamer.stamps

        (out, stamps), wall = _clocked(self.device, go)
        return Sample(out[0, len(prompt) :].tolist(), wall, emissions=stamps)

    def _hf_assisted(self, draft, k: int) -> Callable[[list[int]], Sample]:
        def run(prompt: list[int]) -> Sample:
            cfg = draft.generation_config
            cfg.num_assistant_tokens, cfg.num_assistant_tokens_schedule, cfg.assistant_confidence_threshold = (
                k,
                "constant",
                0.0,
            )
            return self._hf_generate(prompt, assistant_model=draft)

        return run

    def _hf_lookup(self, k: int) -> Callable[[list[int]], Sample]:
        if self.prompts:  # transformers' prompt lookup verifies up to k - 2 candidates past the budget
            check_positions(
                max(self.prompts, key=len), self._settings("lookup", k, engine="transformers"), Models(self.target)
            )
        return lambda prompt: self._hf_generate(prompt, prompt_lookup_num_tokens=k)

    def _prefill(self, name: str, prompt: list[int]) -> float:
        """One forward of the prompt through a model ("target" or a draft's name), empty cache."""
        lm = self._prefill_lms.get(name)
        if lm is None:
            lm = self._prefill_lms[name] = CachedLM(self.target if name == "target" else self.drafts[name])
        lm.reset()
        lm.feed(prompt, keep=1)
        return lm.forward_s

    # ------------------------------------------------------------------ driving

    def _run_one(self, m: Method, prompt: list[int]) -> Sample:
        sample = m.run(prompt)
        if m.family == "vllm":  # vLLM's own process: the in-process prefill does not describe its row
            return sample
        sample.prefill_target_s = self._prefill("target", prompt)
        if m.draft is not None:
            sample.prefill_draft_s = self._prefill(m.draft, prompt)
        return sample

    def run(self) -> None:
        torch.manual_seed(self.seed)
        self.progress(f"warm-up: {len(self.methods)} methods x {len(self.warm_prompts)} prompts")
        for m in self.methods:
            for p in self.warm_prompts:
                self._run_one(m, p)
        for rep in range(self.reps):
            shift = rep % len(self.methods)
            order = self.methods[shift:] + self.methods[:shift]
            for m in order:
                m.samples.append([self._run_one(m, p) for p in self.prompts])
            self.progress(f"repetition {rep + 1}/{self.reps} done")
        if self.sampling.greedy:
            self._check_identical()

    def _check_identical(self) -> None:
        reference = self.methods[0].samples[0]
        for m in self.methods[1:]:
            if m.family == "vllm":  # compared with specscope's decoder, not required equal (vllm.annotate)
                continue
            for rep in m.samples:
                for i, (ref, got) in enumerate(zip(reference, rep)):
                    if got.tokens != ref.tokens:
                        first = next(
                            (j for j, (a, b) in enumerate(zip(ref.tokens, got.tokens)) if a != b),
                            min(len(ref.tokens), len(got.tokens)),
                        )
                        raise BenchError(
                            f"greedy output of '{m.name}' differs from plain decoding on prompt {i} at token {first}"
                        )

    def rows(self) -> list[dict[str, Any]]:
        from .report import bench_rows

        return bench_rows(self)


class _Streamer:
    """transformers' streamer protocol: generate() puts the prompt first, then each step's
    (or each assisted round's) new tokens; we note when they came."""

    def __init__(self, clock: Clock):
        self.clock, self.stamps, self._prompt_seen = clock, [], False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.stamps.append((self.clock(), int(value.numel())))

    def end(self) -> None:
        pass
