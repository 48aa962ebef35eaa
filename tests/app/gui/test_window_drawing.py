"""Issue 42 (the window with a real model): a failed start keeps the run on screen, the wheel
never turns a field of a scrolling panel, the words say what is loaded and what a round did."""

from __future__ import annotations

import pytest

from tests.app.helpers import configure, wait_idle


def test_a_failed_start_keeps_the_previous_run_and_its_title(qtbot, make_window, tmp_path):
    """Item 8: a start that fails (a checkpoint folder whose weights are corrupt) wiped the
    timeline, tree and inspector to "No rounds yet", and the title named the run that never
    started."""
    w = make_window(record=False)
    configure(w, max_new_tokens="8")
    assert w.start_run()
    wait_idle(qtbot, w)
    rounds, title = len(w.model.rounds), w.windowTitle()
    assert rounds and "live:" in title
    w.model.select(1)
    bad = tmp_path / "bad-checkpoint"
    bad.mkdir()
    (bad / "config.json").write_text("{ this is not json")
    w.run_panel.set_texts({"proposer": f"draft:{bad}"})
    assert w.start_run()
    qtbot.waitUntil(lambda: w.error_box is not None and w.error_box.isVisible(), timeout=20000)
    qtbot.wait(100)
    assert len(w.model.rounds) == rounds and w.model.stop_reason is not None
    assert w.timeline.model is w.model and w.timeline.model.rounds
    assert w.windowTitle() == title
    assert str(bad) not in w.windowTitle()


def _wheel(widget, steps=-1):
    from PySide6.QtCore import QPoint, QPointF, Qt
    from PySide6.QtGui import QWheelEvent
    from PySide6.QtWidgets import QApplication

    centre = QPointF(widget.rect().center())
    event = QWheelEvent(
        centre,
        QPointF(widget.mapToGlobal(centre.toPoint())),
        QPoint(0, 0),
        QPoint(0, 120 * steps),
        Qt.MouseButton.NoButton,
        Qt.KeyboardModifier.NoModifier,
        Qt.ScrollPhase.NoScrollPhase,
        False,
    )
    QApplication.sendEvent(widget, event)


def test_scrolling_the_run_panel_turns_no_field_it_passes_over_even_one_clicked_before(qtbot, make_window):
    """Item 9: scrolling the run panel at 1024x700 turned Children from topk to distinct: a box
    clicked earlier keeps the focus, and a focused box took the wheel as the panel scrolled
    past it. Every menu and number box of the run panel and the compare lanes, each enabled
    and each focused in turn, is scrolled over in the middle of a scroll."""
    from PySide6.QtWidgets import QAbstractSpinBox, QComboBox, QScrollArea

    w = make_window()
    w.resize(1024, 700)
    w.run_panel.set_texts({"tree": "3,2,1"})  # the Children menu is enabled for a tree
    qtbot.wait(200)
    area = next(a for a in w.findChildren(QScrollArea) if a.widget() is w.run_panel)
    boxes = (
        w.run_panel.findChildren(QComboBox)
        + w.run_panel.findChildren(QAbstractSpinBox)
        + w.compare.findChildren(QComboBox)
        + w.compare.findChildren(QAbstractSpinBox)
    )
    assert w.run_panel.children_mode in boxes and len(boxes) >= 8
    for box in boxes:
        box.setEnabled(True)
        box.setFocus()  # clicked a while ago
        before = box.currentIndex() if isinstance(box, QComboBox) else box.text()
        _wheel(area.viewport(), -1)  # the panel scrolls...
        _wheel(box, -1)  # ...and the pointer passes over the box
        _wheel(box, -1)
        after = box.currentIndex() if isinstance(box, QComboBox) else box.text()
        assert after == before, (box.objectName() or type(box).__name__, box.toolTip()[:40])
    assert area.verticalScrollBar().value() > 0  # the panel scrolled instead


def test_the_preload_says_which_target_it_loads(qtbot, hub):
    """Item 12: with Target smollm2 the status bar said "loading models (torch, then the bundled
    pair)" and "Models ready (bundled models)"; the words name the panel's target now."""
    from specscope.app.gui.sessions.live import preloading_words
    from specscope.app.gui.sessions.worker import DecodeWorker

    assert "smollm2" in preloading_words("smollm2") and "bundled" not in preloading_words("smollm2")
    assert "bundled target" in preloading_words("")
    said = []
    worker = DecodeWorker(hub, None)
    worker.preloaded.connect(said.append)
    worker.preload("cpu", "")
    assert said == ["Models ready (tiny random target and draft-small, on cpu)."]


