"""The ``turnrl`` command line (typer).

Every command turns user mistakes into one line on stderr and exit code 2
(:class:`~turnrl.errors.TurnRLError`); tracebacks are for bugs only.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel, ValidationError

from turnrl.cli.diagnose import diagnose_app
from turnrl.cli.options import Seed, out_dir, out_file, refuse_model_options, sampling_options
from turnrl.cli.output import console, err_console
from turnrl.cli.pipelines import register as register_pipelines
from turnrl.cli.sppo import register as register_sppo
from turnrl.errors import TurnRLError, check_not_input

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Train LLM agents on multi-turn tasks with preference optimization and RL.")
envs_app = typer.Typer(no_args_is_help=True, help="List and check environments.")
data_app = typer.Typer(no_args_is_help=True, help="Validate and import data files.")
model_app = typer.Typer(no_args_is_help=True, help="The embedded tiny model.")
train_app = typer.Typer(no_args_is_help=True, help="Train a model (sft, dpo, ipo, dmpo, sppo, ...).")
app.add_typer(envs_app, name="envs")
app.add_typer(data_app, name="data")
app.add_typer(model_app, name="model")
app.add_typer(train_app, name="train")
app.add_typer(diagnose_app, name="diagnose")
register_sppo(app, train_app)
register_pipelines(app)

Episodes = Annotated[int, typer.Option(min=1, help="Episodes to play.")]
NumEnvs = Annotated[int, typer.Option(min=1, help="Environments stepped in lock-step.")]
MaxNewTokens = Annotated[int, typer.Option(min=1, help="Tokens a reply may have.")]
History = Annotated[int | None, typer.Option(min=0, help="Earlier exchanges kept in the prompt (default: all).")]
EnvOpt = Annotated[list[str] | None, typer.Option("--env-opt", help="Env option key=value (repeatable).")]
Overrides = Annotated[list[str] | None, typer.Argument(help="Config overrides key=value.", show_default=False)]
Instruction = Annotated[str | None, typer.Option(
    help="Replaces the env's instruction (a pipeline's agent acts on its config's `instruction`).")]
InvalidAction = Annotated[str, typer.Option(
    help="A reply without a valid action: random (a random valid action is played), error (an error "
         "observation) or end (the episode ends).")]
InvalidPenalty = Annotated[float, typer.Option(help="Added to the reward of a turn without a valid action.")]


def _prompt(instruction: str | None, invalid_action: str, invalid_penalty: float, history: int | None) -> Any:
    """The prompt and invalid-action rules of ``turnrl collect`` / ``eval``: a pipeline's agent is
    played with its pipeline's (``instruction``, ``invalid_action``, ``invalid_penalty``)."""
    import math

    from turnrl.agent.prompting import PromptConfig
    from turnrl.errors import unknown

    if invalid_action not in ("random", "error", "end"):
        raise unknown("--invalid-action", invalid_action, ("random", "error", "end"))
    if not math.isfinite(invalid_penalty):
        raise TurnRLError(f"--invalid-penalty must be a finite number (got {invalid_penalty})")
    return PromptConfig.model_validate({"instruction": instruction, "history": history,
                                        "invalid_action": invalid_action, "invalid_penalty": invalid_penalty})


def _env_opts(items: list[str] | None) -> dict[str, Any]:
    from turnrl.config import parse_overrides

    return parse_overrides(items, what="--env-opt")


# ------------------------------------------------------------------------------ envs
@envs_app.command("list")
def envs_list() -> None:
    """List registered environments."""
    from rich.table import Table

    from turnrl import envs

    table = Table(title="Environments")
    table.add_column("name")
    table.add_column("options")
    for name in envs.names():
        table.add_row(name, ", ".join(envs.env_options(name) or ["(any)"]))
    console.print(table)


