"""Rollout engines: the HF engine vs the vLLM engine, episodes/s on one GPU.

Both engines run the same policy (same model, same sampling settings) through the same
lock-step sampler on the same planned tic-tac-toe episodes; only ``engine=hf|vllm`` differs.

    python benchmarks/rollout_engines.py [--model DIR_OR_HUB_ID] [--episodes 256] [--num-envs 64]

Needs a CUDA GPU and vllm (``pip install 'turnrl[vllm]'``); elsewhere it prints why it
skipped and exits 0. The last line of output is one JSON object: ``ratio`` (vLLM episodes/s
over HF episodes/s), or ``skipped`` with the reason.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time

import torch
from _common import model_or_tiny, positive, run_main  # beside this script

from turnrl.collect import run_policy
from turnrl.rollout import SamplingConfig, load_policy


def measure(policy, env: str, episodes: int, num_envs: int) -> dict:
    policy.engine.calls = 0
    t0 = time.perf_counter()
    trajs = run_policy(policy, env, split="train", episodes=episodes, num_envs=num_envs, seed=0)
    dt = time.perf_counter() - t0
    tokens = sum(len(m.token_ids or []) for t in trajs for m in t.messages if m.role == "assistant")
    return {"episodes": episodes, "num_envs": num_envs, "seconds": round(dt, 3),
            "episodes_per_s": round(episodes / dt, 3), "generated_tokens_per_s": round(tokens / dt, 1),
            "generate_calls": policy.engine.calls}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model directory or hub id (default: a fresh tiny model)")
    ap.add_argument("--env", default="tictactoe")
    ap.add_argument("--episodes", type=positive, default=256)
    ap.add_argument("--num-envs", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.4)
    args = ap.parse_args()
    missing = [what for what, ok in (("a CUDA GPU", torch.cuda.is_available()),
                                     ("vllm", importlib.util.find_spec("vllm") is not None)) if not ok]
    if missing:
        reason = f"needs {' and '.join(missing)}"
        print(f"rollout_engines: skipped ({reason})")
        print(json.dumps({"benchmark": "rollout_engines", "skipped": reason}))
        return
    torch.manual_seed(0)
    model = model_or_tiny(args.model)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.max_new_tokens)
    results = {}
    for engine in ("hf", "vllm"):
        opts = {"llm_kwargs": {"gpu_memory_utilization": args.gpu_memory_utilization}} if engine == "vllm" else None
        policy = load_policy(model, sampling=sampling, engine=engine, device="cuda" if engine == "hf" else None,
                             engine_opts=opts)
        measure(policy, args.env, min(8, args.episodes), min(8, args.num_envs))  # warm-up
        results[engine] = measure(policy, args.env, args.episodes, args.num_envs)
        r = results[engine]
        print(f"{engine:>4}: {r['episodes_per_s']:8.2f} episodes/s {r['generated_tokens_per_s']:10.1f} tokens/s")
        del policy
        torch.cuda.empty_cache()
    ratio = results["vllm"]["episodes_per_s"] / results["hf"]["episodes_per_s"]
    print(json.dumps({"benchmark": "rollout_engines", "model": model, "ratio": round(ratio, 2),
                      "device": torch.cuda.get_device_name(0), **results}))


if __name__ == "__main__":
    run_main(main)
