"""The `specscope` command line.

    specscope                      open the inspector with the bundled models
    specscope open TRACE.sqlite    replay a saved trace in the inspector
    specscope run [...]            decode headless, print text with round markers or JSON
    specscope runs|show|export|import ...   the trace store (see app/cli_traces.py)

Qt is imported only by the commands that open a window.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import contextlib
from dataclasses import replace
from typing import Any, Iterator, Sequence

from specscope.core.records import TOKEN_KINDS

log = logging.getLogger("specscope")

ANSI = {"accepted": "\033[32m", "repaired": "\033[31m", "bonus": "\033[34m", "eos": "\033[7m", "round": "\033[90m"}
RESET = "\033[0m"
PLAIN_MARKS = dict(zip(TOKEN_KINDS, (("", ""), ("[", "]"), ("{", "}"))))


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


# --------------------------------------------------------------------------- input checks

INT32_MAX = 2**31 - 1  # the store's INTEGER columns (k, max_new_tokens, top_k, eos id, top_n) on every database
INT64_MAX = 2**63 - 1  # the store's seed column (BIGINT); numpy's default_rng wants a seed >= 0

# dest -> (flag, smallest, largest) of the integer options whose values reach the core or the store
INT_LIMITS: dict[str, tuple[str, int, int]] = {
    "seed": ("--seed", 0, INT64_MAX),
    "k": ("--k (draft length)", 1, INT32_MAX),
    "max_new": ("--max-new", 0, INT32_MAX),
    "top_k": ("--top-k", 0, INT32_MAX),
    "top_n": ("--top-n", 1, INT32_MAX),
    "lookup_max_ngram": ("--lookup-max-ngram", 1, INT32_MAX),
    "lookup_min_ngram": ("--lookup-min-ngram", 1, INT32_MAX),
    "round": ("--round", 0, INT32_MAX),
    "top": ("--top", 0, INT32_MAX),
    "limit": ("--limit", 0, INT64_MAX),
}


def check_int_options(args: argparse.Namespace) -> None:
    """Every integer option within what the core and the store can hold (CliError otherwise):
    the options of INT_LIMITS in their ranges, any other integer within a signed 64-bit one,
    --eos-id / --prompt-ids parsed, and run --db's database driver installed. Runs before
    anything is loaded or opened."""
    for dest, value in vars(args).items():
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        flag, lo, hi = INT_LIMITS.get(dest, ("--" + dest.replace("_", "-"), -INT64_MAX - 1, INT64_MAX))
        if value < lo:
            raise CliError(f"{flag} must be at least {lo}, got {value}")
        if value > hi:
            raise CliError(f"{flag} must be at most {hi}, got {value}")
    if isinstance(getattr(args, "eos_id", None), str):
        _parse_eos(args.eos_id, None)
    if getattr(args, "prompt_ids", None) is not None:
        parse_prompt_ids(args.prompt_ids)
    if getattr(args, "command", None) == "run" and args.db:  # a missing driver is known before the models load
        from specscope.storage import TraceStoreError
        from specscope.storage.engine import check_driver, to_url

        try:
            check_driver(to_url(args.db))
        except TraceStoreError as exc:
            raise CliError(f"--db: {exc}") from None


def parse_prompt_ids(text: str) -> list[int]:
    """--prompt-ids: comma-separated token ids (spaces allowed), at least one; CliError otherwise."""
    if not text.strip():
        raise CliError("--prompt-ids is empty: pass comma-separated token ids, e.g. --prompt-ids 1,2,3")
    ids = []
    for i, item in enumerate(text.split(","), 1):
        item = item.strip()
        try:
            ids.append(int(item))
        except ValueError:
            what = "is empty" if not item else f"{item!r} is not an integer"
            raise CliError(f"--prompt-ids {text!r}: entry {i} {what}; pass comma-separated token ids, e.g. 1,2,3") from None
    return ids


def check_positions(prompt: Sequence[int], max_new: int, pair: Any) -> None:
    """Refuse a prompt that, with --max-new tokens after it, would pass the models' position
    limit (max_position_embeddings): a model reads nothing sensible past it."""
    found = pair.position_limit()
    if found is None:
        return
    limit, name = found
    if len(prompt) > limit:
        raise CliError(f"the prompt is {len(prompt)} tokens, but {name} reads at most {limit} positions "
                       f"(max_position_embeddings): shorten the prompt")
    if len(prompt) + max_new > limit:
        raise CliError(f"the prompt ({len(prompt)} tokens) plus --max-new {max_new} needs {len(prompt) + max_new} "
                       f"positions, but {name} reads at most {limit} (max_position_embeddings): "
                       f"pass --max-new {limit - len(prompt)} or less")


# --------------------------------------------------------------------------- run


def add_run_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "run",
        help="decode one prompt headless and print the text with round markers",
        description=(
            "Run speculative decoding on one prompt without a window. The text is printed with "
            "round boundaries (|), repaired tokens in [brackets] and bonus tokens in {braces} "
            "(colours instead when the output is a terminal). --json prints a summary instead."
        ),
        epilog=proposer_kinds_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="prompt text (tokenised with the target's tokenizer)")
    src.add_argument("--prompt-file", help="read the prompt text from this file")
    src.add_argument("--prompt-ids", help="comma-separated token ids instead of text (at least one)")
    p.add_argument("--proposer", default=None, metavar="SPEC",
                   help="where draft tokens come from: KIND[:ARG][,KEY=VALUE...], e.g. draft, draft:tiny, draft:PATH, "
                        "lookup, lookup:max_ngram=4 (default: draft; the kinds are listed below)")
    p.add_argument("--k", type=int, default=4, help="draft length per round (default: 4)")
    p.add_argument("--threads", type=_threads_arg, default=None, metavar="N",
                   help="torch CPU threads for decoding (default: all cores but one, up to 8 cores)")
    p.add_argument("--tree", default=None, metavar="SPEC",
                   help="draft a token tree instead of a chain: B1,B2,... (e.g. 3,2,1,1), paths:0;1;0.0 or "
                        "dynamic:nodes=16,depth=5,topk=4 (shorthand for --proposer draft:tree=SPEC)")
    p.add_argument("--children", default=None, choices=("topk", "sampled", "distinct"),
                   help="how a tree's siblings are chosen: topk (default), sampled (i.i.d. from q) or distinct "
                        "(without replacement)")
    p.add_argument("--engine", choices=("specscope", "transformers"), default="specscope",
                   help="who decodes: specscope's decoder, or transformers' own generate() recorded round by round "
                        "(--proposer draft or lookup; see docs/transformers-engine.md) (default: specscope)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: 0)")
    p.add_argument("--top-k", type=int, default=0, help="0 = off (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="1.0 = off (default)")
    p.add_argument("--max-new", type=int, default=64,
                   help="token budget (default: 64); the prompt plus this budget must fit the models' "
                        "max_position_embeddings")
    p.add_argument("--seed", type=int, default=0, help="seed of the run's random stream (default: 0)")
    p.add_argument("--coupled", type=int, default=None, metavar="SEED",
                   help="coupled lanes at temperature > 0: the target's draws come from Gumbel keys of (SEED, output "
                        "position) and a draft model proposes by the same keys, so runs with the same SEED emit the "
                        "same tokens wherever their prefixes agree, whatever the proposer (docs/coupling.md)")
    p.add_argument("--eos-id", default="auto", help="EOS token id, 'auto' = the tokenizer's, 'none' = no EOS")
    p.add_argument("--target", default=None,
                   help="target checkpoint directory (default: the bundled target; 'target' names it too)")
    p.add_argument("--draft", default=None,
                   help="draft: 'small', 'tiny' (bundled) or a checkpoint directory (shorthand for --proposer draft:DRAFT); "
                        "a bundled name always means the bundled model: write ./small for a folder named small")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="default: auto (CUDA when available)")
    p.add_argument("--dtype", default=None, choices=("float32", "float16", "bfloat16", "float64"), help="model dtype (default: float32 on CPU)")
    p.add_argument("--lookup-max-ngram", type=int, default=None,
                   help="prompt lookup: longest suffix n-gram tried (default: 3; shorthand for lookup:max_ngram=N)")
    p.add_argument("--lookup-min-ngram", type=int, default=None,
                   help="prompt lookup: shortest suffix n-gram accepted (default: 1; shorthand for lookup:min_ngram=N)")
    p.add_argument("--no-cache", action="store_true", help="recompute every forward from scratch (a reference run)")
    p.add_argument("--fault", default=None, metavar="NAME", help="inject a deliberate bug (see `specscope faults`)")
    p.add_argument("--db", default=None, help="record the run in this trace store (SQLite path or SQLAlchemy URL)")
    p.add_argument("--vectors", choices=("auto", "full", "top"), default="auto",
                   help="what --db keeps of each p, q and residual besides the top-N and each vector's support, "
                        "smallest entry and sum (enough for every checker rule): 'full' vectors too (about 40x the "
                        "bytes at the bundled vocabulary of 4096), 'top' nothing more, 'auto' = full when the "
                        "vocabulary is at most 1024 (default)")
    p.add_argument("--top-n", type=int, default=20, help="entries of each top-N list in --db (default: 20; at least top-k + 1)")
    p.add_argument("--json", action="store_true", help="print a JSON summary instead of the text")
    p.set_defaults(func=cmd_run)


def proposer_kinds_help() -> str:
    """The registered proposer kinds, for `specscope run --help` (read from the registry)."""
    from specscope.core.registry import KINDS

    lines = ["proposer kinds (--proposer KIND[:ARG][,KEY=VALUE...]):"]
    width = max((len(name) for name in KINDS), default=0)
    for kind in KINDS.values():
        lines.append(f"  {kind.name:<{width}}  {kind.summary}")
        if kind.needs_model:
            lines.append(f"  {'':<{width}}    ARG: 'small', 'tiny' (bundled) or a checkpoint directory "
                         f"(default: {kind.default_arg})")
        for param in kind.params:
            lines.append(f"  {'':<{width}}    {param.name}={param.type.__name__} (default {param.default}): {param.help}")
    return "\n".join(lines)


# (flag, attribute, the spec parameter it sets) of the prompt-lookup shorthands
LOOKUP_FLAGS = (("--lookup-max-ngram", "lookup_max_ngram", "max_ngram"),
                ("--lookup-min-ngram", "lookup_min_ngram", "min_ngram"))


def run_spec(args: argparse.Namespace) -> Any:
    """The ProposerSpec of `specscope run`: --proposer with the --draft and --lookup-*
    shorthands folded in; a conflicting combination is a CliError."""
    from specscope.core.registry import KINDS, SpecError, parse_spec

    lookup = {param: getattr(args, attr) for _, attr, param in LOOKUP_FLAGS if getattr(args, attr) is not None}
    text = args.proposer
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


def _fold_tree_flags(args: argparse.Namespace, spec: Any, text: str) -> Any:
    """--tree and --children set the draft spec's tree and children (a conflict is a CliError)."""
    flags = {param: getattr(args, param, None) for param in ("tree", "children")}
    flags = {param: value for param, value in flags.items() if value is not None}
    if not flags:
        return spec
    if spec.kind != "draft":
        raise CliError(f"--{next(iter(flags))} applies to a draft model, not to --proposer {text}")
    for param, value in flags.items():
        if spec.params.get(param, value) != value:
            raise CliError(f"--{param} {value} and --proposer {text} set {param} twice: pass one")
    if "children" in flags and "tree" not in {**spec.params, **flags}:
        raise CliError("--children applies to a tree: pass --tree SPEC too")
    return replace(spec, params={**spec.params, **flags})


