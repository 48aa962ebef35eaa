"""The three everyday changes each touch one place (architecture issue):

- a new fault is one entry (and its inject function) in core/faults/zoo.py;
- a new checker rule is one Rule (name, text, severity, checks) in core/check/rules.py and the method
  that emits it in core/check/checker.py (named in ROUND_CHECKS);
- a new proposer is its class and one registry entry in core/ (tests/app covers the GUI side);
- a new layout (how a draft is laid out in the verify forward and kept in the cache) is its
  class, given to the decoder's `layout` argument (core/decode/layout.py has the two built in).

Each test makes the change the way a maintainer would, at run time and in that one module
only, and then uses it through the public API and the CLI, which were not touched.
"""

from __future__ import annotations

import dataclasses

import pytest

from specscope.app.cli import main
from specscope.core import DraftModelProposer, SamplingConfig
from specscope.core.check import checker as checker_module
from specscope.core.check import rules as rules_module
from specscope.core.check.checker import check_run, first_bad_round
from specscope.core.decode.kv import CachePolicy
from specscope.core.decode.layout import TreeLayout
from specscope.core.draft import registry
from specscope.core.faults import zoo as faults_module
from specscope.core.records import TreeRound
from tests.core.scripted import ScriptedProposer
from tests.tiny_models import noisy_copy, save_pair, tiny_lm


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return save_pair(tmp_path_factory.mktemp("ckpt"), noise=0.3)


class KeepsTwoTooMany(CachePolicy):
    """A new bug: the target cache keeps two rejected entries, and the decoder feeds only
    the newest token when the cache seems to cover the context."""

    def __init__(self, inner, fire):
        self.inner, self.fire = inner, fire

    def pending(self, lm, context):
        if lm.processed >= len(context):
            return [context[-1]]
        return self.inner.pending(lm, context)

    def crop(self, lm, committed):
        if lm.processed > committed:
            self.fire()
        self.inner.crop(lm, committed + 2)


@pytest.fixture
def new_fault(monkeypatch):
    fault = faults_module.Fault(
        "target-crop-off-by-two",
        "the target cache keeps two entries too many after a crop",
        "a rejection",
        lambda seams, fire: dataclasses.replace(seams, target_cache=KeepsTwoTooMany(seams.target_cache, fire)),
    )
    monkeypatch.setitem(faults_module.FAULTS, fault.name, fault)
    return fault.name


def test_a_fault_added_in_faults_py_alone_fires_and_is_flagged(new_fault):
    target = tiny_lm("llama", seed=0, init_range=0.3)
    draft = noisy_copy(target, 0.3)
    dec = faults_module.faulty_decoder(
        new_fault, target, DraftModelProposer(draft), k=4, sampling=SamplingConfig(temperature=0)
    )
    out = dec.generate([1, 2, 3, 4, 1, 2], 40)
    assert out.config.fault == new_fault
    assert dec.fault_rounds, "the new fault never fired"
    findings = check_run(out.config, out.rounds)
    assert first_bad_round(findings) == dec.fault_rounds[0]
    assert {f.rule for f in findings if f.round == dec.fault_rounds[0]} == {"target-cache"}


def test_a_fault_added_in_faults_py_alone_reaches_the_cli(new_fault, checkpoints, tmp_path, capsys):
    target, draft = checkpoints
    assert main(["faults"]) == 0
    assert new_fault in capsys.readouterr().out
    db = tmp_path / "t.sqlite"
    code = main(
        [
            "run",
            "--target",
            str(target),
            "--draft",
            str(draft),
            "--prompt-ids",
            "1,2,3,4,1,2",
            "--device",
            "cpu",
            "--max-new",
            "40",
            "--fault",
            new_fault,
            "--db",
            str(db),
            "--json",
        ]
    )
    assert code == 0
    capsys.readouterr()
    assert main(["check", str(db)]) != 0
    assert "[target-cache]" in capsys.readouterr().out


