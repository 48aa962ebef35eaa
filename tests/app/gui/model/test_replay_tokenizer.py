"""A replayed run is decoded with the tokenizer it recorded (issue 33, case 11): the bundled
one when the run's tokenizer_hash is the bundled tokenizer's, the run's own folder when it is
still there with the same tokenizer.json, else token ids with a reason (never another
model's tokenizer, which would show garbage)."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest

from specscope.app.gui.model.traces import replay_tokenizer
from specscope.core.loading import models as loading
from specscope.storage import ModelInfo

pytestmark = pytest.mark.skipif(not loading.bundled_available(), reason="needs the bundled models")


class _Bundled:
    """Stands for the window's bundled tokenizer."""

    def __len__(self) -> int:
        return 512


BUNDLED = _Bundled()


def info(vocab: int = 1024, **models) -> SimpleNamespace:
    return SimpleNamespace(models=ModelInfo(**{"target_name": "x", **models}), config=SimpleNamespace(vocab_size=vocab))


def test_the_bundled_tokenizer_decodes_a_run_that_used_it():
    digest = loading.tokenizer_sha256(loading.bundled_path("target"))
    got = replay_tokenizer(
        info(tokenizer_name="elsewhere", tokenizer_hash=digest), lambda: BUNDLED, loading.bundled_path("target")
    )
    assert got == (BUNDLED, None)


def test_a_run_with_another_tokenizer_is_decoded_with_its_own(tmp_path):
    folder = tmp_path / "other"
    shutil.copytree(loading.bundled_path("target"), folder)
    tok_json = folder / "tokenizer.json"
    data = json.loads(tok_json.read_text())
    tok_json.write_text(json.dumps(data, indent=1))  # another file, another hash
    digest = loading.tokenizer_sha256(folder)
    tok, why = replay_tokenizer(
        info(tokenizer_name=str(folder), tokenizer_hash=digest), lambda: BUNDLED, loading.bundled_path("target")
    )
    assert why is None and tok is not BUNDLED and tok.decode([int(tok.encode("hello")[0])]).strip()


def test_a_tokenizer_that_is_not_here_shows_ids_and_says_why(tmp_path):
    tok, why = replay_tokenizer(
        info(tokenizer_name=str(tmp_path / "gone"), tokenizer_hash="ab" * 32),
        lambda: BUNDLED,
        loading.bundled_path("target"),
    )
    assert tok is None and "another tokenizer" in why and "token ids" in why
    tok, why = replay_tokenizer(
        info(target_name="/models/mine", tokenizer_name=None, tokenizer_hash=None),
        lambda: BUNDLED,
        loading.bundled_path("target"),
    )
    assert tok is None and "recorded no tokenizer" in why


def test_an_older_bundled_run_without_a_hash_keeps_the_bundled_tokenizer():
    got = replay_tokenizer(
        info(target_name="specscope/target", tokenizer_name="specscope/target"),
        lambda: BUNDLED,
        loading.bundled_path("target"),
    )
    assert got == (BUNDLED, None)
