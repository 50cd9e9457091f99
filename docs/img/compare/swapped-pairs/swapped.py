"""A control for ETO's first iteration: the same DPO step on the same pairs with their sides swapped.

For each seed of a `turnrl compare` run that ran `eto`, trains the seed's SFT agent with DPO on
`OUT/seed-S/eto/iter-1/pairs.jsonl` with every pair's chosen and rejected sides exchanged (same
settings, same seed, so the same batches in the same order), plays the run's seen games greedily
(`OUT/seed-S/swapped/`, resumable stages), and prints, per seed and averaged over the seeds with a
95% CI: SFT, ETO's first iteration and the swapped step, each as the change from the seed's SFT agent.
It then reads the same three agents sampling at temperature 1 on the same games (torch seeded alike
for the three), the policy DPO's objective is about.

If greedy play after one step moved with the direction of the preference, the swapped step would
lower the agents that ETO raises. If both steps move the agents by about as much, in either
direction, what one step does to greedy play is not the preference's doing.

    python docs/img/compare/swapped-pairs/swapped.py CONFIG OUT SEED [SEED ...] [key=value ...]

CONFIG and the key=value overrides are those of the `turnrl compare` command that made OUT.
"""

import json
from functools import partial
from pathlib import Path

from turnrl.data.io import read_pairs, write_jsonl
from turnrl.data.schema import Pair
from turnrl.errors import TurnRLError, run_script
from turnrl.pipelines.compare import script_args, seed_run
from turnrl.pipelines.eto import EtoConfig, evaluate_model, train_iteration
from turnrl.pipelines.iterative import run_stage
from turnrl.stats import mean_ci95

USAGE = "swapped.py CONFIG OUT SEED [SEED ...] [key=value ...]"
SAMPLED = "sampled-T1"  # one label, so one torch seed, for the three agents' sampled games


def _seen(records: list[dict]) -> float:
    return next(r["avg_reward"] for r in records if r["split"] == "seen")


def _swap(src: Path, out: Path) -> dict[str, int]:
    pairs = [Pair(p.task_id, p.rejected, p.chosen, {**p.meta, "swapped": True}) for p in read_pairs(src)]
    write_jsonl(out, pairs)
    return {"pairs": len(pairs)}


def main(argv: list[str]) -> None:
    cfg, out, seeds = script_args(argv)
    rows: dict[str, list[float]] = {"sft": [], "eto": [], "swapped": []}
    sampled: dict[str, list[float]] = {"sft": [], "eto": [], "swapped": []}
    for seed in seeds:
        eto_dir = Path(out) / f"seed-{seed}" / "eto"
        if not (eto_dir / "iter-1" / "eval.json.done.json").is_file():
            raise TurnRLError(f"{eto_dir}/iter-1: unfinished; run the compare command for seed {seed} first")
        run = seed_run(cfg, seed)
        eto_cfg = EtoConfig.model_validate(json.loads((eto_dir / "summary.json").read_text())["config"])
        d = run.dir / "swapped"
        pairs = d / "pairs.jsonl"
        run_stage(pairs, partial(_swap, eto_dir / "iter-1" / "pairs.jsonl"))
        model = run_stage(d / "train", lambda o, c=eto_cfg, m=run.sft, p=pairs: train_iteration(c, c.loss, m, p, o, 1))
        recs = run_stage(d / "eval.json", lambda o, c=eto_cfg, m=model: evaluate_model(c, m, o, "swapped"))
        sft = _seen(json.loads((run.dir / "sft-eval.json").read_text())["results"])
        eto = _seen(json.loads((eto_dir / "iter-1" / "eval.json").read_text())["results"])
        rows["sft"].append(sft)
        rows["eto"].append(eto)
        rows["swapped"].append(_seen(recs))
        # the same three agents sampled at temperature 1 on the same games, torch seeded alike for each
        models = {"sft": run.sft, "eto": str(eto_dir / "iter-1" / "train" / "model"), "swapped": model}
        for name, m in models.items():
            play = partial(evaluate_model, eto_cfg, m, label=SAMPLED, temperature=1.0)
            sampled[name].append(_seen(run_stage(d / f"sampled-{name}.json", play)))
        print(f"seed {seed}: greedy SFT {sft:.4f}  ETO iteration 1 {eto - sft:+.4f}  swapped {_seen(recs) - sft:+.4f}"
              f"  | sampled SFT {sampled['sft'][-1]:.4f}  ETO {sampled['eto'][-1] - sampled['sft'][-1]:+.4f}  "
              f"swapped {sampled['swapped'][-1] - sampled['sft'][-1]:+.4f}")
    for reading, r in (("greedy", rows), ("sampled", sampled)):
        for name in ("eto", "swapped"):
            diff = [b - a for a, b in zip(r["sft"], r[name], strict=True)]
            m, (lo, hi) = mean_ci95(diff)
            mabs = sum(abs(x) for x in diff) / len(diff)
            print(f"{reading:8s} {name:8s} minus SFT {m:+.4f} [{lo:+.4f}, {hi:+.4f}]  mean |change| {mabs:.4f}  up "
                  f"{sum(x > 0 for x in diff)} / down {sum(x < 0 for x in diff)}")


if __name__ == "__main__":
    run_script(main, USAGE)
