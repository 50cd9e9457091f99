"""Reads the best-summary design's claims (docs/rlft.md, PREREGISTERED.txt beside this file) from a study
folder's evaluation files: per model regret@50, coverage@50, the per-instance difference from the start (95% CI
over the instances), the ``said`` counts; per row the Student-t CI over the seeds.

    python docs/img/rlft/best-summary/read_claims.py runs/bsd      # or docs/img/rlft/best-summary (its eval/)

(It reads every seed a row has, or the seeds listed after the folder: ``runs/ucd2 1,2,3`` for the
untried-copy design's confirmatory test.)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from turnrl.errors import TurnRLError, run_script
from turnrl.stats import mean_ci95


def main(study: Path, only: list[int] | None = None) -> None:
    ev = study / "eval"
    start = json.loads((ev / "bandit-greedy-like_SFT-s0.json").read_text())
    start_regret = float(np.mean(start["final_regret"]))
    print(f"start: regret {start_regret:.3f} coverage {np.mean(start['final_coverage']):.2f} "
          f"said {start.get('said')} actions {start['actions_pct']}")
    for row in ("RLFT", "RLFT_plus_bonus"):
        regrets, coverages = [], []
        for seed in only if only is not None else range(len(list(ev.glob(f"bandit-{row}-s*.json")))):
            path = ev / f"bandit-{row}-s{seed}.json"
            if not path.exists():
                continue
            r = json.loads(path.read_text())
            regrets.append(float(np.mean(r["final_regret"])))
            coverages.append(float(np.mean(r["final_coverage"])))
            d, (lo, hi) = mean_ci95((np.array(r["final_regret"]) - np.array(start["final_regret"])).tolist())
            print(f"{row} s{seed}: regret {regrets[-1]:.3f} coverage {coverages[-1]:.2f} minus the start {d:+.2f} "
                  f"[{lo:+.2f}, {hi:+.2f}] said {r.get('said')} actions {r['actions_pct']} invalid {r['invalid']:.3f}")
        if len(regrets) > 1:
            m, (lo, hi) = mean_ci95(regrets)
            cm, (clo, chi) = mean_ci95(coverages)
            print(f"{row}: regret {m:.2f} [{lo:.2f}, {hi:.2f}] (start {start_regret:.2f}), "
                  f"coverage {cm:.2f} [{clo:.2f}, {chi:.2f}]")


def _cli(args: list[str]) -> None:
    if not 1 <= len(args) <= 2:
        raise ValueError("expected a study folder and optionally a seed list")
    if not (Path(args[0]) / "eval" / "bandit-greedy-like_SFT-s0.json").is_file():
        raise TurnRLError(f"{args[0]}: no eval/bandit-greedy-like_SFT-s0.json")
    main(Path(args[0]), [int(s) for s in args[1].split(",")] if len(args) > 1 else None)


if __name__ == "__main__":
    run_script(_cli, "read_claims.py STUDY_DIR [SEED,SEED,...]")
