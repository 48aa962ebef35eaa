"""Proposers: where draft tokens come from.

The interface has two main methods, as in transformers' candidate generators:
`propose(context, k, ...)` returns a Draft (a tree; chains are the degenerate case), and
`observe(committed_len)` tells the proposer how much of the context it saw is still valid
after verification, so it can crop whatever state it keeps. A proposer that drafts trees
says so by its `tree` (the decoder lays its drafts out as trees: core.decode.layout) and
keeps the accepted branch in `keep_path`; `ProposerBase` gives a chain proposer's defaults.

A draft head (core.draft.heads) reads the target's hidden states: it names the layers it
needs in `target_features(target)` (called once by the decoder; the default asks for none,
so the target's forward returns no hidden states), and after each round the decoder hands
it the accepted path's features through `take_features`: from the verify forward the round
runs anyway, never from a second target pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from specscope.core.decode.kv import CachedLM, CachePolicy
from specscope.core.draft.ngram_index import NgramIndex, check_ngram_range
from specscope.core.draft.tree_draft import ModelGrowth, TreePolicy, finish, grow_dynamic, grow_static
from specscope.core.draft.tree_draft import keep_path as keep_tree_path
from specscope.core.draft.trees import tree_options
from specscope.core.sampling.device import draft_distribution, row_confidence, sample_from_torch
from specscope.core.sampling.dists import RowFacts
from specscope.core.sampling.kept_rows import applies, draw_kept, kept_row
from specscope.core.sampling.reference import SamplingConfig
from specscope.core.sampling.row_ops import fast_rows, row_argmax


@dataclass(frozen=True, eq=False)
class Draft:
    tokens: tuple[int, ...]
    parents: tuple[int, ...]  # parent node index, -1 = the committed prefix
    q: torch.Tensor | np.ndarray | None  # (n, V) float64 proposal distributions; None when greedy
    forwards: int = 0  # draft model forward passes spent
    cache_before: int | None = None
    cache_peak: int | None = None
    sample_draws: tuple[float, ...] = field(default=())  # uniforms used to sample each token
    children: str | None = None  # tree drafts: how siblings were chosen (core.verify.tree); None for chains
    q_facts: RowFacts | None = None  # q's whole-row facts, taken while each row was in cache (or None)
    # per token, the proposer's own probability for it from its untransformed softmax
    # (temperature 1), in greedy runs too; None when the proposer has none (prompt lookup)
    confidence: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if len(self.parents) != len(self.tokens):
            raise ValueError("a draft needs one parent per token")
        if self.q is not None and self.q.shape[0] != len(self.tokens):
            raise ValueError("a draft needs one q row per token")
        if self.confidence is not None and len(self.confidence) != len(self.tokens):
            raise ValueError("a draft needs one confidence per token")

    @property
    def is_chain(self) -> bool:
        return all(parent == i - 1 for i, parent in enumerate(self.parents))


class Proposer(Protocol):
    """What the decoder needs from a source of draft tokens.

    `name` is the kind ("draft", "lookup"); `spec` the registry spec it was built from
    (what a trace records); `label` names its model, if any.
    """

    name: str
    spec: str
    label: str | None
    tree: Any  # the tree spec it drafts (core.draft.trees), None for a chain proposer

    def bind(self, vocab_size: int, use_cache: bool) -> None:
        """Called once by the decoder: check (or adopt) the target's vocabulary width and
        follow its cache setting. Raises ValueError when the proposer cannot serve it."""
        ...

    def reset(self) -> None: ...

    def propose(self, context: Sequence[int], k: int, sampling: SamplingConfig, rng: np.random.Generator) -> Draft: ...

    def keep_path(self, path: Sequence[int]) -> None:
        """After verification, before observe: the accepted nodes, from the prefix down (a
        tree proposer keeps that branch of its state)."""
        ...

    def observe(self, committed_len: int) -> int | None:
        """Crop state to the first committed_len context tokens; return the cache length."""
        ...

    def couple(self, coupling: Any, prompt_len: int) -> None:
        """At the start of a run: the coupling (core.verify.coupling) a sampling proposer draws
        by, or None."""
        ...

    def params(self) -> dict[str, Any]: ...

    @property
    def cache_length(self) -> int | None: ...

    # Optional (ProposerBase has the defaults): the target's hidden states a head reads.

    def target_features(self, target: torch.nn.Module) -> tuple[int, ...]:
        """Called once by the decoder with the target model: the indices into its
        `output_hidden_states` (0 = the embeddings' output, i = the output of layer i - 1 =
        the input of layer i, L = the last layer's output after the final norm) whose
        features the proposer reads; () for none. Raises TargetMismatch for a target it
        cannot serve."""
        ...

    def take_features(self, first_position: int, features: torch.Tensor) -> None:
        """After each round (the prefill too), when target_features named layers: the
        (n, layers, H) features of context positions first_position .. first_position + n - 1,
        the positions this round's verify forward committed (pending tokens and the accepted
        path; a rejected node's features are never handed over)."""
        ...


class TargetMismatch(ValueError):
    """A proposer that cannot serve this target (a head trained for another hidden size or
    vocabulary); the message is one line that says why."""


PROTOCOL_MEMBERS = ("name", "spec", "bind", "reset", "propose", "observe", "params", "tree", "keep_path", "couple")


class ProposerBase:
    """A chain proposer's defaults for the protocol's optional parts: no tree, nothing to
    keep of a path beyond what observe crops, nothing drawn by a coupling, no cache."""

    label: str | None = None
    tree: Any = None
    # a dynamic tree with nodes=auto: its width and kept count each round (the decoder sets it per run)
    tree_policy: TreePolicy | None = None

    def keep_path(self, path: Sequence[int]) -> None:
        return None

    def couple(self, coupling: Any, prompt_len: int) -> None:
        return None

    @property
    def cache_length(self) -> int | None:
        return None

    def target_features(self, target: torch.nn.Module) -> tuple[int, ...]:
        return ()

    def take_features(self, first_position: int, features: torch.Tensor) -> None:
        return None


def requested_features(proposer: object, target: Any) -> tuple[int, ...]:  # target: a transformers model
    """The hidden-state indices a proposer reads from the target (an object without
    `target_features`, written before the seam, reads none), checked against the target's
    layer count."""
    ask = getattr(proposer, "target_features", None)
    layers = tuple(int(i) for i in ask(target)) if ask is not None else ()
    if not layers:
        return ()
    if not hasattr(proposer, "take_features"):
        raise TypeError(f"{type(proposer).__name__} asks for the target's features but has no take_features method")
    count = int(target.config.get_text_config().num_hidden_layers)
    bad = [i for i in layers if not 0 <= i <= count]
    if bad:
        raise TargetMismatch(
            f"the proposer asks for hidden states {bad} of a target with {count} layers "
            f"(indices 0..{count}: 0 = embeddings, {count} = the last layer after the final norm)"
        )
    return layers


def check_protocol(proposer: object) -> None:
    """A clear error for an object that is not a Proposer (instead of an AttributeError later)."""
    missing = [m for m in PROTOCOL_MEMBERS if not hasattr(proposer, m)]
    if missing:
        raise TypeError(
            f"{type(proposer).__name__} is not a specscope Proposer: it lacks {', '.join(missing)} "
            "(see specscope.core.draft.proposers.Proposer; ProposerBase has the defaults of a chain proposer)"
        )


def chain_parents(n: int) -> tuple[int, ...]:
    return tuple(range(-1, n - 1))


# One draft token from one row of logits: (token, the q it was drawn from, the uniform), and
# optionally a fourth item, q's core.sampling.kept_rows.KeptRow when the step has it (its nonzero
# entries: then the proposer need not look for them). `out`, when given, is a float64 row
# the step may write q into (the proposer's row for it).
SampleStep = Callable[..., tuple[Any, ...]]


def sample_token(
    logits: torch.Tensor, sampling: SamplingConfig, rng: np.random.Generator, out: torch.Tensor | None = None
) -> tuple[Any, ...]:
    """Greedy: the argmax (no q). Sampling: q = the processed distribution (float64, on the
    draft's device; in `out` when given), one inverse-CDF draw. A top-k row on the CPU
    comes as its kept entries too (core.sampling.kept_rows: a fourth item)."""
    if sampling.greedy:
        if not bool(torch.isfinite(logits).all()):
            raise ValueError("the draft model produced non-finite logits; refusing to propose")
        return int(row_argmax(logits)), None, None
    kept = kept_row(logits, sampling) if applies(logits, sampling) else None
    if kept is not None:
        u = float(rng.random())
        return draw_kept(kept, u), kept.dense(out), u, kept
    q = draft_distribution(logits, sampling, out)
    u = float(rng.random())
    return sample_from_torch(q, u), q, u


def _all_finite(rows: list[torch.Tensor]) -> bool:
    """Whether every logit of the rows is finite, in one device sync. At large vocabularies on
    the CPU one sum per row (a NaN or inf makes it non-finite; a finite row can overflow its
    sum, hence the full look only then) instead of a copy of every row."""
    if fast_rows(rows[0]) and bool(torch.isfinite(torch.stack([row.sum() for row in rows])).all()):
        return True
    return bool(torch.isfinite(torch.stack(rows)).all())


def token_confidence(logits: torch.Tensor, token: int | torch.Tensor) -> torch.Tensor:
    """The proposer's own probability for `token` under the untransformed softmax of its
    logits row (temperature 1, no top-k/top-p): a float64 device scalar
    (core.sampling.device.row_confidence)."""
    return row_confidence(logits, token)


class DraftModelProposer(ProposerBase):
    """A small causal LM drafting k tokens autoregressively with its own KV cache."""

    name = "draft"

    def __init__(
        self,
        draft_model: torch.nn.Module,
        label: str | None = None,
        cache: CachePolicy | None = None,
        sample_step: SampleStep | None = None,
        tree: str | None = None,
        children: str = "topk",
    ):
        """`cache` (how the draft cache follows the context) and `sample_step` (how one token
        and its q come from a row of logits) are seams for the fault zoo; leave them None.
        `tree` (a core.draft.trees spec, e.g. "3,2,1" or "dynamic:nodes=16,depth=5,topk=4") drafts a
        token tree instead of a chain, its siblings chosen by `children` ("topk", "sampled"
        i.i.d. or "distinct" without replacement); see core.draft.tree_draft."""
        self.model = draft_model
        self.label = label or getattr(draft_model.config, "_name_or_path", "") or type(draft_model).__name__
        self.tree, self.children = tree_options(tree, children)
        self.spec = f"draft:{self.label}" + (f",tree={self.tree},children={self.children}" if self.tree else "")
        self._tree_rows: dict[int, int] = {}
        self._tree_prefix = 0
        self.lm = CachedLM(draft_model)
        self.cache = cache if cache is not None else CachePolicy()
        self.sample_step: SampleStep = sample_step if sample_step is not None else sample_token
        self.coupling: Any = None  # core.verify.coupling.Coupling while a coupled run proposes
        self._prompt_len = 0

    def couple(self, coupling: Any, prompt_len: int) -> None:
        """Called by the decoder at the start of a run: with a Coupling, draw each sampled
        draft token as the Gumbel argmax of q with the keys of its output position
        (core.verify.coupling), an exact sample from q; with None, sample from the run's stream."""
        if coupling is not None and self.tree is not None:
            raise ValueError("coupled lanes verify chain drafts only; a tree proposer cannot be coupled")
        self.coupling, self._prompt_len = coupling, int(prompt_len)

    def _coupled_step(self, position: int) -> SampleStep:
        def step(
            logits: torch.Tensor, sampling: SamplingConfig, rng: np.random.Generator, out: torch.Tensor | None = None
        ) -> tuple[Any, ...]:
            q = draft_distribution(logits, sampling, out)
            return self.coupling.pick(q, position), q, None

        return step

    @property
    def vocab_size(self) -> int:
        return self.lm.vocab_size

    def bind(self, vocab_size: int, use_cache: bool) -> None:
        if self.vocab_size != vocab_size:
            raise ValueError(
                f"target and draft vocabularies differ: the target's logits have {vocab_size} "
                f"entries, the draft's {self.vocab_size}; they must share one tokenizer"
            )
        if not use_cache:
            self.use_cache(False)

    def use_cache(self, enabled: bool) -> None:
        self.lm = CachedLM(self.model, use_cache=enabled)

    def reset(self) -> None:
        self.lm.reset()

    @property
    def cache_length(self) -> int | None:
        return self.lm.processed

    def params(self) -> dict[str, Any]:
        if self.tree is not None:
            return {"draft": self.label, "tree": str(self.tree), "children": self.children}
        return {"draft": self.label}

    def propose(self, context: Sequence[int], k: int, sampling: SamplingConfig, rng: np.random.Generator) -> Draft:
        """A chain of k tokens, or with a tree, a tree at most k deep."""
        if self.tree is not None:
            return self._propose_tree(context, k, sampling, rng)
        before = self.lm.processed
        if sampling.greedy and self.lm.use_cache:
            greedy_tokens, greedy_confidence = self._propose_greedy(self.cache.pending(self.lm, context), k)
            return Draft(
                tokens=tuple(greedy_tokens),
                parents=chain_parents(len(greedy_tokens)),
                q=None,
                forwards=k,
                cache_before=before,
                cache_peak=self.lm.processed,
                confidence=tuple(greedy_confidence),
            )
        tokens: list[int] = []
        # (k, V) float64: each step writes its q into its row (or the row takes a copy), and
        # the row's facts for the record are taken then, while it is in cache (core.sampling.dists)
        qs = (
            None
            if sampling.greedy
            else torch.empty((k, self.lm.vocab_size), dtype=torch.float64, device=self.lm.device)
        )
        facts: list[RowFacts | None] = []
        draws: list[float] = []
        confidence: list[torch.Tensor] = []  # device scalars, moved to the host once
        feed = self.cache.pending(self.lm, context)
        coupled = self.coupling is not None and not sampling.greedy
        for i in range(k):
            logits = self.lm.feed(feed, keep=1)[0]
            step = self._coupled_step(len(context) - self._prompt_len + i) if coupled else self.sample_step
            token, q, u, *kept = step(logits, sampling, rng, out=None if qs is None else qs[i])
            confidence.append(token_confidence(logits, token))
            if q is not None:
                if qs is None or q.shape[-1] != qs.shape[-1]:
                    raise ValueError(
                        f"the draft step returned a q of shape {tuple(q.shape)} for a "
                        f"{'greedy' if qs is None else str(qs.shape[-1]) + '-token'} draft"
                    )
                if q.data_ptr() != qs[i].data_ptr():
                    qs[i].copy_(q)
                known = kept[0] if kept else None  # a KeptRow: q's nonzero entries
                facts.append(
                    RowFacts.of_nonzero(known.ids)
                    if known is not None
                    else RowFacts.of(qs[i : i + 1], sparse=sampling.sparse_rows)
                )
            if u is not None:
                draws.append(u)
            tokens.append(token)
            # With a cache only the new token is fed; without one, the whole sequence again.
            feed = [token] if self.lm.use_cache else feed + [token]
        return Draft(
            tokens=tuple(tokens),
            parents=chain_parents(len(tokens)),
            q=qs if facts else None,
            forwards=k,
            cache_before=before,
            cache_peak=self.lm.processed,
            sample_draws=tuple(draws),
            q_facts=RowFacts.stack(facts),
            confidence=tuple(torch.stack(confidence).tolist()) if confidence else (),
        )

    @torch.inference_mode()
    def _propose_greedy(self, feed: list[int], k: int) -> tuple[list[int], list[float]]:
        """k greedy draft tokens and the draft's confidence in each; the argmax stays on the
        device and is fed back as is.

        Greedy needs no q and no host-side distribution: one argmax per step, then one
        finite check over the k logit rows and one device -> host transfer of the k tokens
        and their confidences per round (instead of a check and an .item() sync per step).
        """
        rows: list[torch.Tensor] = []
        picks: list[torch.Tensor] = []
        fed: Sequence[int] | torch.Tensor = feed
        for _ in range(k):
            logits = self.lm.feed(fed, keep=1)[0]  # (V,)
            token = row_argmax(logits).view(1)  # (1,) on the device
            rows.append(logits)
            picks.append(token)
            fed = token
        if not _all_finite(rows):
            raise ValueError("the draft model produced non-finite logits; refusing to propose")
        if not rows:
            return [], []
        tokens = torch.cat(picks)
        block = torch.stack(rows).double()  # (k, V): the confidences in one pass over the rows
        confidence = (block.gather(1, tokens[:, None])[:, 0] - torch.logsumexp(block, dim=-1)).exp()
        both = torch.stack([tokens.to(torch.float64), confidence.to(torch.float64)]).tolist()
        return [int(t) for t in both[0]], both[1]

    def observe(self, committed_len: int) -> int | None:
        self.cache.crop(self.lm, committed_len)
        return self.lm.processed

    def _propose_tree(
        self, context: Sequence[int], depth: int, sampling: SamplingConfig, rng: np.random.Generator
    ) -> Draft:
        before = self.lm.processed
        growth = ModelGrowth(self.lm, len(context), sampling, rng)
        root = growth.root_q(self.cache.pending(self.lm, context))
        if self.tree.kind == "dynamic":
            kept = grow_dynamic(growth, self.tree, depth, root, self.tree_policy)
        else:
            kept = grow_static(growth, self.tree, self.children, depth, root)
        tokens, parents, qs, self._tree_rows = finish(growth, kept)
        self._tree_prefix = len(context)
        return Draft(
            tokens=tokens,
            parents=parents,
            q=None if sampling.greedy or not qs else torch.stack(qs),
            forwards=growth.forwards,
            cache_before=before,
            cache_peak=self.lm.processed,
            sample_draws=tuple(growth.draws),
            children=self.children,
            confidence=growth.confidence(kept),
        )

    def keep_path(self, path: Sequence[int]) -> None:
        """After a tree round: keep the prefix and the accepted path's rows in the draft cache
        (a chain's accepted prefix is what observe crops to)."""
        if self.tree is not None:
            keep_tree_path(self.lm, self._tree_prefix, self._tree_rows, path)


class PromptLookupProposer(ProposerBase):
    """Prompt lookup: copy what followed the most recent earlier occurrence of the context's
    longest matching suffix n-gram. A point-mass proposal (q = one-hot)."""

    name = "lookup"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, vocab_size: int | None = None):
        check_ngram_range(min_ngram, max_ngram)
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.vocab_size = vocab_size  # adopted from the target by bind() when left None
        self.spec = f"lookup:max_ngram={max_ngram},min_ngram={min_ngram}"
        self.index = NgramIndex(min_ngram, max_ngram)

    def bind(self, vocab_size: int, use_cache: bool) -> None:
        if self.vocab_size is None:
            self.vocab_size = vocab_size
        elif self.vocab_size != vocab_size:
            raise ValueError(
                f"prompt lookup was built for a vocabulary of {self.vocab_size}, the target has {vocab_size}"
            )

    def reset(self) -> None:
        self.index.reset()

    def params(self) -> dict[str, Any]:
        return {"max_ngram": self.max_ngram, "min_ngram": self.min_ngram}

    def lookup(self, context: Sequence[int], k: int) -> list[int]:
        """Tokens following the most recent earlier match of the longest suffix n-gram (an
        index updated as the context grows: core.draft.ngram_index)."""
        return self.index.lookup(context, k)

    def propose(self, context: Sequence[int], k: int, sampling: SamplingConfig, rng: np.random.Generator) -> Draft:
        tokens = self.lookup(context, k)
        q = None
        if not sampling.greedy and tokens:
            if not self.vocab_size:
                raise ValueError("PromptLookupProposer needs the vocabulary size to build its q")
            q = torch.zeros((len(tokens), self.vocab_size), dtype=torch.float64)
            q[torch.arange(len(tokens)), torch.as_tensor(tokens)] = 1.0
        return Draft(tokens=tuple(tokens), parents=chain_parents(len(tokens)), q=q)

    def observe(self, committed_len: int) -> int | None:
        return None
