"""The Inspect tab: navigator, legend, token timeline, draft tree and round inspector, in a
splitter whose parts never collapse below a readable height."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QSplitter, QVBoxLayout, QWidget

from specscope.app.gui import theme
from specscope.app.gui.model.runmodel import RunModel

from .inspector import RoundInspectorWidget
from .navigator import RoundNavigatorWidget
from .timeline import TokenTimelineWidget
from .tree import DraftTreeView

TIMELINE_MIN_PX = 90
TREE_MIN_PX = 96
INSPECTOR_MIN_PX = 220


class InspectPage(QWidget):
    """Navigator, legend, timeline and (inspector | draft tree)."""

    def __init__(self, model: RunModel, parent=None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        self.navigator = RoundNavigatorWidget(model)
        layout.addWidget(self.navigator)
        self.legend = QLabel(theme.kind_legend_html())
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        layout.addWidget(self.legend)
        self.splitter = QSplitter(Qt.Orientation.Vertical)
        self.splitter.setChildrenCollapsible(False)
        self.timeline = TokenTimelineWidget(model)
        self.tree = DraftTreeView(model)
        self.inspector = RoundInspectorWidget(model)
        for i, (w, low) in enumerate(
            ((self.timeline, TIMELINE_MIN_PX), (self.tree, TREE_MIN_PX), (self.inspector, INSPECTOR_MIN_PX))
        ):
            w.setMinimumHeight(low)
            self.splitter.addWidget(w)
            self.splitter.setStretchFactor(i, (3, 1, 6)[i])
        self.splitter.setSizes([270, 150, 540])
        layout.addWidget(self.splitter, 1)
        self.tree_asked = 0  # the tallest tree the pane has grown for
        self.tree.heightWanted.connect(self.grow_tree)

    def fit_sizes(self, height: int) -> None:
        """Share `height` between timeline, tree and inspector (first layout, or no saved one)."""
        timeline = max(TIMELINE_MIN_PX, int(height * 0.24))
        tree = max(TREE_MIN_PX, int(height * 0.13))
        self.splitter.setSizes([timeline, tree, max(INSPECTOR_MIN_PX, height - timeline - tree)])

    def grow_tree(self, wanted: int) -> None:
        """Make the tree pane tall enough for a tree taller than any shown before (it opened
        about 50 px tall and clipped a 15-node tree): room from the inspector, then the
        timeline, never below their minimums. Only growth, once per height: a pane the user
        dragged smaller stays so for trees it has seen."""
        if wanted <= self.tree_asked:
            return
        self.tree_asked = wanted
        timeline, tree, inspector = self.splitter.sizes()
        if tree >= wanted or not (timeline + tree + inspector):
            return
        need = wanted - tree
        from_inspector = min(need, max(0, inspector - INSPECTOR_MIN_PX))
        from_timeline = min(need - from_inspector, max(0, timeline - TIMELINE_MIN_PX))
        self.splitter.setSizes(
            [timeline - from_timeline, tree + from_inspector + from_timeline, inspector - from_inspector]
        )
