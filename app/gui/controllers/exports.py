"""File > Export: the current view or every view as PNG, the run as JSONL. Owned by the
window (`window.exports`)."""

from __future__ import annotations

import os
from typing import Any

from PySide6.QtWidgets import QFileDialog, QWidget


class Exports:
    def __init__(self, window: Any):
        self.w = window

    def export_view_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self.w, "Export view", "specscope.png", "PNG (*.png)")
        if path:
            self.export_view(self.w.tabs.currentWidget(), path)

    def export_view(self, widget: QWidget, path: str) -> bool:
        ok = widget.grab().save(path)
        if not ok:
            self.w.show_error(f"Could not write {path}")
        return ok

    def export_all_dialog(self) -> None:
        folder = QFileDialog.getExistingDirectory(self.w, "Export all views to")
        if folder:
            self.export_all(folder)

    def export_all(self, folder: str) -> list[str]:
        w = self.w
        views = {
            "window": w,
            "timeline": w.timeline,
            "inspector": w.inspector,
            "tree": w.tree,
            "plots": w.plots,
            "findings": w.findings,
            "compare": w.compare,
            "calibration": w.calibration,
        }
        written = []
        for name, widget in views.items():
            path = os.path.join(folder, f"specscope-{name}.png")
            if widget.grab().save(path):
                written.append(path)
        w.statusBar().showMessage(f"Wrote {len(written)} PNG files to {folder}", 8000)
        return written

    def export_jsonl_dialog(self) -> None:
        if not self.w.model.rounds:
            self.w.show_error("Nothing to export yet: run or open a trace first.")
            return
        path, _ = QFileDialog.getSaveFileName(self.w, "Export run", "run.jsonl", "JSON lines (*.jsonl)")
        if path:
            self.export_jsonl(path)

    def export_jsonl(self, path: str) -> bool:
        """Export the current run with the storage layer's JSONL format."""
        from specscope.storage import export_run

        try:
            where = self.w.session.store_and_run()
            if where is None:
                raise RuntimeError("this run was not recorded, so it cannot be exported")
            export_run(where[0], where[1], path, overwrite=True)  # the save dialog asked; a store is still refused
        except Exception as exc:  # noqa: BLE001
            self.w.show_error(f"Export failed: {exc}")
            return False
        self.w.statusBar().showMessage(f"Wrote {path}", 8000)
        return True
