"""Run settings validation: every bad field gets its own message (no Qt needed)."""

from specscope.app.gui.model.settings import PanelSettings, validate


def texts(**over):
    base = PanelSettings(prompt="hello").to_texts()
    base.update(over)
    return base


def test_defaults_are_valid():
    v = validate(texts())
    assert v.ok, v.errors
    assert v.settings.k == "auto" and v.settings.greedy  # the window's default: k chosen by cost


def test_each_bad_field_is_explained():
    v = validate(
        texts(
            prompt="  ",
            k="zero",
            temperature="-1",
            top_k="-3",
            top_p="1.5",
            seed="x",
            max_new_tokens="0",
            eos="abc",
            device="tpu",
        )
    )
    assert not v.ok and v.settings is None
    assert set(v.errors) == {"prompt", "k", "temperature", "top_k", "top_p", "seed", "max_new_tokens", "eos", "device"}
    assert "empty" in v.errors["prompt"]
    assert "whole number" in v.errors["k"]
    assert "(0, 1]" in v.errors["top_p"]
    assert "not available" in v.errors["device"]


def test_k_range_and_eos_forms():
    assert validate(texts(k="64")).ok
    assert "at most 4096" in validate(texts(k="4097")).errors["k"]
    assert validate(texts(eos="none")).settings.eos_disabled
    assert validate(texts(eos="auto")).settings.eos is None
    assert validate(texts(eos="7")).settings.eos == 7
    assert "EOS" in validate(texts(eos="99"), vocab_size=64).errors["eos"]


def test_checkpoint_must_be_a_model_folder(tmp_path):
    v = validate(texts(proposer="checkpoint", checkpoint=str(tmp_path / "nope")))
    assert "no such folder" in v.errors["checkpoint"]
    v = validate(texts(proposer="checkpoint", checkpoint=str(tmp_path)))
    assert "config.json" in v.errors["checkpoint"]


def test_a_gguf_file_is_a_checkpoint_and_another_file_is_not(tmp_path):
    gguf = tmp_path / "draft.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))  # the magic bytes are what the field checks; the loader reads the rest
    v = validate(texts(proposer="checkpoint", checkpoint=str(gguf)))
    assert "checkpoint" not in v.errors
    other = tmp_path / "weights.bin"
    other.write_bytes(b"not a model")
    v = validate(texts(proposer="checkpoint", checkpoint=str(other)))
    assert "not a GGUF file" in v.errors["checkpoint"]


def test_chat_system_stops_and_several_eos_ids_round_trip():
    v = validate(texts(chat="on", system="Be brief.", stop_strings="\\n\\nEnd\nstop", stop_ids="1,2,3; 7", eos="2,107"))
    assert v.ok, v.errors
    s = v.settings
    assert s.chat and s.system == "Be brief." and s.eos == (2, 107)
    assert s.stop_strings == ("\n\nEnd", "stop") and s.stop_ids == ((1, 2, 3), (7,))
    assert validate(s.to_texts()).settings == s  # the panel's texts give back the same settings
    assert validate(texts(system="x")).settings.system is None  # the system text counts only with chat on


def test_bad_stop_sequences_are_explained():
    v = validate(texts(stop_ids="1,,2"))
    assert not v.ok and "stop token sequences" in v.errors["stop_ids"]
    assert "EOS" in validate(texts(eos="2,x")).errors["eos"]
