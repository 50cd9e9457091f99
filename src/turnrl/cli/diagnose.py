"""``turnrl diagnose bandit``: regret, coverage, frequency bias and knowing-doing (seed 004).

Example::

    turnrl diagnose bandit --policy ucb --policy thompson --policy random --out runs/diag
    turnrl diagnose bandit --policy runs/sft/model --out runs/diag-sft --env-opt arms=5 \
        --aid try-all --instances 16

Writes ``diagnostics.json`` and ``regret.png``, ``coverage.png``, ``frequency_bias.png``,
``knowing_doing.png`` to ``--out`` and prints a summary table. User errors are one line
and exit code 2, as everywhere in the command line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from turnrl.cli.options import Seed, out_dir, refuse_model_options, sampling_options
from turnrl.cli.output import console

diagnose_app = typer.Typer(no_args_is_help=True, help="Decision-making diagnostics (regret, coverage, "
                                                      "frequency bias, knowing-doing gap).")


@diagnose_app.command("bandit")
def diagnose_bandit(
    ctx: typer.Context,
    policy: Annotated[list[str], typer.Option(
        "--policy", help="Scripted algorithm (ucb, ucb:c=2, thompson, epsilon-greedy:eps=0.1, greedy, random, "
                         "linucb) or a model directory / hub id / tiny. Repeatable.")],
    out: Annotated[Path, typer.Option(help="Output directory (diagnostics.json and PNGs).", callback=out_dir)],
    env: Annotated[str, typer.Option(help="bandit or contextual_bandit.")] = "bandit",
    env_opt: Annotated[list[str] | None, typer.Option("--env-opt", help="Env option key=value (repeatable).")] = None,
    instances: Annotated[int, typer.Option(help="Bandit instances (the first tasks of --split).")] = 64,
    runs: Annotated[int | None, typer.Option(help="Episodes per instance (default: 8 scripted, 1 model).")] = None,
    split: str = "seen",
    seed: Seed = 0,
    num_envs: Annotated[int, typer.Option(min=1, help="Environments stepped in lock-step (models).")] = 32,
    temperature: Annotated[float, typer.Option(min=0.0, help="Model sampling temperature; 0 = greedy.")] = 0.0,
    max_new_tokens: Annotated[int, typer.Option(min=1)] = 192,
    aid: Annotated[list[str] | None, typer.Option(
        "--aid", help="Exploration aid for model policies: epsilon-greedy[:eps=0.1], try-all, "
                      "self-consistency[:k=5], self-correction, summary, randomize. Repeatable; "
                      "scripted policies play without them.")] = None,
    fb_prefixes: Annotated[int, typer.Option(help="Frequency bias: random prefixes.")] = 16,
    fb_max_repeats: Annotated[int, typer.Option(help="Frequency bias: most repetitions of the last action.")] = 100,
    fb_step: Annotated[int, typer.Option(help="Frequency bias: repetition step.")] = 5,
    fb_template: Annotated[str, typer.Option(help="Frequency bias: scored continuation.")] = "ACTION={action}",
    fb_rationale: Annotated[bool, typer.Option(
        help="Frequency bias: score the action after the model's own greedy rationale.")] = False,
    skip: Annotated[list[str] | None, typer.Option(help="Skip frequency-bias or knowing-doing.")] = None,
    device: Annotated[str | None, typer.Option(help="Model device (cpu, cuda; default: cuda when a GPU is visible).")] = None,
) -> None:
    """Diagnose policies on bandits; write diagnostics.json and PNG plots."""
    from turnrl.config import parse_overrides
    from turnrl.diagnostics.bandit import DiagnoseConfig, diagnose

    models = _check_policies(policy)
    _check_model_options(ctx, models, temperature, max_new_tokens, device)
    cfg = DiagnoseConfig(
        env=env, env_opts=parse_overrides(env_opt, what="--env-opt"), instances=instances, split=split, seed=seed,
        runs=runs, num_envs=num_envs, temperature=temperature, max_new_tokens=max_new_tokens, aids=list(aid or []),
        fb_prefixes=fb_prefixes, fb_max_repeats=fb_max_repeats, fb_step=fb_step, fb_template=fb_template,
        fb_rationale=fb_rationale,
        skip=list(skip or []), device=device,
    )
    result = diagnose(policy, out, cfg, log=lambda s: console.print(f"[dim]{s}[/dim]", highlight=False))
    console.print(summary_table(result))
    console.print(f"wrote {out / 'diagnostics.json'} and {', '.join(result['plots'])}")


def _check_policies(specs: list[str]) -> list[str]:
    """Every ``--policy`` before any work (a typo in the second would otherwise surface after the
    first had run): a scripted spec is built, a model name checked for typos of the built-in
    names (``thompsn``) and, when it is a local path, for a model folder. Returns the model specs."""
    from turnrl.bandits.algorithms import is_algorithm_spec, make_algorithm
    from turnrl.models.loading import TINY, check_model_name
    from turnrl.rollout.policies import _check_not_a_typo

    models = []
    for spec in specs:
        if is_algorithm_spec(spec):
            make_algorithm(spec)
            continue
        if spec != TINY:
            _check_not_a_typo(spec)
            check_model_name(spec, "--policy")
        models.append(spec)
    return models


#: the options only a model policy reads
MODEL_OPTIONS = ("temperature", "max_new_tokens", "device", "fb_rationale")


def _check_model_options(ctx: typer.Context, models: list[str], temperature: float, max_new_tokens: int,
                         device: str | None = None) -> None:
    """Before any work: the sampling settings' values and the device (else checked when the first model
    loads, after the scripted policies before it had run), and a model-only option given with no model
    policy (ignored)."""
    sampling_options(temperature, max_new_tokens)
    if not models:
        refuse_model_options(ctx, MODEL_OPTIONS, "every --policy is scripted")
    elif device is not None:
        from turnrl.devices import check_device

        check_device(device)


def summary_table(result: dict[str, Any]) -> Any:
    """A rich table: final regret with its CI, final coverage, knowing-doing (% of steps whose
    rationale is correct; % optimal / greedy / other actions) and the action entropy at 0 and
    at the most repetitions of the frequency-bias sweep."""
    from rich.table import Table

    table = Table(title=f"{result['env']}: {result['instances']} instances, horizon {result['horizon']}")
    for col in ("policy", "regret [95% CI]", "cov", "knows", "opt", "greedy", "other", "entropy"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for r in result["policies"]:
        lo, hi = r["regret"]["final_ci95"]
        kd = r.get("knowing_doing")
        fb = r.get("frequency_bias")
        acts = kd["actions_pct"] if kd else {}
        table.add_row(
            r["policy"], f"{r['regret']['final']:.1f} " + (f"[{lo:.1f}, {hi:.1f}]" if result["instances"] > 1 else
                                                            "(one instance: no CI)"), f"{r['coverage']['final']:.2f}",
            f"{kd['rationale_correct_pct']:.0f}%" if kd else "-",
            *(f"{acts[a]:.0f}%" if kd else "-" for a in ("optimal", "greedy", "other")),
            f"{fb['entropy'][0]:.2f}→{fb['entropy'][-1]:.2f}" if fb else "-",
        )
    return table


__all__ = ["diagnose_app", "summary_table"]
