"""specscope's vLLM driver: runs inside vLLM's own venv, started by specscope as
`VENV/bin/python driver.py SPEC.json` (core/engines/vllm/engine.py). It imports nothing of
specscope. It turns the capture on (SPECSCOPE_VLLM_CAPTURE: the file the capture plugin,
loaded by vLLM in its engine-core process, appends one JSON line per request and step to),
runs vLLM's LLM.generate on the prompts with the speculative config asked for, and writes
what vLLM returned (tokens, finish reasons, its own per-request spec-decode counts) to
SPEC["result_path"]. vLLM spawns its engine core: hence the __main__ guard."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def _metrics(completion: Any) -> dict[str, Any] | None:  # a vLLM RequestOutput (vLLM lives in its own venv)
    """vLLM's own per-request speculative-decoding counts (per_request_spec_decode_metrics),
    kept beside the capture's rounds for cross-checking; None when this vLLM has none."""
    m = getattr(completion, "spec_decode_metrics", None)
    if m is None:
        return None
    out: dict[str, Any] = {}
    for name in dir(m):
        if name.startswith("_"):
            continue
        value = getattr(m, name)
        if callable(value):
            continue
        if isinstance(value, (int, float, str)) or value is None:
            out[name] = value
        elif isinstance(value, (list, tuple)) and all(isinstance(x, (int, float)) for x in value):
            out[name] = list(value)
    return out


def main(spec_path: str) -> int:  # long: the driver's steps in order: read the spec, start vLLM, run, write the trace
    with open(spec_path, encoding="utf-8") as fh:
        spec = json.load(fh)
    os.environ["SPECSCOPE_VLLM_CAPTURE"] = spec["capture_path"] if spec.get("capture", True) else ""
    os.environ["SPECSCOPE_VLLM_TOP_N"] = str(spec.get("top_n", 20))
    os.environ["SPECSCOPE_VLLM_FULL"] = "1" if spec.get("full_vectors") else "0"
    if spec.get("threads"):
        os.environ.setdefault("OMP_NUM_THREADS", str(spec["threads"]))
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs = dict(
        model=spec["model"],
        dtype=spec.get("dtype", "float32"),
        enforce_eager=spec.get("enforce_eager", True),
        seed=spec.get("seed", 0),
        max_model_len=spec["max_model_len"],
        tokenizer=spec.get("tokenizer"),
    )
    if spec.get("speculative_config"):
        kwargs["speculative_config"] = spec["speculative_config"]
    kwargs.update(spec.get("llm_kwargs") or {})
    started = time.time()
    llm = LLM(**{k: v for k, v in kwargs.items() if v is not None})
    loaded = time.time()
    s = spec["sampling"]
    params = SamplingParams(
        temperature=s["temperature"],
        top_k=s.get("top_k") or -1 if s.get("top_k") else 0,
        top_p=s.get("top_p", 1.0),
        max_tokens=spec["max_new_tokens"],
        seed=s.get("seed"),
        ignore_eos=not spec.get("eos_ids"),
        stop_token_ids=spec.get("eos_ids") or None,
        detokenize=False,
    )
    prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids in spec["prompts"]]
    if spec.get("bench"):
        return _serve(llm, params, spec, loaded - started)
    t0 = time.time()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.time() - t0
    reps = []
    if spec.get("overhead_reps"):  # capture off / on, interleaved, the same prompts (the first run warmed up)
        off = spec["capture_path"] + ".off"
        for rep in range(int(spec["overhead_reps"])):
            for mode in ("off", "on") if rep % 2 == 0 else ("on", "off"):  # the order alternates: drift hits both
                if mode == "off":
                    open(off, "w").close()
                t = time.time()
                outs = llm.generate(prompts, params, use_tqdm=False)
                reps.append(
                    {
                        "rep": rep,
                        "capture": mode,
                        "s": time.time() - t,
                        "tokens": sum(len(o.outputs[0].token_ids) for o in outs),
                    }
                )
                if os.path.exists(off):
                    os.remove(off)
    with open(spec["result_path"], "w", encoding="utf-8") as fh:
        for out in outputs:
            c = out.outputs[0]
            fh.write(
                json.dumps(
                    {
                        "request_id": out.request_id,
                        "prompt_ids": list(out.prompt_token_ids or []),
                        "token_ids": list(c.token_ids),
                        "finish_reason": c.finish_reason,
                        "stop_reason": c.stop_reason,
                        "spec_decode": _metrics(c),
                    }
                )
                + "\n"
            )
        import vllm

        fh.write(
            json.dumps(
                {
                    "record": "timing",
                    "load_s": loaded - started,
                    "generate_s": wall,
                    "vllm": vllm.__version__,
                    "overhead": reps,
                }
            )
            + "\n"
        )
    return 0


def _serve(llm: Any, params: Any, spec: dict[str, Any], load_s: float) -> int:
    """`specscope bench --engine vllm`: vLLM held ready while the bench's other rows run, so
    that its calls are timed interleaved with theirs (engine.py's VllmBenchServer). The host
    writes one line per call on stdin: the prompt's token ids as a JSON list (one generate()
    call of that prompt alone, timed here) or `quit`. Each answer is one JSON line appended to
    SPEC["result_path"] and flushed: first `ready`, then one `bench` record per call (tokens,
    finish reason, vLLM's own per-request spec-decode counts), written once vLLM is idle again."""
    import vllm
    from vllm.inputs import TokensPrompt

    with open(spec["result_path"], "a", encoding="utf-8") as fh:

        def answer(record: dict[str, Any]) -> None:
            fh.write(json.dumps(record) + "\n")
            fh.flush()

        answer({"record": "ready", "load_s": load_s, "vllm": vllm.__version__})
        for line in sys.stdin:
            line = line.strip()
            if line == "quit":
                break
            if not line:
                continue
            prompt = TokensPrompt(prompt_token_ids=[int(t) for t in json.loads(line)])
            t = time.perf_counter()
            out = llm.generate([prompt], params, use_tqdm=False)[0]
            s = time.perf_counter() - t
            # vLLM's worker spins on its shared-memory queue for a second after its last message
            # (distributed/device_communicators/shm_broadcast.py, SpinCondition busy_loop_s = 1):
            # answered at once, the next row would be timed beside that spin (75% of a core)
            time.sleep(float(spec["bench"].get("settle_s", 1.2)))
            c = out.outputs[0]
            answer(
                {
                    "record": "bench",
                    "s": s,
                    "token_ids": list(c.token_ids),
                    "finish_reason": c.finish_reason,
                    "spec_decode": _metrics(c),
                }
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
