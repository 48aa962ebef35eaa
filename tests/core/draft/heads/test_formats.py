"""Draft heads (core.draft.heads) loaded from random-initialised checkpoints written in their
authors' formats (tests/core/head_checkpoints.py), decoded through the one round:

- greedy output equals plain greedy decoding for every head kind (chain drafts);
- after every round the head's cache holds exactly the entries a fresh head computes from
  the target's features of the committed context (the accepted path, nothing drafted);
- the seam: the verify forward asks for hidden states only when a proposer names layers,
  and hands over exactly the committed positions' features (checked against a full
  recompute), for chain and tree layouts;
- wrong-format and mismatched checkpoints are refused in one line.
"""

from __future__ import annotations

import pytest
import torch

from specscope.app.cli import main
from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.decode.factory import Models, RunSettings, SettingsError, build_decoder
from specscope.core.draft.proposers import TargetMismatch
from specscope.core.draft.registry import SpecError, build_proposer, parse_spec
from tests.core.head_checkpoints import WRITERS, write_eagle, write_eagle3, write_medusa, write_mtp
from tests.tiny_models import noisy_copy, save_pair, tiny_lm

PROMPT = [1, 2, 3, 4, 5, 6, 2, 3]
GREEDY = SamplingConfig(temperature=0)


@pytest.fixture(scope="module")
def target():
    return tiny_lm("llama", seed=0, init_range=0.3, layers=4, vocab=64)


@pytest.fixture(scope="module")
def small_vocab_target():
    """Eight tokens and peaky rows: sampled drafts are often accepted, so paths are long."""
    return tiny_lm("llama", seed=3, init_range=1.0, layers=4, vocab=8)


def head_spec(kind, folder, target, **kw):
    if kind == "eagle3":
        kw.setdefault("draft_vocab", target.config.vocab_size - 3)
    WRITERS[kind](folder / kind, target, **kw)
    return f"{kind}:{folder / kind}"


def plain_greedy(target, prompt, n):
    return SpeculativeDecoder(target, build_proposer("lookup"), k=1, sampling=GREEDY).generate(prompt, n).new_tokens


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_greedy_output_equals_plain_greedy_for_every_head(kind, target, tmp_path):
    spec = head_spec(kind, tmp_path, target)
    want = plain_greedy(target, PROMPT, 30)
    for k in (1, 3, 5):
        out = SpeculativeDecoder(target, build_proposer(spec), k=k, sampling=GREEDY).generate(PROMPT, 30)
        assert out.new_tokens == want, (kind, k)
        assert out.rounds[0].nodes == () and all(r.target_forwards == 1 for r in out.rounds)
        assert max(len(r.nodes) for r in out.rounds) == min(k, 3) if kind == "medusa" else k


def fresh_head_keys(spec, target, context):
    """The keys a freshly loaded head computes from the target's features of `context` (one
    full target forward), pairing f_j with x_{j+1}."""
    proposer = build_proposer(spec)
    layers = proposer.target_features(target)
    with torch.inference_mode():
        states = target(torch.tensor([context]), output_hidden_states=True).hidden_states
        features = torch.cat([states[i][0] for i in layers], dim=-1)[: len(context) - 1]
        nexts = torch.tensor([context[1:]])
        proposer.head.step(features[None], nexts, from_target=True)
    return proposer.head.kvs[0].keys


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "mtp"])
def test_the_head_cache_keeps_only_the_accepted_path(kind, small_vocab_target, tmp_path):
    target = small_vocab_target
    spec = head_spec(kind, tmp_path, target)
    proposer = build_proposer(spec)
    dec = SpeculativeDecoder(target, proposer, k=4, sampling=SamplingConfig(temperature=1.0), seed=5)
    context = list(PROMPT[:5])
    previous_committed, accepted = 0, 0
    for rnd in dec.rounds(context, 60):
        # the cache holds the entries of the previous round's committed positions, built
        # from the target's own features: what a fresh head computes over that prefix
        assert proposer.cache_length == previous_committed
        if proposer.cache_length:
            want = fresh_head_keys(spec, target, context[: proposer.cache_length + 1])
            torch.testing.assert_close(proposer.head.kvs[0].keys, want, rtol=1e-4, atol=1e-5)
        assert rnd.draft_cache.after <= rnd.prefix_len + rnd.accepted
        accepted += rnd.accepted
        previous_committed = rnd.prefix_len + rnd.accepted
        context += rnd.tokens
    assert accepted >= 5, "too few accepted drafts for the test to mean anything"


