"""Run settings as typed values, validated field by field (no Qt).

The run panel keeps every field as text; `validate` turns the texts into a PanelSettings (the
core's RunSettings, core.settings.model, with the prompt text, the target and the checkpoint
folder) or a dict field -> message that the panel shows next to each field. Only the text ->
number step and what the window alone has (the prompt text, the checkpoint folder, the device
menu) are checked here: every value is checked by the core's RunSettings.validate, against the
bounds of core.settings.bounds, with the messages the CLI gives.

The proposer is a core.draft.registry spec ("draft:small", "draft:/path/to/ckpt", "lookup",
"lookup:max_ngram=4"), and the choices offered are derived from the registry, so a newly
registered proposer kind shows up here without a change to the app. The "local
checkpoint…" entry is KIND:PATH; its folder comes from the checkpoint field. A token tree is
part of the spec ("draft:small,tree=3,2,1,children=sampled"; app/gui/model/tree_settings.py), its
problems reported under "tree" and "children".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from specscope.core.draft.registry import KINDS, ProposerKind, ProposerSpec, SpecError, parse_spec
from specscope.core.loading.models import BUNDLED_DRAFTS, BUNDLED_HEADS, BUNDLED_REAL_DRAFTS, BUNDLED_REAL_HEADS
from specscope.core.settings.bounds import BOUNDS, MAX_K  # noqa: F401 (MAX_K: the run panel's name)
from specscope.core.settings.model import DEFAULT_PROPOSER, FIELD_NAMES, eos_vocab_problem
from specscope.core.settings.model import RunSettings as CoreRunSettings
from specscope.core.settings.vocab import ENGINES as ALL_ENGINES
from specscope.core.settings.vocab import AutoK

from .tree_settings import describe_tree, tree_choice_specs

# The engines the window runs (vllm: app/gui/sessions/vllm.py, in vLLM's own venv).
ENGINES = tuple(ALL_ENGINES)


def engine_note(engine: str) -> str | None:
    """One line saying why an engine cannot run here (vllm without `specscope vllm setup`),
    None when it can: the engine menus show it on the entry, Run shows it under the field."""
    if engine != "vllm":
        return None
    from specscope.core.engines.vllm.setup import not_set_up

    return not_set_up()


def note_engines(combo: Any) -> None:
    """An engine menu (a QComboBox of ENGINES): an engine that cannot run here says why in one
    line on its entry (its tooltip: how to run `specscope vllm setup`)."""
    from PySide6.QtCore import Qt

    for i in range(combo.count()):
        if note := engine_note(combo.itemText(i)):
            combo.setItemData(i, note, Qt.ItemDataRole.ToolTipRole)


# Drafts and heads the package ships, named (not paths): the bundled target's and a fetchable
# target's own (catalog default_draft / default_heads: smollm2-draft, eagle3-smollm2).
NAMED_DRAFTS = BUNDLED_DRAFTS + BUNDLED_REAL_DRAFTS
NAMED_HEADS = BUNDLED_HEADS + BUNDLED_REAL_HEADS
PATH_ARG = "PATH"  # KIND:PATH = the "local checkpoint…" entry; the folder is the checkpoint field
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


def drafts_for(target: str | None) -> tuple[str, ...]:
    """The shipped drafts that share `target`'s tokenizer: the bundled target's ("" = it), a
    catalogued model's own (catalog default_draft: smollm2 -> smollm2-draft); every shipped
    draft for None (a menu that follows no target) or a local checkpoint (its tokenizer is
    compared when the run starts)."""
    if target is None:
        return NAMED_DRAFTS
    if not target.strip():
        return BUNDLED_DRAFTS
    owned = _target_draft(target)
    if owned is not None:
        return (owned,)
    return () if _catalogued(target) else BUNDLED_DRAFTS


def _catalogued(target: str) -> bool:
    from specscope.core.loading import catalog

    return not os.path.exists(target) and catalog.lookup(target) is not None


def _target_draft(target: str) -> str | None:
    """The shipped draft a catalogued target drafts with (None: none, or not catalogued)."""
    from specscope.core.loading import catalog

    if not _catalogued(target):
        return None
    default = catalog.default_proposer(target)
    try:
        ref = parse_spec(default).model_ref if default else None
    except SpecError:
        return None
    return ref if ref in BUNDLED_REAL_DRAFTS else None


def draft_owner(name: str) -> str:
    """Whose tokenizer a shipped draft shares: "the bundled target" or a catalogued model's name."""
    from specscope.core.loading import catalog

    for model in catalog.CATALOG.values():
        if _target_draft(model.name) == name:
            return model.name
    return "the bundled target"


