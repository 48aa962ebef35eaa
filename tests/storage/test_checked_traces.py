"""The checker on traces that went through the store: saved with full vectors or top-N
only, a clean run has no finding and a fired fault is flagged."""

import pytest

from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.check.checker import check_run, first_bad_round
from specscope.core.faults.zoo import FAULTS, faulty_decoder
from specscope.storage import TraceStore, TraceWriter
from tests.tiny_models import noisy_copy, tiny_lm

SETTINGS = [
    SamplingConfig(temperature=0),
    SamplingConfig(temperature=1.0, top_k=8),
    SamplingConfig(temperature=1.0, top_p=0.9),
]


@pytest.fixture(scope="module")
def models():
    target = tiny_lm("llama", vocab=64, seed=0, init_range=0.3)
    return target, noisy_copy(target, 0.08)


def stored(store, decoder, prompt, max_new, seed, full):
    config = decoder.run_config(prompt, max_new, seed=seed)
    with TraceWriter(store, config, full_vectors=full, top_n=8) as writer:
        result = writer.record(decoder.rounds(prompt, max_new, config=config))
    return result, store.run_config(config.run_id), store.load_rounds(config.run_id, full=True)


@pytest.mark.parametrize("full", [True, False], ids=["full-vectors", "top-n"])
def test_saved_clean_runs_have_no_findings(tmp_path, models, full):
    target, draft = models
    with TraceStore(tmp_path / "t.sqlite") as store:
        for cfg in SETTINGS:
            dec = SpeculativeDecoder(target, DraftModelProposer(draft), k=4, sampling=cfg, eos_token_id=7)
            for seed in range(4):
                _, config, rounds = stored(store, dec, [1, 2, 3, 4], 30, seed, full)
                assert check_run(config, rounds) == []


# Every fault, saved with full vectors or top-N only (the writer keeps top-k + 1 entries
# under a top-k filter, and every top-N save keeps the whole vector's support, smallest
# entry and sum, so raw-q shows there too, under top-k and under top-p).
CASES = [(fault, full) for full in (True, False) for fault, f in FAULTS.items() if not f.needs]


@pytest.mark.parametrize("fault,full", CASES, ids=[f"{f}-{'full-vectors' if full else 'top-n'}" for f, full in CASES])
def test_saved_faulty_runs_are_flagged(tmp_path, models, fault, full):
    target, draft = models
    fired = 0
    with TraceStore(tmp_path / "t.sqlite") as store:
        for cfg in SETTINGS + [SamplingConfig(temperature=1.0)]:
            dec = faulty_decoder(fault, target, DraftModelProposer(draft), k=4, sampling=cfg, eos_token_id=None)
            for seed in range(3):
                for max_new in (13, 30):
                    _, config, rounds = stored(store, dec, [1, 2, 3, 4], max_new, seed, full=full)
                    findings = check_run(config, rounds)
                    assert config.fault == fault
                    if dec.fault_rounds:
                        fired += 1
                        assert first_bad_round(findings) == dec.fault_rounds[0], [str(f) for f in findings[:2]]
                    else:
                        assert findings == []
    if fault != "eos-leak":  # needs an EOS id; covered by the core tests
        assert fired > 0


def test_top_n_residual_is_checked_where_p_q_and_it_are_known(tmp_path, models):
    """A top-N trace whose residual was tampered with at one known entry (its mass left
    right): flagged from the stored entries alone."""
    import dataclasses

    import numpy as np

    target, draft = models
    dec = SpeculativeDecoder(target, DraftModelProposer(draft), k=4, sampling=SamplingConfig(temperature=1.0))
    with TraceStore(tmp_path / "t.sqlite") as store:
        _, config, rounds = stored(store, dec, [1, 2, 3, 4], 30, 3, full=False)
    assert check_run(config, rounds) == []
    victim = next(i for i, r in enumerate(rounds) if r.rejected_node is not None and r.residual is not None)
    rnd = rounds[victim]
    node = rnd.nodes[rnd.rejected_node]
    shared = np.intersect1d(np.intersect1d(rnd.residual.known_ids, node.p.known_ids), node.q.known_ids)
    assert shared.size, "the tiny models' top-8 residual, p and q share no token"
    residual = rnd.residual.copy()  # a PartialDistribution with the same known ids
    residual[shared[0]] += 0.05
    bad = rounds[:victim] + [dataclasses.replace(rnd, residual=residual)] + rounds[victim + 1 :]
    assert any(f.rule == "residual" and f.round == victim for f in check_run(config, bad))
    wrong_mass = dataclasses.replace(rnd, residual_mass=rnd.residual_mass * 0.9)
    bad = rounds[:victim] + [wrong_mass] + rounds[victim + 1 :]
    assert any(
        f.rule == "residual" and f.round == victim and "1 - sum min" in f.message for f in check_run(config, bad)
    )


def test_raw_q_is_flagged_when_float32_full_vectors_lose_its_tail(tmp_path, models):
    """At a low temperature an unfiltered q has entries below float32's smallest value
    (1.4e-45): its stored float32 full vector has zeros there, so the whole vector's support
    must come from the exact facts the top-N blob keeps, as it does for a top-N save."""
    import numpy as np

    target, draft = models
    cfg = SamplingConfig(temperature=0.01, top_p=0.9)
    fired = 0
    with TraceStore(tmp_path / "t.sqlite") as store:
        for seed in range(4):
            dec = faulty_decoder("raw-q", target, DraftModelProposer(draft), k=4, sampling=cfg, eos_token_id=None)
            _, config, rounds = stored(store, dec, [1, 2, 3, 4], 20, seed, full=True)
            if not dec.fault_rounds:
                continue
            fired += 1
            q = rounds[dec.fault_rounds[0]].nodes[0].q
            assert np.count_nonzero(np.asarray(q)) < q.shape[-1]  # the float32 vector did lose the tail
            assert first_bad_round(check_run(config, rounds)) == dec.fault_rounds[0]
    assert fired > 0
