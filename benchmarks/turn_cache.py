"""Multi-turn rollouts: turnrl's HF engine reusing each episode's KV cache from its last turn vs
running every turn's whole prompt again (what a ``generate`` call per turn does, as the reference
implementations roll out with transformers).

Both sides are the lock-step sampler with the same model, the same planned episodes and the same
seeded random streams; the peer is the same engine with ``reuse_turns=False``, so the only
difference is the prefill of what earlier turns already ran. The script checks that both sides
play the same replies (a reply can differ where its logits differ in the last bits, as with
another batch's padding: it reports how many differ) and counts the prompt tokens each side runs.

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
from _common import clock, model_or_tiny, positive  # beside this script

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


def play(model: str, reuse: bool, args: argparse.Namespace, cuda: bool) -> dict:
    policy = load_policy(model, sampling=SamplingConfig(temperature=args.temperature,
                                                        max_new_tokens=args.max_new_tokens))
    policy.seed = 0  # both sides draw from the same keyed streams
    policy.engine.reuse_turns = reuse
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
    runs: dict[bool, list[dict]] = {True: [], False: []}
    for _ in range(args.repeats):  # alternating sides, the best of each: a process's first runs are slower
        for reuse in (True, False):
            runs[reuse].append(play(model, reuse, args, cuda))
    turnrl, peer = (min(runs[reuse], key=lambda r: r["seconds"]) for reuse in (True, False))
    differ = sum(a != b for a, b in zip(turnrl.pop("replies"), peer.pop("replies"), strict=False))
    for side, reuse in ((turnrl, True), (peer, False)):
        side["all_seconds"] = [r["seconds"] for r in runs[reuse]]
    for name, side in (("turnrl", turnrl), ("full prefill", peer)):
        print(f"{name:13s} {side['seconds']:8.2f} s  {side['turns']:5d} turns  prompt tokens run "
              f"{side['prompt_tokens_run']:8d} of {side['prompt_tokens']}", flush=True)
    print(json.dumps({"benchmark": "turn_cache", "device": "cuda" if cuda else "cpu", "clock": "wall" if cuda else "cpu",
                      "env": args.env, "episodes": args.episodes, "num_envs": args.num_envs,
                      "turnrl": turnrl, "peer": peer, "replies_that_differ": differ,
                      "ratio": round(peer["seconds"] / turnrl["seconds"], 2)}))


if __name__ == "__main__":
    main()
