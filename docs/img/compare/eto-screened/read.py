"""The reading of the screened ETO/DMPO run (PREREGISTERED.txt beside this script): each seed's rows and the
paired differences from SFT; the tests T1 and T2 themselves are in the aggregating command's compare.md.

    python docs/img/compare/eto-screened/read.py OUT SEED [SEED ...]

OUT is the `turnrl compare` directory (runs/compare/eto-screened) after the aggregating command; the SEEDs
are the test's (the screen driver's `list --accept N`). A named seed without every row is an error, never
dropped in silence.
"""

import json
import sys
from pathlib import Path

from turnrl.errors import TurnRLError, run_script
from turnrl.stats import mean_ci95

USAGE = "read.py OUT SEED [SEED ...]"
ROWS = [("sft", None), ("eto", 1), ("eto", 2), ("dmpo-g0.1-noisy", 1), ("dmpo-g0.1-noisy", 2)]


def _ci(values: list[float], sign: str = "") -> str:
    m, (lo, hi) = mean_ci95(values)
    return f"{m:{sign}.3f} [{lo:{sign}.3f}, {hi:{sign}.3f}]"


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise ValueError("give OUT and the test's SEEDs")
    out = Path(argv[0])
    try:
        seeds = [int(a) for a in argv[1:]]
    except ValueError:
        raise ValueError(f"a SEED is an integer: {' '.join(argv[1:])}") from None
    if not (out / "compare.json").is_file():
        raise TurnRLError(f"{out}/compare.json: missing; run the aggregating compare command first")
    value = {(r["method"], r["seed"], r.get("iteration")): r["avg_reward"]
             for r in json.loads((out / "compare.json").read_text())["results"] if r["split"] == "seen"}
    missing = [(m, s, i) for s in seeds for m, i in ROWS if (m, s, i) not in value]
    if missing:
        raise TurnRLError(f"{out}/compare.json: no record of {missing[0]} (and {len(missing) - 1} more)")
    print("seed   sft     eto 1   eto 2   dmpo 1  dmpo 2")
    for s in seeds:
        print(f"{s}  " + "  ".join(f"{value[(m, s, i)]:.4f}" for m, i in ROWS))
    sft = [value[("sft", s, None)] for s in seeds]
    for m, i in ROWS:
        row = [value[(m, s, i)] for s in seeds]
        line = f"{m} {i or ''}".strip() + f": {_ci(row)}"
        if m != "sft":
            diff = [b - a for a, b in zip(sft, row, strict=True)]
            line += (f"   paired {_ci(diff, '+')}   up {sum(d > 0 for d in diff)} / equal "
                     f"{sum(d == 0 for d in diff)} / down {sum(d < 0 for d in diff)}")
        print(line)


if __name__ == "__main__":
    run_script(main, USAGE, sys.argv[1:])
