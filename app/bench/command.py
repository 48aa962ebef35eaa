"""The `specscope bench` command: load the models and prompts, run the bench per mode,
measure each method's memory in its own child process, print or write the results."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

from specscope.core.settings.bounds import BOUNDS  # torch-free: the parser is built at every start
from specscope.core.settings.model import RunSettings
from specscope.core.settings.vocab import AUTO_K, CHILDREN_MENU, DEFAULT_CHILDREN, AutoK

SCHEMA = "specscope-bench/2"


def add_bench_parser(subparsers: Any) -> None:  # long: the option table, one add_argument per option
    p = subparsers.add_parser(
        "bench",
        help="benchmark the decoder against plain decoding and transformers' assisted generation",
        description="Benchmark specscope's decoder against plain decoding and transformers' assisted generation at "
        "batch size 1: throughput, prefill apart from decode, each method's peak memory, acceptance "
        "(also under vLLM's and llama.cpp's definitions) per prompt kind; --json keeps the raw samples.",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a short version: 1 prompt of each kind, k=4, 3 repetitions, 24 tokens, warm-up on one "
        "prompt, memory measured in the first mode only and not for the traced rows",
    )
    p.add_argument("--json", action="store_true", help="print machine-readable results (raw samples included)")
    p.add_argument(
        "--markdown",
        default=None,
        metavar="FILE",
        help="write the tables (with machine and versions) to FILE, keeping its scale and notes sections",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="let --markdown replace a file the bench did not write (never a trace store)",
    )
    p.add_argument(
        "--from-json",
        default=None,
        metavar="FILE",
        help="run nothing: read the results of an earlier `bench --json` from FILE (with --markdown)",
    )
    p.add_argument(
        "--target",
        default=None,
        help="target checkpoint, GGUF file or fetched model's name, e.g. smollm2 (default: bundled)",
    )
    p.add_argument(
        "--draft",
        action="append",
        default=None,
        metavar="DRAFT",
        help="'small', 'tiny' or a checkpoint path; repeat for several (default: small and tiny; for a "
        "named target with a default draft, that draft)",
    )
    p.add_argument(
        "--chat",
        action="store_true",
        help="the chat prompts (resources/prompts/chat.json: chat, summary, code) through the target's "
        "chat template, stopping at the end of its turn, instead of the code prompts",
    )
    p.add_argument(
        "--proposer",
        action="append",
        default=None,
        metavar="SPEC",
        help="a proposer spec without a model to bench besides the drafts, e.g. lookup:max_ngram=4 or "
        "eagle3:PATH; repeat for several (default: every registered kind that needs no model, at its "
        "defaults, and the bundled target's head where it fits the target: eagle3); eagle3 alone "
        "with a named target that ships its own head is that head (--target smollm2: eagle3-smollm2)",
    )
    p.add_argument(
        "--tree",
        action="append",
        default=None,
        metavar="SPEC",
        help="also bench a token tree drafted by the first draft: e.g. 3,2,1 (static) or "
        "dynamic:nodes=16,depth=5,topk=4; repeat for several (one row each, k does not apply)",
    )
    p.add_argument(
        "--children",
        default=DEFAULT_CHILDREN,
        choices=CHILDREN_MENU,
        help="how the --tree rows choose siblings (default: topk)",
    )
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--dtype", default=None, choices=("float32", "float16", "bfloat16"))
    p.add_argument(
        "--k",
        default=None,
        help="comma-separated draft lengths (default: 2,4,6; quick: 4); auto: each round's length (a tree's "
        "depth) chosen by measured cost, specscope's rows only",
    )
    p.add_argument("--max-new", type=int, default=None, help="tokens per prompt (default: 128; quick: 24)")
    p.add_argument("--reps", type=int, default=None, help="timed repetitions (default: 5; quick: 3)")
    p.add_argument(
        "--prompts",
        type=int,
        default=None,
        help="use the first N bundled example prompts of each kind (default: all; quick: 1)",
    )
    p.add_argument("--kinds", default=None, help="comma-separated prompt kinds to use (default: all bundled kinds)")
    p.add_argument("--mode", choices=("greedy", "sampled", "both"), default="both", help="default: both")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--no-transformers", action="store_true", help="skip transformers' generate()")
    p.add_argument(
        "--engine",
        action="append",
        default=None,
        choices=("specscope", "transformers", "vllm"),
        help="vllm adds vLLM's rows: the same prompts, lookup (ngram) and draft proposers and k, run by vLLM in "
        "its venv (`specscope vllm setup`) after the other rows, with tokens/s, mean accepted length and "
        "whether greedy output equals specscope's decoder; specscope's and transformers' rows always run "
        "(--no-transformers drops the latter)",
    )
    p.add_argument("--no-memory", action="store_true", help="skip the per-method memory measurement (child processes)")
    p.set_defaults(func=cmd_bench)


class UsageError(ValueError):
    pass


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    quick = args.quick
    try:
        ks: list[int | AutoK] = (
            [AUTO_K if k.strip().lower() == AUTO_K else int(k) for k in args.k.split(",")]
            if args.k
            else ([4] if quick else [2, 4, 6])
        )
    except ValueError:
        raise UsageError(f"--k takes comma-separated integers or auto, got {args.k!r}") from None
    for name, value in (("--reps", args.reps), ("--prompts", args.prompts)):  # the settings model's bounds
        if value is not None and (problem := BOUNDS[name[2:]].problem(value)) is not None:
            raise UsageError(f"{name} {problem}")
    max_new = (24 if quick else 128) if args.max_new is None else args.max_new
    for k in ks:  # the run settings' own check, as `specscope run` and the window make it
        problems = RunSettings(k=k, max_new_tokens=max_new).validate({"k": "--k", "max_new_tokens": "--max-new"})
        if problems:
            raise UsageError("; ".join(problems.values()))
    return dict(
        ks=ks,
        max_new=max_new,
        reps=args.reps or (3 if quick else 5),
        prompts_per_kind=args.prompts or (1 if quick else None),
        kinds=[k.strip() for k in args.kinds.split(",")] if args.kinds else None,
        batch_size=1,
    )


def select_prompts(prompts: list[Any], per_kind: int | None, kinds: list[str] | None) -> list[Any]:
    """The first `per_kind` prompts of each kind (all when None), in index order."""
    known = list(dict.fromkeys(p.kind for p in prompts))
    if kinds is not None:
        unknown = [k for k in kinds if k not in known]
        if unknown:
            raise UsageError(f"no bundled prompt of kind {', '.join(unknown)} (kinds: {', '.join(known)})")
    seen: dict[str, int] = {}
    out = []
    for p in prompts:
        if kinds is not None and p.kind not in kinds:
            continue
        seen[p.kind] = seen.get(p.kind, 0) + 1
        if per_kind is None or seen[p.kind] <= per_kind:
            out.append(p)
    return out


def machine_info(device: Any) -> dict[str, Any]:
    import torch
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
        "device": str(device),
    }
    if device.type == "cpu":
        from specscope.core import kernels

        info["few_rows_kernel"] = kernels.kernel_status()  # what a CPU float32 model's linears run on
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def memory_spec(
    method: Any,
    mode: str,
    args: argparse.Namespace,
    draft_refs: dict[str, str],
    prompts: list[list[int]],
    max_new: int,
    eos: int | None,
    device: Any,
) -> dict[str, Any]:
    """What a memory child needs to rebuild exactly this method (see memory.py)."""
    traced = method.name.endswith("traced+stored")
    return {
        "method": method.name,
        "mode": mode,
        "temperature": 0.0 if mode == "greedy" else 1.0,
        "target_ref": args.target,
        "draft_label": method.draft,
        "draft_ref": draft_refs.get(method.draft) if method.draft else None,
        "device": str(device),
        "dtype": args.dtype,
        "threads": args.threads,
        "k": method.k or 1,
        "max_new": max_new,
        "eos": eos,
        "prompts": prompts,
        "specs": [method.spec] if method.family == "specscope" and method.spec else [],
        "include_transformers": method.family == "transformers",
        "include_traced": traced,
    }


def new_results(
    machine: dict[str, Any], settings: dict[str, Any], prompts: list[Any], prompt_ids: list[list[int]]
) -> dict[str, Any]:
    """The JSON's frame; `modes` is filled with each mode's rows (see report.py)."""
    return {
        "schema": SCHEMA,
        "machine": machine,
        "settings": settings,
        "command": "specscope " + " ".join(sys.argv[1:]),
        "prompts": [
            {"name": p.name, "kind": p.kind, "tokens": len(ids), "description": getattr(p, "description", "")}
            for p, ids in zip(prompts, prompt_ids)
        ],
        "modes": {},
    }


def _say(msg: str) -> None:  # progress goes to stderr, also with --json
    print(msg, file=sys.stderr, flush=True)


def tree_specs(args: argparse.Namespace, drafts: dict[str, Any]) -> list[str]:
    """The --tree rows: proposer specs of the first draft drafting each tree."""
    from specscope.core.draft.trees import TreeSpecError, parse_tree

    specs = []
    for tree in getattr(args, "tree", None) or []:
        try:
            parse_tree(tree)
        except TreeSpecError as exc:
            raise UsageError(f"--tree: {exc}") from None
        if tree.startswith("dynamic:") and args.children != "topk":
            raise UsageError("--tree dynamic:... keeps the most probable candidates: use --children topk")
        specs.append(f"draft:{next(iter(drafts))},tree={tree},children={args.children}")
    return specs


def _bench_prompts(chat: bool) -> list[Any]:
    from specscope.core.loading import models as loading
    from specscope.core.loading.chat import chat_prompts

    return chat_prompts() if chat else loading.example_prompts()


def _default_drafts(target: str | None) -> list[str]:
    """The bundled drafts for the bundled target; a named target's own default draft (catalog)."""
    from specscope.core.draft.registry import parse_spec
    from specscope.core.loading.catalog import default_proposer

    spec = default_proposer(target)
    return [parse_spec(spec).arg] if spec else ["small", "tiny"]


