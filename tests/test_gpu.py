"""The CUDA paths: mixed-precision training keeps float32 master weights and runs every
forward of a step (policy, reference, PPO's old pass) at one precision; CUDA rollouts
match the CPU's. ``gpu`` marker: skipped without a CUDA device (``pytest -m gpu``)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from turnrl.collect import run_policy

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TTT = ["env_opts.opponent=random", "instruction=Tic-tac-toe, you are X. Reply ACTION=<cell>."]


def _run(args: list[str], home: Path, *, cpu: bool = False) -> None:
    env = {**os.environ, "TURNRL_PROGRESS": "0", "TURNRL_HOME": str(home), "TOKENIZERS_PARALLELISM": "false"}
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run([sys.executable, "-m", "turnrl", *args], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _metrics(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def test_bf16_sft_keeps_float32_weights_that_small_steps_move(tiny_dir: Path, ttt_demos_and_pairs: tuple[Path, Path],
                                                              tmp_path: Path) -> None:
    """lr 1e-5 on bf16-stored weights rounds away wherever |w| > 0.005; float32 master
    weights move everywhere, and the loss curve follows the CPU's float32 run."""
    demos, _ = ttt_demos_and_pairs
    common = ["train", "sft", "--model", str(tiny_dir), "--data", str(demos), "max_steps=3", "batch_size=4",
              "row_tokens=1024", "warmup_ratio=0"]
    _run([*common, "--out", str(tmp_path / "gpu"), "lr=1e-5", "mixed_precision=bf16"], tmp_path / "home")
    _run([*common, "--out", str(tmp_path / "cpu"), "lr=1e-5"], tmp_path / "home", cpu=True)
    start, after, ref = (_weights(d) for d in (tiny_dir, tmp_path / "gpu" / "model", tmp_path / "cpu" / "model"))
    assert {v.dtype for v in after.values()} == {torch.float32}
    should = {k: ref[k] != start[k].float() for k in ref}  # what float32 steps on the CPU moved
    moved = sum(int((should[k] & (after[k] != start[k].float())).sum()) for k in should)
    total = sum(int(m.sum()) for m in should.values())
    assert total > 0 and moved / total > 0.9, f"only {moved}/{total} weights changed"
    gpu, cpu = _metrics(tmp_path / "gpu"), _metrics(tmp_path / "cpu")
    assert [r["loss"] for r in gpu] == pytest.approx([r["loss"] for r in cpu], rel=2e-2)
    assert all(math.isfinite(r["grad_norm"]) for r in gpu)


