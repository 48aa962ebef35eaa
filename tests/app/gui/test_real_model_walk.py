"""Issue 42: the window's three jobs walked with a real model, as a new user would.

With SmolLM2 (fetched into the cache; skipped, with the reason, where it is not): a chat run
with its EAGLE-3 head and with its shipped draft, stepped then run; the two compared side by
side and with plain greedy decoding; a run recorded by the CLI with a deliberate bug, replayed.
Every view shows text (never token ids, never another tokenizer's garbage) and the findings
panel shows what `specscope check --json` prints. The same walk with a GGUF file named
directly as the target (tests/gguf_files.py: a tiny Llama with a byte-level tokenizer), a
second GGUF file with the same tokenizer as its draft. Short budgets: a few rounds each."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from specscope.app.cli import main
from tests.app.conftest import dispose
from tests.app.gui.test_model_paths import _key, needs_smollm2, shown_findings
from tests.app.helpers import wait_idle

pytestmark = pytest.mark.real_model

SAMPLER = {
    "k": "4",
    "temperature": "0",
    "top_k": "0",
    "top_p": "1.0",
    "seed": "0",
    "eos": "auto",
    "device": "cpu",
    "system": "",
    "stop_strings": "",
    "stop_ids": "",
}


def cli_check(store, run_id: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["check", str(store), "--run", run_id, "--json"])
    return json.loads(out.getvalue())["runs"][0]


def shows_text(window, model=None) -> list[str]:
    """The output's token texts as the timeline draws them; none is its bare id."""
    model = model or window.model
    texts = [model.token_text(t) for t in model.output_tokens]
    assert texts and not any(text == str(t) for t, text in zip(model.output_tokens, texts)), texts
    return texts


def inspect_a_round(window) -> str:
    """The inspector on the first round with an accepted draft (else round 0): its header."""
    model = window.model
    rnd = next((r for r in model.rounds if any(n.status == "accepted" for n in r.nodes)), model.rounds[0])
    window.jump_to(rnd.index, 0 if rnd.nodes else -1)
    header = window.inspector.values["header"]
    assert "“" in header, header  # the token named by its text
    return header


def run_live(qtbot, window, step_first: bool = False) -> None:
    if step_first:
        window.runs.step()
        qtbot.waitUntil(lambda: len(window.model.rounds) >= 1 and window.live.state != "loading", timeout=240_000)
        assert window.last_error is None, window.last_error
        assert len(window.model.rounds) == 1
        shows_text(window)
        window.runs.run_or_resume()
    else:
        assert window.start_run(), window.last_error
    wait_idle(qtbot, window, timeout=240_000)
    assert window.last_error is None, window.last_error


def compare(qtbot, window, a: str, b: str) -> list:
    window.compare.set_side(0, a, 4)
    window.compare.set_side(1, b, 4)
    window.compare.set_side(2, None, 4)
    window.runs.start_compare()
    session = window.compare_session
    qtbot.waitUntil(
        lambda: (
            len(session.results) == 2
            and all(r.stop_reason for r in session.results)
            and window.compare_controller.state == "idle"
        ),
        timeout=300_000,
    )
    assert window.last_error is None and not any(e.text() for e in window.compare.errors), window.last_error
    qtbot.waitUntil(lambda: all(r is not None and r != "checking" for r in session.references), timeout=120_000)
    assert all(not isinstance(r, str) and r.identical for r in session.references), session.references
    outputs = [shows_text(window, m) for m in session.models]
    assert outputs[0] == outputs[1]  # greedy: both exact
    # a lane's Round tab shows p for a drafted node (item 7)
    lane = session.models[0]
    rnd = next((r for r in lane.rounds if r.nodes), None)
    if rnd is not None:
        lane.select(rnd.index, 0)
        assert window.compare.inspectors[0].values["p"], window.compare.inspectors[0].values["header"]
    return outputs


def plain_greedy(window, monkeypatch) -> None:
    from PySide6.QtWidgets import QMessageBox

    shown = []
    monkeypatch.setattr(QMessageBox, "information", staticmethod(lambda parent, title, text: shown.append(text)))
    found = window.checks.reference_check()
    assert found is not None and found.identical, window.last_error
    assert shown and "identical" in shown[-1]


def replay_cli_run(qtbot, window, store, expect_texts: dict[str, str]) -> None:
    from specscope.storage import TraceStore

    with TraceStore(str(store)) as st:
        run_id = st.list_runs()[0].run_id
    assert window.open_trace(str(store), run_id=run_id)
    qtbot.waitUntil(lambda: window.replay.loaded_all, timeout=120_000)
    qtbot.waitUntil(lambda: bool(window.findings.findings), timeout=60_000)
    shows_text(window)
    inspect_a_round(window)
    texts = window.run_panel.texts()
    for key, value in expect_texts.items():
        assert texts[key] == value, (key, texts[key])
    assert window.replay_panel.mismatch == [], window.replay_panel.mismatch
    report = cli_check(store, run_id)
    assert shown_findings(window) == sorted(_key(f) for f in report["findings"])
    assert len([f for f in window.findings.findings if not f.follows]) == len(report["groups"])


# ---------------------------------------------------------------------------- SmolLM2


