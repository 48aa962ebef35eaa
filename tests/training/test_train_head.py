"""training/train_head.py: its --smoke run writes an EAGLE-3 head that loads through the
proposer registry and decodes exactly, and its training unroll is the serving computation."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from tests.training.scripts import load_script


def _module():
    return load_script("train_head", "specscope_train_head")


@pytest.fixture(scope="module")
def train_head():
    return _module()


@pytest.fixture(scope="module")
def target():
    from specscope.core.loading import bundled_path, load_model

    return load_model(bundled_path("target"), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def smoke_head(train_head, tmp_path_factory):
    out = tmp_path_factory.mktemp("head") / "eagle3"
    summary = train_head.main(["--smoke", "--out", str(out), "--threads", "1"])
    return out, summary


def test_the_smoke_head_records_its_accuracy_and_is_stored_small(smoke_head, train_head):
    out, summary = smoke_head
    config = json.loads((out / "config.json").read_text())
    depth = train_head.SMOKE.depth
    record = config["specscope"]
    assert len(record["accuracy_by_depth"]) == depth and all(0 <= a <= 1 for a in record["accuracy_by_depth"])
    assert set(record["heldout"]) == {"text", "greedy", "sampled"}
    assert 1.0 <= record["heldout"]["greedy"]["accepted_length"] <= 1 + depth
    assert config["draft_vocab_size"] == train_head.SMOKE.draft_vocab < config["vocab_size"]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 7]  # (2, L // 2, L - 1), L = 8
    assert record["target"] == "specscope/target"  # the bundled target by name, not this machine's path
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        dtypes = {name: f.get_tensor(name).dtype for name in list(f.keys())}
    assert dtypes.pop("d2t") == torch.int64 and dtypes.pop("t2d") == torch.bool
    assert set(dtypes.values()) == {torch.bfloat16} and "embed_tokens.weight" not in dtypes  # the target's is shared
    assert "step 40: held-out" in (out / "train_log.txt").read_text()
    assert summary["evals"][-1]["step"] == train_head.SMOKE.steps


def test_the_smoke_head_decodes_exactly_through_the_registry(smoke_head, target):
    from specscope.core import SamplingConfig, SpeculativeDecoder
    from specscope.core.decode.baseline import plain_generate
    from specscope.core.draft.registry import build_proposer
    from specscope.core.loading import bundled_path, load_tokenizer

    out, _ = smoke_head
    greedy = SamplingConfig(temperature=0)
    prompt = load_tokenizer(bundled_path("target"))("def parse(text):\n    ", add_special_tokens=False)["input_ids"]
    want = plain_generate(target, prompt, 32, greedy, None).new_tokens
    proposer = build_proposer(f"eagle3:{out}")
    result = SpeculativeDecoder(target, proposer, k=4, sampling=greedy).generate(prompt, 32)
    assert result.new_tokens == want
    assert all(r.target_forwards == 1 for r in result.rounds)
    assert any(len(r.nodes) == 4 for r in result.rounds)  # it drafted (the prefill round drafts nothing)


def test_init_continues_from_a_head_with_its_weights_and_vocabulary(smoke_head, train_head, tmp_path):
    """--init starts from the saved head: with no step taken the written head is the same head,
    and a head for other layers is refused in one line."""
    out, _ = smoke_head
    again = tmp_path / "again"
    summary = train_head.main(["--smoke", "--out", str(again), "--threads", "1", "--init", str(out), "--steps", "0"])
    with safe_open(str(out / "model.safetensors"), "pt") as a, safe_open(str(again / "model.safetensors"), "pt") as b:
        names = set(a.keys())
        assert names == set(b.keys())
        for name in names:
            assert torch.equal(a.get_tensor(name), b.get_tensor(name)), name
    assert summary["evals"][-1]["step"] == 0
    assert "continuing from" in (again / "train_log.txt").read_text()
    # a continued run measures its starting point first: step 0, the loaded head on the held-out sets
    stepped = train_head.main(
        ["--smoke", "--out", str(tmp_path / "one"), "--threads", "1", "--init", str(out), "--steps", "1"]
    )
    assert [e["step"] for e in stepped["evals"]] == [0, 1]
    assert stepped["evals"][0]["all"] == summary["evals"][-1]["all"]
    with pytest.raises(SystemExit, match="reads layers"):
        train_head.main(["--smoke", "--out", str(tmp_path / "other"), "--init", str(out), "--layers", "1,4,7"])


def test_the_training_unroll_is_the_serving_computation(train_head, target):
    """Depth s of the unroll for anchor j equals the serving head after j + 1 real entries and
    s draft steps fed the true tokens: the train/serve mismatch of EAGLE #264 cannot hide here."""
    torch.manual_seed(0)
    layers = (2, 4, 7)
    config = train_head.head_config(target, train_head.SMOKE, layers, 512)
    head = train_head.new_head(target, config, torch.sort(torch.randperm(4096)[:512]).values).eval()
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        x = torch.randint(1, 4096, (2, 16))
        states = target(input_ids=x, output_hidden_states=True).hidden_states
        features = torch.stack([states[i] for i in layers], dim=2).flatten(2)
        outs = train_head.unroll(head, target.get_input_embeddings(), features, x, 4)
        for row, j in ((0, 5), (1, 10)):
            head.reset()
            h = head.step(features[row : row + 1, : j + 1], x[row : row + 1, 1 : j + 2], from_target=True)[0, -1]
            torch.testing.assert_close(h, outs[0][row, j], atol=1e-4, rtol=1e-4)
            for s in range(1, 4):
                h = head.step(h[None, None], x[row : row + 1, j + s + 1 : j + s + 2], from_target=False)[0, -1]
                torch.testing.assert_close(h, outs[s][row, j], atol=1e-4, rtol=1e-4)


def test_coarse_kl_is_zero_for_the_target_itself_and_positive_otherwise(train_head):
    to_draft = torch.tensor([0, 1, 2, 3, -1, -1, 4, 5])  # 8 target ids, 6 in the draft vocabulary
    log_q = torch.log_softmax(torch.tensor([[3.0, 1.0, 0.5, -1.0, 0.0, 0.2]]), dim=-1)
    top = torch.tensor([[0, 1, 2]])  # target ids 0, 1, 2 are draft ids 0, 1, 2
    same = train_head.coarse_kl(log_q, top, log_q[:, :3], to_draft)
    other = train_head.coarse_kl(log_q.flip(-1), top, log_q[:, :3], to_draft)
    assert float(same) == pytest.approx(0.0, abs=1e-6) and float(other) > 0.1
    outside = train_head.coarse_kl(log_q, torch.tensor([[0, 4]]), torch.log(torch.tensor([[0.5, 0.4]])), to_draft)
    assert torch.isfinite(outside).all()  # a top token the head cannot draft goes to the rest bucket


def test_a_prompt_as_long_as_the_sequence_is_refused_before_the_target_runs(train_head, tmp_path):
    with pytest.raises(SystemExit, match="--gen-prompt-len 64 must be between 1 and --seq-len 64"):
        train_head.main(["--smoke", "--out", str(tmp_path / "h"), "--seq-len", "64", "--gen-prompt-len", "64"])
    assert not (tmp_path / "h" / "train_log.txt").exists()
