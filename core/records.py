"""The round record: one frozen value per speculative round, and the run it belongs to.

Everything a person (or the checker) needs to judge a round without the models is here:
the draft tree with q, the target's p at every node, each decision with its uniform draw,
the residual at the first rejection, what was emitted and why it stopped, and the cache
lengths as read from the cache objects themselves.

A round whose draft is a token tree is a TreeRound: a Round plus `tree` (TreeInfo), the
facts the tree walk and the tree forward add (the tried order, each residual update, the
accepted path, node positions, mask rows, kept cache rows). docs/trees.md and
docs/trace-format.md ("tree") describe how they are stored.

Distributions are full-vocabulary float64 numpy arrays, or, above 4,096 tokens of
vocabulary (the decoder's `vectors` setting, core/sampling/dists.py), TopDistributions: the top-N,
the drawn tokens' entries and the exact whole-vector facts. The storage layer decides what
to persist. Scalars that depend on the full vectors (p(x), q(x), ratio, sum min(p, q),
residual mass) are computed from the full rows on the model's device, so they stay exact
whatever is kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from specscope.core.decode.stops import StopMatch
from specscope.core.sampling.reference import SamplingConfig

TokenKind = Literal["accepted", "repaired", "bonus"]
NodeStatus = Literal["accepted", "rejected", "unvisited"]
from specscope.core.settings.vocab import StopReason as StopReason  # noqa: E402 (the words, defined once; re-exported)

TOKEN_KINDS: tuple[str, ...] = ("accepted", "repaired", "bonus")
NODE_STATUSES: tuple[str, ...] = ("accepted", "rejected", "unvisited")


@dataclass(frozen=True, eq=False)
class DraftNode:
    """One proposed token. A chain draft is the tree whose node i has parent i - 1."""

    index: int
    token: int
    parent: int  # index of the parent node; -1 = hangs off the committed prefix
    depth: int  # 1 for a child of the prefix
    p: np.ndarray  # target distribution at this node's position (after transforms)
    q: np.ndarray | None  # proposal distribution the token was drawn from; None in greedy mode
    status: NodeStatus
    u: float | None  # uniform draw of the acceptance test; None when greedy or unvisited
    p_token: float  # p(token)
    q_token: float | None  # q(token); 1.0 for a point-mass proposal
    ratio: float | None  # p(token) / q(token)
    overlap: float | None  # sum_x min(p(x), q(x)): this position's acceptance probability
    target_argmax: int  # argmax of the target logits at this position
    # the proposer's own probability for its token, from its untransformed softmax
    # (temperature 1, no top-k/top-p), recorded in greedy runs too; None = unknown (prompt
    # lookup, the transformers engine, traces written before it was recorded)
    confidence: float | None = None


@dataclass(frozen=True)
class EmittedToken:
    token: int
    kind: TokenKind
    node: int | None  # accepted: its node; repaired: the rejected node it replaces; bonus: None
    draw: float | None = None  # uniform behind a sampled repair/bonus (inverse-CDF draw)


@dataclass(frozen=True)
class CacheState:
    """Lengths read from a KV cache object around one round."""

    before: int  # at the start of the round
    peak: int  # after this round's forward passes, before cropping
    after: int  # after cropping to the accepted prefix
    pending: tuple[int, ...]  # committed tokens not yet processed into this cache

    @property
    def cropped(self) -> int:
        return self.peak - self.after


@dataclass(frozen=True)
class RoundTimings:
    draft_s: float
    verify_s: float
    bookkeeping_s: float

    @property
    def total_s(self) -> float:
        return self.draft_s + self.verify_s + self.bookkeeping_s


@dataclass(frozen=True, eq=False)
class Round:
    run_id: str
    index: int
    prefix_len: int  # prompt + emitted tokens before the round
    emitted_before: int  # new tokens emitted by earlier rounds
    remaining_budget: int  # max_new_tokens - emitted_before
    k: int  # draft budget of this round after capping to the remaining budget
    greedy: bool
    nodes: tuple[DraftNode, ...]
    bonus_p: np.ndarray | None  # target distribution after the last accepted node (all accepted)
    rejected_node: int | None
    residual: np.ndarray | None  # normalised max(p - q, 0) at the first rejection (stochastic)
    residual_mass: float | None  # sum_x max(p(x) - q(x), 0) before normalising
    emitted: tuple[EmittedToken, ...]
    eos: bool  # an emitted token was EOS: the run ends here
    budget_stop: bool  # the run reached max_new_tokens in this round
    bonus_withheld: bool  # all drafts accepted but no budget was left for the bonus
    target_cache: CacheState
    draft_cache: CacheState | None  # None for proposers without a cache (prompt lookup)
    timings: RoundTimings
    draft_forwards: int
    target_forwards: int
    # a stop string or token sequence completed by the round's last token (core.decode.stops)
    stop: StopMatch | None = None
    # what each emitted token adds to the text, recorded when the run has stop strings (the
    # checker matches them on it); None = not recorded
    pieces: tuple[str, ...] | None = None

    @property
    def tokens(self) -> list[int]:
        return [e.token for e in self.emitted]

    @property
    def drafted(self) -> int:
        return len(self.nodes)

    @property
    def accepted(self) -> int:
        return sum(1 for n in self.nodes if n.status == "accepted")

    @property
    def accepted_length(self) -> int:
        """Accepted draft tokens + 1 (the repair or bonus), as vLLM/EAGLE/Spec-Bench count it."""
        return self.accepted + 1

    @property
    def repair(self) -> EmittedToken | None:
        return next((e for e in self.emitted if e.kind == "repaired"), None)

    @property
    def bonus(self) -> EmittedToken | None:
        return next((e for e in self.emitted if e.kind == "bonus"), None)


@dataclass(frozen=True)
class ResidualUpdate:
    """The running target distribution p' of a tree node after one of its children was
    rejected: p' <- normalise(max(p' - q_c, 0)), q_c being the proposal the child was judged
    against (q for "sampled"; q without the earlier siblings' tokens, renormalised, for
    "distinct"; the point mass on the child for "topk", which zeroes p'(child)).

    `parent` is the node whose children were tried (-1 = the committed prefix), `child` the
    rejected node, `p_after` the normalised p' (a full vector, or a top-N record whose
    known entries include every child of `parent` and the token drawn from it), `mass` the
    sum of max(p' - q_c, 0) before normalising (exact, computed on the full rows)."""

    parent: int
    child: int
    p_after: np.ndarray | None  # None: not read (a store read without its vectors)
    mass: Any


@dataclass(frozen=True)
class TreeInfo:
    """What a tree round adds to a Round (field names are part of the trace format: the
    round's `tree` object in docs/trace-format.md, the `rounds.tree` column in the store).

    - `spec`: the tree spec (core.draft.trees), e.g. "3,2,1" or "dynamic:nodes=16,depth=5,topk=4"
    - `children`: how siblings were chosen, and so the acceptance rule: sampled | distinct | topk
    - `path`: the accepted nodes, from the prefix down (node indices)
    - `tried`: ((node, its children in the order they were tried), ...) for every node the
      walk reached, -1 = the prefix; the draw of each tried child is its DraftNode.u and its
      decision its DraftNode.status
    - `updates`: every ResidualUpdate (p' after each rejection), in walk order
    - `final_p`: the distribution the repair or bonus was drawn from (the last p' at the
      node where the walk stopped, or the leaf's p); None when greedy
    - `positions`: each node's position id in the target forward (prefix length + depth - 1)
    - `visible`: for each node, the nodes its attention mask row let it see (its ancestors
      and itself, in index order); the committed context is always visible
    - `kept_rows`: the target cache rows kept after the prefix, in order (the accepted
      path's rows: prefix length + node index)
    """

    spec: str
    children: str
    path: tuple[int, ...]
    tried: tuple[tuple[int, tuple[int, ...]], ...]
    updates: tuple[ResidualUpdate, ...]
    final_p: np.ndarray | None
    positions: tuple[int, ...] = ()
    visible: tuple[tuple[int, ...], ...] = ()
    kept_rows: tuple[int, ...] = ()


@dataclass(frozen=True, eq=False)
class TreeRound(Round):
    """A Round whose draft is a tree; `tree` holds the tree facts (None for a tree round
    read from a trace that did not record them, JSONL version 1). `k` is the tree's depth
    (capped to the remaining budget, as a chain's length is)."""

    tree: TreeInfo | None = None

    @property
    def discarded(self) -> int:
        """Nodes not on the accepted path (rejected, unvisited, pruned)."""
        return len(self.nodes) - len(self.tree.path) if self.tree is not None else 0


@dataclass(frozen=True)
class RunConfig:
    """Everything needed to reproduce a run (with the same models)."""

    run_id: str
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    k: int
    sampling: SamplingConfig
    seed: int
    eos_token_id: int | None
    proposer: str
    proposer_params: Mapping[str, Any] = field(default_factory=dict)
    target_name: str = ""
    draft_name: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    vocab_size: int = 0
    use_cache: bool = True
    fault: str | None = None
    # every EOS id of the run when it has several (eos_token_id is the first); () = just eos_token_id
    eos_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()  # core.decode.stops
    stop_ids: tuple[tuple[int, ...], ...] = ()
    # Optional trace fields this run's trace did not record (a minimal trace of another
    # decoder): the checker skips the rules that need them and says so once. Names as in
    # docs/trace-format.md: "u", "draw", "q", "p_token", "q_token", "eos", "budget_stop",
    # "bonus_withheld", "target_cache", "k", "updates"; "stops" (a trace that does not say which
    # stops the run had: the stop rules are not checked); "eos_token_id" (a trace that does not
    # say which token is EOS: not "no EOS").
    unrecorded: frozenset[str] = frozenset()
    # The most positions the target reads (prompt + new tokens; its max_position_embeddings),
    # None when its config states none or the trace does not record it.
    position_limit: int | None = None

    @property
    def end_unknown(self) -> str | None:
        """Why a round may have ended the output at a token the trace does not name as an end
        (an EOS id or a stop it does not record), or None when the trace says how its run
        could end."""
        if "eos_token_id" in self.unrecorded:
            return "the trace does not say which token is EOS (config.eos_token_id)"
        if "stops" in self.unrecorded:
            return "the trace does not record the run's stops"
        if "stop" in self.unrecorded and (self.stop_strings or self.stop_ids):
            return "the trace does not record which stop ended a round (the rounds' stop)"
        return None

    @property
    def eos_ids(self) -> frozenset[int]:
        """Every token id that ends the run."""
        if self.eos_token_ids:
            return frozenset(self.eos_token_ids)
        return frozenset() if self.eos_token_id is None else frozenset({self.eos_token_id})


@dataclass(frozen=True)
class RunEnd:
    """How a recorded run says it ended (its end record), for the checker to compare with
    its rounds."""

    status: str  # running | completed | interrupted | failed
    stop_reason: str | None  # eos | stop | budget | cancelled | None
    new_tokens: int | None = None  # tokens the end record counts, when it counts them


@dataclass(frozen=True)
class RunSummary:
    """Aggregates over rounds, the numbers the CLI, GUI and benchmarks report."""

    new_tokens: int
    rounds: int
    drafted: int
    accepted: int
    mean_accepted_length: float
    acceptance_rate: float
    target_forward_passes: int
    draft_forward_passes: int
    draft_s: float
    verify_s: float
    bookkeeping_s: float

    @classmethod
    def of(cls, rounds: Iterable[Round]) -> RunSummary:
        tally = SummaryTally()
        for r in rounds:
            tally.add(r)
        return tally.summary()


class SummaryTally:
    """A RunSummary accumulated round by round, so that a run's consumer need not keep
    its rounds to report on them (memory stays flat over a long run)."""

    def __init__(self) -> None:
        self.new_tokens = self.rounds = self.drafted = self.accepted = self.accepted_lengths = 0
        self.target_forwards = self.draft_forwards = 0
        self.draft_s = self.verify_s = self.bookkeeping_s = 0.0

    def add(self, r: Round) -> None:
        accepted = r.accepted
        self.new_tokens += len(r.emitted)
        self.rounds += 1
        self.drafted += r.drafted
        self.accepted += accepted
        self.accepted_lengths += accepted + 1
        self.target_forwards += r.target_forwards
        self.draft_forwards += r.draft_forwards
        self.draft_s += r.timings.draft_s
        self.verify_s += r.timings.verify_s
        self.bookkeeping_s += r.timings.bookkeeping_s

    def summary(self) -> RunSummary:
        return RunSummary(
            new_tokens=self.new_tokens,
            rounds=self.rounds,
            drafted=self.drafted,
            accepted=self.accepted,
            mean_accepted_length=(self.accepted_lengths / self.rounds) if self.rounds else 0.0,
            acceptance_rate=(self.accepted / self.drafted) if self.drafted else 0.0,
            target_forward_passes=self.target_forwards,
            draft_forward_passes=self.draft_forwards,
            draft_s=self.draft_s,
            verify_s=self.verify_s,
            bookkeeping_s=self.bookkeeping_s,
        )


@dataclass(frozen=True, eq=False)
class GenerationResult:
    """A finished run: its tokens and summary; `rounds` holds the rounds when the run was
    asked to keep them (`generate(keep_rounds=True)`, the default), else it is empty and
    `tallied` carries the summary."""

    config: RunConfig
    new_tokens: list[int]
    rounds: list[Round]
    stop_reason: StopReason
    wall_s: float
    tallied: RunSummary | None = None

    @property
    def summary(self) -> RunSummary:
        return self.tallied if self.tallied is not None else RunSummary.of(self.rounds)

    @property
    def mean_accepted_length(self) -> float:
        return self.summary.mean_accepted_length

    @property
    def acceptance_rate(self) -> float:
        return self.summary.acceptance_rate
