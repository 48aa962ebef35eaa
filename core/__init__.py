"""specscope.core: an exact, traced speculative decoder (torch + transformers, no Qt, no SQL).

Folders by role, not by draft shape: decode/ (the round, layouts, caches, the plain baseline),
draft/ (proposers, their registry, tree shapes and growth), verify/ (the walk and its rules),
sampling/ (the transforms and draws, on the host and on the device), check/ (the checker and
its proofs), faults/ (the zoo of deliberate bugs), loading/ (models and tokenizers), engines/
(transformers' own loop, recorded).

The names below load their submodule on first use, so that code needing only the record
types (the trace store's writer process, `specscope runs`) does not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "cost": ("expected_tokens", "expected_tokens_from_survival", "predicted_speedup", "speedup"),
    "decode.baseline": ("plain_generate",),
    "decode.decoder": ("SpeculativeDecoder", "normalize_prompt", "summarize"),
    "decode.factory": ("Models", "build_decoder"),
    "decode.kv": ("CachedLM",),
    "decode.run": ("RunHandle",),
    "decode.settings": ("RunSettings", "SettingsError"),
    "decode.stops": ("StopMatch", "Stops", "token_piece_function"),
    "draft.proposers": ("Draft", "DraftModelProposer", "PromptLookupProposer", "Proposer"),
    "draft.registry": ("KINDS", "ProposerSpec", "SpecError", "build_proposer", "parse_spec"),
    "check.checker": ("check_report", "check_run", "first_bad_round", "group_findings"),
    "faults.zoo": ("FAULTS", "faulty_decoder"),
    "records": (
        "CacheState",
        "DraftNode",
        "EmittedToken",
        "GenerationResult",
        "ResidualUpdate",
        "Round",
        "RoundTimings",
        "RunConfig",
        "RunSummary",
        "TreeInfo",
        "TreeRound",
    ),
    "sampling.reference": ("SamplingConfig", "process_logits", "sample_from"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [
    "FAULTS",
    "KINDS",
    "CacheState",
    "CachedLM",
    "Draft",
    "DraftModelProposer",
    "DraftNode",
    "EmittedToken",
    "GenerationResult",
    "Models",
    "PromptLookupProposer",
    "Proposer",
    "ProposerSpec",
    "ResidualUpdate",
    "Round",
    "RoundTimings",
    "RunConfig",
    "RunHandle",
    "RunSettings",
    "RunSummary",
    "SamplingConfig",
    "SettingsError",
    "SpecError",
    "SpeculativeDecoder",
    "StopMatch",
    "Stops",
    "TreeInfo",
    "TreeRound",
    "build_decoder",
    "build_proposer",
    "check_report",
    "check_run",
    "expected_tokens",
    "expected_tokens_from_survival",
    "faulty_decoder",
    "first_bad_round",
    "group_findings",
    "normalize_prompt",
    "parse_spec",
    "plain_generate",
    "predicted_speedup",
    "process_logits",
    "sample_from",
    "speedup",
    "summarize",
    "token_piece_function",
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
    from specscope.core.check.checker import check_report, check_run, first_bad_round, group_findings
    from specscope.core.cost import expected_tokens, expected_tokens_from_survival, predicted_speedup, speedup
    from specscope.core.decode.baseline import plain_generate
    from specscope.core.decode.decoder import SpeculativeDecoder, normalize_prompt, summarize
    from specscope.core.decode.factory import Models, build_decoder
    from specscope.core.decode.kv import CachedLM
    from specscope.core.decode.run import RunHandle
    from specscope.core.decode.settings import RunSettings, SettingsError
    from specscope.core.decode.stops import StopMatch, Stops, token_piece_function
    from specscope.core.draft.proposers import Draft, DraftModelProposer, PromptLookupProposer, Proposer
    from specscope.core.draft.registry import KINDS, ProposerSpec, SpecError, build_proposer, parse_spec
    from specscope.core.faults.zoo import FAULTS, faulty_decoder
    from specscope.core.records import (
        CacheState,
        DraftNode,
        EmittedToken,
        GenerationResult,
        ResidualUpdate,
        Round,
        RoundTimings,
        RunConfig,
        RunSummary,
        TreeInfo,
        TreeRound,
    )
    from specscope.core.sampling.reference import SamplingConfig, process_logits, sample_from