@pytest.fixture
def new_rule(monkeypatch):
    """A new rule (a lint more than a bug): a round that drafted nothing."""

    def drafted_something(self):
        if not self.rnd.nodes:
            self.add("empty-draft", "the proposer drafted nothing: the round cost a target forward for one token")

    monkeypatch.setitem(
        rules_module.REGISTRY,
        "empty-draft",
        rules_module.Rule(
            "empty-draft", "every round drafts at least one token", rules_module.WRONG_OUTPUT, ("drafted_something",)
        ),
    )
    monkeypatch.setattr(checker_module._RoundChecker, "drafted_something", drafted_something, raising=False)
    monkeypatch.setattr(checker_module, "ROUND_CHECKS", checker_module.ROUND_CHECKS + ("drafted_something",))
    return "empty-draft"


def test_a_rule_added_in_core_check_alone_reaches_the_cli(new_rule, checkpoints, tmp_path, capsys):
    target, _ = checkpoints
    db = tmp_path / "t.sqlite"
    # Prompt lookup on a prompt without repeats drafts nothing in its first round.
    code = main(
        [
            "run",
            "--target",
            str(target),
            "--proposer",
            "lookup",
            "--prompt-ids",
            "1,2,3,4,5,6",
            "--device",
            "cpu",
            "--max-new",
            "8",
            "--db",
            str(db),
            "--json",
        ]
    )
    assert code == 0
    capsys.readouterr()
    assert main(["check", str(db)]) != 0
    out = capsys.readouterr().out
    assert "[empty-draft] round 0" in out


class RepeatLast(ScriptedProposer):
    """A new proposer: the last context token, `times` times, as a point mass."""

    name = "repeat"

    def __init__(self, times: int = 1):
        super().__init__(lambda context, k: [context[-1]] * min(k, times), vocab_size=0)
        self.spec = f"repeat:times={times}"
        self.times = times

    def bind(self, vocab_size, use_cache):
        self.vocab_size = vocab_size

    def params(self):
        return {"times": self.times}


def test_a_proposer_added_in_core_alone_is_built_from_its_spec_and_checked_clean(monkeypatch):
    kind = registry.ProposerKind(
        "repeat",
        "the last token again",
        lambda spec, _load: RepeatLast(**spec.params),
        params=(registry.Param("times", int, 1),),
    )
    monkeypatch.setitem(registry.KINDS, kind.name, kind)
    proposer = registry.build_proposer("repeat:times=3")
    assert proposer.spec == "repeat:times=3"
    from specscope.core import SpeculativeDecoder

    target = tiny_lm("llama", seed=0, init_range=0.3)
    out = SpeculativeDecoder(target, proposer, k=4, sampling=SamplingConfig(temperature=1.0)).generate([5, 5, 5, 5], 30)
    assert out.config.proposer_params["spec"] == "repeat:times=3"
    assert check_run(out.config, out.rounds) == []
    with pytest.raises(registry.SpecError, match="no parameter 'nope'"):
        registry.build_proposer("repeat:nope=1")


class ChainAsTree(TreeLayout):
    """A new layout: a chain draft laid out as the tree whose node i has parent i - 1 (one
    masked forward, the kept rows gathered by index), drafting k tokens as a chain does."""

    def draft_length(self, k, remaining):
        return min(k, remaining)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_layout_added_alone_gives_the_chains_tokens_and_is_checked_clean(temperature):
    target = tiny_lm("llama", seed=0, init_range=0.3)
    draft = noisy_copy(target, 0.3)
    cfg = SamplingConfig(temperature=temperature)
    from specscope.core import SpeculativeDecoder

    chain = SpeculativeDecoder(target, DraftModelProposer(draft), k=4, sampling=cfg, eos_token_id=3, seed=5)
    as_tree = SpeculativeDecoder(
        target, DraftModelProposer(draft), k=4, sampling=cfg, eos_token_id=3, seed=5, layout=ChainAsTree()
    )
    for prompt in ([1, 2, 3, 4, 1, 2], [7, 7, 9, 11, 2]):
        a, b = chain.generate(prompt, 30), as_tree.generate(prompt, 30)
        assert a.new_tokens == b.new_tokens
        assert [[n.status for n in r.nodes] for r in a.rounds] == [[n.status for n in r.nodes] for r in b.rounds]
        assert [r.target_cache for r in a.rounds] == [r.target_cache for r in b.rounds]
        assert all(
            isinstance(r, TreeRound) and r.tree.kept_rows == tuple(r.prefix_len + i for i in r.tree.path)
            for r in b.rounds
        )
        assert check_run(b.config, b.rounds) == []
