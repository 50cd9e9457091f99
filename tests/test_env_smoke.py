"""End to end on each text env: SFT the tiny model on a few hundred expert trajectories,
then evaluate it (greedy) on seen and unseen tasks through the lock-step sampler.

A short instruction replaces each env's full one (as the quickstart does) so sequences stay
a few hundred tokens and the test takes a minute or two per env on a CPU."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from turnrl import envs
from turnrl.agent.prompting import PromptConfig
from turnrl.collect import evaluate, run_policy
from turnrl.rollout import ExpertPolicy, SamplingConfig, load_policy
from turnrl.train.sft import SFTConfig, train_sft

FORMAT = "\nAnswer as:\nThought: <reason>\nAction: <action>"
#: env -> (env options, expert demos, SFT epochs, short instruction)
PLANS: dict[str, tuple[dict, int, float, str]] = {
    "twenty_questions": ({}, 200, 1.0, "Find the object with yes/no questions, then guess it."),
    "guess_my_city": ({}, 200, 1.0, "Find the city with questions, then guess it."),
    "shop": ({}, 200, 1.0, "Buy the product the instruction asks for: search[...] then click[...]."),
    "household": ({}, 200, 1.0, "Do the household task in the text game."),
    "scienceworld": ({"task_names": "find-living-thing"}, 100, 1.0, "Do the science task."),
}


def _registered(name: str) -> bool:
    return name in envs.names()


@pytest.mark.smoke
@pytest.mark.parametrize("name", list(PLANS))
def test_sft_tiny_on_expert_trajectories_then_evaluate(name: str, tiny_dir: Path, tmp_path: Path) -> None:
    if not _registered(name):
        pytest.skip(f"env {name!r} is not registered here (its optional extra is missing)")
    opts, demos, epochs, instruction = PLANS[name]
    prompt = PromptConfig(instruction=instruction + FORMAT)
    data = tmp_path / "demos.jsonl"
    trajs = run_policy(ExpertPolicy(), name, split="train", episodes=demos, env_opts=opts, out=data, num_envs=16,
                       prompt=prompt)
    assert len(trajs) == demos and sum(t.success for t in trajs) >= 0.9 * demos
    cfg = SFTConfig(epochs=epochs, batch_size=8, lr=2e-3, row_tokens=4096, warmup_ratio=0.05, seed=0)
    result = train_sft(str(tiny_dir), data, tmp_path / "sft", cfg)
    losses = [json.loads(line)["loss"] for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert losses[-1] < losses[0]
    policy = load_policy(str(result.model_dir), sampling=SamplingConfig(temperature=0.0, max_new_tokens=40))
    for split in ("seen", "unseen"):
        record, evals = evaluate(policy, name, split=split, episodes=4, env_opts=opts, num_envs=4, seed=1,
                                 prompt=prompt)
        assert record["episodes"] == 4 and all(t.num_turns >= 1 for t in evals)
        assert 0.0 <= record["invalid_action_rate"] <= 1.0 and record["ci95"][0] <= record["avg_reward"]
        assert all(m.token_ids for t in evals for m in t.messages if m.role == "assistant")
        if os.environ.get("TURNRL_SMOKE_PRINT"):
            print(name, split, record)
