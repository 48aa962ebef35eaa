"""Every closed vocabulary of a run, defined once as a `Literal` type and its tuple of words.

The type is what annotations name (`engine: Engine`); the tuple (`ENGINES = get_args(Engine)`)
is what a front end offers (the CLI's `choices`, the window's menus) and what a check compares
with. The first word of a tuple is not a default: defaults live with the settings
(core.settings.model) and the record types.

Torch-free and import-free: core.records, the trace store and the CLI's parser import it.
"""

from __future__ import annotations

from typing import Literal, get_args

# Whose loop decodes: specscope's SpeculativeDecoder, transformers' own generate() recorded, or vLLM's
# v1 engine in its own venv (core.engines.vllm, docs/vllm.md).
Engine = Literal["specscope", "transformers", "vllm"]
# How a tree's siblings are chosen and verified (core.verify.tree): i.i.d. from q, without
# replacement, or q's top-k as point masses.
ChildrenMode = Literal["sampled", "distinct", "topk"]
# What a record keeps besides the top-N (core.sampling.dists; the store's "top" keeps nothing more).
VectorPolicy = Literal["auto", "full", "top"]
# How a draft head draws at T > 0 (core.draft.heads): from its q, or q's top token as a point mass.
HeadDraw = Literal["sampled", "onehot"]
# A stored run's status; every status but "running" ends a run.
RunStatus = Literal["running", "completed", "interrupted", "failed"]
# Why a run's output ended (RunSummary.stop_reason, the store's runs.stop_reason).
StopReason = Literal["eos", "stop", "budget", "cancelled", "running"]
# Which stop matched: a stop string ("text") or a stop token sequence ("ids") (core.decode.stops).
StopKind = Literal["text", "ids"]
# Where the CLI runs the models ("auto": CUDA when available) and the dtypes it loads them in.
Device = Literal["auto", "cpu", "cuda"]
Dtype = Literal["float32", "float16", "bfloat16", "float64"]
# k's one word: the draft length (a tree's depth) chosen each round by cost (core.decode.draft_length).
AutoK = Literal["auto"]
AUTO_K: AutoK = "auto"

ENGINES: tuple[Engine, ...] = get_args(Engine)
CHILDREN_MODES: tuple[ChildrenMode, ...] = get_args(ChildrenMode)
DEFAULT_CHILDREN: ChildrenMode = "topk"
CHILDREN_MENU: tuple[ChildrenMode, ...] = (DEFAULT_CHILDREN, *(m for m in CHILDREN_MODES if m != DEFAULT_CHILDREN))
VECTOR_POLICIES: tuple[VectorPolicy, ...] = get_args(VectorPolicy)
HEAD_DRAWS: tuple[HeadDraw, ...] = get_args(HeadDraw)
RUN_STATUSES: tuple[RunStatus, ...] = get_args(RunStatus)
ENDED_STATUSES: tuple[RunStatus, ...] = tuple(s for s in RUN_STATUSES if s != "running")
STOP_REASONS: tuple[StopReason, ...] = get_args(StopReason)
STOP_KINDS: tuple[StopKind, ...] = get_args(StopKind)
DEVICES: tuple[Device, ...] = get_args(Device)
DTYPES: tuple[Dtype, ...] = get_args(Dtype)


def one_of(words: tuple[str, ...], value: object) -> str | None:
    """The message when `value` is not one of `words` (None when it is)."""
    if isinstance(value, str) and value in words:
        return None
    return f"must be one of {', '.join(words)}, got {value!r}"
