"""Iterative SPPO vs iterative DPO on self-play pairs, several seeds (an example study: the measured
SPPO rows of docs/methods/sppo.md come from ``turnrl compare``).

    python configs/sppo/study.py --config configs/sppo/study.yaml --out runs/sppo-study --seeds 0 1 2

Per seed S (OUT/seed-S/): ``turnrl sppo`` (SFT start, then SPPO iterations) and, from the same
SFT agent with the same samples budget, ``turnrl sppo loss=dpo`` (DPO on each task's
best-vs-worst sample by the same oracle). Seeds run in parallel processes (``--jobs``), every
run is resumable (rerun the command after a kill). Then OUT/study.json, OUT/study.md (mean
avg reward over seeds with 95% CIs, by iteration) and OUT/reward_by_iteration.png. The last
line printed is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any


def run_seed(config: Path, out: Path, seed: int) -> None:
    """SPPO and DPO of one seed, concurrently; DPO starts once SPPO has evaluated the shared
    SFT agent and drawn iteration 1's samples (the same agent and seed draw the same samples:
    they are copied, so both methods learn from identical iteration-1 data)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    d = out / f"seed-{seed}"
    base = [sys.executable, "-m", "turnrl", "sppo", "--config", str(config), f"seed={seed}"]
    with open(d.with_suffix(".log"), "a") as log:
        sppo = subprocess.Popen([*base, f"out={d / 'sppo'}"], env=env, stdout=log, stderr=log)
        dpo = d / "dpo"
        shared = [("eval_start.json", "eval_start.json.done.json", "eval_start-seen.jsonl", "eval_start-unseen.jsonl"),
                  ("iter-1/samples.jsonl", "iter-1/samples.jsonl.done.json")]
        for group in shared:
            while not (d / "sppo" / group[1]).exists() and sppo.poll() is None:
                time.sleep(5)
            for name in group:
                src, dst = d / "sppo" / name, dpo / name
                if src.exists() and not dst.exists():
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(src, dst)
        cmd = [*base, f"out={dpo}", "loss=dpo", f"model={d / 'sppo' / 'sft' / 'model'}"]
        rc_dpo = subprocess.run(cmd, env=env, stdout=log, stderr=log).returncode
        if sppo.wait() != 0 or rc_dpo != 0:
            raise RuntimeError(f"seed {seed}: a run failed; see {d.with_suffix('.log')}")


def _curve(run: Path, split: str) -> list[float]:
    """Avg reward on ``split`` of the start agent and of every finished iteration of a run."""
    files = [run / "eval_start.json"] + sorted(run.glob("iter-*/eval.json"), key=lambda p: int(p.parent.name[5:]))
    out = []
    for f in files:
        if not f.is_file():
            break
        out.append(next(r["avg_reward"] for r in json.loads(f.read_text())["results"] if r["split"] == split))
    return out


def aggregate(out: Path, seeds: list[int]) -> dict[str, Any]:
    """Mean and 95% CI over seeds of the seen-split reward by iteration (the iterations every
    seed has finished; a partial study aggregates what exists)."""
    from turnrl.stats import mean_ci95, overlap

    rows: list[dict[str, Any]] = []
    for m in ("sppo", "dpo"):
        curves = [_curve(out / f"seed-{s}" / m, "seen") for s in seeds]
        n = min(len(c) for c in curves)
        for i in range(n):
            if i == 0 and rows:
                continue  # the shared SFT start is listed once
            mean, ci = mean_ci95([c[i] for c in curves])
            rows.append({"method": "sft" if i == 0 else m, "iteration": i, "mean": mean, "ci95": list(ci),
                         "per_seed": [c[i] for c in curves]})
    by = {(r["method"], r["iteration"]): r for r in rows}
    sft = by[("sft", 0)]
    verdict: dict[str, Any] = {}
    for m in ("sppo", "dpo"):
        last = max((r["iteration"] for r in rows if r["method"] == m), default=0)
        if not last:
            continue
        r = by[(m, last)]
        diffs = [a - b for a, b in zip(r["per_seed"], sft["per_seed"], strict=True)]
        d_mean, d_ci = mean_ci95(diffs)
        verdict[m] = {"iteration": last, "mean": r["mean"], "ci95": r["ci95"],
                      # one seed gives no interval: no verdict (two points "apart" would read as a shown claim)
                      "above_sft_non_overlapping": None if len(seeds) < 2 else
                      r["mean"] > sft["mean"] and not overlap(tuple(r["ci95"]), tuple(sft["ci95"])),
                      "minus_sft_paired": {"mean": d_mean, "ci95": list(d_ci)}}
    result = {"seeds": seeds, "rows": rows, "verdict": verdict}
    (out / "study.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = ["| method | iteration | avg reward (seen), mean over seeds | 95% CI | per seed |", "|---|---:|---:|---|---|"]
    for r in rows:
        ci = "(one seed: no CI)" if len(seeds) < 2 else f"[{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]"
        lines.append(f"| {r['method']} | {r['iteration']} | {r['mean']:.3f} | {ci} | "
                     + ", ".join(f"{x:.2f}" for x in r["per_seed"]) + " |")
    (out / "study.md").write_text("\n".join(lines) + "\n\n" + json.dumps(verdict, indent=1) + "\n")
    plot(rows, out / "reward_by_iteration.png")
    return result


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    sft = next(r for r in rows if r["method"] == "sft")
    for m, color, dx in (("sppo", "tab:blue", -0.04), ("dpo", "tab:orange", 0.04)):
        pts = [sft] + [r for r in rows if r["method"] == m]
        if len(pts) == 1:
            continue
        xs = [r["iteration"] + dx for r in pts]
        ys = [r["mean"] for r in pts]
        err = [[y - r["ci95"][0] for y, r in zip(ys, pts, strict=True)],
               [r["ci95"][1] - y for y, r in zip(ys, pts, strict=True)]]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, color=color, label=f"iterative {m.upper()}")
    n_iter = max(r["iteration"] for r in rows)
    ax.set_xticks(range(n_iter + 1))
    ax.set_xticklabels(["SFT"] + [str(i) for i in range(1, n_iter + 1)])
    ax.set_xlabel("iteration")
    ax.set_ylabel("avg reward, seen split (mean, 95% CI over seeds)")
    ax.set_title("tic-tac-toe vs random opponent, tiny model")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", type=Path, default=Path(__file__).with_name("study.yaml"))
    ap.add_argument("--out", type=Path, default=Path("runs/sppo-study"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--jobs", type=int, default=3)
    ap.add_argument("--aggregate-only", action="store_true")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    for s in a.seeds:
        (a.out / f"seed-{s}").mkdir(parents=True, exist_ok=True)
    if not a.aggregate_only:
        with ThreadPoolExecutor(max_workers=a.jobs) as pool:
            list(pool.map(lambda s: run_seed(a.config.resolve(), a.out.resolve(), s), a.seeds))
    result = aggregate(a.out, a.seeds)
    print(json.dumps({"seeds": a.seeds, **result["verdict"]}))


if __name__ == "__main__":
    main()