class FeatureRecorder(DraftModelProposer):
    """A draft model that also names a target layer and records what it is handed."""

    def __init__(self, *args, layers=(0, 2), **kwargs):
        super().__init__(*args, **kwargs)
        self.layers, self.handed = layers, []

    def target_features(self, target):
        return self.layers

    def take_features(self, first_position, features):
        self.handed.append((first_position, features.clone()))


def forward_flags(module):
    """Every output_hidden_states value `module`'s forwards were called with."""
    flags = []
    module.register_forward_pre_hook(
        lambda _m, _a, kw: flags.append(bool(kw.get("output_hidden_states"))), with_kwargs=True
    )
    return flags


def test_features_are_requested_only_when_a_proposer_asks(tmp_path):
    target = tiny_lm("llama", seed=0, init_range=0.3, layers=4, vocab=64)
    draft = noisy_copy(target, 0.3)
    target_flags, draft_flags = forward_flags(target), forward_flags(draft)
    SpeculativeDecoder(target, DraftModelProposer(draft), k=3, sampling=GREEDY).generate(PROMPT, 12)
    assert target_flags and not any(target_flags) and draft_flags and not any(draft_flags)
    target_flags.clear()
    SpeculativeDecoder(target, build_proposer(head_spec("eagle", tmp_path, target)), k=3, sampling=GREEDY).generate(
        PROMPT, 12
    )
    assert target_flags and all(target_flags)


@pytest.mark.parametrize("tree", [None, "3,2"])
def test_the_handed_features_are_the_committed_positions(tree):
    """Contiguous, one hand-over per round (the prefill included), ending at the committed
    length, and equal to a full forward's hidden states at those positions: no rejected
    node's features, no second target pass. (float64: a full forward and the incremental
    ones agree to rounding.)"""
    target = tiny_lm("llama", seed=3, init_range=1.0, layers=4, vocab=8, dtype=torch.float64)
    recorder = FeatureRecorder(noisy_copy(target, 0.5), tree=tree)
    dec = SpeculativeDecoder(target, recorder, k=3, sampling=SamplingConfig(temperature=1.0), seed=2)
    out = dec.generate(PROMPT, 30)
    assert len(recorder.handed) == len(out.rounds)
    end = 0
    for (first, features), rnd in zip(recorder.handed, out.rounds):
        assert first == end and first + features.shape[0] == rnd.prefix_len + rnd.accepted
        end = first + features.shape[0]
    assert any(rnd.accepted for rnd in out.rounds)
    context = PROMPT + out.new_tokens
    with torch.inference_mode():
        states = target(torch.tensor([context]), output_hidden_states=True).hidden_states
    want = torch.stack([states[i][0] for i in recorder.layers], dim=1)[:end]
    got = torch.cat([f for _, f in recorder.handed])
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_a_run_without_target_cache_gives_the_same_output(small_vocab_target, tmp_path):
    target = small_vocab_target
    spec = head_spec("eagle3", tmp_path, target)
    for temperature in (0.0, 1.0):
        cfg = SamplingConfig(temperature=temperature)
        runs = [
            SpeculativeDecoder(target, build_proposer(spec), k=3, sampling=cfg, seed=4, use_cache=cache)
            .generate(PROMPT, 20)
            .new_tokens
            for cache in (True, False)
        ]
        assert runs[0] == runs[1]


def test_eagle3_drafts_only_its_vocabulary_and_reports_q_over_the_target_vocabulary(small_vocab_target, tmp_path):
    target = small_vocab_target
    proposer = build_proposer(head_spec("eagle3", tmp_path, target, draft_vocab=5))
    out = SpeculativeDecoder(target, proposer, k=3, sampling=SamplingConfig(temperature=1.0), vectors="full").generate(
        PROMPT, 20
    )
    allowed = set(proposer.head.draft_to_target.tolist())
    for rnd in out.rounds:
        for node in rnd.nodes:
            assert node.token in allowed
            assert node.q.shape == (8,) and abs(float(node.q.sum()) - 1) < 1e-9
            assert set(node.q.nonzero()[0].tolist()) <= allowed


