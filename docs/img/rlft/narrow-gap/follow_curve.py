"""What plain RLFT can gain at temperature 1, and what greedy decoding sees (issue 8, docs/rlft.md; exploratory).

The narrow-gap start behaves like the scripted ``lose-shift`` policy with ``follow`` about 0.45: after a low
reward it moves to the next arm with probability ``follow`` and stays otherwise. At temperature 1 RLFT can only
raise ``follow``; greedy decoding of such a model stays after every low reward while ``follow`` < 1/2 and moves
after every one above. This simulates the scripted policy on 1000 instances (4 runs each) for ``follow`` from 0
to 1, at the rollouts' horizon (20) and the evaluation's (50): regret (with the sd of one episode's), coverage and the number of arms tried (the
exploration bonus pays +1 for each).

    python docs/img/rlft/narrow-gap/follow_curve.py
"""

from __future__ import annotations

from typing import Any

import turnrl.greedy_study as g
from turnrl import envs
from turnrl.bandits.simulate import cumulative_regret
from turnrl.diagnostics.bandit import coverage_summary, regret_summary, scripted_run
from turnrl.errors import run_script

FOLLOW = (0.0, 0.3, 0.45, 0.5, 0.6, 0.8, 1.0)
IDS = [f"bandit-{600000 + i}" for i in range(1000)]


def main(args: list[str]) -> None:
    if args:
        raise ValueError("takes no arguments")
    print(f"lose-shift:threshold=-0.5,follow=F on {len(IDS)} instances x 4 runs (regret: mean [95% CI over the "
          "instances])")
    for horizon in (20, 50):
        env: Any = envs.make("bandit", **{**g.NARROW_GAP["bandit_env"], "horizon": horizon})
        for f in FOLLOW:
            pr = scripted_run(f"lose-shift:threshold=-0.5,follow={f:g}", env, IDS, runs=4, seed=0)
            regret, cov = regret_summary(pr), coverage_summary(pr)["final"]
            lo, hi = regret["final_ci95"]
            sd = float(cumulative_regret(pr.run)[:, -1].std(ddof=1))  # one episode's, over all 4 x 1000
            print(f"horizon {horizon}, follow {f:<4g}: regret {regret['final']:5.2f} [{lo:.2f}, {hi:.2f}] (sd {sd:.1f}), "
                  f"coverage {cov:.2f}, arms tried {cov * env.arms:.2f}")

if __name__ == "__main__":
    run_script(main, "follow_curve.py")
