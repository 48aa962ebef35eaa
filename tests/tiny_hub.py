"""The window's model hub on the tests' tiny random models (tests/tiny_models.py): a tiny
Llama target and two noisy copies of it as the drafts "small" and "tiny", no tokenizer (token
text is the id). Fast and deterministic: the GUI tests' `hub` fixture and the screenshot
script's --tiny use it. Production code has no tiny models: without the bundled models the
window says so in one line (app/gui/sessions/hub.py)."""

from __future__ import annotations

from typing import Any

from specscope.app.gui.sessions.hub import ModelHub, import_transformers
from tests.tiny_models import noisy_copy, tiny_lm

PROMPTS = (
    ("counting", "1 2 3 4 5 6 7 8 1 2 3 4 5"),
    ("repetition", "7 7 9 7 7 9 7 7 9 7"),
    ("short", "3 14 15 9 26"),
)
DRAFT_NOISE = {"draft-small": (0.25, 1), "draft-tiny": (0.9, 2)}  # role -> (noise, seed)


class TinyModelHub(ModelHub):
    """Always the tiny random models, in place of the bundled ones."""

    tiny = True
    bundled_target_name = "tiny-target"
    bundled_words = "tiny random target"

    def __init__(self) -> None:
        super().__init__()
        self.missing = None  # the tiny models stand in for the bundled ones

    def description(self) -> str:
        return "tiny random models (the tests' stand-ins for the bundled ones)"

    def example_prompts(self) -> list[tuple[str, str]]:
        return list(PROMPTS)

    def tokenizer(self) -> Any | None:
        return None

    def bundled_target(self, device: str) -> Any:
        import_transformers()
        return self.cached(
            ("tiny", "target", device),
            lambda: tiny_lm("llama", vocab=64, seed=0, positions=4096, sharpen=6.0, bos=1, eos=2).to(device),
        )

    def bundled_draft(self, role: str, device: str) -> Any:
        """role: "draft-small" or "draft-tiny": the target plus noise (made from it, so the
        target is cached first under its own key)."""
        target = self.bundled_target(device)
        noise, seed = DRAFT_NOISE[role]
        return self.cached(("tiny", role, device), lambda: noisy_copy(target, noise, seed=seed, floor=0.0).to(device))
