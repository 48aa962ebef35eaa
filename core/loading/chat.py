"""Chat prompts: the tokenizer's own chat template, and the token that ends the model's turn.

An instruction-tuned model answers a chat-formatted prompt (system and user turns, then the
header of the assistant's turn) and ends its turn with a token its generation config names.
`chat_prompt_ids` applies the template the checkpoint ships (a GGUF carries it in its
metadata); `turn_end_id` picks the EOS the run stops at.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from specscope.core.loading.errors import CheckpointError
from specscope.core.loading.models import prompts_dir


def chat_prompt_ids(tokenizer: Any, user: str, system: str | None = None) -> list[int]:
    """The ids of a one-question chat: [system,] user, then the assistant's turn header."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise CheckpointError("this model's tokenizer has no chat template: a chat prompt needs one (drop --chat)")
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    try:
        encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    except Exception as exc:  # a template error (e.g. a model without system turns), one line
        raise CheckpointError(f"the model's chat template refused this prompt: {exc}") from exc
    return [int(i) for i in encoded["input_ids"]]


def eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """Every EOS the model's generation config names (several for some chat models), else the tokenizer's."""
    config = getattr(model, "generation_config", None)
    ids = getattr(config, "eos_token_id", None)
    if ids is None:
        ids = getattr(tokenizer, "eos_token_id", None)
    if ids is None:
        return []
    return [int(i) for i in (ids if isinstance(ids, (list, tuple)) else [ids])]


def turn_end_id(model: Any, tokenizer: Any) -> int | None:
    """The EOS a chat run stops at: the generation config's one, or, where it names several, the
    one the chat template writes at the end of a turn (Gemma's <end_of_turn>, not <eos>)."""
    ids = eos_ids(model, tokenizer)
    if len(ids) <= 1:
        return ids[0] if ids else None
    template = getattr(tokenizer, "chat_template", None) or ""
    for i in ids:
        token = tokenizer.convert_ids_to_tokens(i)
        if token and token in template:
            return i
    return ids[0]


@dataclass(frozen=True)
class ChatPrompt:
    name: str
    kind: str  # "chat" | "summary" | "code"
    user: str
    system: str | None = None


def chat_prompts(kind: str | None = None) -> list[ChatPrompt]:
    """The bundled chat prompts for real models (resources/prompts/chat.json), optionally one kind."""
    path = prompts_dir() / "chat.json"
    entries = json.loads(path.read_text(encoding="utf-8"))
    return [
        ChatPrompt(e["name"], e["kind"], e["user"], e.get("system"))
        for e in entries
        if kind is None or e["kind"] == kind
    ]
