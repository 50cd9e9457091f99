"""Exploratory, not pre-registered (27 Nov 2026): RLFT on tic-tac-toe from a start with few invalid replies.

The study's tic-tac-toe start (100 minimax games) writes an invalid reply in 27% of its greedy turns and 63%
of its sampled ones, and PPO moved its greedy choice onto occupied cells (docs/rlft.md, the third design).
The quickstart's SFT agent (600 minimax games, 3 epochs) writes 6% invalid greedy replies. This trains PPO
from it with the second design's settings (``turnrl train ppo``'s defaults: lr 1e-4, GAE and the value head,
beta_KL 0.05; 40 iterations of 16 games against the random opponent, -1 per invalid reply) in the
quickstart's prompt, and plays 400 greedy games against the random opponent on the seen split (the same
games for every model) and 200 at temperature 1.

    python docs/img/rlft/ttt-quickstart-start/run.py QUICKSTART_OUT OUT SEED [SEED ...] [KEY=VALUE ...]

QUICKSTART_OUT is a ``turnrl quickstart --out`` folder (its ``sft/model`` is the start). ``KEY=VALUE``
changes a PPO setting (e.g. ``advantage=mc episodes_per_iter=64``; the fifth design). Writes
``OUT/results.json``.
"""

import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from turnrl.errors import run_script
from turnrl.stats import mean_ci95, paired_by_unit

GAMES, SAMPLED = 400, 200


def ppo_config(seed: int, overrides: list[str]) -> Any:
    """The designs' PPO settings for ``seed``, changed by ``KEY=VALUE`` overrides (a bad one is a one-line error)."""
    from turnrl.config import load_config
    from turnrl.quickstart import ENV_OPTS, PROMPT
    from turnrl.train.ppo import PPOConfig

    base = dict(instruction=PROMPT.instruction, history=PROMPT.history, env_opts=ENV_OPTS, max_new_tokens=48,
                iterations=40, episodes_per_iter=16, num_envs=16, invalid_penalty=-1.0, seed=seed, save_every=4)
    return load_config(PPOConfig, None, overrides, base=base)


def ppo(start: str, out: str, seed: int, overrides: list[str]) -> str:
    from turnrl.quickstart import ENV
    from turnrl.train.ppo import train_ppo

    if not (Path(out) / "summary.json").exists():
        train_ppo(start, ENV, out, ppo_config(seed, overrides), resume=(Path(out) / "checkpoints").exists())
    return str(Path(out) / "model")


def play(model: str, temperature: float, games: int, env_seed: int = 1) -> dict[str, Any]:
    import torch

    from turnrl.collect import run_policy
    from turnrl.evaluation import summarize
    from turnrl.quickstart import ENV, ENV_OPTS, PROMPT
    from turnrl.rollout import SamplingConfig, load_policy

    torch.manual_seed(0)
    pol = load_policy(model, sampling=SamplingConfig(temperature=temperature, max_new_tokens=48), history=PROMPT.history)
    trajs = run_policy(pol, ENV, split="seen", episodes=games, env_opts=ENV_OPTS, num_envs=64, seed=env_seed,
                       prompt=PROMPT)
    s = summarize(trajs, policy=model, env=ENV, split="seen")
    return {"avg_reward": s["avg_reward"], "ci95": s["ci95"], "invalid": s["invalid_action_rate"],
            "returns": [t.return_ for t in trajs]}


def play_all(ex: Any, named: dict[str, str], temperature: float, games: int, env_seed: int = 1) -> dict[str, Any]:
    """:func:`play` for every named model, on the pool ``ex``: the same games for each."""
    n = len(named)
    return dict(zip(named, ex.map(play, named.values(), [temperature] * n, [games] * n, [env_seed] * n), strict=True))


def summarize_rows(res: dict[str, dict[str, Any]], seeds: list[int]) -> None:
    """Print each model minus the start game by game, and (more than one seed) RLFT across the seeds: the
    mean's 95% CI and each game's gain averaged over the seeds (``paired_by_unit``); adds the row ``RLFT``."""
    for mode, rows in res.items():
        start = [dict(enumerate(rows["start"]["returns"]))]
        for name, r in rows.items():
            line = f"{mode} {name}: {r['avg_reward']:.3f} {r['ci95']} invalid {r['invalid']:.3f}"
            if name != "start":
                d = paired_by_unit([dict(enumerate(r["returns"]))], start)
                line += f", minus the start by game {d.mean:+.3f} ({d.up} up / {d.down} down)"
            print(line, flush=True)
    if len(seeds) < 2:
        return
    for mode, rows in res.items():
        ms = [rows[f"rlft-s{s}"] for s in seeds]
        mean, ci = mean_ci95([r["avg_reward"] for r in ms])
        d = paired_by_unit([dict(enumerate(r["returns"])) for r in ms], [dict(enumerate(rows["start"]["returns"]))] * len(ms))
        rows["RLFT"] = {"mean": mean, "ci95": ci, "minus_start_by_game": [d.mean, *d.ci95]}
        print(f"{mode} RLFT over seeds {seeds}: {mean:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] against the start's "
              f"{rows['start']['avg_reward']:.3f}; by game {d.mean:+.3f} [{d.ci95[0]:+.3f}, {d.ci95[1]:+.3f}]", flush=True)


def main(args: list[str]) -> None:
    overrides = [a for a in args if "=" in a]
    args = [a for a in args if "=" not in a]
    if len(args) < 3:
        raise ValueError("missing arguments")
    start, out, seeds = str(Path(args[0]) / "sft" / "model"), Path(args[1]), [int(s) for s in args[2:]]
    if not Path(start).is_dir():
        raise ValueError(f"{start}: no quickstart SFT model there")
    ppo_config(seeds[0], overrides)  # a bad override fails here, before any run
    with ProcessPoolExecutor(2) as ex:
        models = list(ex.map(ppo, [start] * len(seeds), [str(out / f"ppo-s{s}") for s in seeds], seeds,
                             [overrides] * len(seeds)))
        named = {"start": start, **{f"rlft-s{s}": m for s, m in zip(seeds, models, strict=True)}}
        greedy = play_all(ex, named, 0.0, GAMES)
        sampled = play_all(ex, named, 1.0, SAMPLED)
    res = {"greedy": greedy, "sampled": sampled}
    summarize_rows(res, seeds)
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":  # the pool's workers are spawned and import this file
    run_script(main, "run.py QUICKSTART_OUT OUT SEED [SEED ...] [KEY=VALUE ...]")
