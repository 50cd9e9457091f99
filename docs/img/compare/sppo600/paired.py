"""The reading of the pre-registered 600-task SPPO run (PREREGISTERED.txt): tests T9 and P, and where
each row's lost games come from.

    python docs/img/compare/sppo600/paired.py OUT [SEED ...]

OUT is the `turnrl compare` directory (runs/compare/sppo600); SEEDs, if given, restrict the reading to
those seeds (T9-new of the second and third stages, PREREGISTERED2.txt and PREREGISTERED3.txt). It prints each seed's SFT agent and SPPO
agent by iteration (greedy avg reward on the 200 seen games), both rows' means with a 95% CI across the
seeds, the paired difference, the two tests' verdicts, and per row the lost games split into those
lost by an invalid move and those lost on the board.
"""

import json
import sys
from pathlib import Path

from turnrl.errors import TurnRLError, run_script
from turnrl.stats import mean_ci95

USAGE = "paired.py OUT [SEED ...]"


def _games(path: Path) -> tuple[int, int, int]:
    """Games, games lost by an invalid move, games lost on the board."""
    games = invalid = board = 0
    with path.open() as f:
        for line in f:
            t = json.loads(line)
            games += 1
            if t["return"] < 0:
                bad = any(m["role"] == "assistant" and not m.get("valid", True) for m in t["messages"])
                invalid += bad
                board += not bad
    return games, invalid, board


def _ci(values: list[float]) -> str:
    m, (lo, hi) = mean_ci95(values)
    return f"{m:.3f} [{lo:.3f}, {hi:.3f}]"


def main(argv: list[str]) -> None:
    if not argv:
        raise ValueError("give OUT")
    out = Path(argv[0])
    try:
        only = {int(a) for a in argv[1:]}
    except ValueError:
        raise ValueError(f"a SEED is an integer: {' '.join(argv[1:])}") from None
    if not (out / "compare.json").is_file():
        raise TurnRLError(f"{out}/compare.json: missing; run the compare command first")
    records = [r for r in json.loads((out / "compare.json").read_text())["results"] if r["split"] == "seen"]
    value = {(r["method"], r["seed"], r.get("iteration", 0)): r["avg_reward"] for r in records}
    seeds = sorted({s for (m, s, _) in value if m == "sft" and (not only or s in only)})
    if only - set(seeds):
        raise TurnRLError(f"{out}/compare.json: no SFT record of seed(s) {sorted(only - set(seeds))}")
    last = max((i for (m, s, i) in value if m == "sppo" and s in seeds), default=0)
    if last == 0:
        raise TurnRLError(f"{out}/compare.json: no SPPO record; run the compare command with method sppo first")
    short = [s for s in seeds if ("sppo", s, last) not in value]
    if only and short:  # a named seed is in the test or the command is wrong: never dropped in silence
        raise TurnRLError(f"{out}/compare.json: no SPPO iteration {last} of named seed(s) {short}")
    seeds = [s for s in seeds if ("sppo", s, last) in value]
    if len(seeds) < 3:
        raise TurnRLError(f"{out}/compare.json: {len(seeds)} seeds with SPPO's iteration {last}; the test needs 3")
    sft = [value[("sft", s, 0)] for s in seeds]
    sppo = [value[("sppo", s, last)] for s in seeds]
    print(f"seeds {seeds}; greedy avg reward on the seen games; SPPO iteration {last}")
    print("seed    SFT    " + "  ".join(f"it {i}" for i in range(1, last + 1)))
    for s, a in zip(seeds, sft, strict=True):
        print(f"{s}  {a:.3f}  " + "  ".join(f"{value[('sppo', s, i)]:.3f}" for i in range(1, last + 1)))
    for i in range(1, last + 1):
        print(f"SPPO iteration {i}: {_ci([value[('sppo', s, i)] for s in seeds])}")
    hs, lp = mean_ci95(sft)[1][1], mean_ci95(sppo)[1][0]
    diff = [b - a for a, b in zip(sft, sppo, strict=True)]
    md, (ld, hd) = mean_ci95(diff)
    print(f"SFT {_ci(sft)}   SPPO {_ci(sppo)}")
    print(f"T9 (rows apart, SPPO above): {'PASS' if lp > hs else 'FAIL'} (SPPO's lower end {lp:.3f}, SFT's upper "
          f"end {hs:.3f})")
    print(f"P (paired above 0): {'PASS' if ld > 0 else 'FAIL'}  {md:+.3f} [{ld:+.3f}, {hd:+.3f}]  up "
          f"{sum(d > 0 for d in diff)} / equal {sum(d == 0 for d in diff)} / down {sum(d < 0 for d in diff)}")
    for name, rel in (("SFT", "sft-eval-seen.jsonl"), ("SPPO", f"sppo/iter-{last}/eval-seen.jsonl")):
        missing = [s for s in seeds if not (out / f"seed-{s}" / rel).is_file()]
        if missing:  # a copy of the aggregates (docs/img) holds no games: the tests above stand alone
            print(f"{name}: no games to count where they were lost ({out}/seed-{missing[0]}/{rel} is missing)")
            continue
        counts = [_games(out / f"seed-{s}" / rel) for s in seeds]
        games, invalid, board = (sum(c[k] for c in counts) for k in range(3))
        print(f"{name}: {games} games, lost {invalid + board}: {invalid} by an invalid move, {board} on the board; "
              f"per seed invalid-move losses {[c[1] for c in counts]}")


if __name__ == "__main__":
    run_script(main, USAGE, sys.argv[1:])
