"""A secondary evaluation of the study's tic-tac-toe rows at temperature 1 (the PPO rollouts'
temperature; the study itself evaluates greedily): the minimax SFT (RLFT's start) and every RLFT
seed, 100 games a seed against each opponent, opponent and sampling seed 1000 + s (a one-model row
at all of them), as the study pairs them.

    python docs/img/rlft/ttt-minimax-start/eval_sampled.py runs/g9 --seeds 3

Writes ``--out`` (default ``sampled.json`` next to this script) and prints a table (mean over seeds, 95% CI over seeds,
and RLFT minus its start per seed).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from turnrl.greedy_study import FULL, TTT_INSTRUCTION, ttt_eval
from turnrl.stats import mean_ci95


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("study", type=Path)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--games", type=int, default=FULL["ttt_games"])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "sampled.json")
    args = ap.parse_args()
    g = FULL["ttt_ppo"]["max_new_tokens"]
    rows = {"minimax SFT": [args.study / "ttt-sft-minimax" / "model"] * args.seeds,
            "RLFT": [args.study / f"ttt-rlft-s{s}" / "model" for s in range(args.seeds)]}
    res: dict = {}
    for label, models in rows.items():
        for opp in ("random", "minimax"):
            per = [ttt_eval(m, opp, args.games, g, TTT_INSTRUCTION, seed=1000 + s, temperature=1.0)
                   for s, m in enumerate(models)]
            res.setdefault(label, {})[opp] = {"mean": [p["mean"] for p in per], "invalid": [p["invalid"] for p in per],
                                              "win": [p["win"] for p in per]}
    lines = ["| row | opponent | return per seed | mean [95% CI] | invalid per turn |", "|---|---|---|---|---|"]
    for label, by in res.items():
        for opp, r in by.items():
            m, (lo, hi) = mean_ci95(r["mean"])
            lines.append(f"| {label} | {opp} | {' / '.join(f'{x:.2f}' for x in r['mean'])} | {m:.3f} [{lo:.3f}, {hi:.3f}] | "
                         f"{sum(r['invalid']) / len(r['invalid']):.3f} |")
    for opp in ("random", "minimax"):
        d = [a - b for a, b in zip(res["RLFT"][opp]["mean"], res["minimax SFT"][opp]["mean"], strict=True)]
        m, (lo, hi) = mean_ci95(d)
        lines.append(f"\nRLFT minus its start vs {opp}, per seed: {m:+.3f} [{lo:+.3f}, {hi:+.3f}]")
    print("\n".join(lines))
    args.out.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