def test_bf16_dpo_starts_at_log2(tiny_dir: Path, ttt_demos_and_pairs: tuple[Path, Path], tmp_path: Path) -> None:
    """The reference log-probs are computed at the policy's precision, so at step 1
    (policy == reference) every margin is 0 and the DPO loss is log 2."""
    _, pairs = ttt_demos_and_pairs
    out = tmp_path / "dpo"
    _run(["train", "dpo", "--model", str(tiny_dir), "--pairs", str(pairs), "--out", str(out), "max_steps=3",
          "batch_size=4", "lr=1e-4", "warmup_ratio=0", "mixed_precision=bf16"], tmp_path / "home")
    rows = _metrics(out)
    assert rows[0]["loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert rows[-1]["loss"] != pytest.approx(math.log(2), abs=1e-3)  # it trained
    assert {v.dtype for v in _weights(out / "model").values()} == {torch.float32}


@pytest.mark.parametrize("kl_estimator", ["k3", "full"])
def test_bf16_ppo_ratio_is_one_and_kl_zero_on_the_first_minibatch(tiny_dir: Path, tmp_path: Path,
                                                                 kl_estimator: str) -> None:
    """PPO's old log-probs and its frozen reference (on the policy's device) run at the
    update's precision: the first minibatch has ratio 1 and KL 0 (up to packing rounding)."""
    out = tmp_path / "ppo"
    _run(["train", "ppo", "--model", str(tiny_dir), "--env", "tictactoe", "--out", str(out), *TTT,
          "iterations=2", "episodes_per_iter=8", "num_envs=8", "minibatches=2", "ppo_epochs=1",
          "max_new_tokens=4", "save_every=2", "lr=1e-4", "row_tokens=1024", "mixed_precision=bf16",
          "beta_kl=0.05", f"kl_estimator={kl_estimator}"], tmp_path / "home")
    rows = [r for r in _metrics(out) if "ratio_max_dev" in r]
    assert rows, "no PPO step was logged"
    firsts = rows[::2]  # minibatches=2, ppo_epochs=1: steps 1, 3 open the iterations
    assert all(r["ratio_max_dev"] < 2e-2 for r in firsts), [r["ratio_max_dev"] for r in firsts]
    assert abs(rows[0]["kl"]) < 1e-2, rows[0]["kl"]
    assert all(math.isfinite(r["loss"]) for r in rows)


def test_archer_bf16_runs_on_cuda(tiny_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "archer"
    _run(["train", "archer", "--model", str(tiny_dir), "--env", "tictactoe", "--out", str(out),
          "prompt.history=0", "env_opts.opponent=random", "episodes_per_iteration=8", "num_envs=8",
          "sampling.max_new_tokens=12", "critic_steps=2", "critic.batch_size=8", "actor.batch_size=4",
          "critic.hidden=32", "critic.intermediate=64", "critic.layers=1", "critic.heads=2",
          "iterations=3", "warmup_iterations=1", "actor.mixed_precision=bf16"], tmp_path / "home")
    rows = _metrics(out)
    assert len(rows) == 3 and all(math.isfinite(v) for r in rows for v in r.values() if isinstance(v, float))
    saved = torch.load(out / "critic.pt")  # loads on a machine without a GPU too
    assert {v.device.type for part in ("critic", "target") for v in saved[part].values()} == {"cpu"}


def test_chai_actor_runs_on_the_gpu(tiny_dir: Path, tmp_path: Path) -> None:
    """CHAI's actor is frozen (no trainer places it): it still goes to the GPU."""
    from turnrl.config import load_config
    from turnrl.train.archer import OnlineConfig, OnlineRun

    cfg = load_config(OnlineConfig, None, ["critic.hidden=32", "critic.intermediate=64", "critic.layers=1",
                                           "critic.heads=2", "actor.mixed_precision=bf16"])
    run = OnlineRun("chai", str(tiny_dir), "tictactoe", tmp_path / "chai", cfg)
    assert next(run.actor.parameters()).device.type == "cuda"


def test_evaluation_leaves_the_gpu_random_stream_alone() -> None:
    from turnrl.devices import forked_rng

    torch.cuda.manual_seed(5)
    want = torch.rand(4, device="cuda")
    torch.cuda.manual_seed(5)
    with forked_rng(1):
        torch.rand(4, device="cuda")
    assert torch.equal(torch.rand(4, device="cuda"), want)


def test_cuda_greedy_rollouts_match_the_cpu(tiny_dir: Path) -> None:
    """float32 on both devices: the same greedy games, log-probs within float rounding."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from turnrl.rollout import HFEngine, ModelPolicy, SamplingConfig
    from turnrl.tokenization import ChatFormat

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    chat = ChatFormat(tok)
    games = []
    for device in ("cpu", "cuda"):
        model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).to(device)
        policy = ModelPolicy(HFEngine(model, tok, chat.stop_token_ids), chat,
                             SamplingConfig(temperature=0.0, max_new_tokens=12))
        games.append(run_policy(policy, "tictactoe", split="train", episodes=8, num_envs=8, seed=0))
    for a, b in zip(*games, strict=True):
        ma = [m for m in a.messages if m.role == "assistant"]
        mb = [m for m in b.messages if m.role == "assistant"]
        assert [m.token_ids for m in ma] == [m.token_ids for m in mb]
        for x, y in zip(ma, mb, strict=True):
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-3)
        assert a.return_ == b.return_