def proposer_choices(
    with_checkpoint: bool = True, with_trees: bool = True, target: str | None = None
) -> list[ProposerChoice]:
    """What a proposer menu offers, from the registry: for a kind with a model, the bundled
    drafts, (optionally) token trees of the first one and a local checkpoint; for a head kind,
    the target's trained head where one ships (the bundled target's, or a named target's own:
    catalog default_heads; with_trees, also drafting one-hot) and
    (optionally) a head checkpoint; one entry, with its defaults, per other kind. The run panel
    has its own tree and draw fields (with_trees=False)."""
    out: list[ProposerChoice] = []
    for kind in KINDS.values():
        if kind.takes_path:  # a draft head: its checkpoint folder is the checkpoint field
            if kind.bundled_head:
                out.append(ProposerChoice(kind.name, f"{kind.name}: the target's trained head"))
                if with_trees and kind.param("draw") is not None:
                    out.append(
                        ProposerChoice(
                            f"{kind.name}:draw=onehot", f"{kind.name}: the target's trained head, one-hot drafts"
                        )
                    )
            if with_checkpoint:
                out.append(ProposerChoice(f"{kind.name}:{PATH_ARG}", f"{kind.name}: head checkpoint…"))
            continue
        if kind.needs_model:
            drafts = drafts_for(target)
            out += [ProposerChoice(f"{kind.name}:{name}", f"{kind.name} model: {name}") for name in drafts]
            if with_trees and kind.param("tree") is not None and drafts:
                out += [ProposerChoice(spec, label) for spec, label in tree_choice_specs(kind.name, drafts[0])]
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
    return arg == PATH_ARG and kind in KINDS and (KINDS[kind].needs_model or KINDS[kind].takes_path)


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
    ref = parsed.arg if KINDS[parsed.kind].takes_path else parsed.model_ref
    if ref is None or ref == PATH_ARG or (ref in NAMED_DRAFTS + NAMED_HEADS and not os.path.exists(ref)):
        return None  # a shipped draft or head, by name (resources/models/NAME wherever the window started)
    return ref


def proposer_label(spec: str) -> str:
    """How a menu or summary names a proposer spec."""
    spec = menu_spec(spec) or spec
    for choice in proposer_choices():
        if choice.spec == spec:
            return choice.label
    path = checkpoint_of(spec)
    if path is None:
        return spec
    kind = spec.partition(":")[0]
    return f"{'' if kind == 'draft' else kind + ' '}checkpoint {os.path.basename(os.path.normpath(path))}"


def spec_of_run(
    proposer: str, params: Mapping[str, Any], draft_name: str | None, target_name: str | None = None
) -> str | None:
    """The spec that reruns a recorded run (its RunConfig's proposer, proposer_params,
    draft_name and target_name), or None when it cannot be rerun from the menu (a head
    checkpoint folder, a draft checkpoint that is not here any more). The decoder records the spec as
    proposer_params["spec"]; older traces have
    the kind only. A shipped head (eagle3:eagle3-smollm2, recorded as bundled:eagle3-smollm2)
    reruns as the menu's "the target's trained head" when it is the run's target's own."""
    try:
        spec = parse_spec(str((params or {}).get("spec") or proposer))
    except SpecError:
        return None
    kind = KINDS[spec.kind]
    if kind.takes_path and spec.arg is not None:
        head = spec.arg.removeprefix("bundled:")
        if head not in NAMED_HEADS or os.path.exists(spec.arg):
            return None  # a head from a checkpoint folder (not a shipped one)
        given = {**(params or {}), **spec.params}
        kept = {p.name: given[p.name] for p in kind.params if given.get(p.name) not in (None, "")}
        own = head == _own_head(kind.name, target_name)
        return menu_spec(str(ProposerSpec(kind.name, None if own else head, kept)))
    if kind.needs_model:
        name = (spec.arg or draft_name or "").removeprefix("specscope/").removeprefix("draft-")
        given = {**spec.params, **(params or {})}  # a tree run's params name its tree and children
        trees = {key: given[key] for key in ("tree", "children") if given.get(key)} if given.get("tree") else {}
        if name in NAMED_DRAFTS:
            return str(ProposerSpec(kind.name, name, trees))
        # a draft from a checkpoint folder or GGUF file that is still there: the "local checkpoint…" entry
        path = next((p for p in (spec.arg, draft_name) if p and os.path.isabs(p) and os.path.exists(p)), None)
        return str(ProposerSpec(kind.name, path, trees)) if path else None
    given = dict(params or {}, **spec.params)
    return menu_spec(
        str(ProposerSpec(kind.name, None, {p.name: given[p.name] for p in kind.params if p.name in given}))
    )


