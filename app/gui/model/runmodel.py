"""The model the views share: one run's rounds, its timeline cells, metrics and selection.

Pure data plus Qt signals (no widgets, no torch, no SQL), in the napari style: views take
a RunModel and subscribe to `reset`, `appended`, `finished` and `selectionChanged`.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from PySide6.QtCore import QObject, Signal

from specscope.app.gui import theme
from specscope.core.records import Round, RunConfig
from specscope.core.sampling.dists import TopDistribution
from specscope.core.sampling.partial import is_full

from .compact import CompactRounds
from .metrics import RunMetrics
from .traces import as_partial

TokenText = Callable[[int], str]


def default_token_text(token: int) -> str:
    return str(token)


_VISIBLE = {"\n": "↵", "\t": "⇥", "\r": "␍"}


def visible_text(text: str) -> str:
    """Make whitespace and control characters visible in a token cell."""
    if text == "":
        return "∅"
    out = []
    for ch in text:
        if ch in _VISIBLE:
            out.append(_VISIBLE[ch])
        elif not ch.isprintable() and ch != " ":
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 256 else f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    joined = "".join(out)
    if joined.startswith(" "):
        joined = "·" + joined[1:]
    return joined


# ---------------------------------------------------------------------- distributions


def top_tokens(dists: Sequence[np.ndarray | None], n: int, must: Iterable[int] = ()) -> np.ndarray:
    """Token ids: the union of each distribution's top n, plus `must`, ordered by the first
    distribution's probability (descending)."""
    ids: set[int] = {int(t) for t in must if t is not None and t >= 0}
    first = None
    for d in dists:
        if d is None:
            continue
        if first is None:
            first = d
        m = min(n, len(d))
        if m:
            part = np.argpartition(-d, m - 1)[:m]
            ids.update(int(i) for i in part if d[i] > 0)
    arr = np.array(sorted(ids), dtype=np.int64)
    if first is not None and len(arr):
        valid = arr[arr < len(first)]
        order = np.argsort(-first[valid], kind="stable")
        arr = np.concatenate([valid[order], arr[arr >= len(first)]])
    return arr


def slim(r: Round) -> Round:
    """The round without its full-vocabulary distributions (the scalars stay exact)."""
    nodes = tuple(replace(n, p=None, q=None) for n in r.nodes)
    return replace(r, nodes=nodes, bonus_p=None, residual=None)


def has_distributions(r: Round) -> bool:
    return r.bonus_p is not None or any(n.p is not None for n in r.nodes)


def for_views(r: Round) -> Round:
    """The round with any TopDistribution (a live run's top-N record above 4,096 tokens,
    core.sampling.dists) as the dense array a top-N trace reads back as, which the views plot."""

    def dense(d):
        return as_partial(d) if isinstance(d, TopDistribution) else d

    arrays = [r.bonus_p, r.residual] + [a for n in r.nodes for a in (n.p, n.q)]
    if not any(isinstance(a, TopDistribution) for a in arrays):
        return r
    nodes = tuple(replace(n, p=dense(n.p), q=dense(n.q)) for n in r.nodes)
    return replace(r, nodes=nodes, bonus_p=dense(r.bonus_p), residual=dense(r.residual))


def _top_n_only(r: Round) -> bool:
    """Whether a distribution of the round was rebuilt from a top-N save (replay batches)."""
    arrays = [r.bonus_p, r.residual] + [a for n in r.nodes for a in (n.p, n.q)]
    return any(a is not None and not is_full(a) for a in arrays)


# ---------------------------------------------------------------------- timeline cells


@dataclass(frozen=True)
class Cell:
    kind: int  # theme.PROMPT .. theme.UNVISITED
    round: int  # -1 for the prompt
    pos: int  # draft position (node index); len(nodes) = the bonus position; -1 prompt
    token: int
    out_pos: int  # index in the generated output; -1 for prompt and discarded drafts
    eos: bool
    text: str


class TokenTexts:
    """The cells' texts, made on demand from their tokens (one visible text per token id,
    cached): the timeline indexes it like a list."""

    def __init__(self, tokens: array, token_text: TokenText):
        self._tokens = tokens
        self._token_text = token_text
        self._cache: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self._tokens)

    def __getitem__(self, i: int) -> str:
        token = self._tokens[i]
        text = self._cache.get(token)
        if text is None:
            text = self._cache[token] = visible_text(self._token_text(token))
        return text


