"""Run settings as typed values, validated field by field (no Qt).

The run panel keeps every field as text; `validate` turns the texts into a RunSettings or
a dict field -> message that the panel shows next to each field.

The proposer is a core.registry spec ("draft:small", "draft:/path/to/ckpt", "lookup",
"lookup:max_ngram=4"), and the choices offered are derived from the registry, so a newly
registered proposer kind shows up here without a change to the app. The "local
checkpoint…" entry is KIND:PATH; its folder comes from the checkpoint field. A token tree is
part of the spec ("draft:small,tree=3,2,1,children=sampled"; app/gui/tree_settings.py), its
problems reported under "tree" and "children".
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from specscope.core.loading.models import BUNDLED_DRAFTS
from specscope.core.draft.registry import KINDS, ProposerKind, ProposerSpec, SpecError, build_proposer, parse_spec

from .tree_settings import check_tree, describe_tree, grows_trees, tree_choice_specs

PATH_ARG = "PATH"  # KIND:PATH = the "local checkpoint…" entry; the folder is the checkpoint field
DEFAULT_PROPOSER = "draft:small"
# Proposer names of settings saved before the registry: name -> spec.
LEGACY_PROPOSERS = {"draft-small": "draft:small", "draft-tiny": "draft:tiny", "checkpoint": f"draft:{PATH_ARG}"}


@dataclass(frozen=True)
class ProposerChoice:
    spec: str
    label: str

    @property
    def needs_path(self) -> bool:
        return _needs_path(self.spec)


def _title(kind: ProposerKind) -> str:
    """A kind's name for people: its summary up to the first colon ("prompt lookup")."""
    head = kind.summary.split(":", 1)[0].strip()
    return head if head and len(head) <= 40 else kind.name


def _defaults(kind: ProposerKind) -> str:
    return ", ".join(f"{p.name}={p.default}" for p in kind.params)


def proposer_choices(with_checkpoint: bool = True, with_trees: bool = True) -> list[ProposerChoice]:
    """What a proposer menu offers, from the registry: for a kind with a model, the bundled
    drafts, (optionally) token trees of the first one and a local checkpoint; one entry, with
    its defaults, per other kind. The run panel has its own tree fields (with_trees=False)."""
    out: list[ProposerChoice] = []
    for kind in KINDS.values():
        if kind.needs_model:
            out += [ProposerChoice(f"{kind.name}:{name}", f"{kind.name} model: {name}") for name in BUNDLED_DRAFTS]
            if with_trees and kind.param("tree") is not None and BUNDLED_DRAFTS:
                out += [ProposerChoice(spec, label) for spec, label in tree_choice_specs(kind.name, BUNDLED_DRAFTS[0])]
            if with_checkpoint:
                label = "local checkpoint…" if kind.name == "draft" else f"{kind.name}: local checkpoint…"
                out.append(ProposerChoice(f"{kind.name}:{PATH_ARG}", label))
        else:
            defaults = _defaults(kind)
            out.append(ProposerChoice(kind.name, f"{_title(kind)} ({defaults})" if defaults else _title(kind)))
    return out


def _model_kind(spec: ProposerSpec) -> bool:
    kind = KINDS.get(spec.kind)
    return kind is not None and kind.needs_model


def _needs_path(text: str) -> bool:
    kind, _, arg = text.partition(":")
    return arg == PATH_ARG and kind in KINDS and KINDS[kind].needs_model


def spec_text(proposer: str, checkpoint: str = "") -> str:
    """The spec a proposer field names: a legacy name mapped, KIND:PATH given the checkpoint
    folder (when there is one). Not validated."""
    text = proposer.strip()
    text = LEGACY_PROPOSERS.get(text, text) or DEFAULT_PROPOSER
    if _needs_path(text) and checkpoint.strip():
        return f"{text.partition(':')[0]}:{checkpoint.strip()}"
    return text


def menu_spec(text: str) -> str | None:
    """The menu form of a spec or legacy name: a kind with a model names it ("draft" ->
    "draft:small"), parameters at their defaults are left out; None when it does not parse."""
    text = text.strip()
    try:
        spec = parse_spec(LEGACY_PROPOSERS.get(text, text) or DEFAULT_PROPOSER)
    except SpecError:
        return None
    kind = KINDS[spec.kind]
    if kind.needs_model:
        return str(replace(spec, arg=spec.model_ref))
    return str(replace(spec, params={k: v for k, v in spec.params.items() if kind.param(k).default != v}))


