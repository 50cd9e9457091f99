"""The regret of the policy RLFT trains: narrow-gap models sampled at temperature 1 (issue 8, docs/rlft.md).

RLFT samples its rollouts at temperature 1 and the study reads its models greedily. This plays each model at
temperature 1 (torch seeded with SEED, the same episodes' seeds as the greedy reading) on the N instances
``bandit-FIRST`` .. and writes OUT/NAME.json (``greedy_study.bandit_eval``'s record; one already there is kept, so
a killed run resumes). It then prints each model's regret@50 and coverage@50, and the difference of every model
from the first one named (the start) with its 95% CI over the instances; and the same for greedy play, from the
greedy readings named by ``greedy.NAME=JSON`` (``bandit_eval`` records on instances from ``bandit-FIRST`` on).

    python docs/img/rlft/narrow-gap/sampled_eval.py OUT FIRST N SEED [jobs=J] NAME=MODEL_DIR [greedy.NAME=JSON] ...
"""

from __future__ import annotations

import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

import turnrl.greedy_study as g
from turnrl.errors import run_script
from turnrl.stats import mean_ci95

ENV = {**g.NARROW_GAP["bandit_env"]}


def _job(path: str, model: str, first: int, n: int, seed: int) -> str:
    import torch

    torch.set_num_threads(1)
    ids = [f"bandit-{first + i}" for i in range(n)]
    # the study's cache: a record already there is kept, a new one is written whole (never half)
    g._cached(Path(path), lambda: g.bandit_eval(model, ENV, ids, 16, g.BANDIT_INSTRUCTION, temperature=1.0, seed=seed))
    return path


def _line(name: str, reg: np.ndarray, cov: np.ndarray, base: np.ndarray | None) -> str:
    text = f"{name:<22} regret@50 {reg.mean():6.2f}  coverage@50 {cov.mean():.2f}"
    if base is not None:
        m, (lo, hi) = mean_ci95((reg - base).tolist())
        text += f"  minus the start {m:+.2f} [{lo:+.2f}, {hi:+.2f}]"
    return text


def main(args: list[str]) -> None:
    if len(args) < 5 or not all(a.isdigit() for a in args[1:4]):
        raise ValueError("give OUT FIRST N SEED and NAME=MODEL_DIR pairs")
    out, first, n, seed = Path(args[0]), int(args[1]), int(args[2]), int(args[3])
    opts = [a.split("=", 1) for a in args[4:]]
    if any(len(o) != 2 for o in opts):
        raise ValueError("every argument after SEED is KEY=VALUE")
    jobs_text = next((v for k, v in opts if k == "jobs"), "1")
    if not jobs_text.isdigit() or int(jobs_text) < 1:
        raise ValueError(f"jobs=J takes a whole number of processes, at least 1 (got {jobs_text!r})")
    jobs = int(jobs_text)
    greedy = {k.removeprefix("greedy."): Path(v) for k, v in opts if k.startswith("greedy.")}
    models = [(k, v) for k, v in opts if k != "jobs" and not k.startswith("greedy.")]
    if not models or set(greedy) - {k for k, _ in models}:
        raise ValueError("name a model (NAME=MODEL_DIR) for every greedy.NAME, and at least one model")
    out.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(jobs) as pool:
        list(pool.map(_job, [str(out / f"{k}.json") for k, _ in models], [v for _, v in models],
                      [first] * len(models), [n] * len(models), [seed] * len(models)))
    sampled = {k: json.loads((out / f"{k}.json").read_text()) for k, _ in models}
    start = models[0][0]
    print(f"temperature 1 (torch seed {seed}), instances bandit-{first}..bandit-{first + n - 1}; CI over instances")
    diffs = []
    for k, _ in models:
        r = sampled[k]
        reg, cov = np.array(r["final_regret"]), np.array(r["final_coverage"])
        base = None if k == start else np.array(sampled[start]["final_regret"])
        if base is not None:
            diffs.append(float(np.mean(reg - base)))
        print(_line(k, reg, cov, base) + f"  moves on Low. {r['moves_on_low'] or 0:.0%}")
    if diffs:
        m, (lo, hi) = mean_ci95(diffs)
        print(f"the {len(diffs)} runs minus the start, 95% CI over the runs: {m:+.2f} [{lo:+.2f}, {hi:+.2f}]")
    if greedy:
        print("greedy play on the same instances (the first N of each greedy reading)")
        read = {k: json.loads(p.read_text()) for k, p in greedy.items()}
        for k, _ in models:
            if k in read:
                reg, cov = np.array(read[k]["final_regret"][:n]), np.array(read[k]["final_coverage"][:n])
                base = None if k == start or start not in read else np.array(read[start]["final_regret"][:n])
                print(_line(k, reg, cov, base))


if __name__ == "__main__":
    run_script(main, "sampled_eval.py OUT FIRST N SEED [jobs=J] NAME=MODEL_DIR [greedy.NAME=JSON] ...")
