"""Actions as data (napari's pattern): one frozen `Action` per thing the user can do from a
menu or a key, and `install_actions`, the one place that turns a table of them into QActions,
menus and window-wide shortcuts.

Enablement rules, as napari's app-model has them: an action may carry `enabled`, a predicate
over a small `WindowContext` ("a run is active", "rounds exist", ...); `update_enablement`
sets every QAction's enabled state from the context the window computes (on each state
change). A disabled entry is greyed in its menu and its key does nothing.

A callback takes no argument. Qt's `triggered(bool checked)` never reaches it: a handler with
an optional first parameter (`def compare_stored_dialog(self, path=None)`) once took
`checked=False` for its path and returned without a dialog. A checkable action's callback
gets its new state instead, by name of the rule, not by accident.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence

Shortcut = str | QKeySequence.StandardKey | Qt.Key


@dataclass(frozen=True)
class WindowContext:
    """What the enablement rules may ask of the window."""

    run_active: bool = False  # a live run is loading, running, paused or stopping
    run_loaded: bool = False  # a run (live or stored) is on the Inspect tab
    rounds_exist: bool = False  # that run has rounds to browse, check or export
    replaying: bool = False  # the Inspect tab shows a stored run
    records: bool = True  # live runs are recorded (to a store this window may write)


Enablement = Callable[[WindowContext], bool]


def run_active(c: WindowContext) -> bool:
    return c.run_active


def rounds_exist(c: WindowContext) -> bool:
    return c.rounds_exist


def rounds_at_rest(c: WindowContext) -> bool:
    """Rounds to check or play back, and no live run holding the decoder."""
    return c.rounds_exist and not c.run_active


def records(c: WindowContext) -> bool:
    return c.records


@dataclass(frozen=True)
class Action:
    id: str  # "file.compare_runs": code and tests find the QAction by it
    title: str  # the menu text, & marks the mnemonic
    callback: Callable[..., Any] | None  # () -> Any; (checked: bool) -> Any when checkable
    menu: str  # the menu bar entry it sits in ("&File")
    shortcut: Shortcut | None = None  # a window-wide shortcut
    tip: str = ""  # the status bar tip
    group: str = ""  # a separator goes between two groups of one menu
    checkable: bool = False
    checked: Callable[[], bool] | None = None  # a checkable action's state when installed
    qaction: Callable[[], QAction] | None = None  # an action Qt makes itself (a dock's show/hide): placed as is
    enabled: Enablement | None = None  # when the action can be used (None: always)


def update_enablement(actions: Iterable[Action], qactions: dict[str, QAction], context: WindowContext) -> None:
    """Every action with a rule enabled or greyed by it in `context`."""
    for action in actions:
        if action.enabled is not None:
            qactions[action.id].setEnabled(action.enabled(context))


def install_actions(window, actions: Iterable[Action]) -> dict[str, QAction]:
    """Menus in the order their first action comes, a separator where the group changes,
    every shortcut window-wide; the QActions by id."""
    menus: dict[str, Any] = {}
    groups: dict[str, str] = {}
    made: dict[str, QAction] = {}
    for action in actions:
        if action.id in made:
            raise ValueError(f"two actions have the id {action.id!r}")
        if action.menu not in menus:
            menus[action.menu] = window.menuBar().addMenu(action.menu)
        elif groups[action.menu] != action.group:
            menus[action.menu].addSeparator()
        groups[action.menu] = action.group
        qaction = action.qaction() if action.qaction is not None else make_qaction(window, action)
        qaction.setObjectName(action.id)
        menus[action.menu].addAction(qaction)
        window.addAction(qaction)
        made[action.id] = qaction
    return made


def make_qaction(parent, action: Action) -> QAction:
    """The QAction for `action`; its `triggered` calls the callback without Qt's `checked`
    (with the new state for a checkable action)."""
    qaction = QAction(action.title, parent)
    if action.shortcut is not None:
        qaction.setShortcut(QKeySequence(action.shortcut))
        qaction.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
    if action.tip:
        qaction.setStatusTip(action.tip)
    callback = action.callback
    if callback is None:
        raise ValueError(f"the action {action.id!r} has neither a callback nor a qaction")
    if action.checkable:
        qaction.setCheckable(True)
        qaction.setChecked(bool(action.checked()) if action.checked is not None else False)
        qaction.triggered.connect(lambda checked=False: callback(bool(checked)))
    else:
        qaction.triggered.connect(lambda _checked=False: callback())
    return qaction
