"""Where a run ends besides the budget: EOS ids, stop strings and stop token sequences.

The rule, the same for both engines and for the checker (docs/trace-format.md, "Stops"):

- the stop check runs on every emitted token, in emission order (accepted draft tokens, then
  the repair or the bonus), and before the budget check;
- an EOS id (any of the run's set) ends the output at that token, the token included;
- a stop token sequence ends the output at the token that completes it, the token included;
  it matches within the new tokens only (never across the prompt) and may span rounds;
- a stop string is matched on the text: the concatenation of the emitted tokens' pieces
  (`token_piece`: what each token adds to the decoded text). It ends the output at the token
  whose piece completes the string's first occurrence, that token included, and the text is
  not cut: the last token's piece may run past the string ("st" + "opper" stops at "opper"
  for "stop"). This is when transformers' StopStringCriteria matches, too.
- when one token completes several, EOS wins, then the first stop string, then the first
  stop sequence (in the order they were given).

Nothing here imports torch: the checker replays it from a trace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

STOP_KINDS = ("text", "ids")


@dataclass(frozen=True)
class StopMatch:
    """A stop that matched: `kind` "text" (RunConfig.stop_strings[index]) or "ids"
    (RunConfig.stop_ids[index]); `position` indexes the round's emitted tokens: the token that
    completed the match (the round's last)."""

    kind: str
    index: int
    position: int

    def to_dict(self) -> dict:
        return {"kind": self.kind, "index": self.index, "position": self.position}

    @classmethod
    def from_dict(cls, data: dict) -> "StopMatch":
        return cls(str(data["kind"]), int(data["index"]), int(data["position"]))


@dataclass(frozen=True)
class Stops:
    """A run's stop strings and stop token sequences (no EOS: that is the verifier's set)."""

    strings: tuple[str, ...] = ()
    sequences: tuple[tuple[int, ...], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.strings or self.sequences)

    @property
    def ids_tail(self) -> int:
        """Earlier tokens a sequence match can reach back to."""
        return max((len(s) for s in self.sequences), default=1) - 1

    @property
    def text_tail(self) -> int:
        """Earlier characters a string match can reach back to."""
        return max((len(s) for s in self.strings), default=1) - 1

    def match(self, tokens: Sequence[int], pieces: Sequence[str] | None, text_before: str) -> tuple[str, int] | None:
        """(kind, index) of the stop the LAST of `tokens` completes, else None. `tokens` ends
        with the new token and reaches back at least `ids_tail` tokens where the output has
        them; `text_before` is the output's text before the new token (its last `text_tail`
        characters suffice); `pieces[-1]` is the new token's piece (None: no strings)."""
        if self.strings and pieces is not None:
            window = text_before[-self.text_tail:] if self.text_tail else ""
            text = window + pieces[-1]
            for i, s in enumerate(self.strings):
                if s in text:
                    return "text", i
        for i, seq in enumerate(self.sequences):
            if len(tokens) >= len(seq) and tuple(tokens[-len(seq):]) == seq:
                return "ids", i
        return None


class StopTracker:
    """A run's stop state across rounds: the output's recent tokens and text. The verifier
    asks `check(round_tokens)` after each token it emits; the decoder calls `commit` with the
    round's tokens once the round is over."""

    def __init__(self, stops: Stops, piece: Callable[[int], str] | None):
        if stops.strings and piece is None:
            raise ValueError("stop strings need the tokenizer (the text of each token)")
        self.stops, self.piece = stops, piece
        self.tokens: list[int] = []  # the output's last few tokens
        self.text = ""  # the output's last few characters

    def check(self, round_tokens: Sequence[int]) -> StopMatch | None:
        """The stop the last of `round_tokens` (this round's tokens so far) completes."""
        if not self.stops or not round_tokens:
            return None
        tokens = self.tokens + list(round_tokens)
        text_before = self.text + "".join(self.piece(t) for t in round_tokens[:-1]) if self.stops.strings else ""
        pieces = [self.piece(round_tokens[-1])] if self.stops.strings else None
        found = self.stops.match(tokens, pieces, text_before)
        return None if found is None else StopMatch(found[0], found[1], len(round_tokens) - 1)

    def pieces(self, round_tokens: Sequence[int]) -> tuple[str, ...] | None:
        """The pieces a round records (only a run with stop strings needs them)."""
        return tuple(self.piece(t) for t in round_tokens) if self.stops.strings else None

    def commit(self, round_tokens: Sequence[int]) -> None:
        self.tokens = (self.tokens + list(round_tokens))[-max(self.stops.ids_tail, 1):]
        if self.stops.strings:
            self.text = (self.text + "".join(self.piece(t) for t in round_tokens))[-max(self.stops.text_tail, 1):]


def token_piece_function(tokenizer) -> Callable[[int], str]:
    """id -> the text the token adds to a decoded output (a leading space included: "▁Paris"
    and "ĠParis" give " Paris"). Found as transformers' StopStringCriteria does: decode a fixed
    prefix's tokens plus this one and drop the prefix's text. Cached per id."""
    prefix = "abcdef"
    base = tokenizer(prefix, add_special_tokens=False)["input_ids"]
    cache: dict[int, str] = {}

    def piece(token: int) -> str:
        found = cache.get(token)
        if found is None:
            text = tokenizer.decode(list(base) + [int(token)], skip_special_tokens=False,
                                    clean_up_tokenization_spaces=False)
            at = text.find(prefix)
            found = cache[token] = text[at + len(prefix):] if at >= 0 else text
        return found

    return piece


def parse_stop_ids(text: str) -> tuple[int, ...]:
    """"1,2,3" -> (1, 2, 3); ValueError (one line) otherwise."""
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or any(not p for p in parts):
        raise ValueError(f"a stop token sequence is a comma list of token ids, got {text!r}")
    try:
        ids = tuple(int(p) for p in parts)
    except ValueError:
        raise ValueError(f"a stop token sequence is a comma list of token ids, got {text!r}") from None
    if any(i < 0 for i in ids):
        raise ValueError(f"token ids are at least 0, got {text!r}")
    return ids


def parse_eos_ids(text: str) -> tuple[int, ...]:
    """"2" or "2,107" -> the EOS ids; ValueError (one line) otherwise."""
    try:
        return parse_stop_ids(text)
    except ValueError:
        raise ValueError(f"EOS must be token ids separated by commas, 'auto' or 'none', got {text!r}") from None
