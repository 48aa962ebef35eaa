"""Settings -> a decoder: the one place a RunSettings becomes a SpeculativeDecoder (or a
faulty one, core.faults) or a TransformersEngine, for the CLI, the GUI and the bench alike.

The front ends load the models their own way (the CLI from paths, the GUI through its cached
hub, the bench from its dict of drafts) and hand them over as `Models` (a core.loading
ModelPair serves as well). Here the settings are validated (core.decode.settings), the EOS
default is taken from the tokenizer, the proposer is built from the spec, and a run's prompt
plus budget is checked against the models' position limit. Every refusal is a SettingsError
whose messages name the fields as the caller does (`names`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specscope.core.decode.settings import FIELD_NAMES, HF_LOOKUP_MAX_NGRAM, RunSettings, SettingsError, \
    eos_vocab_problem
from specscope.core.records import RunConfig


@dataclass(frozen=True)
class Models:
    """The loaded models a run decodes with: the target, the draft the settings' spec names
    (None for kinds without a model), the tokenizer (None: token ids only) and their names."""

    target: Any
    tokenizer: Any = None
    target_name: str = ""
    draft: Any = None
    draft_name: str | None = None


def _names(names: Mapping[str, str] | None) -> dict[str, str]:
    return {**FIELD_NAMES, **(names or {})}


def resolve_eos(settings: RunSettings, models: Any, names: Mapping[str, str] | None = None) -> int | None:
    """The run's EOS id: none when disabled, the settings' id, else the tokenizer's (None
    without a tokenizer); refused when outside the target's vocabulary."""
    from specscope.core.decode.kv import model_vocab_size

    if settings.eos_disabled:
        return None
    eos = settings.eos
    if eos is None and models.tokenizer is not None:
        eos = getattr(models.tokenizer, "eos_token_id", None)
    problem = eos_vocab_problem(eos, model_vocab_size(models.target), names) if eos is not None else None
    if problem:
        raise SettingsError({"eos": problem})
    return None if eos is None else int(eos)


def build_decoder(settings: RunSettings, models: Any, names: Mapping[str, str] | None = None) -> Any:
    """A SpeculativeDecoder (a FaultyDecoder with settings.fault) or, with engine
    "transformers", a TransformersEngine, for `models`; SettingsError when the settings
    cannot run."""
    settings.check(names)
    eos = resolve_eos(settings, models, names)
    if settings.engine == "transformers":
        return _transformers_engine(settings, models, eos, names)
    from specscope.core.decode.decoder import SpeculativeDecoder
    from specscope.core.draft.registry import SpecError, build_proposer

    try:
        proposer = build_proposer(settings.spec, load_draft=lambda ref: (models.draft, models.draft_name))
    except SpecError as exc:
        raise SettingsError({"proposer": f"{_names(names)['proposer']}: {exc}"}) from None
    options = dict(
        k=settings.k, sampling=settings.sampling(), eos_token_id=eos, seed=settings.seed, use_cache=settings.use_cache,
        target_name=models.target_name,
        # the records keep full vectors when asked, else top-N above 4096 tokens (core.dists),
        # computed on the model's device ("top" only changes what a store keeps)
        vectors="full" if settings.vectors == "full" else "auto", top_n=_top_n(settings),
        # greedy decoding draws nothing: there is no randomness to couple
        coupling_seed=None if settings.greedy else settings.coupling_seed,
    )
    from specscope.core.draft.proposers import TargetMismatch

    try:
        if settings.fault:
            from specscope.core.faults.zoo import faulty_decoder

            return faulty_decoder(settings.fault, models.target, proposer, **options)
        return SpeculativeDecoder(models.target, proposer, **options)
    except TargetMismatch as exc:  # a draft head trained for another model
        raise SettingsError({"proposer": f"{_names(names)['proposer']}: {exc}"}) from None


def _top_n(settings: RunSettings) -> int:
    from specscope.core.sampling.dists import DEFAULT_TOP_N

    return DEFAULT_TOP_N if settings.top_n is None else settings.top_n


def _transformers_engine(settings: RunSettings, models: Any, eos: int | None, names: Mapping[str, str] | None) -> Any:
    """transformers' own generate() with the spec's draft model (assisted) or prompt lookup, recorded."""
    from specscope.core.draft.registry import parse_spec
    from specscope.core.engines import PrivateAPIChanged, TransformersEngine

    spec = parse_spec(settings.spec)  # validated
    try:
        return TransformersEngine(
            models.target, kind="assisted" if spec.kind == "draft" else "lookup", draft=models.draft, k=settings.k,
            sampling=settings.sampling(), eos_token_id=eos, seed=settings.seed, target_name=models.target_name,
            draft_name=models.draft_name, max_ngram=int(spec.params.get("max_ngram", HF_LOOKUP_MAX_NGRAM)),
            vectors="full" if settings.vectors == "full" else "auto", top_n=_top_n(settings))
    except (PrivateAPIChanged, ValueError) as exc:
        raise SettingsError({"engine": f"{_names(names)['engine']} transformers: {exc}"}) from None


def check_positions(prompt_ids: Sequence[int], settings: RunSettings, models: Any,
                    names: Mapping[str, str] | None = None) -> None:
    """Refuse a prompt that, with settings.max_new_tokens after it, would pass the models'
    position limit (max_position_embeddings): a model reads nothing sensible past it."""
    from specscope.core.loading.models import position_limit

    found = position_limit(models)
    if found is None:
        return
    limit, model = found
    n, budget = len(prompt_ids), settings.max_new_tokens
    if n > limit:
        raise SettingsError({"prompt": f"the prompt is {n} tokens, but {model} reads at most {limit} positions "
                                       f"(max_position_embeddings): shorten the prompt"})
    if n + budget > limit:
        raise SettingsError({"max_new_tokens": (
            f"the prompt ({n} tokens) plus {budget} new tokens needs {n + budget} positions, but {model} reads at "
            f"most {limit} (max_position_embeddings): {_names(names)['max_new_tokens']} must be at most {limit - n}")})


def run_config(decoder: Any, settings: RunSettings, models: Any, prompt_ids: Sequence[int], run_id: str | None = None,
               names: Mapping[str, str] | None = None) -> RunConfig:
    """The RunConfig of one run of `decoder` (from build_decoder) on `prompt_ids`, after the
    position-limit check."""
    check_positions(prompt_ids, settings, models, names)
    return decoder.run_config(prompt_ids, settings.max_new_tokens, run_id)


__all__ = ["Models", "RunSettings", "SettingsError", "build_decoder", "check_positions", "resolve_eos", "run_config"]
