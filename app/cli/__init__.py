"""The `specscope` command line.

    specscope                      open the inspector with the bundled models
    specscope open TRACE.sqlite    replay a saved trace in the inspector
    specscope run [...]            decode headless, print text with round markers or JSON
    specscope runs|show|export|import ...   the trace store (see app/cli/traces.py)

Qt is imported only by the commands that open a window.

One module per command group: run (and its signals), check/diff/faults, the trace store's
commands (traces), shared options; main builds the parser.
"""

from specscope.app.cli.entry import build_parser, main

__all__ = ["build_parser", "main"]