def checkpoint_of(spec: str) -> str | None:
    """The checkpoint folder a spec loads its model from (None: bundled or no model)."""
    try:
        parsed = parse_spec(spec)
    except SpecError:
        return None
    ref = parsed.model_ref
    return ref if ref is not None and ref not in BUNDLED_DRAFTS and ref != PATH_ARG else None


def proposer_label(spec: str) -> str:
    """How a menu or summary names a proposer spec."""
    spec = menu_spec(spec) or spec
    for choice in proposer_choices():
        if choice.spec == spec:
            return choice.label
    path = checkpoint_of(spec)
    return f"checkpoint {os.path.basename(os.path.normpath(path))}" if path else spec


def spec_of_run(proposer: str, params: Mapping[str, Any], draft_name: str | None) -> str | None:
    """The spec that reruns a recorded run (its RunConfig's proposer, proposer_params and
    draft_name), or None when it cannot be rerun from the menu (a local checkpoint). The
    decoder records the spec as proposer_params["spec"]; older traces have the kind only."""
    try:
        spec = parse_spec(str((params or {}).get("spec") or proposer))
    except SpecError:
        return None
    kind = KINDS[spec.kind]
    if kind.needs_model:
        name = (spec.arg or draft_name or "").removeprefix("specscope/").removeprefix("draft-")
        given = {**spec.params, **(params or {})}  # a tree run's params name its tree and children
        trees = {key: given[key] for key in ("tree", "children") if given.get(key)} if given.get("tree") else {}
        return str(ProposerSpec(kind.name, name, trees)) if name in BUNDLED_DRAFTS else None
    given = dict(params or {}, **spec.params)
    return menu_spec(str(ProposerSpec(kind.name, None, {p.name: given[p.name] for p in kind.params if p.name in given})))


