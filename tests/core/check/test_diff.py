import torch

from specscope.core import DraftModelProposer, PromptLookupProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.check.diff import diff_runs
from specscope.core.faults.zoo import faulty_decoder
from tests.tiny_models import noisy_copy, tiny_lm

GREEDY = SamplingConfig(temperature=0)


def test_cached_run_against_full_recompute_reference_shows_no_divergence():
    target = tiny_lm("qwen2", seed=2, init_range=0.3)
    draft = noisy_copy(target, 0.05)
    prompt = [4, 8, 15, 16, 23, 42]
    a = SpeculativeDecoder(target, DraftModelProposer(draft), k=4, sampling=GREEDY).generate(prompt, 40)
    b = SpeculativeDecoder(target, DraftModelProposer(draft), k=4, sampling=GREEDY, use_cache=False).generate(
        prompt, 40
    )
    result = diff_runs(a.config, a.rounds, b.config, b.rounds)
    assert result.identical, [str(d) for d in result.divergences]
    assert result.compared_tokens == 40


def test_different_proposers_agree_in_greedy_mode():
    target = tiny_lm("llama", seed=2, init_range=0.3)
    prompt = [4, 8, 15, 4, 8, 15, 4]
    a = SpeculativeDecoder(target, DraftModelProposer(noisy_copy(target, 0.05)), k=4, sampling=GREEDY).generate(
        prompt, 30
    )
    b = SpeculativeDecoder(target, PromptLookupProposer(), k=2, sampling=GREEDY).generate(prompt, 30)
    assert diff_runs(a.config, a.rounds, b.config, b.rounds).identical


def test_stale_target_cache_shows_up_as_divergence():
    target = tiny_lm("llama", seed=2, init_range=0.3, dtype=torch.float64)
    draft = noisy_copy(target, 0.05)
    prompt = [4, 8, 15, 16, 23, 42]
    good = SpeculativeDecoder(target, DraftModelProposer(draft), k=4, sampling=GREEDY).generate(prompt, 40)
    dec = faulty_decoder("target-crop-off-by-one", target, DraftModelProposer(draft), k=4, sampling=GREEDY)
    bad = dec.generate(prompt, 40)
    result = diff_runs(good.config, good.rounds, bad.config, bad.rounds)
    assert not result.identical
    cache = result.first("cache")
    assert cache is not None and cache.round_a == dec.fault_rounds[0]
    p = result.first("p")
    assert p is not None and p.round_b == dec.fault_rounds[0] + 1
