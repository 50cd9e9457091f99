"""CLI: ``turnrl sppo``, ``turnrl comparisons`` and ``turnrl train preference-model``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from turnrl.cli.options import Seed, out_dir, out_file
from turnrl.cli.output import console

Overrides = Annotated[list[str] | None, typer.Argument(help="Config overrides key=value.", show_default=False)]


def sppo(
    overrides: Overrides = None,
    config: Annotated[Path | None, typer.Option(help="YAML config (configs/sppo/*.yaml).")] = None,
) -> None:
    """Iterative SPPO: sample K trajectories a task, score them with a preference oracle, train, evaluate."""
    from turnrl.config import load_config
    from turnrl.pipelines.iterative import made_by
    from turnrl.pipelines.sppo import SPPOConfig, run_sppo

    cfg = load_config(SPPOConfig, config, overrides)
    with made_by("sppo"):  # recorded in OUT/settings.json: another command's folder is refused
        summary = run_sppo(cfg, console=console)
    console.print(f"SPPO finished: {summary['out']}/summary.json")


def comparisons(
    trajectories: Annotated[list[Path], typer.Option(help="Trajectories JSONL (repeatable).")],
    out: Annotated[Path, typer.Option(help="Output comparisons JSONL.", callback=out_file)],
    tau: Annotated[float | None, typer.Option(help="Env-reward oracle temperature of --soft labels (default 1).")]
    = None,
    soft: Annotated[bool, typer.Option(help="Keep the oracle's soft probability as the label.")] = False,
    pairs_per_task: Annotated[int | None, typer.Option(min=1, help="At most this many pairs a task.")] = None,
    skip_ties: Annotated[bool, typer.Option(help="Drop pairs with equal returns.")] = False,
    seed: Seed = 0,
) -> None:
    """Labelled comparisons (for `turnrl train preference-model`) between trajectories of the same task,
    labelled by the env-reward oracle."""
    from turnrl.data.io import read_trajectories
    from turnrl.errors import TurnRLError, check_not_input
    from turnrl.oracles import EnvRewardOracle, comparisons_from_trajectories, write_comparisons

    if tau is not None and not soft:  # hard labels are 1, 0 or 1/2 by the returns' order alone
        raise TurnRLError(f"--tau {tau}: the oracle temperature of --soft labels; hard labels have none (it would be "
                          "ignored): add --soft or leave --tau out")
    check_not_input(out, trajectories)
    trajs = [t for f in trajectories for t in read_trajectories(f)]
    comps = comparisons_from_trajectories(trajs, oracle=EnvRewardOracle(1.0 if tau is None else tau), hard=not soft,
                                          pairs_per_task=pairs_per_task, skip_ties=skip_ties, seed=seed)
    if not comps:  # an empty file would only fail later, in `turnrl train preference-model`
        files = ", ".join(str(f) for f in trajectories)
        raise TurnRLError(f"{files}: no comparisons: no task has two trajectories"
                          + (" with different returns" if skip_ties else ""))
    write_comparisons(out, comps)
    ties = sum(c.label == 0.5 for c in comps)
    console.print(f"wrote {len(comps)} comparisons to {out} ({ties} ties)")


def train_preference_model_cmd(
    data: Annotated[Path, typer.Option(help="Comparisons JSONL (turnrl comparisons).")],
    out: Annotated[Path, typer.Option(help="Output directory.", callback=out_dir)],
    overrides: Overrides = None,
    config: Annotated[Path | None, typer.Option(help="YAML config.")] = None,
    eval_data: Annotated[Path | None, typer.Option(help="Held-out comparisons: agreement is logged.")] = None,
    resume: Annotated[bool, typer.Option(help="Continue the run in --out from its last checkpoint.")] = False,
) -> None:
    """Train the pairwise preference model (PairRM-like) used by the pairwise_model oracle."""
    import json

    from turnrl.config import load_config
    from turnrl.train.preference_model import PreferenceModelConfig, train_preference_model

    cfg = load_config(PreferenceModelConfig, config, overrides)
    result = train_preference_model(data, out, cfg, resume=resume, eval_data=eval_data)
    msg = f"preference model: {result.steps} steps, final loss {result.final_loss:.4f}; model in {result.model_dir}"
    ev = out / "eval.json"
    if ev.is_file():
        acc = json.loads(ev.read_text())["final"]["accuracy"]
        msg += f"; held-out agreement {acc:.3f}"
    console.print(msg)


def register(app: typer.Typer, train_app: typer.Typer) -> None:
    """Add the commands to the ``turnrl`` app."""
    app.command("sppo")(sppo)
    app.command("comparisons")(comparisons)
    train_app.command("preference-model")(train_preference_model_cmd)
