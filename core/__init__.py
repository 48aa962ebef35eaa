"""specscope.core: an exact, traced speculative decoder (torch + transformers, no Qt, no SQL).

The names below load their submodule on first use, so that code needing only the record
types (the trace store's writer process, `specscope runs`) does not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "cost": ("expected_tokens", "expected_tokens_from_survival", "predicted_speedup", "speedup"),
    "decoder": ("SpeculativeDecoder", "normalize_prompt", "summarize"),
    "proposers": ("Draft", "DraftModelProposer", "PromptLookupProposer", "Proposer"),
    "registry": ("KINDS", "ProposerSpec", "SpecError", "build_proposer", "parse_spec"),
    "run": ("RunHandle",),
    "records": ("CacheState", "DraftNode", "EmittedToken", "GenerationResult", "ResidualUpdate", "Round", "RoundTimings",
                "RunConfig", "RunSummary", "TreeInfo", "TreeRound"),
    "sampling": ("SamplingConfig", "process_logits", "sample_from"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [
    "KINDS",
    "ProposerSpec",
    "RunHandle",
    "SpecError",
    "build_proposer",
    "parse_spec",
    "CacheState",
    "Draft",
    "DraftModelProposer",
    "DraftNode",
    "EmittedToken",
    "GenerationResult",
    "PromptLookupProposer",
    "Proposer",
    "ResidualUpdate",
    "Round",
    "RoundTimings",
    "RunConfig",
    "RunSummary",
    "SamplingConfig",
    "SpeculativeDecoder",
    "TreeInfo",
    "TreeRound",
    "expected_tokens",
    "expected_tokens_from_survival",
    "normalize_prompt",
    "predicted_speedup",
    "process_logits",
    "sample_from",
    "speedup",
    "summarize",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # for type checkers and IDEs
    from .cost import expected_tokens, expected_tokens_from_survival, predicted_speedup, speedup
    from .decoder import SpeculativeDecoder, normalize_prompt, summarize
    from .proposers import Draft, DraftModelProposer, PromptLookupProposer, Proposer
    from .records import (CacheState, DraftNode, EmittedToken, GenerationResult, ResidualUpdate, Round, RoundTimings,
                          RunConfig, RunSummary, TreeInfo, TreeRound)
    from .registry import KINDS, ProposerSpec, SpecError, build_proposer, parse_spec
    from .run import RunHandle
    from .sampling import SamplingConfig, process_logits, sample_from
