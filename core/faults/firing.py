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
  the same k tokens and accepts them, and the bonus is the token past the budget.
"""

from __future__ import annotations

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

    def __init__(self, config: RunConfig):
        self.config = config
        self._seen: set[int] = set()
        self.eos_candidate: tuple[int, int] | None = None  # (token, round)
        self.budget_candidate: tuple[int, int] | None = None  # (round, max_new_tokens)

    def observe(self, r: Round) -> None:
        last = len(r.emitted) - 1
        for j, e in enumerate(r.emitted):
            if self.eos_candidate is None and j < last and e.token not in self._seen:
                self.eos_candidate = (e.token, r.index)
            self._seen.add(e.token)
        k = self.config.k
        chain = getattr(r, "tree", None) is None  # a TreeRound has `tree`; a chain Round has none
        if self.budget_candidate is None and chain and r.bonus is not None and len(r.nodes) == k < r.remaining_budget:
            self.budget_candidate = (r.index, r.emitted_before + k)


def eos_to_fire(scan: FireScan) -> Suggestion | None:
    if scan.eos_candidate is None:
        return None
    token, rnd = scan.eos_candidate
    return Suggestion({"eos": token}, f"round {rnd} accepted token {token} before its last token, and the run had not "
                                      f"emitted it before: as the EOS id the run meets it there")


def budget_to_fire(scan: FireScan) -> Suggestion | None:
    if scan.budget_candidate is None:
        return None
    rnd, budget = scan.budget_candidate
    return Suggestion({"max_new_tokens": budget}, f"round {rnd} accepted all {scan.config.k} drafts: with this budget "
                                                  f"they are the last tokens allowed, and its bonus goes past it")


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
    return Suggestion(changes, "the fault records q before top-k/top-p: it shows only when a sampled run filters "
                               "q") if changes else None
