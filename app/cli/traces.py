"""Trace-store subcommands of the `specscope` CLI: runs, show, export, import.

`register(subparsers)` adds them to an argparse subparsers object; each parser gets
`func=<handler>`, and every handler takes the parsed args and returns an exit code
(0 ok, 1 a trace-store or trace-file error, printed to stderr as one line).
This module imports no Qt.

Stored strings are untrusted (a run may come from an imported file or an older store): the
text output prints them through _safe (control characters escaped, long strings cut), and one
run's odd values (a time datetime cannot format, ...) never stop a whole listing.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import sys
import unicodedata
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from specscope.app.cli.options import Progress, is_broken_pipe
from specscope.core.records import TOKEN_KINDS
from specscope.core.settings.vocab import RUN_STATUSES

if TYPE_CHECKING:  # the storage package (SQLAlchemy: about 2 s) is imported by the commands that read a store
    import numpy as np

    from specscope.storage import TraceStore

_KIND_MARK = dict(zip(TOKEN_KINDS, ("", "!", "+")))
SAFE_WIDTH = 80  # untrusted strings are cut to this many characters + "…"
SHOW_BATCH = 1000  # rounds of a timeline read at a time by `show`


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "runs", help="list the runs in a trace store", description="List the runs in a trace store, newest first."
    )
    p.add_argument(
        "db",
        nargs="?",
        default=None,
        help=f"trace store: an SQLite path or an SQLAlchemy URL (default: the store the window "
        f"records to, {DEFAULT_STORE}; the path read is said on stderr)",
    )
    p.formatter_class = _DefaultStoreFormatter
    p.add_argument("--status", choices=RUN_STATUSES, help="only runs with this status")
    p.add_argument("--limit", type=int, default=None, help="at most this many runs")
    p.add_argument("--json", action="store_true", help="one JSON object per run (JSON lines)")
    p.set_defaults(func=cmd_runs)

    p = subparsers.add_parser(
        "show",
        help="show a stored run, or one round of it",
        description="Show a run's header and round timeline, or one round in full.",
    )
    p.add_argument("db", help="trace store: an SQLite path or an SQLAlchemy URL")
    p.add_argument("run", help="run id, a unique prefix of one, or 'last'")
    p.add_argument("--round", type=int, default=None, metavar="N", help="show round N in full (nodes, p/q, residual)")
    p.add_argument("--top", type=int, default=5, metavar="N", help="entries of p/q/residual to list (default 5)")
    p.add_argument("--json", action="store_true", help="print JSON (the trace-format records) instead of text")
    p.set_defaults(func=cmd_show)

    p = subparsers.add_parser(
        "export",
        help="export a run as a JSONL trace",
        description="Export a run in the versioned JSONL trace format (docs/trace-format.md).",
    )
    p.add_argument("db", help="trace store: an SQLite path or an SQLAlchemy URL")
    p.add_argument("run", help="run id, a unique prefix of one, or 'last'")
    p.add_argument("-o", "--output", required=True, metavar="FILE.jsonl", help="output file ('-' for stdout)")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace FILE.jsonl if it exists (a trace store or other SQLite file is never replaced)",
    )
    p.set_defaults(func=cmd_export)

    p = subparsers.add_parser(
        "import",
        help="import a JSONL trace into a trace store",
        description="Validate a JSONL trace and add it to a store (all or nothing).",
    )
    p.add_argument("file", metavar="FILE.jsonl", help="trace file ('-' for stdin)")
    p.add_argument("--db", default=None, help=f"trace store (default: {DEFAULT_STORE})")
    p.formatter_class = _DefaultStoreFormatter
    p.add_argument("--run-id", default=None, help="store the run under this id instead of the file's")
    p.set_defaults(func=cmd_import)


# ---------------------------------------------------------------------------- helpers

DEFAULT_STORE = "<the default store>"  # named in a help text only when that help is printed


class _DefaultStoreFormatter(argparse.HelpFormatter):
    """Names the default trace store when a help text is shown: finding it imports the
    storage package, which `specscope --help` and the other commands' help do not need."""

    def _expand_help(self, action: argparse.Action) -> str:
        text = super()._expand_help(action)
        if DEFAULT_STORE in text:
            from specscope.storage.engine import mask_passwords
            from specscope.storage.paths import describe_default_location

            # $SPECSCOPE_DB may be a URL with a password: never shown
            text = text.replace(DEFAULT_STORE, mask_passwords(describe_default_location()))
        return text


