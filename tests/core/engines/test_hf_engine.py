"""The transformers engine: transformers' own generate() recorded round by round.

The recorder must not change what it records (recorded tokens == the same generate() call
without it, greedy and sampled, three architectures, many prompts); greedy output equals
specscope's own decoder and plain greedy; the rounds pass the checker except for the
findings docs/transformers-engine.md classifies; cancel and the private-API check work.
"""

from __future__ import annotations

import random

import pytest
import torch

from specscope.core import SamplingConfig, SpeculativeDecoder
from specscope.core.check.checker import check_report
from specscope.core.draft.proposers import DraftModelProposer, PromptLookupProposer
from specscope.core.engines import PrivateAPIChanged, TransformersEngine, check_private_api, hf_private
from tests.tiny_models import ARCHITECTURES, noisy_copy, tiny_lm

SAMPLERS = (
    SamplingConfig(temperature=0.0),
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.8, top_k=8, top_p=0.9),
)


@pytest.fixture(scope="module", params=ARCHITECTURES)
def arch_pair(request):
    target = tiny_lm(request.param, seed=0, init_range=0.3)
    return target, noisy_copy(target, 0.5)


def _prompts(n: int, vocab: int = 64) -> list[list[int]]:
    out = []
    for i in range(n):
        rng = random.Random(i)
        prompt = [rng.randrange(vocab) for _ in range(rng.randrange(2, 10))]
        out.append(prompt + prompt if i % 2 else prompt)  # repeats give prompt lookup matches
    return out


def _expected(finding) -> bool:
    """The findings docs/transformers-engine.md classifies (not recorder errors)."""
    message = finding.message
    return (
        (finding.rule == "draft-budget" and message.startswith("draft length k="))  # lookup drafts past the budget
        or (finding.rule == "target-cache" and "below the accepted prefix" in message)  # last token left pending
        or (finding.rule == "draft-cache" and "rejected suffix was not cropped" in message)  # last round, never cropped
    )


@pytest.mark.parametrize("kind", ["assisted", "lookup"])
@pytest.mark.parametrize("sampling", SAMPLERS, ids=lambda s: s.describe())
def test_recorded_tokens_equal_unrecorded_generate(arch_pair, kind, sampling):
    target, draft = arch_pair
    for eos in (None, 7):
        engine = TransformersEngine(target, kind=kind, draft=draft, k=4, sampling=sampling, eos_token_id=eos)
        for seed, prompt in enumerate(_prompts(5)):
            result = engine.generate(prompt, 20, seed=seed)
            assert result.new_tokens == engine.plain_generate(prompt, 20, seed=seed), (kind, eos, seed)
            assert [t for r in result.rounds for t in r.tokens] == result.new_tokens
            report = check_report(result.config, result.rounds)
            assert [f for f in report.findings if not _expected(f)] == []
            if not sampling.greedy:
                assert "acceptance-draw" in report.not_checked or all(not r.nodes for r in result.rounds)


@pytest.mark.parametrize("kind", ["assisted", "lookup"])
def test_greedy_equals_specscope_and_plain_greedy(arch_pair, kind):
    target, draft = arch_pair
    greedy = SamplingConfig(temperature=0.0)
    engine = TransformersEngine(target, kind=kind, draft=draft, k=3, sampling=greedy)
    for prompt in _prompts(4):
        ours = (
            SpeculativeDecoder(
                target,
                DraftModelProposer(draft) if kind == "assisted" else PromptLookupProposer(),
                k=3,
                sampling=greedy,
            )
            .generate(prompt, 16)
            .new_tokens
        )
        with torch.inference_mode():
            ids = torch.tensor([prompt])
            plain = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False)
        assert engine.generate(prompt, 16).new_tokens == ours == plain[0, len(prompt) :].tolist()


def test_round_contents(llama_pair):
    target, draft = llama_pair
    engine = TransformersEngine(target, kind="assisted", draft=draft, k=4, sampling=SamplingConfig(temperature=1.0))
    result = engine.generate([1, 2, 3, 4, 5], 24, seed=2)
    config = result.config
    assert config.proposer == "transformers-assisted" and config.proposer_params["spec"].startswith("hf-assisted:")
    assert config.unrecorded >= {"u", "draw"}
    for rnd in result.rounds:
        for node in rnd.nodes:
            assert node.u is None and node.q is not None and abs(node.q.sum() - 1) < 1e-9
            assert node.p_token == pytest.approx(node.p[node.token])
        assert all(e.draw is None for e in rnd.emitted)
        assert rnd.target_forwards == 1 and rnd.draft_forwards >= len(rnd.nodes)
        assert rnd.target_cache.after + len(rnd.target_cache.pending) == rnd.prefix_len + len(rnd.emitted)
    lookup = TransformersEngine(target, kind="lookup", k=3, sampling=SamplingConfig(temperature=1.0))
    rounds = lookup.generate([5, 6, 7, 5, 6, 7, 5, 6], 12).rounds
    drafted = [n for r in rounds for n in r.nodes]
    assert drafted and all(n.q_token == 1.0 for n in drafted)
    assert all(r.draft_cache is None for r in rounds)


def test_cancel_stops_after_the_round_in_progress(llama_pair):
    target, draft = llama_pair
    engine = TransformersEngine(target, kind="assisted", draft=draft, k=2, sampling=SamplingConfig(temperature=0.0))
    run = engine.start([1, 2, 3], 200)
    first = run.step()
    assert first is not None
    run.close()
    assert run.step() is None
    # the engine (and the target) are usable again after a cancel, with nothing left attached
    assert "_get_candidate_generator" not in target.__dict__
    assert engine.generate([1, 2, 3], 8).new_tokens == engine.plain_generate([1, 2, 3], 8)


