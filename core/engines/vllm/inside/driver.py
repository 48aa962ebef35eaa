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
        return _bench(llm, prompts, params, spec, loaded - started)
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


def _bench(llm: Any, prompts: list[Any], params: Any, spec: dict[str, Any], load_s: float) -> int:
    """`specscope bench --engine vllm`: batch size 1 as the bench's other rows, one prompt per
    generate() call; a warm-up pass (SPEC["bench"]["warm"] prompts), then `reps` repetitions
    over every prompt, each call timed. One JSON line per timed call (tokens and vLLM's own
    per-request spec-decode counts), then the timing record."""
    import vllm

    bench = spec["bench"]
    for prompt in prompts[: int(bench.get("warm", len(prompts)))]:
        llm.generate([prompt], params, use_tqdm=False)
    with open(spec["result_path"], "w", encoding="utf-8") as fh:
        for rep in range(int(bench["reps"])):
            for i, prompt in enumerate(prompts):
                t = time.perf_counter()
                out = llm.generate([prompt], params, use_tqdm=False)[0]
                s = time.perf_counter() - t
                c = out.outputs[0]
                fh.write(
                    json.dumps(
                        {
                            "record": "bench",
                            "rep": rep,
                            "prompt": i,
                            "s": s,
                            "token_ids": list(c.token_ids),
                            "finish_reason": c.finish_reason,
                            "spec_decode": _metrics(c),
                        }
                    )
                    + "\n"
                )
        fh.write(json.dumps({"record": "timing", "load_s": load_s, "vllm": vllm.__version__}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
