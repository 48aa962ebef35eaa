"""EAGLE and Medusa folders in the format vLLM 0.32 loads (tests/core/head_checkpoints.py
writes them tensor by tensor under vLLM's names) load as specscope's eagle:/medusa: heads as
saved: greedy output equals plain greedy decoding, and a Medusa head under vLLM's names drafts
exactly what the same tensors under the Medusa repository's names draft. Flags that disagree
with the weights, and a reduced vocabulary, are refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from specscope.core import SamplingConfig, SpeculativeDecoder
from specscope.core.draft.registry import SpecError, build_proposer
from tests.core.head_checkpoints import write_medusa, write_vllm_eagle, write_vllm_medusa
from tests.tiny_models import tiny_lm

PROMPT = [1, 2, 3, 4, 5, 6, 2, 3]
GREEDY = SamplingConfig(temperature=0)


@pytest.fixture(scope="module")
def target():
    return tiny_lm("llama", seed=0, init_range=0.3, layers=4, vocab=64)


def plain_greedy(target, n):
    return SpeculativeDecoder(target, build_proposer("lookup"), k=1, sampling=GREEDY).generate(PROMPT, n).new_tokens


@pytest.mark.parametrize(
    ("writer", "kw"),
    [
        (write_vllm_eagle, {}),
        (write_vllm_medusa, {}),
        (write_vllm_medusa, {"blocks": 2, "bias": True}),
        (write_vllm_medusa, {"prefix": "medusa_heads."}),
        (write_vllm_medusa, {"blocks": 0}),
        (write_vllm_medusa, {"shared_head": True}),
    ],
)
def test_vllm_format_heads_load_and_decode(writer, kw, target, tmp_path):
    writer(tmp_path / "h", target, **kw)
    kind = writer.__name__.removeprefix("write_vllm_")
    proposer = build_proposer(f"{kind}:{tmp_path / 'h'}")
    out = SpeculativeDecoder(target, proposer, k=3, sampling=GREEDY).generate(PROMPT, 16)
    assert out.new_tokens == plain_greedy(target, 16)
    assert max(len(r.nodes) for r in out.rounds) == 3


def _drafts(spec, target, context):
    proposer = build_proposer(spec)
    proposer.target_features(target)
    with torch.inference_mode():
        states = target(torch.tensor([context]), output_hidden_states=True).hidden_states
    proposer.take_features(0, states[-1][0])
    q = proposer.propose(context + [0], 3, SamplingConfig(temperature=1.0), np.random.default_rng(0)).q
    return proposer.propose(context + [0], 3, GREEDY, np.random.default_rng(0)).tokens, q


def test_vllm_names_are_the_medusa_repositorys_names(target, tmp_path):
    """The same tensors saved under both formats' names draft the same tokens with the same q."""
    write_medusa(tmp_path / "repo", target, heads=3, blocks=2)
    weights = load_file(str(tmp_path / "repo" / "medusa_lm_head.safetensors"))
    renamed = {}
    for name, tensor in weights.items():
        head, block, *rest = name.split(".")
        renamed[f"blocks.{head}.layers.{block}.{rest[-1]}" if rest[0] == "linear" else f"lm_heads.{head}.weight"] = (
            tensor
        )
    folder = tmp_path / "vllm"
    folder.mkdir()
    save_file(renamed, str(folder / "model.safetensors"))
    config = {"num_heads": 3, "num_hidden_layers": 2, "hidden_size": int(weights["0.0.linear.weight"].shape[0])}
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 64, "medusa_fc_bias": True}))
    repo_tokens, repo_q = _drafts(f"medusa:{tmp_path / 'repo'}", target, PROMPT)
    vllm_tokens, vllm_q = _drafts(f"medusa:{folder}", target, PROMPT)
    assert repo_tokens == vllm_tokens and len(repo_tokens) == 3
    assert torch.equal(repo_q, vllm_q)


def test_a_shared_output_layer_is_every_heads(target, tmp_path):
    write_vllm_medusa(tmp_path / "h", target, shared_head=True)
    heads = build_proposer(f"medusa:{tmp_path / 'h'}").heads
    assert all(torch.equal(heads[i][-1].weight, heads[0][-1].weight) for i in range(3))


def one_line(exc) -> str:
    text = str(exc.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_medusa_flags_that_disagree_with_the_weights_are_refused(target, tmp_path):
    folder = write_vllm_medusa(tmp_path / "h", target, bias=True)
    config = json.loads((folder / "config.json").read_text())
    for flag, said in ((False, "medusa_fc_bias=False but the blocks have biases"),):
        (folder / "config.json").write_text(json.dumps({**config, "medusa_fc_bias": flag}))
        with pytest.raises(SpecError) as exc:
            build_proposer(f"medusa:{folder}")
        assert said in one_line(exc)
    folder = write_vllm_medusa(tmp_path / "nb", target)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "medusa_fc_bias": True}))
    with pytest.raises(SpecError) as exc:
        build_proposer(f"medusa:{folder}")
    assert "medusa_fc_bias=True but the blocks lack biases" in one_line(exc)
    (folder / "config.json").write_text(json.dumps({**config, "truncated_vocab_size": 32}))
    with pytest.raises(SpecError) as exc:
        build_proposer(f"medusa:{folder}")
    assert "reduced draft vocabulary" in one_line(exc)
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "num_heads"}))
    with pytest.raises(SpecError) as exc:
        build_proposer(f"medusa:{folder}")
    assert "medusa_num_heads (the Medusa repository's) or num_heads (vLLM's)" in one_line(exc)


def test_an_ernie_target_carries_its_mtp_module(tmp_path):
    """ERNIE-4.5's MTP names in the target's own checkpoint (vLLM's `mtp` reads the same folder):
    specscope's mtp:TARGET loads it (no norm before the output head), greedy output equals
    plain greedy, and the head's first cache entry reads no token embedding (vLLM zeroes it)."""
    from transformers import AutoModelForCausalLM

    from tests.core.head_checkpoints import write_ernie_mtp_target

    folder = write_ernie_mtp_target(tmp_path / "ernie", layers=2, hidden=64, vocab=64)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    proposer = build_proposer(f"mtp:{folder}")
    assert getattr(proposer.head.shared_head, "norm", None) is None
    want = SpeculativeDecoder(model, build_proposer("lookup"), k=1, sampling=GREEDY).generate(PROMPT, 16).new_tokens
    for k in (1, 3):
        out = SpeculativeDecoder(model, build_proposer(f"mtp:{folder}"), k=k, sampling=GREEDY).generate(PROMPT, 16)
        assert out.new_tokens == want and max(len(r.nodes) for r in out.rounds) == k
    head = build_proposer(f"mtp:{folder}").head
    head.attach(model)
    with torch.inference_mode():
        feature = torch.randn(1, 1, 64)
        a = head.step(feature, torch.tensor([[5]]), from_target=True)
        head.reset()
        b = head.step(feature, torch.tensor([[9]]), from_target=True)
    assert torch.equal(a, b)  # position 0: the token is not read


def test_the_settings_check_reads_vllms_head_count(target, tmp_path):
    from specscope.core.draft.registry import KINDS, parse_spec

    write_vllm_medusa(tmp_path / "m", target, heads=2)
    with pytest.raises(SpecError) as exc:
        KINDS["medusa"].check(parse_spec(f"medusa:{tmp_path / 'm'},tree=3,2,1"))
    assert "this checkpoint has 2" in one_line(exc)
