"""The exploratory reading that chose the screen's band (29 Nov 2026, before PREREGISTERED.txt; not a test).

    python docs/img/compare/screened/exploratory.py CONFIG OUT STAGE_JSON SEED [SEED ...]

CONFIG and OUT are the 600-task design's (configs/compare/tictactoe_sppo600.yaml, runs/compare/sppo600);
STAGE_JSON is its compare.json over all 38 seeds (docs/img/compare/sppo600/stage3/compare.json). Each
seed's SFT agent plays the screen's 400 validation games (run.py's ``validation_reward``; the games of
each go to OUT/screen-exploratory/). It prints, per seed, the validation reward, the SFT agent's and SPPO
iteration 3's reward on the seen games, their correlation, and for a few bands of validation reward the
rows' means and spreads with the share of 2,000 resamples of n in-band seeds whose rows' CIs part.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import validation_reward  # noqa: E402

from turnrl.errors import run_script  # noqa: E402
from turnrl.stats import mean_ci95  # noqa: E402

USAGE = "exploratory.py CONFIG OUT STAGE_JSON SEED [SEED ...]"
BANDS = [(0.0, 0.84), (0.60, 0.86), (0.65, 0.84), (0.70, 0.84), (0.70, 0.86), (0.0, 1.01)]


def parts(seeds: list[int], sft: dict[int, float], sppo: dict[int, float], n: int, draws: int = 2000) -> float:
    """Share of ``draws`` resamples of ``n`` of ``seeds`` whose SPPO CI lies above the SFT CI."""
    rng, hits = random.Random(0), 0
    for _ in range(draws):
        pick = [rng.choice(seeds) for _ in range(n)]
        hits += mean_ci95([sppo[s] for s in pick])[1][0] > mean_ci95([sft[s] for s in pick])[1][1]
    return hits / draws


def main(argv: list[str]) -> None:
    from turnrl.config import load_config
    from turnrl.pipelines.compare import CompareConfig

    if len(argv) < 4:
        raise ValueError("give CONFIG, OUT, STAGE_JSON and at least one SEED")
    config, out, stage = argv[0], Path(argv[1]), Path(argv[2])
    seeds = [int(s) for s in argv[3:]]
    cfg = load_config(CompareConfig, config, [f"out={out}"])
    records = json.loads(stage.read_text())["results"]
    sft = {r["seed"]: r["avg_reward"] for r in records if r["method"] == "sft" and r["split"] == "seen"}
    sppo = {r["seed"]: r["avg_reward"] for r in records
            if r["method"] == "sppo" and r.get("iteration") == 3 and r["split"] == "seen"}
    (out / "screen-exploratory").mkdir(exist_ok=True)
    val = {}
    for s in seeds:
        pipe = cfg.pipeline.model_copy(update={"seed": s})
        val[s] = validation_reward(pipe, str(out / f"seed-{s}" / "sft" / "model"),
                                   out / "screen-exploratory" / f"seed-{s}-games.jsonl")
    print("seed   validation  SFT    SPPO it3  gain")
    for s in sorted(seeds, key=val.__getitem__):
        print(f"{s}  {val[s]:.4f}      {sft[s]:.3f}  {sppo[s]:.3f}     {sppo[s] - sft[s]:+.3f}")
    xs = [val[s] for s in seeds]
    print(f"r(validation, SFT) = {statistics.correlation(xs, [sft[s] for s in seeds]):.2f}; "
          f"r(validation, gain) = {statistics.correlation(xs, [sppo[s] - sft[s] for s in seeds]):.2f}")
    for lo, hi in BANDS:
        band = [s for s in seeds if lo <= val[s] < hi]
        a, b = [sft[s] for s in band], [sppo[s] for s in band]
        share = ", ".join(f"n={n}: {parts(band, sft, sppo, n):.2f}" for n in (10, 12, 14, 16))
        print(f"[{lo:.2f}, {hi:.2f}): {len(band)} seeds; SFT {statistics.mean(a):.3f} (SD {statistics.stdev(a):.3f}), "
              f"SPPO {statistics.mean(b):.3f} (SD {statistics.stdev(b):.3f}), gain {statistics.mean(b) - statistics.mean(a):+.3f}; "
              f"rows part in {share}")


if __name__ == "__main__":
    run_script(main, USAGE, sys.argv[1:])
