"""`--engine vllm`, the host side: vLLM's own speculative decoding, run in vLLM's venv by
inside/driver.py with the capture plugin (inside/capture.py) recording each step, and
turned here into specscope's JSONL traces (docs/trace-format.md), one per prompt, which the
importer stores and the checker reads. Nothing here imports vllm."""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specscope.core.engines.vllm.setup import INSIDE, default_venv, venv_python

# specscope proposer kind -> vLLM speculative method
METHODS = {
    "lookup": "ngram",
    "draft": "draft_model",
    "eagle3": "eagle3",
    "eagle": "eagle",
    "medusa": "medusa",
    "mtp": "mtp",
}


class VllmEngineError(Exception):
    """The vLLM run failed or its capture disagrees with vLLM's output; one line."""


@dataclass
class VllmRun:
    target: str  # a checkpoint folder
    prompts: list[list[int]]
    proposer_kind: str
    proposer_path: str | None = None
    proposer_params: dict[str, Any] = field(default_factory=dict)
    k: int = 4
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    max_new_tokens: int = 32
    eos_ids: tuple[int, ...] = ()
    top_n: int = 20
    full_vectors: bool = False
    capture: bool = True
    dtype: str = "float32"
    max_model_len: int | None = None
    draft_sample_method: str | None = None  # None: vLLM's default ("greedy": drafts are one-hot)
    target_name: str | None = None
    proposer_text: str = ""
    overhead_reps: int = 0  # the driver's capture-overhead measurement (docs/vllm.md): off/on pairs after the run
    bench_serve: bool = False  # `specscope bench --engine vllm`: held ready for timed calls (VllmBenchServer)
    threads: int | None = None  # OMP_NUM_THREADS of vLLM's processes (None: vLLM's choice)
    # what vLLM does differently with the head than specscope (heads.py: head_notes), set by
    # run_driver before vLLM starts; recorded as proposer_params.vllm_notes
    notes: list[str] = field(default_factory=list)


def checkpoint_folder(ref: str | None, role: str) -> Path:
    """A checkpoint folder vLLM can load: a bundled model's folder, a fetched model's converted
    checkpoint (`smollm2`), a GGUF file's conversion, or a folder; VllmEngineError otherwise."""
    from specscope.core.loading import models as loading

    if ref is None or ref.strip().lower() in ("target", "specscope/target"):
        return Path(loading.bundled_path("target"))
    key = loading._bundled_key(ref)
    if key is not None:
        try:
            return Path(loading.bundled_path(key))
        except Exception:  # noqa: BLE001 - not bundled after all: a path
            pass
    head = ref.strip().removeprefix("bundled:")
    if head in loading.BUNDLED_HEADS + loading.BUNDLED_REAL_HEADS and not Path(ref).exists():
        # a head specscope ships, by its name (`--proposer eagle3` with `--target smollm2` names
        # eagle3-smollm2): its folder, as the specscope engine loads it (a folder of that name
        # in the working directory stays a path)
        try:
            return Path(loading.bundled_head_path(head))
        except Exception as exc:  # noqa: BLE001 - CheckpointError: the package lacks its resources
            raise VllmEngineError(str(exc)) from None
    try:
        return Path(loading._checkpoint_dir(ref, role))
    except Exception as exc:  # noqa: BLE001 - CheckpointError and friends: their message is the line
        raise VllmEngineError(str(exc)) from None


def speculative_config(run: VllmRun) -> dict[str, Any]:
    method = METHODS.get(run.proposer_kind)
    if method is None:
        raise VllmEngineError(f"the vllm engine runs {', '.join(METHODS)}, not {run.proposer_kind}")
    cfg: dict[str, Any] = {"method": method, "num_speculative_tokens": run.k}
    if method == "ngram":
        cfg["prompt_lookup_max"] = int(run.proposer_params.get("max_ngram", 3))
        cfg["prompt_lookup_min"] = int(run.proposer_params.get("min_ngram", 1))
    elif method == "mtp" and run.proposer_path is None:
        pass  # vLLM reads the MTP layers from the target's own checkpoint (config/speculative.py)
    else:
        if run.proposer_path is None:
            raise VllmEngineError(
                f"--proposer {run.proposer_kind} needs a checkpoint folder for vLLM ({run.proposer_kind}:PATH)"
            )
        cfg["model"] = str(run.proposer_path)
    if run.draft_sample_method:
        cfg["draft_sample_method"] = run.draft_sample_method
    return cfg


