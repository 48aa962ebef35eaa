"""The GUI's models: pure data plus Qt signals, no widgets.

`RunModel` (runmodel.py) holds one run's rounds in typed arrays (compact.py), its timeline
cells, metrics (metrics.py) and the selection; `PanelSettings` (settings.py, tree shapes in
tree_settings.py) is what the run panel validates into; traces.py is the only GUI module
that talks to storage (open, record, read back)."""

from .metrics import RunMetrics
from .runmodel import RunModel
from .settings import PanelSettings, Validation, validate
from .traces import TraceLibrary

__all__ = ["PanelSettings", "RunMetrics", "RunModel", "TraceLibrary", "Validation", "validate"]
