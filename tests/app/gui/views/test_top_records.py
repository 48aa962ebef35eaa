"""Live rounds of a model above 4,096 tokens carry top-N records (core.sampling.dists.TopDistribution),
not full vectors: the run model, the round inspector, the draft tree and the KV view show
them as they show a top-N trace."""

from __future__ import annotations

import numpy as np
import pytest

from specscope.app.gui.model.runmodel import RunModel
from specscope.app.gui.views.inspector import RoundInspectorWidget
from specscope.app.gui.views.tree import DraftTreeView
from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.sampling.dists import TopDistribution
from tests.tiny_models import noisy_copy, tiny_lm


@pytest.fixture(scope="module")
def top_run():
    target = tiny_lm("llama", vocab=6000, seed=0, init_range=0.3)
    dec = SpeculativeDecoder(
        target,
        DraftModelProposer(noisy_copy(target, 0.3)),
        k=3,
        sampling=SamplingConfig(temperature=1.0, top_k=40),
        seed=1,
    )
    result = dec.generate([5, 6, 7, 8], 30)
    assert isinstance(result.rounds[0].nodes[0].p, TopDistribution)
    return result


def test_views_show_top_records_of_a_live_run(qtbot, top_run):
    model = RunModel()
    model.begin(top_run.config)
    for r in top_run.rounds:
        model.append(r)
    inspector, tree = RoundInspectorWidget(model), DraftTreeView(model)
    for w in (inspector, tree):
        qtbot.addWidget(w)
        w.resize(900, 600)
        w.show()
    for r in top_run.rounds:
        for pos in range(len(r.nodes) + 1):
            model.select(r.index, pos)
            assert inspector.shown == (r.index, pos)
    rejected = next(r for r in top_run.rounds if r.rejected_node is not None)
    model.select(rejected.index, rejected.rejected_node)
    node = rejected.nodes[rejected.rejected_node]
    shown = inspector.values
    assert shown, "the inspector recorded nothing it displayed"
    assert np.isclose(float(node.p[node.token]), node.p_token)
