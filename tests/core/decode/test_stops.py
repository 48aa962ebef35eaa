"""Stop strings, stop token sequences and several EOS ids (core.decode.stops): where the
output ends, the same in both engines, the checker's stop rules and the stop faults."""

import dataclasses

import pytest
import torch

from specscope.core import DraftModelProposer, PromptLookupProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.check.checker import RULES, check_report, first_bad_round
from specscope.core.decode.stops import StopMatch, Stops, StopTracker
from specscope.core.engines import TransformersEngine
from specscope.core.faults.zoo import FAULTS, faulty_decoder
from specscope.core.records import RunEnd
from tests.tiny_models import noisy_copy, tiny_lm

GREEDY = SamplingConfig(temperature=0)
PROMPT = [1, 2, 3, 4, 5]
BUDGET = 40
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def piece(token: int) -> str:
    """A fake tokenizer's text: pieces of one to three characters, so strings span tokens."""
    return LETTERS[token % 26] * (1 + token % 3)


@pytest.fixture(scope="module")
def pair():
    target = tiny_lm("llama", seed=0, init_range=0.3)
    return target, noisy_copy(target, 0.1)


@pytest.fixture(scope="module")
def plain(pair):
    """Plain greedy output of the target (speculation off: k=1 lookup with nothing to find is
    still exact; transformers' generate is the reference)."""
    target, _ = pair
    ids = torch.tensor([PROMPT])
    out = target.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=BUDGET, do_sample=False, pad_token_id=0
    )
    return out[0, len(PROMPT) :].tolist()


def text_of(tokens):
    return "".join(piece(t) for t in tokens)


def cut_by_string(tokens, s):
    """The reference cut: up to and including the first token whose piece completes `s`."""
    for j in range(len(tokens)):
        if s in text_of(tokens[: j + 1]):
            return tokens[: j + 1]
    return tokens


def proposers(draft):
    return {
        "chain k=1": lambda: (DraftModelProposer(draft), 1),
        "chain k=4": lambda: (DraftModelProposer(draft), 4),
        "tree": lambda: (DraftModelProposer(draft, tree="3,2,1"), 4),
        "lookup": lambda: (PromptLookupProposer(), 3),
    }


def test_tracker_matches_on_the_text_and_does_not_cut_it():
    pieces = {0: "la", 1: "st", 2: "opper", 3: "x"}
    tracker = StopTracker(Stops(strings=("stop",)), pieces.__getitem__)
    assert tracker.check([0]) is None and tracker.check([0, 1]) is None
    assert tracker.check([0, 1, 2]) == StopMatch("text", 0, 2)  # "st" + "opper": the match ends inside "opper"
    tracker.commit([0, 1])  # "st" came in an earlier round: the match spans the round boundary
    assert tracker.check([2]) == StopMatch("text", 0, 0)
    seq = StopTracker(Stops(sequences=((5, 6),)), None)
    seq.commit([5])
    assert seq.check([6]) == StopMatch("ids", 0, 0) and seq.check([7]) is None


@pytest.mark.parametrize("name", ["chain k=1", "chain k=4", "tree", "lookup"])
def test_greedy_speculative_output_with_a_stop_is_plain_greedy_cut_the_same_way(pair, plain, name):
    target, draft = pair
    mid_block = 0
    cases = [Stops(sequences=(tuple(plain[a:b]),)) for a, b in ((3, 5), (0, 1), (12, 15), (30, 31))]
    cases += [Stops(strings=(text_of(plain[a:b])[1:-1] or text_of(plain[a:b]),)) for a, b in ((4, 7), (10, 12))]
    for stops in cases:
        proposer, k = proposers(draft)[name]()
        out = SpeculativeDecoder(target, proposer, k=k, sampling=GREEDY, stops=stops, token_piece=piece).generate(
            PROMPT, BUDGET
        )
        if stops.sequences:
            seq = list(stops.sequences[0])
            end = next(j for j in range(len(plain)) if plain[max(0, j + 1 - len(seq)) : j + 1] == seq)
            expected = plain[: end + 1]
        else:
            expected = cut_by_string(plain, stops.strings[0])
        assert out.new_tokens == expected, (name, stops)
        assert out.stop_reason == "stop" and out.rounds[-1].stop is not None
        assert out.rounds[-1].stop.position == len(out.rounds[-1].emitted) - 1
        mid_block += out.rounds[-1].stop.position < out.rounds[-1].drafted
        report = check_report(out.config, out.rounds, end=RunEnd("completed", "stop", len(out.new_tokens)))
        assert report.findings == [], [str(f) for f in report.findings]
    if name != "lookup":
        assert mid_block, "no stop completed inside an accepted block: the test does not exercise it"


