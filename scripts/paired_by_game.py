"""Rows of a ``turnrl compare`` run minus its SFT agent, paired game by game.

    python scripts/paired_by_game.py runs/osE --row eto=eto/iter-2/eval-seen.jsonl \
        --row dmpo-g0.1=dmpo-g0.1-noisy/iter-1/eval-seen.jsonl

``compare.md``'s paired column has a 95% CI across seeds: how the gain varies with the runs'
randomness. When every seed starts from one SFT agent (``sft_seed``) and trains nearly the same
agent, that CI can be narrow while the gain rests on a few of the evaluation games. This script
gives the other CI: for each evaluation game, the row's return minus the SFT agent's on that game
(the same game for both: same task and env seed), averaged over the seeds; then the mean over
games with a 95% CI across games (:func:`turnrl.stats.paired_by_unit`), and how many games go up
and down. Paths are relative to each ``OUT/seed-S/`` folder; a seed without every file is left
out and named.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from turnrl.data.io import iter_trajectories
from turnrl.errors import TurnRLError
from turnrl.stats import paired_by_unit


def returns_by_game(path: Path) -> dict[tuple[str, str, object], float]:
    """Each game's return in an evaluation file, keyed by (split, task, env seed). A game played more
    than once (Best-of-N's N samples of it) counts with its best return, as compare's row does."""
    out: dict[tuple[str, str, object], float] = {}
    for t in iter_trajectories(path):
        key = (t.split, t.task_id, t.meta.get("seed"))
        out[key] = max(out.get(key, t.return_), t.return_)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="a turnrl compare output directory")
    ap.add_argument("--row", action="append", required=True, metavar="NAME=PATH",
                    help="a row's evaluation trajectories, relative to OUT/seed-S (repeatable)")
    ap.add_argument("--sft", default="sft-eval-seen.jsonl", help="the SFT agent's, relative to OUT/seed-S")
    args = ap.parse_args(argv)
    try:
        rows = dict(_split_row(r) for r in args.row)
        seeds = sorted((d for d in args.out.glob("seed-*") if d.name[5:].isdigit()), key=lambda d: int(d.name[5:]))
        if not seeds:
            raise TurnRLError(f"{args.out}: no seed-S folders")
        print("| row | seeds | games | minus SFT by game [95% CI across games] | games up / equal / down |")
        print("|---|---:|---:|---|---|")
        for name, rel in rows.items():
            have = [d for d in seeds if (d / rel).is_file() and (d / args.sft).is_file()]
            missing = [d.name for d in seeds if d not in have]
            if not have:
                raise TurnRLError(f"{args.out}: no seed has both {rel} and {args.sft}")
            treated = [returns_by_game(d / rel) for d in have]
            control = [returns_by_game(d / args.sft) for d in have]
            mean, (lo, hi), n, up, down = paired_by_unit(treated, control)
            note = f" (left out: {', '.join(missing)})" if missing else ""
            print(f"| {name}{note} | {len(have)} | {n} | {mean:+.3f} [{lo:+.3f}, {hi:+.3f}] | "
                  f"{up} / {n - up - down} / {down} |")
    except TurnRLError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _split_row(text: str) -> tuple[str, str]:
    name, sep, path = text.rpartition("=")  # a name may hold "=" (gamma = 0.1), a path not
    if not sep or not name or not path:
        raise TurnRLError(f"--row {text!r}: expected NAME=PATH")
    return name, path


if __name__ == "__main__":
    sys.exit(main())
