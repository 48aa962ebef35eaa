"""The findings panel: the trace checker's findings, each clickable to its round.

Takes any iterable of findings with `round`, `position` (output position), `rule` and
`message` (attributes or dict keys; `node` = draft node and `severity` optional: the
checker's "wrong output" or "wasted work", default wrong output), so the checker's Finding
records plug in without adapters. Wrong output is listed first, then wasted work, each by
root cause. What the checker could not check (CheckReport.not_checked: rule -> why, an
optional field the trace did not record) is listed apart, greyed, under the table: those
rules neither passed nor failed.

    report = check_report(config, rounds)
    findings_widget.set_findings(report.findings, not_checked=report.not_checked)
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QHeaderView, QLabel, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget

from specscope.core.check.checker import WASTED_WORK, WRONG_OUTPUT, group_findings

_SEVERITY_COLOUR = {WRONG_OUTPUT: "#a0001e", WASTED_WORK: "#8a5a00"}
_NOT_CHECKED_COLOUR = "#6e6e6e"  # grey: neither passed nor failed


@dataclass(frozen=True)
class Finding:
    round: int
    position: int | None  # output position (index among the new tokens)
    rule: str
    message: str
    severity: str = WRONG_OUTPUT
    node: int | None = None  # draft node, when the finding concerns one
    follows: bool = False  # follows from (or repeats) an earlier cause of the same kind


def as_finding(obj: Any) -> Finding:
    def get(name: str, default=None):
        if isinstance(obj, dict):
            return obj.get(name, default)
        return getattr(obj, name, default)

    rnd = get("round", get("round_index", -1))
    pos = get("position", get("pos"))
    node = get("node")
    return Finding(
        round=int(rnd) if rnd is not None else -1,
        position=None if pos is None else int(pos),
        rule=str(get("rule", "")),
        message=str(get("message", "")),
        severity=str(get("severity", WRONG_OUTPUT)),
        node=None if node is None else int(node),
    )


def fault_never_fired(fault: str) -> str:
    """What the findings of a clean run recorded with a deliberate bug say about that bug."""
    from specscope.core.faults.zoo import FAULTS

    known = FAULTS.get(fault)
    if known is not None and known.shows_in:
        return (
            f"<span style='color:#8a5a00'>This run was recorded with the fault <b>{fault}</b> injected. No checker "
            f"rule can see it from the record (the output stays exact: wasted work, not wrong output); it shows "
            f"in {known.shows_in}.</span>"
        )
    when = f" (it fires when: {known.applies})" if known is not None else ""
    return (
        f"<span style='color:#8a5a00'>This run was recorded with the fault <b>{fault}</b> injected, and no round "
        f"shows it: it never fired in this run{when}. <code>specscope run --fault {fault}</code> names the "
        f"setting that makes it fire.</span>"
    )


class FindingsWidget(QWidget):
    """A table of findings; activating a row emits findingActivated(round, position)."""

    findingActivated = Signal(object)  # the Finding

    def __init__(self, parent=None):
        super().__init__(parent)
        self.status = QLabel("No checker results yet.")
        self.status.setWordWrap(True)  # a long summary must not widen the dock
        self.table = QTableWidget(0, 6)
        self.table.setHorizontalHeaderLabels(["round", "output token", "node", "rule", "severity", "message"])
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QTableWidget.SelectionMode.SingleSelection)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(3, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(4, QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        # One line a finding, so that a long list stays scannable in a narrow dock; the
        # selected finding's whole message is shown below the table (and in tooltips).
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.detail = QLabel()
        self.detail.setWordWrap(True)
        self.detail.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.detail.setVisible(False)
        # the rules the trace's fields did not allow, apart from the findings (not a pass)
        self.not_checked_label = QLabel()
        self.not_checked_label.setWordWrap(True)
        self.not_checked_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.not_checked_label.setVisible(False)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addWidget(self.status)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.detail)
        layout.addWidget(self.not_checked_label)
        self.findings: list[Finding] = []
        self.not_checked: dict[str, str] = {}
        self._summary: tuple = (False, None, {}, [], [])  # what the status line says (set_findings)
        self.table.cellClicked.connect(self._activate)
        self.table.cellActivated.connect(self._activate)
        self.table.currentCellChanged.connect(self._current_changed)

    def set_findings(
        self,
        findings: Iterable[Any] | None,
        checked: bool = True,
        fault: str | None = None,
        not_checked: dict[str, str] | None = None,
    ) -> None:
        """Wrong output, then wasted work; within each, root causes first: each cause, then
        (indented, dimmed) the findings that follow from it in later rounds. `fault`: the bug
        the run was recorded with (a fault run). `not_checked`: rule -> why the checker could
        not run it (CheckReport.not_checked), listed apart under the table; None leaves the
        list as set_not_checked left it, and `checked=False` (no results yet) empties it."""
        if not checked or not_checked is not None:
            self._show_not_checked(not_checked if checked else None)
        every = [as_finding(f) for f in (findings or [])]
        by_severity = {s: group_findings([f for f in every if f.severity == s]) for s in (WRONG_OUTPUT, WASTED_WORK)}
        others = group_findings([f for f in every if f.severity not in by_severity])
        groups = by_severity[WRONG_OUTPUT] + by_severity[WASTED_WORK] + others
        self.findings = []
        for g in groups:
            self.findings.append(g.cause)
            self.findings += [replace(f, follows=True) for f in g.follow_on]
        self.table.setRowCount(len(self.findings))
        for row, f in enumerate(self.findings):
            rule = f"  ↳ {f.rule}" if f.follows else f.rule
            values = [
                str(f.round),
                "" if f.position is None else str(f.position),
                "" if f.node is None else str(f.node),
                rule,
                f.severity,
                f.message,
            ]
            for col, v in enumerate(values):
                item = QTableWidgetItem(v)
                item.setToolTip(f.message if not f.follows else f"follows from an earlier finding: {f.message}")
                if f.follows:
                    item.setForeground(QColor("#7a5a60"))
                elif f.severity in _SEVERITY_COLOUR:
                    item.setForeground(QColor(_SEVERITY_COLOUR[f.severity]))
                self.table.setItem(row, col, item)
        self._show_detail(self.table.currentRow())
        self._summary = (checked, fault, by_severity, others, groups)
        self._show_status()

    def set_not_checked(self, not_checked: dict[str, str] | None) -> None:
        """What the checker could not check (rule -> why), apart from the findings."""
        self._show_not_checked(not_checked)
        self._show_status()

    def _show_status(self) -> None:
        checked, fault, by_severity, others, groups = self._summary
        if not checked:
            self.status.setText("No checker results yet.")
        elif self.findings:
            follow = len(self.findings) - len(groups)
            tail = f", {follow} follow-on" if follow else ""
            parts = [
                f"<b style='color:{_SEVERITY_COLOUR[s]}'>{len(g)} cause(s) of {s}</b>"
                for s, g in by_severity.items()
                if g
            ]
            if others:
                parts.append(f"<b>{len(others)} other cause(s)</b>")
            first = min(g.cause.round for g in groups)
            self.status.setText(f"{', '.join(parts)}: first bad round {first}{tail} — click one to jump to its round")
        elif self.not_checked:
            self.status.setText(
                f"<span style='color:#007a4d'>✔ no findings in what the trace allows checking</span>; "
                f"{len(self.not_checked)} rule(s) not checked (below)"
            )
        else:
            self.status.setText("<span style='color:#007a4d'>✔ no findings: every round passed the checks</span>")
        if checked and fault and not self.findings:  # (a flagged fault speaks for itself: the table keeps its room)
            self.status.setText(self.status.text() + "<br>" + fault_never_fired(fault))

    def _show_not_checked(self, not_checked: dict[str, str] | None) -> None:
        self.not_checked = dict(not_checked or {})
        if not self.not_checked:
            self.not_checked_label.clear()
            self.not_checked_label.setVisible(False)
            return
        rows = "".join(
            f"<br>· <b>{html.escape(rule)}</b>: {html.escape(why)}" for rule, why in self.not_checked.items()
        )
        self.not_checked_label.setText(
            f"<span style='color:{_NOT_CHECKED_COLOUR}'><b>Not checked</b> "
            f"({len(self.not_checked)}: neither passed nor failed){rows}</span>"
        )
        self.not_checked_label.setToolTip(
            "Rules the checker could not run: the trace leaves out a field they need. "
            "Unknown stays unknown; nothing is guessed."
        )
        self.not_checked_label.setVisible(True)

    def set_error(self, message: str) -> None:
        self.findings = []
        self.table.setRowCount(0)
        self._show_detail(-1)
        self._show_not_checked(None)
        self.status.setText(f"<span style='color:#a0001e'>checker failed: {message}</span>")

    def _current_changed(self, row: int, col: int, previous_row: int, previous_col: int) -> None:
        self._show_detail(row)

    def _show_detail(self, row: int) -> None:
        """The whole of finding `row` under the table (hidden when none is selected)."""
        if not 0 <= row < len(self.findings):
            self.detail.clear()
            self.detail.setVisible(False)
            return
        f = self.findings[row]
        where = [f"round {f.round}"]
        if f.position is not None:
            where.append(f"position {f.position}")
        if f.node is not None:
            where.append(f"node {f.node}")
        lead = "follows from an earlier finding · " if f.follows else ""
        self.detail.setText(
            f"{lead}<b>{html.escape(f.rule)}</b> ({html.escape(f.severity)}) · {', '.join(where)}: "
            f"{html.escape(f.message)}"
        )
        self.detail.setVisible(True)

    def _activate(self, row: int, col: int) -> None:
        if 0 <= row < len(self.findings):
            self.findingActivated.emit(self.findings[row])
