"""More RLFT seeds for the knowing-doing study, without re-running the seeds already read (27 Nov 2026).

``turnrl study greedy --seeds N`` trains seeds 0..N-1. A new checkout keeps no run folder, and the
evaluations of seeds 0-2 are kept beside this script (``eval/``, ``confirm-500/``), so this script runs,
through the study's own functions and KNOWING_DOING settings, only:

1. the data and the starting SFT (seed 0; it rebuilds deterministically) and the start's evaluation on the
   study's 50 instances (compare it with ``eval/bandit-greedy-like_SFT-s0.json``: equal = the same start);
2. RLFT + bonus, then RLFT, for the given seeds, and their evaluations on the 50 instances.

Usage: python train_more_seeds.py OUT SEED [SEED ...]     (FIVE-SEEDS.txt: runs/kd 3 4; two worker processes)
"""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from turnrl import greedy_study as gs
from turnrl.errors import run_script
from turnrl.pipelines.iterative import check_settings


def train_seeds(out: Path, design: str, cfg: dict[str, Any], seeds: list[int], rows: Sequence[str],
                pool: Any, *, evaluate: bool = True) -> None:
    """In the study folder ``out`` (settings recorded as ``design``): the data and the starting SFT, then
    the given RLFT ``rows`` for ``seeds``; with ``evaluate``, the start's and their evaluations on the
    study's instances."""
    out.mkdir(parents=True, exist_ok=True)
    check_settings(out, {"design": design, "config": cfg})
    gs.collect_bandit(out, cfg)
    plan = gs.plan_bandit(out, max(seeds) + 1, cfg)
    rl = {t[0]: t for t in plan["rl"]}
    pool.run(plan["sft"])
    pool.run((plan["evals"]["greedy-like SFT"] if evaluate else [])
             + [rl[f"bandit {label} seed {s}"] for label in rows for s in seeds])
    if evaluate:
        pool.run([plan["evals"][label][s] for label in rows for s in seeds])


def main(args: list[str]) -> None:
    if len(args) < 2:
        raise ValueError("missing arguments")
    out, seeds = Path(args[0]), [int(s) for s in args[1:]]
    pool = gs._Pool(2, lambda s: print(s, flush=True))
    try:
        train_seeds(out, "knowing-doing", gs.KNOWING_DOING, seeds, ("RLFT + bonus", "RLFT"), pool)
    finally:
        pool.close()


if __name__ == "__main__":  # the pool's workers are spawned and import this file
    run_script(main, "train_more_seeds.py OUT SEED [SEED ...]")
