"""The knowing-doing study's RLFT rows with other PPO settings, read on the 500 fresh instances (27 Nov 2026).

Trains the given rows and seeds from the study's start (rebuilt in OUT by the study's functions, or reused
when OUT already holds ``data/`` and ``sft-greedy/``) with ``gs.KNOWING_DOING``'s PPO settings changed by
the ``KEY=VALUE`` arguments, then reads every model greedily on the 500 instances of CONFIRM-500.txt
(``bandit-300000`` .. ``bandit-300499``).

    python docs/img/rlft/knowing-doing/ppo_variant.py OUT ROWS SEED [SEED ...] [KEY=VALUE ...]

ROWS is ``bonus``, ``plain`` or ``both`` (RLFT + bonus, RLFT, or both); a KEY is a ``turnrl train ppo``
key (``lr_schedule=constant``, ``iterations=40``, ...; values are read as JSON, else kept as text). Prints
per model regret@50, coverage@50, ``Low.`` acted on and the per-instance difference from the start (95%
CI over the 500 instances), and per row the mean over seeds with a Student-t CI; writes
``OUT/variant.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from eval_more_instances import eval_tasks, minus_start  # beside this script
from train_more_seeds import train_seeds

from turnrl import greedy_study as gs
from turnrl.errors import run_script
from turnrl.stats import mean_ci95

ROWS = {"bonus": ("RLFT + bonus",), "plain": ("RLFT",), "both": ("RLFT + bonus", "RLFT")}
TAGS = {"RLFT + bonus": "rlft-bonus", "RLFT": "rlft"}


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def run(out: Path, changes: dict[str, Any], rows: tuple[str, ...], seeds: list[int], summary_name: str,
        design: str, base: dict[str, Any] = gs.KNOWING_DOING, first: int = 300000, jobs: int = 2) -> dict[str, Any]:
    """Train ``rows`` x ``seeds`` from ``base``'s start with its PPO settings changed by ``changes``, read
    them and the start on the 500 instances from ``bandit-<first>``, in ``jobs`` processes; returns (and
    writes to ``OUT/summary_name``) the summary."""
    cfg = {**base, "ppo": {**base["ppo"], **changes}}
    ids = [f"bandit-{i}" for i in range(first, first + 500)]
    models = {label: [f"{TAGS[label]}-s{s}" for s in seeds] for label in rows}
    every = ["sft-greedy", *(m for ms in models.values() for m in ms)]
    parts = out / "eval-500"
    pool = gs._Pool(jobs, lambda s: print(s, flush=True))
    try:
        train_seeds(out, design, cfg, seeds, rows, pool, evaluate=False)
        pool.run(eval_tasks(out, parts, every, ids))
    finally:
        pool.close()
    summary: dict[str, Any] = {"changes": changes, "seeds": seeds}
    for m, (d, lo, hi) in zip(every[1:], minus_start(parts, every[1:]), strict=True):
        r = json.loads((parts / f"{m}.json").read_text())
        summary[m] = {"regret": float(np.mean(r["final_regret"])), "coverage": float(np.mean(r["final_coverage"])),
                      "moves_on_low": r.get("moves_on_low"), "minus_start": [d, lo, hi]}
        print(f"{m}: regret@50 {summary[m]['regret']:.2f}, coverage {summary[m]['coverage']:.2f}, "
              f"Low. acted on {r.get('moves_on_low', 0):.0%}, minus the start {d:+.2f} [{lo:+.2f}, {hi:+.2f}]")
    start = json.loads((parts / "sft-greedy.json").read_text())
    summary["sft-greedy"] = {"regret": float(np.mean(start["final_regret"])),
                             "coverage": float(np.mean(start["final_coverage"]))}
    print(f"start: regret@50 {summary['sft-greedy']['regret']:.2f}, coverage {summary['sft-greedy']['coverage']:.2f}")
    if len(seeds) > 1:
        for label, ms in models.items():
            row: dict[str, Any] = {}
            for key in ("regret", "coverage"):
                mean, (lo, hi) = mean_ci95([summary[m][key] for m in ms])
                row[key] = [mean, lo, hi]
            mean, (lo, hi) = mean_ci95([summary[m]["minus_start"][0] for m in ms])
            row["minus_start_per_seed"] = [mean, lo, hi]
            summary[label] = row
            print(f"{label}: regret@50 {row['regret'][0]:.2f} [{row['regret'][1]:.2f}, {row['regret'][2]:.2f}], "
                  f"coverage {row['coverage'][0]:.2f} [{row['coverage'][1]:.2f}, {row['coverage'][2]:.2f}], "
                  f"minus the start per seed {mean:+.2f} [{lo:+.2f}, {hi:+.2f}]")
    (out / summary_name).write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(args: list[str]) -> None:
    positional = [a for a in args if "=" not in a]
    if len(positional) < 3:
        raise ValueError("missing arguments")
    if positional[1] not in ROWS:
        raise ValueError(f"ROWS is one of {', '.join(ROWS)}, not {positional[1]!r}")
    changes = {k: _value(v) for k, _, v in (a.partition("=") for a in args if "=" in a)}
    unknown = sorted(set(changes) - set(gs.KNOWING_DOING["ppo"]) - {"lr_schedule", "warmup_ratio"})
    if unknown:
        raise ValueError(f"unknown or unsupported PPO key {unknown[0]!r}")
    run(Path(positional[0]), changes, ROWS[positional[1]], [int(s) for s in positional[2:]], "variant.json",
        "knowing-doing, " + ", ".join(f"{k}={v}" for k, v in sorted(changes.items())))


if __name__ == "__main__":  # the pool's workers are spawned and import this file
    run_script(main, "ppo_variant.py OUT bonus|plain|both SEED [SEED ...] [KEY=VALUE ...]")
