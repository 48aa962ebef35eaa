"""`specscope bench --engine vllm`: vLLM rows beside specscope's and transformers'.

Each row is one of the bench's proposers that vLLM has (`lookup` -> vLLM's `ngram` with the
same n-gram range, `draft:NAME` -> `draft_model` with the same checkpoint) at each k, run by
vLLM in its own venv: the same prompts, the same budget, EOS and sampler, batch size 1 (one
prompt per generate() call), without the capture. Each row's vLLM is started before the
bench runs and held ready (core/engines/vllm/engine.py's VllmBenchServer: idle between
calls), so its rows are warmed up and timed with the in-process methods, interleaved in the
same rotating order; each call is timed inside vLLM's driver. Every row's vLLM stays loaded
for the whole bench (about 1 GiB of KV cache each on a CPU: VLLM_CPU_KVCACHE_SPACE).

The rounds of a vLLM row are vLLM's own per-request counts (`per_request_spec_decode_metrics`:
accepted and drafted per drafting step), plus the steps that drafted nothing (ngram without a
match), inferred from the token count and counted as rounds of one token as specscope counts
them; vLLM's prefill step (one token, no draft) is not a round (specscope's first round
drafts). vLLM returns a request's tokens at its end: its rows have no per-token times (no
time to first tokens, no decode split: their decode rate is the whole run's), and no forward
timings (no cost-model columns).

In greedy mode each vLLM row says whether its output equals specscope's decoder with the same
proposer and k, token for token, on every prompt and repetition, and where it first differs;
a difference is reported, not fatal (vLLM's kernels are not torch's).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from specscope.core.draft.registry import parse_spec
from specscope.core.settings.vocab import AutoK

from .measurement import BenchError, Method, Sample, is_tree_spec, method_name
from .metrics import RoundCounts

FAMILY = "vllm"
KINDS = ("lookup", "draft")  # the bench's proposers vLLM has


def vllm_rounds(spec_decode: dict[str, Any] | None, tokens: int) -> list[RoundCounts]:
    """A vLLM request's rounds from its own per-step counts (module docstring)."""
    sd = spec_decode or {}
    drafted = [int(x) for x in sd.get("per_step_drafted") or []]
    accepted = [int(x) for x in sd.get("per_step_accepted") or []]
    rounds = [
        RoundCounts(drafted=d, accepted=a, visited=a + (1 if a < d else 0), emitted=a + 1)
        for d, a in zip(drafted, accepted)
    ]
    undrafted = tokens - 1 - sum(r.emitted for r in rounds)  # the prefill step's token is not a round
    rounds += [RoundCounts(drafted=0, accepted=0, visited=0, emitted=1)] * max(0, undrafted)
    return rounds


