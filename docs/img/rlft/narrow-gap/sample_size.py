"""How many rollout episodes does RLFT need to see that moving on after ``Low.`` pays? (docs/rlft.md, narrow-gap)

A numpy simulation of the narrow-gap start on its PPO rollouts, as ``knowing-doing/advantage_sim.py`` but with the
bandit env's reward table: a task fixes every reward up front (a [horizon, arms] table, ``envs/bandit.py``), so the
episodes of one task that pull the same arm at the same step get the same reward. 10 arms with means U(0, 1), noise
sigma 1, 20-step episodes; after a reward below -0.5 the policy moves on to the next arm with probability 0.34 (the
narrow-gap start's rate at temperature 1), else it stays. For the batch baseline (``group_size`` 1) and the
leave-one-out baseline of G episodes of a task, with and without the +1 exploration bonus, it prints the advantage
of moving on minus that of staying at ``Low.`` states, the advantages' standard deviation there, and about how many
episodes a 95% two-sided test of that difference needs, ``(2 * 1.96 * sd / diff)^2`` ``Low.`` decisions. The last
rows train on the pulled arms' means instead of the sampled rewards (``reward_source=expected``; the policy still
sees the sampled reward).

    python docs/img/rlft/narrow-gap/sample_size.py
"""

from __future__ import annotations

import numpy as np


def run(p: float, gamma: float, bonus: float, group: int, horizon: int = 20, n: int = 40000, seed: int = 0,
        threshold: float = -0.5, expected: bool = False) -> tuple[float, float, float]:
    """(advantage of moving on minus staying at Low. states, their sd, Low. states per episode)."""
    rng = np.random.default_rng(seed)
    tasks = n // group
    mu = np.repeat(rng.uniform(0, 1, (tasks, 10)), group, axis=0)
    table = np.repeat(rng.normal(0, 1, (tasks, horizon, 10)), group, axis=0)
    rows = np.arange(tasks * group)
    arm = np.zeros(len(rows), dtype=int)
    tried = np.zeros((len(rows), 10), dtype=bool)
    rewards = np.zeros((len(rows), horizon))
    low = np.zeros((len(rows), horizon), dtype=bool)
    moved = np.zeros_like(low)
    last = np.full(len(rows), np.nan)
    for t in range(horizon):
        if t > 0:
            is_low = last < threshold
            move = is_low & (rng.random(len(rows)) < p)
            arm = np.where(move, (arm + 1) % 10, arm)
            low[:, t], moved[:, t] = is_low, move
        r = mu[rows, arm] + table[rows, t, arm]
        rewards[:, t] = (mu[rows, arm] if expected else r) + bonus * ~tried[rows, arm]
        tried[rows, arm] = True
        last = r
    ret = np.zeros_like(rewards)
    acc = np.zeros(len(rows))
    for t in reversed(range(horizon)):
        acc = rewards[:, t] + gamma * acc
        ret[:, t] = acc
    if group == 1:
        adv = ret - ret.mean(axis=0)
    else:
        g = ret.reshape(tasks, group, horizon)
        adv = (g - (g.sum(axis=1, keepdims=True) - g) / (group - 1)).reshape(len(rows), horizon)
    diff = adv[low & moved].mean() - adv[low & ~moved].mean()
    return float(diff), float(adv[low].std()), float(low.sum() / len(rows))


if __name__ == "__main__":
    for expected in (False, True):
        for bonus in (0.0, 1.0) if not expected else (0.0,):
            for group in (1, 4, 8):
                d, sd, per_episode = run(0.34, 0.95, bonus, group, expected=expected)
                need = (2 * 1.96 * sd / d) ** 2
                print(f"{'expected rewards, ' if expected else ''}bonus {bonus:g}, group {group}: moving on minus "
                      f"staying {d:+.3f}, sd {sd:.2f}, Low. states an episode {per_episode:.1f}, episodes needed "
                      f"~{need / per_episode:.0f}")