def test_a_window_with_target_smollm2_preloads_and_names_it(qtbot, make_window, settings_file):
    from specscope.core.loading import catalog

    model = catalog.lookup("smollm2")
    if model is None or catalog.cached_checkpoint(model) is None:
        pytest.skip("SmolLM2 is not fetched (specscope models fetch smollm2)")
    settings_file.setValue("run/target", "smollm2")
    w = make_window(record=False)
    assert "smollm2" in w.statusBar().currentMessage() and "bundled" not in w.statusBar().currentMessage()
    w.start_preload()
    qtbot.waitUntil(lambda: w.statusBar().currentMessage().startswith("Models "), timeout=120000)
    assert w.statusBar().currentMessage().startswith("Models ready (target smollm2"), w.statusBar().currentMessage()


def test_a_chat_run_offers_the_chat_example_prompts(qtbot, make_window):
    """Item 12: the example prompts were all Python even for a chat model."""
    from specscope.core.loading.chat import chat_prompts

    w = make_window(record=False)

    def names():
        return [w.run_panel.example.itemText(i) for i in range(1, w.run_panel.example.count())]

    code = names()
    w.run_panel.set_texts({"chat": "true"})
    chat = chat_prompts()
    assert len(chat) == 7 and names() == [f"{p.name} ({p.kind})" for p in chat]
    w.run_panel.example.setCurrentIndex(1)
    w.run_panel.example.activated.emit(1)
    assert w.run_panel.prompt.toPlainText() == chat[0].user
    w.run_panel.set_texts({"chat": "false"})
    assert names() == code


def test_a_round_that_drafted_nothing_reads_no_acceptance_and_the_plots_show_whole_rounds(qtbot, make_window):
    """Item 12: "acceptance 0.00" after round 0, which drafted nothing; the plots' x axes ran
    -4..4 for one round with ticks at half rounds."""
    from specscope.app.gui.sessions.worker import PAUSED

    w = make_window(record=False)
    configure(w, proposer="lookup", prompt="1 2 3 4 5 6 7 8 9 10", max_new_tokens="12")
    assert w.start_run(run=False)
    qtbot.waitUntil(lambda: len(w.model.rounds) == 1 and w.live.state == PAUSED, timeout=30000)
    assert w.model.rounds[0].drafted == 0
    w.update_status()
    state = w.status_bar.full_state
    assert "acceptance — (nothing drafted)" in state and "0.00" not in state, state
    w.plots.refresh()
    assert "acceptance <b>—</b>" in w.plots.summary_html()
    for name in ("acceptance", "latency", "throughput", "cost"):
        plot = w.plots.plots[name]
        low, high = plot.viewRange()[0]
        assert (round(low, 3), round(high, 3)) == (-0.5, 4.5), (name, low, high)
        levels = plot.getAxis("bottom").tickSpacing(low, high, 400)
        assert all(spacing == 1 for spacing, _offset in levels), (name, levels)
    w.live.controller.stop()


def test_runs_without_a_path_lists_the_default_store_and_says_which(tmp_path, monkeypatch, capsys):
    """Item 13: `specscope runs` needed a path although the window records to a default store."""
    from specscope.app.cli.entry import main
    from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
    from specscope.storage import TraceStore, TraceWriter
    from tests.tiny_models import noisy_copy, tiny_lm

    store = tmp_path / "default.sqlite"
    monkeypatch.setenv("SPECSCOPE_DB", str(store))
    assert main(["runs"]) == 0
    out = capsys.readouterr()
    assert "does not exist yet" in out.out and str(store) in out.out
    target = tiny_lm("llama", seed=3)
    dec = SpeculativeDecoder(
        target, DraftModelProposer(noisy_copy(target, 0.2)), k=3, sampling=SamplingConfig(temperature=0)
    )
    config = dec.run_config([3, 9, 27], 8)
    with TraceStore(store) as s, TraceWriter(s, config) as writer:
        writer.record(dec.rounds([3, 9, 27], 8, config=config))
    assert main(["runs"]) == 0
    out = capsys.readouterr()
    assert config.run_id[:12] in out.out and f"runs in the default store {store}" in out.err


def test_a_first_start_fills_the_screen(qtbot, hub, settings_file, tmp_path, monkeypatch):
    """Item 11: the first start opened at 1218x720 on a 1920x1080 screen (and 982x542 at
    1024x700): it fills the screen's free area now."""
    from PySide6.QtCore import QRect
    from PySide6.QtGui import QScreen

    from specscope.app.gui import create_app
    from specscope.app.gui.main_window import MainWindow

    create_app()
    for room in (QRect(0, 0, 1920, 1050), QRect(0, 0, 1024, 700)):
        monkeypatch.setattr(QScreen, "availableGeometry", lambda self, room=room: QRect(room))
        w = MainWindow(hub=hub, settings=settings_file, record=False, store_path=str(tmp_path / "t.sqlite"))
        qtbot.addWidget(w)
        assert (w.width(), w.height()) == (room.width(), room.height())
        w.closed = True
        w.live.close()
        w.compare_controller.close()


