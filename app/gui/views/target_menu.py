"""The run panel's target menu: the models app/gui/model/targets.py lists. Choosing a model
that must be fetched first does not select it: the menu keeps its choice and asks its
controller to fetch (controllers/model_fetch.py), which selects the model once it is ready.
"Local checkpoint or GGUF…" asks for a model folder (its config.json) or a .gguf file."""

from __future__ import annotations

import os

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QFileDialog, QStyle, QStyleOptionComboBox, QStylePainter

from specscope.app.gui.model.targets import FETCHABLE, LOCAL, PICK, TargetChoice, local_choice, target_choices

CHOICE_ROLE = Qt.ItemDataRole.UserRole


class TargetMenu(QComboBox):
    fetchRequested = Signal(object)  # TargetChoice of a model to fetch
    targetChosen = Signal(object)  # TargetChoice the person (or a finished fetch) selected

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setToolTip("the target model: bundled, fetched from the package registry, or a local checkpoint")
        self._chosen = 0
        self.refresh()
        self.activated.connect(self._activated)

    def choices(self) -> list[TargetChoice]:
        return [self.itemData(i, CHOICE_ROLE) for i in range(self.count())]

    def refresh(self, select: str | None = None) -> None:
        """Read the list again (after a fetch); keep the current target unless `select` names one."""
        keep = self.spec() if select is None else select
        locals_ = [c for c in self.choices() if c is not None and c.kind == LOCAL]
        self.blockSignals(True)
        self.clear()
        for choice in target_choices() + locals_:
            self._add(choice)
        self.blockSignals(False)
        self.set_spec(keep)
        # the popup shows whole entries (size and licence) even when the panel is narrow
        self.view().setMinimumWidth(self.view().sizeHintForColumn(0) + 24)

    def _add(self, choice: TargetChoice) -> int:
        index = (
            self.count() - 1
            if self.count() and self.itemData(self.count() - 1, CHOICE_ROLE).kind == PICK
            else self.count()
        )  # local entries go above "Local checkpoint or GGUF…"
        self.insertItem(index, choice.label)
        self.setItemData(index, choice, CHOICE_ROLE)
        self.setItemData(index, choice.tip or choice.label, Qt.ItemDataRole.ToolTipRole)
        return index

    def paintEvent(self, _event) -> None:
        """The closed menu shows the entry's short name ("smollm2"): the whole label (size,
        licence) is in the open list and the tooltip, and the panel stays narrow."""
        painter = QStylePainter(self)
        option = QStyleOptionComboBox()
        self.initStyleOption(option)
        choice = self.itemData(self.currentIndex(), CHOICE_ROLE) if self.count() else None
        if choice is not None and choice.short:
            option.currentText = choice.short
        painter.drawComplexControl(QStyle.ComplexControl.CC_ComboBox, option)
        painter.drawControl(QStyle.ControlElement.CE_ComboBoxLabel, option)

    def _select(self, index: int) -> None:
        self._chosen = index
        self.setCurrentIndex(index)
        choice = self.itemData(index, CHOICE_ROLE)
        self.setToolTip(choice.tip or choice.label if choice is not None else "")

    def spec(self) -> str:
        """The target field's value: "" = the bundled target."""
        choice = self.itemData(self._chosen, CHOICE_ROLE) if self.count() else None
        return choice.spec if choice is not None and choice.kind not in (PICK, FETCHABLE) else ""

    def current_choice(self) -> TargetChoice | None:
        return self.itemData(self._chosen, CHOICE_ROLE)

    def set_spec(self, spec: str) -> None:
        """Select the entry of `spec` (a local folder or file gets its own entry); nothing
        happens when it names a model that is not on this machine."""
        spec = str(spec or "")
        for i, choice in enumerate(self.choices()):
            if choice.spec == spec and choice.kind not in (PICK, FETCHABLE):
                self._select(i)
                return
        if spec and os.path.exists(spec):
            self._select(self._add(local_choice(spec)))

    def _activated(self, index: int) -> None:
        choice: TargetChoice = self.itemData(index, CHOICE_ROLE)
        if choice.kind in (FETCHABLE, PICK):
            self._select(self._chosen)  # nothing is chosen until the model is on this machine
            if choice.kind == FETCHABLE:
                self.fetchRequested.emit(choice)
            else:
                self._pick_local()
            return
        self._select(index)
        self.targetChosen.emit(choice)

    def choose(self, spec: str) -> None:
        """Select `spec` as if the person had (a finished fetch): the list is read again first."""
        self.refresh(select=spec)
        choice = self.current_choice()
        if choice is not None and choice.spec == spec:
            self.targetChosen.emit(choice)

    def _pick_local(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self,
            "Choose a target: a .gguf file, or the config.json of a checkpoint folder",
            "",
            "GGUF files or checkpoint folders (*.gguf config.json);;All files (*)",
        )
        if not path:
            return
        if os.path.basename(path) == "config.json":
            path = os.path.dirname(path)  # a checkpoint folder is named by its config.json
        self.set_spec(path)
        self.targetChosen.emit(self.current_choice())
