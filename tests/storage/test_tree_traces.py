"""Tree runs through the trace store and JSONL: nodes keep their parents and depths and a
tree round keeps its tree facts (tried order, every p' update, path, positions, mask rows,
kept rows); a clean tree run checks clean (proved from full vectors, or from top-N records
with what stays unproved named), the deep replay recomputes each visited node's p over its
own path, each tree fault is flagged at its first round from a stored trace, export/import
round-trip tree traces losslessly, and version-1 files still import."""

import pytest

from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.check.checker import check_report, first_bad_round, recompute_findings
from specscope.core.faults.zoo import faulty_decoder
from specscope.storage import TraceStore, TraceWriter
from tests.tiny_models import noisy_copy, tiny_lm

CASES = [
    ("3,2,1", "topk", SamplingConfig(temperature=0)),
    ("3,2,1", "sampled", SamplingConfig(temperature=1.0)),
    ("2,2", "distinct", SamplingConfig(temperature=1.0, top_k=8)),
    ("dynamic:nodes=8,depth=3,topk=2", "topk", SamplingConfig(temperature=1.0, top_p=0.9)),
]


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
            dec = SpeculativeDecoder(
                target, DraftModelProposer(draft, tree=tree, children=children), sampling=cfg, eos_token_id=7
            )
            config, rounds = stored(store, dec, full)
            assert any(n.parent != n.index - 1 for r in rounds for n in r.nodes)  # real trees were stored
            report = check_report(config, rounds)
            assert report.findings == [], [str(f) for f in report.findings[:2]]
            if full:
                assert not report.not_checked and recompute_findings(config, rounds, target) == []
            else:
                assert "tree-walk" not in report.not_checked and set(report.not_checked) <= {"residual"}


def test_saved_tree_faults_are_flagged(tmp_path, models):
    target, draft = models
    with TraceStore(tmp_path / "t.sqlite") as store:
        # a stale residual shows in the replayed walk
        dec = faulty_decoder(
            "tree-stale-residual",
            target,
            DraftModelProposer(draft, tree="3,2,1", children="sampled"),
            sampling=SamplingConfig(temperature=1.0),
        )
        config, rounds = stored(store, dec, True)
        assert dec.fault_rounds and first_bad_round(check_report(config, rounds).findings) == dec.fault_rounds[0]
        # positions by node index: the deep replay over each node's own path disagrees
        dec = faulty_decoder(
            "tree-positions-by-index",
            target,
            DraftModelProposer(draft, tree="3,2,1"),
            sampling=SamplingConfig(temperature=0),
        )
        config, rounds = stored(store, dec, True)
        found = recompute_findings(config, rounds, target)
        assert dec.fault_rounds and found and first_bad_round(found) >= dec.fault_rounds[0]


def test_tree_runs_survive_jsonl_and_check_clean(tmp_path, models):
    """The JSONL format carries a tree as it is: each node's parent and depth, and the
    proposer params naming the tree and the children mode, which the checker's replay reads."""
    from specscope.storage.jsonl.transfer import export_run, import_run

    target, draft = models
    with TraceStore(tmp_path / "a.sqlite") as store:
        dec = SpeculativeDecoder(
            target,
            DraftModelProposer(draft, tree="3,2,1", children="sampled"),
            sampling=SamplingConfig(temperature=1.0),
        )
        config, rounds = stored(store, dec, True)
        export_run(store, config.run_id, tmp_path / "run.jsonl")
    with TraceStore(tmp_path / "b.sqlite") as other:
        run_id = import_run(other, tmp_path / "run.jsonl")
        config2, rounds2 = other.run_config(run_id), other.load_rounds(run_id, full=True)
    assert config2.proposer_params["tree"] == "3,2,1" and config2.proposer_params["children"] == "sampled"
    assert [[(n.parent, n.depth, n.status) for n in r.nodes] for r in rounds2] == [
        [(n.parent, n.depth, n.status) for n in r.nodes] for r in rounds
    ]
    report = check_report(config2, rounds2)
    assert report.findings == [] and not report.not_checked


# --------------------------------------------------------------------------- tree facts in the store