def test_the_live_plots_come_back_beside_the_inspector_when_the_window_is_wide(qtbot, make_window, settings_file):
    """Item 11: a window closed narrow (the live plots a tab beside the findings) and opened or
    maximised wide kept the plots a small tab in the left column."""
    from PySide6.QtCore import Qt

    w = make_window(record=False)
    w.resize(1024, 700)
    qtbot.wait(200)
    assert w.tabifiedDockWidgets(w.plots_dock)  # narrow: a tab beside the findings
    w.close()
    again = make_window(record=False, settings=settings_file)
    again.resize(1920, 1080)
    qtbot.wait(300)
    assert not again.tabifiedDockWidgets(again.plots_dock)
    assert again.dockWidgetArea(again.plots_dock) == Qt.DockWidgetArea.RightDockWidgetArea
    assert again.plots_dock.width() >= 1920 // 5, again.plots_dock.width()


def test_leaked_tokens_are_marked_and_a_stop_finding_selects_the_stop_token(qtbot, make_window, hub):
    """Item 6: EOS and stops were found but not drawn: leaked tokens (emitted after EOS) looked
    like accepted ones, and clicking a stop finding selected the round's rejected node."""
    from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
    from specscope.core.check.checker import Finding
    from specscope.core.faults.zoo import faulty_decoder

    target, _ = hub.target("cpu")
    draft = hub.draft("draft-small", "cpu")
    prompt = [1, 2, 3, 4, 5]
    clean = SpeculativeDecoder(target, DraftModelProposer(draft), k=4, sampling=SamplingConfig(temperature=0))
    tokens = clean.generate(prompt, 24).new_tokens
    for eos in dict.fromkeys(tokens):  # an EOS inside an accepted block, tokens after it in its round
        dec = faulty_decoder(
            "eos-leak", target, DraftModelProposer(draft), k=4, sampling=SamplingConfig(temperature=0), eos_token_id=eos
        )
        out = dec.generate(prompt, 24)
        if dec.fault_rounds:
            break
    assert dec.fault_rounds, "eos-leak did not fire"
    w = make_window(record=False)
    w.model.begin(out.config)
    w.model.extend(out.rounds)
    end, stops = w.timeline.ends()
    first_eos = list(out.new_tokens).index(eos)
    assert end == first_eos and not stops
    leaked = [i for i in range(len(w.model.cells)) if w.model.cells.out_pos[i] > end]
    assert leaked, "nothing leaked past the EOS"
    assert "leaked" in w.timeline.tooltip_for(leaked[0])
    assert "leaked" not in w.timeline.tooltip_for(w.model.cells.out_cell[end])
    # a stop-flag finding (no position, no node) selects the token completing the round's stop
    # (a repair shares its rejected node's position in the selection: a round ending in a bonus)
    r = next(r for r in out.rounds if len(r.emitted) > 1 and r.emitted[-1].kind != "repaired")
    w.checks.jump_to_finding(Finding(out.config.run_id, r.index, None, "stop-flag", "the round records no stop"))
    last = w.model.cells.cell(w.model.cells.out_cell[r.emitted_before + len(r.emitted) - 1])
    assert w.model.selected == (r.index, last.pos) and last.pos >= 0


def test_one_numbering_of_a_place_in_the_navigator_the_inspector_and_the_findings(qtbot, make_window):
    """Item 6: "position 14" (navigator), "position 3 of 4 drafted" (inspector) and a finding's
    position were three numberings of one place: now the node as recorded and the output
    token (the findings' own numbers) everywhere."""
    w = make_window(record=False)
    configure(w, max_new_tokens="16", temperature="0.8", seed="3")
    assert w.start_run()
    wait_idle(qtbot, w)
    r = next((r for r in w.model.rounds if r.accepted >= 2), None)
    if r is None:
        pytest.skip("no round accepted two drafts")
    w.jump_to(r.index, 1)
    qtbot.wait(50)
    out = r.emitted_before + 1  # node 1 accepted: the round's second output token
    words = f"node 1 (of {len(r.nodes)} drafted) · output token {out}"
    assert words in w.navigator.label.text()
    assert words in w.inspector.header.text()
    assert w.findings.table.horizontalHeaderItem(1).text() == "output token"


def test_quitting_during_the_preload_does_not_wait_for_it(qtbot, make_window, hub, monkeypatch):
    """Item 13: the process lingered 2.3-6.5 s (once > 10 s) after quitting: closing the window
    waited for the worker's preload (torch's import, the models' load), which nothing can
    interrupt and which has nothing to save. The launched window (quick_quit: the process ends
    at close) no longer waits for it."""
    import threading
    import time

    release = threading.Event()
    real = hub.target

    def slow_target(device, name=""):
        release.wait(8)
        return real(device, name)

    monkeypatch.setattr(hub, "target", slow_target)
    w = make_window(record=False)
    w.quick_quit = True
    w.start_preload()
    qtbot.waitUntil(lambda: w.live.controller.worker.preloading, timeout=10000)
    started = time.perf_counter()
    w.close()
    took = time.perf_counter() - started
    release.set()
    assert took < 2.0, took
    qtbot.waitUntil(lambda: not w.live.controller.thread.isRunning(), timeout=20000)