def _parse_eos(value: str, tokenizer: Any) -> int | None:
    if value == "none":
        return None
    if value == "auto":
        return getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    try:
        eos = int(value)
    except ValueError:
        raise CliError(f"--eos-id must be an integer, 'auto' or 'none', got {value!r}") from None
    if not 0 <= eos <= INT32_MAX:
        raise CliError(f"--eos-id must be a token id from 0 to {INT32_MAX}, 'auto' or 'none', got {value}")
    return eos


def _prompt_ids(args: argparse.Namespace, tokenizer: Any) -> list[int]:
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
        text = _default_prompt()
    if tokenizer is None:
        raise CliError("this target has no tokenizer: pass --prompt-ids")
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _default_prompt() -> str:
    from specscope.core.loading import example_prompts

    prompts = example_prompts()
    return prompts[0].text if prompts else "def fibonacci(n):\n"


def _load(args: argparse.Namespace, spec: Any):
    """The ModelPair: the target, and the draft the spec names (None for kinds without a model)."""
    from specscope.core import loading

    return loading.load_models(
        target=args.target,
        draft=spec.model_ref,
        device=loading.resolve_device(args.device),
        dtype=args.dtype,
    )


def _make_decoder(args: argparse.Namespace, spec: Any, pair: Any):
    from specscope.core import SamplingConfig, SpeculativeDecoder
    from specscope.core.registry import SpecError, build_proposer

    sampling = SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    if getattr(args, "engine", "specscope") == "transformers":
        if getattr(args, "coupled", None) is not None:
            raise CliError("--coupled applies to the specscope engine only")
        return _make_transformers_engine(args, spec, pair, sampling)
    try:
        proposer = build_proposer(spec, load_draft=lambda ref: (pair.draft, pair.draft_name))
    except SpecError as exc:
        raise CliError(f"--proposer: {exc}") from None
    options = dict(
        k=args.k,
        sampling=sampling,
        eos_token_id=_parse_eos(args.eos_id, pair.tokenizer),
        seed=args.seed,
        use_cache=not args.no_cache,
        target_name=pair.target_name,
        # The round records keep what --db keeps: full vectors when asked, else top-N above
        # 4096 tokens (core.dists), computed on the model's device.
        vectors="full" if getattr(args, "vectors", "auto") == "full" else "auto",
        top_n=max(1, getattr(args, "top_n", 20)),
        coupling_seed=_coupling_seed(args, sampling),
    )
    if args.fault:
        from specscope.core.faults import faulty_decoder

        return faulty_decoder(args.fault, pair.target, proposer, **options)
    return SpeculativeDecoder(pair.target, proposer, **options)


