"""Issue 20: replay that reproduces: the prompt decoded from its ids, the panel saying when it
no longer matches the trace, a run picker that tells runs apart, the Recompute check."""

from __future__ import annotations

from PySide6.QtWidgets import QMessageBox

from specscope.app.gui.controllers import trace_dialogs
from specscope.app.gui.views import run_picker
from tests.app.gui.views.test_kvview import _faulty_trace


class WordTokenizer:
    """A stand-in for the run's tokenizer: ids <-> space-separated numbers."""

    def __len__(self):
        return 64

    def decode(self, ids):
        return " ".join(str(i) for i in ids)

    def encode(self, text, add_special_tokens=False):
        return [int(t) for t in text.split()]

    def convert_ids_to_tokens(self, i):
        return str(i)


def _stored_runs(hub, path, seeds=(0, 1), prompt_text=None):
    from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
    from specscope.storage import TraceStore, TraceWriter

    target, _ = hub.target("cpu")
    ids = []
    with TraceStore(path) as store:
        for seed in seeds:
            dec = SpeculativeDecoder(
                target,
                DraftModelProposer(hub.draft("draft-small", "cpu"), label="draft-small"),
                k=3,
                sampling=SamplingConfig(temperature=0.8),
                seed=seed,
            )
            config = dec.run_config([5, 6, 7, 8], 12)
            with TraceWriter(store, config, prompt_text=prompt_text) as writer:
                writer.record(dec.rounds([5, 6, 7, 8], 12, config=config))
            ids.append(config.run_id)
    return ids


def test_a_run_without_prompt_text_replays_its_decoded_prompt(qtbot, window, hub, tmp_path, monkeypatch):
    path = tmp_path / "cli.sqlite"
    run_id = _stored_runs(hub, path, seeds=(3,))[0]
    window.run_panel.set_field("prompt", "the previous prompt")
    monkeypatch.setattr(window.hub, "tokenizer", lambda: WordTokenizer())
    assert window.open_trace(str(path), run_id=run_id)
    qtbot.waitUntil(lambda: window.replay.loaded_all, timeout=30000)
    assert window.run_panel.texts()["prompt"] == "5 6 7 8"
    assert window.run_panel.texts()["seed"] == "3"
    assert window.replay_panel.mismatch == []
    assert "Not reproducible" not in window.run_panel.state_label.text()
    window.run_panel.set_field("seed", "4")
    assert "no longer matches the trace (seed changed)" in window.run_panel.state_label.text()
    window.run_panel.set_field("seed", "3")
    assert "no longer matches" not in window.run_panel.state_label.text()


def test_without_the_runs_tokenizer_the_panel_says_the_prompt_is_not_reproduced(qtbot, window, hub, tmp_path):
    path = tmp_path / "cli.sqlite"
    run_id = _stored_runs(hub, path, seeds=(0,))[0]
    window.run_panel.set_field("prompt", "the previous prompt")
    assert window.open_trace(str(path), run_id=run_id)
    assert "Not reproducible from the panel: the prompt" in window.run_panel.state_label.text()


def test_the_run_picker_tells_runs_apart(qtbot, window, hub, tmp_path, monkeypatch):
    path = tmp_path / "two.sqlite"
    ids = _stored_runs(hub, path, prompt_text="five six seven eight")
    seen = {}

    def pick(parent, runs, prompts, title="Open trace", findings=None):
        seen["rows"] = [run_picker.run_row(r, p, findings(i)) for i, (r, p) in enumerate(zip(runs, prompts))]
        return runs[1].run_id

    monkeypatch.setattr(trace_dialogs, "pick_run", pick)
    assert window.open_trace(str(path))
    assert window.model.config.run_id in ids
    rows = seen["rows"]
    col = {name: i for i, name in enumerate(run_picker.PICKER_COLUMNS)}
    assert sorted(r[col["seed"]] for r in rows) == ["0", "1"]
    assert all(r[col["prompt starts"]].startswith("five six") for r in rows)
    assert all(r[col["stop"]] in ("budget", "eos") for r in rows)
    assert all(r[col["findings"]] == "0" for r in rows)


def test_recompute_check_finds_the_stale_cache_from_the_gui(qtbot, window, hub, tmp_path, monkeypatch):
    shown = []
    monkeypatch.setattr(QMessageBox, "information", staticmethod(lambda parent, title, text: shown.append(text)))
    path = tmp_path / "faulty.sqlite"
    run_id, _ = _faulty_trace(hub, path)
    assert window.open_trace(str(path), run_id=run_id)
    qtbot.waitUntil(lambda: window.replay.loaded_all, timeout=30000)
    found = window.checks.recompute_check()
    assert found and all(f.rule == "recompute" for f in found)
    assert any(f.rule == "recompute" for f in window.findings.findings)
    clean = tmp_path / "clean.sqlite"
    clean_id = _stored_runs(hub, clean, seeds=(0,))[0]
    assert window.open_trace(str(clean), run_id=clean_id)
    qtbot.waitUntil(lambda: window.replay.loaded_all, timeout=30000)
    assert window.checks.recompute_check() == []
    assert "matches a full recompute" in shown[-1]


