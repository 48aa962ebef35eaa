"""transformers as a second engine: its own generate() loop, recorded round by round.

`TransformersEngine` has the surface the CLI, the trace writer and the GUI worker use on a
SpeculativeDecoder (run_config, rounds, start, generate, vocab_size, eos_token_id, k,
sampling, proposer naming), but the rounds come from the installed transformers'
`generate(assistant_model=...)` (kind "assisted") or `generate(prompt_lookup_num_tokens=...)`
(kind "lookup"), unchanged: the recorder only observes it (core/engines/hf_recorder.py).

transformers offers no per-round hook, so a live, steppable run needs generate() in a worker
thread: rounds() (and a run handle that is stepped, as the GUI does) hands each Round over
through a one-slot channel, the loop waiting while a round is not taken; closing it cancels
the run after the round in progress (a stopping criterion that turns true). A run that is
drained (`start(...).drain(each)`: the CLI, the trace writer, the bench; `generate()`) runs
generate() in the calling thread instead and calls `each` from inside the loop: no thread and
no hand-over per round (record_here). Only one generate() computes at a time in a process,
and each run keeps its own torch random state while others compute (hf_handover), so two
runs stepped in turn (compare lanes) draw exactly what each would draw alone.
"""

from __future__ import annotations

import inspect
import threading
import time
import uuid
from collections.abc import Callable, Generator, Sequence
from typing import Any, cast

import torch
from transformers import GenerationConfig

from specscope.core.decode.decoder import check_run_positions, normalize_prompt, target_position_limit
from specscope.core.decode.kv import model_vocab_size
from specscope.core.decode.run import RunHandle
from specscope.core.decode.stops import Stops, StopTracker
from specscope.core.engines.hf_handover import COMPUTE, DONE, Baton, CancelCriterion, Channel, StopCriterion
from specscope.core.engines.hf_private import check_private_api, install_candidate_hook
from specscope.core.engines.hf_recorder import RoundRecorder
from specscope.core.records import GenerationResult, Round, RunConfig, SummaryTally
from specscope.core.sampling.dists import DEFAULT_TOP_N, covering_top_n, keeps_full_vectors
from specscope.core.sampling.reference import SamplingConfig

KINDS = ("assisted", "lookup")
UNRECORDED = frozenset({"u", "draw"})  # transformers draws them inside its loop and keeps none