def _coupling_seed(args: argparse.Namespace, sampling: Any) -> int | None:
    """--coupled SEED: checked; None at temperature 0 (greedy has no randomness to share)."""
    seed = getattr(args, "coupled", None)
    if seed is None:
        return None
    if seed < 0:
        raise CliError(f"--coupled must be a seed >= 0, got {seed}")
    if args.tree or "tree" in str(args.proposer or ""):
        raise CliError("--coupled verifies chain drafts: it cannot be combined with a tree")
    if sampling.greedy:
        print("-- note: --coupled has no effect at temperature 0 (greedy decoding draws nothing)", file=sys.stderr)
        return None
    return seed


def _make_transformers_engine(args: argparse.Namespace, spec: Any, pair: Any, sampling: Any):
    """--engine transformers: transformers' own generate() (assisted or prompt lookup), recorded."""
    from specscope.core.engines import PrivateAPIChanged, TransformersEngine

    if args.fault or args.no_cache:
        raise CliError(f"{'--fault' if args.fault else '--no-cache'} applies to the specscope engine only")
    if spec.kind not in ("draft", "lookup"):
        raise CliError(f"--engine transformers runs --proposer draft or lookup, not {spec.kind}")
    unknown = set(spec.params) - ({"max_ngram"} if spec.kind == "lookup" else set())
    if unknown:
        raise CliError(f"--engine transformers: {spec.kind} takes no {', '.join(sorted(unknown))} here")
    try:
        return TransformersEngine(
            pair.target, kind="assisted" if spec.kind == "draft" else "lookup", draft=pair.draft, k=args.k,
            sampling=sampling, eos_token_id=_parse_eos(args.eos_id, pair.tokenizer), seed=args.seed,
            target_name=pair.target_name, draft_name=pair.draft_name, max_ngram=int(spec.params.get("max_ngram", 2)))
    except (PrivateAPIChanged, ValueError) as exc:
        raise CliError(f"--engine transformers: {exc}") from None