def test_two_runs_stepped_in_turn_draw_as_alone(llama_pair):
    target, draft = llama_pair
    sampling = SamplingConfig(temperature=1.0)
    a = TransformersEngine(target, kind="assisted", draft=draft, k=3, sampling=sampling)
    b = TransformersEngine(target, kind="lookup", k=3, sampling=sampling)
    run_a, run_b = a.start([1, 2, 3], 16, seed=5), b.start([4, 5, 4, 5], 16, seed=6)
    while not (run_a.done and run_b.done):
        run_a.step()
        run_b.step()
    assert run_a.result.new_tokens == a.plain_generate([1, 2, 3], 16, seed=5)
    assert run_b.result.new_tokens == b.plain_generate([4, 5, 4, 5], 16, seed=6)


def test_errors_in_generate_reach_the_consumer(llama_pair, monkeypatch):
    target, draft = llama_pair
    engine = TransformersEngine(target, kind="assisted", draft=draft, k=2)

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(engine, "_call_generate", boom)
    with pytest.raises(RuntimeError, match="boom"):
        engine.generate([1, 2, 3], 4)


def test_private_api_check(monkeypatch):
    assert check_private_api().startswith("5.")
    monkeypatch.setattr(hf_private, "_LOOP_CALLS", hf_private._LOOP_CALLS + ("no_such_call(",))
    with pytest.raises(PrivateAPIChanged, match="no_such_call"):
        check_private_api()


def test_zero_budget_and_validation(llama_pair):
    target, draft = llama_pair
    engine = TransformersEngine(target, kind="lookup", k=2)
    result = engine.generate([1, 2], 0)
    assert result.new_tokens == [] and result.rounds == []
    with pytest.raises(ValueError):
        TransformersEngine(target, kind="assisted")
    with pytest.raises(ValueError):
        TransformersEngine(target, kind="eagle", draft=draft)


@pytest.mark.parametrize("proposer", ["draft", "lookup:max_ngram=3"])
def test_cli_run_engine_transformers_records_and_checks(tmp_path, capsys, proposer):
    import json

    from specscope.app.cli import main
    from tests.tiny_models import save_pair

    target_dir, draft_dir = save_pair(tmp_path)
    db = str(tmp_path / "t.sqlite")
    args = [
        "run",
        "--engine",
        "transformers",
        "--proposer",
        proposer,
        "--target",
        str(target_dir),
        "--prompt-ids",
        "1,2,3,1,2,3,1,2",
        "--max-new",
        "12",
        "--temperature",
        "1",
        "--device",
        "cpu",
        "--eos-id",
        "none",
        "--json",
        "--db",
        db,
    ]
    if proposer == "draft":
        args += ["--draft", str(draft_dir)]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert len(summary["new_tokens"]) == 12 and summary["stop_reason"] == "budget"
    assert main(["check", db]) == 0
    out = capsys.readouterr().out
    assert "not checked: acceptance-draw" in out


def test_cli_rejects_what_the_transformers_engine_cannot_run(capsys):
    from specscope.app.cli import main

    code = main(
        [
            "run",
            "--engine",
            "transformers",
            "--proposer",
            "lookup:min_ngram=2",
            "--prompt-ids",
            "1,2",
            "--device",
            "cpu",
        ]
    )
    assert code != 0
    assert "min_ngram" in capsys.readouterr().err


def test_the_models_own_generation_config_does_not_leak_in():
    """generate() fills unset fields from the model's generation_config: a model whose config
    names an EOS still runs to the budget when the run has no EOS."""
    target = tiny_lm("llama", seed=0, init_range=0.3)
    draft = noisy_copy(target, 0.5)
    engine = TransformersEngine(target, kind="assisted", draft=draft, k=4, sampling=SamplingConfig(temperature=0.0))
    free = engine.generate([1, 2, 3], 30).new_tokens
    for model in (target, draft):
        model.generation_config.eos_token_id = free[5]
        model.generation_config.repetition_penalty = 1.5
    result = engine.generate([1, 2, 3], 30)
    assert result.new_tokens == free and result.stop_reason == "budget"
    assert check_report(result.config, result.rounds).findings == []


def test_bundled_pair_greedy_equals_specscope_and_plain_greedy():
    from specscope.core.loading import models as loading

    if not loading.bundled_available():
        pytest.skip("the bundled models are not installed")
    pair = loading.load_bundled("small", device="cpu")
    prompt = list(pair.tokenizer(loading.example_prompts()[0].text, add_special_tokens=False)["input_ids"])
    greedy = SamplingConfig(temperature=0.0)
    eos = pair.tokenizer.eos_token_id
    engine = TransformersEngine(pair.target, kind="assisted", draft=pair.draft, k=4, sampling=greedy, eos_token_id=eos)
    result = engine.generate(prompt, 16)
    ours = (
        SpeculativeDecoder(pair.target, DraftModelProposer(pair.draft), k=4, sampling=greedy, eos_token_id=eos)
        .generate(prompt, 16)
        .new_tokens
    )
    with torch.inference_mode():
        ids = torch.tensor([prompt])
        plain = pair.target.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=16,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos,
        )
    assert result.new_tokens == ours == plain[0, len(prompt) :].tolist()
    assert [f for f in check_report(result.config, result.rounds).findings if not _expected(f)] == []
