"""The decoder's public seams: proposer specs, the run handle, the verifier and cache policy."""

from __future__ import annotations

import pytest

from specscope.core import (
    DraftModelProposer,
    PromptLookupProposer,
    RunHandle,
    SamplingConfig,
    SpecError,
    SpeculativeDecoder,
    build_proposer,
    parse_spec,
)
from specscope.core.check.checker import check_run
from specscope.core.decode.kv import CachePolicy
from specscope.core.faults.zoo import FAULTS, faulty_decoder
from specscope.core.verify.tree import TreeVerifier
from tests.tiny_models import noisy_copy, tiny_lm


@pytest.fixture(scope="module")
def pair():
    target = tiny_lm("llama", seed=1, init_range=0.3)
    return target, noisy_copy(target, 0.2)


@pytest.mark.parametrize(
    "text, kind, arg, params, canonical",
    [
        ("draft", "draft", None, {}, "draft"),
        ("draft:small", "draft", "small", {}, "draft:small"),
        ("DRAFT:/models/my,draft", "draft", "/models/my,draft", {}, "draft:/models/my,draft"),
        ("lookup", "lookup", None, {}, "lookup"),
        (
            "lookup:max_ngram=4,min_ngram=2",
            "lookup",
            None,
            {"max_ngram": 4, "min_ngram": 2},
            "lookup:max_ngram=4,min_ngram=2",
        ),
    ],
)
def test_specs_parse_and_print_back(text, kind, arg, params, canonical):
    spec = parse_spec(text)
    assert (spec.kind, spec.arg, dict(spec.params)) == (kind, arg, params)
    assert str(spec) == canonical
    assert parse_spec(str(spec)) == spec


@pytest.mark.parametrize(
    "text, message",
    [
        ("hydra", "unknown proposer 'hydra'; known: draft, lookup, eagle, eagle3, medusa, mtp"),
        ("lookup:n=3", "has no parameter 'n'"),
        ("lookup:max_ngram=three", "max_ngram must be an integer"),
        ("lookup:max_ngram=0", "max_ngram must be an integer >= 1"),
        ("lookup:small", "takes no model argument"),
    ],
)
def test_bad_specs_say_what_is_wrong(text, message):
    with pytest.raises(SpecError, match=message):
        build_proposer(text)


def test_draft_specs_load_their_model_through_the_given_loader(pair):
    _, draft = pair
    asked = []

    def load(ref):
        asked.append(ref)
        return draft, f"label-{ref}"

    default = build_proposer("draft", load)
    named = build_proposer("draft:/some/folder", load)
    assert asked == ["small", "/some/folder"]
    assert isinstance(named, DraftModelProposer) and named.label == "label-/some/folder"
    assert (default.spec, named.spec) == ("draft", "draft:/some/folder")
    with pytest.raises(SpecError, match="needs a model loader"):
        build_proposer("draft")


def test_the_trace_records_the_spec(pair):
    target, _ = pair
    dec = SpeculativeDecoder(target, build_proposer("lookup:max_ngram=2"), k=3)
    assert dec.run_config([1, 2, 3], 5).proposer_params == {
        "spec": "lookup:max_ngram=2",
        "max_ngram": 2,
        "min_ngram": 1,
    }


def test_bind_refuses_a_proposer_for_another_vocabulary(pair):
    target, _ = pair
    other = tiny_lm("llama", vocab=48, seed=2)
    with pytest.raises(ValueError, match="vocabularies differ"):
        SpeculativeDecoder(target, DraftModelProposer(other))
    with pytest.raises(ValueError, match="built for a vocabulary of 48"):
        SpeculativeDecoder(target, PromptLookupProposer(vocab_size=48))
    with pytest.raises(TypeError, match="is not a specscope Proposer: it lacks spec, bind"):
        SpeculativeDecoder(
            target,
            object.__new__(
                type("Old", (), {"name": "old", "reset": None, "propose": None, "observe": None, "params": None})
            ),
        )


