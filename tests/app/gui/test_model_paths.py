"""Issue 42: paths of the window that were only walked with the bundled pair.

- a catalogued target's shipped draft (smollm2-draft) is a proposer menu entry that runs
  wherever the window was started, and a bundled draft with it is refused under the field;
- Run > Compare with plain greedy decodes with the run's own target;
- a run the CLI recorded with a fetched target replays with that target's tokenizer (text,
  never the bundled tokenizer's garbage), its chat box and its shipped head restored;
- the findings panel and the run picker show what `specscope check` prints;
- a stored comparison's Round tab shows p for an accepted greedy node."""

from __future__ import annotations

import json

import pytest

from specscope.app.cli import main
from specscope.app.gui.model.settings import proposer_choices, spec_of_run, validate
from specscope.core.loading import catalog
from specscope.core.loading import models as loading
from tests.app.helpers import configure, wait_idle

SAMPLER = {"k": "4", "temperature": "0", "top_k": "0", "top_p": "1.0", "seed": "0", "max_new_tokens": "8"}


def smollm2_fetched() -> bool:
    model = catalog.lookup("smollm2")
    return model is not None and catalog.cached_checkpoint(model) is not None


needs_smollm2 = pytest.mark.skipif(
    not smollm2_fetched(), reason="SmolLM2 is not fetched here (`specscope models fetch smollm2`)"
)


# ---------------------------------------------------------------------------- item 1


def test_smollm2s_draft_is_named_not_a_folder_of_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not resources/models: "no such folder: smollm2-draft" before
    got = validate({"prompt": "hi", "target": "", "proposer": "draft:smollm2-draft", **SAMPLER})
    assert "checkpoint" not in got.errors
    assert "draft model: smollm2-draft" in [c.label for c in proposer_choices(with_trees=False)]
    # a shipped draft that does not share the target's tokenizer is refused before anything loads
    assert "drafts for smollm2" in got.errors["proposer"]