def same_tree(a, b, exact: bool) -> None:
    """The tree facts of two rounds agree: every field, each p' to float32 storage (exact
    where the record keeps entries exactly)."""
    import numpy as np

    from specscope.core.sampling.partial import known_ids

    assert type(b).__name__ == "TreeRound" and b.tree is not None
    for name in ("spec", "children", "path", "tried", "positions", "visible", "kept_rows"):
        assert getattr(a.tree, name) == getattr(b.tree, name), name
    assert len(a.tree.updates) == len(b.tree.updates)
    for u, v in zip(a.tree.updates, b.tree.updates):
        assert (u.parent, u.child, float(u.mass)) == (v.parent, v.child, float(v.mass))
        ids = known_ids(u.p_after)
        ids = np.arange(len(u.p_after)) if ids is None else ids
        got, want = np.asarray(v.p_after)[ids], np.asarray(u.p_after)[ids]
        assert np.allclose(got, want, rtol=0, atol=0 if exact else 1e-7)
        siblings = [n.token for n in a.nodes if n.parent == u.parent]
        assert all(float(v.p_after[t]) == float(u.p_after[t]) for t in siblings)  # the entries decisions read


@pytest.mark.parametrize("full", [True, False], ids=["full-vectors", "top-n"])
def test_tree_facts_survive_the_store(tmp_path, models, full):
    target, draft = models
    with TraceStore(tmp_path / "t.sqlite") as store:
        for tree, children, cfg in CASES:
            dec = SpeculativeDecoder(
                target,
                DraftModelProposer(draft, tree=tree, children=children),
                sampling=cfg,
                vectors="full" if full else "top",
            )
            out = dec.generate([1, 2, 3, 4], 30, seed=1)
            with TraceWriter(store, out.config, full_vectors=full) as writer:
                for rnd in out.rounds:
                    writer.write(rnd)
            back = store.load_rounds(out.config.run_id, full=True)
            assert len(back) == len(out.rounds)
            for a, b in zip(out.rounds, back):
                same_tree(a, b, exact=not full)
            if not cfg.greedy:
                assert any(r.tree.updates for r in back)


# --------------------------------------------------------------------------- faults from stored traces

FAULT_CASES = {
    "tree-stale-residual": ("3,2,1", "sampled", SamplingConfig(temperature=1.0)),
    "tree-sibling-mask": ("3,2,1", "topk", SamplingConfig(temperature=0)),
    "tree-wrong-branch-kv": ("3,2,1", "distinct", SamplingConfig(temperature=1.0)),
    "tree-positions-by-index": ("2,2", "topk", SamplingConfig(temperature=0.8, top_k=8)),
}


def cli_check(capsys, db, run_id):
    import json

    from specscope.app.cli import main

    code = main(["check", str(db), "--run", run_id, "--json"])
    out = capsys.readouterr()
    assert code in (0, 1), out.err
    return json.loads(out.out)["runs"][0]


@pytest.mark.parametrize("fault", sorted(FAULT_CASES))
def test_each_tree_fault_is_flagged_at_its_first_round_by_specscope_check(tmp_path, capsys, models, fault):
    """Recorded to SQLite through the trace writer, then `specscope check` on the file."""
    target, draft = models
    tree, children, cfg = FAULT_CASES[fault]
    db = tmp_path / "t.sqlite"
    fired = 0
    with TraceStore(db) as store:
        for seed, prompt in enumerate([(1, 2, 3, 4), (9, 8, 7), (5, 17, 5, 17, 5)]):
            dec = faulty_decoder(fault, target, DraftModelProposer(draft, tree=tree, children=children), sampling=cfg)
            config = dec.run_config(list(prompt), 24, seed=seed)
            with TraceWriter(store, config) as writer:
                writer.record(dec.rounds(list(prompt), 24, config=config))
            report = cli_check(capsys, db, config.run_id)
            rounds = sorted({f["round"] for f in report["findings"]})
            if not dec.fault_rounds:
                assert rounds == [], report["findings"][:1]
                continue
            fired += 1
            assert rounds and rounds[0] == dec.fault_rounds[0], (dec.fault_rounds, report["findings"][:2])
    assert fired >= 2, f"{fault} fired in {fired} runs"


# --------------------------------------------------------------------------- top-N records (vocabulary > 4096)