@pytest.mark.parametrize("kind", ["assisted", "lookup"])
def test_both_engines_emit_the_same_tokens_for_the_same_stop(pair, plain, kind):
    target, draft = pair
    for stops in [
        Stops(sequences=(tuple(plain[6:8]),)),
        Stops(strings=(text_of(plain[9:12])[1:],)),
        Stops(sequences=(tuple(plain[20:21]),), strings=("zzzzzzzz",)),
    ]:
        ours = SpeculativeDecoder(
            target,
            DraftModelProposer(draft) if kind == "assisted" else PromptLookupProposer(),
            k=3,
            sampling=GREEDY,
            stops=stops,
            token_piece=piece,
        ).generate(PROMPT, BUDGET)
        engine = TransformersEngine(
            target, kind=kind, draft=draft, k=3, sampling=GREEDY, stops=stops, token_piece=piece
        )
        theirs = engine.generate(PROMPT, BUDGET)
        assert theirs.new_tokens == ours.new_tokens and theirs.stop_reason == ours.stop_reason == "stop"
        assert theirs.rounds[-1].stop.position == len(theirs.rounds[-1].emitted) - 1
        report = check_report(theirs.config, theirs.rounds, end=RunEnd("completed", "stop", len(theirs.new_tokens)))
        assert [f for f in report.findings if f.rule != "acceptance-draw"] == [], [str(f) for f in report.findings]


def test_several_eos_ids_each_end_the_output_in_both_engines(pair, plain):
    target, draft = pair
    first = next(t for t in plain[8:] if t not in plain[:8])
    eos = (next(t for t in range(64) if t not in plain), first)  # the first id never comes: the second ends it
    ours = SpeculativeDecoder(target, DraftModelProposer(draft), k=4, sampling=GREEDY, eos_token_id=eos).generate(
        PROMPT, BUDGET
    )
    assert ours.new_tokens == plain[: plain.index(first) + 1] and ours.stop_reason == "eos"
    assert ours.config.eos_token_ids == eos and ours.config.eos_ids == set(eos)
    theirs = TransformersEngine(target, draft=draft, k=4, sampling=GREEDY, eos_token_id=eos).generate(PROMPT, BUDGET)
    assert theirs.new_tokens == ours.new_tokens and theirs.stop_reason == "eos"
    assert check_report(ours.config, ours.rounds, end=RunEnd("completed", "eos", len(ours.new_tokens))).findings == []
    # the checker's EOS rule knows every id: a round that went past the second one is flagged
    leak = faulty_decoder("eos-leak", target, DraftModelProposer(draft), k=4, sampling=GREEDY, eos_token_id=eos)
    out = leak.generate(PROMPT, BUDGET)
    if leak.fault_rounds:
        findings = check_report(out.config, out.rounds).findings
        assert first_bad_round(findings) == leak.fault_rounds[0] and findings[0].rule == "eos"


