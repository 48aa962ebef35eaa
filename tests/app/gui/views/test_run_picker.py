"""The run picker shows a store's runs at once and fills in their finding counts afterwards
(issue 42 item 13: `specscope open` of a store waited for the checker to read every run)."""

from __future__ import annotations

from types import SimpleNamespace

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QDialog, QTableWidget

from specscope.app.gui.views import run_picker


def _run(run_id: str) -> SimpleNamespace:
    config = SimpleNamespace(
        draft_name=None,
        proposer="lookup",
        k=4,
        sampling=SimpleNamespace(temperature=0.0, describe=lambda: "greedy"),
        seed=0,
        prompt_ids=[1, 2, 3],
    )
    return SimpleNamespace(
        run_id=run_id, status="completed", config=config, n_rounds=5, n_new_tokens=9, stop_reason="budget"
    )


def test_the_picker_shows_before_any_count_and_fills_them_in(qtbot):
    runs = [_run(f"run{i:05d}") for i in range(3)]
    counted: list[int] = []
    seen: dict[str, object] = {}

    def count(i: int) -> str:
        counted.append(i)
        return str(10 + i)

    def when_shown() -> None:
        dialog = next(w for w in QApplication.topLevelWidgets() if isinstance(w, QDialog) and w.isVisible())
        table = dialog.findChild(QTableWidget)
        column = run_picker.PICKER_COLUMNS.index("findings")
        seen["at_show"] = list(counted)
        seen["cell_at_show"] = table.item(0, column).text()
        qtbot.waitUntil(lambda: len(counted) == 3, timeout=5000)
        seen["cells"] = [table.item(i, column).text() for i in range(3)]
        dialog.accept()

    QTimer.singleShot(0, when_shown)
    chosen = run_picker.pick_run(None, runs, [None] * 3, findings=count)
    assert seen["at_show"] == []  # nothing counted before the table was on screen
    assert seen["cell_at_show"] == "…"
    assert seen["cells"] == ["10", "11", "12"]
    assert chosen == "run00000"
