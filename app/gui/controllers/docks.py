"""The window's docks for its width: below NARROW_PX the live plots dock becomes a tab beside
the findings (a column of its own would be clipped) and goes back to the right when the
window is wide again; the Compare tab, with its own plots per lane, hides the single-run plots
and findings docks while it is shown (they are the Inspect tab's run's: a Compare run once ran
beside a replay's findings). Owned by the window (`window.docks`)."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt

NARROW_PX = 1400  # below this width the live plots share the left column with the findings
RUN_DOCK_PX = 320
FINDINGS_SHARE = 0.55  # of the left column, once there are findings
PLOTS_MIN_PX = 300


class DockLayout:
    def __init__(self, window: Any):
        self.w = window
        self.plots_tabbed_for_width = False
        self.hidden_by_compare: list[Any] = []  # the docks the Compare tab hid, shown again on leaving it

    def adapt(self) -> None:
        """The plots dock tabbed with the findings below NARROW_PX wide, on the right above it."""
        w, plots = self.w, self.w.plots_dock
        if plots.isFloating():
            return
        if (
            w.width() < NARROW_PX
            and w.dockWidgetArea(plots) == Qt.DockWidgetArea.RightDockWidgetArea
            and not w.tabifiedDockWidgets(plots)
        ):
            w.tabifyDockWidget(w.findings_dock, plots)
            w.findings_dock.raise_()
            self.plots_tabbed_for_width = True
        elif w.width() >= NARROW_PX and (
            self.plots_tabbed_for_width or w.findings_dock in w.tabifiedDockWidgets(plots)
        ):
            # wide again (or wide from the start with a state saved narrow): back on the right
            self.plots_tabbed_for_width = False
            w.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, plots)
            if not self.plots_hidden_by_compare:
                plots.show()
            w.resizeDocks([plots], [max(PLOTS_MIN_PX, w.width() // 4)], Qt.Orientation.Horizontal)

    def default_sizes(self) -> None:
        """Docks for the window's size (see adapt), the run panel a fixed width."""
        w = self.w
        self.adapt()
        if w.width() < NARROW_PX:
            w.resizeDocks([w.run_dock], [RUN_DOCK_PX], Qt.Orientation.Horizontal)
        else:
            w.resizeDocks(
                [w.run_dock, w.plots_dock], [RUN_DOCK_PX, max(PLOTS_MIN_PX, w.width() // 4)], Qt.Orientation.Horizontal
            )
        body = max(300, w.height() - 80)
        w.resizeDocks([w.run_dock, w.findings_dock], [int(body * 0.62), int(body * 0.38)], Qt.Orientation.Vertical)
        w.page.fit_sizes(max(400, w.height() - 140))

    def room_for_findings(self, count: int) -> None:
        """With findings to read, the Findings dock takes at least FINDINGS_SHARE of the left
        column's height (at 1024x700 its default share left the table one row); the run panel
        above it scrolls."""
        w = self.w
        dock = w.findings_dock
        if not count or dock.isFloating() or not dock.isVisible() or w.run_dock.isFloating():
            return
        column = dock.height() + w.run_dock.height()
        if dock.height() < column * FINDINGS_SHARE - 4:
            share = int(column * FINDINGS_SHARE)
            w.resizeDocks([w.run_dock, dock], [column - share, share], Qt.Orientation.Vertical)

    @property
    def plots_hidden_by_compare(self) -> bool:
        return self.w.plots_dock in self.hidden_by_compare

    def tab_changed(self, index: int) -> None:
        """The single-run docks step aside on the Compare tab and come back on leaving it."""
        w = self.w
        if w.tabs.widget(index) is w.compare:
            self.hidden_by_compare = [d for d in (w.plots_dock, w.findings_dock) if d.isVisible()]
            for dock in self.hidden_by_compare:
                dock.hide()
        else:
            for dock in self.hidden_by_compare:
                dock.show()
            self.hidden_by_compare = []
        w.update_status()
