"""Every private transformers name the transformers engine relies on, in one place.

The engine runs transformers' own `generate(assistant_model=...)` / prompt lookup loop
(`GenerationMixin._assisted_decoding`) unchanged. To see each round it needs three things
transformers does not promise to keep:

- `GenerationMixin._get_candidate_generator`: the loop builds its candidate generator here;
  the engine wraps what it returns (the same object, two of its methods observed).
- the candidate generator protocol the loop calls once per round:
  `get_candidates(input_ids, ...) -> (candidate_input_ids, candidate_logits | None)` and
  `update_candidate_strategy(input_ids, scores, num_matches)` with `scores` the target's
  processed logits of the round and `input_ids` the sequence after the round.
- the model output's `cache` field and the forward's `cache` keyword (transformers 5.x
  names), read for the cache lengths.

`check_private_api()` runs at engine start-up and raises PrivateAPIChanged, naming what
moved, when the installed transformers no longer matches.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any

GET_CANDIDATE_GENERATOR = "_get_candidate_generator"
ASSISTED_LOOP = "_assisted_decoding"
CACHE_OUTPUT_FIELD = "cache"  # ModelOutput field holding the KV cache (transformers 5.x)
CACHE_FORWARD_KWARG = "cache"  # forward() keyword the generation loop passes the cache as
TESTED_VERSIONS = ("5.24",)  # major.minor versions the recorder was checked against

# what the assisted loop's source must still say for the recorder's reading of it to hold
_LOOP_CALLS = (
    "candidate_generator.get_candidates(",
    "candidate_generator.update_candidate_strategy(input_ids, new_logits, n_matches)",
    "outputs.cache.crop(",
    "self._get_candidate_generator(",
)


class PrivateAPIChanged(RuntimeError):
    """The installed transformers no longer has the private names the engine relies on."""


def transformers_version() -> str:
    import transformers

    return str(transformers.__version__)


def check_private_api() -> str:
    """The installed transformers version, after checking every private name listed here;
    raises PrivateAPIChanged with what changed."""
    from transformers.generation import candidate_generator as cg
    from transformers.generation.utils import GenerationMixin

    version = transformers_version()
    problems: list[str] = []
    for name in (GET_CANDIDATE_GENERATOR, ASSISTED_LOOP):
        if not callable(getattr(GenerationMixin, name, None)):
            problems.append(f"GenerationMixin.{name} is gone")
    for cls_name in ("CandidateGenerator", "AssistedCandidateGenerator", "PromptLookupCandidateGenerator"):
        if not isinstance(getattr(cg, cls_name, None), type):
            problems.append(f"transformers.generation.candidate_generator.{cls_name} is gone")
    base = getattr(cg, "CandidateGenerator", None)
    if base is not None:
        _check_params(base, "update_candidate_strategy", ("input_ids", "scores", "num_matches"), problems)
        _check_params(base, "get_candidates", ("input_ids",), problems)
    loop = getattr(GenerationMixin, ASSISTED_LOOP, None)
    if loop is not None:
        try:
            source = inspect.getsource(loop)
        except (OSError, TypeError):
            source = ""
        problems += [f"{ASSISTED_LOOP} no longer calls `{call}`" for call in _LOOP_CALLS if call not in source]
    if problems:
        raise PrivateAPIChanged(
            f"the transformers engine does not support the installed transformers {version} "
            f"(checked against {', '.join(TESTED_VERSIONS)}): "
            + "; ".join(problems)
            + ". Update specscope/core/engines/hf_private.py for this version."
        )
    return version


def _check_params(cls: type, method: str, names: tuple[str, ...], problems: list[str]) -> None:
    func = getattr(cls, method, None)
    if func is None:
        problems.append(f"{cls.__name__}.{method} is gone")
        return
    params = list(inspect.signature(func).parameters)[1:]
    if tuple(params[: len(names)]) != names:
        problems.append(f"{cls.__name__}.{method} takes {params}, not {list(names)}")


def output_cache(output: Any) -> Any:
    """The KV cache object of a model output (None when it has none)."""
    cache = getattr(output, CACHE_OUTPUT_FIELD, None)
    return cache if cache is not None else getattr(output, "past_key_values", None)


def cache_length(cache: Any) -> int | None:
    if cache is None:
        return None
    return int(cache.get_seq_length())


def install_candidate_hook(model: Any, wrap: Any) -> Any:
    """Make `model`'s generation loop, when it runs in the calling thread, pass its candidate
    generator through `wrap(generator)`. One dispatcher per model (an instance attribute
    shadowing the class method) serves every thread, so two runs on one model (two compare
    lanes) each see only their own loop. Returns an undo callable."""
    thread = threading.get_ident()
    with _HOOK_LOCK:
        wraps = model.__dict__.get(_WRAPS_ATTR)
        if wraps is None:
            wraps = {}
            original = getattr(type(model), GET_CANDIDATE_GENERATOR).__get__(model)

            def get_candidate_generator(*args: Any, **kwargs: Any) -> Any:
                generator = original(*args, **kwargs)
                hook = wraps.get(threading.get_ident())
                return hook(generator) if hook is not None else generator

            object.__setattr__(model, _WRAPS_ATTR, wraps)
            object.__setattr__(model, GET_CANDIDATE_GENERATOR, get_candidate_generator)
        wraps[thread] = wrap

    def undo() -> None:
        with _HOOK_LOCK:
            wraps.pop(thread, None)
            if not wraps:
                model.__dict__.pop(GET_CANDIDATE_GENERATOR, None)
                model.__dict__.pop(_WRAPS_ATTR, None)

    return undo


_HOOK_LOCK = threading.Lock()
_WRAPS_ATTR = "_specscope_candidate_hooks"
