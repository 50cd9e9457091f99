"""The greedy reading of a sampled `turnrl compare` run of SFT and SPPO (PREREGISTERED.txt, D2).

Plays each seed's SFT agent and SPPO's final agent greedily on the run's seen games (the pipeline's
`eval_seed`, `eval_greedy` games: the 200 seen tasks once), writes OUT/seed-S/greedy-{sft,sppo}.json
(resumable stages), then prints both readings side by side: each row's mean over seeds with a 95% CI
across seeds, and SPPO minus the same seed's SFT, paired across seeds.

    python docs/img/compare/sppo-sampled/greedy_reading.py CONFIG OUT SEED [SEED ...] [key=value ...]

CONFIG and the key=value overrides are those of the `turnrl compare` command that made OUT.
"""

import json
from functools import partial
from pathlib import Path

from turnrl.errors import TurnRLError, run_script
from turnrl.pipelines.compare import final_records, script_args, seed_run
from turnrl.pipelines.eto import evaluate_model
from turnrl.pipelines.iterative import run_stage
from turnrl.pipelines.sppo import compare_config
from turnrl.stats import mean_ci95

USAGE = "greedy_reading.py CONFIG OUT SEED [SEED ...] [key=value ...]"

EVAL_GREEDY = 200  # greedy play of the 200 seen tasks is deterministic: each once


def _avg(records: list[dict]) -> float:
    return next(r["avg_reward"] for r in records if r["split"] == "seen")


def main(argv: list[str]) -> None:
    cfg, out, seed_list = script_args(argv)
    sampled = json.loads((Path(out) / "compare.json").read_text())["results"]
    last = {(r["method"], r["seed"]): r["avg_reward"] for r in final_records(sampled) if r["split"] == "seen"}
    rows: dict[str, dict[str, list[float]]] = {"sampled": {"sft": [], "sppo": []}, "greedy": {"sft": [], "sppo": []}}
    for seed in seed_list:
        if ("sppo", seed) not in last:  # before seed_run, which would train a missing seed's SFT agent
            raise TurnRLError(f"{out}/compare.json: no SPPO record of seed {seed}; run the compare command for it first")
        run = seed_run(cfg, seed)
        pipe = run.pipe.model_copy(update={"eval_episodes": EVAL_GREEDY, "eval_splits": ["seen"]})
        sppo_cfg = compare_config(run)  # where the comparison ran SPPO, and for how many iterations
        sppo = Path(sppo_cfg.out) / f"iter-{sppo_cfg.iterations}" / "train" / "model"
        if not sppo.is_dir():
            raise TurnRLError(f"{sppo}: missing; run the compare command for seed {seed} first")
        for name, model in (("sft", run.sft), ("sppo", str(sppo))):
            play = partial(evaluate_model, pipe, model, label=f"greedy-{name}", temperature=0.0)
            recs = run_stage(run.dir / f"greedy-{name}.json", play)
            rows["greedy"][name].append(_avg(recs))
            rows["sampled"][name].append(last[(name, seed)])
    print(f"seeds {seed_list}; sampled: {cfg.pipeline.eval_episodes} games at temperature "
          f"{cfg.pipeline.eval_temperature:g}; greedy: {EVAL_GREEDY} games")
    for reading, r in rows.items():
        diff = [b - a for a, b in zip(r["sft"], r["sppo"], strict=True)]
        (ms, cs), (mp, cp), (md, cd) = mean_ci95(r["sft"]), mean_ci95(r["sppo"]), mean_ci95(diff)
        print(f"{reading:8s} SFT {ms:.3f} [{cs[0]:.3f}, {cs[1]:.3f}]  SPPO {mp:.3f} [{cp[0]:.3f}, {cp[1]:.3f}]  "
              f"paired {md:+.3f} [{cd[0]:+.3f}, {cd[1]:+.3f}]  up {sum(d > 0 for d in diff)} / down "
              f"{sum(d < 0 for d in diff)}")
        print(f"{'':8s} per seed SFT {' '.join(f'{v:.4f}' for v in r['sft'])}")
        print(f"{'':8s} per seed SPPO {' '.join(f'{v:.4f}' for v in r['sppo'])}")


if __name__ == "__main__":
    run_script(main, USAGE)
