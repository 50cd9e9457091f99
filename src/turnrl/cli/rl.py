"""``turnrl train ppo`` (RLFT, seed 004) and ``turnrl study greedy`` (the greedy-agents study).

Examples::

    turnrl train ppo --model runs/sft/model --env bandit --out runs/ppo \
        --env-opt context=3 iterations=10 episodes_per_iter=16 exploration_bonus=1
    turnrl train ppo ... --resume            # continue a killed run from its last checkpoint
    turnrl study greedy --out runs/greedy    # the whole study; docs/rlft.md

Settings are :class:`turnrl.train.ppo.PPOConfig` (``--config FILE.yaml`` plus ``key=value``
overrides). User errors are one line and exit code 2, as everywhere in the command line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from turnrl.cli import app, console, train_app
from turnrl.cli.options import out_dir

study_app = typer.Typer(no_args_is_help=True, help="Reproducible studies (several methods, seeds, one report).")
app.add_typer(study_app, name="study")


@train_app.command("ppo")
def train_ppo_cmd(
    model: Annotated[str, typer.Option(help="Model directory, hub id, or tiny.")],
    env: Annotated[str, typer.Option(help="Environment name (turnrl envs list).")],
    out: Annotated[Path, typer.Option(help="Output directory.", callback=out_dir)],
    overrides: Annotated[list[str] | None, typer.Argument(help="Config overrides key=value.",
                                                          show_default=False)] = None,
    env_opt: Annotated[list[str] | None, typer.Option("--env-opt", help="Env option key=value (repeatable).")] = None,
    config: Annotated[Path | None, typer.Option(help="YAML config.")] = None,
    resume: Annotated[bool, typer.Option(help="Continue the run in --out from its last checkpoint.")] = False,
) -> None:
    """RLFT: token-level PPO on rationale + action, online rollouts, KL to the start model."""
    from turnrl.config import load_config, parse_overrides
    from turnrl.train.ppo import PPOConfig, train_ppo

    cfg = load_config(PPOConfig, config, overrides)
    if env_opt:
        cfg = cfg.model_copy(update={"env_opts": {**cfg.env_opts, **parse_overrides(env_opt, what="--env-opt")}})
    result = train_ppo(model, env, out, cfg, resume=resume)
    console.print(f"PPO finished: {result.steps} updates, final loss {result.final_loss:.4f}; model in {result.model_dir}")


@study_app.command("greedy")
def study_greedy_cmd(
    out: Annotated[Path, typer.Option(help="Output directory (runs, results.json, PNGs).", callback=out_dir)] = Path("runs/greedy"),
    seeds: Annotated[int, typer.Option(help="Seeds per trained row (>= 3 for CIs).")] = 3,
    fast: Annotated[bool, typer.Option(help="A much smaller run (for tests; no claims).")] = False,
    docs: Annotated[Path | None, typer.Option(help="Also write the tables and plots into this directory.",
                                              callback=out_dir)] = None,
    part: Annotated[list[str] | None, typer.Option(help="bandit and/or tictactoe (default both).")] = None,
    jobs: Annotated[int, typer.Option(help="Worker processes for independent stages (one thread each).")] = 1,
    report_only: Annotated[bool, typer.Option(help="Train and evaluate nothing; report the rows of the study in --out whose evaluations exist.")] = False,
    design: Annotated[str, typer.Option(help="Bandit design: commit (23-24 Nov), knowing-doing, best-summary, untried-copy or narrow-gap (docs/rlft.md).")] = "commit",
) -> None:
    """The greedy-agents study: untrained, greedy-like SFT, UCB/minimax SFT, RLFT, RLFT + bonus."""
    from turnrl.errors import TurnRLError
    from turnrl.greedy_study import run_study
    from turnrl.pipelines.iterative import made_by

    parts = part or ["bandit", "tictactoe"]
    for p in parts:
        if p not in ("bandit", "tictactoe"):
            raise TurnRLError(f"--part must be bandit or tictactoe (got {p!r})")
    with made_by("study greedy"):  # recorded in OUT/settings.json: another command's folder is refused
        run_study(out, seeds=seeds, fast=fast, docs=docs, parts=parts, jobs=jobs, report_only=report_only,
                  design=design, log=lambda s: console.print(f"[dim]{s}[/dim]", highlight=False))
    console.print((out / "rlft-tables.md").read_text())


__all__ = ["study_app", "train_ppo_cmd"]