@envs_app.command("check")
def envs_check(name: str, env_opt: EnvOpt = None, episodes: Episodes = 3) -> None:
    """Check that an env honours the text-environment contract."""
    from turnrl import envs
    from turnrl.envs.checker import check_env

    env = envs.make(name, **_env_opts(env_opt))
    problems = check_env(env, episodes=episodes)
    env.close()
    if problems:
        for p in problems:
            err_console.print(f"[red]✗[/red] {name}: {p}")
        raise typer.Exit(1)
    console.print(f"[green]✓[/green] {name}: the env contract holds ({episodes} expert and random episodes)")


# ------------------------------------------------------------------------------ data
@data_app.command("validate")
def data_validate(path: Path) -> None:
    """Validate a trajectory, pair or comparison file (``turnrl comparisons``); print counts."""
    from turnrl.data.io import iter_jsonl, summarize
    from turnrl.oracles import COMPARISON_SCHEMA, read_comparisons

    first = next(iter_jsonl(path), None) if path.is_file() else None
    if first is not None and first[1].get("schema") == COMPARISON_SCHEMA:
        comparisons = read_comparisons(path)
        summary: dict[str, Any] = {
            "path": str(path), "records": len(comparisons), "comparisons": len(comparisons),
            "tasks": len({c.task_id for c in comparisons}),
            "avg_label": sum(c.label for c in comparisons) / len(comparisons),
        }
    else:
        summary = summarize(path)
    if not summary.get("records"):  # a truncated download or an unfinished writer: no valid file of records
        raise TurnRLError(f"{path}: holds no records")
    console.print_json(json.dumps(summary))


@data_app.command("import-eto")
def data_import_eto(
    path: Path,
    out: Annotated[Path, typer.Option("--out", help="Output JSONL.", callback=out_file)],
    env: Annotated[str, typer.Option(help="Env name to record.")] = "unknown",
    default_reward: Annotated[float | None, typer.Option(help="Return for items without a reward.")] = None,
) -> None:
    """Convert ETO's {"id", "conversations"} data to turnrl trajectories."""
    import math

    from turnrl.data.eto import convert_eto

    if default_reward is not None and not math.isfinite(default_reward):
        raise TurnRLError(f"--default-reward must be a finite number (got {default_reward})")
    check_not_input(out, [path], "converting would replace the ETO data")
    n = convert_eto(path, out, env=env, default_reward=default_reward)
    console.print(f"wrote {n} trajectories to {out}")


# ----------------------------------------------------------------------------- model
@model_app.command("init-tiny")
def model_init_tiny(
    out: Annotated[Path, typer.Option("--out", help="Directory to write the model to.", callback=out_dir)],
    preset: str = "tiny",
    seed: Seed = 0,
) -> None:
    """Build the embedded tiny model (tokenizer trained on env text, random weights)."""
    from turnrl.models.tiny import build_tiny

    path = build_tiny(out, preset=preset, seed=seed)
    console.print(f"tiny model written to {path}")


# ------------------------------------------------------------------- collect / eval
def _policy(spec: str, temperature: float, max_new_tokens: int, history: int | None, engine: str = "hf",
            seed: int = 0) -> Any:
    from turnrl.rollout import load_policy

    sampling = sampling_options(temperature, max_new_tokens)
    return load_policy(spec, sampling=sampling, history=history, engine=engine,
                       engine_opts={"seed": seed} if engine == "vllm" else None)


def _check_scripted(ctx: typer.Context, policy: Any, spec: str) -> None:
    """One line for a model-only option given on the command line with a scripted policy
    (``expert``, ``random``, ``ucb``...), which would ignore it."""
    if not hasattr(policy, "engine"):
        refuse_model_options(ctx, ("temperature", "max_new_tokens", "history", "engine"),
                             f"policy '{spec}' is scripted")


def _sampling_seeded(policy: Any, seed: int) -> Any:
    """Around a model policy's episodes: torch seeded with ``seed`` (restored after), so that a run
    with the same ``--seed`` samples the same replies; a scripted policy needs nothing."""
    import contextlib

    if not hasattr(policy, "engine"):
        return contextlib.nullcontext()
    from turnrl.devices import forked_rng

    return forked_rng(seed)


