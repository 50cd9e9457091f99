"""Evaluate some rows of the greedy-agents study on fewer instances (docs/rlft.md).

The measured run of ``turnrl study greedy`` could not evaluate every row on its 50
instances in the time available; this evaluates the given models with the study's own
``bandit_eval`` (greedy decoding, the FULL env) on the first ``N`` of those instances and
writes one JSON per model. Usage::

    python scripts/rlft_partial_eval.py OUT N MODEL_DIR [MODEL_DIR ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from turnrl import envs
from turnrl.greedy_study import BANDIT_INSTRUCTION, FULL, bandit_eval


def main(argv: list[str]) -> None:
    out, n, models = Path(argv[0]), int(argv[1]), argv[2:]
    out.mkdir(parents=True, exist_ok=True)
    env_opts = dict(FULL["bandit_env"])
    ids = list(envs.make("bandit", **env_opts).task_ids("seen")[:n])
    for m in models:
        path = out / (Path(m).parent.name + ".json")
        if path.exists():
            continue
        r = bandit_eval(m, env_opts, ids, FULL["ppo"]["max_new_tokens"], BANDIT_INSTRUCTION)
        path.write_text(json.dumps(r) + "\n")
        print(path.name, round(float(np.mean(r["final_regret"])), 2), round(float(np.mean(r["final_coverage"])), 3),
              round(r["invalid"], 3), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
