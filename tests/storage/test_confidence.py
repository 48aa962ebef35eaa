"""A draft node's confidence (issue 30): the proposer's own probability for its token from its
untransformed softmax. The decoder records it (greedy runs too), the store keeps it (schema
7; an older store migrates with it unknown), JSONL carries it both ways, and unknown stays
unknown (prompt lookup; a trace that leaves it out; an older store)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.draft.proposers import PromptLookupProposer
from specscope.storage import SCHEMA_VERSION, TraceStore, TraceWriter, export_run, import_run
from specscope.storage.errors import TraceFormatError
from tests.storage.helpers import downgrade_sqlite_store
from tests.tiny_models import noisy_copy, tiny_lm

PROMPT = [1, 2, 3, 4, 1, 2, 3]


@pytest.fixture(scope="module")
def pair():
    target = tiny_lm("llama", seed=0, init_range=0.3)
    return target, noisy_copy(target, 0.3)


def _softmax_entry(logits: torch.Tensor, token: int) -> float:
    return float(torch.softmax(logits.double(), dim=-1)[token])


def test_greedy_chain_confidence_is_the_drafts_own_softmax_entry(pair):
    """Greedy: q is a point mass (not recorded) but the confidence is the draft's softmax
    probability of its argmax, recomputed here from the draft model on the same context."""
    target, draft = pair
    out = SpeculativeDecoder(target, DraftModelProposer(draft), k=3, sampling=SamplingConfig(temperature=0)).generate(
        PROMPT, 12
    )
    context = list(PROMPT)
    checked = 0
    for rnd in out.rounds:
        grown = list(context)
        for node in rnd.nodes:
            with torch.no_grad():
                logits = draft(torch.tensor([grown])).logits[0, -1]
            assert node.q_token is None and node.confidence == pytest.approx(
                _softmax_entry(logits, node.token), abs=1e-5
            )
            assert node.confidence < 1.0  # a real softmax entry, not the point mass
            grown.append(node.token)
            checked += 1
        context += rnd.tokens
    assert checked >= 6


@pytest.mark.parametrize("tree", [None, "3,2,1"])
def test_at_temperature_1_without_filters_confidence_equals_q_token(pair, tree):
    target, draft = pair
    out = SpeculativeDecoder(
        target,
        DraftModelProposer(draft, tree=tree, children="sampled" if tree else "topk"),
        k=3,
        sampling=SamplingConfig(temperature=1.0),
    ).generate(PROMPT, 12, seed=3)
    nodes = [n for r in out.rounds for n in r.nodes]
    assert nodes and all(n.confidence == pytest.approx(n.q_token, rel=1e-5, abs=1e-7) for n in nodes)


def test_with_a_filter_confidence_stays_the_untransformed_probability(pair):
    """At T=0.5, top-k 4, q is sharpened and cut; the confidence is still the T=1 softmax
    (the draft's logits on the same context, recomputed here)."""
    target, draft = pair
    out = SpeculativeDecoder(
        target, DraftModelProposer(draft), k=3, sampling=SamplingConfig(temperature=0.5, top_k=4)
    ).generate(PROMPT, 12, seed=2)
    nodes = [n for r in out.rounds for n in r.nodes]
    assert any(abs(n.confidence - n.q_token) > 1e-3 for n in nodes)
    first = out.rounds[1].nodes[0]  # drafted right after round 0's tokens
    with torch.no_grad():
        logits = draft(torch.tensor([PROMPT + out.rounds[0].tokens])).logits[0, -1]
    assert first.confidence == pytest.approx(_softmax_entry(logits, first.token), abs=1e-5)
    assert all(0 < n.confidence < 1 for n in nodes)


def test_prompt_lookup_leaves_confidence_unknown(pair):
    target, _ = pair
    out = SpeculativeDecoder(target, PromptLookupProposer(), k=3, sampling=SamplingConfig(temperature=0)).generate(
        PROMPT, 12
    )
    nodes = [n for r in out.rounds for n in r.nodes]
    assert nodes and all(n.confidence is None for n in nodes)


def _stored(tmp_path, out, name="c.sqlite"):
    path = tmp_path / name
    with TraceStore(path) as store, TraceWriter(store, out.config) as writer:
        for rnd in out.rounds:
            writer.write(rnd)
    return path


def test_the_store_and_jsonl_keep_confidence_and_unknown_stays_unknown(pair, tmp_path):
    target, draft = pair
    out = SpeculativeDecoder(target, DraftModelProposer(draft), k=3, sampling=SamplingConfig(temperature=0)).generate(
        PROMPT, 12
    )
    want = [n.confidence for r in out.rounds for n in r.nodes]
    path = _stored(tmp_path, out)
    with TraceStore(path) as store:
        assert [n.confidence for r in store.load_rounds(out.config.run_id) for n in r.nodes] == want
        buf = io.StringIO()
        export_run(store, out.config.run_id, buf)
    lines = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert [n["confidence"] for line in lines if line.get("record") == "round" for n in line["nodes"]] == want
    # left out of every node: imported as unknown, not as 1 or q_token
    for line in lines:
        for n in line.get("nodes", []):
            n.pop("confidence")
    with TraceStore(tmp_path / "imported.sqlite") as store:
        run = import_run(store, io.StringIO("\n".join(json.dumps(line) for line in lines)), run_id="left-out")
        assert all(n.confidence is None for r in store.load_rounds(run) for n in r.nodes)


def test_a_confidence_outside_0_1_is_refused_in_one_line(pair, tmp_path):
    target, draft = pair
    out = SpeculativeDecoder(target, DraftModelProposer(draft), k=3, sampling=SamplingConfig(temperature=0)).generate(
        PROMPT, 8
    )
    with TraceStore(_stored(tmp_path, out)) as store:
        buf = io.StringIO()
        export_run(store, out.config.run_id, buf)
    lines = [json.loads(line) for line in buf.getvalue().splitlines()]
    next(line for line in lines if line.get("nodes"))["nodes"][0]["confidence"] = 1.5
    with TraceStore(tmp_path / "bad.sqlite") as store, pytest.raises(TraceFormatError) as err:
        import_run(store, io.StringIO("\n".join(json.dumps(line) for line in lines)))
    assert "confidence" in str(err.value) and "\n" not in str(err.value)


def test_a_version_6_store_migrates_with_confidence_unknown(pair, tmp_path):
    target, draft = pair
    out = SpeculativeDecoder(target, DraftModelProposer(draft), k=3, sampling=SamplingConfig(temperature=0)).generate(
        PROMPT, 12
    )
    path = _stored(tmp_path, out)
    downgrade_sqlite_store(path, 6)
    with TraceStore(path) as store:
        assert store.schema_version == SCHEMA_VERSION == 7
        rounds = store.load_rounds(out.config.run_id)
        assert [r.tokens for r in rounds] == [r.tokens for r in out.rounds]
        assert all(n.confidence is None for r in rounds for n in r.nodes)
    assert np.isfinite([n.confidence for r in out.rounds for n in r.nodes]).all()
