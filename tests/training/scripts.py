"""Loading a training script (training/*.py, not a package) as a module for its tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def load_script(name: str, module_name: str) -> ModuleType:
    """training/NAME.py imported under `module_name` (registered in sys.modules, as dataclasses need)."""
    spec = importlib.util.spec_from_file_location(module_name, REPO / "training" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
