"""The speculative decoder: a generator that yields one frozen Round per round.

One round = draft (proposer) -> verify (one target forward over the pending context plus
the draft) -> accept/repair/bonus (the verifier) -> crop both caches to the accepted prefix
(the target's cache policy, the proposer's observe) -> one Round record. `_round` below is
that sequence, top to bottom. The seams are objects the decoder is given: the proposer
(core.proposers, built from a spec by core.registry), the verifier (core.verify) and the
target's cache policy (core.kv); the fault zoo (core.faults) wraps them.

Target-cache contract: after every round the target cache holds the committed context
minus its last token(s), which stay pending and are fed first in the next verify
forward. The next forward therefore starts from the same logical prefix as a full
recompute, which the tests check at every round.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Generator, Sequence

import numpy as np
import torch

from specscope.core.verify.coupling import Coupling, CoupledVerifier, coupled_params
from specscope.core.decode.allocator import tune_allocator
from specscope.core.sampling.device import target_rows
from specscope.core.sampling.dists import DEFAULT_TOP_N, RowFacts, compact_rows, covering_top_n, host_rows, keeps_full_vectors, sparse_entries
from specscope.core.decode.kv import CachedLM, CachePolicy, Stopwatch
from specscope.core.draft.proposers import Draft, Proposer, check_protocol
from specscope.core.records import (
    CacheState,
    DraftNode,
    GenerationResult,
    Round,
    RoundTimings,
    RunConfig,
    RunSummary,
    SummaryTally,
)
from specscope.core.decode.run import RunHandle
from specscope.core.sampling.reference import SamplingConfig
from specscope.core.decode.tree_decode import is_tree_proposer, tree_round
from specscope.core.verify.chain import ChainVerifier, Verdict, Verifier, VerifyTask

log = logging.getLogger(__name__)


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


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
        k: int = 4,
        sampling: SamplingConfig | None = None,
        eos_token_id: int | None = None,
        seed: int = 0,
        use_cache: bool = True,
        target_name: str = "",
        verifier: Verifier | None = None,
        target_cache: CachePolicy | None = None,
        vectors: str = "auto",
        top_n: int = DEFAULT_TOP_N,
        coupling_seed: int | None = None,
    ):
        """`vectors`: what each Round record carries of its full-vocabulary rows: "full"
        (float64 numpy vectors), "top" (a TopDistribution: the top-N entries, the drawn
        tokens' entries and the exact whole-vector facts, computed on the model's device)
        or "auto" (full up to core.dists.FULL_VECTORS_MAX_VOCAB tokens, top above).
        `top_n`: N of the top entries kept (raised to cover a top-k filter).
        `coupling_seed`: couple this decoder's randomness to output positions (core.coupling:
        the CoupledVerifier, and a draft model proposing by the same Gumbel keys), so that
        decoders with the same seed emit the same tokens wherever their prefixes agree."""
        if not _is_int(k) or k < 1:
            raise ValueError(f"k (draft length) must be an integer >= 1, got {k!r}")
        if not _is_int(seed):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        self.sampling = sampling if sampling is not None else SamplingConfig()
        if not isinstance(self.sampling, SamplingConfig):
            raise ValueError("sampling must be a SamplingConfig")
        self.target = target
        self.target_lm = CachedLM(target, use_cache=use_cache)
        self.vocab_size = self.target_lm.vocab_size
        if eos_token_id is not None and (not _is_int(eos_token_id) or not 0 <= eos_token_id < self.vocab_size):
            raise ValueError(f"eos_token_id must be None or a token id in [0, {self.vocab_size}), got {eos_token_id!r}")
        check_protocol(proposer)
        self.proposer = proposer
        proposer.bind(self.vocab_size, use_cache)
        self.coupling = None if coupling_seed is None else Coupling(coupling_seed)
        if self.coupling is not None and is_tree_proposer(proposer):
            raise ValueError("coupled lanes verify chain drafts only; a tree proposer cannot be coupled")
        if verifier is None:
            verifier = ChainVerifier() if self.coupling is None else CoupledVerifier(self.coupling)
        self.verifier: Verifier = verifier
        self.target_cache: CachePolicy = target_cache if target_cache is not None else CachePolicy()
        self.k = int(k)
        self.eos_token_id = None if eos_token_id is None else int(eos_token_id)
        self.seed = int(seed)
        self.use_cache = use_cache
        self.target_name = target_name or getattr(target.config, "_name_or_path", "") or type(target).__name__
        self.stopwatch = Stopwatch(self.target_lm.device)
        if not _is_int(top_n) or top_n < 1:
            raise ValueError(f"top_n must be an integer >= 1, got {top_n!r}")
        self.full_vectors = keeps_full_vectors(vectors, self.vocab_size)
        tune_allocator()  # reuse freed row-sized host memory (core.allocator)
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
            proposer_params={"spec": self.proposer.spec, **self.proposer.params(),
                             **coupled_params(self.coupling, self.sampling.greedy)},
            target_name=self.target_name,
            draft_name=getattr(self.proposer, "label", None),
            device=str(param.device),
            dtype=str(param.dtype).removeprefix("torch."),
            vocab_size=self.vocab_size,
            use_cache=self.use_cache,
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
        if hasattr(self.proposer, "couple"):  # a draft model proposes by the coupled keys (or not, when None)
            self.proposer.couple(self.coupling, len(context))
        new_tokens: list[int] = []
        rounds: list[Round] = []
        tally = SummaryTally()
        stop_reason = "budget"
        started = time.perf_counter()
        try:
            while len(new_tokens) < budget:
                rnd = self._round(config.run_id, tally.rounds, context, len(new_tokens), budget, rng)
                tally.add(rnd)
                if keep_rounds:
                    rounds.append(rnd)
                new_tokens.extend(rnd.tokens)
                context.extend(rnd.tokens)
                yield rnd
                if rnd.eos:
                    stop_reason = "eos"
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
    # draft -> one target forward -> p rows -> verifier -> crop both caches -> record.

    def _round(self, run_id: str, index: int, context: list[int], emitted_before: int, budget: int,
               rng: np.random.Generator) -> Round:
        if is_tree_proposer(self.proposer):  # a token tree: one masked target forward, the tree walk
            return tree_round(self, run_id, index, context, emitted_before, budget, rng)
        clock = self.stopwatch
        remaining = budget - emitted_before
        k = min(self.k, remaining)
        prefix_len = len(context)
        target_before = self.target_lm.processed

        t0 = clock.now()
        draft = self._draft(context, k, rng)
        t1 = clock.now()
        logits = self._verify_forward(context, draft)  # (n + 1, V) float32, on the model's device
        target_peak = self.target_lm.processed
        t2 = clock.now()

        rows = target_rows(logits, self.sampling)  # checks the logits are finite
        p = rows.p
        task = VerifyTask(
            tokens=draft.tokens,
            q=None if draft.q is None else torch.as_tensor(draft.q, dtype=torch.float64).to(p.device),
            p=p,
            argmax=rows.argmax,
            greedy=self.sampling.greedy,
            eos_token_id=self.eos_token_id,
            remaining=remaining,
            position=emitted_before,
        )
        verdict = self.verifier.verify(task, rng)
        committed = prefix_len + verdict.accepted  # context positions whose cache entries stay valid
        self.target_cache.crop(self.target_lm, committed)
        draft_after = self.proposer.observe(committed)
        final_context = context + [e.token for e in verdict.emitted]
        target_cache = _cache_state(target_before, target_peak, self.target_lm.processed, final_context)
        draft_cache = None
        if draft.cache_before is not None and draft_after is not None:
            peak = draft.cache_peak if draft.cache_peak is not None else draft.cache_before
            draft_cache = _cache_state(draft.cache_before, peak, draft_after, final_context)
        vectors = _RoundVectors(task, verdict, self.full_vectors, self.top_n, self.sampling.sparse_rows, draft.q_facts,
                                rows.facts)
        t3 = clock.now()

        return Round(
            run_id=run_id,
            index=index,
            prefix_len=prefix_len,
            emitted_before=emitted_before,
            remaining_budget=remaining,
            k=k,
            greedy=task.greedy,
            nodes=vectors.nodes(draft.parents),
            bonus_p=vectors.bonus_p,
            rejected_node=verdict.rejected_node,
            residual=vectors.residual,
            residual_mass=verdict.residual_mass,
            emitted=tuple(verdict.emitted),
            eos=verdict.eos,
            budget_stop=emitted_before + len(verdict.emitted) >= budget,
            bonus_withheld=verdict.bonus_withheld,
            target_cache=target_cache,
            draft_cache=draft_cache,
            timings=RoundTimings(draft_s=t1 - t0, verify_s=t2 - t1, bookkeeping_s=t3 - t2),
            draft_forwards=draft.forwards,
            target_forwards=1,
        )

    def _draft(self, context: list[int], k: int, rng: np.random.Generator) -> Draft:
        draft = self.proposer.propose(context, k, self.sampling, rng)
        if not draft.is_chain:
            raise NotImplementedError("tree drafts need tree attention in the verifier; only chains are verified")
        if len(draft.tokens) > k:
            raise ValueError(f"proposer {self.proposer.name!r} returned {len(draft.tokens)} tokens for k={k}")
        for t in draft.tokens:
            if not 0 <= t < self.vocab_size:
                raise ValueError(f"proposer {self.proposer.name!r} proposed token {t} outside the vocabulary")
        return draft

    def _verify_forward(self, context: list[int], draft: Draft) -> torch.Tensor:
        """One target forward over the pending context + the draft; logits for n + 1 positions
        (kept on the model's device: only what the record needs comes to the host)."""
        fed = self.target_cache.pending(self.target_lm, context) + list(draft.tokens)
        return self.target_lm.feed(fed, keep=len(draft.tokens) + 1)


def _cache_state(before: int, peak: int, after: int, final_context: list[int]) -> CacheState:
    return CacheState(before=before, peak=peak, after=after, pending=tuple(final_context[after:]))


class _RoundVectors:
    """What the Round record keeps of the round's device rows (p for every node and the
    bonus position, q per node, the residual): the full vectors on the host, or their
    TopDistributions with the drawn tokens' entries; plus each node's scalars (p(x), q(x),
    sum min(p, q)), computed on the device and moved to the host together."""

    def __init__(self, task: VerifyTask, verdict: Verdict, full: bool, top_n: int, sparse: bool = False,
                 q_facts: RowFacts | None = None, p_facts: RowFacts | None = None):
        self.task, self.verdict = task, verdict
        n = len(task.tokens)
        p, q = task.p, task.q
        residual = verdict.residual
        if isinstance(residual, np.ndarray):  # a verifier that decided on the host
            residual = torch.as_tensor(residual, dtype=torch.float64, device=p.device)
        blocks = [p] + ([q] if q is not None else []) + ([residual.reshape(1, -1)] if residual is not None else [])
        extra = self._extra_ids(n, q is not None, residual is not None)
        # `sparse` (SamplingConfig.sparse_rows): every row (p, q, the residual) has about top-k nonzeros
        # q's nonzero entries, when sparse: for its record and for sum min(p, q) (core.row_ops)
        self.q_entries = sparse_entries(q, q_facts) if sparse and q is not None else None
        facts = [p_facts] + ([q_facts] if q is not None else []) + ([None] if residual is not None else [])
        entries = [None] + ([self.q_entries] if q is not None else []) + ([None] if residual is not None else [])
        kept: list = []
        for block, known, found in zip(blocks, facts, entries):  # block by block: no copy of the rows into one tensor
            if full:
                kept.extend(host_rows(block))
            else:
                kept.extend(compact_rows(block, top_n, extra[len(kept) : len(kept) + block.shape[0]], sparse=sparse,
                                         facts=known, entries=found))
        self.p_rows = kept[: n + 1]
        self.q_rows = kept[n + 1 : 2 * n + 1] if q is not None else None
        self.residual = kept[-1] if residual is not None else None
        all_accepted = verdict.rejected_node is None and not verdict.eos
        self.bonus_p = self.p_rows[n] if all_accepted else None
        self.scalars = self._node_scalars(n)

    def _extra_ids(self, n: int, has_q: bool, has_residual: bool) -> list[list[int]]:
        """Entries each row keeps besides its top-N: the proposed token (p and q rows), the
        target's argmax, the token drawn from the row (bonus, repair)."""
        task, verdict = self.task, self.verdict
        tokens, argmax = list(task.tokens), [int(a) for a in task.argmax]
        bonus = verdict.emitted[-1].token if verdict.emitted and verdict.emitted[-1].kind == "bonus" else None
        p_extra = [[tokens[i], argmax[i]] for i in range(n)] + [[argmax[n]] + ([bonus] if bonus is not None else [])]
        q_extra = [[t] for t in tokens] if has_q else []
        repair = verdict.emitted[-1].token if verdict.emitted and verdict.emitted[-1].kind == "repaired" else 0
        return p_extra + q_extra + ([[repair]] if has_residual else [])

    def _node_scalars(self, n: int) -> np.ndarray:
        """(n, 3) host array: p(x), q(x) (NaN without q), sum min(p, q) (NaN without q)."""
        task = self.task
        if n == 0:
            return np.zeros((0, 3))
        p = task.p[:n]
        index = torch.as_tensor(list(task.tokens), dtype=torch.long, device=p.device).view(-1, 1)
        p_tok = torch.gather(p, 1, index).flatten()
        if task.q is None:
            nan = torch.full_like(p_tok, float("nan"))
            return torch.stack([p_tok, nan, nan], dim=1).cpu().numpy()
        q_tok = torch.gather(task.q, 1, index).flatten()
        if self.q_entries is not None:  # sparse q: min(p, q) is 0 off q's nonzero entries
            row_t, ids_t = self.q_entries
            both = torch.minimum(p[row_t, ids_t], task.q[row_t, ids_t])
            overlap = torch.zeros(n, dtype=p.dtype, device=p.device).index_add_(0, row_t, both)
        else:  # row by row: each row's minimum stays in cache for its sum (q's rows are cold by now)
            overlap = torch.stack([torch.minimum(p[i], task.q[i]).sum() for i in range(n)])
        return torch.stack([p_tok, q_tok, overlap], dim=1).cpu().numpy()

    def nodes(self, parents: tuple[int, ...]) -> tuple[DraftNode, ...]:
        """The draft as recorded: each node with p, q, the decision and the checker's scalars."""
        task, verdict = self.task, self.verdict
        out = []
        for i, token in enumerate(task.tokens):
            p_token, q_token, overlap = (float(x) for x in self.scalars[i])
            has_q = self.q_rows is not None
            out.append(
                DraftNode(
                    index=i,
                    token=token,
                    parent=parents[i],
                    depth=i + 1,
                    p=self.p_rows[i],
                    q=self.q_rows[i] if has_q else None,
                    status=verdict.statuses[i],
                    u=verdict.draws[i],
                    p_token=p_token,
                    q_token=q_token if has_q else None,
                    ratio=(p_token / q_token) if has_q and q_token else None,
                    overlap=overlap if has_q else None,
                    target_argmax=int(task.argmax[i]),
                )
            )
        return tuple(out)


def summarize(result: GenerationResult) -> dict:
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
