"""Where models come from and how a PanelSettings becomes a running decoder (torch lives here,
never in a widget). Runs in the worker thread.

`ModelHub` loads the bundled target, drafts and tokenizer (they ship in resources/models)
through `specscope.core.loading.models`, and named targets (a fetched model, a checkpoint folder,
a GGUF file). Where the bundled models are missing (a broken install) the window says so in
one line (`MISSING`) and named targets still run. The decoder is built from the settings by
core.decode.factory, as the CLI's and the bench's are. The tests' tiny random models come in
through a subclass that overrides `bundled_target` and `bundled_draft` (tests/tiny_hub.py).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specscope.app.gui.model.settings import PanelSettings
from specscope.core.decode.factory import Models, build_decoder, prompt_ids, run_config
from specscope.core.decode.settings import SettingsError
from specscope.core.loading import catalog, gguf
from specscope.core.loading import models as loading
from specscope.core.loading.errors import CheckpointError
from specscope.core.loading.text import token_text
from specscope.core.records import RunConfig

log = logging.getLogger(__name__)

TokenText = Callable[[int], str]

MISSING = (
    "The bundled models are not installed (resources/models is missing or incomplete): choose a fetched "
    "target (specscope models fetch smollm2) or reinstall specscope."
)


@dataclass
class Prepared:
    """A decoder ready to iterate, with what the views need to show it."""

    decoder: Any  # SpeculativeDecoder
    prompt_ids: list[int]
    config: RunConfig
    token_text: TokenText
    label: str
    model_info: dict[str, str | None] | None = None  # what the recording names (storage ModelInfo keys)
    notes: tuple[str, ...] = ()  # warnings the window shows (tokenizers that differ in a way that changes no id)


@dataclass(frozen=True)
class PlainCost:
    """Plain (non-speculative) cached decoding of the target on a prompt: the first token,
    whose forward processes the whole prompt, and each token after it."""

    first_s: float
    step_s: float

    def total_s(self, tokens: int) -> float:
        """Seconds plain decoding takes for `tokens` new tokens of this prompt."""
        return self.first_s + max(tokens - 1, 0) * self.step_s


class CachedTokenText:
    """token id -> text through a tokenizer (core.loading.text.token_text), memoised (decode
    is slow per call)."""

    def __init__(self, tokenizer: Any | None):
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}
        self._lock = threading.Lock()

    def __call__(self, token: int) -> str:
        text = self._cache.get(token)
        if text is None:
            if self.tokenizer is None:
                text = str(token)
            else:
                try:
                    text = token_text(self.tokenizer, token)
                except Exception:  # noqa: BLE001 - a bad id must not break a tooltip, whatever the tokenizer raises
                    text = f"<{token}>"
            with self._lock:
                self._cache[token] = text
        return text


def available_devices() -> tuple[str, ...]:
    """The devices torch can decode on here (imports torch: seconds, the first time)."""
    import torch

    devices = ["cpu"]
    if torch.cuda.is_available():
        devices += ["cuda"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        devices.append("mps")
    return tuple(devices)


def _target_folder(name: str) -> Path:
    """The checkpoint folder a target name means: a fetched model's (by catalog name), a GGUF
    file's cached conversion (converted first), or the folder itself."""
    path = Path(name).expanduser()
    if not path.exists() and catalog.lookup(name) is not None:
        return catalog.resolve(name)
    if path.is_file():
        return gguf.converted_checkpoint(path)
    return path


def _target_label(name: str, folder: Path) -> str:
    """How a run records a named target, as the CLI's --target does: the catalog name, else
    the checkpoint folder (a GGUF file's cached conversion)."""
    model = catalog.lookup(name) if not Path(name).expanduser().exists() else None
    return model.name if model is not None else str(Path(folder).resolve())


_IMPORT_LOCK = threading.Lock()
_imported = False


def import_transformers() -> None:
    """Import the transformers names the hub uses, once, under a lock: transformers' lazy
    module is not safe to import from two threads at once (the preload's model and the
    GUI thread's tokenizer for a replay failed with "cannot import name 'LlamaConfig'")."""
    global _imported
    if _imported:
        return
    with _IMPORT_LOCK:
        if not _imported:
            from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: F401

            _imported = True