EngineOpt = Annotated[str, typer.Option(help="Generation engine for model policies: hf or vllm (GPU).")]
WorkersOpt = Annotated[int, typer.Option(help="Run the envs in this many worker processes (0: in-process).")]
WorkerBackendOpt = Annotated[str, typer.Option(
    help="Where --workers run: process (local processes) or ray (Ray actors; pip install 'turnrl\\[ray]'; "
         "RAY_ADDRESS picks the cluster).")]


@app.command()
def collect(
    ctx: typer.Context,
    env: Annotated[str, typer.Option(help="Env name.")],
    policy: Annotated[str, typer.Option(help="expert, random, or a model directory / hub id / tiny.")],
    out: Annotated[Path, typer.Option(help="Output JSONL: episodes are written as they finish; a rerun of the same run resumes it, a file of another run is refused.", callback=out_file)],
    split: str = "train",
    episodes: Episodes = 100,
    num_envs: NumEnvs = 32,
    seed: Seed = 0,
    temperature: Annotated[float, typer.Option(min=0.0, help="0 = greedy.")] = 1.0,
    max_new_tokens: MaxNewTokens = 64,
    history: History = None,
    env_opt: EnvOpt = None,
    engine: EngineOpt = "hf",
    workers: WorkersOpt = 0,
    worker_backend: WorkerBackendOpt = "process",
    instruction: Instruction = None,
    invalid_action: InvalidAction = "random",
    invalid_penalty: InvalidPenalty = 0.0,
) -> None:
    """Collect trajectories of a policy."""
    from turnrl.collect import check_workers, run_policy
    from turnrl.evaluation import summarize
    from turnrl.progress import progress_bar

    check_workers(workers, worker_backend)
    prompt = _prompt(instruction, invalid_action, invalid_penalty, history)
    pol = _policy(policy, temperature, max_new_tokens, history, engine, seed)
    _check_scripted(ctx, pol, policy)
    with progress_bar(f"collect {env}/{split}", episodes) as advance, _sampling_seeded(pol, seed):
        trajs = run_policy(pol, env, split=split, episodes=episodes, env_opts=_env_opts(env_opt),
                           num_envs=num_envs, seed=seed, out=out, progress=advance, workers=workers,
                           worker_backend=worker_backend, prompt=prompt)
    r = summarize(trajs, policy=policy, env=env, split=split)
    with open(out, "rb") as f:
        held = sum(1 for line in f if line.strip())
    where = f"in {out}" if held == len(trajs) else f"of the {held} in {out} (an earlier, longer collection's)"
    console.print(f"{len(trajs)} episodes {where}: avg return {r['avg_reward']:.3f}, "
                  f"success {r['success_rate']:.2f}, invalid actions {r['invalid_action_rate']:.2f}")