def _encode_prompts(chosen: list[Any], chat: bool, target: Any, tokenizer: Any) -> tuple[list[list[int]], int | None]:
    """The prompts' ids and the EOS the runs stop at (a chat run: the token that ends the model's turn)."""
    if not chat:
        ids = [list(tokenizer(p.text, add_special_tokens=False)["input_ids"]) for p in chosen]
        return ids, getattr(tokenizer, "eos_token_id", None)
    from specscope.core.loading.chat import chat_prompt_ids, turn_end_id

    return [chat_prompt_ids(tokenizer, p.user, p.system) for p in chosen], turn_end_id(target, tokenizer)


def run_bench(args: argparse.Namespace) -> dict[str, Any]:  # long: loads, runs both modes, then the memory children
    import torch

    from specscope.core import SamplingConfig
    from specscope.core.draft.registry import for_target
    from specscope.core.loading import models as loading

    from .markdown import format_table
    from .measurement import Bench, default_specs
    from .memory import measure_all

    if args.threads:
        torch.set_num_threads(args.threads)
    settings = settings_of(args)
    chosen = select_prompts(_bench_prompts(args.chat), settings["prompts_per_kind"], settings["kinds"])
    device = loading.resolve_device(args.device)
    draft_names = args.draft or _default_drafts(args.target)
    pairs = {
        name: loading.load_models(target=args.target, draft=name, device=device, dtype=args.dtype)
        for name in draft_names
    }
    first = next(iter(pairs.values()))
    target, tokenizer = first.target, first.tokenizer
    labels = {name: Path(name).name if "/" in name else name for name in draft_names}
    drafts = {labels[name]: p.draft for name, p in pairs.items()}
    draft_refs = {labels[name]: name for name in draft_names}
    trees = tree_specs(args, drafts)
    # `eagle3` alone: a named target's own head (catalog default_heads), as `specscope run` reads it
    proposers = [str(for_target(s, args.target)) for s in args.proposer] if args.proposer else None
    prompt_ids, eos = _encode_prompts(chosen, args.chat, target, tokenizer)
    kinds = [p.kind for p in chosen]
    modes = ["greedy", "sampled"] if args.mode == "both" else [args.mode]
    results = new_results(machine_info(device), settings, chosen, prompt_ids)
    if "few_rows_kernel" in results["machine"]:
        _say(f"few-row linear kernel: {results['machine']['few_rows_kernel']} (SPECSCOPE_ROW_KERNEL=0: off)")
    specs_of_memory = []
    for mode in modes:
        sampling = SamplingConfig(temperature=0.0) if mode == "greedy" else SamplingConfig(temperature=1.0)
        _say(
            f"== {mode}: {len(prompt_ids)} prompts ({', '.join(dict.fromkeys(kinds))}), k in {settings['ks']}, "
            f"{settings['max_new']} tokens, {settings['reps']} repetitions"
        )
        bench = Bench(
            target,
            drafts,
            prompt_ids,
            ks=settings["ks"],
            max_new=settings["max_new"],
            reps=settings["reps"],
            sampling=sampling,
            eos=eos,
            device=device,
            include_transformers=not args.no_transformers,
            progress=_say,
            specs=default_specs(list(drafts), proposers, target, args.target) + trees,
            kinds=kinds,
            warm_every_prompt=not args.quick,
        )
        servers = []
        try:
            if "vllm" in (args.engine or ()):  # started now, timed interleaved with the in-process rows
                servers = _add_vllm_rows(bench, args, draft_refs, prompt_ids, settings, sampling, eos, results)
            bench.run()
        finally:
            for server in servers:
                server.close()
        results["modes"][mode] = bench.rows()
        if "vllm" in (args.engine or ()):
            from .vllm import annotate

            annotate(results["modes"][mode], bench.methods, sampling.greedy)
        if not (args.quick and mode != modes[0]):  # --quick: one mode's memory (the modes differ by a few MB)
            # --quick also leaves out the traced rows' memory (the same models plus the writer)
            specs_of_memory += [
                memory_spec(m, mode, args, draft_refs, prompt_ids, settings["max_new"], eos, device)
                for m in bench.methods
                if not (args.quick and "traced" in m.name) and m.family != "vllm"  # vLLM's own process
            ]
        if not args.json:
            print(f"\n### {mode}\n")
            print(format_table(results["modes"][mode]))
    if not args.no_memory:  # after the timings, so no child runs beside them
        for measured in measure_all(specs_of_memory, progress=_say):
            rows = results["modes"][measured["spec"]["mode"]]
            next(r for r in rows if r["method"] == measured["spec"]["method"])["memory"] = measured
    return results


