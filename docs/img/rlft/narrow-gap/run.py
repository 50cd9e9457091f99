"""The narrow-gap bandit design of issue 8 (27 Nov 2026, night; PREREGISTERED.txt beside this script).

Two stages, each resumable (a finished stage's output is reused), and both in one command:

    python docs/img/rlft/narrow-gap/run.py start OUT FOLLOW
    python docs/img/rlft/narrow-gap/run.py rl OUT FOLLOW SEED [SEED ...] [rows=bonus|plain]
    python docs/img/rlft/narrow-gap/run.py all OUT FOLLOW SEED [SEED ...] [rows=bonus|plain]   # both, if the gate passes

``start=S`` (any stage) makes another start of the design: its data and SFT are seeded by S (``start_seed``;
the first two starts are S = 0), the 28 Nov many-starts test (MANY-STARTS.txt). ``group=G`` (``rl``) trains with
``group_size`` G: each rollout plays 16 / G tasks G times each, with the leave-one-out baseline of the episodes
of a task (GROUP-BASELINE.txt); ``iterations=N`` trains for N PPO iterations instead of 20 (PILOT-40-ITERS.txt);
``episodes=N`` plays N episodes an iteration instead of 16, all N in one lock-step batch (``episodes_per_iter`` and
``num_envs`` N; LARGE-BATCH.txt); ``reward=expected`` trains on the pulled arms' means instead of the sampled
rewards (``reward_source=expected``; EXPECTED-REWARD.txt); ``jobs=J`` trains in J processes at once (2 by default).
With any of the first four, OUT is a folder of its own, holding a copy of the start's ``data/``,
``sft-greedy/``, ``start.json`` and ``eval-500/sft-greedy.json`` (the settings differ, so the start's folder
refuses it).

``start`` writes the start's data and SFT into OUT (``gs.NARROW_GAP`` with ``follow`` = FOLLOW) and reads it
greedily on the study's 50 seen instances: regret@50, coverage@50 and how often its ``Low.`` replies leave the
last arm, with the pre-registered gate (coverage@50 at most 0.20 and ``Low.`` acted on at most 10%: the start
commits although its rationale says to move on). ``rl`` trains RLFT and RLFT + bonus (with ``rows=bonus``, RLFT +
bonus only; with ``rows=plain``, RLFT only) for the given seeds from that start and reads them and the start on
the 500 instances ``bandit-500000`` .. ``bandit-500499`` (no earlier run has used them), through the
knowing-doing scripts' functions; it writes ``OUT/narrow-gap.json`` (with ``rows=plain``,
``OUT/narrow-gap-plain.json``, so that the bonus rows' summary stays as it is). ``all`` runs ``start`` and, if the
gate passes, ``rl``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "knowing-doing"))

from ppo_variant import ROWS  # noqa: E402
from ppo_variant import run as run_variant  # noqa: E402

from turnrl import greedy_study as gs  # noqa: E402
from turnrl.errors import TurnRLError, run_script  # noqa: E402
from turnrl.pipelines.iterative import check_settings  # noqa: E402

FIRST = 500000  # the 500 instances of the test


def config(follow: float, start_seed: int = 0) -> tuple[str, dict[str, Any]]:
    """The design name recorded in OUT and its settings: NARROW_GAP with the start's ``follow`` and
    ``start_seed`` (the seed of its data and SFT; 0 for the first two starts)."""
    if not 0.0 < follow < 0.5:
        raise ValueError(f"FOLLOW must lie in (0, 0.5), so that greedy decoding repeats the arm, not {follow}")
    cfg = {**gs.NARROW_GAP, "greedy_policy": f"lose-shift:threshold=-0.5,follow={follow:g}"}
    if start_seed:
        cfg["start_seed"] = start_seed
    name = "narrow-gap" if cfg["greedy_policy"] == gs.NARROW_GAP["greedy_policy"] else f"narrow-gap, follow={follow:g}"
    return name + (f", start={start_seed}" if start_seed else ""), cfg


def start(out: Path, follow: float, start_seed: int = 0) -> dict[str, Any]:
    """The start's data, SFT and greedy reading on the study's 50 instances, with the gate."""
    design, cfg = config(follow, start_seed)
    out.mkdir(parents=True, exist_ok=True)
    check_settings(out, {"design": design, "config": cfg})
    gs.collect_bandit(out, cfg)
    plan = gs.plan_bandit(out, 1, cfg)
    pool = gs._Pool(1, lambda s: print(s, flush=True))
    try:
        pool.run(plan["sft"])
        pool.run(plan["evals"]["greedy-like SFT"])
    finally:
        pool.close()
    r = json.loads(Path(plan["evals"]["greedy-like SFT"][0][2][0]).read_text())
    res = {"follow": follow, "start_seed": start_seed, "regret": float(np.mean(r["final_regret"])),
           "coverage": float(np.mean(r["final_coverage"])), "low_replies": r.get("low_replies", 0),
           "moves_on_low": r.get("moves_on_low") or 0.0}
    res["gate"] = bool(res["coverage"] <= 0.20 and res["moves_on_low"] <= 0.10)
    print(f"start (follow {follow:g}) on the 50 instances: regret@50 {res['regret']:.2f}, coverage@50 "
          f"{res['coverage']:.2f}, Low. acted on {res['moves_on_low']:.0%} of {res['low_replies']}; gate "
          f"{'passed' if res['gate'] else 'FAILED'}")
    (out / "start.json").write_text(json.dumps(res, indent=1) + "\n")
    return res


def main(args: list[str]) -> None:
    if len(args) < 3 or args[0] not in ("start", "rl", "all") or (args[0] != "start" and len(args) < 4):
        raise ValueError("missing or unknown arguments")
    out, follow = Path(args[1]), float(args[2])
    options = dict(a.split("=", 1) for a in args[3:] if "=" in a)
    for key, value in options.items():
        if (key, value) not in (("rows", "bonus"), ("rows", "plain"), ("reward", "expected")) and (
                key not in ("start", "group", "iterations", "episodes", "jobs") or not value.isdigit()
                or (key != "start" and int(value) < 1)):
            raise ValueError(f"unknown option {key}={value} (counts are whole numbers, at least 1)")
    start_seed = int(options.get("start", 0))
    # PPO settings changed from the design's (ppo_variant's mechanism), in the order the design name lists them
    changes = {key: int(options[opt]) for key, opt in (("group_size", "group"), ("iterations", "iterations"),
                                                         ("episodes_per_iter", "episodes"), ("num_envs", "episodes"))
               if opt in options}
    if "reward" in options:
        changes["reward_source"] = options["reward"]
    if changes and args[0] != "rl":
        raise ValueError("group=G, iterations=N, episodes=N and reward=expected are options of rl (from a copy of a "
                         "start: see the docstring)")
    if args[0] != "rl":
        gate = start(out, follow, start_seed)["gate"]
        if args[0] == "start":
            return
        if not gate:
            raise TurnRLError(f"{out}: the start failed the gate (start.json), so no PPO runs")
    design, cfg = config(follow, start_seed)
    design += "".join(f", {key}={value}" for key, value in changes.items())
    rows = ROWS[options.get("rows", "both")]
    summary = "narrow-gap-plain.json" if options.get("rows") == "plain" else "narrow-gap.json"
    run_variant(out, changes, rows, [int(s) for s in args[3:] if "=" not in s], summary, design, base=cfg,
                first=FIRST, jobs=int(options.get("jobs", 2)))


if __name__ == "__main__":  # the pool's workers are spawned and import this file
    run_script(main, "run.py start OUT FOLLOW [start=S] | run.py rl|all OUT FOLLOW SEED [SEED ...] [rows=bonus|plain] "
                     "[start=S] [group=G] [iterations=N] [episodes=N] [reward=expected] [jobs=J]")
