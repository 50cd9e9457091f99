"""Exploratory, not pre-registered (27 Nov 2026): does a longer PPO budget make the exploration bonus
take hold in greedy play?

In the five-seed reading (FIVE-SEEDS.txt) the bonus raised the sampled policy's coverage in every seed but
changed the greedy reply after ``Low.`` in only 2 of 5. This trains RLFT + bonus for the given seeds with
ITERATIONS PPO iterations instead of 20 (everything else KNOWING_DOING, from the same start, rebuilt in OUT
by the study's functions) and reads them greedily on the 500 fresh instances of CONFIRM-500.txt.

    python docs/img/rlft/knowing-doing/longer_budget.py OUT ITERATIONS SEED [SEED ...]

Prints per model regret@50, coverage@50, ``Low.`` acted on and the per-instance difference from the start
(95% CI over the 500 instances); writes ``OUT/longer_budget.json``.
"""

import json
from pathlib import Path

import numpy as np
from eval_more_instances import eval_tasks, minus_start  # beside this script
from train_more_seeds import train_seeds

from turnrl import greedy_study as gs
from turnrl.errors import run_script


def main(args: list[str]) -> None:
    if len(args) < 3:
        raise ValueError("missing arguments")
    out, iterations, seeds = Path(args[0]), int(args[1]), [int(s) for s in args[2:]]
    cfg = {**gs.KNOWING_DOING, "ppo": {**gs.KNOWING_DOING["ppo"], "iterations": iterations}}
    ids = [f"bandit-{i}" for i in range(300000, 300500)]
    models = ["sft-greedy", *(f"rlft-bonus-s{s}" for s in seeds)]
    parts = out / "eval-500"
    pool = gs._Pool(2, lambda s: print(s, flush=True))
    try:
        train_seeds(out, "knowing-doing, longer budget", cfg, seeds, ("RLFT + bonus",), pool, evaluate=False)
        pool.run(eval_tasks(out, parts, models, ids))
    finally:
        pool.close()
    summary = {}
    for m, (d, lo, hi) in zip(models, minus_start(parts, models), strict=True):
        r = json.loads((parts / f"{m}.json").read_text())
        summary[m] = {"regret": float(np.mean(r["final_regret"])), "coverage": float(np.mean(r["final_coverage"])),
                      "moves_on_low": r.get("moves_on_low"), "minus_start": [d, lo, hi]}
        print(f"{m}: regret@50 {summary[m]['regret']:.2f}, coverage {summary[m]['coverage']:.2f}, "
              f"Low. acted on {r.get('moves_on_low', 0):.0%}, minus the start {d:+.2f} [{lo:+.2f}, {hi:+.2f}]")
    (out / "longer_budget.json").write_text(json.dumps({"iterations": iterations, **summary}, indent=1) + "\n")


if __name__ == "__main__":  # the pool's workers are spawned and import this file
    run_script(main, "longer_budget.py OUT ITERATIONS SEED [SEED ...]")
