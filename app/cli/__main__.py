"""`python -m specscope.app.cli`: the `specscope` command."""

import sys

from specscope.app.cli.entry import main

sys.exit(main())