class TransformersEngine:
    """Records transformers' own speculative decoding of `target`.

    kind "assisted": candidates from `draft` (AssistedCandidateGenerator); `k` is the
    assistant's num_assistant_tokens, `schedule` its num_assistant_tokens_schedule and
    `confidence` its assistant_confidence_threshold (None: transformers' default).
    kind "lookup": prompt lookup (PromptLookupCandidateGenerator); `k` is
    prompt_lookup_num_tokens and `max_ngram` max_matching_ngram_size.
    `vectors` / `top_n`: what each Round keeps of its full-vocabulary rows, as for
    SpeculativeDecoder ("auto": full vectors up to core.sampling.dists.FULL_VECTORS_MAX_VOCAB tokens,
    else the top-N entries and the exact facts).
    """

    def __init__(
        self,
        target: torch.nn.Module,
        kind: str = "assisted",
        draft: torch.nn.Module | None = None,
        k: int = 4,
        sampling: SamplingConfig | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        seed: int = 0,
        target_name: str = "",
        draft_name: str | None = None,
        max_ngram: int = 2,
        schedule: str = "constant",
        confidence: float | None = None,
        vectors: str = "auto",
        top_n: int = DEFAULT_TOP_N,
        stops: Stops | None = None,
        token_piece: Callable[[int], str] | None = None,
    ):
        self.transformers_version = check_private_api()
        if kind not in KINDS:
            raise ValueError(f"transformers engine kind must be one of {KINDS}, got {kind!r}")
        if kind == "assisted" and draft is None:
            raise ValueError("the transformers engine's assisted kind needs a draft model")
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k (draft length) must be an integer >= 1, got {k!r}")
        self.target, self.kind, self.draft = target, kind, draft if kind == "assisted" else None
        self.k, self.seed, self.max_ngram = int(k), int(seed), int(max_ngram)
        self.schedule, self.confidence = schedule, confidence
        self.sampling = sampling if sampling is not None else SamplingConfig()
        self.vocab_size = model_vocab_size(target)
        self.eos_token_ids = _eos_ids(eos_token_id, self.vocab_size)
        self.eos_token_id = self.eos_token_ids[0] if self.eos_token_ids else None
        self.stops = stops if stops is not None else Stops()
        if self.stops.strings and token_piece is None:
            raise ValueError("stop strings need token_piece (the text of each token): give the engine a tokenizer")
        self.token_piece = token_piece
        self.target_name = target_name or getattr(target.config, "_name_or_path", "") or type(target).__name__
        self.draft_name = draft_name if self.draft is not None else None
        self.use_cache = True  # transformers' assisted loop requires a cache
        if not isinstance(top_n, int) or top_n < 1:
            raise ValueError(f"top_n must be an integer >= 1, got {top_n!r}")
        self.full_vectors = keeps_full_vectors(vectors, self.vocab_size)
        self.top_n = covering_top_n(top_n, self.sampling.top_k)

    def keep_full_vectors(self) -> None:
        """From the next run on, every Round carries its rows as full float64 vectors (what
        a trace store that keeps them needs), whatever `vectors` said."""
        self.full_vectors = True

    # ------------------------------------------------------------------ naming

    @property
    def name(self) -> str:
        return f"transformers-{self.kind}"

    @property
    def spec(self) -> str:
        if self.kind == "lookup":
            return f"hf-lookup:num_tokens={self.k},max_ngram={self.max_ngram}"
        return f"hf-assisted:{self.draft_name or 'draft'}"

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {"engine": "transformers", "transformers": self.transformers_version}
        if self.kind == "lookup":
            out.update(prompt_lookup_num_tokens=self.k, max_matching_ngram_size=self.max_ngram)
        else:
            out.update(
                num_assistant_tokens=self.k,
                num_assistant_tokens_schedule=self.schedule,
                assistant_confidence_threshold=self._confidence(),
            )
        return out

    def _confidence(self) -> float | None:
        if self.confidence is not None:
            return float(self.confidence)
        if self.draft is None:
            return None
        threshold: float | None = _generation_config(self.draft).assistant_confidence_threshold
        return threshold

    # ------------------------------------------------------------------ the generate() call

    def generation_config(self, config: RunConfig) -> Any:
        """The GenerationConfig of a run: the sampler, budget and EOS of `config`, every other
        processor off (a checkpoint's own generation_config.json is not used)."""
        from transformers import GenerationConfig

        s = config.sampling
        eos = sorted(config.eos_ids) if config.eos_ids else None
        # generate() fills every None field from the model's own generation_config: "no EOS" is
        # -1 (transformers' documented "never stops at EOS"), and the processors are off explicitly
        options: dict[str, Any] = dict(
            max_new_tokens=config.max_new_tokens,
            eos_token_id=-1 if eos is None else eos,
            pad_token_id=0 if eos is None else eos[0],
            do_sample=not s.greedy,
            num_beams=1,
            min_length=0,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            typical_p=1.0,
            epsilon_cutoff=0.0,
            eta_cutoff=0.0,
            encoder_repetition_penalty=1.0,
        )
        if not s.greedy:  # top_k=0 said explicitly: transformers' default is 50
            options.update(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)
        if self.kind == "lookup":
            options.update(prompt_lookup_num_tokens=self.k, max_matching_ngram_size=self.max_ngram)
        return GenerationConfig(**options)

    def _call_generate(self, config: RunConfig, stopping: Sequence[Any] = ()) -> list[int]:
        """transformers' generate() for `config`, seeded with config.seed; the new tokens."""
        device = next(self.target.parameters()).device
        ids = torch.tensor([list(config.prompt_ids)], dtype=torch.long, device=device)
        kwargs: dict[str, Any] = dict(
            generation_config=self.generation_config(config), attention_mask=torch.ones_like(ids)
        )
        if stopping:
            from transformers import StoppingCriteriaList

            kwargs["stopping_criteria"] = StoppingCriteriaList(list(stopping))
        saved = None
        if self.draft is not None:
            kwargs["assistant_model"] = self.draft
            saved = _set_assistant(self.draft, self.k, self.schedule, self.confidence)
        torch.manual_seed(config.seed)
        try:
            with torch.inference_mode():
                generate: Any = self.target.generate  # a transformers model's (GenerationMixin)
                out = generate(ids, **kwargs)
        finally:
            if saved is not None and self.draft is not None:  # (saved only with a draft)
                _restore_assistant(self.draft, saved)
        return [int(t) for t in out[0, ids.shape[1] :].tolist()]

    def plain_generate(
        self, prompt_ids: Sequence[int] | torch.Tensor, max_new_tokens: int = 32, seed: int | None = None
    ) -> list[int]:
        """The same generate() call with nothing recorded: the reference a recorded run must
        equal. It ends where a recorded run ends: at EOS, the budget, or the token that
        completes one of the engine's stops (the tokens transformers computed past it in that
        round are not returned, as the recorder does not emit them)."""
        config = self.run_config(prompt_ids, max_new_tokens, seed=seed)
        if config.max_new_tokens == 0:
            return []
        stopping: tuple[StopCriterion, ...] = ()
        if self.stops:
            tracker = StopTracker(Stops(config.stop_strings, config.stop_ids), self.token_piece)
            stopping = (StopCriterion(tracker, len(config.prompt_ids), frozenset(config.eos_ids)),)
        with COMPUTE:
            tokens = self._call_generate(config, stopping=stopping)
        end = stopping[0].end if stopping else None
        return tokens if end is None else tokens[:end]

    # ------------------------------------------------------------------ the decoder surface

    def run_config(
        self,
        prompt_ids: Sequence[int] | torch.Tensor,
        max_new_tokens: int,
        run_id: str | None = None,
        seed: int | None = None,
    ) -> RunConfig:
        ids = normalize_prompt(prompt_ids, self.vocab_size)
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        extra, why = self.positions_past_budget()
        check_run_positions(
            len(ids), max_new_tokens, [(self.target_name, self.target), (self.draft_name, self.draft)], extra, why
        )
        param = next(self.target.parameters())
        return RunConfig(
            run_id=run_id or uuid.uuid4().hex,
            prompt_ids=tuple(ids),
            max_new_tokens=int(max_new_tokens),
            k=self.k,
            sampling=self.sampling,
            seed=self.seed if seed is None else int(seed),
            eos_token_id=self.eos_token_id,
            proposer=self.name,
            proposer_params={"spec": self.spec, **self.params()},
            target_name=self.target_name,
            draft_name=self.draft_name,
            device=str(param.device),
            dtype=str(param.dtype).removeprefix("torch."),
            vocab_size=self.vocab_size,
            use_cache=True,
            unrecorded=UNRECORDED,
            eos_token_ids=self.eos_token_ids if len(self.eos_token_ids) > 1 else (),
            stop_strings=self.stops.strings,
            stop_ids=self.stops.sequences,
            position_limit=target_position_limit(self.target),
        )

    def positions_past_budget(self) -> tuple[int, str]:
        """Positions the target reads past prompt + budget, and why (lookup_positions_past_budget)."""
        return lookup_positions_past_budget(self.k) if self.kind == "lookup" else (0, "")

    def rounds(
        self,
        prompt_ids: Sequence[int] | torch.Tensor = (),
        max_new_tokens: int = 32,
        run_id: str | None = None,
        seed: int | None = None,
        config: RunConfig | None = None,
        keep_rounds: bool = False,
    ) -> Generator[Round, None, GenerationResult]:
        """Yield one Round per round of transformers' loop, live; return the GenerationResult.
        generate() runs in a worker thread that waits while a round is not taken, so the
        consumer steps the run; closing the generator cancels the run after the round in
        progress. The result keeps the rounds only if `keep_rounds` asks for them."""
        config = config or self.run_config(prompt_ids, max_new_tokens, run_id, seed)
        started = time.perf_counter()
        channel = Channel()
        thread = threading.Thread(
            target=self._produce, args=(config, channel), name="specscope-transformers", daemon=True
        )
        collected = _Collected(keep_rounds)
        if config.max_new_tokens > 0:
            thread.start()
        try:
            while thread.is_alive() or not channel.empty():
                item = channel.get()
                if item is DONE:
                    break
                if isinstance(item, BaseException):
                    raise item
                collected.add(item)
                yield item
        finally:
            channel.cancel()
            if thread.is_alive():
                thread.join()
        return collected.result(config, started)

    def _produce(self, config: RunConfig, channel: Channel) -> None:
        channel.baton.take()
        try:
            self._record(config, channel.put, channel.cancelled)
            channel.put(DONE)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            channel.put(exc)
        finally:
            channel.baton.give()

    def _record(self, config: RunConfig, emit: Callable[[Round], None], cancelled: threading.Event) -> None:
        """One recorded generate() in the calling thread, `emit` called with each Round in it."""
        tracker = StopTracker(Stops(config.stop_strings, config.stop_ids), self.token_piece)
        recorder = RoundRecorder(
            config,
            self.target,
            self.draft,
            emit,
            greedy=config.sampling.greedy,
            lookup=self.kind == "lookup",
            full_vectors=self.full_vectors,
            top_n=self.top_n,
            stops=tracker,
        )
        undo = install_candidate_hook(self.target, recorder.wrap)
        recorder.attach()
        try:
            self._call_generate(config, stopping=(CancelCriterion(cancelled), recorder.stop_criterion()))
            recorder.finish()
        finally:
            recorder.detach()
            undo()

    def record_here(
        self,
        config: RunConfig,
        each: Callable[[Round], None] | None = None,
        cancelled: threading.Event | None = None,
        keep_rounds: bool = False,
    ) -> GenerationResult:
        """The run in the calling thread, no worker thread and no hand-over: `each(round)`
        is called from inside transformers' loop as each round ends (rounds are live, but
        the loop waits while `each` runs: keep it cheap). An exception from `each` (or
        Ctrl-C) ends generate() there and propagates; setting `cancelled` ends the run after
        the round in progress. What `start(...).drain(each)` does."""
        started = time.perf_counter()
        collected = _Collected(keep_rounds)
        baton = Baton()

        def emit(rnd: Round) -> None:
            collected.add(rnd)
            if each is not None:
                baton.give()  # another run may compute while `each` runs (as a stepped run's consumer)
                try:
                    each(rnd)
                finally:
                    baton.take()

        if config.max_new_tokens > 0:
            baton.take()
            try:
                self._record(config, emit, cancelled if cancelled is not None else threading.Event())
            finally:
                baton.give()
        return collected.result(config, started)

    def start(
        self,
        prompt_ids: Sequence[int] | torch.Tensor = (),
        max_new_tokens: int = 32,
        run_id: str | None = None,
        seed: int | None = None,
        config: RunConfig | None = None,
        keep_rounds: bool = False,
    ) -> TransformersRun:
        config = config or self.run_config(prompt_ids, max_new_tokens, run_id, seed)
        return TransformersRun(self, config, keep_rounds)

    def generate(
        self,
        prompt_ids: Sequence[int] | torch.Tensor,
        max_new_tokens: int = 32,
        run_id: str | None = None,
        seed: int | None = None,
        keep_rounds: bool = True,
    ) -> GenerationResult:
        """Run to the end in the calling thread; the result keeps every Round unless
        `keep_rounds=False`."""
        return self.start(prompt_ids, max_new_tokens, run_id, seed, keep_rounds=keep_rounds).drain()


