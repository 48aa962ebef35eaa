"""Tree runs through the trace store: nodes keep their parents and depths, a clean tree run
checks clean (the walk replayed from full vectors; noted as not checked from top-N only),
the deep replay recomputes each visited node's p over its own path, and a stored run with a
tree fault is flagged."""

import pytest

from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.checker import check_report, first_bad_round, recompute_findings
from specscope.core.faults import faulty_decoder
from specscope.storage import TraceStore, TraceWriter

from ..tiny_models import noisy_copy, tiny_lm

CASES = [("3,2,1", "topk", SamplingConfig(temperature=0)), ("3,2,1", "sampled", SamplingConfig(temperature=1.0)),
         ("2,2", "distinct", SamplingConfig(temperature=1.0, top_k=8)),
         ("dynamic:nodes=8,depth=3,topk=2", "topk", SamplingConfig(temperature=1.0, top_p=0.9))]


@pytest.fixture(scope="module")
def models():
    target = tiny_lm("llama", vocab=64, seed=0, init_range=0.3)
    return target, noisy_copy(target, 0.3)


def stored(store, dec, full, prompt=(1, 2, 3, 4), max_new=30, seed=1):
    config = dec.run_config(list(prompt), max_new, seed=seed)
    with TraceWriter(store, config, full_vectors=full, top_n=8) as writer:
        writer.record(dec.rounds(list(prompt), max_new, config=config))
    return store.run_config(config.run_id), store.load_rounds(config.run_id, full=True)


@pytest.mark.parametrize("full", [True, False], ids=["full-vectors", "top-n"])
def test_saved_clean_tree_runs_check_clean(tmp_path, models, full):
    target, draft = models
    with TraceStore(tmp_path / "t.sqlite") as store:
        for tree, children, cfg in CASES:
            dec = SpeculativeDecoder(target, DraftModelProposer(draft, tree=tree, children=children), sampling=cfg,
                                     eos_token_id=7)
            config, rounds = stored(store, dec, full)
            assert any(n.parent != n.index - 1 for r in rounds for n in r.nodes)  # real trees were stored
            report = check_report(config, rounds)
            assert report.findings == [], [str(f) for f in report.findings[:2]]
            if full:
                assert not report.not_checked and recompute_findings(config, rounds, target) == []
            elif not cfg.greedy:
                assert "tree-walk" in report.not_checked


def test_saved_tree_faults_are_flagged(tmp_path, models):
    target, draft = models
    with TraceStore(tmp_path / "t.sqlite") as store:
        # a stale residual shows in the replayed walk
        dec = faulty_decoder("tree-stale-residual", target, DraftModelProposer(draft, tree="3,2,1", children="sampled"),
                             sampling=SamplingConfig(temperature=1.0))
        config, rounds = stored(store, dec, True)
        assert dec.fault_rounds and first_bad_round(check_report(config, rounds).findings) == dec.fault_rounds[0]
        # positions by node index: the deep replay over each node's own path disagrees
        dec = faulty_decoder("tree-positions-by-index", target, DraftModelProposer(draft, tree="3,2,1"),
                             sampling=SamplingConfig(temperature=0))
        config, rounds = stored(store, dec, True)
        found = recompute_findings(config, rounds, target)
        assert dec.fault_rounds and found and first_bad_round(found) >= dec.fault_rounds[0]


def test_tree_runs_survive_jsonl_and_check_clean(tmp_path, models):
    """The JSONL format carries a tree as it is: each node's parent and depth, and the
    proposer params naming the tree and the children mode, which the checker's replay reads."""
    from specscope.storage.jsonl import export_run, import_run

    target, draft = models
    with TraceStore(tmp_path / "a.sqlite") as store:
        dec = SpeculativeDecoder(target, DraftModelProposer(draft, tree="3,2,1", children="sampled"),
                                 sampling=SamplingConfig(temperature=1.0))
        config, rounds = stored(store, dec, True)
        export_run(store, config.run_id, tmp_path / "run.jsonl")
    with TraceStore(tmp_path / "b.sqlite") as other:
        run_id = import_run(other, tmp_path / "run.jsonl")
        config2, rounds2 = other.run_config(run_id), other.load_rounds(run_id, full=True)
    assert config2.proposer_params["tree"] == "3,2,1" and config2.proposer_params["children"] == "sampled"
    assert [[(n.parent, n.depth, n.status) for n in r.nodes] for r in rounds2] == \
        [[(n.parent, n.depth, n.status) for n in r.nodes] for r in rounds]
    report = check_report(config2, rounds2)
    assert report.findings == [] and not report.not_checked
