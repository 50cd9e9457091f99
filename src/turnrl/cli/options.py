"""Option helpers shared by the command modules."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from turnrl.config import SEED_MAX
from turnrl.errors import check_output


def _output_check(directory: bool) -> Any:
    """A typer callback: the option's path can be written as a file (or a folder), checked
    before the command does any work (:func:`turnrl.errors.check_output`)."""

    def callback(param: typer.CallbackParam, value: Path | None) -> Path | None:
        if value is not None:
            check_output(value, (param.opts or [param.name or "path"])[0], directory=directory)
        return value

    return callback


#: ``callback=`` of an option naming a file / a folder the command writes
out_file, out_dir = _output_check(False), _output_check(True)


#: a ``--seed`` option: the seeds numpy and torch take (:data:`turnrl.config.SEED_RANGE`), refused in one
#: line where it is given, not with an overflow traceback once the command has started
Seed = Annotated[int, typer.Option(min=0, max=SEED_MAX, help="Random seed, 0 to 2**31 - 1.")]