def _token_text(tokenizer: Any, token: int) -> str:
    if tokenizer is None:
        return f"<{token}>"
    return tokenizer.decode([token])


def _print_round(rnd: Any, tokenizer: Any, eos_id: int | None, color: bool) -> None:
    out = []
    for e in rnd.emitted:
        text = _token_text(tokenizer, e.token)
        if e.token == eos_id:
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

    if args.top_n < 1:
        raise CliError(f"--top-n must be at least 1, got {args.top_n}")
    store = TraceStore(args.db)
    full = {"auto": None, "full": True, "top": False}[args.vectors]
    return TraceWriter(store, config, model_info=pair.model_info(), full_vectors=full, top_n=args.top_n)


def _report(args: argparse.Namespace, result: Any, pair: Any, writer: Any) -> None:
    from specscope.core import summarize

    summary = summarize(result)
    summary["text"] = pair.tokenizer.decode(result.new_tokens) if pair.tokenizer is not None else None
    if args.db:
        from specscope.storage.engine import mask_passwords

        summary["db"] = mask_passwords(str(args.db))
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
    if writer is not None:
        print(f"-- recorded as run {result.config.run_id} in {writer.store.location}", file=sys.stderr)


def cmd_run(args: argparse.Namespace) -> int:
    from specscope.app.threads import apply_threads

    apply_threads(args.threads)
    spec = run_spec(args)
    pair = _load(args, spec)
    decoder = _make_decoder(args, spec, pair)
    prompt = _prompt_ids(args, pair.tokenizer)
    check_positions(prompt, args.max_new, pair)
    config = decoder.run_config(prompt, args.max_new)
    color = sys.stdout.isatty() and not args.json
    writer = _open_writer(args, config, pair)
    if not args.json:
        sys.stdout.write(pair.tokenizer.decode(prompt) if pair.tokenizer is not None else str(prompt))

    decoded = 0

    def each(rnd: Any) -> None:
        nonlocal decoded
        with signals.whole_round():  # a signal now waits: the round is counted, stored and shown whole
            decoded += 1
            if writer is not None:
                writer.write(rnd)  # raises at once once the writer has failed: decoding stops here
            if not args.json:
                _print_round(rnd, pair.tokenizer, decoder.eos_token_id, color)

    with _run_signals() as signals:
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
            except Exception:
                if writer.error is None:
                    raise
                return _recording_failed(args, writer, decoded)
    _report(args, result, pair, writer)
    return 0


