"""The checker's stop rules: stop strings and token sequences (core.decode.stops), how a run
finished, and what its end record counts (their Rule entries: core.check.rules). Every
rule here is about wrong output.

They replay the stop rule from the trace alone: the run's stops (RunConfig.stop_strings,
stop_ids), its EOS ids, and, for stop strings, the text each emitted token added (a round's
`pieces`). What a trace did not record is not guessed: without the run's stops ("stops" in
RunConfig.unrecorded) no stop rule runs, and without the pieces the strings are not matched;
each is named in the report's not-checked list instead.

check_report (core.check.checker) feeds one StopRules the rounds in order and then the end
record, holding nothing but a short tail of tokens and text.
"""

from __future__ import annotations

from typing import Any

from specscope.core.decode.stops import StopMatch, Stops
from specscope.core.records import Round, RunConfig, RunEnd


class StopRules:
    """One run's stop rules, fed round by round (`round`) and then its end record (`end`)."""

    def __init__(self, config: RunConfig, findings: list[Any], not_checked: dict[str, str], finding_type: Any):
        self.config, self.findings, self.not_checked, self.Finding = config, findings, not_checked, finding_type
        self.stops = Stops(tuple(config.stop_strings), tuple(tuple(s) for s in config.stop_ids))
        self.known = "stops" not in config.unrecorded  # the trace says which stops the run had
        self.tokens: list[int] = []  # the output's last tokens (a sequence match reaches back)
        self.text = ""  # the output's last characters (a string match reaches back)
        self.text_known = True  # every round so far recorded its pieces
        self.ended: tuple[str, int, int] | None = None  # (kind "eos"/"stop", round, output position) of the first end
        self.emitted = 0  # output tokens so far
        if not self.known:
            for rule in ("stop-leak", "stop-flag", "stop-budget"):
                self.not_checked.setdefault(rule, "the trace does not record the run's stops")

    @property
    def at_stop(self) -> bool:
        """The output ended at a stop string or sequence (as replayed)."""
        return self.ended is not None and self.ended[0] == "stop"

    def _add(self, rnd: Round, rule: str, message: str, position: int | None = None) -> None:
        self.findings.append(self.Finding(self.config.run_id, rnd.index, position, rule, message))

    def round(self, rnd: Round) -> None:
        out_start = self.emitted
        self.emitted += len(rnd.emitted)
        if not self.known:
            return
        if self.ended is not None:
            if self.ended[0] == "stop":
                self._add(
                    rnd, "stop-leak", f"the run went on after the stop completed at position {self.ended[2]}", out_start
                )
            return
        match = self._replay(rnd)
        recorded = getattr(rnd, "stop", None)
        self._flag(rnd, match, recorded)
        if match is None:
            return
        self.ended = ("stop", rnd.index, out_start + match.position)
        after = len(rnd.emitted) - 1 - match.position
        if after > 0:
            kinds = sorted({e.kind for e in rnd.emitted[match.position + 1 :]})
            self._add(
                rnd,
                "stop-leak",
                f"{after} token(s) emitted after the stop {self._name(match)} completed ({', '.join(kinds)})",
                out_start + match.position + 1,
            )
        if (
            rnd.budget_stop
            and "budget_stop" not in self.config.unrecorded
            and out_start + match.position + 1 < self.config.max_new_tokens
        ):
            self._add(
                rnd,
                "stop-budget",
                f"budget_stop is set, but the output ends at the stop with "
                f"{out_start + match.position + 1} of max_new_tokens={self.config.max_new_tokens} tokens: "
                "the budget was counted with tokens past the stop",
            )

    def _replay(self, rnd: Round) -> StopMatch | None:
        """The first stop (EOS first) the round's tokens complete, replayed from the trace."""
        strings = bool(self.stops.strings)
        recorded_pieces: list[str] | None = getattr(rnd, "pieces", None)
        if strings and (recorded_pieces is None or len(recorded_pieces) != len(rnd.emitted)):
            self.text_known = False
            self.not_checked.setdefault(
                "stop-leak", "the trace does not record the text of each token (pieces): stop strings not matched"
            )
        use_text = strings and self.text_known
        pieces: list[str] = list(recorded_pieces) if use_text and recorded_pieces is not None else []
        matcher = Stops(self.stops.strings if use_text else (), self.stops.sequences)
        found = None
        for j, e in enumerate(rnd.emitted):
            if e.token in self.config.eos_ids:
                self.ended = ("eos", rnd.index, self.emitted - len(rnd.emitted) + j)  # the eos rule checks the rest
                break
            text_before = self.text + "".join(pieces[:j]) if use_text else ""
            hit = matcher.match(
                self.tokens + [e.token for e in rnd.emitted[: j + 1]], [pieces[j]] if use_text else None, text_before
            )
            if hit is not None:
                found = StopMatch(hit[0], hit[1], j)
                break
        self.tokens = (self.tokens + rnd.tokens)[-max(self.stops.ids_tail, 1) :]
        if use_text:
            self.text = (self.text + "".join(pieces))[-max(self.stops.text_tail, 1) :]
        return found

    def _flag(self, rnd: Round, match: StopMatch | None, recorded: StopMatch | None) -> None:
        if "stop" in self.config.unrecorded:
            self.not_checked.setdefault("stop-flag", "field 'stop' not recorded")
            return
        if self.stops.strings and not self.text_known:
            self.not_checked.setdefault(
                "stop-flag",
                "the trace does not record the text of each token (pieces): "
                "whether a stop string ended a round is not checked",
            )
        if recorded == match:
            return
        if recorded is not None and not self._known_kind(recorded):
            self._add(
                rnd,
                "stop-flag",
                f"the round records stop {recorded.kind}[{recorded.index}], which the run does not have",
            )
        elif match is None and recorded is not None:
            if recorded.kind == "text" and not self.text_known:  # the strings cannot be replayed
                self.not_checked.setdefault(
                    "stop-flag",
                    "the trace does not record the text of each token (pieces): "
                    "a recorded stop string is not checked against the text",
                )
                return
            self._add(
                rnd,
                "stop-flag",
                f"the round records the stop {self._name(recorded)} at token "
                f"{recorded.position}, but its tokens complete no stop there",
            )
        elif match is not None and recorded is None:
            self._add(
                rnd,
                "stop-flag",
                f"the stop {self._name(match)} completes at token {match.position} of the "
                "round, but the round records no stop",
            )
        elif match is not None and recorded is not None:
            self._add(
                rnd,
                "stop-flag",
                f"the round records the stop {self._name(recorded)} at token "
                f"{recorded.position}; the tokens complete {self._name(match)} at token {match.position}",
            )

    def _known_kind(self, m: StopMatch) -> bool:
        items = self.stops.strings if m.kind == "text" else self.stops.sequences if m.kind == "ids" else ()
        return 0 <= m.index < len(items)

    def _name(self, m: StopMatch) -> str:
        if m.kind == "text" and 0 <= m.index < len(self.stops.strings):
            return repr(self.stops.strings[m.index])
        if m.kind == "ids" and 0 <= m.index < len(self.stops.sequences):
            return str(list(self.stops.sequences[m.index]))
        return f"{m.kind}[{m.index}]"

    # ---------------------------------------------------------------- the end record

    def end(self, end: RunEnd, last: Round | None) -> None:
        """finish-reason and end-count against the replayed end of the output."""
        cut = self.emitted if self.ended is None else self.ended[2] + 1  # tokens up to the stop or EOS
        if end.new_tokens is not None and end.new_tokens > cut and self.ended is not None and self.known:
            self._add_end(
                last,
                "end-count",
                f"the end record counts {end.new_tokens} new tokens, but the output "
                f"ends at the {self.ended[0]} after {cut}: it counts tokens past it",
            )
        if end.status != "completed" or end.stop_reason is None:
            return
        reason = self._reason(cut)
        if reason is None and end.stop_reason in ("stop", "budget"):
            self.not_checked.setdefault(
                "finish-reason",
                "the trace does not record the run's stops (or the text of "
                "its tokens), so a stop cannot be told from none",
            )
            return
        if reason is not None and end.stop_reason != reason and "stop" in (reason, end.stop_reason):
            self._add_end(
                last,
                "finish-reason",
                f"the run's finish reason is {end.stop_reason!r}, but its tokens show {reason!r}{self._where()}",
            )

    def _reason(self, cut: int) -> str | None:
        """What the tokens show; None when the trace cannot say (stops or pieces unrecorded
        and no EOS or budget explains the end)."""
        if self.ended is not None and self.ended[0] == "eos":
            return "eos"
        if self.at_stop:
            return "stop"
        unknown = not self.known or (self.stops.strings and not self.text_known)
        if unknown:
            return None
        return "budget" if cut >= self.config.max_new_tokens else "early"

    def _where(self) -> str:
        return f" (position {self.ended[2]}, round {self.ended[1]})" if self.ended is not None else ""

    def _add_end(self, last: Round | None, rule: str, message: str) -> None:
        self.findings.append(
            self.Finding(self.config.run_id, last.index if last is not None else 0, None, rule, message)
        )