def test_run_handle_iterates_rounds_and_keeps_the_result(pair):
    target, draft = pair
    dec = SpeculativeDecoder(target, DraftModelProposer(draft), k=3, sampling=SamplingConfig(temperature=1.0), seed=4)
    run = dec.start([1, 2, 3, 4], 20)
    assert isinstance(run, RunHandle) and run.result is None and run.config.max_new_tokens == 20
    first = run.step()
    assert first is not None and first.index == 0 and not run.done
    seen = [first.index] + [r.index for r in run]
    assert run.done and seen == list(range(len(seen)))
    assert run.step() is None and list(run) == []
    assert run.result.new_tokens == dec.generate([1, 2, 3, 4], 20, seed=4).new_tokens
    assert run.result.rounds == [] and run.result.summary.rounds == len(seen)  # start() keeps no rounds


def test_run_handle_close_cancels_and_drain_closes_on_error(pair):
    target, draft = pair
    dec = SpeculativeDecoder(target, DraftModelProposer(draft), k=2)
    run = dec.start([1, 2, 3], 30)
    run.step()
    run.close()
    assert run.step() is None and run.result is None

    def boom(_rnd):
        raise RuntimeError("consumer failed")

    run = dec.start([1, 2, 3], 30)
    with pytest.raises(RuntimeError, match="consumer failed"):
        run.drain(boom)
    assert run.step() is None  # the generator was closed, not left half-way


def test_a_decoder_given_the_default_seams_explicitly_is_the_default_decoder(pair):
    target, draft = pair
    cfg = SamplingConfig(temperature=0.9, top_k=20)
    a = SpeculativeDecoder(target, DraftModelProposer(draft), k=3, sampling=cfg, seed=7).generate([3, 1, 4, 1, 5], 25)
    b = SpeculativeDecoder(
        target,
        DraftModelProposer(draft, cache=CachePolicy()),
        k=3,
        sampling=cfg,
        seed=7,
        verifier=TreeVerifier(),
        target_cache=CachePolicy(),
    ).generate([3, 1, 4, 1, 5], 25)
    assert a.new_tokens == b.new_tokens
    assert [r.target_cache for r in a.rounds] == [r.target_cache for r in b.rounds]


@pytest.mark.parametrize("fault", [name for name, f in FAULTS.items() if not f.needs])
def test_every_fault_is_a_wrapper_that_fires_and_leaves_the_callers_proposer_alone(pair, fault):
    """A fault that silently stopped firing (as a renamed private method once allowed) fails here."""
    target, draft = pair
    # eos-leak needs an accepted draft EOS with tokens after it: the target drafting for
    # itself greedily accepts everything, and EOS is the second token it emits.
    eos_run = fault == "eos-leak"
    proposer = DraftModelProposer(target if eos_run else draft)
    before = (proposer.cache, proposer.sample_step)
    fired = 0
    for seed in range(40):
        prompt = [1, 2, 3, 4, 1, 2, seed]
        if eos_run:
            cfg = SamplingConfig(temperature=0)
            eos = (
                SpeculativeDecoder(target, DraftModelProposer(target), k=4, sampling=cfg)
                .generate(prompt, 2)
                .new_tokens[1]
            )
        else:
            cfg = (
                SamplingConfig(temperature=1.0, top_k=5)
                if fault != "budget-overshoot"
                else SamplingConfig(temperature=0)
            )
            eos = None
        dec = faulty_decoder(fault, target, proposer, k=4, sampling=cfg, eos_token_id=eos, seed=seed)
        out = dec.generate(prompt, 9 + seed % 5)
        assert out.config.fault == fault
        if dec.fault_rounds:
            fired += 1
            assert check_run(out.config, out.rounds), f"{fault} fired but the checker saw nothing"
        if fired >= 2:
            break
    assert fired >= 2, f"{fault} fired in {fired} of the runs"
    assert (proposer.cache, proposer.sample_step) == before
