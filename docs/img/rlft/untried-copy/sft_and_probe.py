"""The start of the untried-copy design (docs/rlft.md, 27 Nov 2026): the study's own data and SFT
stages (``--design untried-copy``) into OUT, then, before any PPO run, what the start does:

* regret@50 / coverage / action shares on the study's 20 first seen instances, greedy;
* the best-summary design's probe (120 random states with 1-6 tried arms), greedy, and sampled at
  temperature 1 with 4 replies a state: per rationale word, how many replies play the arm it names
  (the best arm after ``Best.``, an untried arm after ``Untried.``).

    python docs/img/rlft/untried-copy/sft_and_probe.py OUT

(run as measured: ``runs/ucd`` with the config of commit be1e3f8, 1500 SFT steps, output in probe/start-1500.txt;
``runs/ucd2`` with 3000 steps, probe/start-3000.txt; both with OMP_NUM_THREADS=2.)
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import numpy as np

import turnrl.greedy_study as g
from turnrl import envs
from turnrl.errors import run_script

_spec = importlib.util.spec_from_file_location("bs_probe", Path(__file__).parents[1] / "best-summary" / "sft_and_probe.py")
assert _spec is not None and _spec.loader is not None
bs_probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bs_probe)


def main(args: list[str]) -> None:
    if len(args) != 1:
        raise ValueError("expected one output folder")
    out, cfg = Path(args[0]), g.UNTRIED_COPY
    env_opts = dict(cfg["bandit_env"])
    g.collect_bandit(out, cfg)
    print(f"SFT data: {g.check_budget(out / 'data' / 'greedy.jsonl', 16)} (budget check)")
    t = time.time()
    model = g._sft(out / "data" / "greedy.jsonl", out / "sft-greedy", cfg["sft_steps"], cfg["sft_lr"], cfg["sft_batch"])
    print(f"SFT: {time.time() - t:.0f} s")
    ids = envs.make("bandit", **env_opts).task_ids("seen")[:20]
    r = g.bandit_eval(model, env_opts, ids, 16, g.BANDIT_INSTRUCTION)
    print(f"regret@50 {np.mean(r['final_regret']):.2f}, coverage {np.mean(r['final_coverage']):.2f}, "
          f"actions % {r['actions_pct']}, invalid {r['invalid']:.2f}, said {r.get('said')}")
    for temperature, repeats in ((0.0, 1), (1.0, 4)):
        for word, (n, k) in bs_probe.probe(model, env_opts=env_opts, temperature=temperature, repeats=repeats).items():
            print(f"probe T={temperature:g}: {word!r} {n} replies, {k} play the arm it names")


if __name__ == "__main__":
    run_script(main, "sft_and_probe.py OUT")
