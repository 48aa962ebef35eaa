"""The run picker: a table of a trace store's runs with what tells them apart (proposer, k,
temperature, seed, rounds, tokens, stop, finding count, the prompt's start)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from specscope.app.gui.model.runmodel import visible_text
from specscope.app.gui.model.traces import describe_run

PICKER_COLUMNS = (
    "run",
    "status",
    "proposer",
    "k",
    "T",
    "seed",
    "rounds",
    "tokens",
    "stop",
    "findings",
    "prompt starts",
)
PROMPT_START = 32


def run_row(info: Any, prompt: str | None, findings: str = "—") -> list[str]:
    """The picker's cells for one run."""
    cfg = info.config
    tokens = getattr(info, "n_new_tokens", None)
    if tokens is None:
        tokens = len(getattr(info, "new_tokens", ()))
    start = visible_text(prompt or "")[:PROMPT_START] if prompt else f"{len(cfg.prompt_ids)} token ids"
    return [
        info.run_id[:8],
        info.status,
        cfg.draft_name or cfg.proposer,
        str(cfg.k),
        f"{cfg.sampling.temperature:g}",
        str(cfg.seed),
        str(info.n_rounds),
        str(tokens),
        info.stop_reason or "—",
        findings,
        start,
    ]


def pick_run(
    parent,
    runs: list[Any],
    prompts: list[str | None],
    title: str = "Open trace",
    findings: list[str] | Callable[[int], str] | None = None,
) -> str | None:
    """A table of the runs; the chosen run's id (None when cancelled). `findings` is each run's
    count, or a function giving run i's count: then the table shows at once with "…" in that
    column and the counts fill in one run per event-loop pass (the checker reads every round)."""
    lazy = callable(findings)
    dialog = QDialog(parent)
    dialog.setWindowTitle(title)
    table = QTableWidget(len(runs), len(PICKER_COLUMNS))
    table.setHorizontalHeaderLabels(PICKER_COLUMNS)
    table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    for i, (info, prompt) in enumerate(zip(runs, prompts)):
        count = "…" if lazy else (findings[i] if findings else "—")
        for j, text in enumerate(run_row(info, prompt, count)):
            item = QTableWidgetItem(text)
            item.setToolTip(describe_run(info) + (f"\n{prompt[:400]}" if prompt else ""))
            table.setItem(i, j, item)
    table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    table.horizontalHeader().setStretchLastSection(True)
    table.selectRow(0)
    buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Open | QDialogButtonBox.StandardButton.Cancel)
    buttons.accepted.connect(dialog.accept)
    buttons.rejected.connect(dialog.reject)
    table.doubleClicked.connect(lambda _: dialog.accept())
    layout = QVBoxLayout(dialog)
    layout.addWidget(table)
    layout.addWidget(buttons)
    dialog.resize(900, 360)
    if lazy:
        column = PICKER_COLUMNS.index("findings")

        def fill(i: int = 0) -> None:
            if i >= len(runs) or not dialog.isVisible():
                return
            table.item(i, column).setText(findings(i))
            QTimer.singleShot(0, lambda: fill(i + 1))

        QTimer.singleShot(0, fill)
    if dialog.exec() != QDialog.DialogCode.Accepted:
        return None
    row = table.currentRow()
    return runs[row].run_id if 0 <= row < len(runs) else None