def lookup_positions_past_budget(k: int) -> tuple[int, str]:
    """transformers' prompt lookup caps its candidates by the input's length, not by
    max_length: a round that starts two tokens before the end verifies up to k candidates,
    k - 2 of them past the budget (a model with learned positions fails there with an
    IndexError; one with rotary positions reads positions past its limit)."""
    extra = max(int(k) - 2, 0)
    return extra, (
        f" (+{extra}: transformers' prompt lookup with k={k} verifies up to {extra} candidates past the budget)"
        if extra
        else ""
    )


class TransformersRun(RunHandle):
    """start()'s run handle. Stepping it (`next`, `step`, `for`: the GUI) runs generate() in
    a worker thread, one round per step (rounds()). `drain(each)` on a run not stepped yet
    (the CLI, the trace writer, the bench) runs generate() in the calling thread with `each`
    called from inside the loop (record_here): no thread, no per-round hand-over, so a
    recorded run costs what the same generate() call costs plus the recorder's reading."""

    def __init__(self, engine: TransformersEngine, config: RunConfig, keep_rounds: bool = False):
        super().__init__(engine.rounds(config=config, keep_rounds=keep_rounds), config)
        self._engine, self._keep_rounds = engine, keep_rounds
        self._cancelled = threading.Event()

    def drain(self, each: Callable[[Round], None] | None = None) -> GenerationResult:
        if self.result is not None or inspect.getgeneratorstate(self._rounds) != inspect.GEN_CREATED:
            return super().drain(each)  # already stepped: go on in its worker thread
        self._rounds.close()  # never started: nothing runs

        def counted(rnd: Round) -> None:
            self.rounds_seen += 1
            if each is not None:
                each(rnd)

        config = cast(RunConfig, self.config)  # the engine's handle is made with its run's config
        self.result = self._engine.record_here(config, counted, self._cancelled, self._keep_rounds)
        return self.result

    def close(self) -> None:
        self._cancelled.set()  # a drain in progress (close() called from its `each`) ends after this round
        super().close()


