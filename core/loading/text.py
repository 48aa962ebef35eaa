"""A token's text, as a reader sees it: the one function every view, report and command uses
to show one token (the stop rule's piece in context, core.decode.stops.token_piece_function,
is another thing: the text a token adds to the output decoded so far).
"""

from __future__ import annotations

from typing import Any

REPLACEMENT = "\ufffd"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


BYTE_DECODER = {c: b for b, c in _bytes_to_unicode().items()}


def byte_level_text(piece: str) -> str | None:
    """The text of a byte-level BPE piece; bytes that are not valid UTF-8 alone become \\xNN."""
    if not piece or any(ch not in BYTE_DECODER for ch in piece):
        return None
    raw = bytes(BYTE_DECODER[ch] for ch in piece)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "".join(f"\\x{b:02x}" if b >= 0x80 else chr(b) for b in raw)


def token_text(tokenizer: Any, token: int) -> str:
    """The text of one token decoded alone. A token that is only part of a UTF-8 character
    shows its bytes (\\xe2) instead of "\ufffd" (a byte-level BPE vocabulary's piece)."""
    text: str = tokenizer.decode([int(token)])
    if REPLACEMENT in text:
        piece = tokenizer.convert_ids_to_tokens(int(token))
        text = (byte_level_text(piece) if isinstance(piece, str) else None) or text
    return text


def token_label(tokenizer: Any | None, token: int) -> str:
    """A token in a report: its text quoted and its id, or the id alone without a tokenizer."""
    return f"{token_text(tokenizer, token)!r} (id {token})" if tokenizer is not None else f"id {token}"
