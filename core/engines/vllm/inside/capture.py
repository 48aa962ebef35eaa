"""specscope's capture of vLLM v1's speculative-decoding rounds. Installed into vLLM's own
venv by `specscope vllm setup` as the module `specscope_vllm_capture`, registered as a
`vllm.general_plugins` entry point (vLLM calls `register()` in each of its processes), so
nothing in vLLM's source changes. It imports nothing of specscope.

It is active only where SPECSCOPE_VLLM_CAPTURE names a file (the driver sets it). It wraps:

- `GPUModelRunner._sample(logits, spec_decode_metadata)` (the CPU runner inherits it): the
  request ids in row order, their computed-token counts, the step's sampled ids and time;
- in `vllm.v1.sample.rejection_sampler` (its `forward` looks these names up at call time):
  `rejection_sample` (draft ids, per-request draft counts, draft probabilities or None, the
  target's logits after vLLM's temperature/top-k/top-p, the bonus ids), `generate_uniform_probs`
  (the acceptance draws) and `sample_recovered_tokens` (the repair tokens);
- `RejectionSampler.forward`, to read the bonus rows' logits before vLLM samples them.

Per step it appends one JSON line per request: drafted ids, the target's probabilities at
every drafted position and at the bonus position (top-N, the drafted token's p, full vectors
on request; non-finite entries counted and listed, never hidden), the draft's probabilities
(or "one-hot" where vLLM treats the drafts as point masses), the uniform draws, the
recovered tokens, the sampled ids, the computed-token count before the step and timings."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where it runs (vLLM's venv has it); vLLM's own objects stay Any
    import torch

_PATCHED = False
_STATE = threading.local()

# every private name the capture relies on: (module, attribute path)
PRIVATE = (
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._sample"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.propose_draft_token_ids"),
    ("vllm.v1.sample.rejection_sampler", "RejectionSampler.forward"),
    ("vllm.v1.sample.rejection_sampler", "rejection_sample"),
    ("vllm.v1.sample.rejection_sampler", "apply_sampling_constraints"),
    ("vllm.v1.sample.rejection_sampler", "generate_uniform_probs"),
    ("vllm.v1.sample.rejection_sampler", "sample_recovered_tokens"),
    ("vllm.v1.sample.rejection_sampler", "PLACEHOLDER_TOKEN_ID"),
    ("vllm.v1.spec_decode.metadata", "SpecDecodeMetadata"),
)
# the parameters of the wrapped functions, as the capture reads them
SIGNATURES = {
    "GPUModelRunner._sample": ("self", "logits", "spec_decode_metadata"),
    "rejection_sample": (
        "draft_token_ids",
        "num_draft_tokens",
        "max_spec_len",
        "cu_num_draft_tokens",
        "draft_probs",
        "target_logits",
        "bonus_token_ids",
        "sampling_metadata",
    ),
    "RejectionSampler.forward": ("self", "metadata", "draft_probs", "logits", "sampling_metadata"),
}


def _resolve(module: str, path: str) -> Any:
    import importlib

    obj = importlib.import_module(module)
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def check_private() -> dict[str, Any]:
    """{"version": vLLM's, "missing": [what changed]} for the names and signatures above."""
    import inspect

    import vllm

    missing: list[str] = []
    for module, path in PRIVATE:
        try:
            obj = _resolve(module, path)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{module}.{path} ({type(exc).__name__})")
            continue
        want = SIGNATURES.get(path)
        if want is not None:
            have = tuple(inspect.signature(obj).parameters)
            if have[: len(want)] != want:
                missing.append(f"{module}.{path} takes {have}, the capture reads {want}")
    return {"version": getattr(vllm, "__version__", "unknown"), "missing": missing}


def register() -> None:
    """vLLM's general-plugin hook: patch once per process, only when a capture is asked for."""
    global _PATCHED
    if _PATCHED or not os.environ.get("SPECSCOPE_VLLM_CAPTURE"):
        return
    result = check_private()
    if result["missing"]:
        raise RuntimeError(
            f"specscope capture: vLLM {result['version']} lacks what the capture relies on: "
            f"{'; '.join(result['missing'])}"
        )
    _patch()
    _PATCHED = True


class _Writer:
    def __init__(self, path: str):
        self.path = path
        self.fh: IO[str] | None = None
        self.lock = threading.Lock()

    def write(self, obj: dict[str, Any]) -> None:
        with self.lock:
            if self.fh is None:
                self.fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - opened on the first write, kept open for the process's later writes
            self.fh.write(json.dumps(obj, allow_nan=True) + "\n")
            self.fh.flush()


_WRITER: _Writer | None = None


def _dist(row: torch.Tensor, top_n: int, full: bool, token: int | None = None) -> dict[str, Any]:
    """A probability row (a float32 torch tensor) as the trace format's DIST, with the
    non-finite entries counted: NaN/inf are written as JSON NaN/Infinity, as vLLM had them."""
    import torch

    row = row.detach().to("cpu", torch.float64)
    finite = torch.isfinite(row)
    n_bad = int((~finite).sum())
    clean = torch.where(finite, row, torch.zeros_like(row))
    n = min(top_n, row.numel())
    vals, ids = torch.topk(clean, n)
    keep = vals > 0
    out: dict[str, Any] = {
        "top_ids": ids[keep].tolist(),
        "top_probs": vals[keep].tolist(),
        "support": int((clean > 0).sum()),
        "minimum": float(clean.min()),
        "total": float(clean.sum()),
    }
    if not out["top_ids"]:  # nothing finite and > 0: the most "probable" by id order, at 0
        out["top_ids"], out["top_probs"] = [int(ids[0])], [0.0]
    if n_bad:
        bad = (~finite).nonzero().flatten()
        out["nonfinite"] = {
            "count": n_bad,
            "nan": int(torch.isnan(row).sum()),
            "first_ids": bad[:8].tolist(),
            "first_values": [float(x) for x in row[bad[:8]]],
        }
    if token is not None:
        out["token_p"] = float(row[token])  # may be NaN: as vLLM had it
    if full:
        out["full"] = row.tolist()
    return out


def _patch() -> None:  # long: the wrappers share the step state and the originals they call
    import torch
    from vllm.v1.sample import rejection_sampler as rs
    from vllm.v1.worker import gpu_model_runner as gmr

    global _WRITER
    _WRITER = writer = _Writer(os.environ["SPECSCOPE_VLLM_CAPTURE"])
    top_n = int(os.environ.get("SPECSCOPE_VLLM_TOP_N", "20"))
    full = os.environ.get("SPECSCOPE_VLLM_FULL") == "1"
    placeholder = int(rs.PLACEHOLDER_TOKEN_ID)

    orig_rejection_sample = rs.rejection_sample
    orig_uniform = rs.generate_uniform_probs
    orig_recovered = rs.sample_recovered_tokens
    orig_forward = rs.RejectionSampler.forward
    orig_sample = gmr.GPUModelRunner._sample
    orig_propose = gmr.GPUModelRunner.propose_draft_token_ids

    def step() -> dict[str, Any] | None:
        return getattr(_STATE, "step", None)

    def rejection_sample(  # vLLM's arguments are its own objects: Any here (vLLM is not installed in specscope's venv)
        draft_token_ids: Any,
        num_draft_tokens: Any,
        max_spec_len: Any,
        cu_num_draft_tokens: Any,
        draft_probs: Any,
        target_logits: Any,
        bonus_token_ids: Any,
        sampling_metadata: Any,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        s = step()
        if s is not None:
            # what vLLM computes its target probabilities from, and how (rejection_sample):
            # softmax(target_logits, float32); all-greedy batches compare argmax of the raw logits
            s["target_probs"] = target_logits.softmax(dim=-1, dtype=torch.float32)
            s["draft_ids"] = draft_token_ids.tolist()
            s["num_draft"] = list(num_draft_tokens)
            s["draft_probs"] = None if draft_probs is None else draft_probs.detach().clone()
            s["all_greedy"] = bool(sampling_metadata.all_greedy)
        return orig_rejection_sample(
            draft_token_ids,
            num_draft_tokens,
            max_spec_len,
            cu_num_draft_tokens,
            draft_probs,
            target_logits,
            bonus_token_ids,
            sampling_metadata,
            *args,
            **kwargs,
        )

    def generate_uniform_probs(*args: Any, **kwargs: Any) -> Any:
        out = orig_uniform(*args, **kwargs)
        s = step()
        if s is not None:
            s["uniform"] = out.detach().to("cpu", torch.float64).tolist()
        return out

    def sample_recovered_tokens(*args: Any, **kwargs: Any) -> Any:
        out = orig_recovered(*args, **kwargs)
        s = step()
        if s is not None:
            s["recovered"] = out.tolist()
        return out

    def forward(
        self: Any, metadata: Any, draft_probs: Any, logits: Any, sampling_metadata: Any, *args: Any, **kwargs: Any
    ) -> Any:
        s = step()
        if s is not None:
            s["bonus_probs"] = _processed_probs(
                logits[metadata.bonus_logits_indices].to(torch.float32), sampling_metadata
            )
        return orig_forward(self, metadata, draft_probs, logits, sampling_metadata, *args, **kwargs)

    off_path = os.environ["SPECSCOPE_VLLM_CAPTURE"] + ".off"

    def _sample(self: Any, logits: Any, spec_decode_metadata: Any, *args: Any, **kwargs: Any) -> Any:
        if os.path.exists(off_path):  # the driver's overhead measurement turns the capture off between runs
            return orig_sample(self, logits, spec_decode_metadata, *args, **kwargs)
        req_ids = list(self.input_batch.req_ids)
        n = len(req_ids)
        s: dict[str, Any] = {"t0": time.time()}
        try:
            s["computed"] = [int(x) for x in self.input_batch.num_computed_tokens_cpu[:n]]
            s["prompt_len"] = [int(x) for x in self.input_batch.num_prompt_tokens[:n]]
        except (AttributeError, TypeError):
            s["computed"] = s["prompt_len"] = None
        if spec_decode_metadata is None and logits is not None:
            s["bonus_probs"] = _processed_probs(logits.to(torch.float32), self.input_batch.sampling_metadata)
        _STATE.step = s
        try:
            out = orig_sample(self, logits, spec_decode_metadata, *args, **kwargs)
        finally:
            _STATE.step = None
        try:
            _emit(self, req_ids, s, spec_decode_metadata, out, time.time() - s["t0"])
        except Exception as exc:  # noqa: BLE001 - a capture failure is recorded, never raised into vLLM
            writer.write({"record": "capture-error", "error": f"{type(exc).__name__}: {exc}"})
        return out

    def propose_draft_token_ids(self: Any, *args: Any, **kwargs: Any) -> Any:
        if os.path.exists(off_path):
            return orig_propose(self, *args, **kwargs)
        t0 = time.time()
        try:
            return orig_propose(self, *args, **kwargs)
        finally:
            writer.write({"record": "propose", "t": t0, "draft_s": time.time() - t0})

    def _processed_probs(logits: torch.Tensor, sm: Any) -> torch.Tensor:
        """The distribution vLLM's sampler draws a non-draft (bonus) token from: temperature,
        then top-k/top-p (vLLM's own apply_top_k_top_p), softmax in float32. All-greedy: the
        softmax of the raw logits (what argmax reads)."""
        logits = logits.clone()
        if sm.all_greedy:
            return logits.softmax(dim=-1, dtype=torch.float32)
        temp = sm.temperature.to(logits.dtype).clone()
        temp = torch.where(temp <= 0, torch.ones_like(temp), temp)
        logits = logits / temp.unsqueeze(-1)
        from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

        logits = apply_top_k_top_p(logits, sm.top_k, sm.top_p)
        return logits.softmax(dim=-1, dtype=torch.float32)

    def _emit(runner: Any, req_ids: list[str], s: dict[str, Any], md: Any, out: Any, sample_s: float) -> None:
        sampled = out.sampled_token_ids.detach().to("cpu").tolist()
        vocab = None
        tp: Any = s.get("target_probs")  # a tensor whenever the step has drafts
        bp = s.get("bonus_probs")
        if tp is not None:
            vocab = tp.shape[-1]
        elif bp is not None:
            vocab = bp.shape[-1]
        num_draft = s.get("num_draft") or [0] * len(req_ids)
        draft_ids = s.get("draft_ids") or []
        uniform = s.get("uniform")
        recovered = s.get("recovered")
        dprobs = s.get("draft_probs")
        start = 0
        for row, req in enumerate(req_ids):
            k = num_draft[row] if row < len(num_draft) else 0
            drafts = draft_ids[start : start + k]
            valid = [t for t in sampled[row] if t != placeholder and (vocab is None or t < vocab)]
            nodes: list[dict[str, Any]] = []
            for j in range(k):
                pos = start + j
                tok = drafts[j]
                node: dict[str, Any] = {"token": tok, "p": _dist(tp[pos], top_n, full, tok)}
                if uniform is not None:
                    node["u"] = uniform[pos]
                if recovered is not None:
                    node["recovered"] = recovered[pos]
                if dprobs is not None:
                    node["q"] = _dist(dprobs[pos], top_n, full, tok)
                nodes.append(node)
            rec: dict[str, Any] = {
                "record": "step",
                "req": req,
                "row": row,
                "t": s["t0"],
                "sample_s": sample_s,
                "drafts": drafts,
                "nodes": nodes,
                "sampled": valid,
                "draft_probs": "one-hot" if dprobs is None else "probabilistic",
                "all_greedy": s.get("all_greedy"),
            }
            if bp is not None and row < bp.shape[0]:
                rec["bonus_p"] = _dist(bp[row], top_n, full)
            if s.get("computed") is not None:
                rec["computed"] = s["computed"][row]
                rec["prompt_len"] = s["prompt_len"][row]
            writer.write(rec)
            start += k

    rs.rejection_sample = rejection_sample
    rs.generate_uniform_probs = generate_uniform_probs
    rs.sample_recovered_tokens = sample_recovered_tokens
    rs.RejectionSampler.forward = forward
    gmr.GPUModelRunner._sample = _sample
    gmr.GPUModelRunner.propose_draft_token_ids = propose_draft_token_ids