def _stored_run_with_stops(hub, path, unrecorded=frozenset()):
    """A run whose EOS ids are several and that has stop strings and token sequences."""
    import dataclasses

    from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
    from specscope.core.decode.stops import Stops
    from specscope.storage import TraceStore, TraceWriter

    target, _ = hub.target("cpu")
    stops = Stops(strings=("zz\nq", "a\\b"), sequences=((60, 61), (62,)))
    dec = SpeculativeDecoder(
        target,
        DraftModelProposer(hub.draft("draft-small", "cpu"), label="draft-small"),
        k=3,
        sampling=SamplingConfig(temperature=0.8),
        seed=2,
        eos_token_id=(63, 7, 9),
        stops=stops,
        token_piece=lambda t: "abcdefgh"[t % 8],
    )
    config = dec.run_config([5, 6, 7, 8], 12)
    config = dataclasses.replace(config, unrecorded=config.unrecorded | unrecorded)
    with TraceStore(path) as store, TraceWriter(store, config) as writer:
        writer.record(dec.rounds([5, 6, 7, 8], 12, config=config))
    return config.run_id


def test_the_replayed_panel_shows_every_eos_id_and_the_stops(qtbot, window, hub, tmp_path, monkeypatch):
    path = tmp_path / "stops.sqlite"
    run_id = _stored_run_with_stops(hub, path)
    monkeypatch.setattr(window.hub, "tokenizer", lambda: WordTokenizer())
    assert window.open_trace(str(path), run_id=run_id)
    qtbot.waitUntil(lambda: window.replay.loaded_all, timeout=30000)
    texts = window.run_panel.texts()
    assert texts["eos"] == "63,7,9"
    assert texts["stop_strings"] == "zz\\nq\na\\\\b" and texts["stop_ids"] == "60,61; 62"
    settings = window.run_panel.validate_quietly()  # Run would start the trace's EOS ids and stops
    assert settings.eos == (63, 7, 9)
    assert settings.stop_strings == ("zz\nq", "a\\b") and settings.stop_ids == ((60, 61), (62,))
    assert window.replay_panel.mismatch == []
    # a run without stops empties the stop fields (Run must not add the previous run's)
    other = _stored_runs(hub, tmp_path / "plain.sqlite", seeds=(0,))[0]
    assert window.open_trace(str(tmp_path / "plain.sqlite"), run_id=other)
    qtbot.waitUntil(lambda: window.replay.loaded_all and window.model.config.run_id == other, timeout=30000)
    texts = window.run_panel.texts()
    assert texts["stop_strings"] == "" and texts["stop_ids"] == "" and texts["eos"] == "none"


def test_a_trace_without_its_stops_says_the_panel_cannot_reproduce_them(qtbot, window, hub, tmp_path, monkeypatch):
    path = tmp_path / "blind.sqlite"
    run_id = _stored_run_with_stops(hub, path, unrecorded=frozenset({"stops"}))
    monkeypatch.setattr(window.hub, "tokenizer", lambda: WordTokenizer())
    assert window.open_trace(str(path), run_id=run_id)
    qtbot.waitUntil(lambda: window.replay.loaded_all, timeout=30000)
    assert any("stops" in m for m in window.replay_panel.mismatch), window.replay_panel.mismatch
    assert "the stops" in window.run_panel.state_label.text()


def test_the_findings_panel_lists_the_rules_a_replayed_trace_does_not_allow(qtbot, window, hub, tmp_path):
    path = tmp_path / "blind.sqlite"
    run_id = _stored_run_with_stops(hub, path, unrecorded=frozenset({"stops"}))
    assert window.open_trace(str(path), run_id=run_id)
    qtbot.waitUntil(lambda: window.replay.loaded_all and window.findings.not_checked != {}, timeout=30000)
    assert {"stop-leak", "stop-flag", "stop-budget"} <= set(window.findings.not_checked)
    assert "does not record the run's stops" in window.findings.not_checked["stop-leak"]
    assert window.findings.not_checked_label.isVisible() and window.findings.findings == []
    assert window.model.not_checked == window.findings.not_checked


def test_the_engine_a_run_was_recorded_with_is_the_engine_replay_puts_in_the_panel():
    """A vLLM run replayed refilled the panel with engine "specscope" (only two engines were known)."""
    from types import SimpleNamespace

    from specscope.app.gui.controllers.replay_panel import engine_of_run

    def run(proposer, **params):
        return SimpleNamespace(proposer=proposer, proposer_params=params)

    assert engine_of_run(run("vllm-ngram", vllm="0.32.0", spec="lookup")) == "vllm"
    assert engine_of_run(run("vllm-draft_model", spec="draft:smollm2-draft")) == "vllm"
    assert engine_of_run(run("draft", engine="transformers")) == "transformers"
    assert engine_of_run(run("draft", spec="draft:small")) == "specscope"
    assert engine_of_run(SimpleNamespace(proposer="lookup", proposer_params=None)) == "specscope"
