"""Telling a torch tensor from a numpy array without importing torch.

The verifiers and the checker share code that takes numpy arrays (a trace's rows, the exact
oracles) and torch tensors (the decoder's rows on the model's device). Commands that only read
traces (`specscope check`, `runs`, `export`) must not pay torch's import (seconds): when torch
was never imported, nothing can be a tensor.
"""

from __future__ import annotations

import sys
from typing import Any


def is_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)