@app.command("eval")
def eval_cmd(
    ctx: typer.Context,
    env: Annotated[str, typer.Option(help="Env name.")],
    policy: Annotated[str, typer.Option("--policy", "--model",
                                        help="expert, random, or a model directory / hub id / tiny.")],
    out: Annotated[Path, typer.Option(help="Report JSON.", callback=out_file)],
    split: Annotated[list[str] | None, typer.Option(help="Split(s) to evaluate (repeatable; default: seen).")] = None,
    episodes: Episodes = 100,
    num_envs: NumEnvs = 32,
    seed: Seed = 0,
    temperature: Annotated[float, typer.Option(min=0.0, help="0 = greedy.")] = 0.0,
    max_new_tokens: MaxNewTokens = 64,
    history: History = None,
    env_opt: EnvOpt = None,
    trajectories: Annotated[Path | None, typer.Option(help="Also write the episodes here.", callback=out_file)] = None,
    engine: EngineOpt = "hf",
    workers: WorkersOpt = 0,
    worker_backend: WorkerBackendOpt = "process",
    instruction: Instruction = None,
    invalid_action: InvalidAction = "random",
    invalid_penalty: InvalidPenalty = 0.0,
) -> None:
    """Evaluate a policy; write {"results": [...]} and print a table."""
    from turnrl import envs
    from turnrl.collect import check_workers, evaluate
    from turnrl.data.io import write_jsonl
    from turnrl.evaluation import results_table
    from turnrl.progress import progress_bar
    from turnrl.train.core import atomic_write_json

    check_workers(workers, worker_backend)
    if trajectories is not None and trajectories.resolve() == out.resolve():
        raise TurnRLError(f"--trajectories {trajectories}: is the --out report too (the report would replace it)")
    prompt = _prompt(instruction, invalid_action, invalid_penalty, history)
    splits = list(dict.fromkeys(split or ["seen"]))  # a split given twice is played once
    probe = envs.make(env, **_env_opts(env_opt))  # every split checked before any is played
    try:
        for s in splits:
            probe.task_ids(s)
    finally:
        probe.close()
    pol = _policy(policy, temperature, max_new_tokens, history, engine, seed)
    _check_scripted(ctx, pol, policy)
    results, all_trajs = [], []
    for s in splits:
        with progress_bar(f"eval {env}/{s}", episodes) as advance, _sampling_seeded(pol, seed):
            rec, trajs = evaluate(pol, env, split=s, episodes=episodes, env_opts=_env_opts(env_opt),
                                  num_envs=num_envs, seed=seed, progress=advance, policy_label=policy,
                                  workers=workers, worker_backend=worker_backend, prompt=prompt)
        results.append(rec)
        all_trajs.extend(trajs)
    if trajectories is not None:
        write_jsonl(trajectories, all_trajs)
    atomic_write_json(out, {"results": results})
    console.print(results_table(results))


# ------------------------------------------------------------------------------ train
@train_app.command("sft")
def train_sft_cmd(
    model: Annotated[str, typer.Option(help="Model directory, hub id, or tiny.")],
    data: Annotated[Path, typer.Option(help="Trajectories (turnrl JSONL or ETO format).")],
    out: Annotated[Path, typer.Option(help="Output directory.", callback=out_dir)],
    overrides: Overrides = None,
    config: Annotated[Path | None, typer.Option(help="YAML config.")] = None,
    resume: Annotated[bool, typer.Option(help="Continue the run in --out from its last checkpoint.")] = False,
) -> None:
    """Behaviour cloning on agent turns."""
    from turnrl.config import load_config
    from turnrl.train.sft import SFTConfig, train_sft

    cfg = load_config(SFTConfig, config, overrides)
    cfg.check_budget()
    result = train_sft(model, data, out, cfg, resume=resume)
    console.print(f"SFT finished: {result.steps} steps, final loss {result.final_loss:.4f}; model in {result.model_dir}")
    _note_left_out(out, cfg.max_length, "example")


def _note_left_out(out: Path, max_length: int, what: str) -> None:
    """One console line when the data's tokenizing left something out (``OUT/data_stats.json``): agent
    turns past ``max_length``, ``what``s whose first turn did not fit, pairs cut to the same tokens on
    both sides. Documented, but easy to miss in a file."""
    stats_file = out / "data_stats.json"
    stats = json.loads(stats_file.read_text()) if stats_file.is_file() else {}
    parts = []
    if stats.get("dropped_turns") or stats.get("skipped_too_long"):
        parts.append(f"max_length={max_length} left out {stats.get('dropped_turns', 0)} agent turn(s) past it and "
                     f"{stats.get('skipped_too_long', 0)} {what}(s) whose first turn did not fit")
    if stats.get("skipped_identical"):
        parts.append(f"{stats['skipped_identical']} pair(s) with the same tokens on both sides were skipped")
    if parts:
        console.print(f"[yellow]note: {'; '.join(parts)} ({stats_file})[/yellow]", highlight=False)