FIELDS = (
    "prompt",
    "engine",
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
# Who decodes: specscope's SpeculativeDecoder, or transformers' own generate() recorded
# round by round (core.engines.TransformersEngine; proposers: draft models and lookup).
ENGINES = ("specscope", "transformers")
MAX_NEW_TOKENS = 100_000


@dataclass(frozen=True)
class RunSettings:
    prompt: str = ""
    proposer: str = DEFAULT_PROPOSER  # a core.registry spec
    checkpoint: str = ""  # the folder of a KIND:PATH spec, "" otherwise
    k: int = 4
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    max_new_tokens: int = 64
    eos: int | None = None  # None = the tokenizer's EOS (or none when it has none)
    eos_disabled: bool = False
    device: str = "cpu"
    engine: str = "specscope"  # one of ENGINES
    threads: int | None = None  # torch CPU threads; None = threads.default_threads()

    def to_texts(self) -> dict[str, str]:
        texts = {k: ("" if v is None else str(v)) for k, v in asdict(self).items()}
        texts["eos"] = "none" if self.eos_disabled else ("auto" if self.eos is None else str(self.eos))
        texts.pop("eos_disabled")
        texts["threads"] = "auto" if self.threads is None else str(self.threads)
        return texts

    @property
    def spec(self) -> str:
        """The proposer spec (also for settings written with a legacy proposer name)."""
        return spec_text(self.proposer, self.checkpoint)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def describe(self) -> str:
        path = checkpoint_of(self.spec)
        prop = f"checkpoint {os.path.basename(path)}" if path else self.spec
        samp = "greedy" if self.greedy else f"T={self.temperature:g}"
        engine = "" if self.engine == "specscope" else f"{self.engine}: "
        # with a tree, k does not apply (the spec names the tree)
        length = "" if describe_tree(self.spec) else f", k={self.k}"
        return f"{engine}{prop}{length}, {samp}, seed={self.seed}"


@dataclass
class Validation:
    settings: RunSettings | None
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors


def _parse(text: str, name: str, convert, noun: str, errors: dict[str, str], key: str):
    s = text.strip()
    try:
        return convert(s)
    except ValueError:
        errors[key] = f"{name} must be {noun}" + (f", got “{s}”" if s else "")
        return None


def _int(text: str, name: str, lo: int, hi: int, errors: dict[str, str], key: str) -> int | None:
    value = _parse(text, name, int, "a whole number", errors, key)
    if value is not None and not lo <= value <= hi:
        errors[key] = f"{name} must lie in [{lo}, {hi}], got {value}"
        return None
    return value


def _float(text: str, name: str, errors: dict[str, str], key: str) -> float | None:
    value = _parse(text, name, float, "a number", errors, key)
    if value is not None and not math.isfinite(value):
        errors[key] = f"{name} must be finite"
        return None
    return value


def _checkpoint_error(folder: str) -> str | None:
    if not folder:
        return "choose a local checkpoint folder (a transformers model directory)"
    if not os.path.isdir(folder):
        return f"no such folder: {folder}"
    if not os.path.exists(os.path.join(folder, "config.json")):
        return "this folder has no config.json: not a transformers checkpoint"
    return None


def _proposer(text: str, checkpoint: str, errors: dict[str, str]) -> tuple[str, str]:
    """(spec, checkpoint folder) of the proposer fields; problems go to errors["proposer"] or
    errors["checkpoint"]. A kind without a model is built once, which checks its parameters."""
    text = text.strip() or DEFAULT_PROPOSER
    if _needs_path(LEGACY_PROPOSERS.get(text, text)) and not checkpoint:
        errors["checkpoint"] = _checkpoint_error("")
        return text, checkpoint
    try:
        spec = parse_spec(spec_text(text, checkpoint))
        if not _model_kind(spec):
            build_proposer(spec)
    except (SpecError, ValueError) as exc:
        errors["proposer"] = str(exc)
        return text, checkpoint
    if grows_trees(str(spec)):
        check_tree(spec.params, errors)  # the parser the CLI and the proposer use
    if _model_kind(spec):
        spec = replace(spec, arg=spec.model_ref)
        path = checkpoint_of(str(spec))
        problem = _checkpoint_error(path) if path is not None else None
        if problem:
            errors["checkpoint"] = problem
        checkpoint = path or ""
    return str(spec), checkpoint


def validate(texts: dict[str, str], devices: tuple[str, ...] = ("cpu",), vocab_size: int | None = None) -> Validation:
    """Check every field; never raises. `texts` maps FIELDS to their text."""
    errors: dict[str, str] = {}
    get = lambda key: str(texts.get(key, ""))  # noqa: E731

    prompt = get("prompt")
    if not prompt.strip():
        errors["prompt"] = "the prompt is empty: speculative decoding needs at least one token"

    proposer, checkpoint = _proposer(get("proposer"), get("checkpoint").strip(), errors)

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

    engine = _engine(get("engine"), proposer, errors)
    threads = _threads(get("threads"), errors)
    device = get("device").strip() or "cpu"
    if device not in devices:
        errors["device"] = f"device “{device}” is not available here; available: {', '.join(devices)}"

    if errors:
        return Validation(None, errors)
    return Validation(RunSettings(
        prompt=prompt, proposer=proposer, checkpoint=checkpoint, k=k, temperature=temperature, top_k=top_k,
        top_p=top_p, seed=seed, max_new_tokens=max_new, eos=eos, eos_disabled=eos_disabled, device=device,
        engine=engine, threads=threads,
    ))


def _threads(text: str, errors: dict[str, str]) -> int | None:
    """The threads field: "auto" (or empty) = the default, else 1..MAX_THREADS."""
    from specscope.app.threads import MAX_THREADS

    text = text.strip().lower()
    if text in ("", "auto"):
        return None
    value = _int(text, "threads", 1, MAX_THREADS, errors, "threads")
    if "threads" in errors:
        errors["threads"] += " (or “auto”)"
    return value


def _engine(text: str, proposer: str, errors: dict[str, str]) -> str:
    """The engine field; transformers runs draft models and prompt lookup (max_ngram) only."""
    engine = text.strip().lower() or "specscope"
    if engine not in ENGINES:
        errors["engine"] = f"engine must be one of {', '.join(ENGINES)}, got “{text.strip()}”"
    elif engine == "transformers" and "proposer" not in errors:
        try:
            spec = parse_spec(proposer)
        except SpecError:
            return engine
        extra = set(spec.params) - ({"max_ngram"} if spec.kind == "lookup" else set())
        if "tree" in extra:
            errors["tree"] = "the transformers engine drafts chains: choose the specscope engine for a tree"
        elif spec.kind not in ("draft", "lookup") or extra:
            errors["proposer"] = ("the transformers engine runs draft models and prompt lookup (max_ngram only), "
                                  f"not {spec}")
    return engine
