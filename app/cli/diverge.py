"""`specscope diverge`: did greedy speculative output differ from plain greedy decoding, and
was it a near tie (numerics) or a logic bug? The analysis is core.check.diverge's."""

from __future__ import annotations

import argparse
import json
from typing import Any

from specscope.app.cli.options import CliError, threads_arg
from specscope.core.settings.vocab import CHILDREN_MENU, DEVICES, DTYPES, ENGINES

# `specscope run` flags that diverge does not take, at the values that make a greedy run
RUN_DEFAULTS = dict(
    chat=False,
    system=None,
    lookup_max_ngram=None,
    lookup_min_ngram=None,
    temperature=0.0,
    top_k=0,
    top_p=1.0,
    seed=0,
    coupled=None,
    no_cache=False,
    vectors="auto",
    top_n=20,
)


# the flags that set up a live run: meaningless with --db (a stored run brings its own)
LIVE_ONLY = (
    "--prompt",
    "--prompt-file",
    "--prompt-ids",
    "--example",
    "--examples",
    "--proposer",
    "--draft",
    "--tree",
    "--children",
    "--fault",
)


def add_diverge_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "diverge",
        help="compare greedy speculative output with plain greedy decoding: near tie or logic bug?",
        description=(
            "Decode greedily with speculation and plainly with the same target (or recompute the plain reference "
            "for a stored run: --db and --run), find the first output position where the two differ, and say "
            "whether it is a near tie (the target's top-2 margin there is within what the measured difference "
            "between the verify forward's and the one-token forward's logits can flip) or a logic bug (pointing "
            "at the round and at what the checker says). Exit status 1 when a logic bug is found."
        ),
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="prompt text (tokenised with the target's tokenizer)")
    src.add_argument("--prompt-file", help="read the prompt text from this file")
    src.add_argument("--prompt-ids", help="comma-separated token ids instead of text")
    src.add_argument("--example", metavar="NAME", help="a bundled example prompt by name (resources/prompts)")
    src.add_argument("--examples", action="store_true", help="every bundled example prompt, one comparison each")
    p.add_argument(
        "--db", default=None, help="a trace store holding the run to recompute the reference for (with --run)"
    )
    p.add_argument("--run", default=None, metavar="ID", help="with --db: the stored run (an id or a unique prefix)")
    p.add_argument("--proposer", default=None, metavar="SPEC", help="as `specscope run` (default: draft)")
    p.add_argument("--draft", default=None, help="draft: 'small', 'tiny' (bundled) or a checkpoint directory")
    p.add_argument("--tree", default=None, metavar="SPEC", help="draft a token tree (as `specscope run --tree`)")
    p.add_argument("--children", default=None, choices=CHILDREN_MENU, help="a tree's sibling rule")
    p.add_argument("--k", type=int, default=4, help="draft length per round (default: 4)")
    p.add_argument(
        "--engine", choices=ENGINES, default="specscope", help="who decodes the speculative side (default: specscope)"
    )
    p.add_argument("--max-new", type=int, default=64, help="token budget (default: 64)")
    p.add_argument("--eos-id", default="auto", help="EOS token id, 'auto' = the tokenizer's, 'none' = no EOS")
    p.add_argument(
        "--target", default=None, help="target checkpoint (default: the bundled target; for --db, the run's)"
    )
    p.add_argument("--device", default="auto", choices=DEVICES, help="default: auto")
    p.add_argument(
        "--dtype",
        default=None,
        choices=DTYPES,
        help="model dtype (default: float32 on CPU; for --db, the run's recorded dtype)",
    )
    p.add_argument("--fault", default=None, metavar="NAME", help="inject a deliberate bug (see `specscope faults`)")
    p.add_argument("--threads", type=threads_arg, default=None, metavar="N", help="torch CPU threads")
    p.add_argument("--json", action="store_true", help="print the comparisons as JSON")
    p.set_defaults(func=cmd_diverge, **RUN_DEFAULTS)


def cmd_diverge(args: argparse.Namespace) -> int:
    from specscope.app.threads import apply_threads

    apply_threads(args.threads)
    if args.run is not None and args.db is None:
        raise CliError("--run names a stored run: pass its trace store with --db")
    if args.db is not None:
        found = [_stored(args)]
    else:
        found = _live(args)
    if args.json:
        print(
            json.dumps(
                {"comparisons": [{"prompt": name, **d.to_dict()} for name, d, _ in found], **_tally(found)}, indent=2
            )
        )
    else:
        for name, d, tokenizer in found:
            _print(name, d, tokenizer)
        if len(found) > 1:
            t = _tally(found)
            print(
                f"{t['compared']} prompts: {t['differ']} differ from plain greedy ({t['near_ties']} near ties, "
                f"{t['logic_bugs']} logic bugs)"
            )
    return 1 if any(d.verdict == "logic bug" for _, d, _ in found) else 0


