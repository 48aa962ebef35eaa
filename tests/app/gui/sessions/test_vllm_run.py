"""The window's vLLM run of its settings (app/gui/sessions/vllm.py): the proposer's folder as the CLI finds it."""

from __future__ import annotations


def test_the_window_hands_vllm_the_targets_own_head():
    from pathlib import Path

    from specscope.app.gui.model.settings import PanelSettings
    from specscope.app.gui.sessions.vllm import vllm_run_of
    from specscope.core.loading.models import bundled_head_path

    run = vllm_run_of(PanelSettings(proposer="eagle3", target="smollm2", k=3), [1, 2], (2,), Path("/t"))
    assert run.proposer_path == str(bundled_head_path("eagle3-smollm2"))
