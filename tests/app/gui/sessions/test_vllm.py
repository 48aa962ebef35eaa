"""The window's vllm engine (app/gui/sessions/vllm.py): SmolLM2 greedy with prompt lookup run
by vLLM from the run panel, its rounds in the timeline and recorded to the window's store;
then a compare lane of specscope's decoder beside a vLLM lane on the same prompt, equal
output. Skipped, with the reason, where vLLM's venv or SmolLM2 is absent. Each vLLM start
takes a minute or more on a CPU. Without vLLM: the menu entry and Run say so in one line."""

from __future__ import annotations

import pytest

from specscope.app.gui.model.settings import PanelSettings, engine_note, validate
from specscope.core.engines.vllm.setup import not_set_up
from tests.app.conftest import dispose
from tests.app.gui.test_model_paths import needs_smollm2
from tests.app.helpers import wait_idle

NO_VLLM = not_set_up()
needs_vllm = pytest.mark.skipif(NO_VLLM is not None, reason=str(NO_VLLM))

PROMPT = "The capital of France is"
SAMPLER = {
    "k": "4",
    "temperature": "0",
    "top_k": "0",
    "top_p": "1.0",
    "seed": "0",
    "eos": "none",
    "device": "cpu",
    "system": "",
    "stop_strings": "",
    "stop_ids": "",
    "chat": "off",
}


def test_without_vllm_the_entry_and_run_say_so_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSCOPE_VLLM_VENV", str(tmp_path / "no-venv"))
    note = engine_note("vllm")
    assert note is not None and "specscope vllm setup" in note and "\n" not in note
    assert engine_note("specscope") is None
    errors = validate(dict(PanelSettings(prompt="1 2").to_texts(), engine="vllm")).errors
    assert errors == {"engine": note}


@pytest.fixture
def smollm2_window(qtbot, settings_file, tmp_path):
    from specscope.app.gui import create_app
    from specscope.app.gui.main_window import MainWindow
    from specscope.app.gui.sessions.hub import ModelHub

    create_app()
    w = MainWindow(hub=ModelHub(), settings=settings_file, store_path=str(tmp_path / "window.sqlite"))
    qtbot.addWidget(w)
    w.resize(1500, 920)
    w.show()
    yield w
    dispose(w)


@needs_vllm
@needs_smollm2
def test_vllm_session_runs_smollm2_in_the_window_and_compares(qtbot, smollm2_window, tmp_path):
    from specscope.storage import TraceStore

    window = smollm2_window
    panel = window.run_panel
    panel.target.choose("smollm2")
    panel.set_texts({"prompt": PROMPT, "engine": "vllm", "proposer": "lookup", "max_new_tokens": "16", **SAMPLER})
    assert window.start_run(), window.last_error
    wait_idle(qtbot, window, timeout=900_000)
    assert window.last_error is None, window.last_error
    model = window.model
    assert model.config.proposer == "vllm-ngram"
    assert model.config.proposer_params["vllm"]
    assert len(model.output_tokens) == 16 and len(model.rounds) >= 2
    assert window.timeline.model is model  # the timeline draws these rounds
    assert [r.index for r in model.rounds] == list(range(len(model.rounds)))
    assert any(r.nodes for r in model.rounds)  # vLLM's drafts
    with TraceStore(str(tmp_path / "window.sqlite")) as store:
        (info,) = [i for i in store.list_runs() if i.run_id == model.config.run_id]
        assert info.n_rounds == len(model.rounds) and store.new_tokens(info.run_id) == model.output_tokens
    vllm_tokens = list(model.output_tokens)

    # compare: specscope's decoder beside vLLM, the same prompt, proposer and k
    window.compare.set_side(0, "lookup", 4)
    window.compare.set_side(1, "lookup", 4)
    window.compare.set_side(2, None, 4)
    window.compare.engines[1].setCurrentText("vllm")
    window.runs.start_compare()
    session = window.compare_session
    qtbot.waitUntil(
        lambda: (
            len(session.results) == 2
            and all(r.stop_reason for r in session.results)
            and window.compare_controller.state == "idle"
        ),
        timeout=900_000,
    )
    assert window.last_error is None and not any(e.text() for e in window.compare.errors), window.last_error
    ours, theirs = session.models
    assert ours.config.proposer == "lookup" and theirs.config.proposer == "vllm-ngram"
    assert theirs.output_tokens == vllm_tokens
    assert ours.output_tokens == theirs.output_tokens  # greedy float32: vLLM equals specscope's decoder


def test_what_vllm_does_differently_with_a_head_is_a_note_of_the_lane(tmp_path, monkeypatch):
    """A Medusa folder with biases but no medusa_fc_bias (vLLM drops them): the lane's Prepared
    carries the note the window shows (Prepared.notes), not only the run's parameters."""
    import json

    import torch
    from transformers import AutoModelForCausalLM

    from specscope.app.gui.sessions import vllm as session
    from specscope.app.gui.sessions.hub import ModelHub
    from specscope.core.engines.vllm.engine import check_head
    from specscope.core.loading.models import bundled_path
    from tests.core.head_checkpoints import write_vllm_medusa

    target = AutoModelForCausalLM.from_pretrained(bundled_path("target"), dtype=torch.float32)
    folder = write_vllm_medusa(tmp_path / "medusa", target, bias=True)
    config = json.loads((folder / "config.json").read_text())
    config.pop("medusa_fc_bias")  # the Medusa repository's biased blocks, without vLLM's flag
    (folder / "config.json").write_text(json.dumps(config))
    monkeypatch.setattr("specscope.core.engines.vllm.setup.not_set_up", lambda: None)

    def fake_rounds(run, work, cancelled=None):  # vLLM itself is not needed: its head check is
        check_head(run)
        from specscope.core import SamplingConfig, SpeculativeDecoder
        from specscope.core.draft.registry import build_proposer

        dec = SpeculativeDecoder(target, build_proposer("lookup"), k=2, sampling=SamplingConfig(temperature=0))
        out = dec.generate(run.prompts[0], 4)
        return out.config, list(out.rounds), list(out.new_tokens), "budget", 0.1

    monkeypatch.setattr(session, "recorded_rounds", fake_rounds)
    texts = dict(PanelSettings(prompt="def f(x):").to_texts(), **SAMPLER)
    texts.update(engine="vllm", proposer=f"medusa:{folder}", k="2", max_new_tokens="4")
    settings = validate(texts).settings
    assert settings is not None, validate(texts).errors
    prepared = session.build_vllm(ModelHub(), settings)
    assert len(prepared.notes) == 1 and prepared.notes[0].startswith("vLLM: medusa:") and "biases" in prepared.notes[0]
