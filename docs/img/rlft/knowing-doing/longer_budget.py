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

from pathlib import Path

from ppo_variant import run  # beside this script

from turnrl.errors import run_script


def main(args: list[str]) -> None:
    if len(args) < 3:
        raise ValueError("missing arguments")
    out, iterations, seeds = Path(args[0]), int(args[1]), [int(s) for s in args[2:]]
    run(out, {"iterations": iterations}, ("RLFT + bonus",), seeds, "longer_budget.json", "knowing-doing, longer budget")


if __name__ == "__main__":  # the pool's workers are spawned and import this file
    run_script(main, "longer_budget.py OUT ITERATIONS SEED [SEED ...]")