def _tally(found: list) -> dict[str, int]:
    verdicts = [d.verdict for _, d, _ in found]
    return {
        "compared": len(verdicts),
        "differ": sum(v != "identical" for v in verdicts),
        "near_ties": verdicts.count("near tie"),
        "logic_bugs": verdicts.count("logic bug"),
    }


def _stored(args: argparse.Namespace) -> tuple[str, Any, Any]:
    """The reference recomputed for a stored run with its recorded prompt, budget, EOS and target."""
    from specscope.app.cli.check import open_existing_store
    from specscope.core.check.diverge import diverge_report, require_greedy
    from specscope.core.decode.stops import token_piece_function

    if args.run is None:
        raise CliError("--db needs --run ID: the stored run to compare with plain greedy decoding")
    live = [flag for flag in LIVE_ONLY if getattr(args, flag.removeprefix("--").replace("-", "_")) not in (None, False)]
    if live:
        raise CliError(f"{live[0]} sets up a new run; a stored run (--db, --run) is compared with its own settings")
    store = open_existing_store(args.db)
    try:
        try:
            info = store.get_run(args.run)
        except Exception as exc:  # noqa: BLE001 - the store's own message says which (unknown, ambiguous)
            raise CliError(f"{args.db}: {exc}") from None
        require_greedy(info.config)  # before any model loads
        rounds = store.load_rounds(info.run_id, full=True)
        end = info.end
    finally:
        store.close()
    pair = _stored_target(args, info.config)
    piece = token_piece_function(pair.tokenizer) if pair.tokenizer is not None else None  # the run's stop strings
    return "stored", diverge_report(info.config, rounds, pair.target, end=end, token_piece=piece), pair.tokenizer


def _stored_target(args: argparse.Namespace, config: Any) -> Any:
    """The run's target (or --target) at the run's dtype (or --dtype); refused when its
    vocabulary is not the run's."""
    from specscope.core.decode.kv import model_vocab_size
    from specscope.core.loading import models as loading

    name = args.target or config.target_name
    pair = loading.load_models(
        target=name, draft=None, device=loading.resolve_device(args.device), dtype=args.dtype or config.dtype
    )
    if model_vocab_size(pair.target) != int(config.vocab_size):
        raise CliError(
            f"{name} has a vocabulary of {model_vocab_size(pair.target)} tokens, but run {config.run_id} "
            f"was recorded with {config.vocab_size}: pass the run's own target with --target"
        )
    from specscope.core.decode.decoder import check_run_positions

    try:  # the reference decodes the run's whole budget: a --target with a smaller limit cannot
        check_run_positions(len(config.prompt_ids), config.max_new_tokens, [(name, pair.target)])
    except ValueError as exc:
        raise CliError(f"run {config.run_id}: {exc}") from None
    return pair


def _live(args: argparse.Namespace) -> list[tuple[str, Any, Any]]:
    """Decode each asked-for prompt with speculation, then plainly, and compare."""
    from specscope.app.cli.run import FLAG_NAMES, _load, _prompt_ids, run_settings, run_spec
    from specscope.core.check.diverge import diverge_run
    from specscope.core.decode.factory import SettingsError, build_decoder, run_config

    spec = run_spec(args)
    settings = run_settings(args, spec)
    try:
        settings.check(FLAG_NAMES)
        pair = _load(args, spec)
        decoder = build_decoder(settings, pair, FLAG_NAMES)
        found = []
        for name, prompt in _prompts(args, pair.tokenizer, lambda a, t: _prompt_ids(a, t, settings)):
            config = run_config(decoder, settings, pair, prompt, names=FLAG_NAMES)
            found.append((name, diverge_run(decoder, pair.target, prompt, args.max_new, config), pair.tokenizer))
        return found
    except SettingsError as exc:
        raise CliError(str(exc)) from None


def _prompts(args: argparse.Namespace, tokenizer: Any, prompt_ids: Any) -> list[tuple[str, list[int]]]:
    """(name, token ids) of each prompt: the bundled examples, one by name, or run's prompt flags."""
    if not (args.examples or args.example):
        return [("prompt", prompt_ids(args, tokenizer))]
    from specscope.core.loading.models import example_prompts

    if tokenizer is None:
        raise CliError("this target has no tokenizer: the example prompts are text; pass --prompt-ids")
    examples = example_prompts()
    if args.example:
        examples = [e for e in examples if e.name == args.example]
        if not examples:
            known = ", ".join(e.name for e in example_prompts())
            raise CliError(f"--example: no bundled prompt named {args.example!r}; known: {known}")
    return [(e.name, list(tokenizer(e.text, add_special_tokens=False)["input_ids"])) for e in examples]


def _print(name: str, d: Any, tokenizer: Any) -> None:
    from specscope.core.loading.text import token_label

    first, *rest = d.lines(lambda token: token_label(tokenizer, token))
    print(f"{name}: run {d.run_id[:12]}: {first}")
    for line in rest:
        print(line)
