"""User-facing errors.

Anything a user can cause (a bad file, an unknown key, a missing model) raises
:class:`TurnRLError` with a one-line message that names the file, line, key or value.
The command line prints that line and exits non-zero; it never dumps a traceback for it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class TurnRLError(Exception):
    """An error caused by user input; its message is one line that says what and where."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split("\n")))


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """Return ``" (did you mean 'x'?)"`` for the closest choice, or ``""`` if none is close."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}'?)" if close else ""


def unknown(kind: str, name: str, choices: Iterable[str]) -> TurnRLError:
    """``unknown env 'tictacto' (did you mean 'tictactoe'?); choose from: a, b``."""
    choices = sorted(choices)
    return TurnRLError(f"unknown {kind} '{name}'{did_you_mean(name, choices)}; choose from: {', '.join(choices)}")