def _preference_command(loss: str) -> None:
    doc = {
        "dpo": "Trajectory DPO (ETO) on preference pairs.",
        "ipo": "IPO on preference pairs.",
        "dmpo": "DMPO: discounted, length-normalised multi-turn DPO on preference pairs.",
        "sppo": "SPPO's squared loss on scored samples (turnrl pairs --scored).",
    }[loss]

    def command(
        model: Annotated[str, typer.Option(help="Model directory, hub id, or tiny.")],
        pairs: Annotated[Path, typer.Option(help="Pairs JSONL (scored samples for sppo).")],
        out: Annotated[Path, typer.Option(help="Output directory.", callback=out_dir)],
        overrides: Overrides = None,
        config: Annotated[Path | None, typer.Option(help="YAML config.")] = None,
        eval_pairs: Annotated[Path | None, typer.Option(help="Held-out pairs: loss and accuracy are logged.")] = None,
        resume: Annotated[bool, typer.Option(help="Continue the run in --out from its last checkpoint.")] = False,
    ) -> None:
        from turnrl.config import load_config
        from turnrl.train.preference import PreferenceConfig, train_preference

        cfg = load_config(PreferenceConfig, config, overrides, base={"loss": loss})
        if cfg.loss != loss:  # the command is the loss: another one set in the config would be ignored
            raise TurnRLError(f"loss={cfg.loss} is set (--config or an override), but this command trains "
                              f"{loss}; run 'turnrl train {cfg.loss}' or drop the key")
        cfg.check_unread([loss], what="this command trains", given=cfg.model_fields_set)  # gamma under dpo, eta under dmpo, beta under sppo
        result = train_preference(model, pairs, out, cfg, resume=resume, eval_data=eval_pairs)
        console.print(f"{loss.upper()} finished: {result.steps} steps, final loss {result.final_loss:.4f}; "
                      f"model in {result.model_dir}")
        _note_left_out(out, cfg.max_length, "sample" if loss == "sppo" else "pair")

    command.__doc__ = doc
    train_app.command(loss)(command)


for _loss in ("dpo", "ipo", "dmpo", "sppo"):
    _preference_command(_loss)

import turnrl.cli.archer  # noqa: E402,F401  (registers train archer | chai | filtered-bc)
import turnrl.cli.rl  # noqa: E402,F401  (registers train ppo and study greedy)


