"""`specscope run`: decode headless and print text with round markers, or JSON; record with --db."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Any

from specscope.app.cli.options import (
    ANSI,
    PLAIN_MARKS,
    RESET,
    CliError,
    k_arg,
    parse_eos,
    parse_prompt_ids,
    parse_stop_ids,
    stderr_progress,
    threads_arg,
)
from specscope.app.cli.signals import interrupt_status, run_signals
from specscope.core.settings.vocab import CHILDREN_MENU, DEVICES, DTYPES, ENGINES, VECTOR_POLICIES


def add_run_parser(subparsers: Any, list_kinds: bool = True) -> None:  # long: the option table
    p = subparsers.add_parser(
        "run",
        help="decode one prompt headless and print the text with round markers",
        description=(
            "Run speculative decoding on one prompt without a window. The text is printed with "
            "round boundaries (|), repaired tokens in [brackets] and bonus tokens in {braces} "
            "(colours instead when the output is a terminal). --json prints a summary instead."
        ),
        epilog=proposer_kinds_help() if list_kinds else "proposer kinds: see `specscope run --help`",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="prompt text (tokenised with the target's tokenizer)")
    src.add_argument("--prompt-file", help="read the prompt text from this file")
    src.add_argument("--prompt-ids", help="comma-separated token ids instead of text (at least one)")
    p.add_argument(
        "--chat",
        action="store_true",
        help="the prompt is a user's message: apply the model's chat template (system turn from --system); "
        "with --eos-id auto the run ends at any EOS the model's generation config names (a chat "
        "model's end of turn among them)",
    )
    p.add_argument("--system", default=None, metavar="TEXT", help="with --chat: the system turn's text")
    p.add_argument(
        "--proposer",
        default=None,
        metavar="SPEC",
        help="where draft tokens come from: KIND[:ARG][,KEY=VALUE...], e.g. draft, draft:tiny, draft:PATH, "
        "lookup, lookup:max_ngram=4 (default: draft; the kinds are listed below)",
    )
    p.add_argument(
        "--k",
        type=k_arg,
        default=4,
        metavar="K",
        help="draft length per round, or auto: each round's length (a tree's depth) chosen from the measured "
        "verify cost, draft cost and acceptance (default: 4)",
    )
    p.add_argument(
        "--threads",
        type=threads_arg,
        default=None,
        metavar="N",
        help="torch CPU threads for decoding (default: all cores but one, up to 8 cores)",
    )
    p.add_argument(
        "--tree",
        default=None,
        metavar="SPEC",
        help="draft a token tree instead of a chain: B1,B2,... (e.g. 3,2,1,1), paths:0;1;0.0 or "
        "dynamic:nodes=16,depth=5,topk=4 (shorthand for the spec's tree=SPEC: a draft model or a draft head)",
    )
    p.add_argument(
        "--children",
        default=None,
        choices=CHILDREN_MENU,
        help="how a tree's siblings are chosen: topk (default), sampled (i.i.d. from q) or distinct "
        "(without replacement)",
    )
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default="specscope",
        help="who decodes: specscope's decoder, transformers' generate() (docs/transformers-engine.md) or "
        "vLLM in its venv (`specscope vllm setup`; docs/vllm.md), recorded round by round",
    )
    p.add_argument(
        "--vllm-draft-sample",
        choices=("greedy", "probabilistic"),
        default=None,
        help="--engine vllm: vLLM's draft_sample_method (default greedy: one-hot drafts)",
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: 0)")
    p.add_argument("--top-k", type=int, default=0, help="0 = off (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="1.0 = off (default)")
    p.add_argument(
        "--max-new",
        type=int,
        default=64,
        help="token budget (default: 64); the prompt plus this budget must fit the models' max_position_embeddings",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the run's random stream (default: 0)")
    p.add_argument(
        "--coupled",
        type=int,
        default=None,
        metavar="SEED",
        help="coupled lanes at temperature > 0: the target's draws come from Gumbel keys of (SEED, output "
        "position) and a draft model proposes by the same keys, so runs with the same SEED emit the "
        "same tokens wherever their prefixes agree, whatever the proposer (docs/coupling.md)",
    )
    p.add_argument(
        "--eos-id",
        "--eos",
        dest="eos_id",
        default="auto",
        help="EOS token id or ids (comma list: 2,107), 'auto' = the model's (every id its generation "
        "config names, and the tokenizer's), 'none' = no EOS",
    )
    p.add_argument(
        "--stop",
        action="append",
        default=None,
        metavar="TEXT",
        help="stop string (repeatable): the output ends at the token whose text completes it, that token "
        "included; the text is not cut (docs/trace-format.md, Stops)",
    )
    p.add_argument(
        "--stop-ids",
        action="append",
        default=None,
        metavar="IDS",
        help="stop token sequence, a comma list of ids (repeatable): the output ends at its last token",
    )
    p.add_argument(
        "--target",
        default=None,
        help="target: a checkpoint directory, a GGUF file (converted once and cached), a fetched model's "
        "name (`specscope models`), or the bundled target (the default; 'target' names it too)",
    )
    p.add_argument(
        "--draft",
        default=None,
        help="draft: 'small', 'tiny' (bundled) or a checkpoint directory (shorthand for --proposer draft:DRAFT); "
        "a bundled name always means the bundled model: write ./small for a folder named small",
    )
    p.add_argument("--device", default="auto", choices=DEVICES, help="default: auto (CUDA when available)")
    p.add_argument("--dtype", default=None, choices=DTYPES, help="model dtype (default: float32 on CPU)")
    p.add_argument(
        "--lookup-max-ngram",
        type=int,
        default=None,
        help="prompt lookup: longest suffix n-gram tried (default: 3; shorthand for lookup:max_ngram=N)",
    )
    p.add_argument(
        "--lookup-min-ngram",
        type=int,
        default=None,
        help="prompt lookup: shortest suffix n-gram accepted (default: 1; shorthand for lookup:min_ngram=N)",
    )
    p.add_argument("--no-cache", action="store_true", help="recompute every forward from scratch (a reference run)")
    p.add_argument("--fault", default=None, metavar="NAME", help="inject a deliberate bug (see `specscope faults`)")
    p.add_argument("--db", default=None, help="record the run in this trace store (SQLite path or SQLAlchemy URL)")
    p.add_argument(
        "--vectors",
        choices=VECTOR_POLICIES,
        default="auto",
        help="what --db keeps of each p, q and residual besides the top-N and each vector's support, "
        "smallest entry and sum (enough for every checker rule): 'full' vectors too (about 40x the "
        "bytes at the bundled vocabulary of 4096), 'top' nothing more, 'auto' = full when the "
        "vocabulary is at most 1024 (default)",
    )
    p.add_argument(
        "--top-n", type=int, default=20, help="entries of each top-N list in --db (default: 20; at least top-k + 1)"
    )
    p.add_argument("--json", action="store_true", help="print a JSON summary instead of the text")
    p.set_defaults(func=cmd_run)


def proposer_kinds_help() -> str:
    """The registered proposer kinds, for `specscope run --help` (read from the registry)."""
    from specscope.core.draft.registry import KINDS

    lines = ["proposer kinds (--proposer KIND[:ARG][,KEY=VALUE...]):"]
    width = max((len(name) for name in KINDS), default=0)
    for kind in KINDS.values():
        lines.append(f"  {kind.name:<{width}}  {kind.summary}")
        if kind.needs_model:
            lines.append(
                f"  {'':<{width}}    ARG: 'small', 'tiny' (bundled) or a checkpoint directory "
                f"(default: {kind.default_arg})"
            )
        for param in kind.params:
            lines.append(
                f"  {'':<{width}}    {param.name}={param.type.__name__} (default {param.default}): {param.help}"
            )
    return "\n".join(lines)


# (flag, attribute, the spec parameter it sets) of the prompt-lookup shorthands
LOOKUP_FLAGS = (
    ("--lookup-max-ngram", "lookup_max_ngram", "max_ngram"),
    ("--lookup-min-ngram", "lookup_min_ngram", "min_ngram"),
)


def run_spec(args: argparse.Namespace) -> Any:
    """The ProposerSpec of `specscope run`: --proposer with the --draft and --lookup-*
    shorthands folded in; a conflicting combination is a CliError."""
    from specscope.core.draft.registry import KINDS, SpecError, for_target, parse_spec

    lookup = {param: getattr(args, attr) for _, attr, param in LOOKUP_FLAGS if getattr(args, attr) is not None}
    text = args.proposer
    if args.draft is not None and not args.draft.strip():
        raise CliError("--draft is empty: name a draft ('small', 'tiny') or a checkpoint folder, or leave --draft out")
    if text is None:
        if args.draft is not None and lookup:
            raise CliError("--draft and --lookup-* name two proposers: pass one, or --proposer SPEC")
        text = "lookup" if lookup else "draft"
    try:
        spec = parse_spec(text)
    except SpecError as exc:
        raise CliError(f"--proposer: {exc}") from None
    if args.draft is not None:
        if not KINDS[spec.kind].needs_model:
            raise CliError(f"--draft names a draft model, but --proposer {text} runs none")
        if spec.arg is not None and spec.arg != args.draft:
            raise CliError(f"--draft {args.draft} and --proposer {text} name two draft models: pass one")
        spec = replace(spec, arg=args.draft)
    if spec.kind == "draft" and spec.arg is None:
        spec = replace(spec, arg=_target_default_draft(args.target))
    spec = for_target(spec, args.target)  # `eagle3` alone: a named target's own head (catalog default_heads)
    for flag, attr, param in LOOKUP_FLAGS:
        value = getattr(args, attr)
        if value is None:
            continue
        if spec.kind != "lookup":
            raise CliError(f"{flag} applies to prompt lookup, not to --proposer {text}")
        if spec.params.get(param, value) != value:
            raise CliError(f"{flag} {value} and --proposer {text} set {param} twice: pass one")
    spec = replace(spec, params={**spec.params, **lookup}) if spec.kind == "lookup" and lookup else spec
    return _fold_tree_flags(args, spec, text)


def _target_default_draft(target: str | None) -> str | None:
    """The draft model a named target comes with (catalog.default_draft: `--target smollm2
    --proposer draft` drafts with the project's SmolLM2 draft), None for the kind's default."""
    from specscope.core.draft.registry import parse_spec
    from specscope.core.loading.catalog import default_proposer

    spec = default_proposer(target)
    return parse_spec(spec).arg if spec else None


def _fold_tree_flags(args: argparse.Namespace, spec: Any, text: str) -> Any:
    """--tree and --children set the spec's tree and children, for a kind that drafts trees (a
    draft model, a draft head); a conflict is a CliError."""
    from specscope.core.draft.registry import KINDS

    flags = {param: getattr(args, param, None) for param in ("tree", "children")}
    flags = {param: value for param, value in flags.items() if value is not None}
    if not flags:
        return spec
    if KINDS[spec.kind].param("tree") is None:
        raise CliError(f"--{next(iter(flags))} applies to a draft model or head, not to --proposer {text}")
    for param, value in flags.items():
        if spec.params.get(param, value) != value:
            raise CliError(f"--{param} {value} and --proposer {text} set {param} twice: pass one")
    if "children" in flags and "tree" not in {**spec.params, **flags}:
        raise CliError("--children applies to a tree: pass --tree SPEC too")
    return replace(spec, params={**spec.params, **flags})


def _prompt_ids(args: argparse.Namespace, tokenizer: Any, settings: Any) -> list[int]:
    if args.prompt_ids is not None:
        return parse_prompt_ids(args.prompt_ids)
    if args.prompt_file:
        try:
            with open(args.prompt_file, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise CliError(f"cannot read --prompt-file: {exc}") from None
    else:
        text = args.prompt
    if text is None:
        text = _default_prompt(getattr(args, "chat", False))
    if tokenizer is None:
        raise CliError("this target has no tokenizer: pass --prompt-ids")
    from specscope.core.decode.factory import Models, prompt_ids

    return prompt_ids(settings, Models(target=None, tokenizer=tokenizer), text)


def _default_prompt(chat: bool = False) -> str:
    if chat:
        from specscope.core.loading.chat import chat_prompts

        return chat_prompts("chat")[0].user
    from specscope.core.loading.models import example_prompts

    prompts = example_prompts()
    return prompts[0].text if prompts else "def fibonacci(n):\n"


def _load(args: argparse.Namespace, spec: Any):
    """The ModelPair: the target, and the draft the spec names (None for kinds without a model)."""
    from specscope.core.loading import models as loading

    return loading.load_models(
        target=args.target,
        draft=spec.model_ref,
        device=loading.resolve_device(args.device),
        dtype=args.dtype,
        progress=stderr_progress,
    )


# How a settings message names each field here: by its flag.
FLAG_NAMES = {
    "proposer": "--proposer",
    "tree": "--tree",
    "children": "--children",
    "engine": "--engine",
    "k": "--k (draft length)",
    "temperature": "--temperature",
    "top_k": "--top-k",
    "top_p": "--top-p",
    "seed": "--seed",
    "max_new_tokens": "--max-new",
    "eos": "--eos-id",
    "coupling_seed": "--coupled",
    "use_cache": "--no-cache",
    "fault": "--fault",
    "vectors": "--vectors",
    "top_n": "--top-n",
    "stop_strings": "--stop",
    "stop_ids": "--stop-ids",
    "system": "--system",
    "threads": "--threads",
}


def run_settings(args: argparse.Namespace, spec: Any) -> Any:
    """The core's RunSettings of `specscope run`'s flags (not yet checked)."""
    from specscope.core.decode.settings import RunSettings

    eos, no_eos = parse_eos(args.eos_id)
    return RunSettings(
        proposer=str(spec),
        engine=args.engine,
        k=args.k,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        max_new_tokens=args.max_new,
        eos=eos,
        eos_disabled=no_eos,
        coupling_seed=args.coupled,
        use_cache=not args.no_cache,
        fault=args.fault,
        vectors=args.vectors,
        top_n=args.top_n,
        device=args.device,
        dtype=args.dtype,
        threads=args.threads,
        # commands that share run's flags without the stop and chat ones (diverge) stop at EOS only
        stop_strings=tuple(getattr(args, "stop", None) or ()),
        stop_ids=parse_stop_ids(getattr(args, "stop_ids", None)),
        chat=getattr(args, "chat", False),
        system=getattr(args, "system", None),
    )


def _prepare(args: argparse.Namespace) -> tuple[Any, Any, list[int], Any]:
    """(model pair, decoder, prompt ids, RunConfig) of the run: the settings checked before
    anything loads, the decoder made and the prompt plus budget checked against the models'
    positions by core.decode.factory, the one place the window and the bench make theirs too;
    a refusal is one CliError line naming the flags."""
    from specscope.core.decode.factory import SettingsError, build_decoder, run_config

    if args.chat and args.prompt_ids is not None:
        raise CliError("--chat applies the chat template to prompt text: it cannot take --prompt-ids")
    if args.system is not None and not args.chat:
        raise CliError("--system is the system turn of a chat prompt: add --chat")
    spec = run_spec(args)
    settings = run_settings(args, spec)
    try:
        settings.check(FLAG_NAMES)
        if settings.coupling_seed is not None and settings.greedy:
            print("-- note: --coupled has no effect at temperature 0 (greedy decoding draws nothing)", file=sys.stderr)
        from specscope.app.threads import apply_threads

        apply_threads(args.threads)  # imports torch: after every setting is checked, so a refusal is quick
        pair = _load(args, spec)
        decoder = build_decoder(settings, pair, FLAG_NAMES)
        prompt = _prompt_ids(args, pair.tokenizer, settings)
        return pair, decoder, prompt, run_config(decoder, settings, pair, prompt, names=FLAG_NAMES)
    except SettingsError as exc:
        raise CliError(str(exc)) from None


def _token_text(tokenizer: Any, token: int) -> str:
    from specscope.core.loading.text import token_text

    return f"<{token}>" if tokenizer is None else token_text(tokenizer, token)


def _print_round(rnd: Any, tokenizer: Any, eos_ids: Any, color: bool) -> None:
    out = []
    for e in rnd.emitted:
        text = _token_text(tokenizer, e.token)
        if e.token in eos_ids:
            text = f"<eos:{e.token}>"
        if color:
            out.append(f"{ANSI[e.kind]}{text}{RESET}")
        else:
            left, right = PLAIN_MARKS[e.kind]
            out.append(f"{left}{text}{right}")
    sep = f"{ANSI['round']}|{RESET}" if color else "|"
    sys.stdout.write("".join(out) + sep)
    sys.stdout.flush()


def _open_writer(args: argparse.Namespace, config: Any, pair: Any) -> Any:
    """The TraceWriter of --db, or None."""
    if not args.db:
        return None
    from specscope.storage import TraceStore, TraceWriter

    store = TraceStore(args.db)  # --top-n was checked with the settings
    full = {"auto": None, "full": True, "top": False}[args.vectors]
    return TraceWriter(
        store,
        config,
        model_info=pair.model_info(),
        full_vectors=full,
        top_n=args.top_n,
        on_wait=_say_lock_wait(store.location),
    )


def _say_lock_wait(where: str) -> Any:
    """The writer's on_wait: a line on stderr when a locked store makes it wait, every few
    seconds while it waits, when the lock clears and when the run goes to a file instead."""

    def say(state: Any) -> None:
        print(f"\n-- {state.describe(where)}", file=sys.stderr, flush=True)

    return say


def _spill_line(writer: Any) -> str:
    """Where a run whose store stayed locked went, and how to add it to the store."""
    from specscope.storage.engine import mask_passwords

    return writer.spill_note(mask_passwords(str(writer.store.location)))


def _report(args: argparse.Namespace, result: Any, pair: Any, writer: Any, fault: Any = None) -> None:
    from specscope.core import summarize

    summary = summarize(result)
    summary["text"] = pair.tokenizer.decode(result.new_tokens) if pair.tokenizer is not None else None
    if args.db:
        from specscope.storage.engine import mask_passwords

        summary["db"] = mask_passwords(str(args.db))
    if fault is not None:
        summary["fault"] = fault.to_dict()
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    s = result.summary
    print()
    print(
        f"-- run {result.config.run_id}: {s.new_tokens} tokens in {s.rounds} rounds, "
        f"mean accepted length {s.mean_accepted_length:.2f}, acceptance rate {s.acceptance_rate:.2f}, "
        f"{result.wall_s:.3f} s (draft {s.draft_s:.3f} s, verify {s.verify_s:.3f} s), stop: {result.stop_reason}",
        file=sys.stderr,
    )
    for line in fault_lines(fault) if fault is not None else ():
        print(line, file=sys.stderr)
    if writer is not None and not writer.spilled_to:
        print(f"-- recorded as run {result.config.run_id} in {writer.store.location}", file=sys.stderr)


def cmd_run(args: argparse.Namespace) -> int:
    if args.engine == "vllm":  # vLLM runs in its own venv: nothing of specscope's decoder loads
        from specscope.app.cli.vllm import cmd_run_vllm

        return cmd_run_vllm(args, (run_spec, run_settings, _prompt_ids))
    _check_store(args)
    pair, decoder, prompt, config = _prepare(args)
    writer = _open_writer(args, config, pair)
    try:
        return _decode(args, pair, decoder, prompt, config, writer)
    except BaseException as exc:
        _close_unfinished(writer, exc)
        raise
    finally:
        _close_unfinished(writer, None)


def _check_store(args: argparse.Namespace) -> None:
    """Before any model loads: --db must be a file a run can be recorded in (not another
    kind of file, not a store of a newer schema: one line, exit 2)."""
    if not args.db:
        return
    from specscope.storage import NewerStoreError
    from specscope.storage.engine import precheck_sqlite_file, sqlite_path, to_url

    try:
        path = sqlite_path(to_url(args.db))
        if path is not None:
            precheck_sqlite_file(path)
    except NewerStoreError as exc:
        raise CliError(f"--db: {exc}") from None


def _close_unfinished(writer: Any, exc: BaseException | None) -> None:
    """No run is left `running` by an error in printing or reporting: a writer that nothing
    finished is closed here (interrupted after Ctrl-C, failed after an error, else
    interrupted), its rounds kept."""
    if writer is None or writer.finished:
        return
    from specscope.storage import TraceStoreError

    try:
        if exc is None:
            writer.finish("interrupted", error="the run stopped before it was finished")
        else:
            writer.fail(exc)
    except TraceStoreError:  # the store's own failure is reported where it happened
        pass


def _decode(args: argparse.Namespace, pair: Any, decoder: Any, prompt: list[int], config: Any, writer: Any) -> int:
    color = sys.stdout.isatty() and not args.json
    if not args.json:
        sys.stdout.write(pair.tokenizer.decode(prompt) if pair.tokenizer is not None else str(prompt))

    decoded = 0
    scan = _fire_scan(args, config, decoder, pair)

    def each(rnd: Any) -> None:
        nonlocal decoded
        with signals.whole_round():  # a signal now waits: the round is counted, stored and shown whole
            decoded += 1
            if scan is not None:
                scan.observe(rnd)
            if writer is not None:
                writer.write(rnd)  # raises at once once the writer has failed: decoding stops here
            if not args.json:
                _print_round(rnd, pair.tokenizer, decoder.eos_token_ids, color)

    with run_signals() as signals:
        try:
            result = decoder.start(prompt, args.max_new, config=config).drain(each)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (Cancelled)
            return _cancelled(args, exc, writer, decoded)
        except BaseException as exc:
            if writer is not None and writer.error is not None:
                return _recording_failed(args, writer, decoded)
            if writer is not None:
                writer.fail(exc)
            raise
        if writer is not None:
            try:
                writer.finish_with(result)
            except KeyboardInterrupt as exc:  # while it waited for a locked store: the run went to a file
                return _cancelled(args, exc, writer, decoded)
            except Exception:
                if writer.error is None:
                    raise
                return _recording_failed(args, writer, decoded)
    _report(args, result, pair, writer, _fire_report(decoder, scan))
    if writer is not None and writer.spilled_to:
        print(f"specscope: {_spill_line(writer)}", file=sys.stderr)
        return 1
    return 0


def _fire_scan(args: argparse.Namespace, config: Any, decoder: Any, pair: Any) -> Any:
    """With --fault: what the run meets that would make the fault fire (core.faults.firing);
    the text of each token, for a stop string to suggest."""
    if not args.fault:
        return None
    from specscope.core.decode.stops import token_piece_function
    from specscope.core.faults.firing import FireScan

    piece = getattr(decoder, "token_piece", None)
    if piece is None and pair.tokenizer is not None:
        piece = token_piece_function(pair.tokenizer)
    return FireScan(config, piece)


def _fire_report(decoder: Any, scan: Any) -> Any:
    if scan is None:
        return None
    from specscope.core.faults.zoo import fire_report

    return fire_report(decoder.fault, decoder.fault_rounds, scan)


def fault_lines(report: Any) -> list[str]:
    """Where the fault fired, or that it never did and which flags would make it fire."""
    name, fired = report.fault, report.fired_rounds
    if fired:
        shown = ", ".join(str(i) for i in fired[:20]) + (", …" if len(fired) > 20 else "")
        return [f"-- fault {name} fired in {_rounds(len(fired))}: {shown}"]
    lines = [
        f"-- fault {name} never fired: this run is correct, and `specscope check` rightly finds nothing in it "
        f"(it fires when: {report.applies})"
    ]
    s = report.suggestion
    if s is None:
        lines.append(
            "-- this run met nothing a setting could turn into a fire: try another --seed, prompt or --max-new"
        )
    else:
        flags = " ".join(_flag_values(key, value) for key, value in s.settings.items())
        lines.append(f"-- to make it fire, run again with {flags} ({s.why})")
    return lines


def _flag_values(key: str, value: Any) -> str:
    """A RunSettings field's value as the flags that set it (--stop and --stop-ids once per item)."""
    import shlex

    flag = FLAG_NAMES[key].split()[0]
    if key == "stop_strings":
        return " ".join(f"{flag} {shlex.quote(text)}" for text in value)
    if key == "stop_ids":
        return " ".join(f"{flag} {','.join(str(t) for t in seq)}" for seq in value)
    return f"{flag} {value}"