class Cells:
    """Column arrays of the timeline's cells, grown round by round (typed arrays: a few
    bytes a cell, so a run of a million rounds fits; texts are made when drawn)."""

    def __init__(self, token_text: TokenText = default_token_text) -> None:
        self.kind = array("b")
        self.round = array("i")
        self.pos = array("i")
        self.token = array("q")
        self.out_pos = array("q")
        self.eos = array("b")
        self.text = TokenTexts(self.token, token_text)
        self.round_first = array("q")  # first cell of each round
        self.out_cell = array("q")  # cell index of each output position

    def __len__(self) -> int:
        return len(self.kind)

    def cell(self, i: int) -> Cell:
        return Cell(
            self.kind[i], self.round[i], self.pos[i], self.token[i], self.out_pos[i], bool(self.eos[i]), self.text[i]
        )

    def _add(self, kind: int, rnd: int, pos: int, token: int, out_pos: int, eos: bool) -> None:
        self.kind.append(kind)
        self.round.append(rnd)
        self.pos.append(pos)
        self.token.append(token)
        self.out_pos.append(out_pos)
        self.eos.append(eos)
        if out_pos >= 0:
            self.out_cell.append(len(self.kind) - 1)

    def add_prompt(self, ids: Sequence[int], token_text: TokenText | None = None) -> None:
        for t in ids:
            self._add(theme.PROMPT, -1, -1, int(t), -1, False)

    def add_round(self, r: Round, token_text: TokenText | None, eos_ids: frozenset[int]) -> None:
        self.round_first.append(len(self.kind))
        out = r.emitted_before
        accepted_nodes = {e.node for e in r.emitted if e.kind == "accepted"}
        # Accepted drafts in order, then the discarded drafts (struck through), then the
        # repair or bonus: the round reads like an edit.
        emitted = list(r.emitted)
        for e in emitted:
            if e.kind != "accepted":
                continue
            self._add(theme.ACCEPTED, r.index, e.node, e.token, out, e.token in eos_ids)
            out += 1
        for n in r.nodes:
            if n.index in accepted_nodes or n.status == "accepted":
                continue
            self._add(theme.KIND_OF_STATUS[n.status], r.index, n.index, n.token, -1, False)
        for e in emitted:
            if e.kind == "accepted":
                continue
            kind = theme.KIND_OF_EMITTED[e.kind]
            pos = e.node if e.kind == "repaired" and e.node is not None else len(r.nodes)
            self._add(kind, r.index, pos, e.token, out, e.token in eos_ids)
            out += 1


# ---------------------------------------------------------------------- the model


FULL_VOCAB_LIMIT = 4096  # above this vocabulary size, rounds are kept slim from the start
FULL_BYTES = 384 * 2**20  # below it, keep every round's distributions up to this many bytes
RECENT_FULL = 256  # slim rounds: distributions of at most this many recent rounds ...
RECENT_BYTES = 128 * 2**20  # ... and of no more than this many bytes of them


def round_bytes(vocab: int, k: int) -> int:
    """Rough size of one round's distributions (p and q per node, bonus, residual)."""
    return max(1, vocab) * 8 * 2 * (max(1, k) + 2)