@pytest.fixture(scope="module")
def smollm2_hub():
    pytest.importorskip("PySide6")
    from specscope.app.gui.sessions.hub import ModelHub

    return ModelHub()


@pytest.fixture
def smollm2_window(qtbot, smollm2_hub, settings_file, tmp_path):
    from specscope.app.gui import create_app
    from specscope.app.gui.main_window import MainWindow

    create_app()
    w = MainWindow(hub=smollm2_hub, settings=settings_file, store_path=str(tmp_path / "window.sqlite"))
    qtbot.addWidget(w)
    w.resize(1500, 920)
    w.show()
    yield w
    dispose(w)


@needs_smollm2
def test_smollm2_walk(qtbot, smollm2_window, tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    window = smollm2_window
    monkeypatch.chdir(tmp_path)  # the shipped draft is found wherever the window was started
    panel = window.run_panel
    panel.target.choose("smollm2")
    assert panel.texts()["proposer"] == "draft:smollm2-draft"
    prompt = "What is the capital of France?"
    panel.set_texts({"prompt": prompt, "chat": "on", "max_new_tokens": "10", **SAMPLER})
    # 1. its draft, stepped then run; 2. its head
    run_live(qtbot, window, step_first=True)
    draft_text = "".join(shows_text(window))
    assert "Paris" in draft_text, draft_text
    inspect_a_round(window)
    panel.set_field("proposer", "eagle3")
    run_live(qtbot, window)
    assert window.model.config.draft_name == "bundled:eagle3-smollm2"
    assert "".join(shows_text(window)) == draft_text
    plain_greedy(window, monkeypatch)  # the run's own target (it was the bundled one)
    # 3. the two side by side, each against plain greedy decoding
    compare(qtbot, window, "eagle3", "draft:smollm2-draft")
    # 4. the window's own eagle3 run reopens with its chat box and head
    replay_window_run(qtbot, window, prompt)
    # 5. a run recorded by the CLI with a deliberate bug, replayed
    store = tmp_path / "cli.sqlite"
    assert (
        main(
            [
                "run",
                "--target",
                "smollm2",
                "--proposer",
                "draft",
                "--chat",
                "--prompt",
                prompt,
                "--max-new",
                "10",
                "--fault",
                "target-crop-off-by-one",
                "--db",
                str(store),
            ]
        )
        == 0
    )
    replay_cli_run(
        qtbot, window, store, {"prompt": prompt, "chat": "on", "target": "smollm2", "proposer": "draft:smollm2-draft"}
    )
    assert any(f.rule == "target-cache" for f in window.findings.findings)


def replay_window_run(qtbot, window, prompt: str) -> None:
    from specscope.storage import TraceStore

    path = window.session.trace_path
    with TraceStore(path) as st:
        run = next(r for r in st.list_runs() if r.config.proposer == "eagle3" and "comparison" not in (r.extra or {}))
    window.run_panel.set_texts({"chat": "", "proposer": "draft:smollm2-draft"})
    assert window.open_trace(path, run_id=run.run_id)
    qtbot.waitUntil(lambda: window.replay.loaded_all, timeout=120_000)
    texts = window.run_panel.texts()
    assert (texts["prompt"], texts["chat"], texts["proposer"], texts["target"]) == (prompt, "on", "eagle3", "smollm2")
    assert window.replay_panel.mismatch == []
    shows_text(window)


# ---------------------------------------------------------------------------- a GGUF file named as the target


@pytest.fixture(scope="module")
def gguf_pair(tmp_path_factory):
    pytest.importorskip("gguf")
    from tests.gguf_files import write_tiny_llama

    folder = tmp_path_factory.mktemp("gguf-walk")
    target = write_tiny_llama(folder / "target.gguf", seed=5, context=2048)
    draft = write_tiny_llama(folder / "draft.gguf", seed=6, context=2048)  # other weights, the same tokenizer
    return str(target), str(draft)


def test_gguf_walk(qtbot, window, gguf_pair, tmp_path, monkeypatch):
    target, draft = gguf_pair
    panel = window.run_panel
    prompt = "the cat sat on the mat and the cat sat on the"
    panel.set_texts({"prompt": prompt, "chat": "", "max_new_tokens": "12", **SAMPLER, "eos": "none"})
    panel.set_field("target", target)
    assert panel.texts()["target"] == target
    panel.set_field("proposer", f"draft:{draft}")  # a local checkpoint: the GGUF draft
    run_live(qtbot, window, step_first=True)
    inspect_a_round(window)
    draft_text = shows_text(window)
    panel.set_field("proposer", "lookup")
    run_live(qtbot, window)
    assert shows_text(window) == draft_text
    plain_greedy(window, monkeypatch)
    compare(qtbot, window, f"draft:{draft}", "lookup")
    store = tmp_path / "cli.sqlite"
    assert (
        main(
            [
                "run",
                "--target",
                target,
                "--draft",
                draft,
                "--prompt",
                prompt,
                "--max-new",
                "12",
                "--eos-id",
                "none",
                "--k",
                "3",
                "--fault",
                "target-crop-off-by-one",
                "--db",
                str(store),
            ]
        )
        == 0
    )
    replay_cli_run(qtbot, window, store, {"prompt": prompt, "chat": ""})