def vllm_specs(specs: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the specs vLLM runs, a line for each it does not)."""
    ours, skipped = [], []
    for spec in specs:
        parsed = parse_spec(spec)
        if is_tree_spec(spec):
            skipped.append(f"{method_name(spec)}: vLLM drafts chains, not trees")
        elif parsed.kind not in KINDS:
            skipped.append(f"{method_name(spec)}: the vLLM bench runs lookup and draft:NAME")
        else:
            ours.append(spec)
    return ours, skipped


def vllm_methods(  # long: one vLLM per proposer and k, started and held ready
    *,
    target_ref: str | None,
    draft_refs: dict[str, str],
    specs: Sequence[str],
    ks: Sequence[int | AutoK],
    prompts: Sequence[list[int]],
    max_new: int,
    temperature: float,
    top_k: int,
    top_p: float,
    eos: int | None,
    threads: int | None,
    progress: Callable[[str], None],
    venv: str | None = None,
) -> tuple[list[Method], list[str], list[Any]]:
    """The vLLM rows' methods, each a vLLM started and ready (its `run(prompt)` one timed call),
    a line for each row not run (a proposer vLLM lacks, a model vLLM refuses, no vLLM venv),
    and the servers, which the caller closes when the bench is done."""
    from specscope.core.engines.vllm.engine import VllmBenchServer, VllmEngineError, VllmRun, checkpoint_folder

    chosen, skipped = vllm_specs(specs)
    methods: list[Method] = []
    servers: list[Any] = []
    try:
        target = str(checkpoint_folder(target_ref, "target"))
    except VllmEngineError as exc:
        return [], [*skipped, f"vLLM: {exc}"], []
    for k in ks:
        if not isinstance(k, int):  # k auto is specscope's policy; vLLM's rows take a fixed k
            continue
        for spec in chosen:
            parsed = parse_spec(spec)
            label = parsed.model_ref if parsed.kind == "draft" else None
            name = f"vllm {method_name(spec)} k={k}"
            try:
                path = str(checkpoint_folder(draft_refs.get(label, label), "draft")) if label else None
                run = VllmRun(
                    target=target,
                    prompts=[list(p) for p in prompts],
                    proposer_kind=parsed.kind,
                    proposer_path=path,
                    proposer_params=dict(parsed.params),
                    k=k,
                    temperature=temperature,
                    top_k=top_k,
                    top_p=top_p,
                    max_new_tokens=max_new,
                    eos_ids=(eos,) if eos is not None else (),
                    threads=threads,
                    proposer_text=spec,
                )
                progress(f"{name}: starting vLLM (a minute or more on a CPU) ...")
                server = VllmBenchServer(run, venv=venv)
            except VllmEngineError as exc:
                skipped.append(f"{name}: {exc}")
                progress(f"{name}: not run: {exc}")
                continue
            servers.append(server)
            method = Method(name, FAMILY, k, _caller(server, name), draft=label, spec=spec)
            method.engine_version = server.version
            progress(f"{name}: ready (vLLM {server.version}, {server.load_s:.0f} s to load)")
            methods.append(method)
    return methods, skipped, servers


def _caller(server: Any, name: str) -> Callable[[list[int]], Sample]:
    """A vLLM row's run(prompt): one timed call of its vLLM; a failure ends the bench in one line."""
    from specscope.core.engines.vllm.engine import VllmEngineError

    def run(prompt: list[int]) -> Sample:
        try:
            r = server.generate(prompt)
        except VllmEngineError as exc:
            raise BenchError(f"{name}: {exc}") from None
        tokens = [int(t) for t in r["token_ids"]]
        return Sample(tokens, float(r["s"]), rounds=vllm_rounds(r.get("spec_decode"), len(tokens)))

    return run


def first_difference(ref: Sequence[Sequence[int]], got: Sequence[Sequence[int]]) -> tuple[int, int] | None:
    """(prompt, token) where `got` first differs from `ref`, None when every output is equal."""
    for i, (a, b) in enumerate(zip(ref, got)):
        if list(a) != list(b):
            at = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            return i, at
    return None


def annotate(rows: list[dict[str, Any]], methods: Sequence[Method], greedy: bool) -> None:
    """Each vLLM row: vLLM's version and, greedy, whether its output equals specscope's decoder
    with the same proposer and k (every repetition; the first difference)."""
    by_name = {m.name: m for m in methods}
    for row in rows:
        m = by_name.get(row["method"])
        if m is None or m.family != FAMILY:
            continue
        row["vllm_version"] = m.engine_version
        twin = by_name.get(f"specscope {method_name(m.spec or '')} k={m.k}")
        row["specscope_twin"] = twin.name if twin else None
        if not greedy or twin is None or not twin.samples:
            row["greedy_identical_to_specscope"] = None
            continue
        ref = [s.tokens for s in twin.samples[0]]
        diff = next((d for rep in m.samples if (d := first_difference(ref, [s.tokens for s in rep]))), None)
        row["greedy_identical_to_specscope"] = diff is None
        row["first_difference"] = None if diff is None else {"prompt": diff[0], "token": diff[1]}
