"""Finish the knowing-doing study's pre-registered reading after its run folder was lost (27 Nov 2026).

Seeds 0 and 1 of both RLFT rows, the start's and the lose-shift SFT's evaluations were done on 26 Nov;
their evaluation files are kept in ``eval/`` beside this script, the run folder (``runs/kd``) with its
models is not. This script runs exactly the stages the study (``turnrl study greedy --design
knowing-doing --seeds 3``) still lacked, through the study's own functions and settings:

1. data, the starting SFT (seed 0, as before) and the UCB reference SFT;
2. the start's evaluation (compare it with ``eval/bandit-greedy-like_SFT-s0.json``: equal files mean
   the rebuilt start is the start seeds 0 and 1 trained from) beside RLFT and RLFT + bonus seed 2;
3. the evaluations of seed 2, the untrained model and the UCB SFT.

Then copy ``eval/*.json`` into ``OUT/eval`` (without overwriting) and run
``turnrl study greedy --out OUT --part bandit --design knowing-doing --seeds 3 --report-only``.

Usage: python rebuild_seed2.py OUT [JOBS]

What happened (PREREGISTERED.txt, second addendum of 27 Nov): stage 1 ran, and stage 2's evaluation showed
that the rebuilt start is not the 26 Nov start (regret 20.955 against 24.425: it commits to another label).
The script was stopped 3 iterations into seed 2, and the study command itself then ran all three seeds from
the rebuilt start, reusing stage 1's models, the start's evaluation and seed 2's checkpoints.
"""

from pathlib import Path

from turnrl import greedy_study as gs
from turnrl.errors import run_script
from turnrl.pipelines.iterative import check_settings


def main(args: list[str]) -> None:
    if not args:
        raise ValueError("missing arguments")
    out = Path(args[0])
    jobs = int(args[1]) if len(args) > 1 else 2
    cfg = gs.KNOWING_DOING
    out.mkdir(parents=True, exist_ok=True)
    check_settings(out, {"design": "knowing-doing", "config": cfg})
    gs.collect_bandit(out, cfg)
    plan = gs.plan_bandit(out, 3, cfg)
    pool = gs._Pool(jobs, lambda s: print(s, flush=True))
    try:
        pool.run(plan["sft"] + [t for t in plan["ref_sft"] if t[0] == "bandit UCB SFT"])
        seed2 = [t for t in plan["rl"] if t[0].endswith("seed 2")]
        pool.run(plan["evals"]["greedy-like SFT"] + seed2)
        pool.run([t for lab in ("RLFT", "RLFT + bonus") for t in plan["evals"][lab] if t[2][0].endswith("-s2.json")]
                 + plan["evals"]["untrained"] + plan["evals"]["UCB SFT"])
    finally:
        pool.close()


if __name__ == "__main__":  # the pool's workers are spawned and import this file
    run_script(main, "rebuild_seed2.py OUT [JOBS]")
