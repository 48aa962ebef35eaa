"""core.decode.settings and core.decode.factory: one settings object, validated once, built
into a decoder or an engine, with the EOS default and the position limit in one place."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from specscope.core import SamplingConfig, SpeculativeDecoder
from specscope.core.decode.factory import Models, build_decoder, check_positions, resolve_eos, run_config
from specscope.core.decode.settings import INT32_MAX, INT64_MAX, MAX_K, RunSettings, SettingsError
from specscope.core.draft.proposers import DraftModelProposer, PromptLookupProposer
from specscope.core.engines import TransformersEngine
from specscope.core.faults.zoo import FaultyDecoder

PROMPT = [1, 2, 3, 4, 1, 2, 3]
FLAGS = {"k": "--k", "temperature": "--temperature", "max_new_tokens": "--max-new", "top_p": "--top-p"}


class Tokenizer:
    eos_token_id = 5


@pytest.fixture(scope="module")
def models(llama_pair):
    target, draft = llama_pair
    return Models(target, Tokenizer(), "tiny-target", draft, "tiny-draft")


def test_defaults_validate():
    assert RunSettings().validate() == {}


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("k", 0, "k (draft length) must be at least 1, got 0"),
        ("k", MAX_K + 1, f"must be at most {MAX_K}"),
        ("k", 2.5, "must be a whole number"),
        ("temperature", math.nan, "temperature must be a finite number, got nan"),
        ("temperature", math.inf, "temperature must be a finite number"),
        ("temperature", -1.0, "temperature must be at least 0 (0 = greedy), got -1"),
        ("top_p", math.nan, "top-p must be a finite number"),
        ("top_p", 0.0, "top-p must lie in (0, 1] (1 = off), got 0"),
        ("top_p", 1.5, "top-p must lie in (0, 1]"),
        ("top_p", -1.0, "top-p must lie in (0, 1] (1 = off), got -1"),
        ("top_k", -1, "top-k must be at least 0, got -1"),
        ("top_k", INT32_MAX + 1, f"top-k must be at most {INT32_MAX}"),
        ("seed", -1, "seed must be at least 0"),
        ("seed", INT64_MAX + 1, f"seed must be at most {INT64_MAX}"),
        ("max_new_tokens", 0, "max new tokens must be at least 1, got 0"),
        ("eos", -5, "EOS must be a token id from 0 to"),
        ("coupling_seed", -1, "coupling seed must be at least 0"),
        ("top_n", 0, "top-N must be at least 1"),
        ("vectors", "some", "vectors must be one of auto, full, top"),
        ("engine", "gpt", "engine must be one of specscope, transformers, vllm"),
        ("fault", "no-such-bug", "unknown fault 'no-such-bug'"),
        ("proposer", "nope", "unknown proposer 'nope'"),
        ("proposer", "lookup:max_ngram=0", "proposer: "),
        ("proposer", "lookup:max_ngram=x", "must be an integer"),
    ],
)
def test_each_bad_value_has_one_message_under_its_field(field, value, words):
    errors = RunSettings(**{field: value}).validate()
    assert list(errors) == [field] and words in errors[field], errors


def test_tree_problems_go_under_tree_and_children():
    assert "branching factor" in RunSettings(proposer="draft:small,tree=3,x").validate()["tree"]
    assert "children" in RunSettings(proposer="draft:small,tree=2,1,children=some").validate()
    assert "choose a tree" in RunSettings(proposer="draft:small,children=sampled").validate()["children"]


def test_what_the_vllm_engine_cannot_run_is_refused_under_its_field():
    assert RunSettings(engine="vllm", proposer="lookup").validate() == {}
    assert RunSettings(engine="vllm", proposer="draft:small").validate() == {}
    errors = RunSettings(
        engine="vllm", proposer="lookup", coupling_seed=1, fault="eos-leak", use_cache=False, stop_strings=("x",)
    ).validate()
    assert sorted(errors) == ["coupling_seed", "fault", "stop_strings", "use_cache"]
    assert all("vllm engine" in msg for msg in errors.values()), errors
    assert "chains" in RunSettings(engine="vllm", proposer="draft:small,tree=2,1").validate()["tree"]
    for spec in ("eagle3,lookup=3", "eagle3,stop=0.3"):  # specscope's own head options
        assert "specscope's own head option" in RunSettings(engine="vllm", proposer=spec).validate()["proposer"]


def test_what_cannot_run_together_is_refused():
    tree = "draft:small,tree=2,1"
    assert "tree" in RunSettings(proposer=tree, coupling_seed=3).validate()["coupling_seed"]
    engine = RunSettings(engine="transformers", coupling_seed=1, fault="eos-leak", use_cache=False)
    assert set(engine.validate()) == {"coupling_seed", "fault", "use_cache"}
    assert "chains" in RunSettings(engine="transformers", proposer=tree).validate()["tree"]
    assert "min_ngram" in RunSettings(engine="transformers", proposer="lookup:min_ngram=2").validate()["proposer"]
    assert RunSettings(engine="transformers", proposer="lookup:max_ngram=4").validate() == {}


def test_messages_name_the_fields_as_the_caller_does():
    errors = RunSettings(k=0, temperature=math.nan).validate(FLAGS)
    assert errors == {
        "k": "--k must be at least 1, got 0",
        "temperature": "--temperature must be a finite number, got nan",
    }
    with pytest.raises(SettingsError) as caught:
        RunSettings(k=0, temperature=math.nan).check(FLAGS)
    assert str(caught.value) == "--k must be at least 1, got 0; --temperature must be a finite number, got nan"
    assert caught.value.errors == errors


def test_build_decoder_makes_each_kind(models):
    chain = build_decoder(RunSettings(k=3, temperature=1.0, seed=7), models)
    assert type(chain) is SpeculativeDecoder and isinstance(chain.proposer, DraftModelProposer)
    assert (chain.k, chain.seed, chain.sampling, chain.target_name) == (
        3,
        7,
        SamplingConfig(temperature=1.0),
        "tiny-target",
    )
    assert isinstance(build_decoder(RunSettings(proposer="lookup"), models).proposer, PromptLookupProposer)
    assert isinstance(build_decoder(RunSettings(fault="eos-leak"), models), FaultyDecoder)
    engine = build_decoder(RunSettings(engine="transformers", proposer="lookup"), models)
    assert isinstance(engine, TransformersEngine) and engine.kind == "lookup" and engine.max_ngram == 2
    assisted = build_decoder(RunSettings(engine="transformers"), models)
    assert assisted.kind == "assisted" and assisted.draft is models.draft and assisted.draft_name == "tiny-draft"


def test_build_decoder_refuses_before_building(models):
    with pytest.raises(SettingsError) as caught:
        build_decoder(RunSettings(top_p=math.nan, k=-1), models, FLAGS)
    assert set(caught.value.errors) == {"top_p", "k"} and "--top-p" in str(caught.value)


def test_eos_defaults_to_the_tokenizer_and_must_fit_the_vocabulary(models):
    assert resolve_eos(RunSettings(), models) == (5,)
    assert resolve_eos(RunSettings(eos=9), models) == (9,)
    assert resolve_eos(RunSettings(eos=(9, 3, 9)), models) == (9, 3)
    assert resolve_eos(RunSettings(eos_disabled=True), models) == ()
    assert resolve_eos(RunSettings(), replace(models, tokenizer=None)) == ()
    with pytest.raises(SettingsError) as caught:
        build_decoder(RunSettings(eos=(3, 64)), models, {"eos": "--eos-id"})
    assert caught.value.errors == {"eos": "--eos-id must be token ids below the vocabulary size 64, got 64"}
    assert build_decoder(RunSettings(), models).eos_token_id == 5


def test_greedy_runs_are_not_coupled(models):
    assert build_decoder(RunSettings(coupling_seed=3), models).coupling is None
    assert build_decoder(RunSettings(coupling_seed=3, temperature=1.0), models).coupling is not None


def test_position_limit_refuses_the_prompt_or_the_budget(models):
    limit = models.target.config.max_position_embeddings
    decoder = build_decoder(RunSettings(), models)
    fits = RunSettings(max_new_tokens=limit - len(PROMPT))
    assert run_config(decoder, fits, models, PROMPT).max_new_tokens == limit - len(PROMPT)
    with pytest.raises(SettingsError) as caught:
        run_config(decoder, replace(fits, max_new_tokens=limit), models, PROMPT, names=FLAGS)
    ((field, message),) = caught.value.errors.items()
    assert field == "max_new_tokens" and f"needs {limit + len(PROMPT)} positions" in message
    assert f"at most {limit} (max_position_embeddings)" in message
    assert message.endswith(f"--max-new must be at most {limit - len(PROMPT)}")
    with pytest.raises(SettingsError) as caught:
        check_positions([1] * (limit + 1), RunSettings(max_new_tokens=1), models)
    assert list(caught.value.errors) == ["prompt"] and "shorten the prompt" in caught.value.errors["prompt"]


def test_the_draft_sets_the_limit_when_it_reads_fewer_positions(models):
    import copy

    short = copy.deepcopy(models.draft)
    short.config.max_position_embeddings = 16
    with pytest.raises(SettingsError) as caught:
        check_positions(PROMPT, RunSettings(max_new_tokens=10), replace(models, draft=short))
    assert "tiny-draft reads at most 16" in caught.value.errors["max_new_tokens"]
    check_positions(PROMPT, RunSettings(max_new_tokens=10), replace(models, draft=None, target=models.target))


def test_the_factory_decodes_what_the_decoder_does(models):
    settings = RunSettings(k=3, temperature=1.0, seed=11, eos_disabled=True, max_new_tokens=20)
    decoder = build_decoder(settings, models)
    built = decoder.start(PROMPT, 20, config=run_config(decoder, settings, models, PROMPT)).drain()
    direct = SpeculativeDecoder(
        models.target, DraftModelProposer(models.draft), k=3, sampling=SamplingConfig(temperature=1.0), seed=11
    ).generate(PROMPT, 20)
    assert built.new_tokens == direct.new_tokens and len(built.new_tokens) == 20


def test_eos_defaults_to_every_id_of_the_generation_config_and_the_tokenizer(models, monkeypatch):
    # a chat model (Gemma: <eos> and <end_of_turn>) names several: the run ends at any of them
    monkeypatch.setattr(models.target.generation_config, "eos_token_id", [7, 5])
    assert resolve_eos(RunSettings(), models) == (7, 5)
    decoder = build_decoder(RunSettings(), models)
    assert decoder.eos_token_ids == (7, 5) and decoder.run_config([1, 2], 4).eos_ids == {5, 7}
    assert resolve_eos(RunSettings(eos=3), models) == (3,)  # the settings' ids replace the model's
