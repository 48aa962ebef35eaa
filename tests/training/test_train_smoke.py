"""The training script's --smoke mode: a few steps on a few stdlib files, into a tmp dir."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from safetensors import safe_open

from tests.training.scripts import load_script


def _train_module():
    return load_script("train_models", "specscope_train_models")


@pytest.fixture(scope="module")
def train():
    return _train_module()


@pytest.fixture(scope="module")
def smoke_run(train, tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke") / "models"
    # one torch thread, as the rest of the suite: the script's default of 2 is set process-wide
    # (it would outlive this test) and, with a busy second core, made the smoke run 3x slower
    summary = train.main(["--smoke", "--out", str(out), "--no-data-md", "--threads", "1"])
    return out, summary


def test_smoke_run_writes_loadable_models(smoke_run):
    from specscope.core import DraftModelProposer, SpeculativeDecoder
    from specscope.core.loading.models import load_pair

    out, summary = smoke_run
    for name in ("tokenizer", "target", "draft-small", "draft-tiny"):
        assert (out / name).is_dir(), name
    assert (out / "train_log.txt").read_text().count("step") >= 3
    written = json.loads((out / "training.json").read_text())
    assert written["mode"] == "smoke" and written["data"]["licence"].startswith("PSF")
    assert len(written["data"]["file_list_sha256"]) == 64

    with safe_open(str(out / "target" / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in list(f.keys())} == {torch.bfloat16}  # stored at half size
    for draft in ("draft-small", "draft-tiny"):
        pair = load_pair(out / "target", out / draft, device="cpu")
        assert next(pair.target.parameters()).dtype == torch.float32  # upcast on load
        prompt = pair.tokenizer("def f(x):\n", add_special_tokens=False)["input_ids"]
        dec = SpeculativeDecoder(pair.target, DraftModelProposer(pair.draft), k=3)
        # A few-step model has nearly flat logits, so only the mechanics are checked here;
        # exactness against plain decoding is the core tests' job.
        result = dec.generate(prompt, max_new_tokens=8)
        assert len(result.new_tokens) == 8 and all(0 <= t < len(pair.tokenizer) for t in result.new_tokens)


def test_split_is_by_file_and_deterministic(train):
    files = [f"pkg/mod{i}.py" for i in range(400)]
    tr, held = train.split_files(files, 3)
    assert set(tr).isdisjoint(held) and len(tr) + len(held) == len(files)
    assert 0 < len(held) < 40
    assert train.split_files(list(reversed(files)), 3)[1] == list(reversed(held))


def test_stdlib_listing_excludes_tests_and_data(train):
    files = train.list_stdlib_files(train.stdlib_root())
    assert files == sorted(files) and len(files) > 100
    assert not [f for f in files if f.startswith(("test/", "encodings/", "site-packages/")) or "/tests/" in f]
    assert "argparse.py" in files


def test_smoke_run_has_the_loop_breaking_stages(smoke_run):
    out, summary = smoke_run
    log = (out / "train_log.txt").read_text()
    assert "target stage 3 final:" in log and "unlikelihood" in log
    assert "target DITTO final:" in log
    metrics = summary["metrics"]
    assert {"target_stage1", "target_stage2", "target"} <= set(metrics)
    assert 0.0 <= metrics["target"]["greedy_distinct_2grams"] <= 1.0
    assert not (out / "target-stage1").exists() and not (out / "target-stage2").exists()


def test_repeat_mask_marks_every_token_of_a_repeated_ngram(train):
    tokens = torch.tensor([[1, 2, 3, 4, 1, 2, 3, 9, 1, 2, 3, 4], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]])
    mask = train.repeat_mask(tokens, 3)
    # row 0: "1 2 3" recurs at 4..6 and 8..10; "2 3 4" recurs at 9..11
    assert mask[0].tolist() == [0, 0, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1]
    assert mask[1].sum() == 0


def test_distinct_ngrams_is_low_for_a_loop_and_one_without_repeats(train):
    loop = torch.tensor([[7, 8] * 20])
    fresh = torch.arange(40)[None, :]
    assert train.distinct_ngrams(fresh, 4) == 1.0
    assert train.distinct_ngrams(loop, 4) == pytest.approx(2 / 37)


def test_training_lines_are_whole_lines_without_eos(train):
    newline = np.zeros(20, dtype=bool)
    newline[[10, 11]] = True  # ids 10 and 11 end a line
    data = np.array([1, 2, 10, 3, 4, 5, 10, 6, 0, 7, 11, 8, 9, 10, 1, 2, 3, 4, 5, 6, 7, 11], dtype=np.uint16)
    stage = dataclasses.replace(train.FULL.target_ditto, prefix=2, min_line=3, max_line=5)
    spans = train.training_lines(data, newline, 0, stage)
    # lines after each break: [3 4 5 10] (3..7), [6 0 7 11] has EOS (id 0), [8 9 10] (11..14), the last is 8 long
    assert spans.tolist() == [[3, 7], [11, 14]]


def test_repetition_batch_points_each_copy_at_the_one_before(train):
    data = np.arange(100, dtype=np.uint16)
    lines = np.array([[40, 43]])  # a 3-token line, 40 41 42
    stage = dataclasses.replace(train.FULL.target_ditto, batch=2, prefix=4, length=14)
    x, prev, mask = train.repetition_batch(data, lines, stage, np.random.default_rng(0))
    assert x[0].tolist() == [36, 37, 38, 39, 40, 41, 42, 40, 41, 42, 40, 41, 42, 40]
    # logits index i predicts x[i + 1]; the second copy starts at x[7], predicted at index 6
    assert mask[0].tolist() == [0] * 6 + [1] * 7
    for i in np.flatnonzero(mask[0].numpy()):
        assert x[0, i + 1] == x[0, prev[0, i] + 1] and prev[0, i] == i - 3