@app.command()
def pairs(
    out: Annotated[Path, typer.Option(help="Output JSONL.", callback=out_file)],
    explored: Annotated[list[Path], typer.Option(help="Explored (agent) trajectories (repeatable).")],
    expert: Annotated[list[Path] | None, typer.Option(help="Expert trajectories (repeatable).")] = None,
    mode: Annotated[str, typer.Option(help="trajectory, step, mixed, takeover or self-play.")] = "trajectory",
    takeovers: Annotated[list[Path] | None, typer.Option(
        help="For --mode takeover: the expert's takeovers of the explored games (turnrl eto's "
             "iter-i/takeover.jsonl; repeatable).")] = None,
    losers: Annotated[str, typer.Option(help="clean (drop degenerate losers) or noisy (keep them).")] = "noisy",
    truncate_k: Annotated[int | None, typer.Option(min=0, help="Cut losers to the winner's turns + K.")] = None,
    scored: Annotated[bool, typer.Option(help="Write SPPO scored samples instead of pairs.")] = False,
    tau: Annotated[float | None, typer.Option(help="Reward-oracle temperature for --scored (default 1).")] = None,
) -> None:
    """Build preference pairs (ETO, step-wise, takeover, self-play) or SPPO scored samples."""
    from turnrl.data import pairs as P
    from turnrl.data.io import read_trajectories, write_jsonl

    modes = ("trajectory", "step", "mixed", "takeover", "self-play")
    if mode not in modes:
        from turnrl.errors import unknown

        raise unknown("pairs mode", mode, modes)
    if losers not in ("clean", "noisy"):
        raise TurnRLError(f"--losers must be clean or noisy (got {losers!r})")
    if scored:  # scored samples are every explored sample: the pair options would be ignored
        given = [opt for opt, on in ((f"--mode {mode}", mode != "trajectory"),
                                     (f"--truncate-k {truncate_k}", truncate_k is not None),
                                     ("--expert", bool(expert)), ("--losers clean", losers == "clean")) if on]
        if given:
            raise TurnRLError(f"{given[0]}: builds pairs, and --scored writes SPPO scored samples of --explored "
                              "instead (it would be ignored); drop one of them")
    if tau is not None and not scored:
        raise TurnRLError(f"--tau {tau}: the oracle temperature of --scored samples; pairs have none (it would be "
                          "ignored)")
    check_not_input(out, [*explored, *(expert or []), *(takeovers or [])])
    if takeovers and mode != "takeover":
        raise TurnRLError(f"--takeovers is for --mode takeover (got --mode {mode})")
    if truncate_k is not None and mode not in ("trajectory", "mixed"):
        raise TurnRLError(f"--truncate-k cuts trajectory pairs' losers; --mode {mode} has none to cut")
    explored_trajs = [t for f in explored for t in read_trajectories(f)]
    stats: dict[str, int] = {}
    records: list[Any]
    if scored:
        tau = 1.0 if tau is None else tau
        if not tau > 0:
            raise TurnRLError(f"--tau must be > 0 (got {tau})")
        records = P.scored_samples(explored_trajs, tau=tau)
        P.check_several_samples(records, ", ".join(map(str, explored)))
    elif mode == "self-play":
        if expert:
            raise TurnRLError("--expert: --mode self-play pairs the explored samples with each other (it would be "
                              "ignored); drop it")
        records = P.self_play_pairs(explored_trajs, losers=losers, stats=stats)  # type: ignore[arg-type]
    else:
        if not expert:
            raise TurnRLError(f"--mode {mode} needs --expert trajectories (or use --mode self-play)")
        experts = [t for f in expert for t in read_trajectories(f)]
        records = []
        if mode in ("trajectory", "mixed"):
            records += P.trajectory_pairs(experts, explored_trajs, losers=losers,  # type: ignore[arg-type]
                                          truncate_k=truncate_k, stats=stats)
        if mode in ("step", "mixed"):
            records += P.step_pairs(experts, explored_trajs, losers=losers, stats=stats)  # type: ignore[arg-type]
        if mode == "takeover":
            if not takeovers:
                raise TurnRLError("--mode takeover needs --takeovers (turnrl eto's iter-i/takeover.jsonl)")
            records += P.takeover_pairs(experts, explored_trajs, [t for f in takeovers for t in read_trajectories(f)],
                                        losers=losers, stats=stats)  # type: ignore[arg-type]
    what = "scored samples" if scored else "pairs"
    extra = ", ".join(f"{k} {v}" for k, v in sorted(stats.items()) if k != "pairs")
    if not records:  # an empty file would only fail later, at training
        raise TurnRLError(f"no {what} from {', '.join(map(str, [*explored, *(expert or [])]))}"
                          + (f" ({extra})" if extra else "") + f"; nothing written to {out}")
    write_jsonl(out, records)
    console.print(f"wrote {len(records)} {what} to {out}" + (f" ({extra})" if extra else ""))


