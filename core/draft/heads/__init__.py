"""Draft heads fed by the target's hidden states: EAGLE, EAGLE-3, Medusa, MTP (one module
each, in its authors' checkpoint format; base.py has what they share). Each loader takes a
checkpoint folder and returns a proposer (core.draft.proposers) that names the target layers
it reads; the decoder hands it those layers' features from the verify forward it already
runs (docs/heads.md)."""

from specscope.core.draft.head_folders import HeadFormatError
from specscope.core.draft.heads.eagle import load_eagle
from specscope.core.draft.heads.eagle3 import load_eagle3
from specscope.core.draft.heads.medusa import load_medusa
from specscope.core.draft.heads.mtp import load_mtp

LOADERS = {"eagle": load_eagle, "eagle3": load_eagle3, "medusa": load_medusa, "mtp": load_mtp}

__all__ = ["LOADERS", "HeadFormatError", "load_eagle", "load_eagle3", "load_medusa", "load_mtp"]
