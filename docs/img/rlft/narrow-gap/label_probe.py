"""Which labels does a narrow-gap model leave after a low reward? (issue 8, docs/rlft.md; exploratory)

The design's prompt shows one history line (``context=1``), so a state after a low reward is fixed by the step, the
label last pulled and that reward. For every one of the 10 labels, at 12 steps (1-49) and 3 low rewards (-0.7,
-1.3, -2.1), this builds that state and reads the model's greedy reply: does it stay on the label or move, and to
which label. It also reads the model's first reply (step 1, nothing pulled yet).

Greedy play of such a model is then a walk: it pulls its first label until a reward is low, moves to the label its
reply names, and so on; a label it does not leave ends the walk. The labels on that walk, over 10, bound the
coverage@50 of its greedy evaluation from above (an arm may give no low reward within 50 steps).

With ``sample=K`` it reads the policy RLFT samples instead (temperature 1, torch seeded with 0): per label, the
share of K replies in each of 15 of those states (steps 2, 5, 12, 25 and 40) that stay on the label, and the
first labels of 200 sampled first replies. Greedy decoding leaves a label only where staying has fallen below
about one half.

    python docs/img/rlft/narrow-gap/label_probe.py [sample=K] NAME=MODEL_DIR [NAME=MODEL_DIR ...]
"""

from __future__ import annotations

import collections
import random
from typing import Any

import turnrl.greedy_study as g
from turnrl import envs
from turnrl.agent.parsing import parse_action
from turnrl.data.schema import Message
from turnrl.devices import forked_rng
from turnrl.errors import run_script
from turnrl.rollout.policies import Request

ENV = {**g.NARROW_GAP["bandit_env"]}
STEPS = (1, 2, 3, 5, 8, 12, 16, 20, 25, 30, 40, 49)
LOW = (-0.7, -1.3, -2.1)
SAMPLED_STEPS = (2, 5, 12, 25, 40)


def _request(history: list[tuple[int, float]]) -> Request:
    env: Any = envs.make("bandit", **ENV)
    env.reset(options={"task_id": "bandit-100000"})  # the instance only fixes the labels' order, not what is shown
    env.history = list(history)
    msgs = [Message(role="system", content=g.BANDIT_INSTRUCTION), Message(role="user", content=env.render())]
    return Request(env=env, messages=msgs, turn=0, valid_actions=env.labels, rng=random.Random(0))


def probe(model: str) -> dict[str, Any]:
    """The first label, and per label the replies after a low reward: {label: Counter(action)}."""
    env: Any = envs.make("bandit", **ENV)
    labels = env.labels
    policy = g._model_policy(model, 16)
    first = parse_action(policy.act([_request([])])[0].content, labels).action or "none"  # not a label: its walk ends
    keys = [(a, k, r) for a in range(len(labels)) for k in STEPS for r in LOW]
    replies = policy.act([_request([(a, 0.5)] * (k - 1) + [(a, r)]) for a, k, r in keys])
    after: dict[str, collections.Counter[str]] = {lab: collections.Counter() for lab in labels}
    for (a, _, _), rep in zip(keys, replies, strict=True):
        after[labels[a]][parse_action(rep.content, labels).action or "none"] += 1  # the action as the env reads it
    return {"first": first, "after": after}


def sampled(model: str, k: int) -> dict[str, Any]:
    """At temperature 1: per label, the share of replies after a low reward that stay on it (``k`` replies in
    each state), and a Counter of the first label over 200 first replies."""
    env: Any = envs.make("bandit", **ENV)
    labels = env.labels
    policy = g._model_policy(model, 16, temperature=1.0)
    keys = [(a, s, r) for a in range(len(labels)) for s in SAMPLED_STEPS for r in LOW for _ in range(k)]
    with forked_rng(0):
        replies = policy.act([_request([(a, 0.5)] * (s - 1) + [(a, r)]) for a, s, r in keys])
        firsts = policy.act([_request([]) for _ in range(200)])
    stays: collections.Counter[str] = collections.Counter()
    for (a, _, _), rep in zip(keys, replies, strict=True):
        stays[labels[a]] += parse_action(rep.content, labels).action == labels[a]
    n = len(SAMPLED_STEPS) * len(LOW) * k
    return {"replies": n, "stay": {lab: stays[lab] / n for lab in labels},
            "first": collections.Counter(str(parse_action(r.content, labels).action) for r in firsts)}


def walk(first: str, after: dict[str, collections.Counter[str]]) -> list[str]:
    """Greedy play's labels: from the first, to the most common reply after a low reward, until one stays."""
    path = [first]
    while first in after:
        nxt = after[first].most_common(1)[0][0]
        if nxt == first or nxt in path:
            break
        path.append(first := nxt)
    return path


def main(args: list[str]) -> None:
    k = 0
    if args and args[0].startswith("sample="):
        value = args.pop(0).split("=", 1)[1]
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"sample=K takes a whole number of replies, at least 1 (got {value!r})")
        k = int(value)
    if not args or any("=" not in a for a in args):
        raise ValueError("give NAME=MODEL_DIR pairs")
    n = len(STEPS) * len(LOW)
    for name, model in (a.split("=", 1) for a in args):
        if k:
            r = sampled(model, k)
            stay = r["stay"]
            print(f"{name}: stays after a low reward, temperature 1 (of {r['replies']}): mean "
                  f"{sum(stay.values()) / len(stay):.2f}; " + ", ".join(f"{lab} {v:.2f}" for lab, v in stay.items()))
            print("   first label of 200 sampled: " + ", ".join(f"{lab} {c}" for lab, c in r["first"].most_common(5)))
            continue
        r = probe(model)
        left = {lab: n - c[lab] for lab, c in r["after"].items()}
        path = walk(r["first"], r["after"])
        print(f"{name}: first {r['first']}; leaves {sum(v == n for v in left.values())} labels always, "
              f"stays on {', '.join(lab for lab, v in left.items() if v < n / 2) or 'none'}; walk "
              f"{' > '.join(path)} (coverage <= {len(path) / len(left):.1f})")
        print("   left after a low reward, of " + str(n) + ": " + ", ".join(f"{lab} {v}" for lab, v in left.items()))
        print("   goes to: " + ", ".join(f"{lab}>{c.most_common(1)[0][0]}" for lab, c in r["after"].items()))


if __name__ == "__main__":
    run_script(main, "label_probe.py [sample=K] NAME=MODEL_DIR [NAME=MODEL_DIR ...]")
