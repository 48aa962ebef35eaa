"""The views' model on real rounds from the tiny models: cells, metrics, slimming."""

from __future__ import annotations

import numpy as np
import pytest

from specscope.app.gui import theme
from specscope.app.gui.model.runmodel import RunModel, first_divergence, has_distributions, slim, top_tokens
from specscope.app.gui.model.settings import PanelSettings
from specscope.core.records import RunSummary


@pytest.fixture(scope="module")
def sampled_run(hub):
    prep = hub.build(
        PanelSettings(
            prompt="1 2 3 4 5 6 7 8 1 2 3 4", proposer="draft-tiny", temperature=1.0, max_new_tokens=60, seed=3
        )
    )
    result = prep.decoder.generate(prep.prompt_ids, 60)
    assert any(r.rejected_node is not None for r in result.rounds), "the fixture needs rejections"
    assert any(r.bonus is not None for r in result.rounds), "the fixture needs bonus tokens"
    return prep, result


def test_cells_follow_the_rounds(qapp, sampled_run):
    prep, result = sampled_run
    model = RunModel()
    model.begin(prep.config, prep.token_text)
    model.extend(result.rounds)
    cells = model.cells
    n_prompt = len(prep.prompt_ids)
    discarded = sum(1 for r in result.rounds for n in r.nodes if n.status != "accepted")
    assert len(cells) == n_prompt + len(result.new_tokens) + discarded
    # Output cells, in order, are exactly the generated tokens with their kinds.
    out = [cells.cell(i) for i in cells.out_cell]
    assert [c.token for c in out] == result.new_tokens
    assert [c.out_pos for c in out] == list(range(len(result.new_tokens)))
    kinds = [theme.KIND_NAMES[c.kind] for c in out]
    assert kinds == [e.kind for r in result.rounds for e in r.emitted]
    # Every rejected draft appears struck through in its own round.
    for r in result.rounds:
        if r.rejected_node is not None:
            rej = [
                cells.cell(i)
                for i in range(len(cells))
                if cells.round[i] == r.index and cells.kind[i] == theme.REJECTED
            ]
            assert [c.token for c in rej] == [r.nodes[r.rejected_node].token]
    assert len(cells.round_first) == len(result.rounds)


def test_metrics_match_the_core_summary(qapp, sampled_run):
    prep, result = sampled_run
    model = RunModel()
    model.begin(prep.config, prep.token_text)
    for r in result.rounds:
        model.append(r)
    m = model.metrics
    s = RunSummary.of(result.rounds)
    assert len(m) == s.rounds
    assert m.acceptance_rate == pytest.approx(s.acceptance_rate)
    assert m.mean_accepted_length == pytest.approx(s.mean_accepted_length)
    assert int(m.length_hist.sum()) == s.rounds
    assert m.emitted_total == s.new_tokens
    est = m.cost_estimate()
    assert est is not None and 0 <= est.alpha <= 1 and est.expected_alpha >= 1
    rates = m.per_position()
    assert np.all((rates[~np.isnan(rates)] >= 0) & (rates[~np.isnan(rates)] <= 1))


def test_selection_defaults_to_the_interesting_position(qapp, sampled_run):
    prep, result = sampled_run
    model = RunModel()
    model.begin(prep.config, prep.token_text)
    model.extend(result.rounds)
    seen = []
    model.selectionChanged.connect(lambda r, p: seen.append((r, p)))
    rej = next(r for r in result.rounds if r.rejected_node is not None)
    model.select(rej.index)
    assert seen[-1] == (rej.index, rej.rejected_node)
    model.select(10_000)  # clamped
    assert model.selected[0] == len(result.rounds) - 1


def test_slim_rounds_come_back_full(qapp, sampled_run, monkeypatch):
    prep, result = sampled_run
    import specscope.app.gui.model.runmodel as rm

    monkeypatch.setattr(rm, "FULL_BYTES", 0)  # force slimming at vocab 64
    monkeypatch.setattr(rm, "RECENT_FULL", 4)
    model = RunModel()
    model.begin(prep.config, prep.token_text)
    model.extend(result.rounds)
    assert not any(has_distributions(r) for r in model.rounds)
    assert len(model._full) == 4  # only the most recent rounds keep their distributions
    assert has_distributions(model.full_round(len(result.rounds) - 1))  # recent: cached
    assert not has_distributions(model.full_round(0))  # old and no loader
    model.loader = lambda i: result.rounds[i]
    assert model.full_round(0) is result.rounds[0]
    s = slim(result.rounds[0])
    assert s.nodes[0].p is None and s.nodes[0].ratio == result.rounds[0].nodes[0].ratio


def test_helpers():
    assert first_divergence([1, 2, 3], [1, 2, 4]) == 2
    assert first_divergence([1, 2], [1, 2, 3]) is None
    p = np.array([0.1, 0.6, 0.3, 0.0])
    q = np.array([0.5, 0.1, 0.1, 0.3])
    ids = top_tokens([p, q], 2, must=[2])
    assert list(ids[:2]) == [1, 2] and set(ids) == {0, 1, 2, 3}