class Cancelled(KeyboardInterrupt):
    """Raised in the main thread by `specscope run`'s SIGTERM handler: the run ends as after
    Ctrl-C (cancelled, what was decoded stored), and the exit status is 128 + the signal."""

    def __init__(self, signum: int):
        import signal

        super().__init__(f"cancelled by {signal.Signals(signum).name}")
        self.signum = signum


def _interrupt_status(exc: BaseException) -> int:
    """The conventional exit status after an interrupt: 130 for SIGINT (Ctrl-C), 143 for SIGTERM."""
    import signal

    return 128 + int(getattr(exc, "signum", signal.SIGINT))


class _RunSignals:
    """Ctrl-C and SIGTERM while `specscope run` decodes: SIGTERM raises Cancelled as Ctrl-C
    raises KeyboardInterrupt, except while a decoded round is being stored and printed
    (`whole_round`): then the signal waits for the round's end, so that a round is counted,
    kept and shown entirely or not at all."""

    def __init__(self) -> None:
        self.holding = False
        self.pending: int | None = None

    def handler(self, signum: int, frame: Any) -> None:
        if self.holding:
            self.pending = signum
            return
        self.interrupt(signum)

    @staticmethod
    def interrupt(signum: int) -> None:
        import signal

        raise Cancelled(signum) if signum == signal.SIGTERM else KeyboardInterrupt

    @contextlib.contextmanager
    def whole_round(self) -> Iterator[None]:
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
        if self.pending is not None:
            signum, self.pending = self.pending, None
            self.interrupt(signum)


