"""What plain RLFT can gain at temperature 1, and what greedy decoding sees (issue 8, docs/rlft.md; exploratory).

The narrow-gap start behaves like the scripted ``lose-shift`` policy with ``follow`` about 0.45: after a low
reward it moves to the next arm with probability ``follow`` and stays otherwise. At temperature 1 RLFT can only
raise ``follow``; greedy decoding of such a model stays after every low reward while ``follow`` < 1/2 and moves
after every one above. This simulates the scripted policy on 1000 instances (4 runs each) for ``follow`` from 0
to 1, at the rollouts' horizon (20) and the evaluation's (50): regret, coverage and the number of arms tried (the
exploration bonus pays +1 for each).

    python docs/img/rlft/narrow-gap/follow_curve.py
"""

from __future__ import annotations

import numpy as np

import turnrl.greedy_study as g
from turnrl import envs
from turnrl.diagnostics.bandit import scripted_run
from turnrl.errors import run_script

FOLLOW = (0.0, 0.3, 0.45, 0.5, 0.6, 0.8, 1.0)
IDS = [f"bandit-{600000 + i}" for i in range(1000)]


def main(args: list[str]) -> None:
    if args:
        raise ValueError("takes no arguments")
    print(f"lose-shift:threshold=-0.5,follow=F on {len(IDS)} instances x 4 runs (regret: mean [95% CI over the episodes])")
    for horizon in (20, 50):
        env = envs.make("bandit", **{**g.NARROW_GAP["bandit_env"], "horizon": horizon})
        for f in FOLLOW:
            pr = scripted_run(f"lose-shift:threshold=-0.5,follow={f:g}", env, IDS, runs=4, seed=0)
            mu, arms = pr.run.instances.mu, pr.run.arms
            regret = (mu.max(-1) - np.take_along_axis(mu, arms[..., None], -1)[..., 0]).sum(1)
            tried = np.array([len(set(a.tolist())) for a in arms])
            half = 1.96 * regret.std(ddof=1) / np.sqrt(len(regret))
            print(f"horizon {horizon}, follow {f:<4g}: regret {regret.mean():5.2f} [±{half:.2f}], "
                  f"coverage {tried.mean() / mu.shape[-1]:.2f}, arms tried {tried.mean():.2f}")


if __name__ == "__main__":
    run_script(main, "follow_curve.py")
