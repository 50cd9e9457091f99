"""User-facing errors.

Anything a user can cause (a bad file, an unknown key, a missing model) raises
:class:`TurnRLError` with a one-line message that names the file, line, key or value.
The command line prints that line and exits non-zero; it never dumps a traceback for it.
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path


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


def check_output(path: str | Path, what: str, *, directory: bool = False) -> None:
    """Fail before any work when ``path`` cannot be written as ``what``: a file (``directory``
    False) where a folder exists, a folder where a file exists, or a path under a file."""
    p = Path(path)
    if directory and p.exists() and not p.is_dir():
        raise TurnRLError(f"{what} {p}: is a file, not a folder")
    if not directory and p.is_dir():
        raise TurnRLError(f"{what} {p}: is a folder, not a file")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise TurnRLError(f"{what} {p}: {parent} is a file, not a folder")
            break


def check_not_input(out: str | Path, inputs: Iterable[str | Path], why: str = "it would be replaced") -> None:
    """Fail before any work when the output file ``out`` is one of the ``inputs`` (after symbolic
    links, and a hard link to an input: the same file under another name)."""
    for f in inputs:
        if _same_file(f, out):
            raise TurnRLError(f"--out {out}: is the input file {f} ({why}); choose another --out")


def _same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one existing file (symbolic links followed, hard links included)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # either is missing (an output not written yet) or unreadable
        return False


def run_script(main: Callable[[list[str]], object], usage: str, argv: list[str] | None = None) -> None:
    """Run a script's ``main(args)`` (the ``docs/`` and ``scripts/`` helpers): a :class:`TurnRLError`
    is one line naming the script, a bad argument (``ValueError``) the same with ``usage``; both exit 1."""
    name = Path(sys.argv[0]).name
    try:
        main(sys.argv[1:] if argv is None else argv)
    except TurnRLError as e:
        sys.exit(f"{name}: {e}")
    except ValueError as e:
        sys.exit(f"{name}: {e} (usage: {usage})")
