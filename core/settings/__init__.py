"""The one typed settings model (torch-free): vocabularies (`vocab`), numeric bounds (`bounds`)
and a run's settings (`model.RunSettings`), shared by the CLI, the window, the bench, the
factory, the decoder's checks and the JSONL reader. docs/architecture.md, "Settings"."""

from specscope.core.settings.bounds import BOUNDS, IntBound
from specscope.core.settings.model import FIELD_NAMES, RunSettings, SettingsError

__all__ = ["BOUNDS", "FIELD_NAMES", "IntBound", "RunSettings", "SettingsError"]
