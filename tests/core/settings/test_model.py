"""The one settings model (core/settings): torch-free, each vocabulary and each numeric bound
defined once and used by every module that checks it, bounds on every number that could
exhaust memory (issue 43 item 6), and no empty part in a proposer spec (item 7)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from specscope.core.decode.settings import RunSettings as OldPathRunSettings
from specscope.core.draft.registry import SpecError, parse_spec
from specscope.core.draft.trees import TreeSpecError, parse_tree
from specscope.core.settings import bounds, vocab
from specscope.core.settings.model import RunSettings
from tests.tiny_models import tiny_lm


def test_importing_the_settings_model_imports_no_torch():
    code = (
        "import sys; import specscope.core.settings, specscope.core.settings.model, specscope.core.decode.settings, "
        "specscope.core.draft.registry; specscope.core.settings.model.RunSettings(proposer='lookup').check(); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_old_import_path_is_the_same_class():
    assert OldPathRunSettings is RunSettings


def test_each_vocabulary_is_one_object_everywhere_it_is_checked():
    from specscope.core import records
    from specscope.core.sampling import dists
    from specscope.core.verify import tree
    from specscope.storage import schema
    from specscope.storage.jsonl import read
    from specscope.storage.writer import api

    assert tree.CHILDREN_MODES is vocab.CHILDREN_MODES is read.CHILDREN_MODES
    assert dists.VECTOR_MODES is vocab.VECTOR_POLICIES
    assert records.StopReason is vocab.StopReason and api.STOP_REASONS == vocab.STOP_REASONS is read.STOP_REASONS
    assert schema.RUN_STATUSES is vocab.RUN_STATUSES is read.RUN_STATUSES
    assert api.RUN_STATUSES is vocab.ENDED_STATUSES and "running" not in api.RUN_STATUSES


def test_the_cli_takes_every_integer_bound_from_the_model():
    from specscope.app.cli.options import INT_OPTIONS, int_option

    for dest, (flag, setting) in INT_OPTIONS.items():
        assert int_option(dest) == (flag, bounds.BOUNDS[setting])
    # the two limits that disagreed with the core's (issue 39): k <= 2^31-1 and max-new >= 0
    assert int_option("k")[1].hi == bounds.MAX_K and int_option("max_new")[1].lo == 1


@pytest.mark.parametrize(
    "setting, value, message",
    [
        ("k", 4097, "must be at most 4096, got 4097"),
        ("max_ngram", 2**31 - 1, "must be at most 64 (the n-gram index grows with its square), got 2147483647"),
        ("top_n", 2**31 - 1, "must be at most 16777216 (the largest vocabulary a trace may hold), got 2147483647"),
        ("threads", 0, "must be at least 1, got 0"),
        ("reps", 2.0, "must be a whole number, got 2.0"),
        ("seed", True, "must be a whole number, got True"),
    ],
)
def test_a_bound_has_one_message(setting, value, message):
    assert bounds.BOUNDS[setting].problem(value) == message


def test_every_bound_is_ordered_and_within_64_bits():
    for name, bound in bounds.BOUNDS.items():
        assert -(2**63) <= bound.lo <= bound.hi <= bounds.INT64_MAX, name


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("top_n", 2**24 + 1, "top-N must be at most 16777216"),
        ("threads", 10**6, "threads must be at most 256"),
        ("proposer", "lookup:max_ngram=2147483647", "proposer: lookup: max_ngram must be at most 64"),
        ("proposer", "lookup:min_ngram=100000", "proposer: lookup: min_ngram must be at most 64"),
        ("proposer", "draft:small,tree=dynamic:nodes=16,depth=2147483647,topk=4", "depth must be at most 256"),
    ],
)
def test_numbers_that_could_exhaust_memory_are_refused_by_the_settings(field, value, message):
    errors = RunSettings(**{field: value}).validate()
    assert len(errors) == 1 and message in next(iter(errors.values())), errors


@pytest.mark.parametrize(
    "text",
    [
        "draft:",
        "eagle3:",
        "medusa:",
        "lookup:",
        "draft,",
        "lookup:max_ngram=",
        "lookup:max_ngram=3,min_ngram=",
        "draft:small,tree=",
        "draft:small,tree=3,2,children=",
        "eagle3:draw=",
        "draft:small,",
        "lookup:,max_ngram=2",
        "draft:small,,tree=3",
    ],
)
def test_an_empty_part_of_a_spec_is_refused_in_one_line(text):
    with pytest.raises(SpecError) as caught:
        parse_spec(text)
    message = str(caught.value)
    assert "\n" not in message and ("nothing after" in message or "no value" in message or "empty item" in message)
    errors = RunSettings(proposer=text).validate()
    assert list(errors) == ["proposer"] and errors["proposer"] == f"proposer: {message}"


@pytest.mark.parametrize(
    "text",
    [
        "draft",
        "draft:small",
        "lookup",
        "lookup:max_ngram=64,min_ngram=2",
        "eagle3",
        "draft:small,tree=3,2,1,children=sampled",
        "eagle3,tree=dynamic:nodes=16,depth=5,topk=4",
    ],
)
def test_specs_with_every_part_given_still_parse(text):
    assert parse_spec(parse_spec(text).__str__()) == parse_spec(text)


@pytest.mark.parametrize(
    "tree, message",
    [
        ("dynamic:nodes=16,depth=5,topk=2147483647", "topk must be at most 256"),
        ("dynamic:nodes=16,depth=100000,topk=4", "depth must be at most 256"),
    ],
)
def test_a_dynamic_trees_depth_and_width_are_bounded(tree, message):
    with pytest.raises(TreeSpecError, match=message):
        parse_tree(tree)


def test_the_decoder_checks_the_models_bounds():
    from specscope.core.decode.decoder import SpeculativeDecoder
    from specscope.core.draft.proposers import PromptLookupProposer

    target = tiny_lm("llama", seed=0)
    for kwargs, message in (
        (dict(k=bounds.MAX_K + 1), "k (draft length) must be at most 4096"),
        (dict(top_n=2**31 - 1), "top_n must be at most 16777216"),
        (dict(seed=-1), "seed must be at least 0"),
    ):
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            SpeculativeDecoder(target, PromptLookupProposer(), **kwargs)
    import numpy as np

    assert SpeculativeDecoder(target, PromptLookupProposer(), k=np.int64(3), seed=np.int64(5)).k == 3
