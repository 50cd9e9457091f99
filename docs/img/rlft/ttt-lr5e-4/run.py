"""Issue 8's tic-tac-toe claim, a third design (27 Nov 2026; PREREGISTERED.txt beside this file).

The second design (``../ttt-minimax-start``) trained RLFT from the minimax SFT at ``turnrl train ppo``'s
defaults (lr 1e-4, beta_KL 0.05): the KL to the start stayed at most 0.16-0.24 nats a token and two of
three seeds never changed a greedy move. This design changes only PPO's lr to 5e-4 and beta_KL to 0.1
(the settings with which PPO stayed stable in the knowing-doing bandit design) and evaluates on 400
greedy games a seed against the random opponent instead of 100. It runs through the study's own
functions: the same data, the same minimax SFT (``plan_ttt``), PPO via ``_ppo``, games via ``_eval_ttt_job``.

    python docs/img/rlft/ttt-lr5e-4/run.py OUT            # two worker processes, one thread each

Writes ``OUT/results.json`` and prints the rows; the start is also evaluated on the second design's 100
games a seed (the identity check: 0.71 / 0.72 / 0.70 there).
"""

import json
from pathlib import Path

from turnrl import greedy_study as gs
from turnrl.errors import run_script
from turnrl.pipelines.iterative import check_settings
from turnrl.stats import mean_ci95

SEEDS = 3
CFG = {**gs.FULL, "ttt_games": 400, "ttt_ppo": {**gs.FULL["ttt_ppo"], "lr": 5e-4, "beta_kl": 0.1}}


def main(args: list[str]) -> None:
    if len(args) != 1:
        raise ValueError("expected one argument")
    out = Path(args[0])
    out.mkdir(parents=True, exist_ok=True)
    check_settings(out, {"design": "ttt-lr5e-4", "config": CFG})
    gs.collect_ttt(out, CFG)
    plan = gs.plan_ttt(out, SEEDS, CFG)
    g = CFG["ttt_ppo"]["max_new_tokens"]
    start = str(out / "ttt-sft-minimax" / "model")

    def game(label: str, model: str, s: int, games: int) -> tuple[str, object, tuple[object, ...]]:
        path = out / "eval" / f"{label}-random-{games}-s{s}.json"
        return f"eval {label} seed {s} ({games} games)", gs._eval_ttt_job, (str(path), model, "random", games, g, 1000 + s)

    check = [game("start", start, s, 100) for s in range(SEEDS)]
    evals = {"minimax SFT (the start)": [game("start", start, s, CFG["ttt_games"]) for s in range(SEEDS)],
             "RLFT": [game("rlft", str(out / f"ttt-rlft-s{s}" / "model"), s, CFG["ttt_games"]) for s in range(SEEDS)]}
    pool = gs._Pool(2, lambda s: print(s, flush=True))
    try:
        pool.run(plan["sft"])
        pool.run(plan["rl"] + check + evals["minimax SFT (the start)"])
        pool.run(evals["RLFT"])
    finally:
        pool.close()
    res: dict[str, dict[str, object]] = {}
    for label, tasks in {"start, 100 games (identity check)": check, **evals}.items():
        per = [json.loads(Path(t[2][0]).read_text()) for t in tasks]
        mean, ci = mean_ci95([p["mean"] for p in per])
        res[label] = {"per_seed": [p["mean"] for p in per], "mean": mean, "ci95": ci,
                      "invalid": [p["invalid"] for p in per], "win": [p["win"] for p in per]}
        print(f"{label}: {mean:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] per seed {res[label]['per_seed']} "
              f"invalid {res[label]['invalid']}")
    diffs = [a - b for a, b in zip(res["RLFT"]["per_seed"], res["minimax SFT (the start)"]["per_seed"], strict=True)]
    mean, ci = mean_ci95(diffs)
    res["paired"] = {"per_seed": diffs, "mean": mean, "ci95": ci}
    print(f"RLFT minus the start, per seed: {mean:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}] {diffs}")
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":  # the pool's workers are spawned and import this file
    run_script(main, "run.py OUT")
