"""``turnrl train archer|chai|filtered-bc``: the online actor-critic (seed 003) and its baselines.

Example::

    turnrl train archer --model runs/sft/model --env tictactoe --out runs/archer \
        iterations=30 critic_steps=10 actor.lr=1e-4 prompt.history=0 env_opts.opponent=random
    turnrl train archer ... --resume          # continue a killed run from its last checkpoint
    turnrl train chai ...                     # best of chai_k samples by the target critic
    turnrl train filtered-bc ...              # SFT on the top bc_top episodes by return

Settings are :class:`turnrl.train.archer.OnlineConfig` (``--config FILE.yaml`` plus
``key=value`` overrides, nested with dots: ``critic.encoder=roberta-base``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from turnrl.cli import console, train_app
from turnrl.cli.options import out_dir

_DOCS = {
    "archer": "ArCHer: utterance-level double critic + token-level policy gradient (online, replay).",
    "chai": "CHAI baseline: frozen actor, act with the best of k samples by the target critic.",
    "filtered_bc": "Online filtered BC baseline: SFT on the top episodes by return, every iteration.",
}


def _register(algo: str) -> None:
    def command(
        model: Annotated[str, typer.Option(help="Model directory, hub id, or tiny.")],
        env: Annotated[str, typer.Option(help="Environment name (turnrl envs list).")],
        out: Annotated[Path, typer.Option(help="Output directory.", callback=out_dir)],
        overrides: Annotated[list[str] | None, typer.Argument(help="Config overrides key=value.",
                                                              show_default=False)] = None,
        config: Annotated[Path | None, typer.Option(help="YAML config.")] = None,
        resume: Annotated[bool, typer.Option(help="Continue the run in --out from its last checkpoint.")] = False,
    ) -> None:
        from turnrl.config import load_config
        from turnrl.train.archer import OnlineConfig, train_online

        cfg = load_config(OnlineConfig, config, overrides)
        summary = train_online(algo, model, env, out, cfg, resume=resume)  # type: ignore[arg-type]
        evals = summary.get("eval") or []
        last = f", eval return {evals[-1]['return']:.3f}" if evals else ""
        console.print(f"{algo} finished: {summary['iterations']} iterations, {summary['env_steps']} env steps"
                      f"{last}; model in {summary['model_dir']}")

    command.__doc__ = _DOCS[algo]
    train_app.command(algo.replace("_", "-"))(command)


for _algo in ("archer", "chai", "filtered_bc"):
    _register(_algo)
