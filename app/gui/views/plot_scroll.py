"""Live plots at a readable size wherever they sit: a compare lane, or the main window's
plots dock tabbed narrow beside the findings (issue 20: at 1024x700 plots side by side were
clipped slivers)."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QScrollArea

from .plots import LivePlotsWidget


class ScrollingPlots(QScrollArea):
    """Plots at a readable size: two columns when there is room, else one below the other,
    scrolling vertically (a narrow window squeezed them into clipped slivers), and sideways
    where the room is narrower than one plot (three compare lanes at 1024 px)."""

    PLOT_W, PLOT_H = 290, 150  # the least a plot needs for its title, ticks and axis labels

    def __init__(self, plots: LivePlotsWidget):
        super().__init__()
        self.plots = plots
        self.cols = 2
        self.setWidgetResizable(True)
        self.setFrameShape(QScrollArea.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.setWidget(plots)
        plots.setMinimumWidth(self.PLOT_W)  # narrower, it scrolls sideways instead of cutting the axes
        self._fit(self.viewport().width())

    def resizeEvent(self, event) -> None:
        self._fit(event.size().width())
        super().resizeEvent(event)

    def _fit(self, width: int) -> None:
        cols = 2 if width >= 2 * self.PLOT_W else 1
        shown = [self.plots.plots[name] for name in self.plots.shown]
        if cols != self.cols:
            layout = self.plots.graphics.ci
            for item in shown:
                layout.removeItem(item)
            for j, item in enumerate(shown):
                layout.addItem(item, row=j // cols, col=j % cols)
            self.cols = cols
        summary = self.plots.summary.sizeHint().height() if self.plots.summary.isVisibleTo(self.plots) else 0
        self.plots.setMinimumHeight(
            -(-len(shown) // cols) * self.PLOT_H + summary
        )  # the summary below takes none of it
