"""Exploratory (not part of the pre-registered test): each seed's gain over its own SFT agent against that
agent's avg reward, from this folder's compare.json. Prints the correlations and writes gain_vs_start.png.

    python docs/img/compare/many-starts/gain_vs_start.py
"""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from turnrl.pipelines.compare import final_records  # noqa: E402  (a method's last iteration)

HERE = Path(__file__).parent
ROWS = {"eto": "ETO, iteration 2", "dmpo-g0.1-noisy": "DMPO γ = 0.1"}


def main() -> None:
    recs = json.loads((HERE / "compare.json").read_text())["results"]
    last = {(r["method"], r["seed"]): r["avg_reward"] for r in final_records(recs) if r["split"] == "seen"}
    seeds = sorted({s for m, s in last if m == "sft"})
    start = np.array([last[("sft", s)] for s in seeds])
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, label in ROWS.items():
        gain = np.array([last[(method, s)] for s in seeds]) - start
        r = np.corrcoef(start, gain)[0, 1]
        print(f"{label}: mean gain {gain.mean():+.3f}, correlation with the start {r:+.2f}, "
              f"{int((gain > 0).sum())} up / {int((gain < 0).sum())} down")
        ax.scatter(start, gain, label=f"{label} (r = {r:+.2f})")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("SFT agent's avg reward (400 seen games)")
    ax.set_ylabel("row minus its SFT agent")
    ax.set_title(f"{len(seeds)} starts of the quickstart's recipe")
    ax.legend()
    fig.tight_layout()
    fig.savefig(HERE / "gain_vs_start.png", dpi=120)


if __name__ == "__main__":
    main()
