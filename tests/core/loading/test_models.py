"""specscope.core.loading.models: bundled models offline, local pairs by path, the tokenizer contract."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specscope.core.loading import models as loading
from specscope.core.loading.models import (
    CheckpointError,
    check_tokenizers,
    example_prompts,
    load_bundled,
    load_models,
    load_pair,
    resolve_device,
    resolve_dtype,
)


@pytest.fixture
def offline(monkeypatch):
    """No network at all: any socket connection fails, and the Hub is told it is offline."""

    def refuse(*args, **kwargs):
        raise OSError("network access during a test that must run offline")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def small_pair():
    return load_bundled("small", device="cpu")


@pytest.fixture(scope="module")
def bundled_tokenizer():
    return loading.load_tokenizer(loading.bundled_path("tokenizer"))


def _tokenizer_from_json(data: dict, **special) -> PreTrainedTokenizerFast:
    kwargs = dict(
        eos_token="<|endoftext|>", bos_token="<|endoftext|>", unk_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    kwargs.update(special)
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(data)), **kwargs)


def _tokens_at(vocab: dict, *fractions: float) -> tuple[str, ...]:
    """Ordinary (merged, non-special) tokens at given fractions of the id range, in id order."""
    by_id = {i: t for t, i in vocab.items()}
    return tuple(by_id[int(f * (len(by_id) - 1))] for f in fractions)


@pytest.fixture(scope="module")
def tokenizer_json():
    return json.loads((loading.bundled_path("tokenizer") / "tokenizer.json").read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------- bundled


def test_bundled_small_loads_offline_upcast_to_float32(offline):
    pair = load_bundled("small", device="cpu")
    assert pair.target_name == "specscope/target" and pair.draft_name == "specscope/draft-small"
    assert pair.model is pair.draft
    for model in (pair.target, pair.draft):
        assert {p.dtype for p in model.parameters()} == {torch.float32}  # stored bf16, upcast on load
        assert not model.training
    assert pair.tokenizer.eos_token == "<|endoftext|>"
    assert pair.eos_token_id == pair.tokenizer.eos_token_id
    ids = pair.tokenizer("def main():\n    return 0\n", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        lt = pair.target(input_ids=torch.tensor([ids])).logits
        ld = pair.draft(input_ids=torch.tensor([ids])).logits
    assert lt.shape == ld.shape and lt.shape[-1] == len(pair.tokenizer)
    assert torch.isfinite(lt).all() and torch.isfinite(ld).all()
    info = pair.model_info()
    assert info["target_hash"] and info["draft_hash"] and info["tokenizer_hash"]


def test_bundled_tiny_and_target_alone(offline):
    tiny = load_bundled("draft-tiny", device="cpu")
    assert tiny.draft_name == "specscope/draft-tiny"
    n_tiny = sum(p.numel() for p in tiny.draft.parameters())
    n_target = sum(p.numel() for p in tiny.target.parameters())
    assert n_tiny * 10 < n_target
    alone = load_bundled("target", device="cpu")
    assert alone.draft is None and alone.model is alone.target


def test_bundled_weights_fit_the_budget():
    """The bundled target, its drafts and its EAGLE-3 head (issue 30) within 30 MB, the head
    within 5 MB of it; the SmolLM2 draft (issue 29) within 25 MB on its own, tokenizer and
    log included; the SmolLM2 EAGLE-3 head within 25 MB of weights."""
    weights = {p.parent.name: p.stat().st_size for p in loading.models_dir().glob("*/*.safetensors")}
    real = loading.BUNDLED_REAL_DRAFTS + loading.BUNDLED_REAL_HEADS
    toy = sum(size for name, size in weights.items() if name not in real)
    assert all(0 < weights[head] <= 25_000_000 for head in loading.BUNDLED_REAL_HEADS)
    assert {"target", "draft-small", "draft-tiny", *loading.BUNDLED_HEADS} <= set(weights)
    assert 0 < toy <= 30_000_000
    assert all(0 < weights[head] <= 5_000_000 for head in loading.BUNDLED_HEADS)
    for name in loading.BUNDLED_REAL_DRAFTS:
        folder = loading.models_dir() / name
        assert 0 < sum(p.stat().st_size for p in folder.iterdir()) <= 25 * 2**20, name


def test_bundled_dtype_can_be_asked_for():
    pair = load_bundled("tiny", device="cpu", dtype="bfloat16")
    assert next(pair.draft.parameters()).dtype == torch.bfloat16


def test_load_models_resolves_cli_flags(small_pair):
    pair = load_models(target=None, draft="tiny", device="cpu")
    assert pair.draft_name == "specscope/draft-tiny" and pair.target_name == "specscope/target"
    alone = load_models(target="specscope/target", draft=None, device="cpu")
    assert alone.draft is None
    by_path = load_models(
        target=str(loading.bundled_path("target")), draft=str(loading.bundled_path("small")), device="cpu"
    )
    assert by_path.target_path == loading.bundled_path("target").resolve()


def test_unknown_bundled_name():
    with pytest.raises(ValueError, match="unknown bundled model 'medium'"):
        load_bundled("medium")


def test_bundled_pair_runs_in_the_decoder(small_pair):
    from specscope.core import DraftModelProposer, SpeculativeDecoder

    pair = small_pair
    prompt = pair.tokenizer("import os\n\n\ndef main():\n", add_special_tokens=False)["input_ids"]
    dec = SpeculativeDecoder(
        pair.target,
        DraftModelProposer(pair.draft, label=pair.draft_name),
        k=3,
        eos_token_id=pair.eos_token_id,
        target_name=pair.target_name,
    )
    result = dec.generate(prompt, max_new_tokens=12)
    assert 1 <= len(result.new_tokens) <= 12
    assert result.config.target_name == "specscope/target"


# ---------------------------------------------------------------------------- device / dtype


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type in ("cpu", "cuda")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device("tpu")


def test_resolve_dtype():
    assert resolve_dtype(None) is torch.float32
    assert resolve_dtype("bf16") is torch.bfloat16
    assert resolve_dtype(torch.float16) is torch.float16
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("int4")


# ---------------------------------------------------------------------------- tokenizer contract


def test_identical_tokenizers_pass(bundled_tokenizer, tokenizer_json):
    check_tokenizers(bundled_tokenizer, _tokenizer_from_json(tokenizer_json))


def test_swapped_token_is_named(tokenizer_json, bundled_tokenizer):
    data = json.loads(json.dumps(tokenizer_json))
    vocab = data["model"]["vocab"]
    a, b = _tokens_at(vocab, 0.5, 0.75)
    vocab[a], vocab[b] = vocab[b], vocab[a]
    swapped = _tokenizer_from_json(data)
    assert len(swapped) == len(bundled_tokenizer)  # equal vocabulary size is not enough
    with pytest.raises(
        ValueError, match=rf"token {re.escape(repr(a))} has id \d+ in the target tokenizer but id \d+ in the draft"
    ):
        check_tokenizers(bundled_tokenizer, swapped)


def test_different_special_token_is_named(tokenizer_json, bundled_tokenizer):
    (plain,) = _tokens_at(tokenizer_json["model"]["vocab"], 0.6)
    other = _tokenizer_from_json(tokenizer_json, pad_token=plain)
    assert other.get_vocab() == bundled_tokenizer.get_vocab()
    with pytest.raises(
        ValueError, match=re.escape(f"special token pad_token: '<|endoftext|>' in the target tokenizer vs {plain!r}")
    ):
        check_tokenizers(bundled_tokenizer, other)


def test_different_pre_tokenizer_is_named(tokenizer_json, bundled_tokenizer):
    data = json.loads(json.dumps(tokenizer_json))
    data["pre_tokenizer"]["add_prefix_space"] = True
    with pytest.raises(ValueError, match=r"pre_tokenizer differs .* at pre_tokenizer.add_prefix_space: false vs true"):
        check_tokenizers(bundled_tokenizer, _tokenizer_from_json(data))


def test_different_merges_are_named(tokenizer_json, bundled_tokenizer):
    data = json.loads(json.dumps(tokenizer_json))
    merges = data["model"]["merges"]
    merges[0], merges[1] = merges[1], merges[0]
    with pytest.raises(ValueError, match=r"model differs .* at model.merges\[0\]"):
        check_tokenizers(bundled_tokenizer, _tokenizer_from_json(data))


def test_a_normalizer_that_changes_text_as_given_is_refused(tokenizer_json, bundled_tokenizer):
    data = json.loads(json.dumps(tokenizer_json))
    data["normalizer"] = {"type": "Lowercase"}
    with pytest.raises(ValueError, match=r"normalizer differs .* normalizes to .*; a draft must share"):
        check_tokenizers(bundled_tokenizer, _tokenizer_from_json(data))
    data["normalizer"] = {"type": "NFKC"}  # ligatures, fractions, full-width letters: NFC text changes
    with pytest.raises(ValueError, match=r"normalizer differs .* normalizes to "):
        check_tokenizers(bundled_tokenizer, _tokenizer_from_json(data))


def test_an_nfc_normalizer_alone_is_a_warning(tokenizer_json, bundled_tokenizer, caplog):
    data = json.loads(json.dumps(tokenizer_json))
    data["normalizer"] = {"type": "NFC"}
    nfc = _tokenizer_from_json(data)
    with caplog.at_level("WARNING"):
        warnings = check_tokenizers(bundled_tokenizer, nfc)
    assert len(warnings) == 1 and "normalizer differs" in warnings[0] and '{"type": "NFC"}' in warnings[0]
    assert "NFC" in caplog.text
    assert loading.tokenizer_difference(nfc, bundled_tokenizer, ("a", "b")) is None
    for text in loading.PROBE_TEXTS:  # what makes it harmless: text as given encodes alike
        assert nfc.encode(text) == bundled_tokenizer.encode(text)


def _shared_tokenizer_pair(root: Path, tokenizer_json: dict) -> tuple[Path, Path]:
    """A tiny Qwen2 target and a tiny Llama draft, each folder with the same tokenizer files
    (no tokenizer_class: each model class picks its own tokenizer class)."""
    from tests.tiny_models import tiny_lm

    config = json.loads((loading.bundled_path("tokenizer") / "tokenizer_config.json").read_text())
    config.pop("tokenizer_class")
    config.pop("backend", None)
    folders = []
    for arch in ("qwen2", "llama"):
        folder = root / arch
        tiny_lm(arch, vocab=len(tokenizer_json["model"]["vocab"])).save_pretrained(folder)
        (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json))
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
        folders.append(folder)
    return folders[0], folders[1]


def test_a_qwen2_target_and_a_llama_draft_sharing_a_tokenizer_pair(tmp_path, tokenizer_json, caplog):
    """Issue 43: the Qwen2 class adds an NFC normalizer (and its own pre-tokenizer) to a
    tokenizer.json that has none; the Llama class keeps the file as it is. With Qwen2's
    pre-tokenizer in the file, NFC is the only difference: it changes no id of text as given."""
    qwen2_split = json.loads(
        loading.load_tokenizer(_shared_tokenizer_pair(tmp_path / "probe", tokenizer_json)[0]).backend_tokenizer.to_str()
    )["pre_tokenizer"]
    data = json.loads(json.dumps(tokenizer_json))
    data["pre_tokenizer"] = qwen2_split
    target, draft = _shared_tokenizer_pair(tmp_path / "shared", data)
    tok_t, tok_d = loading.load_tokenizer(target), loading.load_tokenizer(draft)
    assert type(tok_t).__name__ != type(tok_d).__name__
    assert tok_t.backend_tokenizer.normalizer is not None and tok_d.backend_tokenizer.normalizer is None
    with caplog.at_level("WARNING"):
        pair = load_pair(target, draft, device="cpu")
    assert pair.draft is not None
    assert "tokenizers differ harmlessly: normalizer differs" in caplog.text
    prompt = "Café: It's 2024 ½ 中文 🙂"
    assert tok_t.encode(prompt) == tok_d.encode(prompt)


def test_a_model_class_that_changes_ids_is_still_refused(tmp_path, tokenizer_json):
    """The bundled tokenizer.json splits text with GPT-2's rule; the Qwen2 class replaces it with
    its own (digits one by one): the same files give different ids, so the pair is refused."""
    target, draft = _shared_tokenizer_pair(tmp_path, tokenizer_json)
    with pytest.raises(
        ValueError,
        match=r"pre_tokenizer differs \(target vs draft\).* encodes to .* in the target "
        r"tokenizer vs .* in the draft; a draft must share",
    ):
        load_pair(target, draft, device="cpu")


# ---------------------------------------------------------------------------- local pairs


def _save_random_pair(root: Path, tokenizer, draft_tokenizer=None) -> tuple[Path, Path]:
    vocab = len(tokenizer)
    torch.manual_seed(0)
    for name, layers, hidden in (("target", 2, 32), ("draft", 1, 16)):
        cfg = LlamaConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=128,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.eos_token_id,
        )
        LlamaForCausalLM(cfg).save_pretrained(root / name)
    tokenizer.save_pretrained(root / "target")
    (draft_tokenizer or tokenizer).save_pretrained(root / "draft")
    return root / "target", root / "draft"


def test_random_local_pair_loads_by_path(tmp_path, bundled_tokenizer, offline):
    t, d = _save_random_pair(tmp_path, bundled_tokenizer)
    pair = load_pair(t, d, device="cpu")
    assert pair.target_name == str(t.resolve()) and pair.draft_name == str(d.resolve())
    assert pair.target.config.num_hidden_layers == 2 and pair.draft.config.num_hidden_layers == 1
    assert next(pair.target.parameters()).dtype == torch.float32
    assert len(pair.tokenizer) == len(bundled_tokenizer)
    same = load_models(target=str(t), draft=str(d), device="cpu")
    assert same.draft_path == d.resolve()


def test_local_pair_with_mismatched_tokenizer_is_refused(tmp_path, bundled_tokenizer, tokenizer_json):
    data = json.loads(json.dumps(tokenizer_json))
    vocab = data["model"]["vocab"]
    a, b = _tokens_at(vocab, 0.3, 0.4)
    vocab[a], vocab[b] = vocab[b], vocab[a]
    t, d = _save_random_pair(tmp_path, bundled_tokenizer, _tokenizer_from_json(data))
    with pytest.raises(ValueError, match=rf"tokenizers differ: token {re.escape(repr(a))} has id"):
        load_pair(t, d, device="cpu")


def test_bad_paths_give_clear_errors(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(CheckpointError, match=r"target checkpoint not found: .*nope does not exist"):
        load_pair(missing)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match=r"has no config\.json"):
        load_pair(empty)
    a_file = tmp_path / "weights.bin"
    a_file.write_bytes(b"x")
    with pytest.raises(CheckpointError, match="is a file"):
        load_models(target=str(loading.bundled_path("target")), draft=str(a_file))
    no_weights = tmp_path / "cfg_only"
    no_weights.mkdir()
    (no_weights / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="no weights"):
        load_pair(no_weights)


# ---------------------------------------------------------------------------- prompts, purity


def test_example_prompts(bundled_tokenizer):
    prompts = example_prompts()
    assert len(prompts) >= 4
    assert {"copy", "novel"} <= {p.kind for p in prompts}
    assert [p.name for p in example_prompts("copy")] and all(p.kind == "copy" for p in example_prompts("copy"))
    for p in prompts:
        n = len(bundled_tokenizer(p.text, add_special_tokens=False)["input_ids"])
        assert 10 < n <= 384, (p.name, n)
    assert loading.example_prompt(prompts[0].name).text == prompts[0].text
    with pytest.raises(KeyError, match="no example prompt"):
        loading.example_prompt("missing")


def test_loading_stays_pure():
    code = (
        "import sys, specscope.core.loading.models as l; l.example_prompts(); "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('PySide6', 'sqlalchemy', 'pyqtgraph', 'sqlite3')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
