"""How much does moving on after ``Low.`` pay, and how noisy is it? (docs/rlft.md, knowing-doing design)

A numpy simulation of the study's start policy on its PPO rollouts: 10 arms with means U(0, 1),
reward noise sigma 1, 20-step episodes; after a reward below -0.5 the policy moves on to the next
arm with probability ``p`` (0.3, like the start's data), else it stays. For each discount gamma and
with / without the exploration bonus (+1 for an untried arm) it prints the mean advantage
(return-to-go minus the per-step batch baseline) of moving on minus that of staying at ``Low.``
states, the advantages' standard deviation there, and about how many ``Low.`` decisions a 95%
two-sided test of that difference needs.

    python docs/img/rlft/knowing-doing/advantage_sim.py
"""

from __future__ import annotations

import numpy as np


def run(p: float, gamma: float, bonus: float, horizon: int = 20, n: int = 20000, seed: int = 0,
        threshold: float = -0.5) -> tuple[float, float, float]:
    rng = np.random.default_rng(seed)
    mu = rng.uniform(0, 1, (n, 10))
    rows = np.arange(n)
    arm = np.zeros(n, dtype=int)
    tried = np.zeros((n, 10), dtype=bool)
    rewards = np.zeros((n, horizon))
    low = np.zeros((n, horizon), dtype=bool)
    moved = np.zeros((n, horizon), dtype=bool)
    last = np.full(n, np.nan)
    for t in range(horizon):
        if t > 0:
            is_low = last < threshold
            move = is_low & (rng.random(n) < p)
            arm = np.where(move, (arm + 1) % 10, arm)
            low[:, t], moved[:, t] = is_low, move
        r = mu[rows, arm] + rng.normal(0, 1, n)
        rewards[:, t] = r + bonus * ~tried[rows, arm]
        tried[rows, arm] = True
        last = r
    ret = np.zeros((n, horizon))
    acc = np.zeros(n)
    for t in reversed(range(horizon)):
        acc = rewards[:, t] + gamma * acc
        ret[:, t] = acc
    adv = ret - ret.mean(axis=0)
    diff = adv[low & moved].mean() - adv[low & ~moved].mean()
    return float(diff), float(adv[low].std()), float(low.sum() / n)


if __name__ == "__main__":
    for bonus in (0.0, 1.0):
        for gamma in (0.95, 0.8, 0.5, 0.0):
            d, sd, per_episode = run(0.3, gamma, bonus)
            print(f"bonus {bonus:g} gamma {gamma:g}: advantage of moving on minus staying {d:+.3f}, "
                  f"sd {sd:.2f}, Low. states per episode {per_episode:.1f}, "
                  f"Low. decisions needed ~{(2 * 1.96 * sd / d) ** 2:.0f}")
