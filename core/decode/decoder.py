"""The speculative decoder: a generator that yields one frozen Round per round.

One round, for every draft shape (a chain is the tree whose node i has parent i - 1):
draft (the proposer) -> one target forward over the pending context plus the draft, laid
out by the layout (core.decode.layout: a chain fed causally, a tree under a 4D mask) -> p
rows -> the verifier's verdict (accept/repair/bonus, core.verify) -> both caches keep the
accepted path (the layout and the target's cache policy; the proposer's keep_path and
observe) -> one Round record (a TreeRound for a tree). `_round` below is that sequence, top
to bottom. The seams are constructor arguments with defaults: the proposer (core.draft,
built from a spec by core.draft.registry), the verifier, the layout and the target's cache
policy (core.decode.kv); the fault zoo (core.faults) wraps them.

Target-cache contract: after every round the target cache holds the committed context
minus its last token(s), which stay pending and are fed first in the next verify
forward. The next forward therefore starts from the same logical prefix as a full
recompute, which the tests check at every round.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Generator, Sequence
from typing import Any, TypeGuard, cast

import numpy as np
import torch

from specscope.core.decode.allocator import tune_allocator
from specscope.core.decode.draft_length import (
    AUTO_K_MAX,
    CostPolicy,
    VerifyCost,
    is_auto,
    measure_verify_cost,
    target_forward_timer,
)
from specscope.core.decode.kv import CachedLM, CachePolicy, Stopwatch
from specscope.core.decode.layout import Layout, layout_for
from specscope.core.decode.run import RunHandle
from specscope.core.decode.stops import Stops, StopTracker
from specscope.core.decode.vectors import RoundVectors
from specscope.core.draft.proposers import Draft, Proposer, check_protocol, requested_features
from specscope.core.records import (
    CacheState,
    GenerationResult,
    Round,
    RoundTimings,
    RunConfig,
    RunSummary,
    SummaryTally,
)
from specscope.core.sampling.device import target_rows
from specscope.core.sampling.dists import DEFAULT_TOP_N, covering_top_n, keeps_full_vectors
from specscope.core.sampling.reference import SamplingConfig
from specscope.core.settings.bounds import BOUNDS
from specscope.core.settings.vocab import StopReason
from specscope.core.verify.chain import Verifier
from specscope.core.verify.coupling import Coupling, coupled_params

log = logging.getLogger(__name__)


def _is_int(value: object) -> TypeGuard[int | np.integer[Any]]:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _bounded(name: str, value: object, setting: str) -> int:
    """`value` as an int within the settings model's bound for `setting` (core.settings.bounds),
    else ValueError naming it: the decoder checks what the front ends checked, for any caller."""
    number = int(value) if _is_int(value) else value  # a numpy integer is taken as its value
    problem = BOUNDS[setting].problem(number)
    if problem is not None:
        raise ValueError(f"{name} {problem}")
    return int(cast(int, number))  # within its bound: an int


def target_position_limit(model: torch.nn.Module) -> int | None:
    """The most positions the target reads (its config's max_position_embeddings), for the
    RunConfig: the checker flags a round past it."""
    from specscope.core.loading.models import max_positions  # core.loading imports core.decode

    return max_positions(model)


def check_run_positions(
    prompt_len: int, max_new_tokens: int, models: Sequence[tuple[str | None, Any]], extra: int = 0, why: str = ""
) -> None:
    """ValueError (one line) when a run of `prompt_len` + `max_new_tokens` tokens (+ `extra`
    positions its verify forwards read past the budget, `why` says whose) passes the position
    limit (max_position_embeddings) of one of `models` ((name, model) pairs): the decoder and
    the transformers engine refuse such a run themselves, whoever made them (the front ends
    refuse it earlier, naming their flags: core.decode.factory.check_positions)."""
    from specscope.core.loading.models import max_positions  # core.loading imports core.decode

    needed = prompt_len + max_new_tokens + extra
    for name, model in models:
        limit = max_positions(model) if model is not None else None
        if limit is not None and needed > limit:
            raise ValueError(
                f"the prompt ({prompt_len} tokens) plus {max_new_tokens} new tokens{why} needs {needed} "
                f"positions, but {name} reads at most {limit} (max_position_embeddings)"
            )


def normalize_prompt(prompt_ids: Sequence[int] | torch.Tensor, vocab_size: int) -> list[int]:
    """Validate a prompt (list of ints or LongTensor of shape (n,) or (1, n))."""
    if isinstance(prompt_ids, torch.Tensor):
        if prompt_ids.dtype not in (torch.long, torch.int, torch.int16, torch.int8, torch.uint8):
            raise ValueError(f"prompt_ids must hold integer token ids, got dtype {prompt_ids.dtype}")
        if prompt_ids.ndim == 2 and prompt_ids.shape[0] == 1:
            prompt_ids = prompt_ids[0]
        if prompt_ids.ndim != 1:
            raise ValueError(f"prompt_ids must have shape (n,) or (1, n), got {tuple(prompt_ids.shape)}")
        ids = [int(t) for t in prompt_ids.tolist()]
    else:
        ids = list(prompt_ids)
        for pos, t in enumerate(ids):
            if not _is_int(t):
                raise ValueError(f"prompt_ids[{pos}] = {t!r} is not an integer token id")
        ids = [int(t) for t in ids]
    if not ids:
        raise ValueError("the prompt is empty: speculative decoding needs at least one token")
    for pos, t in enumerate(ids):
        if not 0 <= t < vocab_size:
            raise ValueError(f"prompt_ids[{pos}] = {t} is outside the vocabulary [0, {vocab_size})")
    return ids


class SpeculativeDecoder:
    """Exact speculative decoding of `target` with draft tokens from `proposer`.

    Greedy (temperature 0) output equals plain greedy decoding of the target; sampled
    output follows exactly the target's distribution after the sampling transforms.
    """

    def __init__(
        self,
        target: torch.nn.Module,
        proposer: Proposer,
        k: int | str = 4,
        sampling: SamplingConfig | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        seed: int = 0,
        use_cache: bool = True,
        target_name: str = "",
        verifier: Verifier | None = None,
        target_cache: CachePolicy | None = None,
        vectors: str = "auto",
        top_n: int = DEFAULT_TOP_N,
        coupling_seed: int | None = None,
        layout: Layout | None = None,
        stops: Stops | None = None,
        token_piece: Callable[[int], str] | None = None,
    ):
        """`k`: the draft length (a chain's tokens; a tree's spec sizes it), or "auto": each round's
        length (a tree's depth) chosen by measured cost and acceptance, up to AUTO_K_MAX
        (core.decode.draft_length; the run's config records k = AUTO_K_MAX and the policy).
        `vectors`: what each Round record carries of its full-vocabulary rows: "full"
        (float64 numpy vectors), "top" (a TopDistribution: the top-N entries, the drawn
        tokens' entries and the exact whole-vector facts, computed on the model's device)
        or "auto" (full up to core.sampling.dists.FULL_VECTORS_MAX_VOCAB tokens, top above).
        `top_n`: N of the top entries kept (raised to cover a top-k filter).
        `coupling_seed`: couple this decoder's randomness to output positions (core.verify.coupling:
        the CoupledVerifier, and a draft model proposing by the same Gumbel keys), so that
        decoders with the same seed emit the same tokens wherever their prefixes agree.
        `eos_token_id`: one id or several (every one ends the output). `stops`: stop strings
        and token sequences (core.decode.stops); stop strings need `token_piece` (the text
        each token adds, core.decode.stops.token_piece_function).

        The seams, each with its default: `verifier` (core.verify: the layout's, the
        CoupledVerifier when coupled), `target_cache` (core.decode.kv.CachePolicy) and
        `layout` (core.decode.layout: how a draft is laid out in the verify forward and kept
        in the cache; a tree for a proposer that drafts trees, else a chain)."""
        # the settings model's bounds (core.settings.bounds); `vectors` is checked by keeps_full_vectors
        self.auto_k = is_auto(k)  # the length chosen each round by cost (core.decode.draft_length)
        k = AUTO_K_MAX if self.auto_k else _bounded("k (draft length)", k, "k")
        seed = _bounded("seed", seed, "seed")
        self._verify_table: dict[int, float] | None = None  # auto: the target's measured forward times
        self._policy: CostPolicy | None = None  # auto: the run in progress's policy
        top_n = _bounded("top_n", top_n, "top_n")
        self.sampling = sampling if sampling is not None else SamplingConfig()
        if not isinstance(self.sampling, SamplingConfig):
            raise ValueError("sampling must be a SamplingConfig")
        self.target = target
        self.target_lm = CachedLM(target, use_cache=use_cache)
        self.vocab_size = self.target_lm.vocab_size
        self.eos_token_ids = _eos_ids(eos_token_id, self.vocab_size)
        self.stops = stops if stops is not None else Stops()
        if self.stops.strings and token_piece is None:
            raise ValueError("stop strings need token_piece (the text of each token): give the decoder a tokenizer")
        self.token_piece = token_piece
        self._tracker = StopTracker(Stops(), None)  # the run in progress's (rounds() makes one per run)
        check_protocol(proposer)
        self.proposer = proposer
        proposer.bind(self.vocab_size, use_cache)
        # a draft head's layers: the verify forward returns hidden states only when asked
        self.target_lm.hidden_layers = requested_features(proposer, target)
        self.coupling = None if coupling_seed is None else Coupling(coupling_seed)
        self.layout: Layout = layout if layout is not None else layout_for(proposer)
        default_verifier = self.layout.verifier(self.coupling)  # refuses a coupling it cannot verify
        self.verifier: Verifier = verifier if verifier is not None else default_verifier
        self.target_cache: CachePolicy = target_cache if target_cache is not None else CachePolicy()
        self.k = int(k)
        self.eos_token_id = self.eos_token_ids[0] if self.eos_token_ids else None
        self.seed = int(seed)
        self.use_cache = use_cache
        self.target_name = target_name or getattr(target.config, "_name_or_path", "") or type(target).__name__
        self.stopwatch = Stopwatch(self.target_lm.device)
        self.full_vectors = keeps_full_vectors(vectors, self.vocab_size)
        tune_allocator()  # reuse freed row-sized host memory (core.decode.allocator)
        self.top_n = covering_top_n(int(top_n), self.sampling.top_k)

    # ------------------------------------------------------------------ public API

    def keep_full_vectors(self) -> None:
        """From the next run on, every Round carries its rows as full float64 vectors (what
        a trace store that keeps them needs), whatever `vectors` said."""
        self.full_vectors = True

    def run_config(
        self,
        prompt_ids: Sequence[int] | torch.Tensor,
        max_new_tokens: int,
        run_id: str | None = None,
        seed: int | None = None,
    ) -> RunConfig:
        ids = normalize_prompt(prompt_ids, self.vocab_size)
        if seed is not None and not _is_int(seed):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        if not _is_int(max_new_tokens) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        draft = getattr(self.proposer, "model", None)
        check_run_positions(
            len(ids),
            int(max_new_tokens),
            [(self.target_name, self.target)]
            + ([(getattr(self.proposer, "label", "the draft"), draft)] if isinstance(draft, torch.nn.Module) else []),
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
            proposer=self.proposer.name,
            proposer_params={
                "spec": self.proposer.spec,
                **self.proposer.params(),
                **coupled_params(self.coupling, self.sampling.greedy),
                **self._k_policy_params(ids),
            },
            target_name=self.target_name,
            draft_name=self.proposer.label,
            device=str(param.device),
            dtype=str(param.dtype).removeprefix("torch."),
            vocab_size=self.vocab_size,
            use_cache=self.use_cache,
            eos_token_ids=self.eos_token_ids if len(self.eos_token_ids) > 1 else (),
            stop_strings=self.stops.strings,
            stop_ids=self.stops.sequences,
            position_limit=target_position_limit(self.target),
        )

    def rounds(
        self,
        prompt_ids: Sequence[int] | torch.Tensor,
        max_new_tokens: int = 32,
        run_id: str | None = None,
        seed: int | None = None,
        config: RunConfig | None = None,
        keep_rounds: bool = False,
    ) -> Generator[Round, None, GenerationResult]:
        """Yield one Round per speculative round; return the GenerationResult.

        `seed` overrides the decoder's seed for this run; `config` (from run_config())
        replaces prompt, budget, run id and seed. Closing the generator cancels the run
        after the round in progress. The generator keeps no round once it has yielded it
        (the result carries a running summary) unless `keep_rounds` asks it to.
        """
        config = config or self.run_config(prompt_ids, max_new_tokens, run_id, seed)
        context = list(config.prompt_ids)
        budget = config.max_new_tokens
        rng = np.random.default_rng(config.seed)
        self.target_lm.reset()
        self.proposer.reset()
        self.proposer.couple(self.coupling, len(context))  # a draft model proposes by the coupled keys (or not)
        new_tokens: list[int] = []
        rounds: list[Round] = []
        tally = SummaryTally()
        stop_reason: StopReason = "budget"
        started = time.perf_counter()
        self._tracker = StopTracker(Stops(config.stop_strings, config.stop_ids), self.token_piece)
        self._policy = self._new_policy(context) if self.auto_k or self.nodes_by_cost else None
        if self.nodes_by_cost:  # the tree's shape by cost, from this run's policy (ProposerBase.tree_policy)
            proposer: Any = self.proposer
            proposer.tree_policy = self._policy
        try:
            while len(new_tokens) < budget:
                rnd = self._round(config.run_id, tally.rounds, context, len(new_tokens), budget, rng)
                self._tracker.commit(rnd.tokens)
                tally.add(rnd)
                if keep_rounds:
                    rounds.append(rnd)
                new_tokens.extend(rnd.tokens)
                context.extend(rnd.tokens)
                yield rnd
                if rnd.eos or rnd.stop is not None:
                    stop_reason = "eos" if rnd.eos else "stop"
                    break
        except GeneratorExit:  # the consumer closed the generator: a cancel
            log.info("run %s cancelled after %d rounds", config.run_id, tally.rounds)
            raise
        return GenerationResult(
            config=config,
            new_tokens=new_tokens,
            rounds=rounds,
            stop_reason=stop_reason,
            wall_s=time.perf_counter() - started,
            tallied=tally.summary(),
        )

    def start(
        self,
        prompt_ids: Sequence[int] | torch.Tensor = (),
        max_new_tokens: int = 32,
        run_id: str | None = None,
        seed: int | None = None,
        config: RunConfig | None = None,
        keep_rounds: bool = False,
    ) -> RunHandle:
        """A run handle: iterate it for the rounds; `.result` once it has ended."""
        config = config or self.run_config(prompt_ids, max_new_tokens, run_id, seed)
        return RunHandle(self.rounds(prompt_ids, max_new_tokens, config=config, keep_rounds=keep_rounds), config)

    def generate(
        self,
        prompt_ids: Sequence[int] | torch.Tensor,
        max_new_tokens: int = 32,
        run_id: str | None = None,
        seed: int | None = None,
        keep_rounds: bool = True,
    ) -> GenerationResult:
        """Run to the end. The result keeps every Round unless `keep_rounds=False` (then only
        the tokens and the summary: what a long run needs)."""
        return self.start(prompt_ids, max_new_tokens, run_id, seed, keep_rounds=keep_rounds).drain()

    # ------------------------------------------------------------------ one round
    #
    # draft -> one target forward laid out by the layout -> p rows -> the verifier -> keep the
    # accepted path in both caches -> one Round. Every draft shape takes this path.

    def _round(  # long: the round's steps in order (draft, verify, decide, crop, record), one after another
        self, run_id: str, index: int, context: list[int], emitted_before: int, budget: int, rng: np.random.Generator
    ) -> Round:
        clock, lm, layout = self.stopwatch, self.target_lm, self.layout
        remaining = budget - emitted_before
        k = layout.draft_length(self.k, remaining)
        if self._policy is not None and self.nodes_by_cost:  # the depth (and width) a nodes=auto tree grows
            k = min(k, self._policy.tree_shape()[0])
        elif self._policy is not None:  # k="auto": this round's length (a tree's depth) by cost
            k = min(k, self._policy.choose())
        prefix_len = len(context)
        target_before = lm.processed

        t0 = clock.now()
        draft = self._draft(context, k, rng)
        t1 = clock.now()
        pending = self.target_cache.pending(lm, context)
        logits, placed = layout.forward(lm, pending, draft, prefix_len)  # (n + 1, V) float32, on the model's device
        target_peak = lm.processed
        t2 = clock.now()

        rows = target_rows(logits, self.sampling)  # checks the logits are finite
        q = None if draft.q is None else torch.as_tensor(draft.q, dtype=torch.float64).to(rows.p.device)
        task = layout.task(
            draft,
            q=q,
            p=rows.p,
            argmax=rows.argmax,
            greedy=self.sampling.greedy,
            eos_token_id=self.eos_token_id,
            more_eos=frozenset(self.eos_token_ids[1:]),
            stops=self._tracker if self._tracker.stops else None,
            remaining=remaining,
            position=emitted_before,
        )
        verdict = self.verifier.verify(task, rng)
        committed = prefix_len + len(verdict.path)  # context positions whose cache entries stay valid
        placed = layout.keep(lm, self.target_cache, prefix_len, verdict.path, draft, placed)
        self.proposer.keep_path(verdict.path)
        draft_after = self.proposer.observe(committed)
        if lm.hidden_layers:  # the features of the committed positions this forward fed, for the head
            kept = list(range(len(pending))) + [len(pending) + i for i in verdict.path]
            self.proposer.take_features(committed - len(kept), lm.take_features(kept))
        final_context = context + [e.token for e in verdict.emitted]
        target_cache = cache_state(target_before, target_peak, lm.processed, final_context)
        draft_cache = None
        if draft.cache_before is not None and draft_after is not None:
            peak = draft.cache_peak if draft.cache_peak is not None else draft.cache_before
            draft_cache = cache_state(draft.cache_before, peak, draft_after, final_context)
        vectors = RoundVectors(
            task,
            verdict,
            draft.parents,
            self.full_vectors,
            self.top_n,
            self.sampling.sparse_rows,
            draft.q_facts,
            rows.facts,
            walk_facts=layout.walk_facts,
        )
        t3 = clock.now()
        if self._policy is not None:  # the round's costs and acceptance (a prompt-reading round: acceptance only)
            n = len(pending) + len(draft.tokens)
            self._policy.observe(
                draft.parents, len(verdict.path), t1 - t0, t2 - t1, n, costs=target_before > 0, path=verdict.path
            )

        fields = dict(
            run_id=run_id,
            index=index,
            prefix_len=prefix_len,
            emitted_before=emitted_before,
            remaining_budget=remaining,
            k=k,
            greedy=task.greedy,
            nodes=vectors.nodes(draft.confidence),
            bonus_p=vectors.bonus_p,
            rejected_node=verdict.rejected_node,
            residual=vectors.residual,
            residual_mass=verdict.residual_mass,
            emitted=tuple(verdict.emitted),
            eos=verdict.eos,
            stop=verdict.stop,
            pieces=self._tracker.pieces([e.token for e in verdict.emitted]),
            budget_stop=emitted_before + len(verdict.emitted) >= budget,
            bonus_withheld=verdict.bonus_withheld,
            target_cache=target_cache,
            draft_cache=draft_cache,
            timings=RoundTimings(draft_s=t1 - t0, verify_s=t2 - t1, bookkeeping_s=t3 - t2),
            draft_forwards=draft.forwards,
            target_forwards=1,
        )
        return layout.record(fields, task, verdict, vectors, placed)

    # ------------------------------------------------------------------ k = "auto"

    def _verify_cost_table(self, prompt: Sequence[int]) -> dict[int, float]:
        """The target's forward time over 1..N positions (N: the deepest chain's, or a tree's
        node cap + 1, at most 65), measured once per decoder with a few warm forwards after the prompt."""
        if self._verify_table is None:
            tree = self.proposer.tree
            most = self.k + 1 if tree is None else min(65, int(getattr(tree, "nodes", 64)) + 1)  # its node cap
            timer = target_forward_timer(self.target, prompt, self.use_cache)
            self._verify_table = measure_verify_cost(timer, most)
        return self._verify_table

    @property
    def nodes_by_cost(self) -> bool:
        """A dynamic tree with nodes=auto: each round's kept node count chosen by cost."""
        return bool(getattr(self.proposer.tree, "nodes_by_cost", False))

    def _k_policy_params(self, prompt: Sequence[int]) -> dict[str, Any]:
        """What a run's config records of an auto k (the policy, its cap) or an auto tree width,
        and the measured table both read."""
        if not (self.auto_k or self.nodes_by_cost):
            return {}
        table = self._verify_cost_table(prompt)
        policy = {"k_policy": "auto", "k_max": self.k} if self.auto_k else {}
        if self.nodes_by_cost:
            policy["tree_nodes"] = "auto"
        return {**policy, "verify_ms": {str(n): round(s * 1e3, 4) for n, s in table.items()}}

    def _new_policy(self, prompt: Sequence[int]) -> CostPolicy:
        tree = self.proposer.tree
        depth = self.k if tree is None else min(self.k, int(getattr(tree, "depth", self.k)))  # a tree: its own depth
        width = int(getattr(tree, "topk", 1)) if self.nodes_by_cost else 1  # nodes=auto: its width too
        return CostPolicy(depth, VerifyCost(self._verify_cost_table(prompt)), tree=tree is not None, max_width=width)

    def _draft(self, context: list[int], k: int, rng: np.random.Generator) -> Draft:
        draft = self.proposer.propose(context, k, self.sampling, rng)
        try:
            self.layout.check(draft, k)
        except ValueError as exc:
            raise ValueError(f"proposer {self.proposer.name!r} {exc}") from None
        for t in draft.tokens:
            if not 0 <= t < self.vocab_size:
                raise ValueError(f"proposer {self.proposer.name!r} proposed token {t} outside the vocabulary")
        return draft


def _eos_ids(eos: int | Sequence[int] | None, vocab_size: int) -> tuple[int, ...]:
    """The run's EOS ids, in order, without repeats; ValueError for an id outside the vocabulary."""
    ids: list[Any] = [] if eos is None else [eos] if not isinstance(eos, (list, tuple, set, frozenset)) else list(eos)
    for t in ids:
        if not _is_int(t) or not 0 <= t < vocab_size:
            raise ValueError(f"eos_token_id must be None or token ids in [0, {vocab_size}), got {eos!r}")
    return tuple(dict.fromkeys(int(t) for t in ids))


def cache_state(before: int, peak: int, after: int, final_context: list[int]) -> CacheState:
    return CacheState(before=before, peak=peak, after=after, pending=tuple(final_context[after:]))


def summarize(result: GenerationResult) -> dict[str, Any]:
    """The JSON-friendly run summary printed by `specscope run --json`."""
    s: RunSummary = result.summary
    return {
        "run_id": result.config.run_id,
        "new_tokens": result.new_tokens,
        "rounds": s.rounds,
        "mean_accepted_length": s.mean_accepted_length,
        "acceptance_rate": s.acceptance_rate,
        "target_forward_passes": s.target_forward_passes,
        "draft_forward_passes": s.draft_forward_passes,
        "wall_s": result.wall_s,
        "draft_s": s.draft_s,
        "verify_s": s.verify_s,
        "bookkeeping_s": s.bookkeeping_s,
        "stop_reason": result.stop_reason,
    }
