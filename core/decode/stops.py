"""Where a run ends besides the budget: EOS ids, stop strings and stop token sequences.

The rule, the same for both engines and for the checker (docs/trace-format.md, "Stops"):

- the stop check runs on every emitted token, in emission order (accepted draft tokens, then
  the repair or the bonus), and before the budget check;
- an EOS id (any of the run's set) ends the output at that token, the token included;
- a stop token sequence ends the output at the token that completes it, the token included;
  it matches within the new tokens only (never across the prompt) and may span rounds;
- a stop string is matched on the text of the emitted tokens decoded together: the
  concatenation of their pieces, where a token's piece is what it adds to that text. It ends
  the output at the token whose piece completes the string's first occurrence, that token
  included, and the text is not cut: the last token's piece may run past the string ("st" +
  "opper" stops at "opper" for "stop"). This is when transformers' StopStringCriteria
  matches, too;
- a token whose bytes end inside a UTF-8 character (a byte-level tokenizer splits an emoji or
  a CJK character over two to four tokens) adds no text yet: its piece is "", and the token
  that completes the character adds all of it (`StopTracker`). So a stop string that ends
  with such a character ends the output at the token that completes the character, in
  whichever round it comes. A run that ends on an unfinished character leaves it out of the
  pieces; bytes that never form a character show as U+FFFD once a later token follows them
  (or after HELD_BACK_MAX tokens);
- when one token completes several, EOS wins, then the first stop string, then the first
  stop sequence (in the order they were given).

Nothing here imports torch: the checker replays it from a trace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast


@dataclass(frozen=True)
class StopMatch:
    """A stop that matched: `kind` "text" (RunConfig.stop_strings[index]) or "ids"
    (RunConfig.stop_ids[index]); `position` indexes the round's emitted tokens: the token that
    completed the match (the round's last)."""

    kind: str
    index: int
    position: int

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "index": self.index, "position": self.position}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StopMatch:
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
            window = text_before[-self.text_tail :] if self.text_tail else ""
            text = window + pieces[-1]
            for i, s in enumerate(self.strings):
                if s in text:
                    return "text", i
        for i, seq in enumerate(self.sequences):
            if len(tokens) >= len(seq) and tuple(tokens[-len(seq) :]) == seq:
                return "ids", i
        return None


# What decoding shows for bytes that are not (yet) a whole UTF-8 character
REPLACEMENT = "\ufffd"
# Tokens a character's bytes may be held back over (UTF-8 needs at most 4 bytes; a token that
# completes one character may start the next): past this, the bytes show as they decode
HELD_BACK_MAX = 16


class TokenText:
    """A tokenizer's text of tokens: calling it gives what one token adds to a decoded output
    (cached per id), `joined(tokens)` what several add decoded together, so that the bytes of
    a character split across tokens come out as the character. `decode_after(tokens)` is the
    text the tokens add after a fixed prefix (a leading space included)."""

    def __init__(self, decode_after: Callable[[Sequence[int]], str]):
        self.decode_after = decode_after
        self._alone: dict[int, str] = {}

    def __call__(self, token: int) -> str:
        found = self._alone.get(token)
        if found is None:
            found = self._alone[token] = self.decode_after([int(token)])
        return found

    def joined(self, tokens: Sequence[int]) -> str:
        return self.decode_after([int(t) for t in tokens])


@dataclass(frozen=True)
class _Held:
    """Tokens at the end of the output whose bytes end inside a character, and how much of
    their text is shown already (the whole characters before the unfinished one)."""

    tokens: tuple[int, ...] = ()
    shown: str = ""


