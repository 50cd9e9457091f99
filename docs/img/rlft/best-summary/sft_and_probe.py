"""The ``summary=best`` attempt of 25 Nov 2026 (docs/rlft.md): SFT the tiny model on
epsilon-greedy episodes whose prompt names the best tried arm and the untried arms, then
ask it, greedily, on 120 random states with 1-6 tried arms, whether its ``Best.`` reply
plays the arm that the prompt names as best.

    python docs/img/rlft/best-summary/sft_and_probe.py OUT STEPS EPS EPISODES LR [SUMMARY]

(run as measured: ``OUT 200 0.3 200 3e-3`` and ``OUT 400 0.3 200 1e-3``; on 27 Nov ``OUT 800 0.3 200
1e-3`` and ``OUT 1500 0.3 200 1e-3``, then the same with SUMMARY ``best-kv``, the line written as
``Best=red 0.83 (3x). Untried=green,yellow.``; SUMMARY defaults to ``best``). Prints the SFT
time, regret@50 / coverage / action shares on the study's 20 first seen instances, and the
probe's count of ``Best.`` replies that play the named arm.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import numpy as np

import turnrl.greedy_study as g
from turnrl import envs
from turnrl.data.schema import Message
from turnrl.envs.bandit import arm_stats, best_tried
from turnrl.rollout.policies import Request

ENV = {"arms": 10, "noise": "medium", "horizon": 50, "context": 0, "summary": "best"}


def probe(model: Path, states: int = 120, env_opts: dict | None = None, temperature: float = 0.0,
          repeats: int = 1) -> dict[str, tuple[int, int]]:
    """Per rationale word: (replies, replies whose arm is right: the named best arm after
    ``Best.``, an untried arm after ``Untried.``). ``repeats`` asks each state that many times
    (sampled replies at ``temperature`` > 0)."""
    requests, best, untried = [], [], []
    for i in [i for i in range(states) for _ in range(repeats)]:
        rng = random.Random(i)
        env = envs.make("bandit", **(env_opts or ENV))
        obs, _ = env.reset(options={"task_id": f"bandit-{100000 + i}"})
        arms = rng.sample(env.labels, rng.randint(1, 6))
        for _ in range(rng.randint(len(arms), 15)):
            obs, *_ = env.step(rng.choice(arms))
        counts, sums = arm_stats(env.history, 10)
        best.append(env.labels[best_tried(counts, sums)])
        untried.append({env.labels[j] for j in range(10) if not counts[j]})
        msgs = [Message(role="system", content=g.BANDIT_INSTRUCTION), Message(role="user", content=obs)]
        requests.append(Request(env=env, messages=msgs, turn=0, valid_actions=env.labels, rng=rng))
    out: dict[str, tuple[int, int]] = {}
    for reply, b, u in zip(g._model_policy(model, 16, temperature).act(requests), best, untried, strict=True):
        word, _, action = reply.content.partition("\nACTION=")
        right = action.strip() == b if word.strip() == "Best." else action.strip() in u
        n, k = out.get(word.strip(), (0, 0))
        out[word.strip()] = (n + 1, k + int(right))
    return out


def main() -> None:
    if len(sys.argv) < 6:
        sys.exit("usage: python docs/img/rlft/best-summary/sft_and_probe.py OUT STEPS EPS EPISODES LR [SUMMARY]")
    out, steps, eps, episodes, lr = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
    env_opts = {**ENV, "summary": sys.argv[6] if len(sys.argv) > 6 else "best"}
    out.mkdir(parents=True, exist_ok=True)
    g._collect(g.CompactBanditPolicy(f"epsilon-greedy:eps={eps}"), "bandit", env_opts, g.BANDIT_INSTRUCTION,
               out / "greedy.jsonl", episodes)
    g.check_budget(out / "greedy.jsonl", 16)
    t = time.time()
    model = g._sft(out / "greedy.jsonl", out / "sft", steps, lr, 16)
    print(f"SFT: {time.time() - t:.0f} s")
    ids = envs.make("bandit", **env_opts).task_ids("seen")[:20]
    r = g.bandit_eval(model, env_opts, ids, 16, g.BANDIT_INSTRUCTION)
    print(f"regret@50 {np.mean(r['final_regret']):.2f}, coverage {np.mean(r['final_coverage']):.2f}, "
          f"actions % {r['actions_pct']}, invalid {r['invalid']:.2f}")
    for word, (n, k) in probe(model, env_opts=env_opts).items():
        print(f"probe: {word!r} {n} replies, {k} play the named arm")


if __name__ == "__main__":
    main()
