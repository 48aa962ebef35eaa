"""Settings -> a decoder: the one place a RunSettings becomes a SpeculativeDecoder (or a
faulty one, core.faults) or a TransformersEngine, for the CLI, the GUI and the bench alike.

The front ends load the models their own way (the CLI from paths, the GUI through its cached
hub, the bench from its dict of drafts) and hand them over as `Models` (a core.loading
ModelPair serves as well). Here the settings are validated (core.settings.model), the EOS
default is taken from the model (generation config and tokenizer), prompt text becomes ids
(through the chat template for a chat run: `prompt_ids`), the stops get the token texts, the proposer is built from
the spec, and a run's prompt
plus budget is checked against the models' position limit. Every refusal is a SettingsError
whose messages name the fields as the caller does (`names`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specscope.core.records import RunConfig
from specscope.core.settings.model import (
    FIELD_NAMES,
    HF_LOOKUP_MAX_NGRAM,
    RunSettings,
    SettingsError,
    eos_vocab_problem,
)


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


def resolve_eos(settings: RunSettings, models: Any, names: Mapping[str, str] | None = None) -> tuple[int, ...]:
    """The run's EOS ids: none when disabled, the settings' ids, else the model's: every id its
    generation config names (a chat model ends its turn with one, e.g. Gemma's <end_of_turn>)
    and the tokenizer's (none without a tokenizer); refused when one lies outside the target's
    vocabulary."""
    from specscope.core.decode.kv import model_vocab_size

    ids = settings.eos_ids
    if ids is None and models.tokenizer is None:
        ids = ()  # token ids only (a random test model): no EOS unless the settings name one
    elif ids is None:
        config = getattr(getattr(models.target, "generation_config", None), "eos_token_id", None)
        ids = tuple(_as_ids(config)) + tuple(_as_ids(getattr(models.tokenizer, "eos_token_id", None)))
    ids = tuple(dict.fromkeys(int(i) for i in ids))
    vocab = model_vocab_size(models.target)
    if problem := eos_vocab_problem(ids, vocab, names):
        raise SettingsError({"eos": problem})
    for seq in settings.stop_ids:
        if problem := eos_vocab_problem(seq, vocab, names, field="stop_ids"):
            raise SettingsError({"stop_ids": problem})
    return ids


def _as_ids(value: Any) -> list[int]:
    if value is None:
        return []
    values = value if isinstance(value, (list, tuple)) else [value]
    return [int(v) for v in values if int(v) >= 0]  # transformers writes -1 for "no EOS"


def _stops(settings: RunSettings, models: Any, names: Mapping[str, str] | None) -> tuple[Any, Any]:
    """The run's Stops and, for stop strings, the text of each token (from the tokenizer)."""
    from specscope.core.decode.stops import Stops, token_piece_function

    stops = Stops(tuple(settings.stop_strings), tuple(tuple(s) for s in settings.stop_ids))
    if not stops.strings:
        return stops, None
    if models.tokenizer is None:
        raise SettingsError(
            {
                "stop_strings": f"{_names(names)['stop_strings']} need a tokenizer (the text of each "
                f"token): this target has none; stop on token ids instead"
            }
        )
    return stops, token_piece_function(models.tokenizer)


def prompt_ids(settings: RunSettings, models: Any, text: str) -> list[int]:
    """The ids of prompt text: with settings.chat, the tokenizer's chat template around it (the
    user's turn, settings.system the system turn, then the assistant's turn header); else the
    text's tokens. SettingsError (under "prompt") without a tokenizer or a template."""
    from specscope.core.loading.errors import CheckpointError

    if models.tokenizer is None:
        raise SettingsError({"prompt": "this target has no tokenizer: give the prompt as token ids"})
    if not settings.chat:
        return [int(i) for i in models.tokenizer(text, add_special_tokens=False)["input_ids"]]
    from specscope.core.loading.chat import chat_prompt_ids

    try:
        return chat_prompt_ids(models.tokenizer, text, settings.system)
    except CheckpointError as exc:
        raise SettingsError({"prompt": str(exc)}) from None


def build_decoder(settings: RunSettings, models: Any, names: Mapping[str, str] | None = None) -> Any:
    """A SpeculativeDecoder (a FaultyDecoder with settings.fault) or, with engine
    "transformers", a TransformersEngine, for `models`; SettingsError when the settings
    cannot run."""
    settings.check(names)
    eos = resolve_eos(settings, models, names)
    stops, piece = _stops(settings, models, names)
    if settings.engine == "transformers":
        return _transformers_engine(settings, models, eos, names, stops, piece)
    from specscope.core.decode.decoder import SpeculativeDecoder
    from specscope.core.draft.registry import SpecError, build_proposer, for_target

    try:
        # `eagle3` alone: a named target's own head (catalog default_heads), for every front end
        spec = for_target(settings.spec, models.target_name)
        proposer = build_proposer(spec, load_draft=lambda ref: (models.draft, models.draft_name))
    except SpecError as exc:
        raise SettingsError({"proposer": f"{_names(names)['proposer']}: {exc}"}) from None
    options = dict(
        k=settings.k,
        sampling=settings.sampling(),
        eos_token_id=eos,
        seed=settings.seed,
        use_cache=settings.use_cache,
        target_name=models.target_name,
        # the records keep full vectors when asked, else top-N above 4096 tokens (core.sampling.dists),
        # computed on the model's device ("top" only changes what a store keeps)
        vectors="full" if settings.vectors == "full" else "auto",
        top_n=_top_n(settings),
        # greedy decoding draws nothing: there is no randomness to couple
        coupling_seed=None if settings.greedy else settings.coupling_seed,
        stops=stops,
        token_piece=piece,
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


def _transformers_engine(
    settings: RunSettings, models: Any, eos: tuple[int, ...], names: Mapping[str, str] | None, stops: Any, piece: Any
) -> Any:
    """transformers' own generate() with the spec's draft model (assisted) or prompt lookup, recorded."""
    from specscope.core.decode.draft_length import START_K
    from specscope.core.draft.registry import parse_spec
    from specscope.core.engines import PrivateAPIChanged, TransformersEngine

    spec = parse_spec(settings.spec)  # validated
    try:
        return TransformersEngine(
            models.target,
            kind="assisted" if spec.kind == "draft" else "lookup",
            draft=models.draft,
            # k auto: transformers' own adaptive length (its "heuristic" schedule, from 4), as its
            # generate() runs it; the settings refuse auto for its prompt lookup
            k=settings.k if isinstance(settings.k, int) else START_K,
            schedule="constant" if isinstance(settings.k, int) else "heuristic",
            sampling=settings.sampling(),
            eos_token_id=eos,
            seed=settings.seed,
            target_name=models.target_name,
            draft_name=models.draft_name,
            max_ngram=int(spec.params.get("max_ngram", HF_LOOKUP_MAX_NGRAM)),
            vectors="full" if settings.vectors == "full" else "auto",
            top_n=_top_n(settings),
            stops=stops,
            token_piece=piece,
        )
    except (PrivateAPIChanged, ValueError) as exc:
        raise SettingsError({"engine": f"{_names(names)['engine']} transformers: {exc}"}) from None


def check_positions(
    prompt_ids: Sequence[int], settings: RunSettings, models: Any, names: Mapping[str, str] | None = None
) -> None:
    """Refuse a prompt that, with settings.max_new_tokens after it, would pass the models'
    position limit (max_position_embeddings): a model reads nothing sensible past it."""
    from specscope.core.loading.models import position_limit

    found = position_limit(models)
    if found is None:
        return
    limit, model = found
    n, budget = len(prompt_ids), settings.max_new_tokens
    extra, why = _positions_past_budget(settings)
    if n + extra > limit:
        raise SettingsError(
            {
                "prompt": f"the prompt is {n} tokens{why}, but {model} reads at most {limit} positions "
                f"(max_position_embeddings): shorten the prompt"
            }
        )
    if n + budget + extra > limit:
        raise SettingsError(
            {
                "max_new_tokens": (
                    f"the prompt ({n} tokens) plus {budget} new tokens{why} needs {n + budget + extra} positions, "
                    f"but {model} reads at most {limit} (max_position_embeddings): "
                    f"{_names(names)['max_new_tokens']} must be at most {limit - n - extra}"
                )
            }
        )


def _positions_past_budget(settings: RunSettings) -> tuple[int, str]:
    """The positions a run's engine reads past prompt + budget, and why: transformers' prompt
    lookup's (core.engines.hf_engine.lookup_positions_past_budget); none otherwise."""
    if settings.engine != "transformers" or not isinstance(settings.k, int):  # k auto: refused by the settings' check
        return 0, ""
    from specscope.core.draft.registry import parse_spec
    from specscope.core.engines.hf_engine import lookup_positions_past_budget

    return lookup_positions_past_budget(settings.k) if parse_spec(settings.spec).kind == "lookup" else (0, "")


def run_config(
    decoder: Any,
    settings: RunSettings,
    models: Any,
    prompt_ids: Sequence[int],
    run_id: str | None = None,
    names: Mapping[str, str] | None = None,
) -> RunConfig:
    """The RunConfig of one run of `decoder` (from build_decoder) on `prompt_ids`, after the
    position-limit check."""
    check_positions(prompt_ids, settings, models, names)
    config: RunConfig = decoder.run_config(prompt_ids, settings.max_new_tokens, run_id)
    return config


__all__ = [
    "Models",
    "RunSettings",
    "SettingsError",
    "build_decoder",
    "check_positions",
    "prompt_ids",
    "resolve_eos",
    "run_config",
]
