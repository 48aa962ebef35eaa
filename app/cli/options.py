"""Shared pieces of the command line: the one-line error, integer option bounds (the settings
model's, core.settings.bounds), prompt ids, --eos-id."""

from __future__ import annotations

import argparse
import errno
import logging
import math
import os
import sys
import time
from typing import Any

from specscope.core.records import TOKEN_KINDS
from specscope.core.settings.bounds import ANY_INT, BOUNDS, IntBound  # torch-free: the parser is built at every start

log = logging.getLogger("specscope")


ANSI = {"accepted": "\033[32m", "repaired": "\033[31m", "bonus": "\033[34m", "eos": "\033[7m", "round": "\033[90m"}


RESET = "\033[0m"


PLAIN_MARKS = dict(zip(TOKEN_KINDS, (("", ""), ("[", "]"), ("{", "}"))))


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


# dest -> (flag, the setting whose bound it takes) of the integer options whose values reach the
# core or the store; the bounds are the settings model's (core.settings.bounds), one per setting
INT_OPTIONS: dict[str, tuple[str, str]] = {
    "seed": ("--seed", "seed"),
    "k": ("--k (draft length)", "k"),
    "max_new": ("--max-new", "max_new_tokens"),
    "top_k": ("--top-k", "top_k"),
    "top_n": ("--top-n", "top_n"),
    "coupled": ("--coupled", "coupling_seed"),
    "lookup_max_ngram": ("--lookup-max-ngram", "max_ngram"),
    "lookup_min_ngram": ("--lookup-min-ngram", "min_ngram"),
    "round": ("--round", "round"),
    "top": ("--top", "top"),
    "limit": ("--limit", "limit"),
    "threads": ("--threads", "threads"),
    "reps": ("--reps", "reps"),
    "prompts": ("--prompts", "prompts"),
}


def int_option(dest: str) -> tuple[str, IntBound]:
    """(flag, bound) of an integer option: INT_OPTIONS', or any other within a signed 64-bit integer."""
    if dest in INT_OPTIONS:
        flag, setting = INT_OPTIONS[dest]
        return flag, BOUNDS[setting]
    return "--" + dest.replace("_", "-"), ANY_INT


# `specscope run`'s options that are RunSettings fields: core.decode.settings checks them (the
# checks and messages the window's run panel shows), so they are not checked twice here
RUN_SETTINGS_DESTS = frozenset({"seed", "k", "max_new", "top_k", "top_n", "coupled"})


def check_options(args: argparse.Namespace) -> None:
    """Every option checked before a command starts: integers, numbers, store locations."""
    check_int_options(args)
    check_float_options(args)
    check_store_options(args)


# dest -> (flag, smallest allowed) of the non-run commands' real-valued options
FLOAT_LIMITS: dict[str, tuple[str, float]] = {
    "tol": ("--tol", 0.0),
    "p_tol": ("--p-tol", 0.0),
}


def finite_number(flag: str, value: float, lo: float | None = None, hi: float | None = None) -> float:
    """`value` when it is a finite number in [lo, hi]; CliError otherwise (one message for every option)."""
    if not math.isfinite(value):
        raise CliError(f"{flag} must be a finite number, got {value}")
    if lo is not None and value < lo:
        raise CliError(f"{flag} must be at least {lo:g}, got {value:g}")
    if hi is not None and value > hi:
        raise CliError(f"{flag} must be at most {hi:g}, got {value:g}")
    return value


def check_float_options(args: argparse.Namespace) -> None:
    """The real-valued options of check, diff and the other trace commands: finite, and not
    below what they mean (a tolerance is never negative). `run`'s own options are checked
    by its settings."""
    if getattr(args, "command", None) == "run":
        return
    for dest, value in vars(args).items():
        if isinstance(value, float):
            flag, lo = FLOAT_LIMITS.get(dest, ("--" + dest.replace("_", "-"), None))
            finite_number(flag, value, lo)


def check_store_options(args: argparse.Namespace) -> None:
    """Every store location a command was given (or, for `import`, the default one) names a
    store that can keep runs: not empty, not an in-memory database."""
    from specscope.storage import TraceStoreError
    from specscope.storage.engine import check_store_location

    for dest in ("db", "trace"):
        value = getattr(args, dest, None)
        if value is None and not (dest == "db" and getattr(args, "command", None) == "import"):
            continue
        try:
            check_store_location(value)
        except TraceStoreError as exc:
            flag = "--db: " if dest == "db" and args.command in ("run", "import") else ""
            raise CliError(f"{flag}{exc}") from None


