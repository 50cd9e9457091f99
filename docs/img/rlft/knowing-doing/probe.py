"""Does a bandit model act on its own ``Low.`` rationale? (issue 8, docs/rlft.md)

Two probes of a model trained with one history line (``context=1``) and lose-shift rationales:

* greedy decoding on 200 random states (1-12 random pulls; ``sft_and_probe.probe``): is the word
  right, does the arm follow the lose-shift rule, does it copy the last arm;
* sampling at temperature 1 (the PPO rollouts' temperature) on 400 states whose last reward is
  below -0.5: how often the reply says ``Low.``, moves on to the next label, or stays.

    python docs/img/rlft/knowing-doing/probe.py MODEL_DIR
"""

from __future__ import annotations

import collections
import random
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "lose-shift"))

import sft_and_probe as sp  # noqa: E402

import turnrl.greedy_study as g  # noqa: E402
from turnrl import envs  # noqa: E402
from turnrl.data.schema import Message  # noqa: E402
from turnrl.rollout.policies import Request  # noqa: E402


def sampled_low_states(model: str, states: int = 400, seed: int = 0) -> dict[str, int]:
    requests, nxt, last = [], [], []
    for i in range(states):
        rng = random.Random(i)
        env: Any = envs.make("bandit", **sp.ENV)
        obs, _ = env.reset(options={"task_id": f"bandit-{100000 + i}"})
        while True:  # random pulls until one is low
            obs, *_ = env.step(rng.choice(env.labels))
            if env.history[-1][1] < -0.5:
                break
        arm = env.history[-1][0]
        nxt.append(env.labels[(arm + 1) % 10])
        last.append(env.labels[arm])
        msgs = [Message(role="system", content=g.BANDIT_INSTRUCTION), Message(role="user", content=obs)]
        requests.append(Request(env=env, messages=msgs, turn=0, valid_actions=env.labels, rng=rng))
    torch.manual_seed(seed)
    out: collections.Counter[str] = collections.Counter(states=states)
    for reply, n, stay in zip(g._model_policy(model, 16, temperature=1.0).act(requests), nxt, last, strict=True):
        word, _, action = reply.content.partition("\nACTION=")
        out["says Low."] += word.strip() == "Low."
        out["moves to the next label"] += action.strip() == n
        out["stays"] += action.strip() == stay
    return dict(out)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python docs/img/rlft/knowing-doing/probe.py MODEL_DIR")
    print("greedy, 200 random states:", sp.probe(Path(sys.argv[1])))
    print("temperature 1, 400 low states:", sampled_low_states(sys.argv[1]))
