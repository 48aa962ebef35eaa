"""GGUF files anywhere a checkpoint is accepted: converted once, cached by SHA-256, decoded
exactly; files that cannot be decoded refused in one line."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("gguf")

from specscope.core import PromptLookupProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.loading import CheckpointError, gguf, load_models, load_tokenizer
from tests.gguf_files import write_tiny_llama, write_unsupported


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECSCOPE_CACHE", str(root))
        yield root


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory, cache):
    return write_tiny_llama(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def converted(tiny_gguf, cache):
    messages = []
    folder = gguf.converted_checkpoint(tiny_gguf, messages.append)
    return folder, messages


def test_a_gguf_file_is_converted_into_the_cache_once_with_progress(converted, tiny_gguf, cache, monkeypatch):
    folder, messages = converted
    assert folder.parent == cache / "gguf" and folder.name == gguf.file_sha256(tiny_gguf)
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    assert gguf.conversion_info(folder)["architecture"] == "llama"
    assert any("dequantising" in m for m in messages) and any("checksum" in m for m in messages)
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no half-written folder left

    def no_second_conversion(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf, "_convert", no_second_conversion)
    assert gguf.converted_checkpoint(tiny_gguf) == folder


def test_greedy_decoding_of_a_gguf_equals_transformers_generate_on_the_same_file(converted, tiny_gguf):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    pair = load_models(target=str(tiny_gguf), draft=None, device="cpu")
    assert pair.tokenizer is not None and pair.target.config.vocab_size == 265
    prompt = pair.tokenizer.encode("the thin air in the thin")
    decoder = SpeculativeDecoder(
        pair.target, PromptLookupProposer(max_ngram=2), k=3, sampling=SamplingConfig(temperature=0.0)
    )
    ours = decoder.generate(prompt, 24).new_tokens

    reference = AutoModelForCausalLM.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name, dtype=torch.float32)
    out = reference.generate(
        torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    assert ours == out[0, len(prompt) :].tolist()


def test_the_tokenizer_comes_from_the_gguf_metadata(converted, tiny_gguf):
    tok = load_tokenizer(tiny_gguf)
    ids = tok.encode("the thin<|endoftext|>")
    assert ids[-1] == tok.convert_tokens_to_ids("<|endoftext|>") and tok.decode(ids) == "the thin<|endoftext|>"


def test_a_truncated_gguf_is_refused_in_one_line(tiny_gguf, tmp_path, cache):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[: tiny_gguf.stat().st_size // 3])
    with pytest.raises(CheckpointError, match="truncated or corrupt") as err:
        load_models(target=str(cut), draft=None, device="cpu")
    assert "\n" not in str(err.value)
    assert not [p for p in (cache / "gguf").iterdir() if p.name.startswith(".")]


def test_an_architecture_transformers_cannot_read_is_refused_naming_it(tmp_path, cache):
    path = write_unsupported(tmp_path / "bert.gguf")
    with pytest.raises(CheckpointError, match="cannot read GGUF architecture 'bert'") as err:
        load_models(target=str(path), draft=None, device="cpu")
    assert "\n" not in str(err.value)


def test_a_file_named_gguf_that_is_not_one_is_refused(tmp_path, cache):
    fake = tmp_path / "fake.gguf"
    fake.write_text("not a model")
    with pytest.raises(CheckpointError, match="not a GGUF file"):
        load_models(target=str(fake), draft=None, device="cpu")


def test_a_draft_whose_gguf_tokenizer_differs_from_the_targets_is_refused(
    tiny_gguf, converted, tmp_path, cache, monkeypatch
):
    from tests import gguf_files

    tokens, types, merges = gguf_files.tokenizer_metadata()
    monkeypatch.setattr(
        gguf_files, "tokenizer_metadata", lambda: (tokens, types, merges[::-1])
    )  # the same tokens, merged in another order
    other = gguf_files.write_tiny_llama(tmp_path / "other.gguf", seed=1)
    with pytest.raises(ValueError, match="tokenizers differ"):
        load_models(target=str(tiny_gguf), draft=str(other), device="cpu")


def test_dequantising_reports_progress_lines_not_transformers_bar(tmp_path, cache, capfd):
    """transformers' own tqdm bar wrote one carriage-returned line per tensor into the
    CLI's output; the conversion reports quarters through specscope's progress instead."""
    path = write_tiny_llama(tmp_path / "other.gguf", seed=7)
    messages = []
    gguf.converted_checkpoint(path, messages.append)
    quarters = [m for m in messages if m.startswith("dequantising:")]
    assert quarters and quarters[-1].startswith("dequantising: 100% of")
    assert "Converting and de-quantizing" not in capfd.readouterr().err
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    assert gguf_utils.tqdm.__module__.startswith("tqdm")  # put back afterwards
