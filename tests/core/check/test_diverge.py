"""core.check.diverge: a near tie is found and named; every fault of the zoo that changes greedy
output is a logic bug at the round the fault fired."""

from __future__ import annotations

import pytest
import torch

from specscope.core.check.diverge import IDENTICAL, LOGIC_BUG, NEAR_TIE, diverge_report, diverge_run, first_difference
from specscope.core.decode.baseline import plain_generate
from specscope.core.decode.decoder import SpeculativeDecoder
from specscope.core.draft.proposers import DraftModelProposer
from specscope.core.faults.zoo import FAULTS, faulty_decoder
from specscope.core.sampling.reference import SamplingConfig
from tests.tiny_models import noisy_copy, tiny_lm

GREEDY = SamplingConfig(temperature=0)
PROMPT = [1, 5, 9, 13]
BUDGET = 12


@pytest.fixture(scope="module")
def pair():
    target = tiny_lm("llama", seed=0, init_range=0.3)
    return target, noisy_copy(target, 0.05)


@pytest.fixture(scope="module")
def plain(pair):
    return plain_generate(pair[0], PROMPT, BUDGET, GREEDY).new_tokens


def tie_within_rounding(model: torch.nn.Module, a: int, b: int):
    """Make tokens a and b tie within float32 rounding wherever a is the argmax: b's logit is
    the float32 number just above a's in a forward over several positions (a verify forward),
    just below it in a one-token forward. Real kernels do this by reduction order, which
    depends on the shape of the forward; here the one-ulp flip is certain."""

    def hook(_module, _inputs, logits):
        rows = logits[0]
        batched = rows.shape[0] > 1
        for row in rows:
            if int(row.argmax()) == a:
                toward = torch.tensor(float("inf") if batched else float("-inf"), dtype=row.dtype)
                row[b] = torch.nextafter(row[a], toward)
        return logits

    return model.lm_head.register_forward_hook(hook)


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 4, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_identical_outputs_say_so(pair, plain):
    target, draft = pair
    d = diverge_run(SpeculativeDecoder(target, DraftModelProposer(draft), k=4, sampling=GREEDY), target, PROMPT, BUDGET)
    assert d.verdict == IDENTICAL and d.position is None and list(d.plain) == plain == list(d.speculative)


@pytest.mark.parametrize("tree", [None, "3,2,1"])
def test_a_float32_near_tie_is_found_and_named(pair, plain, tree):
    target, draft = pair
    a = plain[3]
    b = (a + 1) % 64
    where = plain.index(a)  # the first position whose plain token is a
    handle = tie_within_rounding(target, a, b)
    try:
        decoder = SpeculativeDecoder(target, DraftModelProposer(draft, tree=tree), k=4, sampling=GREEDY)
        d = diverge_run(decoder, target, PROMPT, BUDGET)
    finally:
        handle.remove()
    assert d.verdict == NEAR_TIE, d.reason
    assert (d.position, d.plain_token, d.speculative_token) == (where, a, b)
    assert list(d.plain) == plain  # plain decoding never saw b above a
    assert 0 < d.margin < 1e-5  # one float32 step apart in the one-token forward (logits of size ~1-10)
    assert d.verify_margin < 0  # the verify forward, recomputed, prefers b
    assert d.margin <= 2 * d.logit_diff
    assert d.findings == () and d.blame_round == d.round
    assert "numerics" in d.reason


def test_a_token_far_from_a_tie_is_a_logic_bug(pair, plain):
    """A recorded round whose first emitted token was swapped for one the target ranks far
    below its argmax: the margin is far beyond what the forwards' difference can flip."""
    import dataclasses

    target, draft = pair
    decoder = SpeculativeDecoder(target, DraftModelProposer(draft), k=4, sampling=GREEDY)
    config = decoder.run_config(PROMPT, BUDGET)
    rounds = list(decoder.start(PROMPT, BUDGET, config=config))
    last = rounds[-1]
    wrong = (plain[last.emitted_before] + 7) % 64
    emitted = (dataclasses.replace(last.emitted[0], token=wrong),) + last.emitted[1:]
    rounds[-1] = dataclasses.replace(last, emitted=emitted)
    d = diverge_report(config, rounds, target)
    assert d.verdict == LOGIC_BUG and d.position == last.emitted_before and d.round == last.index
    assert d.margin > 2 * d.logit_diff


# the zoo's greedy-visible faults, each with a run in which it fires (eos-leak needs an EOS
# that a draft proposes mid-block: plain output's token 5; budget-overshoot no EOS)
EOS_AT = {"eos-leak": 5}


