"""A named target knows its own draft head as it knows its default draft (catalog
default_heads): `--target smollm2 --proposer eagle3` drafts with resources/models/eagle3-smollm2,
`--proposer eagle3` with the bundled target still with eagle3-target, and a shipped head that
does not fit a target is refused with whose head it is. No SmolLM2 needed: the catalog logic and
the shipped head's files."""

from __future__ import annotations

import json

import pytest

from specscope.core.draft.proposers import TargetMismatch
from specscope.core.draft.registry import build_proposer, for_target
from specscope.core.loading import BUNDLED_REAL_HEADS, bundled_head_path, bundled_path, catalog, load_model

TREE = "dynamic:nodes=16,depth=5,topk=4"


def _run_spec(argv: list[str]):
    from specscope.app.cli.entry import build_parser
    from specscope.app.cli.run import run_spec

    return run_spec(build_parser(argv).parse_args(argv))


def test_a_named_target_resolves_a_bare_head_kind_to_its_own_head():
    assert catalog.default_head("smollm2", "eagle3") == "eagle3-smollm2" in BUNDLED_REAL_HEADS
    assert catalog.default_head("smollm2", "medusa") is None and catalog.default_head(None, "eagle3") is None
    assert str(for_target("eagle3", "smollm2")) == "eagle3:eagle3-smollm2"
    tree = for_target(f"eagle3,tree={TREE}", "smollm2")
    assert (tree.arg, tree.params["tree"]) == ("eagle3-smollm2", TREE)
    assert str(for_target("eagle3", None)) == "eagle3" and str(for_target("eagle3", "gemma3-270m")) == "eagle3"
    assert for_target("eagle3:/some/head", "smollm2").arg == "/some/head"  # a named checkpoint stays
    assert str(for_target("draft", "smollm2")) == "draft" and str(for_target("lookup", "smollm2")) == "lookup"


def test_the_run_command_reads_eagle3_alone_by_its_target():
    assert str(_run_spec(["run", "--target", "smollm2", "--chat", "--proposer", "eagle3"])) == "eagle3:eagle3-smollm2"
    tree = _run_spec(["run", "--target", "smollm2", "--proposer", "eagle3", "--tree", TREE])
    assert (tree.arg, tree.params["tree"]) == ("eagle3-smollm2", TREE)
    assert _run_spec(["run", "--proposer", "eagle3"]).arg is None  # the bundled target: its own eagle3-target
    assert _run_spec(["run", "--target", "smollm2", "--proposer", "eagle3:/a/head"]).arg == "/a/head"


def test_the_shipped_smollm2_head_loads_by_name_and_refuses_the_bundled_target():
    folder = bundled_head_path("eagle3-smollm2")
    config = json.loads((folder / "config.json").read_text())
    assert config["specscope"]["target"] == "smollm2" and config["vocab_size"] == 49_152
    assert 0 < (folder / "model.safetensors").stat().st_size <= 25_000_000
    proposer = build_proposer("eagle3:eagle3-smollm2")
    assert proposer.label == "bundled:eagle3-smollm2"
    bundled_target = load_model(bundled_path("target"), device="cpu", dtype="float32")
    with pytest.raises(TargetMismatch, match="eagle3-smollm2 is smollm2's"):
        proposer.target_features(bundled_target)
    build_proposer("eagle3").target_features(bundled_target)  # the bundled target's own head still fits


def test_the_factory_resolves_eagle3_alone_by_the_loaded_target_for_every_front_end():
    """The window, the CLI and the bench build decoders through core.decode.factory: `eagle3`
    alone there means the loaded target's own head, so a run on SmolLM2 picked in the window
    drafts with eagle3-smollm2 (here a target that is not SmolLM2 but carries its name is
    refused with the words of that head), and the bundled target keeps its own."""
    from specscope.core.decode.factory import Models, build_decoder
    from specscope.core.decode.settings import RunSettings, SettingsError

    bundled_target = load_model(bundled_path("target"), device="cpu", dtype="float32")
    with pytest.raises(SettingsError, match="eagle3-smollm2 is smollm2's"):
        build_decoder(RunSettings(proposer="eagle3"), Models(bundled_target, target_name="smollm2"))
    decoder = build_decoder(RunSettings(proposer="eagle3"), Models(bundled_target, target_name="specscope/target"))
    assert decoder.proposer.label == "bundled:eagle3-target"