class ModelHub:
    """Loads and caches models; `build(settings)` returns a Prepared decoder.

    The bundled target, drafts and tokenizer come from resources/models; `missing` is the one
    line the window shows when they are not there (None when they are).
    """

    tiny = False  # the bundled models are tiny random stand-ins without a tokenizer (the tests' hub)
    bundled_target_name = loading.BUNDLED_PREFIX + "target"  # how a run records the bundled target
    bundled_words = "bundled target"  # the preload's status line

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards the dicts only, never held while a value is made
        self._key_locks: dict[tuple, threading.RLock] = {}
        # one model load at a time: transformers' from_pretrained builds a model on the meta
        # device through process-wide state, and two threads loading at once (the preload's
        # bundled target while a comparison loads SmolLM2) failed with "Cannot copy out of
        # meta tensor"
        self._load_lock = threading.RLock()
        self._models: dict[tuple, Any] = {}
        self._tokenizer: Any | None = None
        self._token_text: CachedTokenText | None = None
        self._devices: tuple[str, ...] | None = None
        try:
            bundled = bool(loading.bundled_available())
        except Exception:  # noqa: BLE001 - an unreadable resources folder is a missing one
            bundled = False
        self.missing: str | None = None if bundled else MISSING

    # ------------------------------------------------------------------ discovery

    def description(self) -> str:
        return self.missing or "bundled models"

    @property
    def devices_known(self) -> bool:
        """Whether devices() is the real list: it is known once torch is imported (the worker's
        preload imports it; the window never waits for that)."""
        return self._devices is not None or "torch" in sys.modules

    def devices(self) -> tuple[str, ...]:
        """The devices to offer: ("cpu",) until torch is imported (see detect_devices)."""
        if self._devices is None and "torch" in sys.modules:
            self._devices = available_devices()
        return self._devices or ("cpu",)

    def detect_devices(self) -> tuple[str, ...]:
        """The real device list, importing torch when it is not yet (the worker thread calls this)."""
        if self._devices is None:
            self._devices = available_devices()
        return self._devices

    def example_prompts(self) -> list[tuple[str, str]]:
        """(name, text) pairs: the bundled examples (none when they cannot be read)."""
        try:
            return [(f"{p.name} ({p.kind})", p.text) for p in loading.example_prompts()]
        except Exception as exc:  # noqa: BLE001 - a missing prompt file must not stop the app
            log.warning("could not read the example prompts: %s", exc)
            return []

    # ------------------------------------------------------------------ models

    def cached(self, key: tuple, make: Callable[[], Any]) -> Any:
        """One value per key, made once. Each key has its own lock: the GUI thread asking for
        the tokenizer (opening a trace) must not wait while the worker loads a model under
        another key (one lock for all froze the window for the whole load)."""
        with self._lock:
            if key in self._models:
                return self._models[key]
            # re-entrant: a value whose making asks for its own key again must not hang forever
            key_lock = self._key_locks.setdefault(key, threading.RLock())
        with key_lock:
            with self._lock:
                if key in self._models:  # made by another thread while this one waited
                    return self._models[key]
            value = make()
            with self._lock:
                self._models[key] = value
            return value

    @staticmethod
    def load_tokenizer(folder: Any) -> Any:
        import_transformers()
        return loading.load_tokenizer(folder)

    def _load(self, folder: Any, device: str, role: str) -> Any:
        import_transformers()
        with self._load_lock:
            return loading.load_model(folder, device, role=role)

    def bundled_target(self, device: str) -> Any:
        """The bundled target on `device` (a CheckpointError saying MISSING where it is not installed)."""
        if self.missing:
            raise CheckpointError(self.missing)
        return self.cached(
            ("bundled", "target", device), lambda: self._load(loading.bundled_path("target"), device, "target")
        )

    def bundled_draft(self, role: str, device: str) -> Any:
        """A bundled draft, role "draft-small" or "draft-tiny"."""
        if self.missing:
            raise CheckpointError(self.missing)
        return self.cached(("bundled", role, device), lambda: self._load(loading.bundled_path(role), device, "draft"))

    def tokenizer(self) -> Any | None:
        """The bundled tokenizer (None where the bundled models are missing)."""
        if self.missing:
            return None
        return self.cached(("tokenizer",), lambda: self.load_tokenizer(loading.bundled_path("target")))

    def target(self, device: str, name: str = ""):
        """(target model, tokenizer or None): the bundled target, or (`name`) a fetched model by
        its catalog name, a checkpoint folder or a GGUF file, with the tokenizer it carries."""
        if name:
            folder = self.cached(("folder", name), lambda: _target_folder(name))
            model = self.cached(("target", name, device), lambda: self._load(folder, device, "target"))
            return model, self.cached(("tokenizer", name), lambda: self.load_tokenizer(folder))
        return self.bundled_target(device), self.tokenizer()

    def draft(self, name: str, device: str):
        """A bundled draft: "small"/"tiny" (or "draft-small"/"draft-tiny")."""
        return self.bundled_draft("draft-" + name.removeprefix("draft-"), device)

    def checkpoint(self, path: str, device: str):
        return self.cached(("checkpoint", path, device), lambda: self._load(path, device, "draft"))

    def check_draft_tokenizer(self, ref: str, target_tokenizer: Any | None, target_name: str = "") -> list[str]:
        """Refuse (a SettingsError on the proposer field, before any draft weights load) a
        draft whose tokenizer differs from the target's in a way that can change ids: the
        bundled drafts share the bundled target's; a checkpoint folder or GGUF file carries its
        own (none: nothing to compare). The differences that change no id (an NFC normalizer
        one model class adds to the same tokenizer.json) come back as warnings, in words."""
        if target_tokenizer is None or (not target_name and ref.removeprefix("draft-") in loading.BUNDLED_DRAFTS):
            return []
        if ref.removeprefix("draft-") in loading.BUNDLED_DRAFTS:
            draft_tokenizer = self.tokenizer()
        else:
            folder = loading.bundled_path(ref) if ref in loading.BUNDLED_REAL_DRAFTS else Path(ref)
            has_tokenizer = folder.is_file() or any(
                (folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")
            )
            draft_tokenizer = (
                self.cached(("tokenizer", ref), lambda: self.load_tokenizer(folder)) if has_tokenizer else None
            )
        if draft_tokenizer is None:
            return []
        # the comparison parses both tokenizers' JSON (0.7-0.9 s for SmolLM2's pair): once a pair
        problem, harmless = self.cached(
            ("tokenizer-difference", target_name, ref),
            lambda: loading.compare_tokenizers(target_tokenizer, draft_tokenizer),
        )
        if problem:
            raise SettingsError(
                {
                    "proposer": f"this draft cannot propose for {target_name or 'the bundled target'}: "
                    f"its tokenizer differs ({problem}); a draft must share the target's "
                    f"tokenizer"
                }
            )
        for warning in harmless:
            log.warning("the target and draft tokenizers differ harmlessly: %s", warning)
        return [f"The target's and the draft's tokenizers differ, but give the same ids: {w}" for w in harmless]

    def draft_loader(self, device: str) -> Callable[[str], tuple[Any, str]]:
        """core.draft.registry's load_draft for this hub: a bundled draft by name ("small", "tiny"; a
        fetchable target's bundled default draft, "smollm2-draft") or a checkpoint folder ->
        (model, label), through the hub's caches."""

        def load(ref: str) -> tuple[Any, str]:
            if ref.removeprefix("draft-") in loading.BUNDLED_DRAFTS:
                label = "draft-" + ref.removeprefix("draft-")
                return self.draft(label, device), label
            if ref in loading.BUNDLED_REAL_DRAFTS:  # catalog.default_draft of a named target
                return self.checkpoint(str(loading.bundled_path(ref)), device), ref
            return self.checkpoint(ref, device), ref

        return load

    def token_text(self, tokenizer: Any | None) -> TokenText:
        if self._token_text is None or self._token_text.tokenizer is not tokenizer:
            self._token_text = CachedTokenText(tokenizer)
        return self._token_text

    # ------------------------------------------------------------------ prompts

    def encode(self, text: str, tokenizer: Any | None, vocab_size: int) -> list[int]:
        if tokenizer is not None:
            ids = tokenizer.encode(text, add_special_tokens=False) if hasattr(tokenizer, "encode") else tokenizer(text)
            return [int(t) for t in ids]
        parts = text.split()
        if parts and all(p.lstrip("-").isdigit() for p in parts):
            return [int(p) for p in parts]
        # no tokenizer: one token per character, folded into the vocabulary
        return [ord(ch) % vocab_size for ch in text]

    # ------------------------------------------------------------------ build

    def models(self, settings: PanelSettings) -> Models:
        """The target, tokenizer and the draft the settings' spec names, through the hub's caches."""
        return self.models_and_notes(settings)[0]

    def models_and_notes(self, settings: PanelSettings) -> tuple[Models, list[str]]:
        """`models(settings)` and the warnings to show about them (check_draft_tokenizer)."""
        name = settings.target  # the run panel's target menu ("" = bundled)
        target, tokenizer = self.target(settings.device, name)
        ref = settings.model_ref
        notes = self.check_draft_tokenizer(ref, tokenizer, name) if ref is not None else []
        draft, draft_name = self.draft_loader(settings.device)(ref) if ref is not None else (None, None)
        folder = self.cached(("folder", name), lambda: _target_folder(name)) if name else None
        # the bundled target is recorded as the CLI records it (it was its folder's path, which
        # replay took for a local checkpoint)
        target_name = _target_label(name, folder) if folder else self.bundled_target_name
        return Models(target, tokenizer, target_name, draft, draft_name), notes

    def model_info(self, settings: PanelSettings, models: Models) -> dict[str, str | None]:
        """What a recording names of its models, as the CLI's does: the target and draft, and
        the tokenizer with its sha256, so that a replay decodes the tokens with it (the window
        recorded no tokenizer, and its runs replayed as token ids)."""
        name = settings.target
        if name:
            folder = self.cached(("folder", name), lambda: _target_folder(name))
        else:
            folder = None if self.tokenizer() is None else loading.bundled_path("target")
        digest = None
        if folder is not None and models.tokenizer is not None:
            digest = self.cached(("tokenizer_sha256", str(folder)), lambda: loading.tokenizer_sha256(folder))
        return {
            "target_name": models.target_name,
            "draft_name": models.draft_name,
            "tokenizer_name": (str(folder) if name else models.target_name) if digest else None,
            "tokenizer_hash": digest,
        }

    def build(self, settings: PanelSettings, run_id: str | None = None) -> Prepared:
        """The decoder of `settings` (core.decode.factory: the CLI's checks, EOS default and
        position limit); a core SettingsError names the fields that cannot run."""
        settings.check()  # before any model loads
        models, notes = self.models_and_notes(settings)
        decoder = build_decoder(settings, models)
        if settings.chat:  # the prompt is the user's turn: the tokenizer's chat template (core.decode.factory)
            ids = prompt_ids(settings, models, settings.prompt)
        else:
            ids = self.encode(settings.prompt, models.tokenizer, decoder.vocab_size)
        config = run_config(decoder, settings, models, ids, run_id)
        return Prepared(
            decoder,
            ids,
            config,
            self.token_text(models.tokenizer),
            settings.describe(),
            self.model_info(settings, models),
            tuple(notes),
        )

    def measure_plain(self, settings: PanelSettings, prompt_ids: list[int], steps: int = 16) -> PlainCost:
        """What plain cached decoding of the target costs on this prompt with the run's sampler
        (core.decode.baseline.plain_generate): the first token apart, because its
        forward processes the whole prompt, which a per-token average over a few tokens would
        spread over every token of a longer run."""
        from specscope.core.decode.baseline import plain_generate

        target, _ = self.target(settings.device, settings.target)
        n = max(2, min(steps, settings.max_new_tokens))
        sampling = settings.sampling()

        def wall(tokens: int) -> float:
            return plain_generate(target, prompt_ids, tokens, sampling=sampling, seed=settings.seed).wall_s

        wall(2)  # warm-up
        first = min(wall(1), wall(1))
        return PlainCost(first, max(wall(1 + n) - first, 0.0) / n)
