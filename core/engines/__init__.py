"""Other engines specscope records: decoders that are not specscope's own SpeculativeDecoder
but yield the same Round records (transformers' generate(), core/engines/hf_engine.py)."""

from __future__ import annotations

from specscope.core.engines.hf_engine import KINDS, TransformersEngine
from specscope.core.engines.hf_private import PrivateAPIChanged, check_private_api

__all__ = ["KINDS", "PrivateAPIChanged", "TransformersEngine", "check_private_api"]
