"""Can the tiny model play lose-shift from one history line? (26 Nov 2026, docs/rlft.md)

SFT the tiny model on episodes of the scripted ``lose-shift`` policy (threshold -0.5) with
``context=1`` (the observation shows only the last pull and its reward) and one-word rationales
(``Start.``, ``Low.``, ``High.``), then:

* play the study's 50 seen instances greedily: regret@50 and coverage, next to the scripted
  policy and a commit to one arm on the same instances;
* probe 200 random states (1-12 random pulls): does the reply's word match the last reward, and
  does its arm follow the rule (the last arm after ``High.``, the next label after ``Low.``)?

    python docs/img/rlft/lose-shift/sft_and_probe.py OUT STEPS EPISODES LR
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import numpy as np

import turnrl.greedy_study as g
from turnrl import envs
from turnrl.bandits.algorithms import make_algorithm
from turnrl.bandits.simulate import cumulative_regret, simulate
from turnrl.data.schema import Message
from turnrl.rollout.policies import Request

ENV = {"arms": 10, "noise": "medium", "horizon": 50, "context": 1}
SPEC = "lose-shift:threshold=-0.5"


def probe(model: Path, states: int = 200) -> dict[str, int]:
    requests, want_word, want_arm = [], [], []
    for i in range(states):
        rng = random.Random(i)
        env = envs.make("bandit", **ENV)
        obs, _ = env.reset(options={"task_id": f"bandit-{100000 + i}"})
        for _ in range(rng.randint(1, 12)):
            obs, *_ = env.step(rng.choice(env.labels))
        arm, reward = env.history[-1]
        low = reward < -0.5
        want_word.append("Low." if low else "High.")
        want_arm.append(env.labels[(arm + 1) % 10] if low else env.labels[arm])
        msgs = [Message(role="system", content=g.BANDIT_INSTRUCTION), Message(role="user", content=obs)]
        requests.append(Request(env=env, messages=msgs, turn=0, valid_actions=env.labels, rng=rng))
    out = {"states": states, "word right": 0, "arm right": 0, "low states": 0, "low arm right": 0,
           "copies last arm": 0}
    for reply, w, a, req in zip(g._model_policy(model, 16).act(requests), want_word, want_arm, requests,
                                strict=True):
        word, _, action = reply.content.partition("\nACTION=")
        last = req.env.labels[req.env.history[-1][0]]
        out["word right"] += word.strip() == w
        out["arm right"] += action.strip() == a
        out["copies last arm"] += action.strip() == last
        if w == "Low.":
            out["low states"] += 1
            out["low arm right"] += action.strip() == a
    return out


def main() -> None:
    if len(sys.argv) < 5:
        sys.exit("usage: python docs/img/rlft/lose-shift/sft_and_probe.py OUT STEPS EPISODES LR")
    out, steps, episodes, lr = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    out.mkdir(parents=True, exist_ok=True)
    g._collect(g.CompactBanditPolicy(SPEC), "bandit", ENV, g.BANDIT_INSTRUCTION, out / "lose-shift.jsonl", episodes)
    g.check_budget(out / "lose-shift.jsonl", 16)
    t = time.time()
    model = g._sft(out / "lose-shift.jsonl", out / "sft", steps, lr, 16)
    print(f"SFT: {time.time() - t:.0f} s", flush=True)
    env = envs.make("bandit", **ENV)
    ids = env.task_ids("seen")[:50]
    inst = env.instances(ids)
    scripted = cumulative_regret(simulate(make_algorithm(SPEC), inst, seed=0))[:, -1]
    commit = np.cumsum(inst.mu.max(-1) - inst.mu[..., 0], axis=1)[:, -1]
    r = g.bandit_eval(model, ENV, ids, 16, g.BANDIT_INSTRUCTION)
    print(f"model: regret@50 {np.mean(r['final_regret']):.2f}, coverage {np.mean(r['final_coverage']):.2f}, "
          f"invalid {r['invalid']:.2f}; scripted lose-shift {scripted.mean():.2f}; commit to the first label "
          f"{commit.mean():.2f}", flush=True)
    print("probe:", probe(model))


if __name__ == "__main__":
    main()
