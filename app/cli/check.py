"""`specscope check`, `diff` and `faults`: the checker, run diffs and the fault zoo from the command line."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from specscope.app.cli.options import CliError, Progress


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
    """A trace store a read-only command reads, opened read-only: a missing path or an empty
    file is refused (CliError, exit 2), and nothing is created or changed (a store on a
    read-only mount, or only readable by this user, reads as any other)."""
    from specscope.storage import TraceStore, TraceStoreError

    try:
        return TraceStore(location, create=False, readonly=True, presume_interrupted=True)
    except TraceStoreError as exc:
        raise CliError(str(exc)) from None


def cmd_check(args: argparse.Namespace) -> int:
    from specscope.core.check.checker import check_report, recompute_findings

    store = open_existing_store(args.db)
    run_ids = [store.resolve_run_id(args.run)] if args.run else [r.run_id for r in store.list_runs(newest_first=False)]
    target_cache: dict[str, Any] = {}
    report = []
    total = 0
    for run_id in run_ids:
        info = store.get_run(run_id)
        counted = [0]  # rounds are streamed from the store in batches: memory is one batch, not the run

        def rounds(what: str, count: bool) -> Any:
            with Progress(f"{what} run {run_id[:12]}", info.n_rounds, quiet=args.json) as progress:
                for rnd in store.iter_rounds(run_id, full=True):
                    counted[0] += count
                    progress.advance()
                    yield rnd

        checked = check_report(info.config, rounds("checking", True), tol=args.tol, end=info.end)
        n_rounds = counted[0]
        if args.recompute:
            target = _target_for_recompute(args, info, target_cache)
            checked.findings += recompute_findings(info.config, rounds("recomputing", False), target)
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


def _target_for_recompute(args: argparse.Namespace, info: Any, cache: dict[str, Any]) -> Any:
    """The target --recompute runs, loaded once per checkpoint; refused (CliError) when its
    vocabulary is not the run's: its token ids would mean other tokens, or none."""
    from specscope.core.decode.kv import model_vocab_size
    from specscope.core.loading import models as loading

    config = info.config
    key = args.target or config.target_name
    if key not in cache:
        cache[key] = loading.load_models(target=key, draft=None, device=loading.resolve_device(args.device), dtype=None)
    pair = cache[key]
    ours, theirs = model_vocab_size(pair.target), int(config.vocab_size)
    run_tok, our_tok = info.models.tokenizer_hash, pair.hashes.get("tokenizer")
    if ours != theirs or (args.target and run_tok and our_tok and run_tok != our_tok):
        what = (f"a vocabulary of {ours} tokens" if ours != theirs
                else f"the same size of vocabulary ({ours}) but another tokenizer ({our_tok[:12]})")
        raise CliError(f"--recompute: {key} has {what}, but run {config.run_id} was recorded with {config.target_name}'s "
                       f"vocabulary of {theirs} tokens" + ("" if ours != theirs else f" (tokenizer {run_tok[:12]})")
                       + "; recompute with the run's own target or one of its vocabulary")
    return pair.target


def cmd_diff(args: argparse.Namespace) -> int:
    from specscope.core.check.diff import diff_runs

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
    from specscope.core.faults.zoo import FAULTS

    width = max(len(n) for n in FAULTS)
    for f in FAULTS.values():
        print(f"{f.name:<{width}}  {f.summary}\n{'':<{width}}  fires when: {f.applies}")
    return 0


def check_trace_file(path: str) -> None:
    """`specscope open PATH` before the window opens: PATH must be a trace store file, or a
    database URL that opens as one (CliError otherwise; nothing is created or changed)."""
    from specscope.storage.engine import is_url

    if not is_url(path) and not os.path.isfile(path):
        raise CliError(f"no trace store at {path}" + (" (a directory)" if os.path.isdir(path) else ""))
    open_existing_store(path).close()
