"""specscope.core: an exact, traced speculative decoder (torch + transformers, no Qt, no SQL)."""

from .cost import expected_tokens, expected_tokens_from_survival, predicted_speedup, speedup
from .decoder import SpeculativeDecoder, normalize_prompt, summarize
from .proposers import Draft, DraftModelProposer, PromptLookupProposer, Proposer
from .records import (
    CacheState,
    DraftNode,
    EmittedToken,
    GenerationResult,
    Round,
    RoundTimings,
    RunConfig,
    RunSummary,
)
from .sampling import SamplingConfig, process_logits, sample_from

__all__ = [
    "CacheState",
    "Draft",
    "DraftModelProposer",
    "DraftNode",
    "EmittedToken",
    "GenerationResult",
    "PromptLookupProposer",
    "Proposer",
    "Round",
    "RoundTimings",
    "RunConfig",
    "RunSummary",
    "SamplingConfig",
    "SpeculativeDecoder",
    "expected_tokens",
    "expected_tokens_from_survival",
    "normalize_prompt",
    "predicted_speedup",
    "process_logits",
    "sample_from",
    "speedup",
    "summarize",
]
