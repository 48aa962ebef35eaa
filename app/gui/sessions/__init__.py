"""What drives the models, none of it with widgets.

`ModelHub` (hub.py) loads the models and builds decoders; `RunController` (worker.py) steps
a run in a QThread; `LiveSession` (live.py) fills the Inspect tab's RunModel from a live run,
`ReplaySession` (replay.py) from a stored one, `CompareSession` (compare.py) runs or reads
two lanes."""

from .compare import CompareSession
from .hub import ModelHub
from .live import LiveSession
from .replay import ReplaySession
from .worker import IDLE, LOADING, PAUSED, RUNNING, RunController

__all__ = [
    "IDLE",
    "LOADING",
    "PAUSED",
    "RUNNING",
    "CompareSession",
    "LiveSession",
    "ModelHub",
    "ReplaySession",
    "RunController",
]
