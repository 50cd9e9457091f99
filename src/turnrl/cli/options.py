"""Option helpers shared by the command modules."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from turnrl.config import SEED_MAX
from turnrl.errors import TurnRLError, check_output


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


def refuse_model_options(ctx: typer.Context, names: tuple[str, ...], scripted: str) -> None:
    """One line for each of the options ``names`` given on the command line when the policy is scripted
    (``scripted`` says which: ``policy 'ucb' is scripted``), which would ignore them."""
    given = [f"--{name.replace('_', '-')}" for name in names
             if (source := ctx.get_parameter_source(name)) is not None and source.name == "COMMANDLINE"]
    if given:
        one = len(given) == 1
        raise TurnRLError(f"{', '.join(given)}: {'it changes' if one else 'they change'} model policies only, and "
                          f"{scripted} (it would be ignored); leave {'it' if one else 'them'} out")


def sampling_options(temperature: float, max_new_tokens: int) -> Any:
    """The :class:`~turnrl.rollout.SamplingConfig` of ``--temperature`` and ``--max-new-tokens``; a bad
    value is one line naming the flag (``--temperature inf: must be a finite number >= 0``)."""
    from pydantic import ValidationError

    from turnrl.rollout import SamplingConfig

    try:
        return SamplingConfig(temperature=temperature, max_new_tokens=max_new_tokens)
    except ValidationError as e:
        err = e.errors()[0]
        key = str(err["loc"][0]) if err.get("loc") else "temperature"
        value = temperature if key == "temperature" else max_new_tokens
        raise TurnRLError(f"--{key.replace('_', '-')} {value}: {err['msg'].removeprefix('Value error, ')}") from None


#: a ``--seed`` option: the seeds numpy and torch take (:data:`turnrl.config.SEED_RANGE`), refused in one
#: line where it is given, not with an overflow traceback once the command has started
Seed = Annotated[int, typer.Option(min=0, max=SEED_MAX, help="Random seed, 0 to 2**31 - 1.")]