def recent_capacity(vocab: int, k: int) -> int:
    """How many full rounds the recent-round cache keeps for this vocabulary and k."""
    return max(4, min(RECENT_FULL, RECENT_BYTES // round_bytes(vocab, k)))


class RunModel(QObject):
    """One run (live or replayed): config, rounds, cells, metrics, selection, findings.

    Rounds of big-vocabulary runs are kept slim (no distributions); `full_round(i)` gives
    the distributions back from a small cache of recent rounds or from `loader` (set by
    whoever knows where the trace is stored).
    """

    reset = Signal()
    appended = Signal(int, int)  # first new round index, number of rounds
    finished = Signal(str)  # stop reason
    selectionChanged = Signal(int, int)  # round, position (-1, -1 = none)
    findingsChanged = Signal()

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.token_text: TokenText = default_token_text
        self.config: RunConfig | None = None
        self.rounds = CompactRounds()
        self.cells = Cells()
        self.metrics = RunMetrics()
        self.stop_reason: str | None = None
        self.wall_s: float | None = None
        self.source: str = ""  # "live", or the trace path being replayed
        self.findings: list[Any] = []
        self.not_checked: dict[str, str] = {}  # rule -> why the checker could not run it
        self.selected: tuple[int, int] = (-1, -1)
        self.label: str = ""
        self.loader: Callable[[int], Round] | None = None
        self._full: OrderedDict[int, Round] = OrderedDict()
        self._full_bytes = 0

    # -------------------------------------------------------------- mutation

    def begin(
        self, config: RunConfig | None, token_text: TokenText | None = None, source: str = "live", label: str = ""
    ) -> None:
        self.config = config
        self.token_text = token_text or default_token_text
        self.rounds = CompactRounds()
        self.cells = Cells(self.token_text)
        self.metrics = RunMetrics()
        self.stop_reason = None
        self.wall_s = None
        self.source = source
        self.label = label
        self.findings = []
        self.not_checked = {}
        self.selected = (-1, -1)
        self.loader = None
        self._full = OrderedDict()
        self._full_bytes = 0
        if config is not None:
            self.cells.add_prompt(config.prompt_ids, self.token_text)
        self.reset.emit()

    def clear(self) -> None:
        self.begin(None)

    def extend(self, rounds: Iterable[Round]) -> None:
        first = len(self.rounds)
        eos = self.config.eos_ids if self.config is not None else frozenset()  # every EOS id of the run
        batch = list(rounds)
        self.rounds.extend(batch, [self._keep(r) for r in batch])
        for r in batch:
            self.cells.add_round(r, None, eos)
            self.metrics.append(r)
        count = len(self.rounds) - first
        if count:
            self.appended.emit(first, count)

    def append(self, r: Round) -> None:
        self.extend([r])

    def _keep(self, r: Round) -> bool:
        """Whether to hold the round whole (distributions and all). Rounds are kept slim
        (CompactRounds) except the small-vocabulary rounds of a live run, up to FULL_BYTES;
        the last rounds' distributions stay in a small cache, and full_round() reads any
        other from the store (`loader`)."""
        vocab = self.config.vocab_size if self.config is not None else 0
        if not vocab and r.nodes and r.nodes[0].p is not None:
            vocab = len(r.nodes[0].p)
        if not has_distributions(r):
            return False
        if vocab <= FULL_VOCAB_LIMIT and self._full_bytes + round_bytes(vocab, r.k) <= FULL_BYTES:
            self._full_bytes += round_bytes(vocab, r.k)
            return True
        self._full[r.index] = r
        cap = recent_capacity(vocab, r.k)
        while len(self._full) > cap:
            self._full.popitem(last=False)
        return False

    def full_round(self, index: int) -> Round:
        """Round `index` with its distributions when anything still has them: the loader's
        (the store's full vectors, when it kept them) for a round held slim or top-N only."""
        r = self.rounds[index]
        if (has_distributions(r) and not _top_n_only(r)) or (not r.nodes and r.bonus is None):
            return r
        got = self._full.get(index)
        if got is not None:
            self._full.move_to_end(index)
            return for_views(got)
        if self.loader is not None:
            try:
                got = self.loader(index)
            except Exception:  # noqa: BLE001 - a failed read shows the slim round
                return r
            self._full[index] = got
            vocab = self.config.vocab_size if self.config is not None else 0
            while len(self._full) > recent_capacity(vocab, got.k):
                self._full.popitem(last=False)
            return got
        return for_views(r)

    def finish(self, stop_reason: str, wall_s: float | None = None) -> None:
        self.stop_reason = stop_reason
        self.wall_s = wall_s
        self.finished.emit(stop_reason)

    def select(self, round_index: int, pos: int = -1) -> None:
        if not self.rounds:
            return
        round_index = max(0, min(round_index, len(self.rounds) - 1))
        r = self.rounds[round_index]
        if pos < 0:
            pos = default_position(r)
        pos = max(0, min(pos, len(r.nodes)))
        if (round_index, pos) != self.selected:
            self.selected = (round_index, pos)
            self.selectionChanged.emit(round_index, pos)

    def set_findings(self, findings: Iterable[Any], not_checked: dict[str, str] | None = None) -> None:
        """The checker's findings, and what it could not check (rule -> why; None: unchanged,
        as when the recompute check adds its findings to the checker's)."""
        self.findings = list(findings)
        if not_checked is not None:
            self.not_checked = dict(not_checked)
        self.findingsChanged.emit()

    # -------------------------------------------------------------- reading

    @property
    def output_tokens(self) -> list[int]:
        return self.rounds.tokens

    @property
    def selected_round(self) -> Round | None:
        i = self.selected[0]
        return self.rounds[i] if 0 <= i < len(self.rounds) else None

    @property
    def eos_id(self) -> int | None:
        return self.config.eos_token_id if self.config is not None else None


def default_position(r: Round) -> int:
    """The most interesting position of a round: the rejection, else the bonus."""
    if r.rejected_node is not None:
        return r.rejected_node
    return len(r.nodes)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """First output position where the two token sequences differ (None if one is a prefix
    of the other)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None
