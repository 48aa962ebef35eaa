"""One place that turns a proposer spec into a proposer, for the CLI, the GUI and the bench.

A spec is a short string, and it is what a trace records as the run's proposer:

    draft               the bundled draft-small (same as draft:small)
    draft:small         a bundled draft by name (small, tiny)
    draft:PATH          a local transformers checkpoint folder
    lookup              prompt lookup with its defaults
    lookup:max_ngram=4,min_ngram=2
    draft:small,tree=3,2,1,children=sampled            a token tree (core.draft.trees)
    draft:tree=dynamic:nodes=16,depth=5,topk=4
    eagle:PATH          a draft head on the target's hidden states, from its checkpoint folder
    eagle3:PATH         (EAGLE, EAGLE-3, Medusa, MTP: core.draft.heads, docs/heads.md)
    eagle3              the target's trained EAGLE-3 head: the bundled target's (resources/models/eagle3-target),
                        or a named target's own (catalog default_heads: --target smollm2 -> eagle3-smollm2)
    eagle3:eagle3-smollm2   a bundled head by its name (resources/models/NAME)
    eagle3:draw=onehot  ... drafting q's top token as a point mass at T > 0 (vLLM #40149's shape)
    medusa:PATH
    mtp:PATH
    eagle3,tree=dynamic:nodes=16,depth=5,topk=4        a head drafting a token tree (EAGLE-2)
    medusa:PATH,tree=3,2,1,children=sampled            (static trees, Medusa at most K deep)

Grammar: KIND[:ARG][,KEY=VALUE...] where ARG (a model name or path) comes first. A value may
itself hold commas (`tree=3,2,1`): an item without "=" after a KEY=VALUE item continues that
value. Nothing in a spec may be empty: `draft:`, `eagle3:`, `lookup:max_ngram=`, `draft:small,`
are refused in one line rather than read as a default, and an integer parameter is bounded
where it is parsed (core.settings.bounds: `lookup:max_ngram=2147483647` would build an index
that exhausts memory).

Adding a proposer kind: write its class (it follows core.draft.proposers.Proposer) and add one
`register(ProposerKind(...))` line below; nothing in app/ changes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from specscope.core.settings.bounds import BOUNDS, IntBound
from specscope.core.settings.vocab import DEFAULT_CHILDREN, HEAD_DRAWS

if TYPE_CHECKING:  # the builders import the proposers (and so torch) when they build one:
    from specscope.core.draft.heads.base import HeadDrafting
    from specscope.core.draft.proposers import Proposer  # parsing a spec stays torch-free for the window

# Loads the draft model a spec names ("small", "tiny" or a path): (model, label).
DraftLoader = Callable[[str], tuple[Any, str]]


class SpecError(ValueError):
    """A proposer spec that cannot be parsed or built; the message says what to write."""


@dataclass(frozen=True)
class ProposerSpec:
    kind: str
    arg: str | None = None  # model name or path for kinds that take one
    params: Mapping[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        head = self.kind if self.arg is None else f"{self.kind}:{self.arg}"
        items = [f"{k}={v}" for k, v in self.params.items()]
        if not items:
            return head
        return f"{head},{','.join(items)}" if self.arg is not None else f"{head}:{','.join(items)}"

    @property
    def model_ref(self) -> str | None:
        """The draft model this spec loads (None for kinds without a model)."""
        kind = KINDS.get(self.kind)
        if kind is None or not kind.needs_model:
            return None
        return self.arg or kind.default_arg


@dataclass(frozen=True)
class Param:
    name: str
    type: type
    default: Any
    help: str = ""
    bound: IntBound | None = None  # an int parameter's bound (core.settings.bounds): its top is checked on parsing


@dataclass(frozen=True)
class ProposerKind:
    name: str
    summary: str
    build: Callable[[ProposerSpec, DraftLoader | None], Proposer]
    params: tuple[Param, ...] = ()
    needs_model: bool = False
    default_arg: str | None = None  # the model when the spec names none
    takes_path: bool = False  # ARG is a checkpoint the kind loads itself (a draft head), not a draft model
    # checks a spec's parameters as `build` would, without building (raises SpecError); the
    # settings check uses it instead of a build that imports torch (the window validates before torch loads)
    check: Callable[[ProposerSpec], None] | None = None
    bundled_head: str | None = None  # a head kind's checkpoint when the spec names none (resources/models/NAME)

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)


KINDS: dict[str, ProposerKind] = {}


def register(kind: ProposerKind) -> ProposerKind:
    if kind.name in KINDS:
        raise ValueError(f"proposer kind {kind.name!r} is registered twice")
    KINDS[kind.name] = kind
    return kind


def _convert(kind: ProposerKind, key: str, raw: str) -> Any:
    param = kind.param(key)
    if param is None:
        known = ", ".join(p.name for p in kind.params) or "none"
        raise SpecError(f"proposer {kind.name!r} has no parameter {key!r} (its parameters: {known})")
    if not raw:
        default = "" if param.default is None else f" ({param.default})"
        raise SpecError(
            f"{kind.name}: {key}= has no value: write {key}=VALUE, or leave {key} out for its default{default}"
        )
    if param.type is int:
        try:
            value = int(raw)
        except ValueError:
            raise SpecError(f"{kind.name}: {key} must be an integer, got {raw!r}") from None
        if param.bound is not None and value > param.bound.hi:  # past what can matter: refused before anything is built
            raise SpecError(f"{kind.name}: {key} {param.bound.problem(value)}")
        return value  # below the bound: the kind's own check says why (lookup: min_ngram <= max_ngram too)
    if param.type is float:
        try:
            return float(raw)
        except ValueError:
            raise SpecError(f"{kind.name}: {key} must be a number, got {raw!r}") from None
    return raw


def parse_spec(text: str | ProposerSpec) -> ProposerSpec:
    """Parse (and validate the names and types of) a proposer spec string."""
    if isinstance(text, ProposerSpec):
        return text
    text = str(text).strip()
    # KIND:ARG,... or, without ARG, KIND,KEY=VALUE (eagle3,tree=3,2,1): the kind ends at the first ":" or ","
    cut = min((i for i in (text.find(":"), text.find(",")) if i >= 0), default=len(text))
    name, rest = text[:cut], text[cut + 1 :]
    name = name.strip().lower()
    if name not in KINDS:
        raise SpecError(f"unknown proposer {name or text!r}; known: {', '.join(KINDS)}")
    kind = KINDS[name]
    _refuse_empty(kind, text, cut, rest)
    positional: list[str] = []
    params: dict[str, Any] = {}
    raw: dict[str, str] = {}
    last: str | None = None
    for item in rest.split(",") if rest else []:
        key, eq, value = item.partition("=")
        if eq and last == "tree" and key.strip() in TREE_KEYS and kind.param(key.strip()) is None:
            raw[last] += "," + item.strip()  # tree=dynamic:nodes=16,depth=5,topk=4 is one value
        elif eq and key.strip().isidentifier():
            last = key.strip()
            raw[last] = value.strip()
        elif last is not None:
            raw[last] += "," + item.strip()
        else:
            positional.append(item)
    for key, value in raw.items():
        params[key] = _convert(kind, key, value)
    arg = ",".join(positional).strip() or None
    if arg is not None and not (kind.needs_model or kind.takes_path):
        raise SpecError(f"proposer {name!r} takes no model argument (got {arg!r}); write {name}:KEY=VALUE,...")
    return ProposerSpec(name, arg, params)


def _refuse_empty(kind: ProposerKind, text: str, cut: int, rest: str) -> None:
    """SpecError for an empty part of a spec: nothing after the kind's ":" (`draft:`), or an
    empty item between commas (`draft:small,`, `lookup:,max_ngram=2`). An empty KEY= value is
    refused where the value is converted."""
    if cut < len(text) and not rest.strip():
        name = kind.name
        if kind.needs_model:
            hint = (
                f"{name}:NAME or {name}:PATH (a bundled draft or a checkpoint folder), or {name} alone for "
                f"the default ({kind.default_arg})"
            )
        elif kind.takes_path:
            hint = f"{name}:PATH (a head checkpoint folder)" + (
                f", or {name} alone for the target's trained head" if kind.bundled_head else ""
            )
        else:
            hint = f"{name}:KEY=VALUE,..., or {name} alone for its defaults"
        raise SpecError(f"proposer {text!r} has nothing after {text[cut]!r}: write {hint}")
    if rest and any(not item.strip() for item in rest.split(",")):
        raise SpecError(f"proposer {text!r} has an empty item between commas: remove the extra comma")


# Keys inside a tree spec's value (core.draft.trees), not parameters of their own.
TREE_KEYS = ("nodes", "depth", "topk")


def build_proposer(spec: str | ProposerSpec, load_draft: DraftLoader | None = None) -> Proposer:
    """Build the proposer a spec names. Kinds with a model load it through `load_draft`."""
    parsed = parse_spec(spec)
    kind = KINDS[parsed.kind]
    if kind.needs_model and load_draft is None:
        raise SpecError(f"proposer {parsed.kind!r} needs a model loader")
    proposer = kind.build(parsed, load_draft)
    proposer.spec = str(parsed)
    return proposer


def _build_draft(spec: ProposerSpec, load_draft: DraftLoader | None) -> Proposer:
    from specscope.core.draft.proposers import DraftModelProposer

    assert load_draft is not None
    model, label = load_draft(spec.model_ref or "small")
    try:
        return DraftModelProposer(
            model, label=label, tree=spec.params.get("tree"), children=spec.params.get("children", DEFAULT_CHILDREN)
        )
    except ValueError as exc:
        raise SpecError(f"draft: {exc}") from None


def _check_lookup(spec: ProposerSpec) -> None:
    from specscope.core.draft.ngram_index import check_ngram_range

    try:
        check_ngram_range(spec.params.get("min_ngram", 1), spec.params.get("max_ngram", 3))
    except ValueError as exc:
        raise SpecError(f"lookup: {exc}") from None


def _build_lookup(spec: ProposerSpec, _load: DraftLoader | None) -> Proposer:
    from specscope.core.draft.proposers import PromptLookupProposer

    try:
        return PromptLookupProposer(**spec.params)
    except ValueError as exc:
        raise SpecError(f"lookup: {exc}") from None


# A kind that drafts token trees takes these two (the settings check parses them for any kind that does).
TREE_PARAMS = (
    Param("tree", str, None, "draft a token tree: B1,B2,... | paths:0;1;0.0 | dynamic:nodes=N,depth=D,topk=K"),
    Param("children", str, DEFAULT_CHILDREN, "how a tree's siblings are chosen: topk | sampled (i.i.d.) | distinct"),
)
register(
    ProposerKind(
        "draft",
        "a small causal LM drafting k tokens with its own KV cache (draft:small, draft:tiny, draft:PATH)",
        _build_draft,
        needs_model=True,
        default_arg="small",
        params=TREE_PARAMS,
    )
)
register(
    ProposerKind(
        "lookup",
        "prompt lookup: copy what followed the last match of the context's suffix n-gram",
        _build_lookup,
        check=_check_lookup,
        params=(
            Param("max_ngram", int, 3, "longest suffix n-gram tried", BOUNDS["max_ngram"]),
            Param("min_ngram", int, 1, "shortest suffix n-gram accepted", BOUNDS["min_ngram"]),
        ),
    )
)


def _refuse_unnamed_head(spec: ProposerSpec) -> None:
    if spec.arg is None and KINDS[spec.kind].bundled_head is None:
        shipped = ", ".join(k.name for k in KINDS.values() if k.bundled_head) or "none"
        raise SpecError(
            f"{spec.kind} needs a head checkpoint: write {spec.kind}:PATH, a folder in the "
            f"{HEAD_FORMATS[spec.kind]} format (specscope ships a trained head for: {shipped})"
        )


# How a head draws at T > 0 (HeadDrafting.draw_mode in core.draft.heads.base): core.settings.vocab.HEAD_DRAWS.


def _head_draw(spec: ProposerSpec) -> str:
    draw: str = spec.params.get("draw", HEAD_DRAWS[0])
    if draw not in HEAD_DRAWS:
        raise SpecError(f"{spec.kind}: draw must be {' or '.join(HEAD_DRAWS)}, got {draw!r}")
    if draw == "onehot" and spec.params.get("tree"):
        raise SpecError(
            f"{spec.kind}: draw=onehot applies to chains; a tree's siblings are chosen by "
            "children=topk|sampled|distinct"
        )
    return draw


def _head_stop(spec: ProposerSpec) -> float | None:
    """The `stop` threshold (EAGLE-2 style early stop of a chain), checked: in [0, 1)."""
    stop = spec.params.get("stop")
    if stop is None:
        return None
    if spec.kind == "medusa" or spec.params.get("tree"):
        raise SpecError(
            f"{spec.kind}: stop ends a chain drafted one head step at a time (eagle, eagle3, mtp); "
            "a tree or Medusa's heads are sized by their spec"
        )
    if not 0.0 <= float(stop) < 1.0:
        raise SpecError(
            f"{spec.kind}: stop must lie in [0, 1) (the path confidence below which drafting stops), got {stop!r}"
        )
    return float(stop)


def _head_lookup(spec: ProposerSpec) -> int | None:
    """The `lookup` n-gram length (prompt lookup first, the head otherwise), checked."""
    n = spec.params.get("lookup")
    if n is None:
        return None
    if spec.kind == "medusa" or spec.params.get("tree"):
        raise SpecError(
            f"{spec.kind}: lookup takes a chain's round from prompt lookup (eagle, eagle3, mtp chains); "
            "a tree or Medusa's heads draft every round"
        )
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_HEAD_LOOKUP:
        raise SpecError(f"{spec.kind}: lookup must be an n-gram length in 1..{MAX_HEAD_LOOKUP}, got {n!r}")
    return n


def _build_head(spec: ProposerSpec, _load: DraftLoader | None) -> Proposer:
    _refuse_unnamed_head(spec)
    draw = _head_draw(spec)
    stop = _head_stop(spec)
    lookup = _head_lookup(spec)
    from specscope.core.draft.heads import LOADERS

    bundled = KINDS[spec.kind].bundled_head
    named = _bundled_head_name(spec)
    try:
        if named is not None:
            proposer = _bundled_head(spec.kind, named)
        else:
            # (no path: the kind has a bundled head, else _refuse_unnamed_head refused the spec)
            proposer = (
                LOADERS[spec.kind](spec.arg) if spec.arg is not None else _bundled_head(spec.kind, cast(str, bundled))
            )
    except ValueError as exc:  # HeadFormatError, CheckpointError: their messages name the kind
        raise SpecError(str(exc)) from None
    try:
        proposer.draft_trees(spec.params.get("tree"), spec.params.get("children", DEFAULT_CHILDREN))
    except ValueError as exc:
        raise SpecError(f"{spec.kind}: {exc}") from None
    proposer.draw_mode = draw
    proposer.stop_below = stop
    proposer.use_lookup(lookup)
    return cast("Proposer", proposer)  # each loader's HeadDrafting subclass implements propose and observe


def _check_head(spec: ProposerSpec) -> None:
    """What the settings check can say without torch: a head named nowhere, a draw that is not
    one of HEAD_DRAWS, or a checkpoint folder that is missing or has no readable config.json
    (the weights are checked on load)."""
    from specscope.core.draft.head_folders import head_folder, read_config

    _refuse_unnamed_head(spec)
    _head_draw(spec)
    _head_stop(spec)
    _head_lookup(spec)
    if spec.arg is None or _bundled_head_name(spec) is not None:
        return
    try:
        config = read_config(head_folder(spec.arg, spec.kind), spec.kind)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    if spec.kind == "medusa" and spec.params.get("tree"):
        _check_medusa_depth(str(spec.params["tree"]), config.get("medusa_num_heads", config.get("num_heads")))


def _check_medusa_depth(tree: str, heads: Any) -> None:
    from specscope.core.draft.head_folders import tree_too_deep
    from specscope.core.draft.trees import TreeSpecError, parse_tree

    try:
        depth = parse_tree(tree).depth
    except TreeSpecError:
        return  # the settings check reports the tree itself
    if isinstance(heads, int) and depth > heads:
        raise SpecError(f"medusa: {tree_too_deep(depth, heads)}")


def _bundled_head_name(spec: ProposerSpec) -> str | None:
    """The bundled head a spec's ARG names (eagle3:eagle3-smollm2), None for a path or no ARG;
    a folder of that name in the working directory is a path."""
    from pathlib import Path

    from specscope.core.loading.models import BUNDLED_HEADS as TOY_HEADS
    from specscope.core.loading.models import BUNDLED_REAL_HEADS

    if spec.arg is None or spec.arg not in TOY_HEADS + BUNDLED_REAL_HEADS or Path(spec.arg).exists():
        return None
    return spec.arg


def _bundled_head(kind: str, name: str) -> HeadDrafting:
    """A head specscope ships (the bundled target's, or a named target's), labelled by its
    name; a target it does not fit is refused with a hint that says whose head it is."""
    from specscope.core.draft.head_folders import read_config
    from specscope.core.draft.heads import LOADERS
    from specscope.core.loading.models import bundled_head_path

    folder = bundled_head_path(name)
    proposer = LOADERS[kind](folder)
    proposer.label = f"bundled:{name}"
    owner = read_config(folder, kind).get("specscope", {}).get("target", "specscope/target")
    whose = "is the bundled target's" if owner == "specscope/target" else f"{name} is {owner}'s (--target {owner})"
    proposer.hint = f"the bundled {kind} head {whose}: for another target write {kind}:PATH"
    return proposer


def for_target(spec: str | ProposerSpec, target: str | None) -> ProposerSpec:
    """A head spec without a checkpoint, for a named target that ships its own head of that kind
    (catalog default_heads): the spec naming that head (`eagle3` with `--target smollm2` is
    eagle3:eagle3-smollm2). Any other spec, or target, is returned as it is."""
    from dataclasses import replace

    from specscope.core.loading.catalog import default_head

    parsed = parse_spec(spec)
    if parsed.arg is not None or not KINDS[parsed.kind].takes_path:
        return parsed
    name = default_head(target, parsed.kind)
    return replace(parsed, arg=name) if name is not None else parsed


# The heads trained for the bundled target (training/train_head.py), by kind: resources/models/NAME.
BUNDLED_HEADS = {"eagle3": "eagle3-target"}


def checkpoint_ref(spec: ProposerSpec, target: str | None) -> str | None:
    """What an engine that loads checkpoints by folder (vLLM) loads for a spec: its model or ARG,
    else the head a named target ships (for_target: `eagle3` with smollm2), else the bundled
    target's head of that kind (`eagle3` alone); None for a proposer with no checkpoint."""
    spec = for_target(spec, target)
    ref = spec.model_ref if KINDS[spec.kind].needs_model else spec.arg
    if ref is None and (target or "").strip().lower() in ("", "target", "specscope/target"):
        ref = BUNDLED_HEADS.get(spec.kind)
    return ref