def _fail(message: str) -> int:
    print(f"specscope: error: {_safe(message, 1000)}", file=sys.stderr)
    return 1


def _escape(ch: str) -> str:
    if ch in "\n\r\t":
        return repr(ch)[1:-1]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _unsafe(ch: str) -> bool:
    # control (C0, DEL, C1), format (bidi overrides, zero-width), line/paragraph separators
    return ch < " " or "\x7f" <= ch <= "\x9f" or (ch > "\x9f" and unicodedata.category(ch) in ("Cf", "Zl", "Zp", "Cs"))


def _safe(value: Any, width: int = SAFE_WIDTH) -> str:
    """An untrusted value as one printable line: control characters escaped (ESC -> \\x1b),
    cut to `width` characters + "…"."""
    if value is None:
        return "-"
    s = value if isinstance(value, str) else str(value)
    s = s[: width + 1]  # never escape (or print) more than is shown
    out = "".join(_escape(ch) if _unsafe(ch) else ch for ch in s)
    return out if len(out) <= width and len(s) <= width else out[:width] + "…"


def _guard(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        from specscope.storage import NewerStoreError, TraceStoreError

        try:
            return fn(args)
        except NewerStoreError as exc:  # a writer refused before it wrote anything
            _fail(str(exc))
            return 2
        except TraceStoreError as exc:
            return _fail(str(exc))
        except OSError as exc:
            if is_broken_pipe(exc):  # the reader went away (`| head`): main() exits quietly
                raise
            return _fail(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "))

    run.__name__ = fn.__name__
    run.__doc__ = fn.__doc__
    return run


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    try:
        return _dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, ValueError, OSError, TypeError):  # a time no calendar shows: print the number
        return _safe(repr(ts), 19)


def _open(db: str | None, create: bool = False) -> TraceStore:
    """A writer (create=True: import) may create the store; a reader opens it read-only and
    creates or changes nothing (no journal mode, no recovery written, no migration)."""
    from specscope.storage import TraceStore

    store = TraceStore(db, create=create, readonly=not create, presume_interrupted=not create)
    if store.newer_schema:
        say_newer(store)
    return store


def say_newer(store: TraceStore) -> None:
    """A reader of a store of a newer schema says so, in one line on stderr."""
    print(f"specscope: note: {_safe(store.newer_schema, 1000)}", file=sys.stderr)


def _fmt(x: float | None, spec: str = ".4f") -> str:
    if x is None:
        return "-"
    try:
        return format(x, spec)
    except (TypeError, ValueError):
        return _safe(repr(x), 12)


# ---------------------------------------------------------------------------- runs


@_guard
def cmd_runs(args: argparse.Namespace) -> int:
    """specscope runs [DB]: without DB, the default store the window records to."""
    if args.db is None:
        from specscope.storage.engine import is_url, mask_passwords
        from specscope.storage.paths import default_db_location

        args.db = default_db_location()
        shown = mask_passwords(args.db)
        if not is_url(args.db) and not os.path.exists(args.db):
            print(
                f"specscope: no runs: the default store {shown} does not exist yet (the window records there)",
                file=sys.stderr if args.json else sys.stdout,
            )
            return 0
        print(f"specscope: runs in the default store {shown}", file=sys.stderr)
    with _open(args.db) as store:
        runs = store.list_runs(status=args.status, limit=args.limit)
    if args.json:
        for r in runs:
            print(
                json.dumps(
                    {
                        "run_id": r.run_id,
                        "status": r.status,
                        "stop_reason": r.stop_reason,
                        "started_at": r.started_at,
                        "ended_at": r.ended_at,
                        "proposer": r.config.proposer,
                        "target": r.models.target_name,
                        "draft": r.models.draft_name,
                        "k": r.config.k,
                        "sampling": r.config.sampling.describe(),
                        "rounds": r.n_rounds,
                        "new_tokens": r.n_new_tokens,
                        "acceptance_rate": r.acceptance_rate,
                        "mean_accepted_length": r.mean_accepted_length,
                    }
                )
            )
        return 0
    if not runs:
        print("no runs")
        return 0
    print(
        f"{'run':12} {'status':11} {'started':19} {'proposer':9} {'sampling':12} {'k':>2} {'rounds':>6} "
        f"{'tokens':>6} {'accept':>6} {'tau':>5}  target / draft"
    )
    for r in runs:
        try:
            line = _run_line(r)
        except Exception as exc:  # noqa: BLE001 - one run's odd values, whatever they raise, never hide the others
            line = f"{_safe(r.run_id, 12):12} (cannot show this run: {_safe(exc)})"
        print(line)
    return 0


def _run_line(r: Any) -> str:
    models = _safe(r.models.target_name) + (f" / {_safe(r.models.draft_name)}" if r.models.draft_name else "")
    return (
        f"{_safe(r.run_id, 12):12} {_safe(r.status, 11):11} {_when(r.started_at):19} {_safe(r.config.proposer, 9):9} "
        f"{_safe(r.config.sampling.describe(), 12):12} {r.config.k:>2} {r.n_rounds:>6} {r.n_new_tokens:>6} "
        f"{r.acceptance_rate:>6.1%} {r.mean_accepted_length:>5.2f}  {models}"
    )


# ---------------------------------------------------------------------------- show


def _top(dist: np.ndarray | None, n: int) -> str:
    if dist is None:
        return "-"
    from specscope.storage import is_partial
    from specscope.storage.codec import top_entries

    ids, probs = top_entries(dist, n)
    text = " ".join(f"{i}:{p:.3f}" for i, p in zip(ids.tolist(), probs.tolist()))
    stats = getattr(dist, "stats", None) if is_partial(dist) else None  # a top-N save's whole-vector facts
    if stats is not None:
        smallest = f", smallest {stats.minimum:.3g}" if stats.support == len(dist) else ""
        text += f"  ({stats.support} of {len(dist)} tokens > 0{smallest}, sum {stats.total:.6f})"
    return text


@_guard
def cmd_show(args: argparse.Namespace) -> int:
    """specscope show DB RUN [--round N]"""
    from specscope.storage.jsonl.transfer import header_json, iter_export

    with _open(args.db) as store:
        info = store.get_run(args.run)
        if args.round is not None:
            if args.json:
                for line in iter_export(store, info.run_id):
                    d = json.loads(line)
                    if d.get("record") == "round" and d["index"] == args.round:
                        print(json.dumps(d))
                        return 0
                return _fail(f"run {info.run_id} has no round {args.round}")
            rnd = store.load_round(info.run_id, args.round)
            _print_round(rnd, args.top, info.full_vectors)
            return 0
        if args.json:
            with store.engine.connect() as conn:
                from sqlalchemy import select

                from specscope.storage.schema import runs_table

                row = conn.execute(select(runs_table).where(runs_table.c.run_id == info.run_id)).one()._mapping
            out = header_json(row)
            out.update(
                status=info.status,
                stop_reason=info.stop_reason,
                error=info.error,
                ended_at=info.ended_at,
                rounds=info.n_rounds,
                new_tokens=store.new_tokens(info.run_id),
                acceptance_rate=info.acceptance_rate,
                mean_accepted_length=info.mean_accepted_length,
            )
            print(json.dumps(out))
            return 0
        _print_header(info)
        start = 0
        while True:  # the timeline in batches: a run of any length prints in bounded memory
            summaries = store.round_summaries(info.run_id, start, start + SHOW_BATCH)
            for s in summaries:
                _print_summary(s)
            if len(summaries) < SHOW_BATCH:
                return 0
            start += SHOW_BATCH


def _print_header(info: Any) -> None:
    c = info.config
    m = info.models
    print(
        f"run {_safe(info.run_id)}  [{_safe(info.status)}{' / ' + _safe(info.stop_reason) if info.stop_reason else ''}]"
    )
    if info.error:
        print(f"  note: {_safe(info.error, 4 * SAFE_WIDTH)}")
    print(f"  started {_when(info.started_at)}   ended {_when(info.ended_at)}   wall {_fmt(info.wall_s, '.3f')} s")
    print(f"  target  {_safe(m.target_name)}" + (f"  ({_safe(m.target_hash)})" if m.target_hash else ""))
    if m.draft_name:
        print(f"  draft   {_safe(m.draft_name)}" + (f"  ({_safe(m.draft_hash)})" if m.draft_hash else ""))
    params = _safe(dict(c.proposer_params), 2 * SAFE_WIDTH) if c.proposer_params else ""
    auto = (c.proposer_params or {}).get("k_policy") == "auto"  # each round's k chosen by cost: the k column
    print(
        f"  proposer {_safe(c.proposer)} {params}  k={'auto, at most ' if auto else ''}{c.k}  "
        f"{c.sampling.describe()}  seed={c.seed}  "
        f"eos={c.eos_token_id}  max_new_tokens={c.max_new_tokens}  {_safe(c.device)}/{_safe(c.dtype)}  "
        f"vocab={c.vocab_size}"
    )
    print(
        f"  prompt {len(c.prompt_ids)} tokens"
        + (f": {_safe(repr(info.prompt_text), 2 * SAFE_WIDTH)}" if info.prompt_text else "")
    )
    print(f"  stored top-{info.top_n}" + (f" + full vectors ({_safe(info.full_dtype)})" if info.full_vectors else ""))
    print(
        f"  {info.n_rounds} rounds, {info.n_new_tokens} new tokens, acceptance {info.acceptance_rate:.1%}, "
        f"mean accepted length {info.mean_accepted_length:.2f}"
    )
    print()
    print(
        f"{'round':>5} {'prefix':>6} {'k':>3} {'acc':>5}  {'tcache b>p>a':>14}  {'draft ms':>8} {'verify ms':>9}  "
        "emitted (! repaired, + bonus)"
    )


def _print_summary(s: Any) -> None:
    tc = s.target_cache
    toks = " ".join(f"{_KIND_MARK[e.kind]}{e.token}" for e in s.emitted)
    flags = (
        (" EOS" if s.eos else "")
        + (" BUDGET" if s.budget_stop else "")
        + (" bonus-withheld" if s.bonus_withheld else "")
    )
    print(
        f"{s.index:>5} {s.prefix_len:>6} {s.k:>3} {s.accepted:>2}/{s.drafted:<2}  "
        f"{tc.before:>4}>{tc.peak:>4}>{tc.after:>4}  "
        f"{s.timings.draft_s * 1e3:>8.2f} {s.timings.verify_s * 1e3:>9.2f}  {toks}{flags}"
    )


def _print_round(rnd: Any, top: int, full: bool) -> None:
    print(
        f"round {rnd.index} of run {_safe(rnd.run_id)}: prefix {rnd.prefix_len}, emitted before {rnd.emitted_before}, "
        f"budget left {rnd.remaining_budget}, k={rnd.k}, {'greedy' if rnd.greedy else 'sampled'}"
    )
    print(f"  distributions: {'full vectors' if full else 'top-N only (other entries unknown)'}")
    print(
        f"  {'node':>4} {'parent':>6} {'token':>6} {'status':9} {'p(x)':>8} {'q(x)':>8} {'p/q':>8} {'u':>8} "
        f"{'sum min':>8} {'argmax':>6}"
    )
    for n in rnd.nodes:
        print(
            f"  {n.index:>4} {n.parent:>6} {n.token:>6} {n.status:9} {_fmt(n.p_token)} {_fmt(n.q_token):>8} "
            f"{_fmt(n.ratio):>8} {_fmt(n.u):>8} {_fmt(n.overlap):>8} {n.target_argmax:>6}"
        )
        print(f"{'':8}p top: {_top(n.p, top)}")
        if n.q is not None:
            print(f"{'':8}q top: {_top(n.q, top)}")
    if rnd.rejected_node is not None:
        print(f"  first rejection at node {rnd.rejected_node}; residual mass {_fmt(rnd.residual_mass, '.6f')}")
        if rnd.residual is not None:
            print(f"  residual top: {_top(rnd.residual, top)}")
    if rnd.bonus_p is not None:
        print(f"  bonus p top: {_top(rnd.bonus_p, top)}")
    print(
        "  emitted: "
        + ", ".join(
            f"{e.token} "
            f"({e.kind}{'' if e.node is None else f' @{e.node}'}{'' if e.draw is None else f', draw {e.draw:.4f}'})"
            for e in rnd.emitted
        )
    )
    flags = [
        name
        for name, on in (("EOS", rnd.eos), ("budget stop", rnd.budget_stop), ("bonus withheld", rnd.bonus_withheld))
        if on
    ]
    if flags:
        print("  flags: " + ", ".join(flags))
    for name, cs in (("target", rnd.target_cache), ("draft", rnd.draft_cache)):
        if cs is not None:
            print(
                f"  {name} cache: before {cs.before}, peak {cs.peak}, after {cs.after} (cropped {cs.cropped}), "
                f"pending {list(cs.pending)}"
            )
    t = rnd.timings
    print(
        f"  timings: draft {t.draft_s * 1e3:.3f} ms, verify {t.verify_s * 1e3:.3f} ms, "
        f"bookkeeping {t.bookkeeping_s * 1e3:.3f} ms; forwards: target {rnd.target_forwards}, draft "
        f"{rnd.draft_forwards}"
    )


# ---------------------------------------------------------------------------- export / import


@_guard
def cmd_export(args: argparse.Namespace) -> int:
    """specscope export DB RUN -o FILE.jsonl"""
    from specscope.storage import export_run

    with _open(args.db) as store:
        info = store.get_run(args.run)
        run_id = info.run_id
        if args.output == "-":
            n = export_run(store, run_id, sys.stdout)
        else:
            with Progress(f"exporting run {_safe(run_id, 12)}", info.n_rounds) as progress:
                n = export_run(store, run_id, args.output, overwrite=args.force, on_round=progress.advance)
            print(f"exported run {_safe(run_id)}: {n} rounds -> {args.output}", file=sys.stderr)
    return 0


@_guard
def cmd_import(args: argparse.Namespace) -> int:
    """specscope import FILE.jsonl --db DB"""
    from specscope.storage import import_run

    with _open(args.db, create=True) as store, contextlib.ExitStack() as stack:
        source: Any = sys.stdin
        if args.file != "-":
            source = stack.enter_context(_TickingFile(args.file))
        run_id = import_run(store, source, run_id=args.run_id)
        info = store.get_run(run_id)
    print(f"imported run {_safe(run_id)}: {info.n_rounds} rounds, {info.n_new_tokens} tokens, status {info.status}")
    return 0


class _TickingFile:
    """A trace file read line by line for import, its progress (lines read) on a terminal."""

    def __init__(self, path: str):
        self.name = path
        self._fh = open(path, encoding="utf-8")  # noqa: SIM115 - held for the object's life, closed by __exit__
        self._progress = Progress(f"importing {_safe(os.path.basename(path), 40)}", unit="lines")

    def __iter__(self) -> Iterator[str]:
        for line in self._fh:
            self._progress.advance()
            yield line

    def __enter__(self) -> _TickingFile:
        return self

    def __exit__(self, *_exc: Any) -> None:
        self._progress.close()
        self._fh.close()


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry for these subcommands (the main CLI registers them itself)."""
    parser = argparse.ArgumentParser(prog="specscope")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
