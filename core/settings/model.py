"""One run's settings: the one typed model every front end fills in, validated once.

`RunSettings` holds what turns a target (and a draft) into a decoder: the proposer spec
(core.draft.registry), the engine, k, the sampler, the seed, the budget, EOS (one id or
several), stop strings and token sequences (core.decode.stops), a chat prompt (the prompt is
the user's turn, `system` the system turn), coupling, the record policy (vectors, top-N), and
where it runs. The CLI's flags (app/cli/run.py), the window's run panel
(app/gui/model/settings.py: `PanelSettings` adds the prompt text and the checkpoint folder)
and the bench fill in the same object; core.decode.factory builds the decoder from it.
`validate()` checks every value the same way for all of them and returns field -> message, so
the window shows each message under its field and the CLI joins them into one line. A message
names its field as the caller does (`names`: the CLI passes its flags, "--max-new"; the window
keeps the default words, "max new tokens"). The closed vocabularies are `Literal` types
(core.settings.vocab) and every numeric bound is one `IntBound` (core.settings.bounds); the
proposer spec string stays the front ends' surface and is parsed (and its numbers bounded) by
core.draft.registry.

Why frozen dataclasses with validators, not pydantic: the settings are a frozen value that the
front ends copy with `dataclasses.replace`, subclass (the window's PanelSettings, compare's
lanes) and build field by field from text; every bad value must be reported at once, each under
its field, in the caller's words, which pydantic's per-field errors and coercion (a "3" or 3.0
silently taken for 3) would need wrapping for; and the CLI imports this at every start, where
a dependency costs import time (`tests/app/test_startup.py`) and a line in the dependency list
for no check a dataclass cannot make.

Importing this module does not import torch (the CLI's option checks use its limits).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specscope.core.settings.bounds import BOUNDS, INT32_MAX, INT64_MAX, MAX_K, IntBound
from specscope.core.settings.vocab import (
    AUTO_K,
    DEFAULT_CHILDREN,
    ENGINES,
    VECTOR_POLICIES,
    AutoK,
    Engine,
    VectorPolicy,
    one_of,
)

if TYPE_CHECKING:
    from specscope.core.draft.registry import ProposerSpec
    from specscope.core.sampling.reference import SamplingConfig

__all__ = [
    "DEFAULT_PROPOSER",
    "ENGINES",
    "FIELD_NAMES",
    "HF_LOOKUP_MAX_NGRAM",
    "INT32_MAX",
    "INT64_MAX",
    "MAX_K",
    "VECTOR_POLICIES",
    "RunSettings",
    "SettingsError",
    "eos_vocab_problem",
]

DEFAULT_PROPOSER = "draft:small"
# transformers' own default max_matching_ngram_size: its prompt lookup's n when a spec names none
# (specscope's own lookup proposer defaults to the registry's max_ngram)
HF_LOOKUP_MAX_NGRAM = 2

# How a message names each field unless the caller names it otherwise (the window's words).
FIELD_NAMES: dict[str, str] = {
    "proposer": "proposer",
    "tree": "tree",
    "children": "children",
    "engine": "engine",
    "k": "k (draft length)",
    "temperature": "temperature",
    "top_k": "top-k",
    "top_p": "top-p",
    "seed": "seed",
    "max_new_tokens": "max new tokens",
    "eos": "EOS",
    "coupling_seed": "coupling seed",
    "use_cache": "no-cache",
    "fault": "fault",
    "vectors": "vectors",
    "top_n": "top-N",
    "stop_strings": "stop strings",
    "stop_ids": "stop token sequences",
    "system": "system text",
    "threads": "threads",
}

# The integer fields checked first, each against its bound (core.settings.bounds); top_n's None
# is the core's default (coupling_seed, also optional, is checked with the settings it goes with)
INT_FIELDS = ("k", "top_k", "seed", "max_new_tokens", "top_n")
OPTIONAL_INTS = frozenset({"top_n"})


class SettingsError(ValueError):
    """Settings that cannot run: `errors` maps each bad field to its message; str() is
    every message on one line."""

    def __init__(self, errors: Mapping[str, str]):
        self.errors = dict(errors)
        super().__init__("; ".join(self.errors.values()))


@dataclass(frozen=True)
class RunSettings:
    proposer: str = DEFAULT_PROPOSER  # a core.draft.registry spec, tree included
    engine: Engine = "specscope"
    k: int | AutoK = 4  # or "auto": each round's length by measured cost (core.decode.draft_length)
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    max_new_tokens: int = 64
    # an id or several; None = the model's: its generation config's EOS ids and the tokenizer's
    eos: int | tuple[int, ...] | None = None
    eos_disabled: bool = False  # no EOS at all
    coupling_seed: int | None = None  # couple the run's draws to positions (core.verify.coupling)
    use_cache: bool = True
    fault: str | None = None  # a deliberate bug from core.faults
    vectors: VectorPolicy = "auto"
    top_n: int | None = None  # None = core.sampling.dists.DEFAULT_TOP_N
    device: str = "cpu"
    dtype: str | None = None
    threads: int | None = None  # torch CPU threads; None = the front end's default
    stop_strings: tuple[str, ...] = ()  # the output ends at the token completing one (core.decode.stops)
    stop_ids: tuple[tuple[int, ...], ...] = ()  # token sequences that end the output likewise
    chat: bool = False  # the prompt is the user's turn of a chat: the tokenizer's chat template applies
    system: str | None = None  # with chat: the system turn's text

    @property
    def eos_ids(self) -> tuple[int, ...] | None:
        """The EOS ids the settings name (None: the model's; () with eos_disabled)."""
        if self.eos_disabled:
            return ()
        if self.eos is None:
            return None
        return (self.eos,) if isinstance(self.eos, int) else tuple(self.eos)

    @property
    def spec(self) -> str:
        """The proposer spec the decoder is built from."""
        return self.proposer

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def model_ref(self) -> str | None:
        """The draft model the spec loads ("small", a folder), None without one (or when the
        spec does not parse: validate() says why)."""
        from specscope.core.draft.registry import SpecError, parse_spec

        try:
            return parse_spec(self.spec).model_ref
        except SpecError:
            return None

    def sampling(self) -> SamplingConfig:
        from specscope.core.sampling.reference import SamplingConfig

        return SamplingConfig(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    def validate(self, names: Mapping[str, str] | None = None) -> dict[str, str]:
        """field -> message for every value that cannot run (empty when all can)."""
        name = {**FIELD_NAMES, **(names or {})}
        errors: dict[str, str] = {}
        for key in INT_FIELDS:
            value = getattr(self, key)
            if key == "k" and isinstance(value, str):  # "auto": the draft length chosen by cost each round
                if value != AUTO_K:
                    errors["k"] = f"{name['k']} must be a whole number or {AUTO_K!r}, got {value!r}"
                continue
            if value is not None or key not in OPTIONAL_INTS:
                _put(errors, key, name, BOUNDS[key].problem(value))
        _put(errors, "temperature", name, _temperature_problem(self.temperature))
        _put(errors, "top_p", name, _top_p_problem(self.top_p))
        _put(errors, "eos", name, _eos_problem(self.eos))
        _put(errors, "stop_strings", name, _stop_strings_problem(self.stop_strings))
        _put(errors, "stop_ids", name, _stop_ids_problem(self.stop_ids))
        if self.system is not None and not self.chat:
            errors["system"] = f"{name['system']} is the system turn of a chat prompt: turn chat on"
        if self.coupling_seed is not None:
            _put(errors, "coupling_seed", name, BOUNDS["coupling_seed"].problem(self.coupling_seed))
        if self.threads is not None:
            _put(errors, "threads", name, BOUNDS["threads"].problem(self.threads))
        _put(errors, "vectors", name, one_of(VECTOR_POLICIES, self.vectors))
        _put(errors, "engine", name, one_of(ENGINES, self.engine))
        spec = _spec_problems(self.spec, errors, name)
        if self.fault is not None and (problem := _fault_problem(self.fault)):
            errors["fault"] = f"{name['fault']}: {problem}"
        if spec is not None:
            _combination_problems(self, spec, errors, name)
        return errors

    def check(self, names: Mapping[str, str] | None = None) -> None:
        """Raise SettingsError when validate() finds anything."""
        errors = self.validate(names)
        if errors:
            raise SettingsError(errors)


def _put(errors: dict[str, str], key: str, name: Mapping[str, str], problem: str | None) -> None:
    if problem is not None:
        errors[key] = f"{name[key]} {problem}"


def _finite_problem(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return f"must be a finite number, got {value!r}"
    return None


def _temperature_problem(value: Any) -> str | None:
    problem = _finite_problem(value)
    if problem is None and value < 0:
        problem = f"must be at least 0 (0 = greedy), got {value:g}"
    return problem


def _top_p_problem(value: Any) -> str | None:
    problem = _finite_problem(value)
    if problem is None and not 0.0 < value <= 1.0:
        problem = f"must lie in (0, 1] (1 = off), got {value:g}"
    return problem


_TOKEN_ID: IntBound = BOUNDS["token_id"]


def _is_token_id(value: Any) -> bool:
    return _TOKEN_ID.problem(value) is None


def _eos_problem(value: Any) -> str | None:
    if value is None:
        return None
    ids = value if isinstance(value, tuple) else (value,)
    if not ids or not all(_is_token_id(v) for v in ids):
        return (
            f"must be a token id from 0 to {INT32_MAX} (or several, comma-separated), 'auto' or 'none', got {value!r}"
        )
    return None


def _stop_strings_problem(value: Any) -> str | None:
    if not isinstance(value, tuple) or not all(isinstance(s, str) for s in value):
        return f"must be a tuple of strings, got {value!r}"
    if any(not s for s in value):
        return "cannot hold an empty string (it would match before any token)"
    return None


def _stop_ids_problem(value: Any) -> str | None:
    if not isinstance(value, tuple) or not all(isinstance(s, tuple) for s in value):
        return f"must be a tuple of token-id tuples, got {value!r}"
    for seq in value:
        if not seq or not all(_is_token_id(t) for t in seq):
            return f"must each be one or more token ids from 0 to {INT32_MAX}, got {seq!r}"
    return None


def eos_vocab_problem(
    eos: int | tuple[int, ...] | None, vocab_size: int, names: Mapping[str, str] | None = None, field: str = "eos"
) -> str | None:
    """The message when an EOS id (or a stop sequence's id) lies outside a vocabulary of
    `vocab_size` tokens."""
    ids = () if eos is None else (eos,) if isinstance(eos, int) else eos
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is None:
        return None
    name = {**FIELD_NAMES, **(names or {})}[field]
    return f"{name} must be token ids below the vocabulary size {vocab_size}, got {bad}"


def _fault_problem(fault: str) -> str | None:
    from specscope.core.faults.zoo import fault_named

    try:
        fault_named(fault)
    except ValueError as exc:
        return str(exc)
    return None


def _spec_problems(text: str, errors: dict[str, str], name: Mapping[str, str]) -> ProposerSpec | None:
    """The parsed spec, its tree and children checked as the proposer will (errors under
    "tree" / "children") and a kind without a model checked (its `check`, else built once, which
    checks its parameters); None when it does not parse."""
    from specscope.core.draft.registry import KINDS, SpecError, build_proposer, parse_spec

    try:
        spec = parse_spec(text)
    except SpecError as exc:
        errors["proposer"] = f"{name['proposer']}: {exc}"
        return None
    kind = KINDS[spec.kind]
    if kind.param("tree") is not None:
        _tree_problems(spec.params, errors, name)
    if not kind.needs_model and "tree" not in errors and "children" not in errors:
        try:
            if kind.check is not None:
                kind.check(spec)  # no build: prompt lookup's would import torch
            else:
                build_proposer(spec)
        except (SpecError, ValueError) as exc:
            errors["proposer"] = f"{name['proposer']}: {exc}"
    return spec


def _tree_problems(params: Mapping[str, Any], errors: dict[str, str], name: Mapping[str, str]) -> None:
    """A spec's tree and children, parsed by the parser the proposer uses."""
    from specscope.core.draft.trees import TreeSpecError, parse_tree, tree_options
    from specscope.core.verify.tree import check_children_mode

    tree, children = params.get("tree"), params.get("children")
    if tree is None:
        if children is not None:
            errors["children"] = f"{name['children']} applies to a tree: choose a tree too"
        return
    try:
        parse_tree(str(tree))
    except TreeSpecError as exc:
        errors["tree"] = f"{name['tree']}: {exc}"
        return
    try:
        check_children_mode(str(children or DEFAULT_CHILDREN))
        tree_options(str(tree), str(children or DEFAULT_CHILDREN))
    except ValueError as exc:
        errors["children"] = f"{name['children']}: {exc}"


VLLM_PROPOSERS = ("lookup", "draft", "eagle3", "eagle", "medusa", "mtp")  # core/engines/vllm/engine.py's METHODS


def vllm_lacks(spec: ProposerSpec) -> str | None:
    """Why vLLM cannot run a spec's specscope-only head options (stop, lookup), or None."""
    own = [key for key in ("stop", "lookup") if spec.params.get(key) is not None]
    if not own:
        return None
    options = (
        f"{own[0]} is specscope's own head option"
        if len(own) == 1
        else "stop and lookup are specscope's own head options"
    )
    return f"{options}; vLLM's proposer drafts k tokens every round"


def _vllm_problems(s: RunSettings, spec: ProposerSpec, errors: dict[str, str], name: Mapping[str, str]) -> None:
    """What vLLM's engine cannot run, as `specscope run --engine vllm` refuses it (app/cli/vllm.py)."""
    if spec.kind not in VLLM_PROPOSERS:
        errors["proposer"] = (
            f"{name['proposer']} {spec.kind}: the vllm engine runs vLLM's proposers: lookup (ngram), draft, eagle3, "
            "eagle, medusa, mtp"
        )
    elif spec.params.get("tree"):
        errors["tree"] = f"{name['tree']}: vLLM drafts chains here"
    elif vllm_lacks(spec):
        errors["proposer"] = f"{name['proposer']} {spec.kind}: {vllm_lacks(spec)}"
    for key, off, why in (
        ("coupling_seed", s.coupling_seed is not None, "vLLM has no coupled verifier"),
        ("fault", s.fault is not None, "faults are specscope's own"),
        ("use_cache", not s.use_cache, "vLLM always decodes with its KV cache"),
        ("stop_strings", bool(s.stop_strings), "the vllm engine runs without a detokenizer"),
        ("stop_ids", bool(s.stop_ids), "the vllm engine stops at EOS and the budget only"),
    ):
        if off:
            errors[key] = f"{name[key]} does not apply to the vllm engine ({why})"


def _combination_problems(s: RunSettings, spec: ProposerSpec, errors: dict[str, str], name: Mapping[str, str]) -> None:
    """Settings valid alone that cannot run together: what the transformers engine cannot
    run, and coupling a tree."""
    tree = bool(spec.params.get("tree"))
    if s.coupling_seed is not None and tree:
        errors["coupling_seed"] = f"{name['coupling_seed']} verifies chain drafts: it cannot be combined with a tree"
    if s.engine == "vllm":  # vLLM runs in its own venv (core/engines/vllm, docs/vllm.md)
        _vllm_problems(s, spec, errors, name)
        return
    if s.engine != "transformers":
        return
    if s.k == AUTO_K and spec.kind == "lookup":  # a draft model: transformers' own heuristic schedule (factory)
        errors["k"] = f"{name['k']} auto: transformers' prompt lookup drafts a fixed length: give it a number"
    for key, off in (
        ("coupling_seed", s.coupling_seed is not None),
        ("fault", s.fault is not None),
        ("use_cache", not s.use_cache),
    ):
        if off:
            errors[key] = f"{name[key]} applies to the specscope engine only"
    extra = set(spec.params) - ({"max_ngram"} if spec.kind == "lookup" else set())
    if tree:
        errors["tree"] = "the transformers engine drafts chains: choose the specscope engine for a tree"
    elif spec.kind not in ("draft", "lookup") or extra:
        errors["proposer"] = f"the transformers engine runs draft models and prompt lookup (max_ngram only), not {spec}"