def _own_head(kind: str, target_name: str | None) -> str | None:
    """The shipped head of this kind that `kind` alone names for the run's target: a
    catalogued target's own (catalog default_heads), else the bundled target's."""
    from specscope.core.loading import catalog

    name = (target_name or "").strip()
    own = catalog.default_head(name, kind) if name and not os.path.exists(name) else None
    return own or KINDS[kind].bundled_head


FIELDS = (
    "prompt",
    "target",
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
# The text of the run panel's fields (FIELDS, the tree fields folded into the proposer, threads).
TEXT_FIELDS = FIELDS + ("threads",)
# The run panel's chat and stop fields (texts of their own: see to_texts and _stops)
CHAT_STOP_FIELDS = ("chat", "system", "stop_strings", "stop_ids")


@dataclass(frozen=True)
class PanelSettings(CoreRunSettings):
    """The core's RunSettings (core.settings.model: validated there, built into a decoder by
    core.decode.factory) with what the run panel adds: the prompt text, the target and the
    folder of a "local checkpoint…" (KIND:PATH) proposer."""

    prompt: str = ""
    k: int | AutoK = "auto"  # the window's default: each round's length chosen by cost (core.decode.draft_length)
    checkpoint: str = ""  # the folder of a KIND:PATH spec, "" otherwise
    target: str = ""  # "" = the bundled target; a fetched model's name, a checkpoint folder or a GGUF file

    def to_texts(self) -> dict[str, str]:
        values = asdict(self)
        texts = {k: ("" if values[k] is None else str(values[k])) for k in TEXT_FIELDS}
        eos = self.eos if not isinstance(self.eos, tuple) else ",".join(str(i) for i in self.eos)
        texts["eos"] = "none" if self.eos_disabled else ("auto" if eos is None else str(eos))
        texts["threads"] = "auto" if self.threads is None else str(self.threads)
        texts["chat"] = "on" if self.chat else ""
        texts["system"] = self.system or ""
        texts["stop_strings"] = "\n".join(s.replace("\\", "\\\\").replace("\n", "\\n") for s in self.stop_strings)
        texts["stop_ids"] = "; ".join(",".join(str(t) for t in seq) for seq in self.stop_ids)
        return texts

    @property
    def spec(self) -> str:
        """The proposer spec (also for settings written with a legacy proposer name)."""
        return spec_text(self.proposer, self.checkpoint)

    def describe(self) -> str:
        path = checkpoint_of(self.spec)
        prop = f"checkpoint {os.path.basename(path)}" if path else self.spec
        samp = "greedy" if self.greedy else f"T={self.temperature:g}"
        engine = "" if self.engine == "specscope" else f"{self.engine}: "
        # with a tree, k does not apply (the spec names the tree)
        length = "" if describe_tree(self.spec) else f", k={self.k}"
        target = f"{os.path.basename(os.path.normpath(self.target))} · " if self.target else ""
        return f"{target}{engine}{prop}{length}, {samp}, seed={self.seed}"


@dataclass
class Validation:
    settings: PanelSettings | None
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors


def _parse(text: str, name: str, convert, noun: str, errors: dict[str, str], key: str):
    """A field's text as a number (None, with errors[key] set, when it is not one); the
    number's range is the core settings' check."""
    s = text.strip()
    try:
        return convert(s)
    except ValueError:
        errors[key] = f"{name} must be {noun}" + (f", got “{s}”" if s else "")
        return None


def _is_gguf(path: str) -> bool:
    """A GGUF file (its magic bytes), which the loader converts once and caches (core.loading.gguf)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def _checkpoint_error(folder: str) -> str | None:
    if not folder:
        return "choose a local checkpoint folder (a transformers model directory) or a GGUF file"
    if os.path.isfile(folder):
        return None if _is_gguf(folder) else f"{folder} is a file but not a GGUF file: choose a checkpoint folder"
    if not os.path.isdir(folder):
        return f"no such folder: {folder}"
    if not os.path.exists(os.path.join(folder, "config.json")):
        return "this folder has no config.json: not a transformers checkpoint"
    return None


def _target_error(target: str) -> str | None:
    """Why a target the menu names cannot load (None: it can): a catalogued model not fetched
    yet, or a folder or file that is not a checkpoint."""
    from specscope.core.loading import catalog

    model = catalog.lookup(target) if not os.path.exists(target) else None
    if model is not None:
        fetched = catalog.cached_checkpoint(model) is not None or catalog.fetched_gguf(model).is_file()
        return None if fetched else f"{model.name} is not on this machine yet: choose it in the menu to fetch it"
    return _checkpoint_error(target)


def draft_target_problem(spec: str, target: str) -> str | None:
    """Why a shipped draft cannot propose for `target` (None: it can, or it is not a shipped
    draft): the bundled drafts share the bundled target's tokenizer, smollm2-draft SmolLM2's.
    Said before any model loads (the draft was refused at Step, as a tokenizer mismatch)."""
    try:
        parsed = parse_spec(spec)
    except SpecError:
        return None
    ref = parsed.model_ref if KINDS[parsed.kind].needs_model else None
    if ref is None or ref not in NAMED_DRAFTS or os.path.exists(ref):
        return None
    if not target.strip() or not _catalogued(target):  # a local checkpoint's tokenizer is compared when it loads
        if ref in BUNDLED_REAL_DRAFTS and not target.strip():
            return (
                f"draft model: {ref} drafts for {draft_owner(ref)}, not the bundled target (its tokenizer "
                f"differs): choose Target {draft_owner(ref)}, or draft model: small"
            )
        return None
    if ref in drafts_for(target):
        return None
    from specscope.core.loading import catalog

    name = catalog.lookup(target).name
    own = _target_draft(target)
    offer = f"draft model: {own} ({name}'s own draft), " if own else ""
    return (
        f"draft model: {ref} shares {draft_owner(ref)}'s tokenizer, not {name}'s: choose {offer}"
        f"the target's trained head or prompt lookup"
    )


def _proposer(text: str, checkpoint: str, errors: dict[str, str]) -> tuple[str, str]:
    """(spec, checkpoint folder) of the proposer fields, a model kind's spec naming its model;
    a missing or unusable checkpoint folder goes to errors["checkpoint"]. The spec itself
    (kind, parameters, tree) is the core settings' check."""
    text = text.strip() or DEFAULT_PROPOSER
    if _needs_path(LEGACY_PROPOSERS.get(text, text)) and not checkpoint:
        errors["checkpoint"] = _checkpoint_error("")
        return text, checkpoint
    try:
        spec = parse_spec(spec_text(text, checkpoint))
    except SpecError:
        return text, checkpoint
    if _model_kind(spec):
        spec = replace(spec, arg=spec.model_ref)
        path = checkpoint_of(str(spec))
        problem = _checkpoint_error(path) if path is not None else None
        if problem:
            errors["checkpoint"] = problem
        checkpoint = path or ""
    return str(spec), checkpoint


def _numbers(get, errors: dict[str, str]) -> dict[str, Any]:
    """The numeric fields that parse, as numbers (the others' errors say why)."""
    whole = lambda s: int(s)  # noqa: E731
    fields = {
        "k": (lambda s: "auto" if s.lower() == "auto" else int(s), "a whole number or “auto”"),
        "temperature": (float, "a number"),
        "top_k": (whole, "a whole number"),
        "top_p": (float, "a number"),
        "seed": (whole, "a whole number"),
        "max_new_tokens": (whole, "a whole number"),
    }
    values = {}
    for key, (convert, noun) in fields.items():
        value = _parse(get(key), FIELD_NAMES[key], convert, noun, errors, key)
        if value is not None:
            values[key] = value
    return values


def _eos(text: str, errors: dict[str, str]) -> tuple[int | tuple[int, ...] | None, bool]:
    """The EOS field: (a token id, several separated by commas, or None for the model's; disabled)."""
    text = text.strip().lower()
    if text in ("", "auto", "default"):
        return None, False
    if text in ("none", "off", "-"):
        return None, True
    ids = [
        _parse(part, FIELD_NAMES["eos"], int, "token ids separated by commas, “auto” or “none”", errors, "eos")
        for part in text.split(",")
    ]
    if "eos" in errors:
        return None, False
    return (ids[0] if len(ids) == 1 else tuple(ids)), False


def _stops(get, errors: dict[str, str]) -> dict[str, Any]:
    """The chat and stop fields: chat on/off, the system text, stop strings (one per line; \\n
    writes a newline, \\\\ a backslash), stop token sequences ("1,2,3; 7,8")."""
    from specscope.core.decode.stops import parse_stop_ids

    lines = [line for line in get("stop_strings").split("\n") if line]
    strings = tuple(_unescape(line) for line in lines)
    seqs = []
    for part in (p.strip() for p in get("stop_ids").split(";")):
        if not part:
            continue
        try:
            seqs.append(parse_stop_ids(part))
        except ValueError as exc:
            errors["stop_ids"] = f"{FIELD_NAMES['stop_ids']}: {exc}"
    chat = get("chat").strip().lower() in ("on", "true", "1", "yes")
    system = get("system").strip() or None
    return dict(stop_strings=strings, stop_ids=tuple(seqs), chat=chat, system=system if chat else None)


def _unescape(line: str) -> str:
    out, i = [], 0
    while i < len(line):
        if line[i] == "\\" and i + 1 < len(line) and line[i + 1] in "n\\":
            out.append("\n" if line[i + 1] == "n" else "\\")
            i += 2
        else:
            out.append(line[i])
            i += 1
    return "".join(out)


def validate(texts: dict[str, str], devices: tuple[str, ...] = ("cpu",), vocab_size: int | None = None) -> Validation:
    """Check every field; never raises. `texts` maps FIELDS to their text. Each value is
    checked by the core's RunSettings.validate, the check the CLI makes, with its messages."""
    errors: dict[str, str] = {}
    get = lambda key: str(texts.get(key, ""))  # noqa: E731

    prompt = get("prompt")
    if not prompt.strip():
        errors["prompt"] = "the prompt is empty: speculative decoding needs at least one token"
    proposer, checkpoint = _proposer(get("proposer"), get("checkpoint").strip(), errors)
    target = get("target").strip()
    if target and (problem := _target_error(target)):
        errors["target"] = problem
    if "proposer" not in errors and (problem := draft_target_problem(proposer, target)):
        errors["proposer"] = problem
    numbers = _numbers(get, errors)
    eos, eos_disabled = _eos(get("eos"), errors)
    threads = _threads(get("threads"), errors)
    stops = _stops(get, errors)
    device = get("device").strip() or "cpu"
    if device not in devices:
        errors["device"] = f"device “{device}” is not available here; available: {', '.join(devices)}"
    settings = PanelSettings(
        prompt=prompt,
        target=target,
        proposer=proposer,
        checkpoint=checkpoint,
        eos=eos,
        eos_disabled=eos_disabled,
        device=device,
        engine=get("engine").strip().lower() or "specscope",
        threads=threads,
        **stops,
        **numbers,
    )
    for key, message in settings.validate().items():
        errors.setdefault(key, message)  # a field whose text did not parse keeps that message
    if "engine" not in errors and (note := engine_note(settings.engine)):
        errors["engine"] = note
    if vocab_size and "eos" not in errors and (problem := eos_vocab_problem(eos, vocab_size)):
        errors["eos"] = problem
    return Validation(None, errors) if errors else Validation(settings)


def _threads(text: str, errors: dict[str, str]) -> int | None:
    """The threads field: "auto" (or empty) = the default, else within the threads bound."""
    bound = BOUNDS["threads"]
    text = text.strip().lower()
    if text in ("", "auto"):
        return None
    value = _parse(text, "threads", int, "a whole number", errors, "threads")
    if value is not None and bound.problem(value) is not None:
        errors["threads"] = f"threads must lie in [{bound.lo}, {bound.hi}], got {value}"
    if "threads" in errors:
        errors["threads"] += " (or “auto”)"
        return None
    return value
