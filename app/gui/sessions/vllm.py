"""The vLLM engine in the window: the run panel's or a compare lane's target run by vLLM with
its own proposer (lookup -> ngram, draft, eagle3, eagle, medusa, mtp), through the engine the
CLI's `--engine vllm` uses (core/engines/vllm/engine.py: vLLM's process, in its own venv, with
specscope's capture plugin). Runs in the decode worker's thread like every other engine.

vLLM decodes a request in one generate() call inside its own process, so the whole request
runs while the run panel says "loading models" (vLLM's start takes a minute or more on a
CPU); the captured steps are then turned into specscope's rounds (one per vLLM step, the
format the CLI imports) and handed to the worker one round at a time, as a decoder hands its
rounds: Run, Step and Pause step through them, the views fill round by round, and the
worker's recorder writes them to the window's store (the run's config carries vLLM's own
per-request counts, the NaN list the `nonfinite` rule reads, and vLLM's version). Stop
cancels between rounds, and while vLLM runs it ends vLLM's processes (the run is then
cancelled with no rounds).

Where vLLM is not set up, Run refuses under the engine field in one line (`specscope vllm
setup`), and the engine menus say so on the vllm entry (model/settings.py: engine_note).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

from specscope.app.gui.model.settings import PanelSettings
from specscope.core.decode.factory import Models, prompt_ids, resolve_eos
from specscope.core.decode.run import RunHandle
from specscope.core.decode.settings import SettingsError
from specscope.core.records import GenerationResult, Round, RunConfig

from .hub import ModelHub, Prepared, _target_folder, _target_label


class VllmRecorded:
    """What the worker drives for a vLLM lane: vLLM's finished request as a decoder whose
    start() hands over its rounds one at a time (core.decode.run.RunHandle)."""

    def __init__(self, config: RunConfig, rounds: list[Round], new_tokens: list[int], stop_reason: Any, wall_s: float):
        self.config, self.rounds = config, rounds
        self.new_tokens, self.stop_reason, self.wall_s = new_tokens, stop_reason, wall_s
        self.vocab_size = config.vocab_size

    def keep_full_vectors(self) -> None:
        """The worker asks this of a store that keeps full vectors: vLLM's rows are what the
        capture kept (top-N; --vectors full is the CLI's)."""

    def start(self, prompt_ids: list[int], config: RunConfig | None = None, **_: Any) -> RunHandle:
        config = config or self.config

        def rounds() -> Generator[Round, None, GenerationResult]:
            handed: list[Round] = []
            for rnd in self.rounds:
                handed.append(rnd)
                yield rnd
            return GenerationResult(config, list(self.new_tokens), handed, self.stop_reason, self.wall_s)

        return RunHandle(rounds(), config)


def _folder(ref: str | None, role: str) -> Path:
    from specscope.core.engines.vllm.engine import VllmEngineError, checkpoint_folder

    try:
        return checkpoint_folder(ref, role)
    except VllmEngineError as exc:
        raise SettingsError({"target" if role == "target" else "proposer": str(exc)}) from None


def vllm_run_of(settings: PanelSettings, prompt: list[int], eos: tuple[int, ...], target: Path) -> Any:
    """The engine's VllmRun of the window's settings (as `specscope run --engine vllm` makes it)."""
    from specscope.core.draft.registry import checkpoint_ref, parse_spec
    from specscope.core.engines.vllm.engine import VllmRun

    spec = parse_spec(settings.proposer)
    ref = checkpoint_ref(spec, settings.target)  # as the CLI: `eagle3` alone names the target's own head
    path = str(_folder(ref, "draft")) if ref else None
    return VllmRun(
        target=str(target),
        prompts=[list(prompt)],
        proposer_kind=spec.kind,
        proposer_path=path,
        proposer_params=dict(spec.params),
        k=settings.k,
        temperature=settings.temperature,
        top_k=settings.top_k,
        top_p=settings.top_p,
        seed=settings.seed,
        max_new_tokens=settings.max_new_tokens,
        eos_ids=eos,
        top_n=settings.top_n or 20,
        full_vectors=settings.vectors == "full",
        dtype=settings.dtype or "float32",
        target_name=getattr(settings, "target", "") or None,
        proposer_text=str(spec),
        threads=settings.threads,
    )


def recorded_rounds(
    run: Any, work: Path, cancelled: Callable[[], bool] | None = None
) -> tuple[RunConfig, list[Round], list[int], Any, float]:
    """Run vLLM (the engine's driver) and read its one request back as core records: through
    the trace format and a scratch store, exactly as `specscope run --engine vllm --db`
    imports it. (config, rounds, new tokens, stop reason, generate() seconds)."""
    from specscope.core.engines.vllm.engine import VllmEngineError, run_driver, traces, write_traces
    from specscope.storage import TraceStore
    from specscope.storage.jsonl.transfer import import_run

    try:
        captured, results, timing = run_driver(run, work=work, cancelled=cancelled)
        lines = traces(run, captured, results, timing.get("vllm", "unknown"), timing.get("generate_s"))
    except VllmEngineError as exc:
        raise RuntimeError(str(exc)) from None
    (path,) = write_traces(lines[:1], work)
    store = TraceStore(str(work / "vllm.sqlite"))
    try:
        run_id = import_run(store, path)
        info = store.get_run(run_id)
        rounds = list(store.iter_rounds(run_id, full=True))
        tokens = store.new_tokens(run_id)
    finally:
        store.close()
    return info.config, rounds, tokens, info.stop_reason or "budget", float(timing.get("generate_s") or 0.0)


def build_vllm(
    hub: ModelHub, settings: PanelSettings, run_id: str | None = None, cancelled: Callable[[], bool] | None = None
) -> Prepared:
    """A vLLM lane, prepared: settings checked (vLLM's own refusals, `specscope vllm setup`),
    the prompt encoded with the target's tokenizer, vLLM run to the end (module docstring).
    `cancelled()` (the worker's Stop, the window closing) ends vLLM's processes."""
    from specscope.core.engines.vllm.setup import not_set_up

    settings.check()
    if note := not_set_up():
        raise SettingsError({"engine": note})
    name = getattr(settings, "target", "")
    target_dir = _folder(name or None, "target")
    model, tokenizer = hub.target(settings.device, name)  # the tokenizer, and the views' token texts
    folder = _target_folder(name) if name else None
    target_name = _target_label(name, folder) if folder else "bundled:target"
    models = Models(model, tokenizer, target_name)
    if settings.chat or tokenizer is not None:
        ids = prompt_ids(settings, models, settings.prompt)
    else:
        ids = hub.encode(settings.prompt, tokenizer, int(model.config.vocab_size))
    eos = resolve_eos(settings, models)
    run = vllm_run_of(settings, ids, eos, target_dir)
    run.target_name = target_name
    work = Path(tempfile.mkdtemp(prefix="specscope-vllm-window-"))
    started = time.perf_counter()
    try:
        config, rounds, tokens, stop, wall = recorded_rounds(run, work, cancelled)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if run_id is not None:
        config = dataclasses.replace(config, run_id=run_id)
        rounds = [dataclasses.replace(r, run_id=run_id) for r in rounds]
    wall = wall or time.perf_counter() - started
    decoder = VllmRecorded(config, rounds, tokens, stop, wall)
    info = hub.model_info(settings, models)
    info["draft_name"] = run.proposer_path
    # what vLLM does differently with the head than specscope (a dropped bias, ...: engine.check_head)
    notes = tuple(f"vLLM: {note}" for note in run.notes)
    return Prepared(decoder, ids, config, hub.token_text(tokenizer), f"{settings.describe()} · vLLM", info, notes)
