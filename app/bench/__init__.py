"""`specscope bench`: the decoder against plain decoding and transformers' own assisted
generation, prefill apart from decode, each method's memory, per prompt kind, with the raw
per-token latencies and per-round counts kept (measurement, report, metrics, memory,
markdown, command)."""

from typing import Any

from .command import SCHEMA, add_bench_parser, cmd_bench, machine_info, select_prompts, settings_of
from .markdown import NOTES_MARKER, SCALE_BEGIN, SCALE_END, format_table, write_markdown

# measurement imports torch: loaded on first use, so building the CLI's parser (every
# `specscope` start, --help included) does not pay for it
_MEASUREMENT = ("Bench", "BenchError", "Method", "Sample", "default_specs", "method_name")


def __getattr__(name: str) -> Any:
    if name in _MEASUREMENT:
        from . import measurement

        return getattr(measurement, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "NOTES_MARKER",
    "SCALE_BEGIN",
    "SCALE_END",
    "SCHEMA",
    "Bench",
    "BenchError",
    "Method",
    "Sample",
    "add_bench_parser",
    "cmd_bench",
    "default_specs",
    "format_table",
    "machine_info",
    "method_name",
    "select_prompts",
    "settings_of",
    "write_markdown",
]
