"""The exploratory reading that chose the second screened run's band and size (29 Nov 2026, before
PREREGISTERED.txt beside this script; not a test).

    python docs/img/compare/screened2/exploratory.py > docs/img/compare/screened2/exploratory.txt

It pools the 48 SFT starts that ran SPPO in the 600-task design: the 38 of ../sppo600/ (their
validation rewards in ../screened/exploratory.txt) and the 10 of the first screened run
(../screened/screen.txt and paired.txt). For each candidate band [LO, HI) of validation reward it prints
the in-band seeds' SFT and SPPO iteration-3 rows, the share of the 60 screened candidates the band
would accept (the 48, plus the first run's 12 screened out), and how often the rows' 95% CIs part when
n seeds are drawn with replacement from the band. Both the bands and the resampling are in-sample:
the shares are optimistic.
"""

import random
import statistics as st
from pathlib import Path

from turnrl.stats import mean_ci95

HERE = Path(__file__).resolve().parent
FIRST = HERE.parent / "screened"
BANDS = [(0.60, 0.78), (0.60, 0.80), (0.65, 0.80), (0.65, 0.84), (0.70, 0.80), (0.70, 0.84), (0.0, 0.80), (0.0, 0.84)]
SIZES = (6, 8, 10, 12, 16)
DRAWS = 4000
# process-minutes of one screened candidate and of an accepted seed's SPPO (the first screened run)
SCREEN_MIN, SPPO_MIN = 5.0, 21.0


def _rows(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines() if line[:1].isdigit()]


def starts() -> tuple[list[tuple[float, float, float]], list[float]]:
    """(validation, SFT, SPPO iteration 3) of every start that ran SPPO; every candidate's validation."""
    data = [(float(v), float(a), float(b)) for _, v, a, b, _ in _rows(FIRST / "exploratory.txt")]
    screen = {int(r[0]): float(r[1]) for r in _rows(FIRST / "screen.txt")}
    paired = [r for r in _rows(FIRST / "paired.txt") if len(r) == 5]
    data += [(screen[int(r[0])], float(r[1]), float(r[4])) for r in paired]
    return data, [d[0] for d in data[:38]] + list(screen.values())


def main() -> None:
    data, candidates = starts()
    rng = random.Random(0)
    print(f"{len(data)} starts with SPPO, {len(candidates)} screened candidates")
    for lo, hi in BANDS:
        band = [d for d in data if lo <= d[0] < hi]
        share = sum(lo <= v < hi for v in candidates) / len(candidates)
        per_250 = share / (SCREEN_MIN + SPPO_MIN * share) * 250
        parts = []
        for n in SIZES:
            hits = 0
            for _ in range(DRAWS):
                draw = [rng.choice(band) for _ in range(n)]
                hits += mean_ci95([d[2] for d in draw])[1][0] > mean_ci95([d[1] for d in draw])[1][1]
            parts.append(f"n={n}: {hits / DRAWS:.2f}")
        print(f"[{lo:.2f}, {hi:.2f}): {len(band)} seeds, accepts {share:.2f} ({per_250:.1f} seeds per 250 "
              f"process-minutes); SFT {st.mean(d[1] for d in band):.3f} (SD {st.stdev(d[1] for d in band):.3f}), "
              f"SPPO {st.mean(d[2] for d in band):.3f} (SD {st.stdev(d[2] for d in band):.3f}), gain "
              f"{st.mean(d[2] - d[1] for d in band):+.3f}; rows part in " + ", ".join(parts))


if __name__ == "__main__":
    main()