@pytest.fixture(scope="module")
def big_models():
    target = tiny_lm("llama", vocab=5000, seed=0, init_range=0.3)
    return target, noisy_copy(target, 0.3)


def test_a_top_n_tree_trace_checks_clean_and_flags_the_stale_residual(tmp_path, capsys, big_models):
    """Above 4096 tokens the decoder keeps top-N records and the store keeps top-N only:
    the walk is proved from them (decisions exactly; each p' update at its stored entries and
    by its mass where exact scalars give it), and the stale residual is caught at its first
    round."""
    target, draft = big_models
    db = tmp_path / "big.sqlite"
    with TraceStore(db) as store:
        for tree, children in (("3,2", "sampled"), ("2,2", "distinct"), ("3,1", "topk")):
            dec = SpeculativeDecoder(
                target,
                DraftModelProposer(draft, tree=tree, children=children),
                sampling=SamplingConfig(temperature=1.0),
            )
            config, rounds = stored(store, dec, False, max_new=16)
            info = store.get_run(config.run_id)
            assert info.full_vectors is False
            nodes = -(-info.drafted // info.n_rounds)  # a batch holds about 3 vectors per node (p, q, p')
            assert nodes > config.k and store.batch_size(config.run_id) == (64 << 20) // (5000 * 8 * (3 * nodes + 2))
            assert all(getattr(n.p, "partial", False) for r in rounds for n in r.nodes)
            assert any(r.tree.updates for r in rounds)
            report = cli_check(capsys, db, config.run_id)
            assert report["findings"] == [], report["findings"][:2]
            assert set(report["not_checked"]) == {"residual"} and "partly" in report["not_checked"]["residual"]
        for seed in range(4):
            dec = faulty_decoder(
                "tree-stale-residual",
                target,
                DraftModelProposer(draft, tree="3,2", children="sampled"),
                sampling=SamplingConfig(temperature=1.0),
            )
            config, rounds = stored(store, dec, False, max_new=16, seed=seed)
            if dec.fault_rounds:
                break
        assert dec.fault_rounds
        report = cli_check(capsys, db, config.run_id)
        first = min(f["round"] for f in report["findings"])
        assert first == dec.fault_rounds[0] and report["findings"][0]["rule"] == "residual"


# --------------------------------------------------------------------------- JSONL


def _findings(config, rounds):
    return [(f.round, f.rule, f.message) for f in check_report(config, rounds).findings]


@pytest.mark.parametrize("full", [True, False], ids=["full-vectors", "top-n"])
def test_export_import_round_trips_tree_traces(tmp_path, models, full):
    """export -> import -> export gives the same bytes; the imported rounds carry the same
    tree facts, and check gives the same findings as the original (clean and faulty runs)."""
    from specscope.storage.jsonl.transfer import export_run, import_run

    target, draft = models
    with TraceStore(tmp_path / "a.sqlite") as a, TraceStore(tmp_path / "b.sqlite") as b:
        for name, children, fault in (
            ("clean", "sampled", None),
            ("distinct", "distinct", None),
            ("stale", "sampled", "tree-stale-residual"),
        ):
            proposer = DraftModelProposer(draft, tree="3,2,1", children=children)
            cfg = SamplingConfig(temperature=1.0)
            dec = (
                faulty_decoder(fault, target, proposer, sampling=cfg)
                if fault
                else SpeculativeDecoder(target, proposer, sampling=cfg)
            )
            config, rounds = stored(a, dec, full, seed=2)
            first = tmp_path / f"{name}.jsonl"
            export_run(a, config.run_id, first)
            assert '"version":2' in first.read_text().splitlines()[0] and '"tree":{' in first.read_text()
            run_id = import_run(b, first)
            again = tmp_path / f"{name}-again.jsonl"
            export_run(b, run_id, again)
            assert again.read_bytes() == first.read_bytes()
            back = b.load_rounds(run_id, full=True)
            for x, y in zip(rounds, back):
                same_tree(x, y, exact=True)
            assert _findings(b.run_config(run_id), back) == _findings(config, rounds)
            if fault:
                assert _findings(config, rounds)


def test_a_version_1_tree_trace_still_imports_and_checks(tmp_path):
    """tests/storage/data/tree_v1.jsonl was exported by specscope before format version 2
    (a sampled 2,1 tree, full vectors): it imports, its tree rounds have no tree facts and
    are replayed from full vectors, clean; exported again it is a version-2 file."""
    from pathlib import Path

    from specscope.storage.jsonl.transfer import export_run, import_run

    fixture = Path(__file__).parent / "data" / "tree_v1.jsonl"
    assert '"version":1' in fixture.read_text().splitlines()[0]
    with TraceStore(tmp_path / "t.sqlite") as store:
        run_id = import_run(store, fixture)
        config, rounds = store.run_config(run_id), store.load_rounds(run_id, full=True)
        assert rounds and all(getattr(r, "tree", None) is None for r in rounds)
        assert any(n.parent != n.index - 1 for r in rounds for n in r.nodes)
        report = check_report(config, rounds)
        # version 1 recorded neither its stops, nor the position limit, nor a tree's layout
        assert report.findings == [] and set(report.not_checked) == {
            "stop-leak",
            "stop-flag",
            "stop-budget",
            "position-limit",
            "tree-layout",
            "target-cache",
        }
        export_run(store, run_id, tmp_path / "again.jsonl")
    lines = (tmp_path / "again.jsonl").read_text().splitlines()
    assert '"version":2' in lines[0] and not any('"tree":{"spec"' in line for line in lines)


def test_a_bad_tree_object_is_one_line_with_its_field(tmp_path, models):
    import json

    from specscope.storage import TraceFormatError
    from specscope.storage.jsonl.transfer import export_run, import_run

    target, draft = models
    with TraceStore(tmp_path / "a.sqlite") as a:
        dec = SpeculativeDecoder(
            target,
            DraftModelProposer(draft, tree="3,2,1", children="sampled"),
            sampling=SamplingConfig(temperature=1.0),
        )
        config, _ = stored(a, dec, True, max_new=6)
        export_run(a, config.run_id, tmp_path / "ok.jsonl")
    lines = (tmp_path / "ok.jsonl").read_text().splitlines()
    for change, field, words in (
        (lambda t: t.update(path=[99]), "tree.path[0]", "refers to node 99"),
        (lambda t: t.update(children="greedy"), "tree.children", "expected one of"),
        (
            lambda t: t["updates"].append({"parent": -1, "child": 0, "exact_ids": [1], "exact_probs": []}),
            "tree.updates",
            "exact_probs",
        ),
    ):
        line = json.loads(lines[1])
        change(line["tree"])
        bad = tmp_path / "bad.jsonl"
        bad.write_text("\n".join([lines[0], json.dumps(line)] + lines[2:]) + "\n")
        with TraceStore(tmp_path / "b.sqlite") as b, pytest.raises(TraceFormatError) as err:
            import_run(b, bad)
        assert "line 2" in str(err.value) and field in str(err.value) and words in str(err.value), str(err.value)


@pytest.mark.parametrize("full", [True, False], ids=["full-vectors", "top-n"])
def test_specscope_export_import_and_check_agree_on_tree_traces(tmp_path, capsys, models, full):
    """The CLI: `specscope export`, `specscope import` into another store, `specscope check`
    on both gives the same findings (a faulty run: not none)."""
    from specscope.app.cli import main

    target, draft = models
    db_a, db_b, file = tmp_path / "a.sqlite", tmp_path / "b.sqlite", tmp_path / "run.jsonl"
    with TraceStore(db_a) as a:
        dec = faulty_decoder(
            "tree-stale-residual",
            target,
            DraftModelProposer(draft, tree="3,2,1", children="sampled"),
            sampling=SamplingConfig(temperature=1.0),
        )
        config, _ = stored(a, dec, full, seed=3)
    assert dec.fault_rounds
    assert main(["export", str(db_a), config.run_id, "-o", str(file)]) == 0
    assert main(["import", str(file), "--db", str(db_b)]) == 0
    capsys.readouterr()
    original, imported = cli_check(capsys, db_a, config.run_id), cli_check(capsys, db_b, config.run_id)
    assert original["findings"] and imported["findings"] == original["findings"]
    assert imported["not_checked"] == original["not_checked"]
    assert min(f["round"] for f in original["findings"]) == dec.fault_rounds[0]


def test_a_version_3_store_migrates_and_then_keeps_tree_rounds(tmp_path, models):
    """Schema 4 adds rounds.tree, tree_top, tree_full: a store of version 3 opens, migrates in
    place, its chain runs load as before, and a tree run written afterwards (through the
    writer's child process too) keeps its tree facts."""
    from specscope.storage.migrations import CURRENT_VERSION
    from tests.storage.helpers import downgrade_sqlite_store, synthetic_config, synthetic_rounds

    path = tmp_path / "v3.sqlite"
    old = synthetic_config(run_id="chain-run")
    with TraceStore(path) as s:
        with TraceWriter(s, old) as writer:
            for rnd in synthetic_rounds(old, 4):
                writer.write(rnd)
        before = [r.tokens for r in s.load_rounds("chain-run")]
    assert len(before) == 4
    downgrade_sqlite_store(path, 3)
    target, draft = models
    with TraceStore(path) as s:
        assert s.schema_version == CURRENT_VERSION == 7
        assert [r.tokens for r in s.load_rounds("chain-run")] == before
        assert all(type(r).__name__ == "Round" for r in s.load_rounds("chain-run"))
        dec = SpeculativeDecoder(
            target,
            DraftModelProposer(draft, tree="3,2,1", children="sampled"),
            sampling=SamplingConfig(temperature=1.0),
        )
        out = dec.generate([1, 2, 3, 4], 20, seed=4)
        with TraceWriter(s, out.config, mode="process") as writer:
            for rnd in out.rounds:
                writer.write(rnd)
        back = s.load_rounds(out.config.run_id, full=True)
    for a, b in zip(out.rounds, back):
        same_tree(a, b, exact=False)


def test_tampered_top_n_tree_traces_are_flagged(tmp_path, models):
    """A top-N tree trace edited in its JSONL: a p' update's mass, an exact p' entry, the
    tried order and a tried child's draw are each caught in the round edited."""
    import json

    from specscope.storage.jsonl.transfer import export_run, import_run

    target, draft = models
    with TraceStore(tmp_path / "a.sqlite") as a:
        dec = SpeculativeDecoder(
            target,
            DraftModelProposer(draft, tree="3,2,1", children="sampled"),
            sampling=SamplingConfig(temperature=1.0),
            vectors="top",
        )
        config, rounds = stored(a, dec, False, seed=1)
        assert check_report(config, rounds).findings == []
        export_run(a, config.run_id, tmp_path / "ok.jsonl")
    lines = (tmp_path / "ok.jsonl").read_text().splitlines()
    # a round whose first child of the prefix was rejected and a second one tried
    at = next(
        i
        for i, r in enumerate(rounds)
        if r.tree.updates and r.tree.updates[0].parent == -1 and len(r.tree.tried[0][1]) > 1
    )
    second = rounds[at].tree.tried[0][1][1]
    token = rounds[at].nodes[second].token

    def mass(t, nodes):
        t["updates"][0]["mass"] *= 1.5

    def entry(t, nodes):
        u = t["updates"][0]
        i = u["exact_ids"].index(token)
        u["exact_probs"][i] = u["exact_probs"][i] * 0.5 + 0.01

    def order(t, nodes):
        t["tried"][0][1] = list(reversed(t["tried"][0][1]))

    def draw(t, nodes):
        nodes[t["tried"][0][1][0]]["u"] = 0.0  # the rejected first child now passes its test

    for change, rule in ((mass, "residual"), (entry, "residual"), (order, "tree-walk"), (draw, "acceptance-draw")):
        line = json.loads(lines[1 + at])
        change(line["tree"], line["nodes"])
        bad = tmp_path / f"{change.__name__}.jsonl"
        bad.write_text("\n".join(lines[: 1 + at] + [json.dumps(line)] + lines[2 + at :]) + "\n")
        with TraceStore(tmp_path / f"{change.__name__}.sqlite") as b:
            run_id = import_run(b, bad)
            findings = check_report(b.run_config(run_id), b.load_rounds(run_id, full=True)).findings
        assert findings and findings[0].round == at and findings[0].rule == rule, (
            change.__name__,
            [str(f) for f in findings[:2]],
        )
