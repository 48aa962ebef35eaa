"""The findings panel: one line a finding, the selected one in full below the table."""

from __future__ import annotations


def test_findings_are_one_line_each_and_the_selected_one_is_shown_whole(qtbot, gui_env):
    from specscope.app.gui.views.findings import FindingsWidget

    w = FindingsWidget()
    qtbot.addWidget(w)
    w.resize(320, 400)
    w.show()
    long = "target cache holds 105 positions but only 104 are accepted: " + "and more words " * 20
    w.set_findings(
        [
            {"round": 3, "position": 7, "node": 1, "rule": "target-cache", "message": long},
            {"round": 5, "rule": "eos", "message": "tokens after <EOS>"},
        ]
    )
    assert not w.table.wordWrap()
    assert w.table.rowHeight(0) == w.table.rowHeight(1)  # a long message does not make its row taller
    assert not w.detail.isVisible()

    w.table.setCurrentCell(0, 4)
    assert w.detail.isVisible()
    text = w.detail.text()
    assert "round 3, position 7, node 1" in text and "target-cache" in text and long.strip() in text
    w.table.setCurrentCell(1, 0)
    assert "tokens after &lt;EOS&gt;" in w.detail.text() and "position" not in w.detail.text()

    w.set_error("boom")
    assert not w.detail.isVisible() and w.table.rowCount() == 0


def test_findings_are_grouped_by_root_cause(qtbot, gui_env):
    from specscope.app.gui.views.findings import FindingsWidget

    w = FindingsWidget()
    qtbot.addWidget(w)
    crop = [{"round": r, "rule": "target-cache", "message": f"stale entry in round {r}"} for r in range(3, 9)]
    eos = {"round": 5, "rule": "eos", "message": "tokens after EOS"}
    w.set_findings(crop + [eos])
    rows = [(w.table.item(r, 0).text(), w.table.item(r, 3).text()) for r in range(w.table.rowCount())]
    # the cause, then what follows from it; the other cause after them
    assert rows[0] == ("3", "target-cache") and rows[-1] == ("5", "eos")
    assert all(rule == "  ↳ target-cache" for _, rule in rows[1:6])
    assert (
        "2 cause(s)" in w.status.text() and "first bad round 3" in w.status.text() and "5 follow-on" in w.status.text()
    )
    w.table.setCurrentCell(2, 0)
    assert "follows from an earlier finding" in w.detail.text()


def test_wrong_output_is_listed_apart_from_wasted_work(qtbot, gui_env):
    from specscope.app.gui.views.findings import FindingsWidget
    from specscope.core.check.checker import Finding

    w = FindingsWidget()
    qtbot.addWidget(w)
    w.set_findings(
        [Finding("r", 1, None, "draft-budget", "k=4 past the budget"), Finding("r", 4, 2, "eos", "tokens after EOS")]
    )
    rows = [(w.table.item(r, 3).text(), w.table.item(r, 4).text()) for r in range(w.table.rowCount())]
    assert rows == [("eos", "wrong output"), ("draft-budget", "wasted work")]  # wrong output first
    text = w.status.text()
    assert "1 cause(s) of wrong output" in text and "1 cause(s) of wasted work" in text
    w.table.setCurrentCell(1, 0)
    assert "(wasted work)" in w.detail.text()


def test_what_the_checker_could_not_check_is_listed_apart_and_greyed(qtbot, gui_env):
    from specscope.app.gui.views.findings import FindingsWidget
    from specscope.core.check.checker import Finding

    w = FindingsWidget()
    qtbot.addWidget(w)
    w.resize(320, 400)
    w.show()
    not_checked = {
        "stop-leak": "the trace does not record the text of each token (pieces): stop strings not matched",
        "acceptance-draw": "field 'u' not recorded",
    }
    w.set_findings(
        [Finding("r", 4, 2, "eos", "tokens after EOS"), Finding("r", 1, None, "draft-budget", "k=4 past")],
        not_checked=not_checked,
    )
    # the findings keep their table and severities; the unchecked rules are not rows of it
    rows = [(w.table.item(r, 3).text(), w.table.item(r, 4).text()) for r in range(w.table.rowCount())]
    assert rows == [("eos", "wrong output"), ("draft-budget", "wasted work")]
    assert w.not_checked == not_checked
    assert w.not_checked_label.isVisible()
    text = w.not_checked_label.text()
    assert "Not checked" in text and "stop-leak" in text and "pieces" in text and "acceptance-draw" in text
    assert "#6e6e6e" in text  # greyed: neither passed nor failed
    # with no findings the status does not claim that every check passed
    w.set_findings([], not_checked=not_checked)
    assert "every round passed" not in w.status.text() and "2 rule(s) not checked" in w.status.text()
    assert w.not_checked_label.isVisible()
    # findings set without a report (the recompute check adding its own) keep the list
    w.set_findings([Finding("r", 2, None, "recompute", "p differs")])
    assert w.not_checked == not_checked and w.not_checked_label.isVisible()
    # a report that could check everything, a cleared panel and a failed checker show no such section
    w.set_findings([], not_checked={})
    assert not w.not_checked_label.isVisible() and "every round passed" in w.status.text()
    w.set_not_checked(not_checked)  # the status follows
    assert "2 rule(s) not checked" in w.status.text() and w.not_checked_label.isVisible()
    w.set_findings([], checked=False)
    assert not w.not_checked_label.isVisible() and w.not_checked == {}
    w.set_findings([], not_checked=not_checked)
    w.set_error("boom")
    assert not w.not_checked_label.isVisible()