def test_eagle3_reads_its_configured_layers(small_vocab_target, tmp_path):
    proposer = build_proposer(head_spec("eagle3", tmp_path, small_vocab_target, layers=[0, 1, 3]))
    assert proposer.target_features(small_vocab_target) == (0, 1, 3)
    default = build_proposer(head_spec("eagle3", tmp_path / "d", small_vocab_target))
    assert default.target_features(small_vocab_target) == (2, 2, 1)  # (2, L//2, L-3) for L = 4


@pytest.mark.parametrize(
    "writer, kw",
    [
        (write_eagle, {"file": "model.safetensors", "embedding": True}),
        (write_eagle, {"bias": False}),
        (write_medusa, {"file": "medusa_lm_head.pt", "blocks": 2}),
        (write_mtp, {"copies": True}),
    ],
)
def test_format_variants_load_and_decode(writer, kw, target, tmp_path):
    writer(tmp_path / "h", target, **kw)
    kind = writer.__name__.removeprefix("write_")
    out = SpeculativeDecoder(target, build_proposer(f"{kind}:{tmp_path / 'h'}"), k=3, sampling=GREEDY).generate(
        PROMPT, 16
    )
    assert out.new_tokens == plain_greedy(target, PROMPT, 16)


# ---------------------------------------------------------------------------- refusals


def one_line(exc) -> str:
    text = str(exc.value)
    assert "\n" not in text and "Traceback" not in text
    return text


@pytest.mark.parametrize("kind", sorted(set(WRITERS) - {"eagle3"}))
def test_a_spec_without_a_path_asks_for_a_head_checkpoint(kind):
    with pytest.raises(SpecError) as exc:
        build_proposer(kind)
    assert f"{kind} needs a head checkpoint" in one_line(exc) and "trained head for: eagle3" in one_line(exc)
    assert parse_spec(f"{kind}:/some/folder").arg == "/some/folder"


def test_eagle3_without_a_path_is_the_bundled_targets_head_and_refuses_another_target(target):
    proposer = build_proposer("eagle3")
    assert proposer.spec == "eagle3" and proposer.params() == {"head": "bundled:eagle3-target", "draw": "sampled"}
    with pytest.raises(TargetMismatch) as exc:
        SpeculativeDecoder(target, proposer, k=3)
    assert "the bundled eagle3 head is the bundled target's: for another target write eagle3:PATH" in one_line(exc)


def test_wrong_formats_are_refused_in_one_line(target, tmp_path):
    write_eagle3(tmp_path / "e3", target, draft_vocab=50)
    write_eagle(tmp_path / "e1", target)
    write_medusa(tmp_path / "m", target)
    cases = [
        ("eagle", "e3", "is an EAGLE-3 head"),
        ("eagle3", "e1", "EAGLE-1 head"),
        ("medusa", "e1", "medusa_num_heads"),
        ("mtp", "e1", "num_nextn_predict_layers"),
        ("eagle", "missing", "is not a folder"),
        ("eagle", "m", "config.json lacks hidden_size"),
    ]
    for kind, folder, said in cases:
        with pytest.raises(SpecError) as exc:
            build_proposer(f"{kind}:{tmp_path / folder}")
        assert said in one_line(exc), (kind, folder)


def test_damaged_checkpoints_are_refused_in_one_line(target, tmp_path):
    folder = write_eagle(tmp_path / "e", target, file="model.safetensors")
    (folder / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes()[:100])
    with pytest.raises(SpecError) as exc:
        build_proposer(f"eagle:{folder}")
    assert "cannot read model.safetensors" in one_line(exc)
    from safetensors.torch import load_file, save_file

    folder = write_eagle3(tmp_path / "e3", target, draft_vocab=50)
    weights = load_file(str(folder / "model.safetensors"))
    save_file({k: v for k, v in weights.items() if k != "norm.weight"}, str(folder / "model.safetensors"))
    with pytest.raises(SpecError) as exc:
        build_proposer(f"eagle3:{folder}")
    assert "lacks norm.weight" in one_line(exc)
    weights["d2t"] = torch.zeros_like(weights["d2t"])  # every draft id on itself: disagrees with t2d
    save_file(weights, str(folder / "model.safetensors"))
    with pytest.raises(SpecError) as exc:
        build_proposer(f"eagle3:{folder}")
    assert "t2d and d2t disagree" in one_line(exc)