def _add_vllm_rows(
    bench: Any,
    args: argparse.Namespace,
    draft_refs: dict[str, str],
    prompt_ids: list[list[int]],
    settings: dict[str, Any],
    sampling: Any,
    eos: int | None,
    results: dict[str, Any],
) -> list[Any]:
    """vLLM's rows (app/bench/vllm.py) appended to the bench's methods, their vLLMs started
    (returned: the caller closes them); a row vLLM cannot run is a line in
    results["vllm_not_run"]."""
    from .vllm import vllm_methods

    methods, skipped, servers = vllm_methods(
        target_ref=args.target,
        draft_refs=draft_refs,
        specs=bench.specs,
        ks=settings["ks"],
        prompts=prompt_ids,
        max_new=settings["max_new"],
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        eos=eos,
        threads=args.threads,
        progress=_say,
    )
    bench.methods.extend(methods)
    for line in skipped:
        _say(f"vLLM row not run: {line}")
    results.setdefault("vllm_not_run", [])
    results["vllm_not_run"] += [line for line in skipped if line not in results["vllm_not_run"]]
    return servers


def cmd_bench(args: argparse.Namespace) -> int:
    from .markdown import is_bench_markdown, write_markdown
    from .measurement import BenchError

    if args.markdown:  # before anything runs: a store, or a file the bench did not write, is kept
        from specscope.storage import TraceStoreError
        from specscope.storage.outputs import check_output

        try:
            check_output(args.markdown, overwrite=args.force or is_bench_markdown(Path(args.markdown)))
        except TraceStoreError as exc:
            print(f"specscope bench: --markdown: {exc}", file=sys.stderr)
            return 1
    try:
        if args.from_json:
            results = json.loads(Path(args.from_json).read_text(encoding="utf-8"))
            if results.get("schema") != SCHEMA:
                raise UsageError(f"{args.from_json} is not a `specscope bench --json` result of schema {SCHEMA}")
        else:
            results = run_bench(args)
    except json.JSONDecodeError as exc:
        print(f"specscope bench: {args.from_json} is not JSON ({exc})", file=sys.stderr)
        return 1
    except (BenchError, OSError, ValueError) as exc:  # bad input (UsageError, a bad spec or checkpoint): one line
        print(f"specscope bench: {exc}", file=sys.stderr)
        return 1
    if args.json:  # compact: the raw samples are most of it
        print(json.dumps(results, separators=(",", ":")))
    if args.markdown:
        write_markdown(Path(args.markdown), results)
        _say(f"wrote {args.markdown}")
    return 0
