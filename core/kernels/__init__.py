"""Compute kernels for the shapes speculative decoding runs and the libraries serve badly on CPUs:
`few_rows` (a linear layer over the 1-16 positions of a decoding step or a verify forward)."""

from specscope.core.kernels.few_rows import (
    MAX_ROWS,
    FewRowsLinear,
    few_rows_linear,
    install,
    installed,
    kernel_available,
    kernel_status,
    remove,
)

__all__ = [
    "MAX_ROWS",
    "FewRowsLinear",
    "few_rows_linear",
    "install",
    "installed",
    "kernel_available",
    "kernel_status",
    "remove",
]