# the stop faults need a run with stops: test_each_stop_fault_is_a_logic_bug_at_its_round
# (a head fault needs a draft head and never changes the output: tests/core/faults/test_head_faults.py)
@pytest.mark.parametrize("name", [n for n, f in FAULTS.items() if f.needs not in ("coupled", "stops", "head")])
def test_each_fault_that_changes_greedy_output_is_a_logic_bug_at_its_round(pair, plain, name):
    target, draft = pair
    fault = FAULTS[name]
    eos = plain[EOS_AT[name]] if name in EOS_AT else None
    tree = "3,2,1" if fault.needs == "tree" else None
    decoder = faulty_decoder(name, target, DraftModelProposer(draft, tree=tree), k=4, sampling=GREEDY, eos_token_id=eos)
    d = diverge_run(decoder, target, PROMPT, BUDGET)
    if d.verdict == IDENTICAL:
        # greedy decoding draws nothing, and the draft only decides what is accepted: these
        # faults cannot change greedy output
        assert name in ("resample-p", "raw-q", "stale-draft-cache", "tree-stale-residual"), name
        return
    assert decoder.fault_rounds, f"{name}: output changed, yet the fault never fired"
    assert d.verdict == LOGIC_BUG, d.reason
    assert d.blame_round == decoder.fault_rounds[0] <= d.round
    assert d.findings and d.findings[0].round == decoder.fault_rounds[0]


def test_a_sampled_run_is_refused(pair):
    target, draft = pair
    decoder = SpeculativeDecoder(target, DraftModelProposer(draft), k=4, sampling=SamplingConfig(temperature=1.0))
    with pytest.raises(ValueError, match="only defined at temperature 0"):
        diverge_run(decoder, target, PROMPT, BUDGET)


def test_transformers_engine_runs_are_compared_too(pair, plain):
    from specscope.core.engines import TransformersEngine

    target, draft = pair
    engine = TransformersEngine(target, kind="assisted", draft=draft, k=4, sampling=GREEDY)
    d = diverge_run(engine, target, PROMPT, BUDGET)
    assert d.verdict == IDENTICAL and list(d.speculative) == plain
    handle = tie_within_rounding(target, plain[3], (plain[3] + 1) % 64)
    try:
        d = diverge_run(
            TransformersEngine(target, kind="assisted", draft=draft, k=4, sampling=GREEDY), target, PROMPT, BUDGET
        )
    finally:
        handle.remove()
    assert d.verdict == NEAR_TIE and d.position == plain.index(plain[3]), d.reason


def _piece(token: int) -> str:
    """A fake tokenizer's text: one to three letters a token, so a stop string spans tokens."""
    return "abcdefghijklmnopqrstuvwxyz"[token % 26] * (1 + token % 3)


def _stops_in(plain, a: int, strings: bool):
    from specscope.core.decode.stops import Stops

    if strings:
        return Stops(strings=("".join(_piece(t) for t in plain[a : a + 2])[1:],))
    return Stops(sequences=(tuple(plain[a : a + 2]),))


@pytest.mark.parametrize("strings", [False, True])
def test_a_correct_run_with_stops_is_identical_to_plain_decoding_with_them(pair, plain, strings):
    target, draft = pair
    for a in (2, 5):
        stops = _stops_in(plain, a, strings)
        decoder = SpeculativeDecoder(
            target, DraftModelProposer(draft), k=4, sampling=GREEDY, stops=stops, token_piece=_piece
        )
        d = diverge_run(decoder, target, PROMPT, BUDGET)
        assert d.verdict == IDENTICAL and len(d.plain) < BUDGET, d.reason  # plain decoding stopped there too


@pytest.mark.parametrize("name", [n for n, f in FAULTS.items() if f.needs == "stops"])
def test_each_stop_fault_is_a_logic_bug_at_its_round(pair, plain, name):
    target, draft = pair
    fired = 0
    for a in range(1, BUDGET - 3):
        stops = _stops_in(plain, a, strings=name == "stop-per-token")
        budget = a + 3 if name == "budget-before-stop" else BUDGET  # the stop lands in the last round
        decoder = faulty_decoder(
            name, target, DraftModelProposer(draft), k=4, sampling=GREEDY, stops=stops, token_piece=_piece
        )
        d = diverge_run(decoder, target, PROMPT, budget)
        if not decoder.fault_rounds:
            assert d.verdict == IDENTICAL, (name, a, d.reason)
            continue
        fired += 1
        assert d.verdict == LOGIC_BUG and d.blame_round == decoder.fault_rounds[0], (name, a, d.reason)
    assert fired >= 2, f"{name} fired in {fired} runs"


def test_stop_strings_without_the_tokenizer_are_refused(pair, plain):
    target, draft = pair
    decoder = SpeculativeDecoder(
        target, DraftModelProposer(draft), k=4, sampling=GREEDY, stops=_stops_in(plain, 2, True), token_piece=_piece
    )
    config = decoder.run_config(PROMPT, BUDGET)
    rounds = list(decoder.start(PROMPT, BUDGET, config=config))
    with pytest.raises(ValueError, match="needs the tokenizer"):
        diverge_report(config, rounds, target)
