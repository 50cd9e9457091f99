"""The knowing-doing study's models on more instances (27 Nov 2026: 150 exploratory, then 500 pre-registered).

A start that commits to one label has the regret of that label, and on the study's 50 instances the ten
labels range from 19.10 to 24.85, so the regret claim against a one-model start is partly a draw of its
label. Over more instances every fixed label's regret tends to the same value (50 x (E[max of 10 U(0,1)]
- 1/2) = 20.45), which leaves what the policy does. This script evaluates the study's models greedily, as
the study does, on other instances (below; disjoint from the 50) and
prints regret@50, coverage@50 and ``Low.`` acted on per model, and the per-seed mean with a Student-t CI.

    python docs/img/rlft/knowing-doing/eval_more_instances.py runs/kd OUT.json [JOBS [FIRST COUNT [SEEDS]]]

The instances are ``bandit-FIRST`` .. ``bandit-(FIRST + COUNT - 1)``: by default 100050 and 150, the rest of
the seen split (``bandit-100050`` .. ``bandit-100199``; the exploratory run). The confirmatory run of
``CONFIRM-500.txt`` uses 300000 500: instances no run has trained or been evaluated on. SEEDS (default 3) is
the number of RLFT seeds per row (``FIVE-SEEDS.txt``: 5). An evaluation whose file exists in ``OUT-parts/`` is
not re-run.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from turnrl import greedy_study as gs
from turnrl.errors import run_script
from turnrl.stats import mean_ci95


def model_rows(seeds: int) -> dict[str, list[str]]:
    """Each row's model folders in the study: the one-model rows and ``seeds`` seeds of both RLFT rows."""
    return {"greedy-like SFT": ["sft-greedy"], "RLFT": [f"rlft-s{s}" for s in range(seeds)],
            "RLFT + bonus": [f"rlft-bonus-s{s}" for s in range(seeds)], "lose-shift SFT": ["sft-lose-shift"]}


def eval_tasks(study: Path, parts: Path, models: list[str], ids: list[str]) -> list[tuple]:
    """The study's greedy evaluation job of each model folder on ``ids``, written to ``parts/<model>.json``
    (an existing file is not re-run)."""
    cfg = gs.KNOWING_DOING
    return [(f"eval {m}", gs._eval_bandit_job, (str(parts / f"{m}.json"), str(study / m / "model"),
                                                 dict(cfg["bandit_env"]), ids, cfg["ppo"]["max_new_tokens"]))
            for m in models]


def minus_start(parts: Path, models: list[str], start: str = "sft-greedy") -> list[tuple[float, float, float]]:
    """Each model's regret@H minus the start's, instance by instance: mean and 95% Student t CI over the
    instances."""
    final = {m: np.asarray(json.loads((parts / f"{m}.json").read_text())["final_regret"]) for m in [start, *models]}
    return [(float(d.mean()), *mean_ci95([float(x) for x in d])[1]) for d in (final[m] - final[start] for m in models)]


def main(args: list[str]) -> None:
    if len(args) < 2:
        raise ValueError("missing arguments")
    study, out = Path(args[0]), Path(args[1])
    jobs = int(args[2]) if len(args) > 2 else 1
    first, count = (int(args[3]), int(args[4])) if len(args) > 4 else (100050, 150)
    rows = model_rows(int(args[5]) if len(args) > 5 else 3)
    ids = [f"bandit-{s}" for s in range(first, first + count)]
    tmp = out.parent / (out.stem + "-parts")
    tasks = {label: eval_tasks(study, tmp, ms, ids) for label, ms in rows.items()}
    pool = gs._Pool(jobs, lambda s: print(s, flush=True))
    try:
        pool.run([t for ts in tasks.values() for t in ts])
    finally:
        pool.close()
    # the study's own aggregation: CIs over a row's models, ``Low.`` acted on pooled, and each RLFT row
    # minus the start per seed ("paired")
    agg = gs.aggregate_bandit(tmp, len(rows["RLFT"]), gs.KNOWING_DOING, tasks)
    for label, ms in rows.items():
        row = agg["rows"][label]
        row["paired_per_model"] = minus_start(tmp, ms)  # and each model minus the start, per instance
        r, c = row["regret_seeds"], row["coverage_seeds"]
        print(f"{label}: regret@50 {r['mean']:.2f} {r['ci95']} {row['regret_per_seed']}; coverage {c['mean']:.2f} "
              f"{c['ci95']}; Low. acted on {row.get('moves_on_low', 0):.0%} of {row.get('low_replies', 0)}")
        print("  minus the start, per model: "
              + " / ".join(f"{m:+.2f} [{lo:+.2f}, {hi:+.2f}]" for m, lo, hi in row["paired_per_model"]))
    for label, d in agg["paired"].items():
        print(f"{label} minus the start, per seed: {d['diff_seeds']}")
    result = {"rows": agg["rows"], "paired": agg["paired"]}
    out.write_text(json.dumps({"instances": [ids[0], ids[-1]], **result}, indent=1) + "\n")


if __name__ == "__main__":  # the pool's workers are spawned and import this file
    run_script(main, "eval_more_instances.py STUDY_DIR OUT.json [JOBS [FIRST COUNT [SEEDS]]]")
