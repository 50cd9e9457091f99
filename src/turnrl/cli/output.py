"""The command line's consoles, one pair for every command.

Piped output (CI logs, ``| tee``) gets a width that fits the results tables instead of
rich's 80. Messages are soft-wrapped: rich never breaks a line itself, so a path longer than
the terminal comes out whole (the terminal folds it on screen; copying it gives the path).
Tables still lay out to the width.
"""

from __future__ import annotations

import sys

from rich.console import Console

console = Console(width=None if sys.stdout.isatty() else 140, soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)
