"""Progress bars for long work (rich), on stderr; silent when stderr is not a terminal unless forced.

The bar is drawn on stderr, the stream whose terminal decides whether it shows: stdout stays the
command's output (tables, JSON), whole when it is piped or redirected."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def _enabled() -> bool:
    flag = os.environ.get("TURNRL_PROGRESS")
    if flag is not None:
        return flag not in ("0", "false", "no")
    return sys.stderr.isatty()


@contextmanager
def progress_bar(description: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """Yields ``advance(n)``; shows a bar on a terminal (or with ``TURNRL_PROGRESS=1``)."""
    if not _enabled():

        def noop(n: int = 1) -> None:
            return None

        yield noop
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn())
    # stderr, not rich's default stdout console; stdout written meanwhile is left where it goes
    with Progress(*columns, console=Console(stderr=True), redirect_stdout=False, transient=False) as bar:
        task = bar.add_task(description, total=total)

        def advance(n: int = 1) -> None:
            bar.advance(task, n)

        yield advance
