"""More RLFT seeds for the knowing-doing study, without re-running the seeds already read (27 Nov 2026).

``turnrl study greedy --seeds N`` trains seeds 0..N-1. A new checkout keeps no run folder, and the
evaluations of seeds 0-2 are kept beside this script (``eval/``, ``confirm-500/``), so this script runs,
through the study's own functions and KNOWING_DOING settings, only:

1. the data and the starting SFT (seed 0; it rebuilds deterministically) and the start's evaluation on the
   study's 50 instances (compare it with ``eval/bandit-greedy-like_SFT-s0.json``: equal = the same start);
2. RLFT + bonus, then RLFT, for the given seeds, and their evaluations on the 50 instances.

Usage: python train_more_seeds.py OUT SEED [SEED ...]     (FIVE-SEEDS.txt: runs/kd 3 4; two worker processes)
"""

from pathlib import Path

from turnrl import greedy_study as gs
from turnrl.errors import run_script
from turnrl.pipelines.iterative import check_settings


def main(args: list[str]) -> None:
    if len(args) < 2:
        raise ValueError("missing arguments")
    out, seeds = Path(args[0]), [int(s) for s in args[1:]]
    cfg = gs.KNOWING_DOING
    out.mkdir(parents=True, exist_ok=True)
    check_settings(out, {"design": "knowing-doing", "config": cfg})
    gs.collect_bandit(out, cfg)
    plan = gs.plan_bandit(out, max(seeds) + 1, cfg)
    rl = {t[0]: t for t in plan["rl"]}
    pool = gs._Pool(2, lambda s: print(s, flush=True))
    try:
        pool.run(plan["sft"])
        pool.run(plan["evals"]["greedy-like SFT"]
                 + [rl[f"bandit {label} seed {s}"] for label in ("RLFT + bonus", "RLFT") for s in seeds])
        pool.run([plan["evals"][label][s] for label in ("RLFT + bonus", "RLFT") for s in seeds])
    finally:
        pool.close()


if __name__ == "__main__":  # the pool's workers are spawned and import this file
    run_script(main, "train_more_seeds.py OUT SEED [SEED ...]")
