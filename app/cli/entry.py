"""The `specscope` parser, `specscope open`, and main(): every command's errors as one line."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from specscope.app.cli.check import add_check_parsers, check_trace_file, open_existing_store
from specscope.app.cli.diverge import add_diverge_parser
from specscope.app.cli.models import add_models_parser
from specscope.app.cli.options import CliError, check_options, is_broken_pipe, leave_quietly, threads_arg
from specscope.app.cli.run import add_run_parser
from specscope.app.cli.signals import interrupt_status
from specscope.app.cli.vllm import add_vllm_parser


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


# global options that take a value: skipped when looking for the command in argv
VALUE_OPTIONS = ("--threads",)


def command_of(argv: Sequence[str] | None) -> str | None:
    """The command word of `argv` (sys.argv's when None): the first token that is not a
    global option or its value."""
    tokens = list(sys.argv[1:] if argv is None else argv)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token in VALUE_OPTIONS:
            i += 2
            continue
        if not token.startswith("-"):
            return token
        i += 1
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser; `argv` (when known) lets a command other than `run` skip run's
    torch-importing list of proposer kinds."""
    parser = argparse.ArgumentParser(
        prog="specscope",
        description="An inspector for speculative decoding. Without a command, opens the window.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parser.add_argument(
        "--threads",
        dest="app_threads",
        type=threads_arg,
        default=None,
        metavar="N",
        help="the window's torch CPU threads for decoding (default: all cores but one, up to 8 "
        "cores; the run panel keeps its own setting otherwise)",
    )
    p = sub.add_parser("open", help="open a saved trace in the inspector")
    p.add_argument("trace", help="an SQLite trace store")
    p.add_argument("--run", default=None, metavar="ID", help="the run to replay (an id or a unique prefix)")
    p.set_defaults(func=cmd_open)
    # run's help lists the registered proposer kinds, and reading the registry imports torch
    # (5 of the 9 s `specscope --help` took on a loaded 2-core machine): only run's own help shows it
    add_run_parser(sub, list_kinds=argv is None or command_of(argv) == "run")
    add_check_parsers(sub)
    add_diverge_parser(sub)
    add_models_parser(sub)
    add_vllm_parser(sub)
    from specscope.app import bench
    from specscope.app.cli import traces

    bench.add_bench_parser(sub)

    traces.register(sub)
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
    parsers = _subparsers(parser)
    if not any("://" in text for p in parsers for text in _help_texts(p)):
        return  # no URL, no password: the storage package (about 1 s to import) is not needed
    from specscope.storage.engine import mask_passwords

    for p in parsers:
        for action in p._actions:
            if isinstance(action.help, str):
                action.help = mask_passwords(action.help)
        for attr in ("description", "epilog"):
            if isinstance(getattr(p, attr), str):
                setattr(p, attr, mask_passwords(getattr(p, attr)))


def _help_texts(p: argparse.ArgumentParser) -> list[str]:
    texts = [a.help for a in p._actions if isinstance(a.help, str)]
    return texts + [t for t in (p.description, p.epilog) if isinstance(t, str)]


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


def tolerant_output() -> None:
    """stdout and stderr write what their encoding cannot show as backslash escapes (\\U0001f642) instead of
    raising (PYTHONIOENCODING=ascii, a C locale, a Windows code page): a prompt or an output
    with an emoji prints, its character escaped, on every command."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name, None)
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is None or getattr(stream, "errors", "strict") not in ("strict", None):
            continue
        try:
            reconfigure(errors="backslashreplace")
        except (ValueError, OSError, AttributeError):  # a stream that cannot change: leave it
            pass


def main(argv: Sequence[str] | None = None) -> int:
    tolerant_output()
    parser = build_parser(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
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
        check_options(args)
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
        return status
    except CliError as exc:
        print(f"specscope: {masker.mask(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C outside a run's rounds (`specscope run` reports its own)
        print("specscope: cancelled", file=sys.stderr)
        return interrupt_status(exc)
    except OSError as exc:
        if is_broken_pipe(exc):  # `specscope ... | head`: the reader has what it wanted
            return leave_quietly()
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"specscope: error: {masker.mask(where + (exc.strerror or str(exc)))}", file=sys.stderr)
        return 1
    except ValueError as exc:  # bad input caught by the core: one clear line, no traceback
        print(f"specscope: error: {masker.mask(str(exc))}", file=sys.stderr)
        return 2
    except Exception as exc:
        from specscope.storage import NewerStoreError, TraceStoreError

        if isinstance(exc, TraceStoreError):
            print(f"specscope: {masker.mask(str(exc))}", file=sys.stderr)
            return 2 if isinstance(exc, NewerStoreError) else 1  # a writer refused a newer store: nothing written
        raise
