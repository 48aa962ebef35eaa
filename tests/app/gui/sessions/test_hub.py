"""The model hub (app/gui/sessions/hub.py) as the window uses it."""

from __future__ import annotations

import pytest

from tests.app.helpers import configure, wait_idle
from tests.tiny_models import nfc_only_tokenizer_pair


@pytest.fixture(scope="module")
def nfc_pair(tmp_path_factory):
    return nfc_only_tokenizer_pair(tmp_path_factory.mktemp("nfc-pair"))


def test_a_harmless_tokenizer_difference_is_shown_in_the_window(qtbot, window, nfc_pair):
    """Issue 43 item 5: a Qwen2 target and a Llama draft sharing one tokenizer.json differ only
    by the NFC normalizer the Qwen2 class adds; the pair runs, and the window says so (the CLI
    logged it, the window showed nothing)."""
    target, draft = nfc_pair
    configure(window, prompt="Café: It's 2024", proposer=f"draft:{draft}", max_new_tokens="4")
    window.run_panel.set_field("target", str(target))
    shown = []  # the status bar's message as the note arrives (the window's slot runs first)
    window.live.noted.connect(lambda _text: shown.append(window.statusBar().currentMessage()))
    assert window.start_run(), window.last_error
    wait_idle(qtbot, window, timeout=120_000)
    assert len(shown) == 1 and "tokenizers differ, but give the same ids" in shown[0] and "NFC" in shown[0]
    assert window.model.rounds, window.last_error
    # the message gives way to the run's end; the state text keeps saying it while the run shows
    assert "tokenizers differ (same ids)" in window.status_bar.full_state


def test_missing_bundled_models_are_said_in_one_line(qtbot, gui_env, settings_file, tmp_path, monkeypatch):
    """Issue 39: production code builds no tiny random models; without the bundled models (a
    broken install) the hub refuses the bundled target in one line and the window says it."""
    from specscope.app.gui import create_app
    from specscope.app.gui.main_window import MainWindow
    from specscope.app.gui.sessions import hub as hub_module
    from specscope.core.loading.errors import CheckpointError
    from tests.app.conftest import dispose

    monkeypatch.setattr(hub_module.loading, "bundled_available", lambda: False)
    hub = hub_module.ModelHub()
    assert hub.missing == hub_module.MISSING and "\n" not in hub.missing
    with pytest.raises(CheckpointError, match="bundled models are not installed"):
        hub.target("cpu")
    assert hub.tokenizer() is None
    create_app()
    w = MainWindow(hub=hub, settings=settings_file, store_path=str(tmp_path / "traces.sqlite"))
    try:
        assert w.statusBar().currentMessage() == hub_module.MISSING
    finally:
        dispose(w)
