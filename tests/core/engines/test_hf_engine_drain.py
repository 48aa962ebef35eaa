"""The transformers engine's two ways of running: drained in the caller's thread (CLI, trace
writer, bench) and stepped through a worker thread (GUI). Both must record the same rounds
as the same generate() call makes, and leave nothing attached however they end."""

from __future__ import annotations

import threading

import pytest

from specscope.core import SamplingConfig
from specscope.core.check.checker import check_report
from specscope.core.engines import TransformersEngine
from specscope.core.engines.hf_handover import COMPUTE
from specscope.core.sampling.dists import TopDistribution

SAMPLERS = (SamplingConfig(temperature=0.0), SamplingConfig(temperature=1.0))


def _facts(rnd):
    """What two recordings of one round must agree on."""
    return (
        rnd.tokens,
        [n.status for n in rnd.nodes],
        [round(n.p_token, 12) for n in rnd.nodes],
        [None if n.q_token is None else round(n.q_token, 12) for n in rnd.nodes],
        rnd.target_cache,
        rnd.draft_cache,
        rnd.rejected_node,
    )


def _nothing_attached(target, draft) -> bool:
    return (
        "_get_candidate_generator" not in target.__dict__
        and not target._forward_hooks
        and not draft._forward_hooks
        and not draft._forward_pre_hooks
        and not COMPUTE.locked()
    )


@pytest.mark.parametrize("kind", ["assisted", "lookup"])
@pytest.mark.parametrize("sampling", SAMPLERS, ids=lambda s: s.describe())
def test_drain_runs_in_the_callers_thread_and_records_what_stepping_records(llama_pair, kind, sampling):
    target, draft = llama_pair
    engine = TransformersEngine(target, kind=kind, draft=draft, k=3, sampling=sampling, eos_token_id=7)
    for seed, prompt in enumerate(([1, 2, 3, 1, 2, 3, 1], [9, 4, 4, 9, 4, 4], [5])):
        caller, threads_seen, drained = threading.get_ident(), set(), []

        def each(rnd):  # called while this prompt's run drains, so its sets are the right ones
            threads_seen.add(threading.get_ident())  # noqa: B023
            assert not any(t.name == "specscope-transformers" for t in threading.enumerate())
            drained.append(rnd)  # noqa: B023

        result = engine.start(prompt, 20, seed=seed).drain(each)
        stepped = engine.start(prompt, 20, seed=seed)
        stepped_rounds = list(stepped)
        assert threads_seen == {caller}
        assert result.new_tokens == stepped.result.new_tokens == engine.plain_generate(prompt, 20, seed=seed)
        assert [_facts(r) for r in drained] == [_facts(r) for r in stepped_rounds]
        assert result.summary.rounds == len(drained) and result.rounds == []  # start() keeps none by default
        assert _nothing_attached(target, draft)


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_an_exception_in_each_ends_the_run_there_and_detaches_everything(llama_pair, error):
    target, draft = llama_pair
    engine = TransformersEngine(target, kind="assisted", draft=draft, k=2, sampling=SamplingConfig(temperature=1.0))
    assistant_k = draft.generation_config.num_assistant_tokens
    seen = []

    def each(rnd):
        seen.append(rnd)
        if len(seen) == 2:
            raise error("stop")

    run = engine.start([1, 2, 3], 200)
    with pytest.raises(error, match="stop"):
        run.drain(each)
    assert len(seen) == 2 and run.rounds_seen == 2
    assert _nothing_attached(target, draft)
    assert draft.generation_config.num_assistant_tokens == assistant_k
    assert engine.generate([1, 2, 3], 8, seed=4).new_tokens == engine.plain_generate([1, 2, 3], 8, seed=4)


def test_close_from_each_ends_a_drained_run_after_the_round_in_progress(llama_pair):
    target, draft = llama_pair
    engine = TransformersEngine(target, kind="lookup", k=2, sampling=SamplingConfig(temperature=0.0))
    full = engine.plain_generate([1, 2, 3], 60)
    run = engine.start([1, 2, 3], 60)
    result = run.drain(lambda rnd: run.close())
    assert 1 <= result.summary.rounds <= 2
    assert result.new_tokens == full[: len(result.new_tokens)] and len(result.new_tokens) < 60
    assert _nothing_attached(target, draft)


def test_drain_after_steps_goes_on_stepping(llama_pair):
    target, draft = llama_pair
    engine = TransformersEngine(target, kind="assisted", draft=draft, k=3, sampling=SamplingConfig(temperature=1.0))
    run = engine.start([4, 5, 6], 24, seed=3, keep_rounds=True)
    first = run.step()
    result = run.drain()
    assert result.rounds[0] is first and run.rounds_seen == len(result.rounds)
    assert result.new_tokens == engine.plain_generate([4, 5, 6], 24, seed=3)


def test_a_drained_run_whose_each_steps_another_run_draws_as_each_alone(llama_pair):
    """Two lanes in one thread: one drained, its `each` stepping the other. The drained run
    gives up the compute lock and its random state while `each` runs, so neither waits
    for the other forever and each draws what it draws alone."""
    target, draft = llama_pair
    sampling = SamplingConfig(temperature=1.0)
    a = TransformersEngine(target, kind="assisted", draft=draft, k=3, sampling=sampling)
    b = TransformersEngine(target, kind="lookup", k=3, sampling=sampling)
    run_b = b.start([4, 5, 4, 5], 16, seed=6)
    result_a = a.start([1, 2, 3], 16, seed=5).drain(lambda rnd: run_b.step())
    while not run_b.done:
        run_b.step()
    assert result_a.new_tokens == a.plain_generate([1, 2, 3], 16, seed=5)
    assert run_b.result.new_tokens == b.plain_generate([4, 5, 4, 5], 16, seed=6)


@pytest.mark.parametrize("kind", ["assisted", "lookup"])
@pytest.mark.parametrize(
    "sampling",
    [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.8, top_k=8, top_p=0.9)],
    ids=lambda s: s.describe(),
)
def test_top_n_records_agree_with_full_vectors(llama_pair, kind, sampling):
    target, draft = llama_pair
    full = TransformersEngine(target, kind=kind, draft=draft, k=3, sampling=sampling, vectors="full")
    top = TransformersEngine(target, kind=kind, draft=draft, k=3, sampling=sampling, vectors="top", top_n=5)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    a, b = full.generate(prompt, 24, seed=1), top.generate(prompt, 24, seed=1)
    assert a.new_tokens == b.new_tokens
    assert [_facts(r) for r in a.rounds] == [_facts(r) for r in b.rounds]
    nodes = [(x, y) for ra, rb in zip(a.rounds, b.rounds) for x, y in zip(ra.nodes, rb.nodes)]
    assert nodes and all(isinstance(y.p, TopDistribution) and isinstance(y.q, TopDistribution) for _, y in nodes)
    assert all(
        x.overlap == pytest.approx(y.overlap, abs=1e-12) and x.target_argmax == y.target_argmax for x, y in nodes
    )
    for ra, rb in zip(a.rounds, b.rounds):
        assert (ra.residual is None) == (rb.residual is None)
        if rb.residual is not None:
            assert rb.residual_mass == pytest.approx(ra.residual_mass, abs=1e-12)
            repair = rb.emitted[-1].token
            assert rb.residual[repair] == pytest.approx(ra.residual[repair], abs=1e-12)
    assert check_report(b.config, b.rounds).findings == check_report(a.config, a.rounds).findings