def test_the_checker_flags_a_wrong_stop_record_finish_reason_and_end_count(pair, plain):
    target, draft = pair
    stops = Stops(sequences=(tuple(plain[12:14]),))
    out = SpeculativeDecoder(target, DraftModelProposer(draft), k=4, sampling=GREEDY, stops=stops).generate(
        PROMPT, BUDGET
    )
    n = len(out.new_tokens)
    rules = lambda rounds, end=None: {f.rule for f in check_report(out.config, rounds, end=end).findings}  # noqa: E731
    assert rules(out.rounds, RunEnd("completed", "budget", n)) == {"finish-reason"}
    assert rules(out.rounds, RunEnd("completed", "stop", n + 2)) >= {"end-count"}
    unflagged = out.rounds[:-1] + [dataclasses.replace(out.rounds[-1], stop=None)]
    assert rules(unflagged) == {"stop-flag"}
    wrong = [dataclasses.replace(r, stop=StopMatch("ids", 0, 0)) if r.stop is None else r for r in out.rounds]
    assert "stop-flag" in rules(wrong)
    assert all(name in RULES for name in ("stop-leak", "stop-flag", "stop-budget", "finish-reason", "end-count"))


def test_stop_rules_never_guess_without_the_recorded_stops(pair, plain):
    target, draft = pair
    out = SpeculativeDecoder(
        target,
        DraftModelProposer(draft),
        k=4,
        sampling=GREEDY,
        stops=Stops(strings=(text_of(plain[5:8])[1:],)),
        token_piece=piece,
    ).generate(PROMPT, BUDGET)
    blind = dataclasses.replace(out.config, unrecorded=frozenset({"stops"}), stop_strings=())
    report = check_report(blind, out.rounds, end=RunEnd("completed", "stop", len(out.new_tokens)))
    assert report.findings == [] and "stop-leak" in report.not_checked and "finish-reason" in report.not_checked
    textless = [dataclasses.replace(r, pieces=None) for r in out.rounds]
    report = check_report(out.config, textless, end=RunEnd("completed", "stop", len(out.new_tokens)))
    assert report.findings == [] and "pieces" in report.not_checked["stop-leak"]


STOP_FAULTS = [name for name, f in FAULTS.items() if f.needs == "stops"]


def test_the_stop_faults_are_listed():
    assert set(STOP_FAULTS) == {"stop-last-token", "budget-before-stop", "stop-per-token"}


@pytest.mark.parametrize("fault", STOP_FAULTS)
def test_every_stop_fault_is_flagged_at_its_first_round(pair, plain, fault):
    target, draft = pair
    fired = 0
    for a in range(2, 30, 5):
        for b in (2, 3):
            stops = (
                Stops(strings=(text_of(plain[a : a + b])[1:],))
                if fault == "stop-per-token"
                else Stops(sequences=(tuple(plain[a : a + b]),))
            )
            budget = a + b + 1 if fault == "budget-before-stop" else BUDGET  # the stop lands in the last round
            for k in (4,):
                dec = faulty_decoder(
                    fault, target, DraftModelProposer(draft), k=k, sampling=GREEDY, stops=stops, token_piece=piece
                )
                out = dec.generate(PROMPT, budget)
                end = RunEnd("completed", out.stop_reason, len(out.new_tokens))
                findings = check_report(out.config, out.rounds, end=end).findings
                if not dec.fault_rounds:
                    assert findings == [], (fault, [str(f) for f in findings])
                    continue
                fired += 1
                assert first_bad_round(findings) == dec.fault_rounds[0], (fault, [str(f) for f in findings])
                assert {f.rule for f in findings} <= {
                    "stop-leak",
                    "stop-flag",
                    "stop-budget",
                    "finish-reason",
                    "end-count",
                    "budget",
                    "round-structure",
                }
                assert "stop-leak" in {f.rule for f in findings}
                # otherwise plausible: every token is the target's own greedy choice
                assert out.new_tokens == plain[: len(out.new_tokens)]
    assert fired >= 3, f"{fault} fired in only {fired} runs"