class _Collected:
    """A run's tokens and running summary (and its rounds, when kept)."""

    def __init__(self, keep_rounds: bool):
        self.keep_rounds = keep_rounds
        self.rounds: list[Round] = []
        self.tokens: list[int] = []
        self.tally = SummaryTally()
        self.eos = False
        self.stop = False

    def add(self, rnd: Round) -> None:
        self.tally.add(rnd)
        if self.keep_rounds:
            self.rounds.append(rnd)
        self.tokens.extend(rnd.tokens)
        self.eos, self.stop = rnd.eos, rnd.stop is not None

    def result(self, config: RunConfig, started: float) -> GenerationResult:
        return GenerationResult(
            config=config,
            new_tokens=self.tokens,
            rounds=self.rounds,
            stop_reason="eos" if self.eos else "stop" if self.stop else "budget",
            wall_s=time.perf_counter() - started,
            tallied=self.tally.summary(),
        )


def _eos_ids(eos: int | Sequence[int] | None, vocab_size: int) -> tuple[int, ...]:
    ids: list[Any] = [] if eos is None else [eos] if not isinstance(eos, (list, tuple, set, frozenset)) else list(eos)
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
            raise ValueError(f"eos_token_id must be None or token ids in [0, {vocab_size}), got {eos!r}")
    return tuple(dict.fromkeys(int(t) for t in ids))


def _generation_config(model: torch.nn.Module) -> GenerationConfig:
    """A transformers model's generation_config (nn.Module types its attributes Tensor | Module)."""
    return cast(GenerationConfig, model.generation_config)


def _set_assistant(draft: torch.nn.Module, k: int, schedule: str, confidence: float | None) -> dict[str, Any]:
    """Set the assistant's draft length, schedule and confidence threshold for one call;
    return what they were (transformers reads them from the assistant's generation_config)."""
    gc = _generation_config(draft)
    names = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
    saved = {name: getattr(gc, name, None) for name in names}
    gc.num_assistant_tokens = k
    gc.num_assistant_tokens_schedule = schedule
    if confidence is not None:
        gc.assistant_confidence_threshold = confidence
    return saved


def _restore_assistant(draft: torch.nn.Module, saved: dict[str, Any]) -> None:
    for name, value in saved.items():
        setattr(draft.generation_config, name, value)
