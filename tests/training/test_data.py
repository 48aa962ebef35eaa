"""training/data.py (issue 41): batched generation with a KV cache, left padding and continuous
refill gives each row what unbatched decoding gives; the shards resume; the readers give the
trainers' formats."""

from __future__ import annotations

import pytest
import torch

from tests.tiny_models import tiny_lm
from tests.training.scripts import load_script

data = load_script("data", "specscope_training_data")
STOP = 3


def _reference_greedy(model, prompt: list[int], max_new: int, stop: set[int]) -> list[int]:
    """Unbatched greedy decoding by full recomputation: no padding, no cache."""
    ids, out = list(prompt), []
    with torch.no_grad():
        while len(out) < max_new:
            t = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            out.append(t)
            ids.append(t)
            if t in stop:
                break
    return out


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 12, (n,), generator=g).tolist()
    return [torch.randint(4, 64, (n_i,), generator=g).tolist() for n_i in lengths]


@pytest.mark.parametrize("refill", [True, False])
def test_a_batched_greedy_row_equals_unbatched_greedy_decoding(refill):
    model = tiny_lm("llama", seed=0, init_range=0.3)
    prompts = _prompts(11)
    jobs = [data.Job(f"p{i}", p) for i, p in enumerate(prompts)]
    got = {j.key: j.answer for j in data.generate(model, jobs, max_new=9, stop={STOP}, batch=4, refill=refill)}
    assert len(got) == len(prompts)
    for i, p in enumerate(prompts):
        assert got[f"p{i}"] == _reference_greedy(model, p, 9, {STOP}), i


def test_rows_end_at_a_stop_token_and_leave_the_batch(monkeypatch):
    merges = []
    merge = data._merge
    monkeypatch.setattr(data, "_merge", lambda *a: merges.append(a[1].shape[1]) or merge(*a))
    model = tiny_lm("llama", seed=0, init_range=0.3)
    prompts = _prompts(30, seed=1)
    ref = [_reference_greedy(model, p, 12, {5, 9, 17}) for p in prompts]
    assert any(r[-1] in {5, 9, 17} and len(r) < 12 for r in ref), "the check needs rows that end early"
    jobs = [data.Job(f"p{i}", p) for i, p in enumerate(prompts)]
    got = {j.key: j.answer for j in data.generate(model, jobs, max_new=12, stop={5, 9, 17}, batch=8)}
    assert [got[f"p{i}"] for i in range(len(prompts))] == ref
    assert merges, "new prompts joined a running batch (continuous refill)"


def test_a_sampled_row_does_not_depend_on_its_batch():
    model = tiny_lm("llama", seed=0, init_range=0.3)
    prompts = _prompts(9, seed=2)

    def run(batch: int) -> dict[str, list[int]]:
        jobs = [data.Job(f"p{i}", p, sample=True, seed=100 + i) for i, p in enumerate(prompts)]
        return {j.key: j.answer for j in data.generate(model, jobs, max_new=8, stop={STOP}, batch=batch)}

    one, four = run(1), run(4)
    assert one == four
    assert len({tuple(v) for v in one.values()}) > 1


@pytest.mark.real_model
def test_smollm2_batched_greedy_equals_unbatched():
    from specscope.core.loading import catalog

    if not catalog.fetched_gguf(catalog.lookup("smollm2")).is_file():
        pytest.skip("SmolLM2 is not fetched (`specscope models fetch smollm2`)")
    from specscope.core.loading.chat import chat_prompt_ids

    model, tok, stop = data.load_target("smollm2", 1)
    users = ["Why is the sky blue?", "Write a Python function that reverses a string.", "What is DNA?"]
    prompts = [chat_prompt_ids(tok, u) for u in users]
    jobs = [data.Job(str(i), p) for i, p in enumerate(prompts)]
    got = {j.key: j.answer for j in data.generate(model, jobs, max_new=24, stop=stop, batch=3)}
    for i, p in enumerate(prompts):
        assert got[str(i)] == _reference_greedy(model, p, 24, stop), users[i]