HEAD_DRAW_PARAM = Param(
    "draw",
    str,
    HEAD_DRAWS[0],
    "how a draft token is drawn at T > 0: sampled (from the head's q) | "
    "onehot (q's top token, verified as a point mass: vLLM #40149)",
)
HEAD_STOP_PARAM = Param(
    "stop",
    float,
    None,
    "EAGLE-2 style early stop of a chain: stop drafting once the product of the head's own "
    "probabilities of its tokens falls below this (e.g. 0.3; default: draft all k)",
)
MAX_HEAD_LOOKUP = 16
HEAD_LOOKUP_PARAM = Param(
    "lookup",
    int,
    None,
    "prompt lookup first: a round copies what followed an earlier occurrence of the context's last "
    "N tokens (or more, up to N + 2) and the head drafts only where there is none (e.g. 3; default: "
    "the head every round)",
)
HEAD_FORMATS = {
    "eagle": "EAGLE repository's",
    "eagle3": "EAGLE-3 (EAGLE repository, SpecForge)",
    "medusa": "Medusa repository's",
    "mtp": "DeepSeek-V3 MTP",
}
for _kind, _summary in (
    (
        "eagle",
        "EAGLE-1/2 head: the target's last feature + the next token's embedding, one layer, the target's lm_head",
    ),
    ("eagle3", "EAGLE-3 head: three target layers fused, one layer, its own reduced-vocabulary output head"),
    ("medusa", "Medusa heads: K residual heads on the target's last feature, one token position each (k <= K)"),
    ("mtp", "MTP module (DeepSeek-V3 style): normed embedding + hidden state, one layer, the target's head"),
):
    bundled = BUNDLED_HEADS.get(_kind)
    usage = f"{_kind}:PATH, a head checkpoint folder" + (
        f"; {_kind} alone: the target's trained head (the bundled target's, or a named target's own)" if bundled else ""
    )
    register(
        ProposerKind(
            _kind,
            f"{_summary} ({usage})",
            _build_head,
            takes_path=True,
            bundled_head=bundled,
            check=_check_head,
            params=(*TREE_PARAMS, HEAD_DRAW_PARAM, HEAD_STOP_PARAM, HEAD_LOOKUP_PARAM),
        )
    )
