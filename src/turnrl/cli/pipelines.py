"""CLI: ``turnrl eto``, ``turnrl dmpo`` (the iterative pipeline) and ``turnrl compare``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from turnrl.cli.output import console
from turnrl.errors import TurnRLError

Overrides = Annotated[list[str] | None, typer.Argument(help="Config overrides key=value.", show_default=False)]
ConfigOpt = Annotated[Path | None, typer.Option(help="YAML config.")]


def _run(loss: str | None, config: Path | None, overrides: list[str] | None) -> None:
    from turnrl.config import load_config
    from turnrl.evaluation import results_table
    from turnrl.pipelines.eto import EtoConfig, run_pipeline
    from turnrl.pipelines.iterative import made_by

    base = {"loss": loss} if loss else None
    cfg = load_config(EtoConfig, config, overrides, base=base)
    if loss is not None and cfg.loss != loss:  # turnrl dmpo runs DMPO: not DPO because a config says so
        raise TurnRLError(f"loss={cfg.loss}: 'turnrl {loss}' trains with loss={loss}; use 'turnrl eto' for "
                          f"loss={cfg.loss}")
    if not (Path(cfg.out) / "settings.json").is_file():  # a folder made before the check resumes as it was made
        cfg.check_start_settings()
    with made_by(loss or "eto"):  # recorded in OUT/settings.json: another command's folder is refused
        summary = run_pipeline(cfg, log=lambda m: console.print(f"[dim]{m}[/dim]"))
    results = list(summary["start"]["results"])
    for it in summary["iterations"]:
        results += it["results"]
    console.print(results_table(results, title=f"{cfg.loss} pipeline: {cfg.env}"))
    console.print(f"summary: {summary['out']}/summary.json")


def eto(overrides: Overrides = None, config: ConfigOpt = None) -> None:
    """ETO: SFT -> explore -> pair with the expert -> trajectory DPO -> evaluate, iterated."""
    _run(None, config, overrides)


def dmpo(overrides: Overrides = None, config: ConfigOpt = None) -> None:
    """The ETO pipeline with DMPO's loss (loss=dmpo; train.gamma sets the discount)."""
    _run("dmpo", config, overrides)


def compare(overrides: Overrides = None, config: ConfigOpt = None) -> None:
    """Base, SFT, Best-of-N, RFT, ETO (DPO) and DMPO over several seeds: compare.json, compare.md, plots."""
    from turnrl.config import load_config
    from turnrl.pipelines.compare import CompareConfig, run_compare
    from turnrl.pipelines.iterative import made_by

    cfg = load_config(CompareConfig, config, overrides)
    with made_by("compare"):
        summary = run_compare(cfg, log=lambda m: console.print(f"[dim]{m}[/dim]"))
    console.print(summary["table"])
    console.print(f"wrote {summary['out']}/compare.json, compare.md and plots")


def register(app: typer.Typer) -> None:
    app.command("eto")(eto)
    app.command("dmpo")(dmpo)
    app.command("compare")(compare)
