"""Greedy evaluation of the study's two SFT rows at horizon 20 on 24 seen instances
(docs/rlft.md). Run from the study's output directory (it reads study/sft-*/model);
writes evalrows.json."""

import json
import time

import torch
from transformers.utils import logging as hf_logging

from turnrl import envs
from turnrl.greedy_study import BANDIT_INSTRUCTION, bandit_eval
from turnrl.stats import mean_ci95

torch.set_num_threads(1)
hf_logging.set_verbosity_error()
opts = {"arms": 10, "noise": "medium", "horizon": 20, "context": 3}
ids = envs.make("bandit", **opts).task_ids("seen")[:24]
out = {}
for label, model in (("greedy-like SFT", "study/sft-greedy/model"), ("UCB SFT", "study/sft-ucb/model")):
    t = time.time()
    r = bandit_eval(model, opts, ids, 16, BANDIT_INSTRUCTION)
    out[label] = {"regret": mean_ci95(r["final_regret"]), "coverage": mean_ci95(r["final_coverage"]),
                  "actions_pct": r["actions_pct"], "invalid": r["invalid"], "s": time.time() - t}
    print(label, out[label], flush=True)
with open("evalrows.json", "w") as f:
    json.dump(out, f, indent=1)
