"""The window's menus, keys, exports, drag and drop and help (mixed into MainWindow).

The stepping keys (Space, Right, Left, Home, End) step wherever the focus is in the window:
a text field would otherwise take them (it claims them through a ShortcutOverride event),
so an application event filter withholds them from every field but the prompt (and the
checkpoint path), where they still type."""

from __future__ import annotations

import os

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QApplication, QFileDialog, QMessageBox, QWidget

from . import theme
from .compare import COUPLING_HTML
from .kvview import HELP_HTML as KV_HELP

STEP_KEYS = (Qt.Key.Key_Space, Qt.Key.Key_Right, Qt.Key.Key_Left, Qt.Key.Key_Home, Qt.Key.Key_End)


class StepKeys(QObject):
    """Withholds the stepping keys from the window's fields (but `typing_fields`), so the
    window's shortcuts get them."""

    def __init__(self, window, typing_fields, parent=None):
        super().__init__(parent)
        self.window = window
        self.typing_fields = tuple(typing_fields)

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 (Qt API)
        if event.type() != QEvent.Type.ShortcutOverride or event.key() not in STEP_KEYS:
            return False
        if event.modifiers() & ~Qt.KeyboardModifier.KeypadModifier:
            return False
        if not isinstance(obj, QWidget) or obj.window() is not self.window or obj in self.typing_fields:
            return False  # dialogs, and the prompt, keep their keys
        event.ignore()  # not overridden: the shortcut fires
        return True


