"""A target spread over devices with accelerate's device_map: the decoder must not assume one
device for the whole model. On a CPU-only machine the spread is cpu + disk offload (a layer
whose weights live on the meta device between forwards, moved in by accelerate's hooks),
which breaks any code that takes the first parameter's device for everything."""

from __future__ import annotations

import pytest
import torch

from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.loading.models import CheckpointError, load_model
from tests.tiny_models import save_pair

pytest.importorskip("accelerate")

SPREAD = {
    "model.embed_tokens": "cpu",
    "model.layers.0": "cpu",
    "model.layers.1": "disk",
    "model.norm": "cpu",
    "model.rotary_emb": "cpu",
    "lm_head": "cpu",
}


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory):
    return save_pair(tmp_path_factory.mktemp("pair"))


def test_a_spread_target_decodes_exactly_as_a_whole_one(pair_dirs, tmp_path):
    target_dir, draft_dir = pair_dirs
    whole = load_model(target_dir, device="cpu")
    spread = load_model(target_dir, device_map=SPREAD, offload_folder=tmp_path / "offload")
    assert {p.device.type for p in spread.parameters()} == {"cpu", "meta"}, "layer 1 should be offloaded"
    draft = load_model(draft_dir, device="cpu")
    prompt = [3, 7, 11, 5, 2]
    plain = whole.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)[0, len(prompt) :].tolist()
    for sampling in (SamplingConfig(temperature=0.0), SamplingConfig(temperature=1.0, top_k=20)):
        outs = [
            SpeculativeDecoder(t, DraftModelProposer(draft), k=3, sampling=sampling, seed=9).generate(prompt, 24)
            for t in (whole, spread)
        ]
        assert outs[0].new_tokens == outs[1].new_tokens
        if sampling.greedy:
            assert outs[1].new_tokens == plain


def test_a_bad_device_map_is_a_clear_error(pair_dirs):
    with pytest.raises(CheckpointError, match="cannot load the model checkpoint"):
        load_model(pair_dirs[0], device_map="everywhere")
