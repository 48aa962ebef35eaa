"""transformers as a second engine: its own generate() loop, recorded round by round.

`TransformersEngine` has the surface the CLI, the trace writer and the GUI worker use on a
SpeculativeDecoder (run_config, rounds, start, generate, vocab_size, eos_token_id, k,
sampling, proposer naming), but the rounds come from the installed transformers'
`generate(assistant_model=...)` (kind "assisted") or `generate(prompt_lookup_num_tokens=...)`
(kind "lookup"), unchanged: the recorder only observes it (core/engines/hf_recorder.py).

generate() runs in a worker thread and hands each Round over through a one-slot channel,
so the consumer steps the run one round at a time (the loop waits while a round is not
taken) and closing the rounds() generator cancels the run after the round in progress (a
stopping criterion that turns true). Only one generate() computes at a time in a process,
and each keeps its own torch random state across the hand-overs, so two runs stepped in
turn (compare lanes) draw exactly what each would draw alone.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Generator, Sequence
from typing import Any

import torch
from transformers import StoppingCriteria

from specscope.core.decoder import normalize_prompt
from specscope.core.kv import model_vocab_size
from specscope.core.records import GenerationResult, Round, RunConfig
from specscope.core.run import RunHandle
from specscope.core.sampling import SamplingConfig

from .hf_private import check_private_api, install_candidate_hook
from .hf_recorder import RoundRecorder

KINDS = ("assisted", "lookup")
UNRECORDED = frozenset({"u", "draw"})  # transformers draws them inside its loop and keeps none
_COMPUTE = threading.Lock()  # one generate() computing at a time (see the module doc)


class TransformersEngine:
    """Records transformers' own speculative decoding of `target`.

    kind "assisted": candidates from `draft` (AssistedCandidateGenerator); `k` is the
    assistant's num_assistant_tokens, `schedule` its num_assistant_tokens_schedule and
    `confidence` its assistant_confidence_threshold (None: transformers' default).
    kind "lookup": prompt lookup (PromptLookupCandidateGenerator); `k` is
    prompt_lookup_num_tokens and `max_ngram` max_matching_ngram_size.
    """

    def __init__(self, target: torch.nn.Module, kind: str = "assisted", draft: torch.nn.Module | None = None,
                 k: int = 4, sampling: SamplingConfig | None = None, eos_token_id: int | None = None, seed: int = 0,
                 target_name: str = "", draft_name: str | None = None, max_ngram: int = 2,
                 schedule: str = "constant", confidence: float | None = None):
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
        self.eos_token_id = None if eos_token_id is None else int(eos_token_id)
        self.target_name = target_name or getattr(target.config, "_name_or_path", "") or type(target).__name__
        self.draft_name = draft_name if self.draft is not None else None
        self.use_cache = True  # transformers' assisted loop requires a cache

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
            out.update(num_assistant_tokens=self.k, num_assistant_tokens_schedule=self.schedule,
                       assistant_confidence_threshold=self._confidence())
        return out

    def _confidence(self) -> float | None:
        if self.confidence is not None:
            return float(self.confidence)
        return self.draft.generation_config.assistant_confidence_threshold if self.draft is not None else None

    # ------------------------------------------------------------------ the generate() call

    def generation_config(self, config: RunConfig) -> Any:
        """The GenerationConfig of a run: the sampler, budget and EOS of `config`, every other
        processor off (a checkpoint's own generation_config.json is not used)."""
        from transformers import GenerationConfig

        s = config.sampling
        eos = config.eos_token_id
        # generate() fills every None field from the model's own generation_config: "no EOS" is
        # -1 (transformers' documented "never stops at EOS"), and the processors are off explicitly
        options: dict[str, Any] = dict(max_new_tokens=config.max_new_tokens, eos_token_id=-1 if eos is None else eos,
                                       pad_token_id=0 if eos is None else eos, do_sample=not s.greedy, num_beams=1,
                                       min_length=0, repetition_penalty=1.0, no_repeat_ngram_size=0, typical_p=1.0,
                                       epsilon_cutoff=0.0, eta_cutoff=0.0, encoder_repetition_penalty=1.0)
        if not s.greedy:  # top_k=0 said explicitly: transformers' default is 50
            options.update(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)
        if self.kind == "lookup":
            options.update(prompt_lookup_num_tokens=self.k, max_matching_ngram_size=self.max_ngram)
        return GenerationConfig(**options)

    def _call_generate(self, config: RunConfig, stopping: Any = None) -> list[int]:
        """transformers' generate() for `config`, seeded with config.seed; the new tokens."""
        device = next(self.target.parameters()).device
        ids = torch.tensor([list(config.prompt_ids)], dtype=torch.long, device=device)
        kwargs: dict[str, Any] = dict(generation_config=self.generation_config(config),
                                      attention_mask=torch.ones_like(ids))
        if stopping is not None:
            from transformers import StoppingCriteriaList

            kwargs["stopping_criteria"] = StoppingCriteriaList([stopping])
        saved = None
        if self.draft is not None:
            kwargs["assistant_model"] = self.draft
            saved = _set_assistant(self.draft, self.k, self.schedule, self.confidence)
        torch.manual_seed(config.seed)
        try:
            with torch.inference_mode():
                out = self.target.generate(ids, **kwargs)
        finally:
            if saved is not None:
                _restore_assistant(self.draft, saved)
        return [int(t) for t in out[0, ids.shape[1]:].tolist()]

    def plain_generate(self, prompt_ids: Sequence[int] | torch.Tensor, max_new_tokens: int = 32,
                       seed: int | None = None) -> list[int]:
        """The same generate() call with nothing recorded: the reference a recorded run must equal."""
        config = self.run_config(prompt_ids, max_new_tokens, seed=seed)
        if config.max_new_tokens == 0:
            return []
        with _COMPUTE:
            return self._call_generate(config)

    # ------------------------------------------------------------------ the decoder surface

    def run_config(self, prompt_ids: Sequence[int] | torch.Tensor, max_new_tokens: int, run_id: str | None = None,
                   seed: int | None = None) -> RunConfig:
        ids = normalize_prompt(prompt_ids, self.vocab_size)
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        param = next(self.target.parameters())
        return RunConfig(
            run_id=run_id or uuid.uuid4().hex, prompt_ids=tuple(ids), max_new_tokens=int(max_new_tokens), k=self.k,
            sampling=self.sampling, seed=self.seed if seed is None else int(seed), eos_token_id=self.eos_token_id,
            proposer=self.name, proposer_params={"spec": self.spec, **self.params()}, target_name=self.target_name,
            draft_name=self.draft_name, device=str(param.device), dtype=str(param.dtype).removeprefix("torch."),
            vocab_size=self.vocab_size, use_cache=True, unrecorded=UNRECORDED,
        )

    def rounds(self, prompt_ids: Sequence[int] | torch.Tensor = (), max_new_tokens: int = 32, run_id: str | None = None,
               seed: int | None = None, config: RunConfig | None = None) -> Generator[Round, None, GenerationResult]:
        """Yield one Round per round of transformers' loop; return the GenerationResult.
        Closing the generator cancels the run after the round in progress."""
        config = config or self.run_config(prompt_ids, max_new_tokens, run_id, seed)
        started = time.perf_counter()
        channel = _Channel()
        thread = threading.Thread(target=self._produce, args=(config, channel), name="specscope-transformers",
                                  daemon=True)
        rounds: list[Round] = []
        new_tokens: list[int] = []
        if config.max_new_tokens > 0:
            thread.start()
        try:
            while thread.is_alive() or not channel.empty():
                item = channel.get()
                if item is _DONE:
                    break
                if isinstance(item, BaseException):
                    raise item
                rounds.append(item)
                new_tokens.extend(item.tokens)
                yield item
        finally:
            channel.cancel()
            if thread.is_alive():
                thread.join()
        stop = "eos" if rounds and rounds[-1].eos else "budget"
        return GenerationResult(config=config, new_tokens=new_tokens, rounds=rounds, stop_reason=stop,
                                wall_s=time.perf_counter() - started)

    def _produce(self, config: RunConfig, channel: "_Channel") -> None:
        recorder = RoundRecorder(config, self.target, self.draft, channel.put, greedy=config.sampling.greedy,
                                 lookup=self.kind == "lookup")
        channel.baton.take()
        undo = install_candidate_hook(self.target, recorder.wrap)
        recorder.attach()
        try:
            self._call_generate(config, stopping=_CancelCriterion(channel))
            recorder.finish()
            channel.put(_DONE)
        except BaseException as exc:  # handed to the consumer, raised there
            channel.put(exc)
        finally:
            recorder.detach()
            undo()
            channel.baton.give()

    def start(self, prompt_ids: Sequence[int] | torch.Tensor = (), max_new_tokens: int = 32, run_id: str | None = None,
              seed: int | None = None, config: RunConfig | None = None) -> RunHandle:
        config = config or self.run_config(prompt_ids, max_new_tokens, run_id, seed)
        return RunHandle(self.rounds(config=config), config)

    def generate(self, prompt_ids: Sequence[int] | torch.Tensor, max_new_tokens: int = 32, run_id: str | None = None,
                 seed: int | None = None) -> GenerationResult:
        return self.start(prompt_ids, max_new_tokens, run_id, seed).drain()


# ---------------------------------------------------------------------- hand-over


class _Baton:
    """The process-wide compute lock plus this run's torch random state: released (state
    saved) while the run waits for its consumer, taken back (state restored) after."""

    def __init__(self) -> None:
        self.state: Any = None
        self.held = False

    def take(self) -> None:
        _COMPUTE.acquire()
        self.held = True
        if self.state is not None:
            cpu, cuda = self.state
            torch.set_rng_state(cpu)
            if cuda is not None:
                torch.cuda.set_rng_state_all(cuda)

    def give(self) -> None:
        if not self.held:
            return
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        self.state = (torch.get_rng_state(), cuda)
        self.held = False
        _COMPUTE.release()


_DONE = object()


class _Channel:
    """One slot between the generate() thread and the consumer."""

    def __init__(self) -> None:
        self.slot: queue.Queue = queue.Queue(maxsize=1)
        self.cancelled = threading.Event()
        self.baton = _Baton()

    def put(self, item: Any) -> None:
        self.baton.give()
        try:
            while not self.cancelled.is_set():
                try:
                    self.slot.put(item, timeout=0.05)
                    return
                except queue.Full:
                    continue
        finally:
            self.baton.take()

    def get(self) -> Any:
        while True:
            try:
                return self.slot.get(timeout=0.05)
            except queue.Empty:
                if self.cancelled.is_set():
                    return _DONE

    def empty(self) -> bool:
        return self.slot.empty()

    def cancel(self) -> None:
        self.cancelled.set()


class _CancelCriterion(StoppingCriteria):
    """A stopping criterion that is false until the run is cancelled."""

    def __init__(self, channel: _Channel):
        self.channel = channel

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        return torch.full((input_ids.shape[0],), self.channel.cancelled.is_set(), dtype=torch.bool,
                          device=input_ids.device)


def _set_assistant(draft: torch.nn.Module, k: int, schedule: str, confidence: float | None) -> dict[str, Any]:
    """Set the assistant's draft length, schedule and confidence threshold for one call;
    return what they were (transformers reads them from the assistant's generation_config)."""
    gc = draft.generation_config
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
