"""specscope.storage: the trace store (SQLAlchemy 2.0 + the core's record types; no Qt).

store = TraceStore()                       # default: <user data dir>/specscope/traces.sqlite
result = record(store, decoder, prompt_ids, 64)
store.list_runs(); store.round_summaries(run_id); store.load_round(run_id, 3)
export_run(store, run_id, "run.jsonl"); import_run(other_store, "run.jsonl")
with open_jsonl("run.jsonl") as mem: ...   # an in-memory store holding one trace
"""

from specscope.storage.codec import (
    DEFAULT_TOP_N,
    FULL_VECTORS_AUTO_MAX_VOCAB,
    PartialDistribution,
    StoredFullDistribution,
    is_partial,
    round_is_partial,
)
from specscope.storage.errors import (
    CorruptStoreError,
    NewerStoreError,
    NotATraceStoreError,
    RunExistsError,
    RunNotFoundError,
    SchemaVersionError,
    TraceFormatError,
    TraceStoreError,
    WriterError,
)
from specscope.storage.info import ModelInfo, RoundSummary, RunInfo, library_versions
from specscope.storage.jsonl.trace_file import TraceFile
from specscope.storage.jsonl.transfer import FORMAT_NAME, FORMAT_VERSION, export_run, import_run, open_jsonl, read_trace
from specscope.storage.migrations import CURRENT_VERSION as SCHEMA_VERSION
from specscope.storage.paths import default_db_location, user_data_dir
from specscope.storage.store import TraceStore
from specscope.storage.writer.api import TraceWriter, record

__all__ = [
    "DEFAULT_TOP_N",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "FULL_VECTORS_AUTO_MAX_VOCAB",
    "SCHEMA_VERSION",
    "CorruptStoreError",
    "ModelInfo",
    "NewerStoreError",
    "NotATraceStoreError",
    "PartialDistribution",
    "RoundSummary",
    "RunExistsError",
    "RunInfo",
    "RunNotFoundError",
    "SchemaVersionError",
    "StoredFullDistribution",
    "TraceFile",
    "TraceFormatError",
    "TraceStore",
    "TraceStoreError",
    "TraceWriter",
    "WriterError",
    "default_db_location",
    "export_run",
    "import_run",
    "is_partial",
    "library_versions",
    "open_jsonl",
    "read_trace",
    "record",
    "round_is_partial",
    "user_data_dir",
]