def driver_spec(run: VllmRun, work: Path) -> dict[str, Any]:
    longest = max((len(p) for p in run.prompts), default=0)
    return {
        "model": str(run.target),
        "dtype": run.dtype,
        "seed": run.seed,
        "max_model_len": run.max_model_len or longest + run.max_new_tokens + run.k + 8,
        "capture": run.capture,
        "capture_path": str(work / "capture.jsonl"),
        "result_path": str(work / "result.jsonl"),
        "top_n": run.top_n,
        "full_vectors": run.full_vectors,
        "speculative_config": speculative_config(run),
        "sampling": {"temperature": run.temperature, "top_k": run.top_k, "top_p": run.top_p, "seed": run.seed},
        "max_new_tokens": run.max_new_tokens,
        "eos_ids": list(run.eos_ids),
        "prompts": run.prompts,
        "overhead_reps": run.overhead_reps,
        "threads": run.threads,
        **({"bench": {"serve": True}} if run.bench_serve else {}),
        "llm_kwargs": {
            "skip_tokenizer_init": True,
            "per_request_spec_decode_metrics": "detailed",
            "gpu_memory_utilization": float(os.environ.get("SPECSCOPE_VLLM_MEMORY", "0.05")),
        },
    }


def _start_driver(
    run: VllmRun, venv: str | os.PathLike[str] | None, work: Path, stdin: int | None = None
) -> tuple[subprocess.Popen[bytes], Path]:
    """inside/driver.py started in vLLM's venv on `run`'s spec, in its own process group;
    (the process, its log)."""
    venv = Path(venv) if venv else default_venv()
    python = venv_python(venv)
    if not python.is_file():
        raise VllmEngineError(f"no vLLM venv at {venv}: run `specscope vllm setup` first")
    check_head(run)
    spec = driver_spec(run, work)
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps(spec))
    for name in ("capture.jsonl", "result.jsonl"):
        (work / name).unlink(missing_ok=True)
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    log = work / "vllm.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            [str(python), str(INSIDE / "driver.py"), str(spec_path)],
            stdin=stdin,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(work),
            start_new_session=True,  # vLLM's engine core and workers share its group: one kill ends them all
        )
    return proc, log


