"""Whether an injected fault fired, and a setting that would make it fire.

Most faults fire only when a run meets their condition (`Fault.applies`): eos-leak needs an
EOS id that a round accepts before its last token, budget-overshoot a last round whose drafts
are all accepted. A run where the fault never fired is a correct run, and `specscope check`
rightly finds nothing in it; so a fault run says where it fired, and when it did not, what
to change. `FireScan` watches the run's rounds (a few integers and the set of emitted token
ids, never the distributions) for what such a change needs:

- an EOS id the run will meet mid-round: the first output token that was accepted before the
  last token of its round and not emitted earlier. The run is the same up to that round with
  this EOS id (nothing before it was EOS), and there the verifier meets EOS before the round
  ends;
- a budget that ends right after a round's drafts: the first chain round that accepted all k
  drafts with more than k tokens of budget left. With max_new_tokens = the tokens before that
  round + k, every earlier round is the same (each had more than k left), the round drafts
  the same k tokens and accepts them, and the bonus is the token past the budget;
- for the stop faults (a stop changes no draw and no earlier round, so the run is the same up
  to where the stop completes): a stop token that completes before its round's last token
  (the EOS candidate as a stop sequence: stop-last-token); that budget together with a stop
  on one of that round's tokens before its last (budget-before-stop: the stop completes
  inside the round that reaches the budget); and a two-character stop string across the
  boundary of two tokens, found nowhere earlier in the output's text (stop-per-token; needs
  the text of each token).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specscope.core.records import Round, RunConfig


@dataclass(frozen=True)
class Suggestion:
    """RunSettings fields and the values that make the fault fire, and why."""

    settings: dict[str, Any]
    why: str


class FireScan:
    """What a fault run met that a setting could turn into a fire (see the module doc)."""

    def __init__(self, config: RunConfig, piece: Callable[[int], str] | None = None):
        """`piece`: the text each token adds (core.decode.stops.token_piece_function), for a
        stop string to suggest; None: none is suggested."""
        self.config = config
        self.piece = piece
        self._seen: set[int] = set()
        self.eos_candidate: tuple[int, int] | None = None  # (token, round)
        self.budget_candidate: tuple[int, int] | None = None  # (round, max_new_tokens)
        self.budget_stop_candidate: tuple[int, int, int] | None = None  # (round, max_new_tokens, stop token)
        self.text_candidate: tuple[str, int] | None = None  # (stop string, round)
        self._text = ""  # the output's text until a stop string is found

    def observe(self, r: Round) -> None:
        seen_before = set(self._seen)
        last = len(r.emitted) - 1
        for j, e in enumerate(r.emitted):
            if self.eos_candidate is None and j < last and e.token not in self._seen:
                self.eos_candidate = (e.token, r.index)
            self._seen.add(e.token)
        k = self.config.k
        chain = getattr(r, "tree", None) is None  # a TreeRound has `tree`; a chain Round has none
        if self.budget_candidate is None and chain and r.bonus is not None and len(r.nodes) == k < r.remaining_budget:
            self.budget_candidate = (r.index, r.emitted_before + k)
        if (
            self.budget_stop_candidate is None
            and chain
            and r.bonus is not None
            and len(r.nodes) == k < r.remaining_budget
        ):
            tokens = [e.token for e in r.emitted[:k]]
            stop = next((t for j, t in enumerate(tokens[:-1]) if t not in seen_before and t not in tokens[:j]), None)
            if stop is not None:
                self.budget_stop_candidate = (r.index, r.emitted_before + k, stop)
        if self.text_candidate is None and self.piece is not None:
            self._find_text(r, self.piece)

    def _find_text(self, r: Round, piece_of: Callable[[int], str]) -> None:
        """The first two characters of the output that straddle two tokens and appear nowhere
        earlier in its text (nor inside the second token's own text)."""
        recorded = getattr(r, "pieces", None)
        pieces = (
            list(recorded)
            if recorded is not None and len(recorded) == len(r.emitted)
            else [piece_of(e.token) for e in r.emitted]
        )
        for piece in pieces:
            if "\ufffd" in piece:  # bytes that are not a character yet: no text to suggest
                self._text += piece
                continue
            if self._text and piece:
                candidate = self._text[-1] + piece[0]
                if (
                    candidate.strip()
                    and candidate.isprintable()
                    and candidate not in self._text + piece[1:]
                    and candidate not in piece
                ):
                    self.text_candidate = (candidate, r.index)
                    self._text = ""
                    return
            self._text += piece


def eos_to_fire(scan: FireScan) -> Suggestion | None:
    if scan.eos_candidate is None:
        return None
    token, rnd = scan.eos_candidate
    return Suggestion(
        {"eos": token},
        f"round {rnd} accepted token {token} before its last token, and the run had not "
        f"emitted it before: as the EOS id the run meets it there",
    )


def budget_to_fire(scan: FireScan) -> Suggestion | None:
    if scan.budget_candidate is None:
        return None
    rnd, budget = scan.budget_candidate
    return Suggestion(
        {"max_new_tokens": budget},
        f"round {rnd} accepted all {scan.config.k} drafts: with this budget "
        f"they are the last tokens allowed, and its bonus goes past it",
    )


def sampling_to_fire(scan: FireScan) -> Suggestion | None:
    if scan.config.sampling.temperature == 0:
        return Suggestion({"temperature": 1.0}, "the fault acts on sampled rounds; greedy decoding draws nothing")
    return None


def filters_to_fire(scan: FireScan) -> Suggestion | None:
    """raw-q: the draft's q must be filtered (top-k or top-p) for the raw q to differ."""
    s = scan.config.sampling
    changes: dict[str, Any] = {}
    if s.temperature == 0:
        changes["temperature"] = 1.0
    if s.top_k == 0 and s.top_p >= 1.0:
        changes["top_k"] = 20
    return (
        Suggestion(changes, "the fault records q before top-k/top-p: it shows only when a sampled run filters q")
        if changes
        else None
    )


def stop_ids_to_fire(scan: FireScan) -> Suggestion | None:
    """stop-last-token: a stop token the run meets before its round's last token."""
    if scan.eos_candidate is None:
        return None
    token, rnd = scan.eos_candidate
    return Suggestion(
        {"stop_ids": ((token,),)},
        f"round {rnd} accepted token {token} before its last token, and the "
        f"run had not emitted it before: as a stop the run meets it there",
    )


def budget_and_stop_to_fire(scan: FireScan) -> Suggestion | None:
    """budget-before-stop: a budget that ends right after a round's drafts and a stop on one of
    that round's tokens before its last."""
    if scan.budget_stop_candidate is None:
        return None
    rnd, budget, token = scan.budget_stop_candidate
    return Suggestion(
        {"max_new_tokens": budget, "stop_ids": ((token,),)},
        f"round {rnd} accepted all {scan.config.k} drafts: with this budget it is the round that "
        f"reaches the budget, and token {token} (not emitted before) completes the stop inside it",
    )


def stop_string_to_fire(scan: FireScan) -> Suggestion | None:
    """stop-per-token: a stop string spread over two tokens."""
    if scan.text_candidate is None:
        return None
    text, rnd = scan.text_candidate
    return Suggestion(
        {"stop_strings": (text,)},
        f"in round {rnd} the text {text!r} spans two tokens and appears "
        "nowhere earlier in the output: as a stop string it completes across "
        "them",
    )