@pytest.mark.parametrize("tree, children", [(None, None), ("3,2,1", "sampled"), ("2,2", "topk")])
def test_sampled_runs_that_stop_check_clean(pair, tree, children):
    target, draft = pair
    sampled = SamplingConfig(temperature=1.0, top_k=20)
    stopped = 0
    for seed in range(4):
        proposer = (
            DraftModelProposer(draft) if tree is None else DraftModelProposer(draft, tree=tree, children=children)
        )
        out = SpeculativeDecoder(
            target,
            proposer,
            k=4,
            sampling=sampled,
            seed=seed,
            token_piece=piece,
            stops=Stops(strings=("aa", "cb"), sequences=((5,),)),
        ).generate(PROMPT[:3], BUDGET)
        stopped += out.stop_reason == "stop"
        report = check_report(out.config, out.rounds, end=RunEnd("completed", out.stop_reason, len(out.new_tokens)))
        assert report.findings == [], [str(f) for f in report.findings]
    assert stopped >= 2


def test_token_pieces_of_a_real_tokenizer_concatenate_to_the_decoded_text():
    from specscope.core.decode.stops import token_piece_function
    from specscope.core.loading import models as loading

    if not loading.bundled_available():
        pytest.skip("needs the bundled tokenizer")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(loading.bundled_path("tokenizer")))
    piece = token_piece_function(tokenizer)
    text = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1)"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert "".join(piece(i) for i in ids) == tokenizer.decode(ids) == text
    assert any(piece(i).startswith(" ") for i in ids)  # a leading space belongs to its token


def test_the_factory_refuses_stop_strings_without_a_tokenizer_and_a_chat_without_a_template(pair):
    from specscope.core.decode.factory import Models, build_decoder, prompt_ids
    from specscope.core.decode.settings import RunSettings, SettingsError

    target, draft = pair
    models = Models(target, None, "t", draft, "d")
    with pytest.raises(SettingsError) as caught:
        build_decoder(RunSettings(stop_strings=("x",)), models, {"stop_strings": "--stop"})
    assert set(caught.value.errors) == {"stop_strings"} and "--stop" in str(caught.value)
    with pytest.raises(SettingsError) as caught:
        build_decoder(RunSettings(stop_ids=((1, 64),)), models)
    assert "vocabulary size 64" in caught.value.errors["stop_ids"]
    assert build_decoder(RunSettings(stop_ids=((1, 2),)), models).stops == Stops(sequences=((1, 2),))

    class NoTemplate:
        chat_template = None

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [1, 2]}

    chat = RunSettings(chat=True, system="be brief")
    with pytest.raises(SettingsError) as caught:
        prompt_ids(chat, Models(target, NoTemplate()), "hi")
    assert "chat template" in caught.value.errors["prompt"]
    assert prompt_ids(RunSettings(), Models(target, NoTemplate()), "hi") == [1, 2]
    assert RunSettings(system="x").validate()["system"].endswith("turn chat on")


# ---------------------------------------------------------------- characters split across byte-level tokens


def bundled_tokenizer():
    from specscope.core.loading import models as loading

    if not loading.bundled_available():
        pytest.skip("needs the bundled tokenizer")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(loading.bundled_path("tokenizer")))