def run_driver(
    run: VllmRun,
    venv: str | os.PathLike[str] | None = None,
    work: Path | None = None,
    say: Callable[[str], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Run vLLM in its venv: (capture records, per-request results, timing). `cancelled()`
    is polled twice a second: True (or an exception here) ends vLLM's processes."""
    work = Path(work or tempfile.mkdtemp(prefix="specscope-vllm-"))
    proc, log = _start_driver(run, venv, work)
    try:
        while True:
            try:
                proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if cancelled is not None and cancelled():
                    raise VllmEngineError("cancelled while vLLM ran") from None
    except BaseException:
        _kill_group(proc)
        raise
    if proc.returncode != 0 or not (work / "result.jsonl").is_file():
        raise VllmEngineError(f"vLLM failed (status {proc.returncode}): {_root_cause(log)} (log: {log})")
    captured = _read_jsonl(work / "capture.jsonl") if run.capture else []
    errors = [r for r in captured if r.get("record") == "capture-error"]
    if errors:
        raise VllmEngineError(f"the capture failed inside vLLM: {errors[0]['error']} (log: {log})")
    results = _read_jsonl(work / "result.jsonl")
    timing = next((r for r in results if r.get("record") == "timing"), {})
    return captured, [r for r in results if "request_id" in r], timing


def check_head(run: VllmRun) -> None:
    """Refuse, in one line, a head folder vLLM cannot run as specscope reads it, and keep in
    `run.notes` what vLLM does differently with it (core/engines/vllm/heads.py)."""
    from specscope.core.engines.vllm.heads import head_notes

    folder = run.proposer_path or (run.target if run.proposer_kind == "mtp" else None)
    if folder is None:
        return
    try:
        run.notes = head_notes(run.proposer_kind, folder, run.k)
    except ValueError as exc:  # HeadRefused, HeadFormatError: one line naming the kind
        raise VllmEngineError(str(exc)) from None


class VllmBenchServer:
    """`specscope bench --engine vllm`: one vLLM (the target with one proposer and k) held ready
    in its venv, without the capture, so that the bench times its calls interleaved with the
    in-process rows, in the same rotating order. Each call is one prompt alone in one
    generate() (batch size 1, as the bench's other rows), timed inside the driver, which
    answers once vLLM's workers have stopped spinning (about a second after the call); between
    calls vLLM waits on its input, idle (measured: 0.08 CPU-s in 10 s). `close()` ends its
    processes; so does leaving a `with`."""

    def __init__(
        self,
        run: VllmRun,
        venv: str | os.PathLike[str] | None = None,
        work: Path | None = None,
        load_timeout_s: float = 1800.0,
    ) -> None:
        run.capture, run.bench_serve = False, True
        self.work = Path(work or tempfile.mkdtemp(prefix="specscope-vllm-bench-"))
        self.proc, self.log = _start_driver(run, venv, self.work, stdin=subprocess.PIPE)
        self._seen = 0  # bytes of result.jsonl read so far
        try:
            ready = self._next("ready", load_timeout_s)
        except BaseException:
            self.close()
            raise
        self.version: str | None = ready.get("vllm")
        self.load_s = float(ready.get("load_s", 0.0))

    def generate(self, prompt: list[int], timeout_s: float = 1800.0) -> dict[str, Any]:
        """One timed generate() of `prompt`: {s, token_ids, finish_reason, spec_decode}."""
        stdin = self.proc.stdin
        if stdin is None or self.proc.poll() is not None:
            raise VllmEngineError(f"vLLM is not running (log: {self.log})")
        try:
            stdin.write((json.dumps([int(t) for t in prompt]) + "\n").encode())
            stdin.flush()
        except OSError as exc:
            raise VllmEngineError(f"vLLM stopped taking prompts ({exc}; log: {self.log})") from None
        return self._next("bench", timeout_s)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                if self.proc.stdin is not None:
                    self.proc.stdin.write(b"quit\n")
                    self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass
        _kill_group(self.proc)

    def __enter__(self) -> VllmBenchServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _next(self, record: str, timeout_s: float) -> dict[str, Any]:
        """The driver's next answer line (result.jsonl, appended and flushed line by line)."""
        deadline = time.monotonic() + timeout_s
        path = self.work / "result.jsonl"
        while True:
            data = b""
            if path.is_file():
                with open(path, "rb") as fh:
                    fh.seek(self._seen)
                    data = fh.read()
            if b"\n" in data:
                line = data[: data.index(b"\n") + 1]
                self._seen += len(line)
                got: dict[str, Any] = json.loads(line)
                if got.get("record") != record:
                    raise VllmEngineError(f"vLLM's driver answered {got.get('record')!r}, not {record!r}")
                return got
            if self.proc.poll() is not None:
                raise VllmEngineError(
                    f"vLLM failed (status {self.proc.returncode}): {_root_cause(self.log)} (log: {self.log})"
                )
            if time.monotonic() > deadline:
                self.close()
                raise VllmEngineError(f"vLLM gave no {record} answer in {timeout_s:.0f} s (log: {self.log})")
            time.sleep(0.005)  # the call is timed inside the driver: this wait adds nothing to it


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """End the driver and every process vLLM started (its session's group)."""
    import signal

    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue


def _root_cause(log: Path) -> str:
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines()]
    for ln in reversed(lines):
        if ("Error:" in ln or "Error " in ln) and "Engine core initialization failed" not in ln:
            return ln.split("] ", 1)[-1][:400]
    return lines[-1][:400] if lines else "no output"


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


# ---------------------------------------------------------------------------- traces


def _clean(dist: dict[str, Any]) -> dict[str, Any]:
    """A captured distribution as the format's DIST: non-finite entries were stored as 0 by
    the capture (and are listed in proposer_params.nonfinite); a row with nothing finite and
    > 0 keeps one entry at 0, since a DIST names at least one token."""
    out = {k: v for k, v in dist.items() if k in ("top_ids", "top_probs", "support", "minimum", "total", "full")}
    if "full" in out and out["full"] is not None:
        out["full"] = [x if math.isfinite(x) else 0.0 for x in out["full"]]
    if not out.get("top_ids"):
        out["top_ids"], out["top_probs"] = [0], [0.0]
    return out


ONE_HOT_KEYS = ("top_ids", "top_probs", "support", "minimum", "total")


def _one_hot(token: int) -> dict[str, Any]:
    return {"top_ids": [token], "top_probs": [1.0], "support": 1, "minimum": 0.0, "total": 1.0}


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def request_trace(  # long: one loop over vLLM's steps
    run: VllmRun,
    prompt: list[int],
    steps: list[dict[str, Any]],
    result: dict[str, Any],
    vocab: int,
    vllm_version: str,
    wall_s: float | None = None,
) -> list[dict[str, Any]]:
    """The trace lines (header, rounds, end) of one request from its captured steps and what
    vLLM returned. Each step is one round; the output's tokens are vLLM's returned ones, and
    a step whose sampled tokens the scheduler cut (budget, EOS) emits only the kept ones."""
    final = list(result["token_ids"])
    greedy = run.temperature == 0
    rounds: list[dict[str, Any]] = []
    nonfinite: list[list[Any]] = []
    one_hot = True
    pos = 0
    for step in steps:
        sampled = step["sampled"]
        if not sampled:
            continue
        take = min(len(sampled), len(final) - pos)
        if take <= 0:
            break
        if sampled[:take] != final[pos : pos + take]:
            raise VllmEngineError(
                f"request {result['request_id']}: the capture's tokens {sampled[:take]} differ from "
                f"vLLM's output {final[pos : pos + take]} at output position {pos}"
            )
        drafts = step["drafts"]
        k = len(drafts)
        n_acc = len(sampled) - 1 if k else 0
        index = len(rounds)
        nodes = []
        for j, tok in enumerate(drafts):
            raw = step["nodes"][j]
            if j < n_acc and j < take:
                status = "accepted"
            elif j == n_acc and take == len(sampled):
                status = "rejected"
            else:
                status = "unvisited"
            p = raw["p"]
            if "nonfinite" in p:
                nonfinite.append([index, j, "p", p["nonfinite"]["count"], p["nonfinite"]["nan"]])
            p_token = p.get("token_p")
            node: dict[str, Any] = {
                "token": tok,
                "status": status,
                "p": _clean(p),
                "p_token": p_token if _finite(p_token) else 0.0,
            }
            if not greedy:
                if "q" in raw:
                    one_hot = False
                    q = raw["q"]
                    if "nonfinite" in q:
                        nonfinite.append([index, j, "q", q["nonfinite"]["count"], q["nonfinite"]["nan"]])
                    node["q"] = _clean(q)
                    node["q_token"] = q.get("token_p") if _finite(q.get("token_p")) else 0.0
                else:  # vLLM treats the draft as a point mass (ngram, greedy drafting): accept iff u <= p(x)
                    node["q"] = _one_hot(tok)
                    node["q_token"] = 1.0
                if status != "unvisited" and raw.get("u") is not None:
                    node["u"] = raw["u"]
            nodes.append(node)
        emitted = [{"token": t, "kind": "accepted", "node": j} for j, t in enumerate(sampled[: min(n_acc, take)])]
        if take == len(sampled):
            last = sampled[-1]
            if n_acc < k:
                emitted.append({"token": last, "kind": "repaired", "node": n_acc})
            else:
                emitted.append({"token": last, "kind": "bonus", "node": None})
        line: dict[str, Any] = {
            "record": "round",
            "index": index,
            "k": k,
            "nodes": nodes,
            "emitted": emitted,
            "timings": {
                "draft_s": step.get("draft_s", 0.0),
                "verify_s": step.get("sample_s", 0.0),
                "bookkeeping_s": 0.0,
            },
            "target_forwards": 1,
        }
        tokens = [e["token"] for e in emitted]
        line["eos"] = any(t in run.eos_ids for t in tokens)
        line["budget_stop"] = pos + take >= run.max_new_tokens
        # every draft accepted and emitted, the bonus cut by the budget (vLLM sampled it; the scheduler dropped it)
        line["bonus_withheld"] = bool(k) and n_acc >= k and take == k and not line["eos"]
        bonus = step.get("bonus_p")
        if bonus is not None and n_acc == k and take == len(sampled):
            if "nonfinite" in bonus:
                nonfinite.append([index, -1, "bonus_p", bonus["nonfinite"]["count"], bonus["nonfinite"]["nan"]])
            line["bonus_p"] = _clean(bonus)
        rounds.append(line)
        pos += take
    if pos != len(final):
        raise VllmEngineError(
            f"request {result['request_id']}: the capture holds {pos} of the {len(final)} tokens vLLM "
            f"returned (a step was not captured)"
        )
    finish = result.get("finish_reason")
    stop_reason = "budget" if finish == "length" else None
    if finish == "stop" and final and final[-1] in run.eos_ids:
        stop_reason = "eos"
    unrecorded = ["draw", "target_cache"]
    params = {
        "spec": run.proposer_text,
        "vllm": vllm_version,
        "speculative_config": speculative_config(run),
        "draft_probs": "one-hot" if one_hot else "probabilistic",
        "vllm_finish_reason": finish,
        "vllm_stop_reason": result.get("stop_reason"),
        "vllm_spec_decode": result.get("spec_decode") or {},
        "nonfinite": nonfinite,
        "vllm_notes": list(run.notes),
        "capture_counts": {
            "per_step_drafted": [len(r["nodes"]) for r in rounds if r["nodes"]],
            "per_step_accepted": [
                sum(1 for n in r["nodes"] if n["status"] == "accepted") for r in rounds if r["nodes"]
            ],
        },
    }
    header = {
        "format": "specscope-trace",
        "version": 2,
        "record": "run",
        "run_id": uuid.uuid4().hex[:16],
        "started_at": steps[0]["t"] if steps else time.time(),
        "prompt_ids": list(prompt),
        "config": {
            "max_new_tokens": run.max_new_tokens,
            "k": run.k,
            "sampling": {"temperature": run.temperature, "top_k": run.top_k, "top_p": run.top_p},
            "seed": run.seed,
            "eos_token_id": run.eos_ids[0] if run.eos_ids else None,
            "proposer": f"vllm-{METHODS[run.proposer_kind]}",
            "proposer_params": params,
            "device": "cpu",
            "dtype": run.dtype,
            "vocab_size": vocab,
            "use_cache": True,
            "position_limit": _position_limit(run.target),
        },
        "stops": {"eos_token_ids": list(run.eos_ids), "strings": [], "ids": []},
        "models": {"target_name": run.target_name or str(run.target), "draft_name": run.proposer_path},
        "library_versions": {"vllm": vllm_version},
        "unrecorded": unrecorded,
        "storage": {"top_n": run.top_n, "full_vectors": run.full_vectors},
    }
    end = {
        "record": "end",
        "status": "completed",
        "stop_reason": stop_reason,
        "error": None,
        "ended_at": time.time(),
        "wall_s": wall_s,
        "new_tokens": final,
    }
    return [header, *rounds, end]


def traces(
    run: VllmRun,
    captured: list[dict[str, Any]],
    results: list[dict[str, Any]],
    vllm_version: str,
    wall_s: float | None = None,
) -> list[list[dict[str, Any]]]:
    """One trace per prompt, in the prompts' order."""
    vocab = None
    by_req: dict[str, list[dict[str, Any]]] = {}
    draft_s = 0.0
    for rec in captured:
        if rec.get("record") == "propose":
            draft_s = rec["draft_s"]
        elif rec.get("record") == "step":
            rec["draft_s"] = draft_s
            by_req.setdefault(rec["req"].split("-")[0], []).append(rec)
            dist = rec.get("bonus_p") or (rec["nodes"][0]["p"] if rec["nodes"] else None)
            if dist is not None and vocab is None:
                vocab = None  # filled from the config below
    out = []
    for prompt, result in zip(run.prompts, results):
        out.append(
            request_trace(
                run,
                prompt,
                by_req.get(str(result["request_id"]), []),
                result,
                _vocab_size(run.target),
                vllm_version,
                wall_s,
            )
        )
    return out


def _position_limit(target: str | os.PathLike[str]) -> int | None:
    cfg = json.loads((Path(target) / "config.json").read_text())
    limit = cfg.get("max_position_embeddings")
    return int(limit) if isinstance(limit, int) and limit > 0 else None


def _vocab_size(target: str | os.PathLike[str]) -> int:
    cfg = json.loads((Path(target) / "config.json").read_text())
    vocab = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    if not vocab:
        raise VllmEngineError(f"{target}/config.json names no vocab_size")
    return int(vocab)


def write_traces(lines_per_request: list[list[dict[str, Any]]], folder: Path) -> list[Path]:
    paths = []
    for i, lines in enumerate(lines_per_request):
        path = folder / f"vllm-{i}.jsonl"
        with open(path, "w", encoding="utf-8") as fh:
            for obj in lines:
                fh.write(json.dumps(obj, allow_nan=False) + "\n")
        paths.append(path)
    return paths
