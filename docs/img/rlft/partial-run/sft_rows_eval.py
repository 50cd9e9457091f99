import json, sys, time, torch
torch.set_num_threads(1)
from transformers.utils import logging as hf_logging
hf_logging.set_verbosity_error()
from turnrl import envs
from turnrl.greedy_study import BANDIT_INSTRUCTION, bandit_eval
opts = {"arms": 10, "noise": "medium", "horizon": 20, "context": 3}
ids = envs.make("bandit", **opts).task_ids("seen")[:24]
out = {}
for label, model in (("greedy-like SFT", "study/sft-greedy/model"), ("UCB SFT", "study/sft-ucb/model")):
    t = time.time()
    r = bandit_eval(model, opts, ids, 16, BANDIT_INSTRUCTION)
    from turnrl.stats import mean_ci95
    out[label] = {"regret": mean_ci95(r["final_regret"]), "coverage": mean_ci95(r["final_coverage"]),
                  "actions_pct": r["actions_pct"], "invalid": r["invalid"], "s": time.time() - t}
    print(label, out[label], flush=True)
json.dump(out, open("evalrows.json", "w"), indent=1)