def check_int_options(args: argparse.Namespace) -> None:
    """Every integer option within what the core and the store can hold (CliError otherwise):
    the options of INT_OPTIONS within their settings' bounds, any other integer within a signed 64-bit one,
    --eos-id / --prompt-ids parsed, and run --db's database driver installed. Runs before
    anything is loaded or opened."""
    skip = RUN_SETTINGS_DESTS if getattr(args, "command", None) == "run" else frozenset()
    for dest, value in vars(args).items():
        if not isinstance(value, int) or isinstance(value, bool) or dest in skip:
            continue
        flag, bound = int_option(dest)
        if (problem := bound.problem(value)) is not None:
            raise CliError(f"{flag} {problem}")
    if isinstance(getattr(args, "eos_id", None), str):
        parse_eos(args.eos_id)
    if getattr(args, "prompt_ids", None) is not None:
        parse_prompt_ids(args.prompt_ids)
    if getattr(args, "command", None) == "run" and args.db:  # a missing driver is known before the models load
        from specscope.storage import TraceStoreError
        from specscope.storage.engine import check_driver, to_url

        try:
            check_driver(to_url(args.db))
        except TraceStoreError as exc:
            raise CliError(f"--db: {exc}") from None


def is_broken_pipe(exc: BaseException) -> bool:
    """The reader of our output went away (`specscope ... | head`)."""
    return isinstance(exc, BrokenPipeError) or (isinstance(exc, OSError) and exc.errno == errno.EPIPE)


SIGPIPE_STATUS = 141  # 128 + SIGPIPE: what a shell reports for a tool the closed pipe stopped


def leave_quietly() -> int:
    """Exit like other Unix tools when the reader of stdout is gone: no message, no
    traceback (stdout is pointed at /dev/null so the interpreter's last flush cannot fail)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real stdout (a test's capture): nothing left to flush there
        pass
    return SIGPIPE_STATUS


class Progress:
    """Progress of long work as one line on stderr, rewritten in place: only on a terminal,
    never with --json or when stderr is piped, and only once the work has taken DELAY_S
    (short commands print nothing). Cleared when the work ends, also by Ctrl-C."""

    DELAY_S = 1.0
    EVERY_S = 0.25

    def __init__(self, what: str, total: int | None = None, unit: str = "rounds", quiet: bool = False):
        self.enabled = not quiet and _is_tty(sys.stderr)
        self.what, self.total, self.unit = what, total, unit
        self.done = 0
        self.started = time.monotonic()
        self.shown_at = 0.0

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and now - self.started >= self.DELAY_S and now - self.shown_at >= self.EVERY_S:
            self.shown_at = now
            of = f" of {self.total}" if self.total else ""
            sys.stderr.write(f"\r{self.what}: {self.done}{of} {self.unit}\033[K")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self.shown_at:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
            self.shown_at = 0.0

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.close()


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


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
            raise CliError(
                f"--prompt-ids {text!r}: entry {i} {what}; pass comma-separated token ids, e.g. 1,2,3"
            ) from None
    return ids


def k_arg(text: str) -> int | str:
    """--k: a whole number (its bound is the settings model's check) or "auto" (chosen each round by cost)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number or auto, got {text!r}") from None


def threads_arg(text: str) -> int:
    bound = BOUNDS["threads"]
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number of threads, got {text!r}") from None
    if bound.problem(n) is not None:
        raise argparse.ArgumentTypeError(f"threads must lie in [{bound.lo}, {bound.hi}], got {n}")
    return n


def parse_eos(value: str) -> tuple[int | tuple[int, ...] | None, bool]:
    """--eos-id as RunSettings' (eos, eos_disabled): 'auto' = the model's (its generation
    config's ids and the tokenizer's), 'none' = no EOS, else a token id or a comma list of
    them (their range is the settings' check)."""
    if value == "none":
        return None, True
    if value == "auto":
        return None, False
    try:
        ids = tuple(int(part) for part in value.split(","))
    except ValueError:
        raise CliError(
            f"--eos-id must be an integer (or integers separated by commas), 'auto' or 'none', got {value!r}"
        ) from None
    return (ids[0] if len(ids) == 1 else ids), False


def parse_stop_ids(values: list[str] | None) -> tuple[tuple[int, ...], ...]:
    """Each --stop-ids as a token sequence (a comma list of ids)."""
    from specscope.core.decode.stops import parse_stop_ids as parse

    try:
        return tuple(parse(v) for v in values or ())
    except ValueError as exc:
        raise CliError(f"--stop-ids: {exc}") from None


def stderr_progress(message: str) -> None:
    """Long loading work (a GGUF conversion, a download) said on stderr, one line a step."""
    print(f"specscope: {message}", file=sys.stderr, flush=True)
