"""Run one PPO seed's two stages (RLFT and RLFT + bonus) of a greedy-study folder, one process each, exactly
as ``turnrl study greedy`` plans them (used on 27 Nov 2026 to start seed 3 of the untried-copy design while the
study ran seeds 0-2; PREREGISTERED-3.txt). Then ``turnrl study greedy ... --seeds 4`` evaluates it.

    python docs/img/rlft/untried-copy/run_seed.py runs/ucd2 3
"""

from __future__ import annotations

from multiprocessing import get_context
from pathlib import Path

import turnrl.greedy_study as g
from turnrl.errors import TurnRLError, run_script


def main(args: list[str]) -> None:
    if len(args) != 2:
        raise ValueError("expected a study folder and a seed")
    out, seed = Path(args[0]), int(args[1])
    if not (out / "sft-greedy" / "model").is_dir():
        raise TurnRLError(f"{out}: no sft-greedy/model (run the study's start first)")
    plan = g.plan_bandit(out, seed + 1, g.UNTRIED_COPY)
    tasks = [t for t in plan["rl"] if t[2][3]["seed"] == seed]  # (name, fn, (model, env, out, settings))
    procs = [get_context("spawn").Process(target=fn, args=args) for _, fn, args in tasks]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode:
            raise TurnRLError(f"a PPO run of seed {seed} exited with code {p.exitcode}")


if __name__ == "__main__":
    run_script(main, "run_seed.py STUDY_DIR SEED")
