"""Multi-turn rollouts: turnrl's HF engine (each turn reusing its episode's KV cache from the last
turn, caches preallocated) vs running every turn's whole prompt again with transformers' own cache
(what a ``generate`` call per turn does, as the reference implementations roll out).

Every side is the lock-step sampler with the same model, the same planned episodes and the same
seeded random streams; the peer is the same engine with ``reuse_turns=False, preallocate=False``
(plain ``generate`` calls), and a middle side turns off the turn reuse only, to tell the two gains
apart. The script checks that the sides play the same replies (a reply can differ where its logits
differ in the last bits, as with another batch's padding: it reports how many differ) and counts
the prompt tokens each side runs.

    python benchmarks/turn_cache.py [--model DIR] [--env tictactoe] [--episodes 32] [--num-envs 16]
                                    [--repeats 3]

Time is the process's CPU time on a CPU (run with ``OMP_NUM_THREADS=1``) and wall time on a GPU, the
best of ``--repeats`` runs of each side taken in turn (the first runs of a process are slower).
The last line is one JSON object with ``ratio`` = peer time / turnrl time (above 1: turnrl is faster).
"""

from __future__ import annotations

import argparse
import json

import torch
from _common import clock, model_or_tiny, positive, run_main  # beside this script

from turnrl.collect import run_policy
from turnrl.rollout import SamplingConfig, load_policy


class PromptCount:
    """Wraps an engine's ``generate`` to count the prompt tokens it is given."""

    def __init__(self, engine):
        self.engine, self.tokens = engine, 0
        self.inner = engine.generate
        engine.generate = self

    def __call__(self, prompts, sampling, seeds=None):
        self.tokens += sum(len(p) for p in prompts)
        return self.inner(prompts, sampling, seeds)


#: the sides: turnrl's engine, the same without reusing turns (its caches still preallocated), and the peer
SIDES = {"turnrl": (True, True), "no turn reuse": (False, True), "peer": (False, False)}


def play(model: str, side: str, args: argparse.Namespace, cuda: bool) -> dict:
    policy = load_policy(model, sampling=SamplingConfig(temperature=args.temperature,
                                                        max_new_tokens=args.max_new_tokens))
    policy.seed = 0  # every side draws from the same keyed streams
    policy.engine.reuse_turns, policy.engine.preallocate = SIDES[side]
    count = PromptCount(policy.engine)
    run_policy(policy, args.env, split="train", episodes=2, num_envs=2, seed=99)  # warm-up
    count.tokens, policy.engine.reused_tokens = 0, 0
    t0 = clock(cuda)
    trajs = run_policy(policy, args.env, split="train", episodes=args.episodes, num_envs=args.num_envs, seed=0)
    dt = clock(cuda) - t0
    replies = [m.token_ids for t in trajs for m in t.messages if m.role == "assistant"]
    return {"seconds": round(dt, 3), "turns": len(replies), "prompt_tokens": count.tokens,
            "prompt_tokens_run": count.tokens - policy.engine.reused_tokens, "replies": replies}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model directory (default: a fresh tiny model)")
    ap.add_argument("--env", default="tictactoe")
    ap.add_argument("--episodes", type=positive, default=32)
    ap.add_argument("--num-envs", type=positive, default=16)
    ap.add_argument("--max-new-tokens", type=positive, default=48)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--repeats", type=positive, default=3)
    args = ap.parse_args()
    model = model_or_tiny(args.model)
    cuda = torch.cuda.is_available()
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    for _ in range(args.repeats):  # the sides in turn, the best of each: a process's first runs are slower
        for side in SIDES:
            runs[side].append(play(model, side, args, cuda))
    best = {side: min(rs, key=lambda r: r["seconds"]) for side, rs in runs.items()}
    replies = {side: r.pop("replies") for side, r in best.items()}
    for side, r in best.items():
        r["all_seconds"] = [x["seconds"] for x in runs[side]]
        r["replies_that_differ_from_the_peer"] = sum(a != b for a, b in zip(replies[side], replies["peer"],
                                                                              strict=False))
        print(f"{side:13s} {r['seconds']:8.2f} s  {r['turns']:5d} turns  prompt tokens run "
              f"{r['prompt_tokens_run']:8d} of {r['prompt_tokens']}", flush=True)
    peer = best["peer"]["seconds"]
    print(json.dumps({"benchmark": "turn_cache", "device": "cuda" if cuda else "cpu", "clock": "wall" if cuda else "cpu",
                      "env": args.env, "episodes": args.episodes, "num_envs": args.num_envs, **best,
                      "ratio_without_turn_reuse": round(peer / best["no turn reuse"]["seconds"], 2),
                      "ratio": round(peer / best["turnrl"]["seconds"], 2)}))


if __name__ == "__main__":
    run_main(main)
