"""The run settings' old home: the model is core.settings.model (with its vocabularies and
bounds in core.settings); these names stay importable from here. Torch-free."""

from specscope.core.settings.model import (
    DEFAULT_PROPOSER,
    ENGINES,
    FIELD_NAMES,
    HF_LOOKUP_MAX_NGRAM,
    INT32_MAX,
    INT64_MAX,
    MAX_K,
    VECTOR_POLICIES,
    RunSettings,
    SettingsError,
    eos_vocab_problem,
)

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