class WindowMenus:
    def _action(self, menu, text: str, slot, shortcut=None, tip: str = "") -> QAction:
        act = QAction(text, self)
        if shortcut is not None:
            act.setShortcut(QKeySequence(shortcut))
            act.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        if tip:
            act.setStatusTip(tip)
        act.triggered.connect(slot)
        menu.addAction(act)
        self.addAction(act)
        return act

    def _build_menus(self) -> None:
        bar = self.menuBar()
        f = bar.addMenu("&File")
        self.open_action = self._action(f, "&Open trace…", self.open_trace_dialog, QKeySequence.StandardKey.Open)
        self.open_last_action = self._action(f, "Open &last trace", self.open_last_trace, "Ctrl+Shift+O")
        self.open_recorded_action = self._action(f, "Open the &recording store", self.open_recording_store)
        self.full_vectors_action = self._action(
            f, "Record &full probability vectors", self._full_vectors_toggled,
            tip="Recordings keep every p, q and residual in full (about 40x the bytes of the top-N at a vocabulary "
                "of 4096, and slower to record); otherwise the top-N and each vector's support, minimum and sum")
        self.full_vectors_action.setCheckable(True)
        self.recording.full_vectors = str(self.qsettings.value("recording/full_vectors", "false")) == "true"
        self.full_vectors_action.setChecked(self.recording.full_vectors)
        self._action(f, "&Compare two runs…", self.compare_stored_dialog,
                     tip="Put two stored runs of a trace store side by side on the Compare tab")
        self._action(f, "&Diff two runs of a trace…", self.diff_runs_dialog,
                     tip="Align two stored runs and report the first divergence in tokens, p and caches")
        f.addSeparator()
        self._action(f, "Export current view as &PNG…", self.export_view_dialog, "Ctrl+E")
        self._action(f, "Export all views as PNG to a folder…", self.export_all_dialog)
        self._action(f, "Export run as &JSONL…", self.export_jsonl_dialog, "Ctrl+J")
        f.addSeparator()
        self._action(f, "&Quit", self.close, QKeySequence.StandardKey.Quit)
        r = bar.addMenu("&Run")
        self.run_action = self._action(r, "Run / Pause", self.toggle_run, Qt.Key.Key_Space)
        self.step_action = self._action(r, "Step one round / next round", self.step_or_next, Qt.Key.Key_Right)
        self.back_action = self._action(r, "Previous round", self.navigator.prev, Qt.Key.Key_Left)
        self._action(r, "First round", self.navigator.first, Qt.Key.Key_Home)
        self._action(r, "Last round", self.navigator.last, Qt.Key.Key_End)
        self._action(r, "Stop", self.stop, "Ctrl+.")
        r.addSeparator()
        self.recompute_action = self._action(
            r, "Re&compute check (replay the target)", self.recompute_check,
            tip="Recompute every round's p with the target from the full prefix and compare with the recorded p")
        v = bar.addMenu("&View")
        for dock in (self.run_dock, self.plots_dock, self.findings_dock):
            v.addAction(dock.toggleViewAction())
        h = bar.addMenu("&Help")
        self._action(h, "Legend and keys", self.show_help)
        self._action(h, "KV caches", lambda: QMessageBox.information(self, "KV caches", KV_HELP))
        self._action(h, "Coupled lanes", lambda: QMessageBox.information(self, "Coupled lanes", COUPLING_HTML))
        self.step_keys = StepKeys(self, (self.run_panel.prompt, self.run_panel.checkpoint), self)
        QApplication.instance().installEventFilter(self.step_keys)

    def show_help(self) -> None:
        QMessageBox.information(
            self, "specscope",
            "<p><b>Timeline</b>: " + theme.kind_legend_html() + "</p>"
            "<p><b>Keys</b> (wherever the focus is, except while typing in the prompt): Space run/pause "
            "(replay: play), Right step one round (replay: next round), Left previous round, Home/End "
            "first/last round, Ctrl+O open a trace.</p>"
            "<p>Hover a token for p, q, p/q, u and the decision; click it to inspect its round.</p>"
            "<p><b>Threads</b>: torch's CPU threads for decoding (run panel); the status bar shows the value.</p>")

    # ------------------------------------------------------------------ export

    def export_view_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export view", "specscope.png", "PNG (*.png)")
        if path:
            self.export_view(self.tabs.currentWidget(), path)

    def export_view(self, widget: QWidget, path: str) -> bool:
        ok = widget.grab().save(path)
        if not ok:
            self.show_error(f"Could not write {path}")
        return ok

    def export_all_dialog(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Export all views to")
        if folder:
            self.export_all(folder)

    def export_all(self, folder: str) -> list[str]:
        views = {"window": self, "timeline": self.timeline, "inspector": self.inspector, "tree": self.tree,
                 "plots": self.plots, "findings": self.findings, "compare": self.compare}
        written = []
        for name, widget in views.items():
            path = os.path.join(folder, f"specscope-{name}.png")
            if widget.grab().save(path):
                written.append(path)
        self.statusBar().showMessage(f"Wrote {len(written)} PNG files to {folder}", 8000)
        return written

    def export_jsonl_dialog(self) -> None:
        if not self.model.rounds:
            self.show_error("Nothing to export yet: run or open a trace first.")
            return
        path, _ = QFileDialog.getSaveFileName(self, "Export run", "run.jsonl", "JSON lines (*.jsonl)")
        if path:
            self.export_jsonl(path)

    def export_jsonl(self, path: str) -> bool:
        """Export the current run with the storage layer's JSONL format."""
        from specscope.storage import export_run

        try:
            where = self.session.store_and_run()
            if where is None:
                raise RuntimeError("this run was not recorded, so it cannot be exported")
            export_run(where[0], where[1], path, overwrite=True)  # the save dialog asked; a store is still refused
        except Exception as exc:  # noqa: BLE001
            self.show_error(f"Export failed: {exc}")
            return False
        self.statusBar().showMessage(f"Wrote {path}", 8000)
        return True

    # ------------------------------------------------------------------ drag and drop

    def dragEnterEvent(self, event) -> None:  # noqa: N802 (Qt API)
        from .traces import looks_like_trace

        urls = event.mimeData().urls() if event.mimeData().hasUrls() else []
        if any(u.isLocalFile() and looks_like_trace(u.toLocalFile()) for u in urls):
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:  # noqa: N802 (Qt API)
        from .traces import looks_like_trace

        for u in event.mimeData().urls():
            if u.isLocalFile() and looks_like_trace(u.toLocalFile()):
                self.open_trace(u.toLocalFile())
                event.acceptProposedAction()
                return
