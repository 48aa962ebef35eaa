"""core.loading.text: the one token-to-text function the views, reports and commands share."""

from __future__ import annotations

from typing import ClassVar

from specscope.core.loading.text import BYTE_DECODER, byte_level_text, token_label, token_text

BYTE_OF = {b: c for c, b in BYTE_DECODER.items()}  # byte -> its printable byte-level character


class ByteLevel:
    """A byte-level BPE tokenizer's two calls the function uses, over a three-token vocabulary:
    " Paris" and the two bytes of "é" (0xc3 0xa9), each a token of its own."""

    pieces: ClassVar[dict[int, bytes]] = {0: b" Paris", 1: b"\xc3", 2: b"\xa9"}

    def decode(self, ids):
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="replace")

    def convert_ids_to_tokens(self, i):
        return "".join(BYTE_OF[b] for b in self.pieces[i])


def test_a_whole_token_is_its_decoded_text():
    assert token_text(ByteLevel(), 0) == " Paris"


def test_part_of_a_character_shows_its_bytes_not_the_replacement_character():
    assert ByteLevel().decode([1]) == "\ufffd"  # what decode alone shows
    assert token_text(ByteLevel(), 1) == "\\xc3"
    assert token_text(ByteLevel(), 2) == "\\xa9"
    assert ByteLevel().decode([1, 2]) == "é"


def test_a_piece_that_is_not_byte_level_keeps_the_decoded_text():
    assert byte_level_text("") is None and byte_level_text("\u2581Paris") is None


def test_a_report_names_the_text_and_the_id_or_the_id_alone():
    assert token_label(ByteLevel(), 0) == "' Paris' (id 0)"
    assert token_label(None, 7) == "id 7"