def test_a_stop_string_ending_in_a_character_split_across_byte_level_tokens_is_matched():
    from specscope.core.decode.stops import token_piece_function

    tokenizer = bundled_tokenizer()  # byte-level BPE: an emoji is four one-byte tokens
    text = "say 日本 then 😀 ok"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    emoji = [i for i in ids if tokenizer.convert_ids_to_tokens(i) in ("ð", "Ł", "ĺ", "Ģ")]
    assert len(emoji) == 4, "the bundled tokenizer no longer splits the emoji into bytes: pick another character"
    last = ids.index(emoji[-1])
    piece = token_piece_function(tokenizer)
    for stop in ("😀", " 😀", "日", "日本", "n 😀 o"):
        tracker = StopTracker(Stops(strings=(stop,)), piece)
        found = next((j for j in range(len(ids)) if tracker.check(ids[: j + 1]) is not None), None)
        # the token that completes the string in the text of the tokens decoded together
        expected = next(j for j in range(len(ids)) if stop in tokenizer.decode(ids[: j + 1]))
        assert found == expected, (stop, found, expected)
    assert expected == last + 1  # "n 😀 o": the token " ok" completes it
    pieces = StopTracker(Stops(strings=("x",)), piece).pieces(ids)
    assert "".join(pieces) == tokenizer.decode(ids) == text  # the pieces are the decoded text
    assert pieces[ids.index(emoji[0]) : last] == ("", "", "") and pieces[last] == "😀"
    # the emoji's first two bytes came in one round, the rest in the next: still matched there
    tracker = StopTracker(Stops(strings=("😀",)), piece)
    split = ids.index(emoji[1]) + 1
    assert all(tracker.check(ids[: j + 1]) is None for j in range(split))
    assert tracker.pieces(ids[:split])[-2:] == ("", "")
    tracker.commit(ids[:split])
    rest = ids[split:]
    assert tracker.check(rest[:1]) is None and tracker.check(rest[:2]) == StopMatch("text", 0, 1)
    assert tracker.pieces(rest[:2]) == ("", "😀")


EMOJI = "😀".encode()  # four bytes: the fake tokenizer below gives them to three tokens


def byte_level_text(table: dict[int, bytes]):
    """A byte-level tokenizer's text (core.decode.stops.TokenText) over a token -> bytes table:
    tokens decode together as their bytes do, so a character split across tokens decodes whole."""
    from specscope.core.decode.stops import TokenText

    return TokenText(lambda ids: b"".join(table[int(t)] for t in ids).decode("utf-8", errors="replace"))


def test_both_engines_stop_at_the_token_that_completes_a_split_character(pair, plain):
    target, draft = pair
    checked = across = 0
    for a in range(2, BUDGET - 3, 3):
        split = plain[a : a + 3]
        if len(set(split)) < 3:
            continue
        table = {t: LETTERS[t % 26].encode() for t in range(64)}
        table.update({split[0]: EMOJI[:2], split[1]: EMOJI[2:3], split[2]: EMOJI[3:]})
        text = byte_level_text(table)
        stop = text.joined(plain[a - 1 : a]) + "😀"  # the character before, then the emoji
        full = lambda n, table=table: b"".join(table[t] for t in plain[:n]).decode("utf-8", errors="replace")  # noqa: E731
        expected = plain[: next(n for n in range(1, len(plain) + 1) if stop in full(n))]
        stops = Stops(strings=(stop,))
        ours = SpeculativeDecoder(
            target, DraftModelProposer(draft), k=3, sampling=GREEDY, stops=stops, token_piece=text
        ).generate(PROMPT, BUDGET)
        theirs = TransformersEngine(
            target, kind="assisted", draft=draft, k=3, sampling=GREEDY, stops=stops, token_piece=text
        ).generate(PROMPT, BUDGET)
        assert ours.new_tokens == theirs.new_tokens == expected, a
        assert ours.stop_reason == theirs.stop_reason == "stop"
        for out in (ours, theirs):
            assert "".join(p for r in out.rounds for p in r.pieces) == full(len(expected))
            report = check_report(out.config, out.rounds, end=RunEnd("completed", "stop", len(out.new_tokens)))
            assert [f for f in report.findings if f.rule != "acceptance-draw"] == [], [str(f) for f in report.findings]
        starts = next(r.index for r in ours.rounds if r.emitted_before + len(r.emitted) > len(expected) - 3)
        across += starts != ours.rounds[-1].index  # the character's first byte came in an earlier round
        checked += 1
    assert checked >= 3 and across >= 1, (checked, across)


# ---------------------------------------------------------------- plain decoding with the same stops


