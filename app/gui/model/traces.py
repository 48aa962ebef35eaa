"""The app's side of the trace store (no widgets here): recording live runs and reading
saved traces for replay. Everything storage-related in the GUI goes through this module."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from specscope.core.records import GenerationResult, Round, RunConfig

log = logging.getLogger(__name__)

TRACE_SUFFIXES = (".sqlite", ".sqlite3", ".db")


def default_trace_path() -> str:
    from specscope.storage import default_db_location

    return default_db_location()


def recorded_tokenizer_folder(name: str | None) -> str | None:
    """Where the tokenizer a run names can be read here: the folder itself (the window and
    the CLI record a checkpoint folder, a GGUF file's cached conversion), or a catalogued
    model's converted checkpoint once it is fetched (the CLI records `--target smollm2` as
    "smollm2"); None when it is not on this machine."""
    from specscope.core.loading import catalog

    if not name:
        return None
    if os.path.isdir(name):
        return name
    model = catalog.lookup(name)
    folder = catalog.cached_checkpoint(model) if model is not None else None
    return str(folder) if folder is not None else None


def replay_tokenizer(
    info: Any, bundled: Callable[[], Any | None], bundled_dir: Any, load: Callable[[str], Any] | None = None
) -> tuple[Any | None, str | None]:
    """The tokenizer a replayed run's text is decoded with: the one the run recorded (its
    tokenizer_hash), found as the bundled one or where the run names it (a folder, or a
    fetched model by its catalog name); else None and why (the window then shows token ids
    and says so): never another model's tokenizer, whose text would be garbage. Runs recorded
    before tokenizers were hashed fall back to the bundled tokenizer when the run's target
    was not another named model and the tokenizer's size is the run's vocabulary.
    `load(folder)` loads a tokenizer (the hub's, cached)."""
    from specscope.core.loading import models as loading

    load = load or loading.load_tokenizer
    name, digest = info.models.tokenizer_name, info.models.tokenizer_hash
    if digest is not None and digest == loading.tokenizer_sha256(bundled_dir):
        return bundled(), None
    folder = recorded_tokenizer_folder(name) if digest is not None else None
    if folder is not None and loading.tokenizer_sha256(folder) == digest:
        return load(folder), None
    if digest is not None:
        return None, (
            f"this run used another tokenizer ({name or 'unnamed'}, sha256 {digest[:12]}…), which is not "
            f"here: showing token ids"
        )
    target = info.models.target_name or ""
    if name is None and target and not target.startswith(loading.BUNDLED_PREFIX):
        return None, "this run recorded no tokenizer: showing token ids"
    tok = bundled()
    if tok is not None and info.config.vocab_size and len(tok) > info.config.vocab_size:
        return None, "the bundled tokenizer does not fit this run's vocabulary: showing token ids"
    return tok, None


def legacy_prompt_tokenizer(info: Any, bundled: Callable[[], Any | None]) -> Any | None:
    """A run that recorded no tokenizer at all (no name, no hash: runs recorded before
    tokenizers were, or by a script): the bundled tokenizer decodes its prompt only when its
    size is exactly the run's vocabulary and the run names no other model (a catalogued
    model or a checkpoint folder)."""
    from specscope.core.loading import catalog

    models = info.models
    if models.tokenizer_hash is not None or models.tokenizer_name is not None:
        return None
    target = models.target_name or ""
    if target and (os.path.exists(target) or catalog.lookup(target) is not None):
        return None
    tok = bundled()
    return tok if tok is not None and info.config.vocab_size and len(tok) == info.config.vocab_size else None


def warm_up_trace_writer() -> None:
    """With SPECSCOPE_TRACE_WRITER=process, start the writer process in the background, so
    the first recorded run does not wait for its imports. A failure here is not an error:
    the writer retries, or falls back to a thread, when a run starts."""

    def start() -> None:
        try:
            from specscope.storage.writer.api import default_mode
            from specscope.storage.writer.process import writer_process

            if default_mode() == "process":
                writer_process()
        except Exception:  # noqa: BLE001 - reported by the TraceWriter if it matters
            pass

    threading.Thread(target=start, name="specscope-writer-warm-up", daemon=True).start()


class Recorder:
    """Adapts a storage TraceWriter to the worker's write(round) / finish(result, reason)."""

    def __init__(
        self,
        store: Any,
        config: RunConfig,
        prompt_text: str | None = None,
        extra: dict | None = None,
        full_vectors: bool | None = None,
        model_info: dict | None = None,
        on_wait: Callable[[str], None] | None = None,
    ):
        from specscope.storage import TraceWriter

        self.store = store
        self.path = store.path or store.location
        self.run_id = config.run_id
        where = os.path.basename(self.path) if store.path else store.location
        say = (lambda state: on_wait(state.describe(where))) if on_wait is not None else None
        self.writer = TraceWriter(
            store,
            config,
            prompt_text=prompt_text,
            extra=extra,
            full_vectors=full_vectors,
            model_info=model_info,
            on_wait=say,
        )
        self.full_vectors = self.writer.policy.full  # the run's records must then carry them

    def write(self, r: Round) -> None:
        self.writer.write(r)

    def finish(self, result: GenerationResult | None, reason: str) -> None:
        """Close the run; a run whose store stayed locked went to a JSONL file: a
        TraceStoreError that names it (the window shows it)."""
        if result is not None:
            self.writer.finish_with(result)
        elif reason == "cancelled":
            self.writer.fail(GeneratorExit())  # stored as interrupted, stop reason "cancelled"
        elif reason == "error":
            self.writer.finish("failed", error="the decoder raised an exception")
        else:
            self.writer.finish("completed")
        if self.writer.spilled_to:
            from specscope.storage import TraceStoreError

            raise TraceStoreError(self.writer.spill_note())


class RecorderFactory:
    """Makes the Recorder of each live run; called on the worker's thread.

    It holds no widget on purpose: the worker may drop its last reference to the factory on
    its own thread, and a Qt widget deleted on a thread other than the GUI thread deadlocks
    against it (a bound method of the window here once kept the window alive until a worker
    thread released it). The window sets `full_vectors` and `prompt_text` before each run."""

    def __init__(self, store_path: str | None):
        self.store_path = store_path
        self.full_vectors = False  # False: the store's default for the vocabulary
        self.prompt_text: str | None = None
        self.store: Any | None = None  # the TraceStore, opened by the first recorded run
        self.on_wait: Callable[[str], None] | None = None  # told (any thread) when a locked store makes a run wait
        self._lock = threading.Lock()

    def open_store(self) -> Any:
        with self._lock:
            if self.store is None:
                from specscope.storage import TraceStore

                self.store = TraceStore(self.store_path or default_trace_path())
            return self.store

    def __call__(self, config: RunConfig, model_info: dict | None = None) -> Recorder:
        return Recorder(
            self.open_store(),
            config,
            prompt_text=self.prompt_text,
            full_vectors=True if self.full_vectors else None,
            model_info=model_info,
            on_wait=self.on_wait,
        )

    def close(self) -> None:
        with self._lock:
            if self.store is not None:
                self.store.close()


class TraceLibrary:
    """One open trace store file: list runs, read rounds (top-N, slimmed) and single rounds.

    A store opened for reading (create=False: every way the window opens one) is opened as the
    CLI's reading commands open it: read-only, creating and changing nothing (a store on a
    read-only mount or in a folder this user may not write reads as any other), a run whose
    writer has gone shown as interrupted without writing it, an older schema migrated in a
    copy in memory."""

    def __init__(self, path: str, create: bool = False):
        from specscope.storage import TraceStore

        self.path = path
        self.store = TraceStore(path, create=create, readonly=not create, presume_interrupted=not create)

    def close(self) -> None:
        self.store.close()

    def runs(self) -> list[Any]:
        return self.store.list_runs()

    def run(self, run_id: str) -> Any:
        return self.store.get_run(run_id)

    def count(self, run_id: str) -> int:
        return self.store.count_rounds(run_id)

    def batches(self, run_id: str, batch_size: int = 1024) -> Iterator[list[Round]]:
        """Rounds in batches, without their distributions (no blob is read): the timeline,
        the plots and the tree need none, and the inspector reads the selected round's
        vectors through `loader`. A batch costs the same at round 10 and at round 10^6."""
        start = 0
        while True:
            batch = self.store.load_rounds(run_id, start, start + batch_size, vectors=False)
            if batch:
                yield batch
            if len(batch) < batch_size:
                return
            start += batch_size

    def loader(self, run_id: str) -> Callable[[int], Round]:
        return lambda index: self.store.load_round(run_id, index, full=True)

    def rounds(self, run_id: str) -> list[Round]:
        return [r for b in self.batches(run_id) for r in b]

    def diff(self, run_a: str, run_b: str, p_tol: float = 1e-4) -> str:
        """`specscope diff` of two stored runs, as the text the GUI shows."""
        from specscope.core.check.diff import diff_runs

        loaded = [(self.store.run_config(r), self.store.load_rounds(r, full=True)) for r in (run_a, run_b)]
        result = diff_runs(loaded[0][0], loaded[0][1], loaded[1][0], loaded[1][1], p_tol=p_tol)
        lines = [
            f"A = {result.run_a}",
            f"B = {result.run_b}",
            f"compared {result.compared_tokens} tokens and {result.compared_cache_rounds} rounds of cache lengths",
        ]
        lines += [f"first {d}" for d in result.divergences] or ["no divergence"]
        return "\n".join(lines)


def as_partial(dist: Any) -> Any:
    """A live run's TopDistribution (core.sampling.dists) as the PartialDistribution a top-N trace
    reads back as (the views plot those); here because it is storage's type."""
    import numpy as np

    from specscope.storage.codec import PartialDistribution

    return PartialDistribution(np.asarray(dist), dist.known_ids, dist.stats, dist.top)


def describe_run(info: Any) -> str:
    cfg = info.config
    prop = cfg.draft_name or cfg.proposer
    return (
        f"{info.run_id[:8]} · {info.status} · {prop} k={cfg.k} {cfg.sampling.describe()} · {info.n_rounds} rounds, "
        f"{info.n_new_tokens} tokens"
    )


def looks_like_trace(path: str) -> bool:
    return os.path.splitext(path)[1].lower() in TRACE_SUFFIXES
