"""Compare mode's coupled lanes (core.verify.coupling), driven through the real window."""

from __future__ import annotations

from PySide6.QtCore import Qt

from specscope.core.check.checker import check_run
from specscope.core.verify.coupling import coupling_seed_of
from tests.app.gui.sessions.test_compare import wait_compare
from tests.app.helpers import configure


def _compare(qtbot, window, coupled: bool, temperature: str = "1.0"):
    configure(window, max_new_tokens="30", temperature=temperature, seed="3")
    window.tabs.setCurrentWidget(window.compare)  # as a user would: the box is on the Compare tab
    window.compare.set_side(0, "draft-small", 4)
    window.compare.set_side(1, "lookup", 3)
    if window.compare.coupled.isChecked() != coupled:
        qtbot.mouseClick(window.compare.coupled, Qt.MouseButton.LeftButton)
    qtbot.mouseClick(window.compare.compare_button, Qt.MouseButton.LeftButton)
    wait_compare(qtbot, window)
    return window.compare_session.models


def test_coupled_lanes_are_off_by_default_and_uncoupled_lanes_part(qtbot, window):
    assert not window.compare.coupled.isChecked()
    a, b = _compare(qtbot, window, coupled=False)
    assert coupling_seed_of(a.config) is None and coupling_seed_of(b.config) is None
    assert a.output_tokens != b.output_tokens  # the control: different proposers, different draws


def test_ticking_coupled_lanes_makes_both_lanes_emit_the_same_tokens(qtbot, window):
    a, b = _compare(qtbot, window, coupled=True)
    assert coupling_seed_of(a.config) == coupling_seed_of(b.config) == 3
    assert a.output_tokens == b.output_tokens and len(a.output_tokens) == 30
    assert window.compare_session.first_divergence is None
    assert "coupled lanes" in window.compare.divergence.text()
    for m in (a, b):  # each lane is an exact coupled run: the checker proves it
        assert check_run(m.config, m.rounds) == []
    # the tooltip and the inspector say that a coupled repair is the target's pick, not a residual draw
    from specscope.app.gui import theme

    tl = window.compare.timelines[0]
    repaired = [i for i in range(len(a.cells)) if a.cells.cell(i).kind == theme.REPAIRED]
    assert repaired, "lane A had no rejection"
    assert "coupled repair" in tl.tooltip_for(repaired[0])
    cell = a.cells.cell(repaired[0])
    a.select(cell.round, cell.pos)
    assert "coupled repair" in window.compare.inspectors[0].header.text()
    # recorded with the comparison: both runs of the store name it and carry the seed
    store = window.compare_recording.open_store()
    runs = [r for r in store.list_runs() if (r.extra or {}).get("comparison") == window.compare_recording.comparison]
    assert len(runs) == 2 and all(r.extra.get("coupled") == 3 for r in runs)
    assert all(coupling_seed_of(r.config) == 3 for r in runs)
    # replayed side by side from the store, the comparison still says it was coupled
    lane = {r.extra["lane"]: r.run_id for r in runs}
    assert window.traces.compare_stored(window.store_path, lane["A"], lane["B"])
    session = window.compare_session
    qtbot.waitUntil(lambda: session.source != "live" and len(session.models[1].output_tokens) == 30, timeout=20000)
    assert session.settings is None and session.coupled
    assert "coupled lanes" in window.compare.divergence.text()


def test_coupled_lanes_box_is_off_at_temperature_zero(qtbot, window):
    configure(window, temperature="0")
    assert not window.compare.coupled.isEnabled() and "T=0" in window.compare.coupled_note.text()
    configure(window, temperature="0.7")
    assert window.compare.coupled.isEnabled() and not window.compare.coupled_note.text()
    window.compare.coupled.setChecked(True)
    a, b = _compare(qtbot, window, coupled=True, temperature="0")  # ticked but greedy: ignored
    assert coupling_seed_of(a.config) is None and a.output_tokens == b.output_tokens


def test_help_explains_the_coupling(qtbot, window, monkeypatch):
    from PySide6.QtWidgets import QMessageBox

    from specscope.app.gui.views.compare import NOTE_HTML

    for words in ("Coupled lanes", "Gumbel", "exact", "prefixes agree", "sum min(p, q)"):
        assert words in NOTE_HTML  # the Compare tab's ? button
    shown = []
    monkeypatch.setattr(QMessageBox, "information", lambda parent, title, text: shown.append((title, text)))
    help_menu = next(a.menu() for a in window.menuBar().actions() if a.text() == "&Help")
    next(a for a in help_menu.actions() if a.text() == "Coupled lanes").trigger()
    assert shown and shown[0][0] == "Coupled lanes"
    assert "random numbers keyed by the output position" in shown[0][1] and "cost" in shown[0][1]


def test_lanes_that_cannot_be_coupled_are_refused_with_the_cores_message(qtbot, window):
    configure(window, temperature="1.0")
    window.tabs.setCurrentWidget(window.compare)
    window.compare.coupled.setChecked(True)
    window.compare.set_side(0, "draft-small", 4)
    window.compare.set_side(1, "draft:small,tree=2,1", 4)
    assert window.compare.lane_settings(window.run_panel.texts(), window.hub.devices()) is None
    assert window.compare.errors[1].text() == "coupling verifies chain drafts: it cannot be combined with a tree"
    window.compare.set_side(1, "lookup", 3)
    window.compare.engines[0].setCurrentText("transformers")
    assert window.compare.lane_settings(window.run_panel.texts(), window.hub.devices()) is None
    assert window.compare.errors[0].text() == "coupling applies to the specscope engine only"
