"""The views: Qt widgets (*View / *Widget) that take a model and subscribe to it. They never
import torch or SQL (an import contract in pyproject.toml); describe.py and tree_inspect.py are the
words and numbers they show for a round or a node."""

from .compare import CompareWidget
from .findings import FindingsWidget
from .inspector import RoundInspectorWidget
from .kvview import KVCacheView
from .navigator import RoundNavigatorWidget
from .pages import InspectPage
from .plots import LivePlotsWidget
from .runpanel import RunPanelWidget
from .timeline import TokenTimelineWidget
from .tree import DraftTreeView

__all__ = [
    "CompareWidget",
    "DraftTreeView",
    "FindingsWidget",
    "InspectPage",
    "KVCacheView",
    "LivePlotsWidget",
    "RoundInspectorWidget",
    "RoundNavigatorWidget",
    "RunPanelWidget",
    "TokenTimelineWidget",
]
