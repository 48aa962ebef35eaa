"""File > Export: the current view or every view as PNG, the run as JSONL. Owned by the
window (`window.exports`)."""

from __future__ import annotations

import os
from collections.abc import Callable

from PySide6.QtWidgets import QFileDialog, QStatusBar, QWidget

from specscope.app.gui.model.runmodel import RunModel
from specscope.app.gui.sessions.protocol import InspectSession


class Exports:
    def __init__(
        self,
        window: QWidget,
        views: Callable[[], dict[str, QWidget]],
        current_view: Callable[[], QWidget],
        model: RunModel,
        session: Callable[[], InspectSession],
        status_bar: QStatusBar,
        show_error: Callable[[str], None],
    ):
        """`window`: the dialogs' parent; `views`: every view by name ("window", "timeline",
        ...); `current_view`: the tab shown; `session`: the active session."""
        self.w = window
        self.views = views
        self.current_view = current_view
        self.model = model
        self.session = session
        self.status_bar = status_bar
        self.show_error = show_error

    def export_view_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self.w, "Export view", "specscope.png", "PNG (*.png)")
        if path:
            self.export_view(self.current_view(), path)

    def export_view(self, widget: QWidget, path: str) -> bool:
        ok = widget.grab().save(path)
        if not ok:
            self.show_error(f"Could not write {path}")
        return ok

    def export_all_dialog(self) -> None:
        folder = QFileDialog.getExistingDirectory(self.w, "Export all views to")
        if folder:
            self.export_all(folder)

    def export_all(self, folder: str) -> list[str]:
        written = []
        for name, widget in self.views().items():
            path = os.path.join(folder, f"specscope-{name}.png")
            if widget.grab().save(path):
                written.append(path)
        self.status_bar.showMessage(f"Wrote {len(written)} PNG files to {folder}", 8000)
        return written

    def export_jsonl_dialog(self) -> None:
        if not self.model.rounds:
            self.show_error("Nothing to export yet: run or open a trace first.")
            return
        path, _ = QFileDialog.getSaveFileName(self.w, "Export run", "run.jsonl", "JSON lines (*.jsonl)")
        if path:
            self.export_jsonl(path)

    def export_jsonl(self, path: str) -> bool:
        """Export the current run with the storage layer's JSONL format."""
        from specscope.storage import export_run

        try:
            where = self.session().store_and_run()
            if where is None:
                raise RuntimeError("this run was not recorded, so it cannot be exported")
            export_run(where[0], where[1], path, overwrite=True)  # the save dialog asked; a store is still refused
        except Exception as exc:  # noqa: BLE001
            self.show_error(f"Export failed: {exc}")
            return False
        self.status_bar.showMessage(f"Wrote {path}", 8000)
        return True
