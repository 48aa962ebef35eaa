"""core.draft.registry: what a proposer spec names."""

from __future__ import annotations


def test_the_checkpoint_an_engine_loads_by_folder_for_a_spec():
    """vLLM loads folders: `eagle3` alone names the target's own head, in the CLI and the window."""
    from specscope.core.draft.registry import checkpoint_ref, parse_spec

    assert checkpoint_ref(parse_spec("eagle3"), "smollm2") == "eagle3-smollm2"
    assert checkpoint_ref(parse_spec("eagle3"), None) == "eagle3-target"
    assert checkpoint_ref(parse_spec("eagle3"), "") == "eagle3-target"
    assert checkpoint_ref(parse_spec("eagle3:/some/head"), "smollm2") == "/some/head"
    assert checkpoint_ref(parse_spec("draft:smollm2-draft"), "smollm2") == "smollm2-draft"
    assert checkpoint_ref(parse_spec("lookup"), None) is None
