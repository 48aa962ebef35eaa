"""The folders `--engine vllm` hands to vLLM: a shipped head by its name, as the specscope engine
takes it (`--target smollm2 --proposer eagle3` failed: "eagle3-smollm2 does not exist")."""

from __future__ import annotations

import pytest

from specscope.core.engines.vllm.engine import VllmEngineError, checkpoint_folder
from specscope.core.loading.models import bundled_head_path, bundled_path


@pytest.mark.parametrize("name", ["eagle3-smollm2", "bundled:eagle3-smollm2", "eagle3-target"])
def test_a_shipped_head_is_found_by_its_name(name):
    folder = checkpoint_folder(name, "draft")
    assert folder == bundled_head_path(name.removeprefix("bundled:"))
    assert (folder / "config.json").is_file()


def test_bundled_models_and_missing_folders():
    assert checkpoint_folder(None, "target") == bundled_path("target")
    assert checkpoint_folder("small", "draft") == bundled_path("draft-small")
    with pytest.raises(VllmEngineError):
        checkpoint_folder("/no/such/folder", "draft")


def test_a_folder_named_like_a_head_in_the_working_directory_is_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "eagle3-smollm2").mkdir()  # an empty folder: refused as a checkpoint, not swapped for the head
    with pytest.raises(VllmEngineError):
        checkpoint_folder("eagle3-smollm2", "draft")