def test_a_head_for_another_target_is_refused_in_one_line(target, tmp_path):
    other = tiny_lm("llama", seed=1, layers=4, vocab=64, hidden=16)
    wider_vocab = tiny_lm("llama", seed=1, layers=4, vocab=80)
    for kind in sorted(WRITERS):
        spec = head_spec(kind, tmp_path / "h", target)
        for wrong, said in ((other, "hidden size"), (wider_vocab, "vocabulary")):
            with pytest.raises(TargetMismatch) as exc:
                SpeculativeDecoder(wrong, build_proposer(spec), k=3)
            assert said in one_line(exc) or "trained for another model" in one_line(exc), (kind, said)
    with pytest.raises(SettingsError) as exc:
        build_decoder(RunSettings(proposer=f"eagle:{tmp_path / 'h' / 'eagle'}"), Models(target=other))
    assert "hidden size" in one_line(exc)


def test_eagle3_layers_beyond_a_shallow_target_are_refused(tmp_path):
    shallow = tiny_lm("llama", seed=0, layers=2, vocab=64)
    with pytest.raises(TargetMismatch) as exc:
        SpeculativeDecoder(shallow, build_proposer(head_spec("eagle3", tmp_path, shallow)), k=3)
    assert "eagle_aux_hidden_state_layer_ids" in one_line(exc)


def test_the_cli_runs_a_head_spec(tmp_path, capsys):
    target_dir, _ = save_pair(tmp_path)
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(target_dir)
    write_eagle(tmp_path / "head", loaded)
    args = [
        "run",
        "--target",
        str(target_dir),
        "--prompt-ids",
        "1,2,3,4,1,2",
        "--device",
        "cpu",
        "--max-new",
        "12",
        "--json",
        "--temperature",
        "0",
    ]
    assert main(args + ["--proposer", f"eagle:{tmp_path / 'head'}"]) == 0
    head_out = capsys.readouterr().out
    assert main(args + ["--proposer", "lookup"]) == 0
    import json

    assert json.loads(head_out)["new_tokens"] == json.loads(capsys.readouterr().out)["new_tokens"]
    assert main(args + ["--proposer", "medusa"]) != 0
    assert "medusa needs a head checkpoint" in capsys.readouterr().err
    assert main(args + ["--proposer", "eagle3"]) != 0  # the bundled head, for the bundled target only
    assert "for another target write eagle3:PATH" in capsys.readouterr().err


def test_a_proposer_asking_for_a_layer_the_target_lacks_is_refused(small_vocab_target):
    recorder = FeatureRecorder(noisy_copy(small_vocab_target, 0.5), layers=(0, 5))
    with pytest.raises(TargetMismatch) as exc:
        SpeculativeDecoder(small_vocab_target, recorder, k=3)
    assert "hidden states [5] of a target with 4 layers" in one_line(exc)


def test_a_coupled_head_draws_its_drafts_by_the_coupling_keys(small_vocab_target, tmp_path):
    """Coupled lanes (core.verify.coupling): each sampled draft token is the Gumbel argmax of
    its q with the keys of its output position, as the draft model draws, and the lane
    emits what any other coupled lane emits."""
    from specscope.core.verify.coupling import Coupling

    spec = head_spec("eagle3", tmp_path, small_vocab_target)
    cfg = SamplingConfig(temperature=1.0)
    lanes = [
        SpeculativeDecoder(
            small_vocab_target, build_proposer(s), k=3, sampling=cfg, coupling_seed=11, vectors="full"
        ).generate(PROMPT, 24)
        for s in (spec, "lookup")
    ]
    assert lanes[0].new_tokens == lanes[1].new_tokens
    keys, drafted = Coupling(11), 0
    for rnd in lanes[0].rounds:
        for i, node in enumerate(rnd.nodes):
            assert node.token == keys.pick(torch.as_tensor(node.q), rnd.emitted_before + i)
            drafted += 1
    assert drafted >= 10
