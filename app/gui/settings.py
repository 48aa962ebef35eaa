"""Run settings as typed values, validated field by field (pure Python, no Qt, no torch).

The run panel keeps every field as text; `validate` turns the texts into a RunSettings or
a dict field -> message that the panel shows next to each field.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field

PROPOSERS = ("draft-small", "draft-tiny", "lookup", "checkpoint")
PROPOSER_LABELS = {
    "draft-small": "draft model: small",
    "draft-tiny": "draft model: tiny",
    "lookup": "prompt lookup (n-gram)",
    "checkpoint": "local checkpoint…",
}
FIELDS = (
    "prompt",
    "proposer",
    "checkpoint",
    "k",
    "temperature",
    "top_k",
    "top_p",
    "seed",
    "max_new_tokens",
    "eos",
    "device",
)
MAX_K = 64
MAX_NEW_TOKENS = 100_000


@dataclass(frozen=True)
class RunSettings:
    prompt: str = ""
    proposer: str = "draft-small"
    checkpoint: str = ""
    k: int = 4
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    max_new_tokens: int = 64
    eos: int | None = None  # None = the tokenizer's EOS (or none when it has none)
    eos_disabled: bool = False
    device: str = "cpu"

    def to_texts(self) -> dict[str, str]:
        texts = {k: ("" if v is None else str(v)) for k, v in asdict(self).items()}
        texts["eos"] = "none" if self.eos_disabled else ("auto" if self.eos is None else str(self.eos))
        texts.pop("eos_disabled")
        return texts

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def describe(self) -> str:
        prop = self.proposer if self.proposer != "checkpoint" else f"checkpoint {os.path.basename(self.checkpoint)}"
        samp = "greedy" if self.greedy else f"T={self.temperature:g}"
        return f"{prop}, k={self.k}, {samp}, seed={self.seed}"


@dataclass
class Validation:
    settings: RunSettings | None
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors


def _int(text: str, name: str, lo: int, hi: int, errors: dict[str, str], key: str) -> int | None:
    s = text.strip()
    try:
        value = int(s)
    except ValueError:
        errors[key] = f"{name} must be a whole number" + (f", got “{s}”" if s else "")
        return None
    if not lo <= value <= hi:
        errors[key] = f"{name} must lie in [{lo}, {hi}], got {value}"
        return None
    return value


def _float(text: str, name: str, errors: dict[str, str], key: str) -> float | None:
    s = text.strip()
    try:
        value = float(s)
    except ValueError:
        errors[key] = f"{name} must be a number" + (f", got “{s}”" if s else "")
        return None
    if not math.isfinite(value):
        errors[key] = f"{name} must be finite"
        return None
    return value


def validate(texts: dict[str, str], devices: tuple[str, ...] = ("cpu",), vocab_size: int | None = None) -> Validation:
    """Check every field; never raises. `texts` maps FIELDS to their text."""
    errors: dict[str, str] = {}
    get = lambda key: str(texts.get(key, ""))  # noqa: E731

    prompt = get("prompt")
    if not prompt.strip():
        errors["prompt"] = "the prompt is empty: speculative decoding needs at least one token"

    proposer = get("proposer") or "draft-small"
    if proposer not in PROPOSERS:
        errors["proposer"] = f"unknown proposer “{proposer}”; choose one of {', '.join(PROPOSERS)}"
    checkpoint = get("checkpoint").strip()
    if proposer == "checkpoint":
        if not checkpoint:
            errors["checkpoint"] = "choose a local checkpoint folder (a transformers model directory)"
        elif not os.path.isdir(checkpoint):
            errors["checkpoint"] = f"no such folder: {checkpoint}"
        elif not os.path.exists(os.path.join(checkpoint, "config.json")):
            errors["checkpoint"] = "this folder has no config.json: not a transformers checkpoint"

    k = _int(get("k"), "k (draft length)", 1, MAX_K, errors, "k")
    temperature = _float(get("temperature"), "temperature", errors, "temperature")
    if temperature is not None and temperature < 0:
        errors["temperature"] = "temperature must be >= 0 (0 = greedy)"
    top_k = _int(get("top_k"), "top-k", 0, 10**9, errors, "top_k")
    top_p = _float(get("top_p"), "top-p", errors, "top_p")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        errors["top_p"] = f"top-p must lie in (0, 1] (1 = off), got {top_p:g}"
    seed = _int(get("seed"), "seed", 0, 2**63 - 1, errors, "seed")
    max_new = _int(get("max_new_tokens"), "max new tokens", 1, MAX_NEW_TOKENS, errors, "max_new_tokens")

    eos_text = get("eos").strip().lower()
    eos: int | None = None
    eos_disabled = False
    if eos_text in ("", "auto", "default"):
        pass
    elif eos_text in ("none", "off", "-"):
        eos_disabled = True
    else:
        hi = (vocab_size - 1) if vocab_size else 10**9
        eos = _int(eos_text, "EOS token id", 0, hi, errors, "eos")
        if "eos" in errors:
            errors["eos"] += " (or “auto” / “none”)"

    device = get("device").strip() or "cpu"
    if device not in devices:
        errors["device"] = f"device “{device}” is not available here; available: {', '.join(devices)}"

    if errors:
        return Validation(None, errors)
    return Validation(
        RunSettings(
            prompt=prompt,
            proposer=proposer,
            checkpoint=checkpoint,
            k=k,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            max_new_tokens=max_new,
            eos=eos,
            eos_disabled=eos_disabled,
            device=device,
        )
    )