@needs_smollm2
def test_the_bundled_draft_with_smollm2_is_refused_under_the_field_and_its_own_is_offered(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    got = validate({"prompt": "hi", "target": "smollm2", "proposer": "draft:small", **SAMPLER})
    assert "smollm2-draft" in got.errors.get("proposer", ""), got.errors
    assert validate({"prompt": "hi", "target": "smollm2", "proposer": "draft:smollm2-draft", **SAMPLER}).ok
    labels = [c.label for c in proposer_choices(with_trees=False, target="smollm2")]
    assert "draft model: smollm2-draft" in labels and "draft model: small" not in labels


@needs_smollm2
def test_choosing_smollm2_sets_its_draft_which_validates_anywhere(qtbot, window, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    panel = window.run_panel
    panel.target.choose("smollm2")
    assert panel.texts()["proposer"] == "draft:smollm2-draft" and panel.texts()["checkpoint"] == ""
    assert panel.proposer.currentText() == "draft model: smollm2-draft"
    assert panel.validate().ok, panel.validate().errors
    panel.set_field("proposer", "draft:small")
    assert "smollm2-draft" in panel.validate().errors["proposer"]


# ---------------------------------------------------------------------------- item 4 (no model)


def test_a_shipped_head_is_reproducible_and_reruns_as_the_targets_own():
    recorded = {"spec": "eagle3:eagle3-smollm2", "head": "bundled:eagle3-smollm2", "draw": "sampled"}
    assert spec_of_run("eagle3", recorded, "bundled:eagle3-smollm2", "smollm2") == "eagle3"
    assert spec_of_run("eagle3", recorded, "bundled:eagle3-smollm2", "specscope/target") == "eagle3:eagle3-smollm2"
    assert (
        spec_of_run("draft", {"spec": "draft:smollm2-draft"}, "specscope/smollm2-draft", "smollm2")
        == "draft:smollm2-draft"
    )


# ---------------------------------------------------------------------------- item 2


@pytest.fixture
def gguf_target(tmp_path_factory):
    pytest.importorskip("gguf")
    from tests.gguf_files import write_tiny_llama

    folder = tmp_path_factory.mktemp("gguf")
    return str(write_tiny_llama(folder / "tiny.gguf", seed=3, context=2048))


def test_compare_with_plain_greedy_uses_the_runs_own_target(qtbot, window, gguf_target, monkeypatch):
    from PySide6.QtWidgets import QMessageBox

    shown = []
    monkeypatch.setattr(QMessageBox, "information", staticmethod(lambda parent, title, text: shown.append(text)))
    configure(window, prompt="the cat sat on the mat and the cat sat", proposer="lookup", eos="none")
    window.run_panel.set_field("target", gguf_target)
    assert window.start_run(), window.last_error
    wait_idle(qtbot, window, timeout=120_000)
    window.run_panel.set_field("target", "")  # the menu names another target now: the run keeps its own
    found = window.checks.reference_check()
    assert found is not None and found.identical, window.last_error
    assert "identical" in shown[-1]


# ---------------------------------------------------------------------------- items 3 and 4 (a CLI run of SmolLM2)


@needs_smollm2
def test_a_cli_chat_run_of_smollm2_replays_as_text_with_its_chat_and_head(qtbot, window, tmp_path):
    store = tmp_path / "cli.sqlite"
    assert (
        main(
            [
                "run",
                "--target",
                "smollm2",
                "--proposer",
                "eagle3",
                "--chat",
                "--prompt",
                "What is the capital of France?",
                "--max-new",
                "8",
                "--db",
                str(store),
            ]
        )
        == 0
    )
    assert window.open_trace(str(store))
    qtbot.waitUntil(lambda: window.replay.loaded_all, timeout=60_000)
    # the run picker's prompt column: the user's turn, not the bundled tokenizer's garbage
    assert window.replay_panel.decode_prompt(window.replay.info) == "What is the capital of France?"
    texts = window.run_panel.texts()
    assert texts["prompt"] == "What is the capital of France?" and texts["chat"] == "on"
    assert texts["target"] == "smollm2" and texts["proposer"] == "eagle3"
    assert window.replay_panel.mismatch == []
    out = "".join(window.model.token_text(t) for t in window.model.output_tokens)
    assert "Paris" in out, out


def test_a_run_of_another_tokenizer_is_never_decoded_with_the_bundled_one(qtbot, bundled_hub, settings_file, tmp_path):
    """A run recorded with a tokenizer that is not here shows ids, and its prompt is not
    decoded with the bundled tokenizer (the picker showed "!→simple for�patNetworkame")."""
    from types import SimpleNamespace

    from specscope.app.gui.controllers.replay_panel import ReplayPanel
    from specscope.storage import ModelInfo

    info = SimpleNamespace(
        prompt_text=None,
        run_id="x" * 32,
        models=ModelInfo(target_name="smollm2-elsewhere", tokenizer_name="smollm2-elsewhere", tokenizer_hash="ab" * 32),
        config=SimpleNamespace(vocab_size=49152, prompt_ids=(1, 9690, 314), unrecorded=()),
    )
    panel = ReplayPanel(bundled_hub, run_panel=None, replay=None)  # only its decoding is used
    assert panel.decode_prompt(info) is None


# ---------------------------------------------------------------------------- item 5


def _cli_check(store) -> dict:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["check", str(store), "--json"])
    return {run["run_id"]: run for run in json.loads(out.getvalue())["runs"]}


def _key(f) -> tuple:
    get = (lambda k: f[k]) if isinstance(f, dict) else (lambda k: getattr(f, k))
    orderable = lambda v: -1 if v is None else v  # noqa: E731
    return (
        get("round"),
        orderable(get("position")),
        get("rule"),
        get("message"),
        orderable(get("node")),
        get("severity"),
    )


def shown_findings(window) -> list[tuple]:
    return sorted(_key(f) for f in window.findings.findings)


@pytest.mark.skipif(not loading.bundled_available(), reason="needs the bundled models")
def test_the_findings_panel_and_the_picker_show_what_specscope_check_prints(qtbot, window, tmp_path, monkeypatch):
    from specscope.app.gui.controllers import trace_dialogs

    store = tmp_path / "faults.sqlite"
    base = ["run", "--prompt", "def fib(n):", "--max-new", "32", "--db", str(store)]
    assert main(base + ["--eos-id", "269", "--fault", "eos-leak"]) == 0
    assert main(base + ["--stop-ids", "362,651", "--fault", "stop-last-token"]) == 0
    cli = _cli_check(store)
    counts = {}

    def pick(parent, runs, prompts, title="Open trace", findings=None):
        counts.update({r.run_id: findings(i) for i, r in enumerate(runs)})
        return pick.run_id

    monkeypatch.setattr(trace_dialogs, "pick_run", pick)
    for run_id, report in cli.items():
        pick.run_id = run_id
        assert window.open_trace(str(store))
        qtbot.waitUntil(lambda: window.replay.loaded_all and bool(window.findings.findings), timeout=60_000)
        assert shown_findings(window) == sorted(_key(f) for f in report["findings"])
        causes = [f for f in window.findings.findings if not f.follows]
        assert len(causes) == len(report["groups"])  # eos-leak: [eos] and [end-count]; stop-last-token: 4
        assert counts[run_id] == str(len(report["findings"]))
    assert sorted(len(r["groups"]) for r in cli.values()) == [2, 4]


# ---------------------------------------------------------------------------- item 7


def test_a_stored_comparisons_round_tab_shows_p_for_an_accepted_greedy_node(qtbot, make_window, tmp_path):
    store = tmp_path / "compare.sqlite"
    w = make_window(store_path=str(store))
    configure(w, max_new_tokens="16")
    w.compare.set_side(0, "draft-small", 4)
    w.compare.set_side(1, "draft-tiny", 2)
    w.runs.start_compare()
    qtbot.waitUntil(
        lambda: all(r.stop_reason for r in w.compare_session.results) and w.compare_controller.state == "idle",
        timeout=60_000,
    )
    runs = [m.config.run_id for m in w.compare_session.models]
    r = make_window(store_path=str(tmp_path / "other.sqlite"))
    assert r.traces.compare_stored(str(store), *runs)
    lane = r.compare_session.models[0]
    rnd = next(x for x in lane.rounds if any(n.status == "accepted" for n in x.nodes))
    node = next(n.index for n in rnd.nodes if n.status == "accepted")
    lane.select(rnd.index, node)
    values = r.compare.inspectors[0].values
    assert values["p"] and values["p"][0] > 0  # "p = — —" and an empty chart before
    assert "has p = —" not in values["header"]


# ---------------------------------------------------------------------------- two loads at once


def test_the_hub_loads_one_model_at_a_time(monkeypatch, tmp_path):
    """The preload's bundled target and a comparison's SmolLM2 loading at once failed with
    "Cannot copy out of meta tensor" (transformers builds models through process-wide state)."""
    import threading
    import time

    from specscope.app.gui.sessions import hub as hub_module

    hub = hub_module.ModelHub()
    busy, most = [0], [0]
    lock = threading.Lock()

    def load_model(folder, device, role="target"):
        with lock:
            busy[0] += 1
            most[0] = max(most[0], busy[0])
        time.sleep(0.2)
        with lock:
            busy[0] -= 1
        return object()

    monkeypatch.setattr(hub_module.loading, "load_model", load_model)
    threads = [threading.Thread(target=hub.checkpoint, args=(str(tmp_path / name), "cpu")) for name in ("a", "b", "c")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1
