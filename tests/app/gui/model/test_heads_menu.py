"""The draft-head kinds (core.draft.heads) in the run panel's proposer menu: one
"KIND: head checkpoint…" entry each, whose folder is the checkpoint field (no Qt here: the
settings model the panel reads)."""

from __future__ import annotations

from specscope.app.gui.model.settings import (
    PATH_ARG,
    PanelSettings,
    checkpoint_of,
    proposer_choices,
    spec_of_run,
    validate,
)
from tests.core.head_checkpoints import write_eagle3
from tests.tiny_models import tiny_lm


def test_each_head_kind_is_offered_with_the_checkpoint_field():
    choices = {c.spec: c.label for c in proposer_choices()}
    for kind in ("eagle", "eagle3", "medusa", "mtp"):
        assert choices[f"{kind}:{PATH_ARG}"] == f"{kind}: head checkpoint…"
    for kind in ("eagle", "medusa", "mtp"):
        assert kind not in choices  # no head of these kinds ships: without a checkpoint it cannot run
    assert choices["eagle3"] == "eagle3: the target's trained head"
    # the compare lanes pick whole specs: the bundled head also drafting one-hot; the run panel has a Draws field
    assert [c.spec for c in proposer_choices(with_checkpoint=False) if c.spec.startswith("eagle")] == [
        "eagle3",
        "eagle3:draw=onehot",
    ]
    assert choices["eagle3:draw=onehot"] == "eagle3: the target's trained head, one-hot drafts"
    assert "eagle3:draw=onehot" not in {c.spec for c in proposer_choices(with_trees=False)}


def test_the_checkpoint_field_names_the_head_folder(tmp_path):
    write_eagle3(tmp_path, tiny_lm("llama", layers=4), draft_vocab=40)
    texts = dict(PanelSettings(prompt="1 2 3").to_texts(), proposer=f"eagle3:{PATH_ARG}", checkpoint=str(tmp_path))
    result = validate(texts)
    assert result.settings.proposer == f"eagle3:{tmp_path}"
    assert checkpoint_of(f"eagle3:{tmp_path}") == str(tmp_path)
    assert "checkpoint" in validate(dict(texts, checkpoint="")).errors
    assert "is not a folder" in validate(dict(texts, checkpoint=str(tmp_path / "nothing"))).errors["proposer"]


def test_the_bundled_head_needs_no_checkpoint_and_reruns_from_a_trace():
    result = validate(dict(PanelSettings(prompt="1 2 3").to_texts(), proposer="eagle3"))
    assert result.errors == {} and result.settings.proposer == "eagle3" and checkpoint_of("eagle3") is None
    assert spec_of_run("eagle3", {"spec": "eagle3", "head": "bundled:eagle3-target"}, None) == "eagle3"
    assert spec_of_run("eagle3", {"spec": "eagle3:/some/head"}, None) is None  # a folder's head is not the bundled one


def test_the_tree_fields_apply_to_the_head_kinds(tmp_path):
    """The run panel enables its tree fields for a kind with a `tree` parameter and folds
    them into the spec it validates: a head's tree is checked as a draft model's."""
    from specscope.app.gui.model.settings import spec_text
    from specscope.app.gui.model.tree_settings import fold_tree, grows_trees

    for kind in ("eagle", "eagle3", "medusa", "mtp"):
        assert grows_trees(f"{kind}:{PATH_ARG}") and grows_trees(kind)
    write_eagle3(tmp_path, tiny_lm("llama", layers=4), draft_vocab=40)
    texts = dict(PanelSettings(prompt="1 2 3").to_texts(), checkpoint=str(tmp_path))
    chosen = spec_text(f"eagle3:{PATH_ARG}", str(tmp_path))  # as the panel does: the folder, then the tree fields
    folded = fold_tree(chosen, "dynamic:nodes=16,depth=5,topk=4", "topk")
    result = validate(dict(texts, proposer=folded))
    assert result.errors == {} and result.settings.proposer == f"eagle3:{tmp_path},tree=dynamic:nodes=16,depth=5,topk=4"
    bad = validate(dict(texts, proposer=fold_tree(chosen, "dynamic:nodes=16,depth=5,topk=4", "sampled")))
    assert "children='topk'" in bad.errors["children"]
    bundled = validate(dict(PanelSettings(prompt="1 2 3").to_texts(), proposer=fold_tree("eagle3", "3,2,1", "sampled")))
    assert bundled.errors == {} and bundled.settings.proposer == "eagle3:tree=3,2,1,children=sampled"


def test_a_onehot_head_validates_reruns_and_keeps_the_menu():
    """draw=onehot (core.draft.registry) is checked by the settings check without loading the
    head, reruns from a trace's params, and leaves the menu's entries as they were."""
    texts = dict(PanelSettings(prompt="1 2 3").to_texts(), proposer="eagle3:draw=onehot")
    result = validate(texts)
    assert result.errors == {} and result.settings.proposer == "eagle3:draw=onehot"
    assert (
        "draw must be sampled or onehot, got 'top'"
        in validate(dict(texts, proposer="eagle3:draw=top")).errors["proposer"]
    )
    recorded = {"spec": "eagle3:draw=onehot", "head": "bundled:eagle3-target", "draw": "onehot"}
    assert spec_of_run("eagle3", recorded, None) == "eagle3:draw=onehot"
    assert (
        spec_of_run("eagle3", {"spec": "eagle3", "head": "bundled:eagle3-target", "draw": "sampled"}, None) == "eagle3"
    )


def test_the_draw_field_splits_out_of_a_spec_and_folds_back():
    from specscope.app.gui.model.tree_settings import fold_draw, split_draw, takes_draw

    assert takes_draw("eagle3") and takes_draw(f"medusa:{PATH_ARG}") and not takes_draw("draft:small")
    assert not takes_draw("lookup") and not takes_draw("no such kind")
    assert split_draw("eagle3:/heads/h,draw=onehot") == ("eagle3:/heads/h", "onehot")
    assert split_draw("eagle3:/heads/h") == ("eagle3:/heads/h", "sampled")
    assert fold_draw("eagle3:/heads/h", "onehot") == "eagle3:/heads/h,draw=onehot"
    assert fold_draw("eagle3", "onehot") == "eagle3:draw=onehot"
    assert fold_draw("eagle3", "sampled") == "eagle3" and fold_draw("draft:small", "onehot") == "draft:small"
