"""Rollout throughput: lock-step batched sampling vs one episode at a time.

The tiny model plays tic-tac-toe against the random opponent. turnrl steps ``--num-envs``
environments in lock-step with one batched ``generate`` per step; the peer is the way the
reference implementations (ETO, ArCHer's data collection) roll out: one episode at a
time, one plain ``generate`` per turn on the turn's whole prompt (the engine's ``reuse_turns`` and
``preallocate`` off; turnrl's side takes each turn's prefix from the episode's last turn and writes
into preallocated caches, ``benchmarks/turn_cache.py``).
Same model, same sampling settings, same episodes.

    python benchmarks/rollout_throughput.py [--episodes 64] [--num-envs 32] [--model DIR]

The last line of output is one JSON object with ``ratio``: batched episodes per CPU second
over sequential episodes per CPU second, both sides playing the same ``--episodes`` planned
games (CPU time: on a shared machine wall time also measures the other jobs; ``wall_ratio``
is the same ratio of episodes per wall-clock second).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from _common import model_or_tiny, positive, positive_list, run_main  # beside this script

from turnrl.collect import run_policy
from turnrl.rollout import SamplingConfig, load_policy


def measure(policy, episodes: int, num_envs: int, plain: bool = False) -> dict:
    """``plain``: the engine as plain ``generate`` calls (no turn reuse, transformers' own cache)."""
    policy.engine.calls = 0
    policy.engine.reuse_turns = policy.engine.preallocate = not plain
    t0, c0 = time.perf_counter(), time.process_time()
    trajs = run_policy(policy, "tictactoe", split="train", episodes=episodes, num_envs=num_envs, seed=0)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    tokens = sum(len(m.token_ids or []) for t in trajs for m in t.messages if m.role == "assistant")
    # cpu_seconds: this process's CPU time (all threads); on a shared machine it tracks the work
    # done where wall time also measures the other jobs
    return {"num_envs": num_envs, "episodes": episodes, "seconds": round(dt, 3), "cpu_seconds": round(cpu, 3),
            "episodes_per_s": round(episodes / dt, 3), "generated_tokens_per_s": round(tokens / dt, 1),
            "episodes_per_cpu_s": round(episodes / cpu, 3), "tokens_per_cpu_s": round(tokens / cpu, 1),
            "generate_calls": policy.engine.calls}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=positive, default=64)
    ap.add_argument("--num-envs", type=positive, default=32)
    ap.add_argument("--max-new-tokens", type=positive, default=32)
    ap.add_argument("--model", default=None, help="model directory (default: a freshly built tiny model)")
    ap.add_argument("--sweep", type=positive_list, default=[], help="also measure these env counts, e.g. 1,8,32,128")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = model_or_tiny(args.model)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.max_new_tokens)
    policy = load_policy(model, sampling=sampling)
    measure(policy, 4, 4)  # warm-up
    batched = measure(policy, args.episodes, args.num_envs)
    # the same planned games, each turn's whole prompt prefilled as a generate call per turn does
    sequential = measure(policy, args.episodes, 1, plain=True)
    print(f"batched    ({args.num_envs:>3} envs): {batched['episodes_per_s']:8.2f} episodes/s "
          f"{batched['generated_tokens_per_s']:9.1f} tokens/s", flush=True)
    print(f"sequential (  1 env ): {sequential['episodes_per_s']:8.2f} episodes/s "
          f"{sequential['generated_tokens_per_s']:9.1f} tokens/s", flush=True)
    sweep = []
    for n in args.sweep:
        r = measure(policy, max(n, 16), n)
        sweep.append(r)
        print(f"sweep {n:>4} envs: {r['episodes_per_s']:8.2f} episodes/s {r['generated_tokens_per_s']:9.1f} tokens/s "
              f"({r['episodes']} episodes, {r['generate_calls']} generate calls, {r['seconds']} s; per CPU second: "
              f"{r['episodes_per_cpu_s']} episodes, {r['tokens_per_cpu_s']} tokens)", flush=True)
    ratio = batched["episodes_per_cpu_s"] / sequential["episodes_per_cpu_s"]
    wall = batched["episodes_per_s"] / sequential["episodes_per_s"]
    print(json.dumps({"benchmark": "rollout_throughput", "ratio": round(ratio, 2), "wall_ratio": round(wall, 2),
                      "batched": batched, "sequential": sequential, "sweep": sweep}))


if __name__ == "__main__":
    run_main(main)
