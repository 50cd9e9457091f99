"""A third ETO iteration after the pre-registered takeover run (exploratory, read after its test).

usage: python docs/img/compare/takeover/iteration3.py CONFIG OUT NEW_OUT SEED [SEED ...] [key=value ...]

For each seed of the ``turnrl compare`` run in OUT (made with CONFIG and the overrides), ETO's
iteration 3 starts from its iteration-2 agent (OUT/seed-S/eto/iter-2) and writes
NEW_OUT/seed-S/eto/iter-3 (explore, takeovers, pairs, train, eval), leaving OUT as it was; then
prints each seed's SFT and iteration 1-3 avg rewards (seen) and the mean change from SFT with a
95% CI across the seeds.
"""

from __future__ import annotations

import json
from pathlib import Path

from turnrl.errors import run_script


def main(argv: list[str]) -> None:
    from turnrl.pipelines.compare import script_args
    from turnrl.pipelines.eto import run_iteration
    from turnrl.stats import mean_ci95

    if len(argv) < 4:
        raise ValueError("give CONFIG OUT NEW_OUT and at least one SEED")
    new_out = Path(argv[2])
    cfg, out, seeds = script_args([argv[0], argv[1], *argv[3:]])

    def reward(p: Path) -> float:
        return float(json.loads(p.read_text())["results"][0]["avg_reward"])

    rows = []
    for seed in seeds:
        d = Path(out) / f"seed-{seed}"
        pipe = cfg.pipeline.model_copy(update={"seed": seed, "base": str(Path(out) / "tiny"), "loss": "dpo"})
        start = json.loads((d / "eto" / "iter-2" / "train.done.json").read_text())["result"]
        run_iteration(pipe, new_out / f"seed-{seed}" / "eto", 3, start, d / "expert.jsonl", label="eto-iter3")
        r = [reward(d / "sft-eval.json"), reward(d / "eto" / "iter-1" / "eval.json"),
             reward(d / "eto" / "iter-2" / "eval.json"), reward(new_out / f"seed-{seed}" / "eto" / "iter-3" / "eval.json")]
        rows.append(r)
        print(f"seed {seed}: sft {r[0]:.4f}, iteration 1 {r[1]:.4f}, 2 {r[2]:.4f}, 3 {r[3]:.4f}", flush=True)
    for i in (1, 2, 3):
        m, ci = mean_ci95([r[i] - r[0] for r in rows])
        print(f"iteration {i} minus SFT over {len(rows)} seeds: {m:+.4f} [{ci[0]:+.4f}, {ci[1]:+.4f}], "
              f"{sum(r[i] > r[0] for r in rows)} up, {sum(r[i] < r[0] for r in rows)} down")


if __name__ == "__main__":
    run_script(main, "iteration3.py CONFIG OUT NEW_OUT SEED [SEED ...] [key=value ...]")
