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
        description="Check every round of a run from its trace alone. Each finding is wrong output or wasted work; "
        "exit status 1 when a run has wrong output (with --strict, wasted work too).",
    )
    p.add_argument("db", help="trace store: an SQLite path or an SQLAlchemy URL")
    p.add_argument("--run", default=None, help="run id (or unique prefix); default: every run in the store")
    p.add_argument("--json", action="store_true", help="print the findings (and their grouping by cause) as JSON")
    p.add_argument("--all", action="store_true", help="list every follow-on finding under its cause, not just a count")
    p.add_argument("--strict", action="store_true", help="exit 1 for wasted-work findings too (k past the budget, ...)")
    p.add_argument("--tol", type=float, default=1e-6, help="tolerance for recorded scalars (default: 1e-6)")
    p.add_argument("--recompute", action="store_true", help="also recompute p with the target model (deep replay)")
    p.add_argument(
        "--target", default=None, help="target checkpoint for --recompute (default: the run's bundled target)"
    )
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
        store = TraceStore(location, create=False, readonly=True, presume_interrupted=True)
    except TraceStoreError as exc:
        raise CliError(str(exc)) from None
    if store.newer_schema:  # read as far as this version understands it; said in one line
        from specscope.app.cli.traces import say_newer

        say_newer(store)
    return store


def cmd_check(args: argparse.Namespace) -> int:
    from specscope.core.check.checker import WASTED_WORK, WRONG_OUTPUT

    store = open_existing_store(args.db)
    run_ids = [store.resolve_run_id(args.run)] if args.run else [r.run_id for r in store.list_runs(newest_first=False)]
    target_cache: dict[str, Any] = {}
    report = []
    counts = {WRONG_OUTPUT: 0, WASTED_WORK: 0}
    for run_id in run_ids:
        n_rounds, checked = _check_one(args, store, run_id, target_cache)
        for f in checked.findings:
            counts[f.severity] += 1
        report.append(
            {
                "run_id": run_id,
                "rounds": n_rounds,
                "findings": [f.to_dict() for f in checked.findings],
                "groups": [g.to_dict() for g in checked.groups],
                "not_checked": checked.not_checked,
                "wrong_output": len(checked.of_severity(WRONG_OUTPUT)),
                "wasted_work": len(checked.of_severity(WASTED_WORK)),
            }
        )
        if not args.json:
            _print_check(run_id, n_rounds, checked, args.all)
    if args.json:
        print(
            json.dumps(
                {
                    "runs": report,
                    "findings": sum(counts.values()),
                    "wrong_output": counts[WRONG_OUTPUT],
                    "wasted_work": counts[WASTED_WORK],
                },
                indent=2,
            )
        )
    return 1 if counts[WRONG_OUTPUT] or (args.strict and counts[WASTED_WORK]) else 0


def _check_one(args: argparse.Namespace, store: Any, run_id: str, target_cache: dict[str, Any]) -> tuple[int, Any]:
    """(rounds read, CheckReport) of one run. A run the store cannot hand over whole (a row it
    cannot decode) is reported as an internal finding at the round it reached: the other runs
    of the store are still checked."""
    from specscope.core.check.checker import recompute_findings

    info = store.get_run(run_id)
    counted = [0]  # rounds are streamed from the store in batches: memory is one batch, not the run

    def rounds(what: str, count: bool) -> Any:
        with Progress(f"{what} run {run_id[:12]}", info.n_rounds, quiet=args.json) as progress:
            for rnd in store.iter_rounds(run_id, full=True):
                counted[0] += count
                progress.advance()
                yield rnd

    from specscope.storage.checking import check_stored_run

    checked = check_stored_run(store, run_id, tol=args.tol, rounds=rounds("checking", True), info=info, counted=counted)
    if args.recompute:
        target = _target_for_recompute(args, info, target_cache)
        checked.findings += recompute_findings(info.config, rounds("recomputing", False), target)
    return counted[0], checked


def _print_check(run_id: str, n_rounds: int, checked: Any, show_all: bool) -> None:
    """Wrong output first, then wasted work; within each, root causes first: each cause on its
    line, what follows from it counted (or listed with --all); then the rules the trace's
    unrecorded fields kept from running."""
    from specscope.core.check.checker import WASTED_WORK, WRONG_OUTPUT, group_findings

    head = f"run {run_id}: {n_rounds} rounds, "
    if not checked.findings:
        print(head + "no findings")
    else:
        first = min(f.round for f in checked.findings)
        print(head + f"{len(checked.findings)} finding(s), first bad round {first}")
    for severity in (WRONG_OUTPUT, WASTED_WORK):
        groups = group_findings(checked.of_severity(severity))
        if not groups:
            continue
        n = sum(1 + len(g.follow_on) for g in groups)
        print(f"  {severity}: {n} finding(s) from {len(groups)} cause(s)")
        for g in groups:
            print(f"    {g.cause}")
            if g.follow_on and show_all:
                for f in g.follow_on:
                    print(f"        follows: {f}")
            elif g.follow_on:
                lo, hi = g.rounds
                rules = ", ".join(sorted({f.rule for f in g.follow_on}))
                print(
                    f"        + {len(g.follow_on)} follow-on finding(s) ({rules}) in rounds {lo}-{hi}; --all lists them"
                )
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
        what = (
            f"a vocabulary of {ours} tokens"
            if ours != theirs
            else f"the same size of vocabulary ({ours}) but another tokenizer ({our_tok[:12]})"
        )
        raise CliError(
            f"--recompute: {key} has {what}, but run {config.run_id} was recorded with {config.target_name}'s "
            f"vocabulary of {theirs} tokens"
            + ("" if ours != theirs else f" (tokenizer {run_tok[:12]})")
            + "; recompute with the run's own target or one of its vocabulary"
        )
    return pair.target


def cmd_diff(args: argparse.Namespace) -> int:
    from specscope.core.check.diff import diff_runs

    store = open_existing_store(args.db)
    ids = [store.resolve_run_id(r) for r in (args.run_a, args.run_b)]
    loaded = [(store.run_config(i), store.load_rounds(i, full=True)) for i in ids]
    result = diff_runs(loaded[0][0], loaded[0][1], loaded[1][0], loaded[1][1], p_tol=args.p_tol)
    if args.json:
        print(
            json.dumps(
                {
                    "run_a": result.run_a,
                    "run_b": result.run_b,
                    "identical": result.identical,
                    "compared_tokens": result.compared_tokens,
                    "compared_cache_rounds": result.compared_cache_rounds,
                    "divergences": [d.__dict__ for d in result.divergences],
                },
                indent=2,
            )
        )
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