class StopTracker:
    """A run's stop state across rounds: the output's recent tokens and text. The verifier
    asks `check(round_tokens)` after each token it emits; the decoder calls `commit` with the
    round's tokens once the round is over.

    `piece` gives a token's text. A TokenText (token_piece_function) also decodes tokens
    together: a token whose bytes end inside a character then adds "" and the token that
    completes the character adds it (module docstring). A plain function is taken as is."""

    def __init__(self, stops: Stops, piece: Callable[[int], str] | None):
        if stops.strings and piece is None:
            raise ValueError("stop strings need the tokenizer (the text of each token)")
        self.stops, self.piece = stops, piece
        self.tokens: list[int] = []  # the output's last few tokens
        self.text = ""  # the output's last few characters
        self.held = _Held()  # the output's unfinished character, if any
        self._round: list[tuple[int, str, _Held]] = []  # this round's tokens so far: (token, piece, held after it)

    def check(self, round_tokens: Sequence[int]) -> StopMatch | None:
        """The stop the last of `round_tokens` (this round's tokens so far) completes."""
        if not self.stops or not round_tokens:
            return None
        tokens = self.tokens + list(round_tokens)
        pieces = self._round_pieces(round_tokens) if self.stops.strings else None
        text_before = self.text + "".join(pieces[:-1]) if pieces is not None else ""
        found = self.stops.match(tokens, None if pieces is None else pieces[-1:], text_before)
        return None if found is None else StopMatch(found[0], found[1], len(round_tokens) - 1)

    def pieces(self, round_tokens: Sequence[int]) -> tuple[str, ...] | None:
        """The pieces a round records (only a run with stop strings needs them)."""
        return tuple(self._round_pieces(round_tokens)) if self.stops.strings else None

    def commit(self, round_tokens: Sequence[int]) -> None:
        self.tokens = (self.tokens + list(round_tokens))[-max(self.stops.ids_tail, 1) :]
        if self.stops.strings:
            pieces = self._round_pieces(round_tokens)
            self.held = self._round[len(round_tokens) - 1][2] if round_tokens else self.held
            self.text = (self.text + "".join(pieces))[-max(self.stops.text_tail, 1) :]
        self._round = []

    def _round_pieces(self, round_tokens: Sequence[int]) -> list[str]:
        """The pieces of this round's tokens after the committed output. The verifier asks for
        growing prefixes of one round: the pieces found so far are kept, not decoded again."""
        same = 0
        while same < min(len(self._round), len(round_tokens)) and self._round[same][0] == round_tokens[same]:
            same += 1
        if same < len(round_tokens):
            del self._round[same:]
            held = self._round[-1][2] if self._round else self.held
            for token in round_tokens[same:]:
                text, held = self._advance(held, int(token))
                self._round.append((int(token), text, held))
        return [text for _, text, _ in self._round[: len(round_tokens)]]

    def _advance(self, held: _Held, token: int) -> tuple[str, _Held]:
        """`token`'s piece after the held tokens, and what is held after it."""
        piece = cast(Callable[[int], str], self.piece)  # a run with stop strings has one (checked in __init__)
        joined: Any = getattr(piece, "joined", None)  # TokenText.joined; None: tokens decode one by one
        if not held.tokens:
            text = piece(token)
            if joined is None or not text.endswith(REPLACEMENT):
                return text, held
        else:
            text = joined(held.tokens + (token,))
        tokens = held.tokens + (token,)
        if text.endswith(REPLACEMENT) and len(tokens) < HELD_BACK_MAX:
            visible = text.rstrip(REPLACEMENT)  # the whole characters before the unfinished one
            return visible[len(held.shown) :], _Held(tokens, visible)
        return text[len(held.shown) :], _Held()


def token_piece_function(tokenizer: Any) -> TokenText:  # a transformers tokenizer
    """id -> the text the token adds to a decoded output (a leading space included: "▁Paris"
    and "ĠParis" give " Paris"), and `.joined(ids)` for tokens decoded together. Found as
    transformers' StopStringCriteria does: decode a fixed prefix's tokens plus these and drop
    the prefix's text."""
    prefix = "abcdef"
    base = list(tokenizer(prefix, add_special_tokens=False)["input_ids"])

    def decode_after(tokens: Sequence[int]) -> str:
        text: str = tokenizer.decode(base + list(tokens), skip_special_tokens=False, clean_up_tokenization_spaces=False)
        at = text.find(prefix)
        return text[at + len(prefix) :] if at >= 0 else text

    return TokenText(decode_after)


def parse_stop_ids(text: str) -> tuple[int, ...]:
    """ "1,2,3" -> (1, 2, 3); ValueError (one line) otherwise."""
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
    """ "2" or "2,107" -> the EOS ids; ValueError (one line) otherwise."""
    try:
        return parse_stop_ids(text)
    except ValueError:
        raise ValueError(f"EOS must be token ids separated by commas, 'auto' or 'none', got {text!r}") from None