def _end_text_line(args: argparse.Namespace) -> None:
    if not args.json:
        print()


def _rounds(n: int) -> str:
    return f"{n} round{'' if n == 1 else 's'}"


def _cancelled(args: argparse.Namespace, exc: KeyboardInterrupt, writer: Any, decoded: int) -> int:
    """Ctrl-C or SIGTERM stopped the run: store what was decoded, closing the run as
    cancelled (status interrupted, stop reason cancelled); one line; 130 or 143."""
    from specscope.storage import TraceStoreError
    from specscope.storage.engine import mask_passwords

    _end_text_line(args)
    line = f"cancelled after {_rounds(decoded)}"
    if writer is not None:
        try:
            try:
                writer.fail(exc)
            except KeyboardInterrupt:  # again, while it waits for a locked store: the run goes to a file now
                pass
        except TraceStoreError as err:
            line += f"; recording run {writer.run_id} in {writer.store.location} failed: {mask_passwords(str(err))}"
        else:
            if writer.spilled_to:
                line += f"; {_spill_line(writer)}"
            else:
                line += (
                    f"; run {writer.run_id} kept in {writer.store.location} as interrupted (cancelled) "
                    f"with {_rounds(writer.rounds_written)}"
                )
    print(f"specscope: {line}", file=sys.stderr)
    return interrupt_status(exc)


def _recording_failed(args: argparse.Namespace, writer: Any, decoded: int) -> int:
    """The trace writer failed (a full disk, say): decoding has stopped at the round after
    the failure; close the run as failed if the store still takes it; one line; 1."""
    from specscope.storage import TraceStoreError
    from specscope.storage.engine import mask_passwords

    _end_text_line(args)
    error = writer.error
    try:
        writer.fail(error)  # the writer is dead: this only closes it (and raises its error)
    except TraceStoreError:
        pass
    reason = mask_passwords(str(error).replace(f"writing run {writer.run_id}: ", "")) or type(error).__name__
    status = writer.stored_status()
    where = writer.store.location
    if status == "failed":
        kept = f"run {writer.run_id} marked failed in {where} with {_rounds(writer.rounds_written)}"
    else:
        kept = (
            f"run {writer.run_id} could not be marked failed in {where} (it shows as {status or 'running'} "
            f"until the store is opened with room to write, which marks it interrupted)"
        )
    print(f"specscope: recording failed after {_rounds(decoded)}, decoding stopped: {reason}; {kept}", file=sys.stderr)
    return 1
