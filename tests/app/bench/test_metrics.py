"""The bench's acceptance metrics on a hand-computed case, under specscope's, vLLM's and
llama.cpp's definitions, and the latency split."""

from types import SimpleNamespace

import pytest

from specscope.app.bench.metrics import (
    RoundCounts,
    alpha_of,
    counts_of,
    decode_split,
    llamacpp_acceptance,
    specscope_acceptance,
    token_latencies,
    vllm_acceptance,
)

# k = 3, greedy. One line per round: drafted, accepted, visited (tested positions), emitted.
ROUNDS = [
    RoundCounts(drafted=3, accepted=3, visited=3, emitted=4),  # all accepted + bonus
    RoundCounts(drafted=3, accepted=1, visited=2, emitted=2),  # one accepted, then a rejection and its repair
    RoundCounts(drafted=0, accepted=0, visited=0, emitted=1),  # prompt lookup found no match
    RoundCounts(drafted=3, accepted=0, visited=1, emitted=1),  # first draft rejected
    # the second draft is EOS and accepted: the round ends there; the target's argmax agreed
    # with the third draft too, which vLLM and llama.cpp count and specscope does not
    RoundCounts(drafted=3, accepted=2, visited=2, emitted=2, eos_accepted=True, after_eos=1),
]


def test_specscope_definitions_by_hand():
    m = specscope_acceptance(ROUNDS, k=3)
    assert (m["rounds"], m["drafted"], m["accepted"]) == (5, 12, 6)
    assert m["mean_accepted_length"] == pytest.approx((4 + 2 + 1 + 1 + 3) / 5)  # the no-draft round counts as 1
    assert m["acceptance_rate"] == pytest.approx(6 / 12)
    # conditional: accepted at i / rounds that tested position i
    assert m["acceptance_by_position"] == pytest.approx([3 / 4, 2 / 3, 1 / 1])
    assert m["survival_by_position"] == pytest.approx([3 / 5, 2 / 5, 1 / 5])
    assert alpha_of(ROUNDS) == pytest.approx(6 / 8)  # greedy: accepted / tested positions


def test_vllm_definitions_by_hand():
    v = vllm_acceptance(ROUNDS, k=3)
    # 4 drafts (the empty one is not a draft); accepted 3 + 1 + 0 + (2 + 1 after EOS) = 7
    assert (v["num_drafts"], v["num_draft_tokens"], v["num_accepted_tokens"]) == (4, 12, 7)
    assert v["mean_acceptance_length"] == pytest.approx(1 + 7 / 4)
    # not conditional: drafts with more than i accepted / all drafts
    assert v["per_position_acceptance_rate"] == pytest.approx([3 / 4, 2 / 4, 2 / 4])
    assert v["draft_acceptance_rate"] == pytest.approx(7 / 12)
    assert v["eos_rounds_unresolved"] == 0


def test_llamacpp_definition_by_hand():
    lc = llamacpp_acceptance(ROUNDS)
    assert (lc["n_drafted"], lc["n_accept"]) == (12, 7)
    assert lc["draft_acceptance_rate"] == pytest.approx(7 / 12)  # the target's own token not counted


def test_an_untested_eos_tail_is_counted_up_to_the_eos_and_flagged():
    rounds = [
        RoundCounts(drafted=3, accepted=1, visited=1, emitted=1, eos_accepted=True, after_eos=None),
        RoundCounts(drafted=3, accepted=3, visited=3, emitted=4),
    ]
    v, lc = vllm_acceptance(rounds, k=3), llamacpp_acceptance(rounds)
    assert v["num_accepted_tokens"] == 4 and v["eos_rounds_unresolved"] == 1
    assert lc["n_accept"] == 4 and lc["eos_rounds_unresolved"] == 1
    assert vllm_acceptance([], k=2)["mean_acceptance_length"] == 1.0
    with pytest.raises(ValueError, match="no rounds"):
        specscope_acceptance([], k=2)


def _node(token, status, argmax, overlap=None):
    return SimpleNamespace(token=token, status=status, target_argmax=argmax, overlap=overlap)


def _round(nodes, emitted, greedy=True):
    return SimpleNamespace(nodes=nodes, emitted=[None] * emitted, greedy=greedy, timings=SimpleNamespace(draft_s=0.002))


def test_counts_of_a_round_record():
    eos = 0
    # greedy: EOS accepted at node 1; node 2 agrees with the target's argmax, node 3 does not
    rnd = _round(
        [_node(5, "accepted", 5), _node(0, "accepted", 0), _node(7, "unvisited", 7), _node(8, "unvisited", 9)], 2
    )
    c = counts_of(rnd, eos)
    assert (c.drafted, c.accepted, c.visited, c.emitted, c.eos_accepted, c.after_eos) == (4, 2, 2, 2, True, 1)
    assert c.draft_s == 0.002 and c.overlap_sum is None
    # sampled: the tail after the EOS was never drawn for, so it is unknown
    rnd = _round([_node(0, "accepted", 3, 0.5), _node(7, "unvisited", 7, 0.9)], 1, greedy=False)
    c = counts_of(rnd, eos)
    assert c.after_eos is None and c.overlap_sum == pytest.approx(0.5)
    # a rejection: tested positions are the accepted ones and the rejected one
    rnd = _round(
        [_node(5, "accepted", 5, 0.8), _node(6, "rejected", 2, 0.3), _node(1, "unvisited", 1, 0.7)], 2, greedy=False
    )
    c = counts_of(rnd, eos)
    assert (c.accepted, c.visited, c.eos_accepted, c.after_eos) == (1, 2, False, 0)
    assert alpha_of([c]) == pytest.approx((0.8 + 0.3) / 2)  # sampled: mean sum min(p, q) over tested positions


def test_latencies_and_the_decode_split():
    emissions = [(0.010, 4), (0.015, 2), (0.030, 1)]  # a round's tokens arrive together
    assert token_latencies(emissions) == pytest.approx([0.0025] * 4 + [0.0025] * 2 + [0.015])
    ttft, decode_tokens, decode_s = decode_split(0.032, 7, emissions)
    assert (ttft, decode_tokens) == (0.010, 3) and decode_s == pytest.approx(0.022)


def test_tracing_overhead_is_split_into_the_rounds_and_the_writers_fixed_cost():
    """Issue 41: a traced run's wall holds the writer's start and final flush (two commits, a
    fixed cost per run) besides its rounds; the bench reports the overhead of the rounds alone
    beside the total, and the fixed cost in ms a run."""
    from specscope.app.bench.measurement import Sample
    from specscope.app.bench.report import method_stats

    def method(wall: float, writer_s: float | None) -> SimpleNamespace:
        reps = [[Sample(tokens=[1] * 24, wall_s=wall + d, writer_s=writer_s)] for d in (0.0, 0.01, 0.02)]
        return SimpleNamespace(samples=reps, draft=None, k=4)

    untraced = method(1.0, None)
    row = method_stats(method(1.3, 0.25), untraced, [0], [8], twin=untraced)
    assert row["tracing_overhead_median"] == pytest.approx(0.3, abs=0.01)
    assert row["tracing_overhead_rounds_median"] == pytest.approx(0.05, abs=0.01)
    assert row["tracing_writer_ms_median"] == pytest.approx(250.0)