def test_plain_decoding_ends_at_the_same_stops_in_both_engines(pair, plain):
    from specscope.core.decode.baseline import plain_generate

    target, draft = pair
    cases = [
        Stops(sequences=(tuple(plain[6:8]),)),
        Stops(strings=(text_of(plain[9:12])[1:],)),
        Stops(sequences=(tuple(plain[20:21]),), strings=("zzzzzzzz",)),
    ]
    for stops in cases:
        reference = plain_generate(target, PROMPT, BUDGET, GREEDY, stops=stops, token_piece=piece)
        assert reference.stop_reason == "stop" and len(reference.new_tokens) < BUDGET, stops
        assert reference.new_tokens == plain[: len(reference.new_tokens)]
        for kind in ("assisted", "lookup"):
            engine = TransformersEngine(
                target, kind=kind, draft=draft, k=3, sampling=GREEDY, stops=stops, token_piece=piece
            )
            assert (
                engine.plain_generate(PROMPT, BUDGET)
                == engine.generate(PROMPT, BUDGET).new_tokens
                == reference.new_tokens
            ), (kind, stops)
    # sampled: the unrecorded generate() ends where the recorded one does, seed for seed
    sampled = SamplingConfig(temperature=1.0, top_k=20)
    engine = TransformersEngine(
        target, draft=draft, k=4, sampling=sampled, stops=Stops(strings=("aa", "cb")), token_piece=piece
    )
    ends = [engine.generate(PROMPT[:3], BUDGET, seed=seed) for seed in range(4)]
    assert [engine.plain_generate(PROMPT[:3], BUDGET, seed=seed) for seed in range(4)] == [e.new_tokens for e in ends]
    assert sum(e.stop_reason == "stop" for e in ends) >= 2


def test_plain_decoding_ends_at_any_of_several_eos_ids(pair, plain):
    from specscope.core.decode.baseline import plain_generate

    target, _ = pair
    first = next(t for t in plain[8:] if t not in plain[:8])
    eos = (next(t for t in range(64) if t not in plain), first)
    out = plain_generate(target, PROMPT, BUDGET, GREEDY, eos_token_id=eos)
    assert out.new_tokens == plain[: plain.index(first) + 1] and out.stop_reason == "eos"


@pytest.mark.parametrize("kind", ["assisted", "lookup"])
def test_a_stop_on_the_last_budget_token_finishes_as_stop_in_both_engines(pair, plain, kind):
    """The stop check runs before the budget check: a stop (or EOS) completed by the budget's
    last token is the finish reason, and that round records both the stop and budget_stop."""
    target, draft = pair
    budget = 20
    tail = tuple(plain[budget - 3 : budget])
    assert all(tuple(plain[i : i + 3]) != tail for i in range(budget - 3))  # completes only at the last token
    for stops, eos, reason in [
        (Stops(sequences=(tail,)), None, "stop"),
        (Stops(strings=(text_of(tail)[1:],)), None, "stop"),
        (Stops(sequences=(tail,)), plain[budget - 1], "eos"),
    ]:
        if eos is not None and eos in plain[: budget - 1]:
            continue
        ours = SpeculativeDecoder(
            target,
            DraftModelProposer(draft) if kind == "assisted" else PromptLookupProposer(),
            k=3,
            sampling=GREEDY,
            stops=stops,
            token_piece=piece,
            eos_token_id=eos,
        ).generate(PROMPT, budget)
        theirs = TransformersEngine(
            target, kind=kind, draft=draft, k=3, sampling=GREEDY, stops=stops, token_piece=piece, eos_token_id=eos
        ).generate(PROMPT, budget)
        for out in (ours, theirs):
            assert out.new_tokens == plain[:budget] and out.stop_reason == reason
            last = out.rounds[-1]
            assert last.budget_stop and (last.stop is not None) == (reason == "stop")
            end = RunEnd("completed", reason, budget)
            assert [
                f for f in check_report(out.config, out.rounds, end=end).findings if f.rule != "acceptance-draw"
            ] == []
