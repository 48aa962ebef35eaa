"""`specscope bench`: the decoder against plain decoding and transformers' own assisted
generation, prefill apart from decode, each method's memory, per prompt kind, with the raw
per-token latencies and per-round counts kept (measurement, report, metrics, memory,
markdown, command)."""

from .command import SCHEMA, add_bench_parser, cmd_bench, machine_info, select_prompts, settings_of
from .markdown import NOTES_MARKER, SCALE_BEGIN, SCALE_END, format_table, write_markdown
from .measurement import Bench, BenchError, Method, Sample, default_specs, method_name

__all__ = [
    "NOTES_MARKER", "SCALE_BEGIN", "SCALE_END", "SCHEMA", "Bench", "BenchError", "Method", "Sample", "add_bench_parser",
    "cmd_bench", "default_specs", "format_table", "machine_info", "method_name", "select_prompts", "settings_of",
    "write_markdown",
]