@contextlib.contextmanager
def _run_signals() -> Iterator[_RunSignals]:
    """Installs _RunSignals' handler for SIGTERM, and for SIGINT where Python's own handler
    is in place (an ignored Ctrl-C stays ignored), in the main thread (elsewhere no handler
    can be set and nothing changes); the previous handlers are restored after."""
    import signal
    import threading

    signals = _RunSignals()
    if threading.current_thread() is not threading.main_thread():
        yield signals
        return
    wanted = [signal.SIGTERM] + ([signal.SIGINT] if signal.getsignal(signal.SIGINT) is signal.default_int_handler else [])
    previous = {signum: signal.signal(signum, signals.handler) for signum in wanted}
    try:
        yield signals
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


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
            writer.fail(exc)
        except TraceStoreError as err:
            line += f"; recording run {writer.run_id} in {writer.store.location} failed: {mask_passwords(str(err))}"
        else:
            line += (f"; run {writer.run_id} kept in {writer.store.location} as interrupted (cancelled) "
                     f"with {_rounds(writer.rounds_written)}")
    print(f"specscope: {line}", file=sys.stderr)
    return _interrupt_status(exc)


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
        kept = (f"run {writer.run_id} could not be marked failed in {where} (it shows as {status or 'running'} "
                f"until the store is opened with room to write, which marks it interrupted)")
    print(f"specscope: recording failed after {_rounds(decoded)}, decoding stopped: {reason}; {kept}", file=sys.stderr)
    return 1


# --------------------------------------------------------------------------- check, diff, faults


