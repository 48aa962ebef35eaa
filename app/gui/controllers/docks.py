"""The window's docks for its width: below NARROW_PX the live plots dock becomes a tab beside
the findings (a column of its own would be clipped) and goes back to the right when the
window is wide again; the Compare tab, with its own plots per lane, hides the single-run plots
and findings docks while it is shown (they are the Inspect tab's run's: a Compare run once ran
beside a replay's findings). Owned by the window (`window.docks`)."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDockWidget, QMainWindow, QTabWidget, QWidget

from specscope.app.gui.views.pages import InspectPage

NARROW_PX = 1400  # below this width the live plots share the left column with the findings
RUN_DOCK_PX = 320
FINDINGS_SHARE = 0.55  # of the left column, once there are findings
PLOTS_MIN_PX = 300


class DockLayout:
    def __init__(
        self,
        window: QMainWindow,
        run_dock: QDockWidget,
        plots_dock: QDockWidget,
        findings_dock: QDockWidget,
        page: InspectPage,
        tabs: QTabWidget,
        compare: QWidget,
        tab_shown: Callable[[], None],
    ):
        """`window`: the main window holding the docks; `tabs`: its Inspect, Compare and
        Calibration tabs (`compare` the Compare one); `tab_shown`: called once a tab change
        has moved the docks (the status bar follows the tab)."""
        self.w = window
        self.run_dock, self.plots_dock, self.findings_dock = run_dock, plots_dock, findings_dock
        self.page, self.tabs, self.compare = page, tabs, compare
        self.tab_shown = tab_shown
        self.plots_tabbed_for_width = False
        self.hidden_by_compare: list[QDockWidget] = []  # the docks the Compare tab hid, shown again on leaving it

    def adapt(self) -> None:
        """The plots dock tabbed with the findings below NARROW_PX wide, on the right above it."""
        w, plots = self.w, self.plots_dock
        if plots.isFloating():
            return
        if (
            w.width() < NARROW_PX
            and w.dockWidgetArea(plots) == Qt.DockWidgetArea.RightDockWidgetArea
            and not w.tabifiedDockWidgets(plots)
        ):
            w.tabifyDockWidget(self.findings_dock, plots)
            self.findings_dock.raise_()
            self.plots_tabbed_for_width = True
        elif w.width() >= NARROW_PX and (
            self.plots_tabbed_for_width or self.findings_dock in w.tabifiedDockWidgets(plots)
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
            w.resizeDocks([self.run_dock], [RUN_DOCK_PX], Qt.Orientation.Horizontal)
        else:
            w.resizeDocks(
                [self.run_dock, self.plots_dock],
                [RUN_DOCK_PX, max(PLOTS_MIN_PX, w.width() // 4)],
                Qt.Orientation.Horizontal,
            )
        body = max(300, w.height() - 80)
        w.resizeDocks(
            [self.run_dock, self.findings_dock], [int(body * 0.62), int(body * 0.38)], Qt.Orientation.Vertical
        )
        self.page.fit_sizes(max(400, w.height() - 140))

    def room_for_findings(self, count: int) -> None:
        """With findings to read, the Findings dock takes at least FINDINGS_SHARE of the left
        column's height (at 1024x700 its default share left the table one row); the run panel
        above it scrolls."""
        w = self.w
        dock = self.findings_dock
        if not count or dock.isFloating() or not dock.isVisible() or self.run_dock.isFloating():
            return
        column = dock.height() + self.run_dock.height()
        if dock.height() < column * FINDINGS_SHARE - 4:
            share = int(column * FINDINGS_SHARE)
            w.resizeDocks([self.run_dock, dock], [column - share, share], Qt.Orientation.Vertical)

    @property
    def plots_hidden_by_compare(self) -> bool:
        return self.plots_dock in self.hidden_by_compare

    def tab_changed(self, index: int) -> None:
        """The single-run docks step aside on the Compare tab and come back on leaving it."""
        if self.tabs.widget(index) is self.compare:
            self.hidden_by_compare = [d for d in (self.plots_dock, self.findings_dock) if d.isVisible()]
            for dock in self.hidden_by_compare:
                dock.hide()
        else:
            for dock in self.hidden_by_compare:
                dock.show()
            self.hidden_by_compare = []
        self.tab_shown()
