"""Other engines specscope records: decoders that are not specscope's own SpeculativeDecoder
but yield the same Round records (transformers' generate(), core/engines/hf_engine.py).

The names load on first use (PEP 562): importing core.engines.vllm.setup (the window asks it
whether vLLM is set up, to label its engine menus) must not import torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names, for type checkers and readers; loaded by __getattr__ at run time
    from specscope.core.engines.hf_engine import KINDS, TransformersEngine
    from specscope.core.engines.hf_private import PrivateAPIChanged, check_private_api

__all__ = ["KINDS", "PrivateAPIChanged", "TransformersEngine", "check_private_api"]


def __getattr__(name: str) -> Any:
    if name in ("KINDS", "TransformersEngine"):
        from specscope.core.engines import hf_engine

        return getattr(hf_engine, name)
    if name in ("PrivateAPIChanged", "check_private_api"):
        from specscope.core.engines import hf_private

        return getattr(hf_private, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