def add_check_parsers(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "check",
        help="check the rounds of saved runs for rollback, EOS, budget and sampler bugs",
        description="Check every round of a run from its trace alone; exit status 1 when a rule is violated.",
    )
    p.add_argument("db", help="trace store: an SQLite path or an SQLAlchemy URL")
    p.add_argument("--run", default=None, help="run id (or unique prefix); default: every run in the store")
    p.add_argument("--json", action="store_true", help="print the findings (and their grouping by cause) as JSON")
    p.add_argument("--all", action="store_true", help="list every follow-on finding under its cause, not just a count")
    p.add_argument("--tol", type=float, default=1e-6, help="tolerance for recorded scalars (default: 1e-6)")
    p.add_argument("--recompute", action="store_true", help="also recompute p with the target model (deep replay)")
    p.add_argument("--target", default=None, help="target checkpoint for --recompute (default: the run's bundled target)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.set_defaults(func=cmd_check)

    p = subparsers.add_parser(
        "diff",
        help="compare two runs of the same prompt and report the first divergence",
        description="Align two runs token by token; report the first divergence in tokens, in p and in cache lengths.",
    )
    p.add_argument("db", help="trace store: an SQLite path or an SQLAlchemy URL")
    p.add_argument("run_a")
    p.add_argument("run_b")
    p.add_argument("--p-tol", type=float, default=1e-4, help="tolerance on p (default: 1e-4)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_diff)

    p = subparsers.add_parser("faults", help="list the deliberate bugs `specscope run --fault` can inject")
    p.set_defaults(func=cmd_faults)


def open_existing_store(location: str) -> Any:
    """A trace store a read-only command reads: a missing path or an empty file is refused
    (CliError, exit 2) and nothing is created."""
    from specscope.storage import TraceStore, TraceStoreError

    try:
        return TraceStore(location, create=False)
    except TraceStoreError as exc:
        raise CliError(str(exc)) from None


def cmd_check(args: argparse.Namespace) -> int:
    from specscope.core.checker import check_report, recompute_findings

    store = open_existing_store(args.db)
    run_ids = [store.resolve_run_id(args.run)] if args.run else [r.run_id for r in store.list_runs(newest_first=False)]
    target_cache: dict[str, Any] = {}
    report = []
    total = 0
    for run_id in run_ids:
        info = store.get_run(run_id)
        counted = [0]  # rounds are streamed from the store in batches: memory is one batch, not the run

        def rounds() -> Any:
            for rnd in store.iter_rounds(run_id, full=True):
                counted[0] += 1
                yield rnd

        checked = check_report(info.config, rounds(), tol=args.tol, end=info.end)
        n_rounds = counted[0]
        if args.recompute:
            target = _target_for_recompute(args, info.config, target_cache)
            checked.findings += recompute_findings(info.config, store.iter_rounds(run_id, full=True), target)
        total += len(checked.findings)
        report.append({"run_id": run_id, "rounds": n_rounds, "findings": [f.to_dict() for f in checked.findings],
                       "groups": [g.to_dict() for g in checked.groups], "not_checked": checked.not_checked})
        if not args.json:
            _print_check(run_id, n_rounds, checked, args.all)
    if args.json:
        print(json.dumps({"runs": report, "findings": total}, indent=2))
    return 1 if total else 0


def _print_check(run_id: str, n_rounds: int, checked: Any, show_all: bool) -> None:
    """Root causes first: each cause on its line, what follows from it counted (or listed
    with --all), then the rules the trace's unrecorded fields kept from running."""
    head = f"run {run_id}: {n_rounds} rounds, "
    groups = checked.groups
    if not groups:
        print(head + "no findings")
    else:
        first = groups[0].cause.round
        print(head + f"{len(checked.findings)} finding(s) from {len(groups)} cause(s), first bad round {first}")
        for g in groups:
            print(f"  {g.cause}")
            if g.follow_on and show_all:
                for f in g.follow_on:
                    print(f"      follows: {f}")
            elif g.follow_on:
                lo, hi = g.rounds
                rules = ", ".join(sorted({f.rule for f in g.follow_on}))
                print(f"      + {len(g.follow_on)} follow-on finding(s) ({rules}) in rounds {lo}-{hi}; --all lists them")
    for rule, why in checked.not_checked.items():
        print(f"  not checked: {rule} ({why})")


def _target_for_recompute(args: argparse.Namespace, config: Any, cache: dict[str, Any]) -> Any:
    from specscope.core import loading

    key = args.target or config.target_name
    if key not in cache:
        pair = loading.load_models(target=args.target or config.target_name, draft=None,
                                   device=loading.resolve_device(args.device), dtype=None)
        cache[key] = pair.target
    return cache[key]


def cmd_diff(args: argparse.Namespace) -> int:
    from specscope.core.diff import diff_runs

    store = open_existing_store(args.db)
    ids = [store.resolve_run_id(r) for r in (args.run_a, args.run_b)]
    loaded = [(store.run_config(i), store.load_rounds(i, full=True)) for i in ids]
    result = diff_runs(loaded[0][0], loaded[0][1], loaded[1][0], loaded[1][1], p_tol=args.p_tol)
    if args.json:
        print(json.dumps({
            "run_a": result.run_a, "run_b": result.run_b, "identical": result.identical,
            "compared_tokens": result.compared_tokens, "compared_cache_rounds": result.compared_cache_rounds,
            "divergences": [d.__dict__ for d in result.divergences],
        }, indent=2))
    else:
        print(f"A = {result.run_a}\nB = {result.run_b}")
        print(f"compared {result.compared_tokens} tokens and {result.compared_cache_rounds} rounds of cache lengths")
        if result.identical:
            print("no divergence")
        for d in result.divergences:
            print(f"  first {d}")
    return 0 if result.identical else 1


def cmd_faults(args: argparse.Namespace) -> int:
    from specscope.core.faults import COUPLED_FAULTS, FAULTS, TREE_FAULTS

    width = max(len(n) for n in [*FAULTS, *TREE_FAULTS, *COUPLED_FAULTS])
    for f in [*FAULTS.values(), *TREE_FAULTS.values(), *COUPLED_FAULTS.values()]:
        print(f"{f.name:<{width}}  {f.summary}\n{'':<{width}}  fires when: {f.applies}")
    return 0


# --------------------------------------------------------------------------- GUI


def check_trace_file(path: str) -> None:
    """`specscope open PATH` before the window opens: PATH must be a trace store file, or a
    database URL that opens as one (CliError otherwise; nothing is created or changed)."""
    if "://" not in path and not os.path.isfile(path):
        raise CliError(f"no trace store at {path}" + (" (a directory)" if os.path.isdir(path) else ""))
    open_existing_store(path).close()


def _threads_arg(text: str) -> int:
    from specscope.app.threads import MAX_THREADS

    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number of threads, got {text!r}") from None
    if not 1 <= n <= MAX_THREADS:
        raise argparse.ArgumentTypeError(f"threads must lie in [1, {MAX_THREADS}], got {n}")
    return n


def cmd_open(args: argparse.Namespace) -> int:
    check_trace_file(args.trace)
    from specscope.app.gui import launch

    if args.run:
        store = open_existing_store(args.trace)
        try:
            run_id = store.resolve_run_id(args.run)  # CliError-worthy when unknown or ambiguous
        except Exception as exc:  # noqa: BLE001 - the store's own message says which
            raise CliError(f"{args.trace}: {exc}") from None
        finally:
            store.close()
        return launch(trace_path=args.trace, run_id=run_id, **_app_threads(args))
    return launch(trace_path=args.trace, **_app_threads(args))


def _app_threads(args: argparse.Namespace) -> dict:
    """launch()'s threads argument, only when given (callers' launch stand-ins stay simple)."""
    return {"threads": args.app_threads} if getattr(args, "app_threads", None) else {}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specscope",
        description="An inspector for speculative decoding. Without a command, opens the window.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parser.add_argument("--threads", dest="app_threads", type=_threads_arg, default=None, metavar="N",
                        help="the window's torch CPU threads for decoding (default: all cores but one, up to 8 "
                             "cores; the run panel keeps its own setting otherwise)")
    p = sub.add_parser("open", help="open a saved trace in the inspector")
    p.add_argument("trace", help="an SQLite trace store")
    p.add_argument("--run", default=None, metavar="ID", help="the run to replay (an id or a unique prefix)")
    p.set_defaults(func=cmd_open)
    add_run_parser(sub)
    add_check_parsers(sub)
    from specscope.app import bench, cli_traces

    bench.add_bench_parser(sub)

    cli_traces.register(sub)
    _mask_help(parser)
    return parser


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found += _subparsers(sub)
    return found


def _mask_help(parser: argparse.ArgumentParser) -> None:
    """No help text shows a database password (e.g. a default taken from $SPECSCOPE_DB)."""
    from specscope.storage.engine import mask_passwords

    for p in _subparsers(parser):
        for action in p._actions:
            if isinstance(action.help, str):
                action.help = mask_passwords(action.help)
        for attr in ("description", "epilog"):
            if isinstance(getattr(p, attr), str):
                setattr(p, attr, mask_passwords(getattr(p, attr)))


def _secrets(args: argparse.Namespace) -> list[str]:
    """The passwords of the database URLs this command was given (--db, $SPECSCOPE_DB)."""
    from sqlalchemy.engine import make_url

    found = []
    for text in (getattr(args, "db", None), os.environ.get("SPECSCOPE_DB")):
        if isinstance(text, str) and "://" in text:
            try:
                password = make_url(text).password
            except Exception:  # noqa: BLE001 - an unparsable URL: the pattern masks it
                continue
            if password:
                found.append(str(password))
    return found


class _MaskSecrets(logging.Filter):
    """Hides database passwords in log records (a URL's, and the given literal ones)."""

    def __init__(self, secrets: Sequence[str]):
        super().__init__()
        self.secrets = [s for s in secrets if len(s) >= 3]  # shorter ones would garble text; URLs are masked anyway

    def mask(self, text: str) -> str:
        from specscope.storage.engine import mask_passwords

        text = mask_passwords(text)
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = self.mask(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


def _hide_loading_bars() -> None:
    """transformers 5 draws a "Loading weights" bar on stderr for every checkpoint it loads;
    specscope's own output says what it does (-v, or the variable set either way, keeps them)."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # read where huggingface_hub is imported
    if "transformers" in sys.modules:  # already imported (the bench parser imports the core)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not args.verbose and "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ:
        _hide_loading_bars()
    masker = _MaskSecrets(_secrets(args))
    for handler in logging.getLogger().handlers:
        for old in [f for f in handler.filters if isinstance(f, _MaskSecrets)]:
            handler.removeFilter(old)
        handler.addFilter(masker)
    if args.command is None:
        from specscope.app.gui import launch

        return launch(**_app_threads(args))
    try:
        check_int_options(args)
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"specscope: {masker.mask(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C outside a run's rounds (`specscope run` reports its own)
        print("specscope: cancelled", file=sys.stderr)
        return _interrupt_status(exc)
    except ValueError as exc:  # bad input caught by the core: one clear line, no traceback
        print(f"specscope: error: {masker.mask(str(exc))}", file=sys.stderr)
        return 2
    except Exception as exc:
        from specscope.storage import TraceStoreError

        if isinstance(exc, TraceStoreError):
            print(f"specscope: {masker.mask(str(exc))}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