# ------------------------------------------------------------------------- quickstart
@app.command()
def quickstart(
    out: Annotated[Path, typer.Option(help="Output directory.", callback=out_dir)] = Path("runs/quickstart"),
    fast: Annotated[bool, typer.Option(help="A smaller run (400 demos, 100 evaluation games per split).")] = False,
    resume: Annotated[bool, typer.Option(help="Reuse finished stages in --out.")] = True,
) -> None:
    """Tiny model -> expert demos -> SFT -> one DMPO iteration -> evaluation table, report and plots."""
    from turnrl.quickstart import run_quickstart

    run_quickstart(out, fast=fast, resume=resume, console=console)


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors are one line and exit 2."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    console.quiet = int(os.environ.get("RANK", "0") or 0) > 0  # under accelerate launch, rank 0 reports
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        # non-standalone typer returns (not raises) the code of a typer.Exit, and turns Ctrl-C
        # (KeyboardInterrupt) into Exit(130): a returned code is the process's exit status
        code = app(args=argv, prog_name="turnrl", standalone_mode=False)
    except TurnRLError as e:
        _print_error(str(e))
        sys.exit(e.exit_code)
    except OSError as e:  # a folder that cannot be written, a full disk: one line, no traceback
        if e.errno not in _USER_OS_ERRORS:
            raise  # any other: a bug's traceback
        paths = " -> ".join(str(p) for p in (e.filename, e.filename2) if p)
        _print_error(f"{paths}: {e.strerror}" if paths else str(e.strerror or e))
        sys.exit(2)
    except ValidationError as e:  # a settings object built from an option's value (--temperature inf)
        from turnrl.config import format_validation_error

        _print_error(format_validation_error(BaseModel, e, "option"))
        sys.exit(2)
    except typer.Exit as e:
        _exit(e.exit_code)
    except KeyboardInterrupt:
        _exit(130)
    except Exception as e:  # click usage errors arrive here in non-standalone mode
        errors, aborts = _click_exceptions()
        if isinstance(e, errors):  # click's message in one line, with where to read the usage
            ctx, message = getattr(e, "ctx", None), e.format_message()  # type: ignore[attr-defined]
            message += _setting_as_flag_hint(e, ctx)
            if message:  # empty for a group called without a command: its help was printed
                _print_error(message + (f" (see '{ctx.command_path} --help')" if ctx is not None else ""))
            sys.exit(e.exit_code)  # type: ignore[attr-defined]
        if isinstance(e, aborts):  # older click turns Ctrl-C into Abort (from KeyboardInterrupt)
            _exit(130 if isinstance(e.__cause__ or e.__context__, KeyboardInterrupt) else 1)
        raise
    if isinstance(code, int) and not isinstance(code, bool) and code != 0:
        _exit(code)


#: errors of the user's file system (permissions, a read-only or full disk, a file where a folder
#: goes): one line; any other OSError keeps its traceback
_USER_OS_ERRORS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR,
                             errno.EISDIR, errno.EEXIST, errno.ENAMETOOLONG, errno.ELOOP})


def _exit(code: int | None) -> None:
    """Exit with ``code``; 130 (Ctrl-C) says so in one line on stderr."""
    if code == 130:
        err_console.print("interrupted", highlight=False)
    sys.exit(code)


def _print_error(message: str) -> None:
    from rich.markup import escape

    # escaped: "pip install 'turnrl[ray]'" is text, not a rich style tag
    err_console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)


def _setting_as_flag_hint(e: Exception, ctx: Any) -> str:
    """For ``--lr 1e-3`` on a command of ``key=value`` settings, where click finds no flag like it: how
    settings are written (``lr=...``)."""
    name = getattr(e, "option_name", None)
    if type(e).__name__ != "NoSuchOption" or not name or ctx is None:
        return ""
    if not any(p.name == "overrides" for p in getattr(ctx.command, "params", ())):
        return ""
    if [p for p in getattr(e, "possibilities", None) or () if p != "--help"]:  # a near flag: click names it
        return ""
    flags = [o for p in ctx.command.params for o in getattr(p, "opts", ()) if o.startswith("--") and o != "--help"]
    key = name.lstrip("-").replace("-", "_")
    return (f"; its flags are {', '.join(flags)}, and its settings key=value arguments: if {key} is a setting, "
            f"write {key}=VALUE")


def _click_exceptions() -> tuple[tuple[type[Exception], ...], tuple[type[Exception], ...]]:
    """Usage errors (``ClickException``) and ``Abort`` of the click that typer parses with:
    recent typer (0.2x) carries its own copy (``typer._click``, with ``typer.Abort``), older
    typer uses the ``click`` package; every one that exists is returned."""
    import importlib

    errors: list[type[Exception]] = []
    aborts: list[type[Exception]] = [typer.Abort]
    for name in ("typer._click.exceptions", "click.exceptions"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        errors.append(mod.ClickException)
        if hasattr(mod, "Abort"):
            aborts.append(mod.Abort)
    return tuple(errors), tuple(aborts)
