"""Shared pieces of the command line: the one-line error, integer option limits, prompt ids, --eos-id."""

from __future__ import annotations

import argparse
import sys
import logging

from specscope.core.decode.settings import INT32_MAX, INT64_MAX  # the store's column limits (torch-free)
from specscope.core.records import TOKEN_KINDS


log = logging.getLogger("specscope")


ANSI = {"accepted": "\033[32m", "repaired": "\033[31m", "bonus": "\033[34m", "eos": "\033[7m", "round": "\033[90m"}


RESET = "\033[0m"


PLAIN_MARKS = dict(zip(TOKEN_KINDS, (("", ""), ("[", "]"), ("{", "}"))))


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


# dest -> (flag, smallest, largest) of the integer options whose values reach the core or the store
INT_LIMITS: dict[str, tuple[str, int, int]] = {
    "seed": ("--seed", 0, INT64_MAX),
    "k": ("--k (draft length)", 1, INT32_MAX),
    "max_new": ("--max-new", 0, INT32_MAX),
    "top_k": ("--top-k", 0, INT32_MAX),
    "top_n": ("--top-n", 1, INT32_MAX),
    "coupled": ("--coupled", 0, INT64_MAX),
    "lookup_max_ngram": ("--lookup-max-ngram", 1, INT32_MAX),
    "lookup_min_ngram": ("--lookup-min-ngram", 1, INT32_MAX),
    "round": ("--round", 0, INT32_MAX),
    "top": ("--top", 0, INT32_MAX),
    "limit": ("--limit", 0, INT64_MAX),
}


# `specscope run`'s options that are RunSettings fields: core.decode.settings checks them (the
# checks and messages the window's run panel shows), so they are not checked twice here
RUN_SETTINGS_DESTS = frozenset({"seed", "k", "max_new", "top_k", "top_n", "coupled"})


def check_int_options(args: argparse.Namespace) -> None:
    """Every integer option within what the core and the store can hold (CliError otherwise):
    the options of INT_LIMITS in their ranges, any other integer within a signed 64-bit one,
    --eos-id / --prompt-ids parsed, and run --db's database driver installed. Runs before
    anything is loaded or opened."""
    skip = RUN_SETTINGS_DESTS if getattr(args, "command", None) == "run" else frozenset()
    for dest, value in vars(args).items():
        if not isinstance(value, int) or isinstance(value, bool) or dest in skip:
            continue
        flag, lo, hi = INT_LIMITS.get(dest, ("--" + dest.replace("_", "-"), -INT64_MAX - 1, INT64_MAX))
        if value < lo:
            raise CliError(f"{flag} must be at least {lo}, got {value}")
        if value > hi:
            raise CliError(f"{flag} must be at most {hi}, got {value}")
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


def threads_arg(text: str) -> int:
    from specscope.app.threads import MAX_THREADS

    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number of threads, got {text!r}") from None
    if not 1 <= n <= MAX_THREADS:
        raise argparse.ArgumentTypeError(f"threads must lie in [1, {MAX_THREADS}], got {n}")
    return n


def parse_eos(value: str) -> tuple[int | None, bool]:
    """--eos-id as RunSettings' (eos, eos_disabled): 'auto' = the tokenizer's, 'none' = no EOS,
    else a token id (its range is the settings' check)."""
    if value == "none":
        return None, True
    if value == "auto":
        return None, False
    try:
        return int(value), False
    except ValueError:
        raise CliError(f"--eos-id must be an integer, 'auto' or 'none', got {value!r}") from None


def stderr_progress(message: str) -> None:
    """Long loading work (a GGUF conversion, a download) said on stderr, one line a step."""
    print(f"specscope: {message}", file=sys.stderr, flush=True)
