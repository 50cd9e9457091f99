"""The knowing-doing study's models on more instances (27 Nov 2026: 150 exploratory, then 500 pre-registered).

A start that commits to one label has the regret of that label, and on the study's 50 instances the ten
labels range from 19.10 to 24.85, so the regret claim against a one-model start is partly a draw of its
label. Over more instances every fixed label's regret tends to the same value (50 x (E[max of 10 U(0,1)]
- 1/2) = 20.45), which leaves what the policy does. This script evaluates the study's models greedily, as
the study does, on other instances (below; disjoint from the 50) and
prints regret@50, coverage@50 and ``Low.`` acted on per model, and the per-seed mean with a Student-t CI.

    python docs/img/rlft/knowing-doing/eval_more_instances.py runs/kd OUT.json [JOBS [FIRST COUNT]]

The instances are ``bandit-FIRST`` .. ``bandit-(FIRST + COUNT - 1)``: by default 100050 and 150, the rest of
the seen split (``bandit-100050`` .. ``bandit-100199``; the exploratory run). The confirmatory run of
``CONFIRM-500.txt`` uses 300000 500: instances no run has trained or been evaluated on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from turnrl import greedy_study as gs
from turnrl.stats import mean_ci95

ROWS = {"start": ["sft-greedy"], "RLFT": ["rlft-s0", "rlft-s1", "rlft-s2"],
        "RLFT + bonus": ["rlft-bonus-s0", "rlft-bonus-s1", "rlft-bonus-s2"], "lose-shift SFT": ["sft-lose-shift"]}


def main() -> None:
    study, out = Path(sys.argv[1]), Path(sys.argv[2])
    jobs = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    first, count = (int(sys.argv[4]), int(sys.argv[5])) if len(sys.argv) > 5 else (100050, 150)
    cfg = gs.KNOWING_DOING
    env_opts = dict(cfg["bandit_env"])
    ids = [f"bandit-{s}" for s in range(first, first + count)]
    tmp = out.parent / (out.stem + "-parts")
    tasks = [(f"eval {m}", gs._eval_bandit_job, (str(tmp / f"{m}.json"), str(study / m / "model"), env_opts, list(ids),
                                                  cfg["ppo"]["max_new_tokens"]))
             for ms in ROWS.values() for m in ms]
    pool = gs._Pool(jobs, lambda s: print(s, flush=True))
    try:
        pool.run(tasks)
    finally:
        pool.close()
    result: dict[str, dict] = {}
    for label, ms in ROWS.items():
        per = [json.loads((tmp / f"{m}.json").read_text()) for m in ms]
        regrets = [float(np.mean(p["final_regret"])) for p in per]
        covs = [float(np.mean(p["final_coverage"])) for p in per]
        low = sum(p["low_replies"] for p in per)
        acted = sum(p["moves_on_low"] * p["low_replies"] for p in per) / low if low else float("nan")
        r, (rlo, rhi) = mean_ci95(regrets)
        c, (clo, chi) = mean_ci95(covs)
        result[label] = {"regret_per_model": regrets, "coverage_per_model": covs, "low_replies": low,
                         "moves_on_low": acted}
        print(f"{label}: regret@50 {r:.2f} [{rlo:.2f}, {rhi:.2f}] ({' / '.join(f'{x:.2f}' for x in regrets)}); "
              f"coverage {c:.2f} [{clo:.2f}, {chi:.2f}] ({' / '.join(f'{x:.2f}' for x in covs)}); "
              f"Low. acted on {acted:.0%} of {low}")
    base = np.asarray(json.loads((tmp / "sft-greedy.json").read_text())["final_regret"])
    for label, ms in ROWS.items():  # each model minus the start, instance by instance (95% Student t)
        diffs = [np.asarray(json.loads((tmp / f"{m}.json").read_text())["final_regret"]) - base for m in ms]
        paired = [(float(d.mean()), *mean_ci95([float(x) for x in d])[1]) for d in diffs]
        result[label]["paired_per_model"] = paired
        if label != "start":
            print(f"{label} minus start, per model: "
                  + " / ".join(f"{m:+.2f} [{lo:+.2f}, {hi:+.2f}]" for m, lo, hi in paired))
    out.write_text(json.dumps({"instances": [ids[0], ids[-1]], "rows": result}, indent=1) + "\n")


if __name__ == "__main__":  # the pool's workers are spawned and import this file
    main()
