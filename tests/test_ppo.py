"""PPO (RLFT) on the trainer core with the tiny model: ratio 1 and KL 0 at the start, clipping,
LoRA + full-vocabulary KL, the value head, kill-and-resume, one-line config errors.

Configs are tiny (a 3-step bandit, a short tic-tac-toe instruction, thinking budget 6-8
tokens) so that each run takes seconds; the untrained model writes no valid action, so
the invalid-action policy and the -5 penalty are exercised too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from turnrl import envs
from turnrl.errors import TurnRLError
from turnrl.train.core import split_modules
from turnrl.train.ppo import PPOConfig, PPOObjective, TurnSample, new_value_head, policy_forward, train_ppo

TTT_INSTRUCTION = "Tic-tac-toe, you are X. Reply ACTION=<cell>."


def metrics(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def bandit_cfg(**kw: Any) -> PPOConfig:
    base: dict[str, Any] = {
        "iterations": 2, "episodes_per_iter": 4, "batch_size": 2, "minibatches": 2, "ppo_epochs": 2,
        "max_new_tokens": 6, "lr": 1e-3, "warmup_ratio": 0.0, "row_tokens": 1024,
        "env_opts": {"arms": 3, "horizon": 3, "context": 2},
        "instruction": "Press blue, green or red. Reply ACTION=X.",
    }
    return PPOConfig(**{**base, **kw})


def test_ppo_bandit_ratio_one_and_kl_zero_at_start_then_moves(tiny_dir: Path, tmp_path: Path) -> None:
    cfg = bandit_cfg(exploration_bonus=1.0, epsilon=0.25)
    res = train_ppo(str(tiny_dir), "bandit", tmp_path / "run", cfg)
    rows = metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(1, 9)) and res.steps == 8
    first = rows[0]
    # the first minibatch of every iteration: pi_theta == pi_old == pi_ref (iteration 0)
    assert first["ratio"] == pytest.approx(1.0, abs=1e-5)
    assert first["ratio_max_dev"] < 1e-4
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)
    assert first["approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert first["clipped"] == 0.0
    assert first["iteration"] == 0 and rows[4]["iteration"] == 1
    assert rows[4]["ratio"] == pytest.approx(1.0, abs=1e-5)  # old log-probs recomputed each iteration
    # after updates the policy has moved away from pi_old and pi_ref
    later = rows[1:4] + rows[5:]
    assert max(abs(r["ratio"] - 1.0) + r["approx_kl"] for r in later) > 1e-4
    assert rows[4]["kl"] > 1e-6
    # rollout statistics on the first step of each iteration: the untrained model writes no
    # valid ACTION, gets the -5 penalty and a random valid arm
    assert first["rollout/invalid"] > 0.5 and first["rollout/trained_turns"] > 0
    assert 0 < first["rollout/coverage"] <= 1
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["run_config"]["advantage"] == "mc"


def test_ppo_counts_turns_too_long_for_max_length_and_refuses_an_iteration_of_none(tiny_dir: Path,
                                                                                     tmp_path: Path) -> None:
    """Later turns of an episode have the longest contexts; those that do not fit are dropped. They
    are counted, and an iteration where none fits is an error, not a run that trains on nothing."""
    train_ppo(str(tiny_dir), "bandit", tmp_path / "some", bandit_cfg(iterations=1, max_length=80, history=None))
    first = metrics(tmp_path / "some")[0]
    assert first["rollout/dropped_turns"] > 0 and first["rollout/trained_turns"] > 0
    assert first["rollout/dropped_turns"] + first["rollout/trained_turns"] == 4 * 3  # 4 episodes of 3 turns
    with pytest.raises(TurnRLError, match=r"none of the 12 turns the model wrote fits in max_length=40"):
        train_ppo(str(tiny_dir), "bandit", tmp_path / "none", bandit_cfg(iterations=1, max_length=40, history=None))


def test_ppo_group_size_plays_each_task_g_times_with_a_leave_one_out_baseline(tiny_dir: Path,
                                                                             tmp_path: Path) -> None:
    """group_size 2: two tasks a rollout, each twice in a row; an episode's advantage is its return minus
    the other episode of its task (before whitening), checked on the rollout the run kept."""
    from turnrl.losses import rewards_to_go
    from turnrl.train.ppo import EpisodeBuffer, PPORunner, _padded, shaped_rewards

    cfg = bandit_cfg(iterations=1, group_size=2, adv_norm=False, reward_norm=False, gamma=1.0)
    runner = PPORunner(cfg, "bandit", None, None, EpisodeBuffer(4), None, "mc")  # type: ignore[arg-type]
    specs = runner.plan(3, "train", 4, group=2)
    assert [s.task_id for s in specs][::2] == [s.task_id for s in specs][1::2]
    assert specs[0].task_id != specs[2].task_id and len({s.seed for s in specs}) == 4
    assert [s.index for s in specs] == [12, 13, 14, 15]
    # group 1: the plan of every earlier run, unchanged (the draws as first written, restated here)
    ids = envs.make("bandit", **cfg.env_opts).task_ids("train")
    rng = np.random.default_rng([cfg.seed, 0, 3])
    picks = rng.choice(len(ids), size=4, replace=False)
    assert [(s.task_id, s.seed) for s in runner.plan(3, "train", 4)] == [
        (ids[int(k)], int(rng.integers(2**31))) for k in picks]

    from turnrl.train import ppo as ppo_mod

    seen: dict[str, Any] = {}
    real = ppo_mod.PPORunner.collect

    def spy(self: Any, iteration: int) -> dict[str, float]:
        out = real(self, iteration)
        rewards, _ = shaped_rewards(self.last_rollout, self.cfg)
        r, mask = _padded(rewards)
        seen["ret"] = rewards_to_go(r, mask, 1.0)
        seen["adv"] = {(s.episode, s.turn): s.advantage for eps in self.buffer.items for s in eps}
        seen["tasks"] = [t.task_id for t in self.last_rollout]
        return out

    ppo_mod.PPORunner.collect = spy  # type: ignore[method-assign]
    try:
        train_ppo(str(tiny_dir), "bandit", tmp_path / "spy", cfg)
    finally:
        ppo_mod.PPORunner.collect = real  # type: ignore[method-assign]
    ret, adv, tasks = seen["ret"], seen["adv"], seen["tasks"]
    assert tasks[0] == tasks[1] and tasks[2] == tasks[3]
    assert any(a != 0 for a in adv.values())  # the random arms of invalid replies differ within a task
    assert all(a == pytest.approx(float(ret[i, t] - ret[i ^ 1, t])) for (i, t), a in adv.items())
    with pytest.raises(ValidationError, match="group_size"):
        PPOConfig(group_size=0)


def test_shaped_rewards_from_expected_rewards_by_hand() -> None:
    """reward_source=expected: the same shaping (scale by the std of the batch's sampled rewards, -5 on
    invalid turns, +bonus on an untried action) applied to meta["expected_rewards"] instead of rewards;
    a trajectory without them is a one-line error naming the key and the env."""
    from turnrl.data.schema import Message, Trajectory
    from turnrl.train.ppo import shaped_rewards

    def traj(actions: list[str | None], rewards: list[float], expected: list[float] | None, env: str = "bandit"):
        msgs = [Message("assistant", "x", action=a, valid=a is not None) for a in actions]
        return Trajectory("e", env, "bandit-1", msgs, rewards=rewards,
                          meta={} if expected is None else {"expected_rewards": expected})

    trajs = [traj(["a", "a", None], [1.5, -0.7, 0.0], [0.2, 0.2, 0.0]), traj(["b", "c", "b"], [0.1, 2.0, -1.0],
                                                                           [0.6, 0.8, 0.6])]
    cfg = PPOConfig(reward_source="expected", exploration_bonus=1.0)
    out, stats = shaped_rewards(trajs, cfg)
    s = 1 / float(np.std([1.5, -0.7, 0.0, 0.1, 2.0, -1.0]))  # the sampled rewards' std, not the means'
    assert stats["reward_scale"] == pytest.approx(s)
    assert out[0] == pytest.approx([0.2 * s + 1, 0.2 * s, -5.0])
    assert out[1] == pytest.approx([0.6 * s + 1, 0.8 * s + 1, 0.6 * s])
    plain, _ = shaped_rewards(trajs, PPOConfig(exploration_bonus=1.0))  # the sampled rewards
    s_env = 1 / float(np.std([1.5, -0.7, 0.0, 0.1, 2.0, -1.0]))
    assert plain[0] == pytest.approx([1.5 * s_env + 1, -0.7 * s_env, -5.0])
    with pytest.raises(TurnRLError, match=r"reward_source=expected: env 'tictactoe' .*expected_reward"):
        shaped_rewards([traj(["a"], [1.0], None, env="tictactoe")], cfg)
    with pytest.raises(ValidationError, match="reward_source"):
        PPOConfig(reward_source="mean")  # type: ignore[arg-type]


def test_exploration_bonus_and_coverage_count_arms_under_randomized_labels() -> None:
    """Under ``randomize_labels`` a label names another arm at every step. The bonus and coverage counted
    labels: a policy that pulls arm 0 every step earned the bonus on 3 of 10 steps and a coverage of 0.6.
    The sampler records the arm the env pulled (``meta["arms"]``), and both count it."""
    from turnrl.agent.prompting import PromptConfig
    from turnrl.rollout.policies import Reply
    from turnrl.rollout.sampler import EpisodeSpec, Sampler
    from turnrl.train.ppo import _coverage, shaped_rewards

    class Arm0:
        name = "arm0"

        def act(self, requests: Any) -> list[Reply]:
            return [Reply(f"ACTION={r.env.labels_now()[0]}") for r in requests]

    opts = {"arms": 5, "horizon": 10, "randomize_labels": True}
    task = envs.make("bandit", **opts).task_ids("train")[0]
    sampler = Sampler(lambda: envs.make("bandit", **opts), Arm0(), env_name="bandit", num_envs=1,
                      prompt=PromptConfig(history=0))
    (traj,) = sampler.run([EpisodeSpec(0, "train", task, 123)])
    sampler.close()
    assert len({m.action for m in traj.messages if m.role == "assistant"}) > 1  # several labels ...
    assert traj.meta["arms"] == [0] * 10  # ... of one arm
    _, stats = shaped_rewards([traj], PPOConfig(exploration_bonus=1.0, reward_norm=False))
    assert stats["bonus_rate"] == pytest.approx(1 / 10)
    assert _coverage(traj, opts, "bandit") == pytest.approx(1 / 5)


def test_an_action_the_env_rejected_is_not_tried_for_the_bonus() -> None:
    """On an env that lists no actions (the shop's search page) an action the env rejects is not executed:
    it counted as tried, so its first valid play earned no bonus."""
    from turnrl.data.schema import Message, Trajectory
    from turnrl.train.ppo import shaped_rewards

    msgs = [Message("assistant", "Action: click[b1]", action="click[b1]", valid=False),  # the env: no such item
            Message("assistant", "Action: click[b1]", action="click[b1]", valid=True),
            Message("assistant", "Action: click[b1]", action="click[b1]", valid=True)]
    traj = Trajectory("e", "shop", "shop-1", msgs, rewards=[0.0, 0.0, 0.0])
    out, stats = shaped_rewards([traj], PPOConfig(exploration_bonus=1.0, reward_norm=False))
    assert out == [[-5.0, 1.0, 0.0]] and stats["bonus_rate"] == pytest.approx(1 / 3)


def test_ppo_trains_on_expected_rewards_from_the_same_rollout(tiny_dir: Path, tmp_path: Path) -> None:
    """The first rollout is the same episodes either way, and both sources are scaled by the sampled
    rewards' std (the arms' means spread less: scaling them by their own std would weigh the penalty
    and the bonus less against them, another objective)."""
    first = {}
    for source in ("env", "expected"):
        train_ppo(str(tiny_dir), "bandit", tmp_path / source, bandit_cfg(iterations=1, reward_source=source))
        first[source] = metrics(tmp_path / source)[0]
        ppo = json.loads((tmp_path / source / "summary.json").read_text())["run_config"]["ppo"]
        assert ppo["reward_source"] == source
        assert "dropout" not in ppo and "kl_gradient" not in ppo  # added settings at their old behaviour: runs
        # made before they existed hash alike and resume
    assert first["env"]["rollout/return"] == first["expected"]["rollout/return"]
    assert first["expected"]["rollout/reward_scale"] == pytest.approx(first["env"]["rollout/reward_scale"])
    # ... and the source reaches the update: the same rollout gives another loss
    assert first["expected"]["loss"] != pytest.approx(first["env"]["loss"], abs=1e-6)


def _sample(tiny_dir: Path) -> tuple[Any, Any, TurnSample]:
    from turnrl.models.loading import load_model, load_tokenizer
    from turnrl.tokenization import ChatFormat
    from turnrl.train.forward import pack

    tok = load_tokenizer(str(tiny_dir))
    model = load_model(str(tiny_dir), dtype="float32")
    chat = ChatFormat(tok)
    msgs = [{"role": "system", "content": "Pick a cell."}, {"role": "user", "content": "Board: 0 1 2"},
            {"role": "assistant", "content": "Thought: center.\nAction: 4"}]
    enc = chat.encode(msgs, trainable_turns=[0])
    assert enc is not None
    sample = TurnSample(enc, 0, 0)
    with torch.no_grad():
        sample.old_logps = policy_forward(model, pack([enc])).logps
    return model, tok, sample


def test_pack_runs_computes_each_episodes_prefix_once_and_matches_plain_packing(tiny_dir: Path) -> None:
    """The turns of an episode, each its own sequence, share the instruction: ``pack_runs`` lays
    out each episode's run once per row-sized unit, and log-probs and values equal plain packing's."""
    from turnrl.models.loading import load_model, load_tokenizer
    from turnrl.tokenization import ChatFormat
    from turnrl.train.forward import common_prefix_length, pack, pack_runs

    tok = load_tokenizer(str(tiny_dir))
    model = load_model(str(tiny_dir), dtype="float32")
    chat = ChatFormat(tok)
    system = {"role": "system", "content": "You press one of 3 buttons: blue, green, red. Reply ACTION=X."}

    def turn(obs: str, reply: str) -> Any:
        enc = chat.encode([system, {"role": "user", "content": obs}, {"role": "assistant", "content": reply}],
                          trainable_turns=[0])
        assert enc is not None
        return enc

    seqs = [turn("Step=1 Action=blue Reward=0.3", "High. ACTION=blue"),
            turn("Step=2 Action=blue Reward=-0.9", "Low. ACTION=green"),
            turn("Step=3 Action=green Reward=1.2", "High. ACTION=green"),
            turn("Step=1 Action=red Reward=0.1", "High. ACTION=red"),
            turn("Step=2 Action=red Reward=0.4", "High. ACTION=red")]
    episodes = [0, 0, 0, 1, 1]
    p = common_prefix_length([s.input_ids for s in seqs])
    assert p > 0  # at least the system message is shared
    # rows with room for any two turns but no three: episode 0's run is split in two units
    lengths = [len(s.input_ids) for s in seqs]
    row = 2 * max(lengths) - p
    assert 3 * min(lengths) - 2 * max(common_prefix_length([a.input_ids, b.input_ids])
                                      for a in seqs for b in seqs if a is not b) > row
    shared = pack_runs(seqs, episodes, row_tokens=row)
    plain = pack(seqs, row_tokens=row)
    assert shared.segments is not None
    units = [u for r in shared.segments for u in r]
    # (turns 1-2), (episode 1's two turns) and turn 3 alone, which is all prefix (no suffix)
    assert sorted(len(u[2]) for u in units) == [0, 2, 2]
    assert shared.real_tokens < plain.real_tokens
    head = new_value_head(model, str(tiny_dir))
    with torch.no_grad():
        torch.nn.init.normal_(head.weight)
        a = policy_forward(model, shared, value_head=head)
        b = policy_forward(model, plain, value_head=head)

    def per_seq(fw: Any, batch: Any) -> torch.Tensor:
        return torch.zeros(len(seqs)).index_add_(0, batch.seq_index, fw.logps)

    assert torch.allclose(per_seq(a, shared), per_seq(b, plain), atol=1e-5)
    assert a.values is not None and b.values is not None and torch.allclose(a.values, b.values, atol=1e-5)
    assert not torch.allclose(a.values, a.values[0].expand_as(a.values))  # each turn reads its own state
    # keys must match the sequences; shared=False is plain packing
    with pytest.raises(ValueError, match="5 sequences but 4 keys"):
        pack_runs(seqs, episodes[:4])
    assert pack_runs(seqs, episodes, row_tokens=row, shared=False).real_tokens == plain.real_tokens


def test_ppo_shared_prefix_and_plain_packing_train_the_same(tiny_dir: Path, tmp_path: Path) -> None:
    """The same run with and without shared prefixes: the same rollouts and, up to float rounding,
    the same losses, ratios and KLs at every step."""
    runs = {}
    for shared in (True, False):
        out = tmp_path / f"shared-{shared}"
        train_ppo(str(tiny_dir), "bandit", out, bandit_cfg(iterations=1, shared_prefix=shared))
        runs[shared] = metrics(out)
    a, b = runs[True], runs[False]
    assert len(a) == len(b) == 4
    assert a[0]["rollout/return"] == b[0]["rollout/return"]
    for x, y in zip(a, b, strict=True):
        for key in ("loss", "ratio", "kl", "approx_kl", "grad_norm"):
            assert x[key] == pytest.approx(y[key], rel=1e-3, abs=1e-5), (x["step"], key)


def _grad_norm(model: Any) -> float:
    return float(sum(p.grad.abs().sum() for p in model.parameters() if p.grad is not None))


def test_objective_clips_positive_advantages_above_one_plus_eps(tiny_dir: Path) -> None:
    model, tok, sample = _sample(tiny_dir)
    obj = PPOObjective(PPOConfig(beta_kl=0.0, clip_eps=0.2), tok.pad_token_id or 0)
    current = sample.old_logps
    assert current is not None
    n = sample.tokens
    # ratio = e (> 1.2) everywhere: with A > 0 every token is clipped and there is no gradient
    sample.old_logps = current - 1.0
    sample.advantage = 1.0
    loss, m = obj(model, [[sample]])
    assert m["clipped"] == n and m["ratio"] == pytest.approx(n * torch.e, rel=1e-4)
    assert loss.item() == pytest.approx(-1.2 * n, rel=1e-5)
    model.zero_grad()
    loss.backward()
    assert _grad_norm(model) == 0.0
    # with A < 0 the unclipped (pessimistic) branch is taken: L = -rho * A, gradient flows
    sample.advantage = -1.0
    loss, m = obj(model, [[sample]])
    assert m["clipped"] == 0 and loss.item() == pytest.approx(torch.e * n, rel=1e-4)
    model.zero_grad()
    loss.backward()
    assert _grad_norm(model) > 0
    # ratio 1: nothing clipped, L = -A per token
    sample.old_logps = current
    sample.advantage = 0.5
    loss, m = obj(model, [[sample]])
    assert m["clipped"] == 0 and loss.item() == pytest.approx(-0.5 * n, abs=1e-4)
    assert obj.units([[sample]]) == n


@pytest.mark.parametrize("trunk", [True, False])
def test_value_loss_reaches_the_trunk_only_when_asked(tiny_dir: Path, trunk: bool) -> None:
    model, tok, sample = _sample(tiny_dir)
    head = new_value_head(model, tiny_dir)
    with torch.no_grad():  # a zero head (the start) passes no gradient to the trunk either way
        head.weight.normal_(0.0, 1.0)
    obj = PPOObjective(PPOConfig(beta_kl=0.0, clip_eps=0.2, vf_coef=0.5, value_trunk=trunk), tok.pad_token_id or 0)
    obj.value_head = head
    assert sample.old_logps is not None
    sample.old_logps = sample.old_logps - 1.0  # every token clipped: the policy loss has no gradient
    sample.advantage, sample.ret, sample.old_value = 1.0, 3.0, 0.0
    loss, m = obj(model, [[sample]])
    assert m["value_loss"] > 0
    model.zero_grad()
    loss.backward()
    assert head.weight.grad is not None and head.weight.grad.abs().sum() > 0  # the head learns either way
    assert (_grad_norm(model) > 0) is trunk


@pytest.mark.slow
def test_ppo_lora_full_vocabulary_kl_is_zero_at_start(tiny_dir: Path, tmp_path: Path) -> None:
    cfg = bandit_cfg(iterations=1, ppo_epochs=1, kl_estimator="full", beta_kl=0.1, lr=5e-3,
                     lora={"r": 4, "alpha": 8, "dropout": 0.0})
    res = train_ppo(str(tiny_dir), "bandit", tmp_path / "lora", cfg)
    rows = metrics(tmp_path / "lora")
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # the reference is the adapter-free model
    assert rows[1]["kl"] > 0.0
    assert res.adapter_dir is not None and (res.adapter_dir / "adapter_config.json").exists()


def ttt_cmd(tiny_dir: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "turnrl", "train", "ppo", "--model", str(tiny_dir), "--env", "tictactoe",
            "--out", str(out), f"instruction={TTT_INSTRUCTION}", "iterations=3", "episodes_per_iter=2",
            "batch_size=1", "minibatches=2", "ppo_epochs=1", "max_new_tokens=4", "save_every=2", "lr=1e-3",
            "row_tokens=1024", "value_clip=0.2", "exploration_bonus=0.5", *extra]


@pytest.mark.slow
def test_ppo_sigkill_then_resume_matches_uninterrupted(tiny_dir: Path, tmp_path: Path) -> None:
    """Tic-tac-toe: GAE with the value head (its weights and the RNG states are in the
    checkpoint); the run is killed in its second iteration and resumed."""
    env = {**os.environ, "TURNRL_PROGRESS": "0", "OMP_NUM_THREADS": "1"}
    ref = tmp_path / "ref"
    subprocess.run(ttt_cmd(tiny_dir, ref), check=True, env=env, capture_output=True)
    ref_rows = metrics(ref)
    assert [r["step"] for r in ref_rows] == [1, 2, 3, 4, 5, 6]
    assert all("value_loss" in r for r in ref_rows) and ref_rows[0]["ratio"] == pytest.approx(1.0, abs=1e-5)
    assert json.loads((ref / "summary.json").read_text())["run_config"]["advantage"] == "gae"

    out = tmp_path / "killed"
    proc = subprocess.Popen(ttt_cmd(tiny_dir, out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    m = out / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline:
        if m.exists() and len(m.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "summary.json").exists(), "the run finished before it could be killed"
    again = subprocess.run(ttt_cmd(tiny_dir, out), env=env, capture_output=True, text=True)
    assert again.returncode != 0 and "--resume" in again.stderr
    subprocess.run([*ttt_cmd(tiny_dir, out), "--resume"], check=True, env=env, capture_output=True)

    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(rows, ref_rows, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["value_loss"] == pytest.approx(b["value_loss"], abs=1e-5)
        for k in ("rollout/return", "rollout/invalid"):
            assert a.get(k) == b.get(k)
    from safetensors.torch import load_file

    for name in ("model.safetensors", "parts/value_head.safetensors"):  # the value head is kept apart
        wa = load_file(str(ref / "model" / name))
        wb = load_file(str(out / "model" / name))
        assert wa.keys() == wb.keys() and max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-5
    assert not any("value_head" in k for k in load_file(str(ref / "model" / "model.safetensors")))
    assert set(wa) == {"weight", "bias"} and wa["weight"].abs().sum() > 0  # it trained
    # the model folder loads with no unexpected key, and PPO continued from it starts from its head
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(str(ref / "model"), output_loading_info=True)
    assert not info["unexpected_keys"] and not info["missing_keys"]
    head = new_value_head(model, ref / "model")
    assert torch.equal(head.weight.data, wa["weight"]) and torch.equal(head.bias.data, wa["bias"])


def test_config_errors_are_one_line(tiny_dir: Path, tmp_path: Path, capsys) -> None:
    from turnrl.cli import main

    def run(*args: str) -> str:
        with pytest.raises(SystemExit) as exc:
            main(["train", "ppo", "--model", str(tiny_dir), "--out", str(tmp_path / "o"), *args])
        assert exc.value.code != 0
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        return err

    assert "save_every" in run("--env", "bandit", "save_every=3")
    assert "grad_accum" in run("--env", "bandit", "grad_accum=2")
    assert "episodes_per_iter" in run("--env", "bandit", "episodes_per_iter=5")
    assert "multiple of group_size (3)" in run("--env", "bandit", "group_size=3")
    assert "needs advantage=mc" in run("--env", "tictactoe", "group_size=2")
    assert "kl_estimator" in run("--env", "bandit", "kl_estimator=k2")
    assert "nope" in run("--env", "nope")
    assert "arms" in run("--env", "bandit", "--env-opt", "arms=0")
    assert "'epsilon': must be in [0, 1]" in run("--env", "bandit", "epsilon=2")
    assert "'temperature': must be a finite number > 0" in run("--env", "bandit", "temperature=0")
    assert "ppo: temperature 0.7: the PPO ratio and the KL term are taken at temperature 1" in \
        run("--env", "bandit", "temperature=0.7")
    assert "kl_estimator=k1 with kl_gradient=pathwise pulls nothing" in run("--env", "bandit", "kl_estimator=k1")
    assert "kl_gradient" in run("--env", "bandit", "kl_gradient=exact")
    assert "reward_source" in run("--env", "bandit", "reward_source=mean")
    assert "ppo: eval_split=test: unknown split" in run("--env", "bandit", "eval_split=test")
    assert "ppo: split=dev: unknown split" in run("--env", "bandit", "split=dev")
    # an env without expected rewards: one line at the first rollout, before any step
    err = run("--env", "tictactoe", "reward_source=expected", "iterations=1", "episodes_per_iter=2", "num_envs=2",
              "max_new_tokens=4", "minibatches=1", "batch_size=2")
    assert "reward_source=expected: env 'tictactoe' does not report" in err
    assert not (tmp_path / "o" / "summary.json").exists()
    with pytest.raises(ValidationError, match="epsilon"):
        PPOConfig(epsilon=2.0)


def test_compact_rationales_for_study_data() -> None:
    from turnrl.greedy_study import compact_thought

    assert compact_thought([], 2) == "Start."
    assert compact_thought([(1, 0.3), (2, 0.1)], 2) == "Stay."
    assert compact_thought([(2, 0.3), (1, 0.1)], 2) == "Switch."
    assert compact_thought([(1, 0.3), (None, 0.0)], 4) == "Untried."
    # with summary=best: the arm of the best mean so far, whichever was pulled last
    assert compact_thought([(1, 0.3), (2, 0.1)], 1, best=True) == "Best."
    assert compact_thought([(1, 0.3), (2, 0.1)], 2, best=True) == "Other."
    assert compact_thought([(1, 0.3), (2, 0.1), (1, -0.5)], 2, best=True) == "Best."
    assert compact_thought([(1, 0.3)], 3, best=True) == "Untried."
    # lose-shift: the last valid pull's reward against the threshold (an invalid turn is skipped)
    assert compact_thought([], 0, threshold=-0.5) == "Start."
    assert compact_thought([(1, 0.3), (1, -0.7)], 2, threshold=-0.5) == "Low."
    assert compact_thought([(1, -0.7), (2, -0.2), (None, 0.0)], 2, threshold=-0.5) == "High."


def test_study_refuses_a_thinking_budget_below_its_replies(tiny_dir: Path, tmp_path: Path) -> None:
    """The study's first measured run used G = 8 for 10-token replies: every sampled reply was
    cut before its action. The budget check turns that into a one-line error."""
    from turnrl.agent.prompting import PromptConfig
    from turnrl.collect import run_policy
    from turnrl.greedy_study import BANDIT_INSTRUCTION, CompactBanditPolicy, check_budget

    data = tmp_path / "greedy.jsonl"
    run_policy(CompactBanditPolicy("greedy"), "bandit", episodes=2, env_opts={"horizon": 3, "context": 3},
               prompt=PromptConfig(history=0, instruction=BANDIT_INSTRUCTION), out=data)
    longest = check_budget(data, 64, model=str(tiny_dir))
    assert 3 < longest <= 64
    with pytest.raises(TurnRLError, match="thinking budget"):
        check_budget(data, longest - 1, model=str(tiny_dir))


def test_study_paired_difference_and_common_eval_instances(tmp_path: Path) -> None:
    """Every bandit row is evaluated on the same instances (one evaluation for a one-model row,
    one per seed for a trained row); the paired difference is per instance."""
    from turnrl.greedy_study import FAST, paired_vs_start, plan_bandit

    plan = plan_bandit(tmp_path, 3, FAST)
    ids = {label: [t[2][3] for t in tasks] for label, tasks in plan["evals"].items()}
    assert len(ids["greedy-like SFT"]) == 1 and len(ids["untrained"]) == 1
    assert len(ids["RLFT"]) == 3 and len(ids["RLFT + bonus"]) == 3
    first = ids["greedy-like SFT"][0]
    assert len(first) == FAST["instances"]
    assert all(i == first for rows in ids.values() for i in rows)

    res = paired_vs_start({"greedy-like SFT": [[10.0, 20.0]], "RLFT": [[8.0, 16.0], [10.0, 18.0], [9.0, 17.0]]})
    assert res["RLFT"]["diff_seeds"]["mean"] == -2.0  # per seed -3, -1, -2
    # by instance: each instance's difference averaged over the seeds (-1, -3), its CI across the 2
    # instances; pooling seeds x instances counted each instance three times (n 6, a CI about sqrt(3) too narrow)
    assert res["RLFT"]["diff_seeds"]["n"] == 3 and res["RLFT"]["diff_pooled"]["n"] == 2
    assert res["RLFT"]["diff_pooled"]["mean"] == -2.0 and res["RLFT"]["diff_pooled"]["ci95"][0] < -2.0 - 12
    copies = paired_vs_start({"greedy-like SFT": [[10.0, 20.0, 5.0]], "RLFT": [[8.0, 16.0, 4.0]] * 3})
    once = paired_vs_start({"greedy-like SFT": [[10.0, 20.0, 5.0]], "RLFT": [[8.0, 16.0, 4.0]]})
    assert copies["RLFT"]["diff_pooled"] == once["RLFT"]["diff_pooled"]  # copies of a seed add nothing
    assert "RLFT + bonus" not in res


def test_study_tables_say_what_did_not_run_and_give_no_interval_for_one_value(tmp_path: Path) -> None:
    """Rows the study did not run vanished from the table (``not_run`` was in results.json only), and a
    one-model row or a one-seed run printed ``[3.02, 3.02]`` as if it were an interval."""
    from turnrl.greedy_study import report

    one = {"mean": 3.02, "ci95": [3.02, 3.02], "n": 1}
    row = {"regret_seeds": one, "coverage_seeds": {**one, "mean": 0.1, "ci95": [0.1, 0.1]}, "regret_pooled":
           {"mean": 3.02, "ci95": [1.5, 4.5], "n": 4}, "actions_pct": {"optimal": 0, "greedy": 100, "other": 0},
           "invalid": 0.0}
    curve = {"steps": [1, 2], "mean": [1.0, 2.0], "lo": [1.0, 2.0], "hi": [1.0, 2.0]}
    result = {"bandit": {"rows": {"untrained": row}, "not_run": ["RLFT", "RLFT + bonus"], "env": {"horizon": 2},
                         "instances_per_seed": 4, "seeds": 1,
                         "curves": [{"policy": "untrained", "regret": curve, "coverage": curve}]},
              "tictactoe": {"rows": {}, "not_run": ["RLFT"]}}
    report(result, tmp_path)
    text = (tmp_path / "rlft-tables.md").read_text()
    assert "| untrained | 3.02 | (one value: no CI) | 0.10 | (one value: no CI) | [1.50, 4.50] |" in text
    assert "Not run: RLFT, RLFT + bonus" in text and "Tic-tac-toe: not run: RLFT" in text


def test_study_knowing_doing_design_rows_and_start_data(tmp_path: Path) -> None:
    """The knowing-doing design: its start's data always says ``Low.`` after a low reward but moves
    on only some of the time (to the next label), one history line in the prompt; the reference rows
    are the UCB SFT and the lose-shift SFT, each with its own data, SFT dir and steps."""
    from turnrl.data.io import iter_trajectories
    from turnrl.greedy_study import DESIGNS, KNOWING_DOING, LABELS, collect_bandit, plan_bandit, run_study

    cfg = {**KNOWING_DOING, "sft_episodes": 40, "bandit_env": {**KNOWING_DOING["bandit_env"], "horizon": 25}}
    plan = plan_bandit(tmp_path, 3, cfg)
    assert list(plan["evals"]) == ["untrained", "greedy-like SFT", "UCB SFT", "lose-shift SFT", "RLFT",
                                   "RLFT + bonus"]
    assert [(t[2][0].name, t[2][1].name, t[2][2]) for t in plan["ref_sft"]] == [
        ("ucb.jsonl", "sft-ucb", 800), ("lose-shift.jsonl", "sft-lose-shift", 1500)]
    assert all(t[2][0] == tmp_path / "sft-greedy" / "model" and t[2][3]["env_opts"]["context"] == 1
               for t in plan["rl"])
    collect_bandit(tmp_path, cfg)
    low = moved = 0
    for traj in iter_trajectories(tmp_path / "data" / "greedy.jsonl"):
        last = None
        for m in traj.messages:
            if m.role == "assistant":
                if m.content.startswith("Low."):
                    low += 1
                    assert m.action in (last, LABELS[(LABELS.index(last) + 1) % 10])
                    moved += m.action != last
                elif m.content.startswith("High."):
                    assert m.action == last
                last = m.action
            elif last is not None:
                assert m.content.count("Step=") == 1  # one history line
    assert low > 60 and 0.15 < moved / low < 0.45  # follow 0.3
    assert set(DESIGNS) == {"commit", "knowing-doing", "best-summary", "untried-copy", "narrow-gap"}
    with pytest.raises(TurnRLError, match="--design must be one of"):
        run_study(tmp_path, design="greedy")
    # the first design keeps its file names and step counts (its documented runs resume and reproduce)
    first = plan_bandit(tmp_path / "commit", 3, DESIGNS["commit"])
    assert [(t[2][0].name, t[2][1].name, t[2][2]) for t in first["ref_sft"]] == [("ucb.jsonl", "sft-ucb", 60)]
    assert list(first["evals"]) == ["untrained", "greedy-like SFT", "UCB SFT", "RLFT", "RLFT + bonus"]


def test_study_narrow_gap_design_moves_on_after_about_45_percent_of_low_rewards(tmp_path: Path) -> None:
    """The narrow-gap design: the knowing-doing design whose start moves on after about 45% of its
    ``Low.`` rationales (still under one half, so greedy decoding repeats the arm), with the PPO lr
    constant after the warm-up; everything else as the knowing-doing design."""
    from turnrl.data.io import iter_trajectories
    from turnrl.greedy_study import KNOWING_DOING, NARROW_GAP, collect_bandit, plan_bandit

    assert {k: v for k, v in NARROW_GAP.items() if k not in ("greedy_policy", "ppo")} == {
        k: v for k, v in KNOWING_DOING.items() if k not in ("greedy_policy", "ppo")}
    assert NARROW_GAP["ppo"] == {**KNOWING_DOING["ppo"], "lr_schedule": "constant"}
    cfg = {**NARROW_GAP, "sft_episodes": 60, "bandit_env": {**NARROW_GAP["bandit_env"], "horizon": 30}}
    assert {t[2][3]["lr_schedule"] for t in plan_bandit(tmp_path, 2, cfg)["rl"]} == {"constant"}
    collect_bandit(tmp_path, cfg)
    decisions = []
    for traj in iter_trajectories(tmp_path / "data" / "greedy.jsonl"):
        acts = [m for m in traj.messages if m.role == "assistant"]
        decisions += [b.action != a.action for a, b in zip(acts[:-1], acts[1:], strict=True) if b.content.startswith("Low.")]
    assert len(decisions) > 150 and 0.35 < sum(decisions) / len(decisions) < 0.55  # follow 0.45, not 0.3


def test_study_start_seed_draws_another_start_of_the_same_design(tmp_path: Path) -> None:
    """``start_seed`` seeds the bandit part's data and SFTs: the same seed gives the same data, another seed
    other data (other train instances and draws) and SFTs seeded by it; absent, it is 0 (the folders made
    before it resume unchanged)."""
    from turnrl.greedy_study import NARROW_GAP, collect_bandit, plan_bandit

    cfg = {**NARROW_GAP, "sft_episodes": 8, "bandit_env": {**NARROW_GAP["bandit_env"], "horizon": 10}}
    data = {}
    for name, seed in (("a", 1), ("b", 1), ("c", 2), ("d", None)):
        run_cfg = cfg if seed is None else {**cfg, "start_seed": seed}
        collect_bandit(tmp_path / name, run_cfg)
        data[name] = (tmp_path / name / "data" / "greedy.jsonl").read_bytes()
        plan = plan_bandit(tmp_path / name, 1, run_cfg)
        assert {t[2][5] for t in plan["sft"] + plan["ref_sft"]} == {seed or 0}
    assert data["a"] == data["b"] and data["a"] != data["c"] and data["d"] not in (data["a"], data["c"])


def test_study_folder_holds_one_design_and_its_settings(tmp_path: Path, monkeypatch) -> None:
    """A study folder remembers its design and settings (the pipelines' ``settings.json``): another
    design, or changed settings, is a one-line error naming the folder and the changed keys, not a
    silent mix of stale stages."""
    import turnrl.greedy_study as g
    from turnrl.pipelines.iterative import check_settings

    # --report-only reports an earlier study's rows: on a folder with none it began one and reported nothing
    with pytest.raises(TurnRLError, match=r"new: holds no study \(no settings\.json\); --report-only reports"):
        g.run_study(tmp_path / "new", fast=True, parts=("bandit",), report_only=True)
    assert not (tmp_path / "new").exists()
    check_settings(tmp_path, {"design": "fast", "config": g.FAST})  # what a study's first run records
    res = g.run_study(tmp_path, fast=True, parts=("bandit", "tictactoe"), report_only=True)
    assert not (tmp_path / "data").exists()  # it plays nothing: it had collected every part's SFT data
    assert "RLFT" in res["bandit"]["not_run"] and "RLFT" in res["tictactoe"]["not_run"]
    g.run_study(tmp_path, fast=True, parts=("bandit",), report_only=True)  # the same again: fine
    with pytest.raises(TurnRLError, match=r"made with other settings \(design: \"fast\", now \"knowing-doing\""):
        g.run_study(tmp_path, parts=("bandit",), report_only=True, design="knowing-doing")
    monkeypatch.setattr(g, "FAST", {**g.FAST, "ppo": {**g.FAST["ppo"], "lr": 1e-3}, "sft_steps": 5})
    with pytest.raises(TurnRLError) as e:
        g.run_study(tmp_path, fast=True, parts=("bandit",), report_only=True)
    assert str(tmp_path) in str(e.value) and "config.ppo.lr: 0.0005, now 0.001" in str(e.value)
    assert "config.sft_steps: 4, now 5" in str(e.value)


def test_bandit_eval_counts_how_often_low_is_acted_on(monkeypatch) -> None:
    """``moves_on_low``: of the replies whose rationale is ``Low.``, the share that leave the last arm
    (a policy that never follows its rationale 0, one that always does 1)."""
    import turnrl.greedy_study as g

    env = {"arms": 10, "noise": "medium", "horizon": 12, "context": 1}
    ids = [f"bandit-{100000 + i}" for i in range(6)]
    got = {}
    for follow in (0.0, 1.0):
        monkeypatch.setattr(g, "_model_policy", lambda *a, f=follow, **k: g.CompactBanditPolicy(
            f"lose-shift:threshold=0.3,follow={f}"))
        r = g.bandit_eval("scripted", env, ids, 16, g.BANDIT_INSTRUCTION)
        assert r["low_replies"] > 5 and r["invalid"] == 0
        got[follow] = r["moves_on_low"]
    assert got == {0.0: 0.0, 1.0: 1.0}

    class Unreadable:  # says Low. but names no button: the env's random fallback is not counted
        name = "unreadable"

        def act(self, requests: list[Any]) -> list[Any]:
            from turnrl.rollout.policies import Reply

            return [Reply("Low.\nACTION=nothing") for _ in requests]

    monkeypatch.setattr(g, "_model_policy", lambda *a, **k: Unreadable())
    r = g.bandit_eval("unreadable", env, ids, 16, g.BANDIT_INSTRUCTION)
    assert r["invalid"] == 1.0 and r["low_replies"] == 0 and r["moves_on_low"] is None


def test_bandit_eval_samples_with_torch_seeded_by_seed(monkeypatch) -> None:
    """``temperature`` reaches the model policy; the episodes' draws come from torch seeded by ``seed`` (the same
    seed the same episodes, another seed others), and the caller's torch stream does not move."""
    import torch

    import turnrl.greedy_study as g

    temps = []

    class TorchDraw:  # a stand-in for a sampled model: each reply's button is a draw from torch's RNG
        name = "torch-draw"

        def act(self, requests: list[Any]) -> list[Any]:
            from turnrl.rollout.policies import Reply

            return [Reply(f"Low.\nACTION={g.LABELS[int(torch.randint(10, (1,)))]}") for _ in requests]

    def policy(model: Any, max_new_tokens: int, temperature: float = 0.0) -> TorchDraw:
        temps.append(temperature)
        return TorchDraw()

    monkeypatch.setattr(g, "_model_policy", policy)
    env = {"arms": 10, "noise": "medium", "horizon": 8, "context": 1}
    ids = [f"bandit-{100000 + i}" for i in range(4)]
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = g.bandit_eval("m", env, ids, 16, g.BANDIT_INSTRUCTION, temperature=1.0, seed=5)
    b = g.bandit_eval("m", env, ids, 16, g.BANDIT_INSTRUCTION, temperature=1.0, seed=5)
    c = g.bandit_eval("m", env, ids, 16, g.BANDIT_INSTRUCTION, temperature=1.0, seed=6)
    assert torch.equal(torch.get_rng_state(), before)
    assert temps == [1.0, 1.0, 1.0] and a["invalid"] == 0
    assert a["final_regret"] == b["final_regret"] and a["final_regret"] != c["final_regret"]
    g.bandit_eval("m", env, ids, 16, g.BANDIT_INSTRUCTION)
    assert temps[-1] == 0.0


def test_bandit_eval_with_summary_best_counts_whether_the_word_names_the_arm(monkeypatch) -> None:
    """``said`` (summary=best only): per rationale word, replies after the first pull and those whose
    arm is the one the word names. The explore-first policy is right every time; a policy that says
    ``Best.`` and plays a random button is right about as often as chance."""
    import turnrl.greedy_study as g

    env = {"arms": 10, "noise": "medium", "horizon": 16, "context": 0, "summary": "best"}
    ids = [f"bandit-{100000 + i}" for i in range(8)]
    monkeypatch.setattr(g, "_model_policy", lambda *a, **k: g.CompactBanditPolicy("greedy:init=100"))
    r = g.bandit_eval("scripted", env, ids, 16, g.BANDIT_INSTRUCTION)
    said = r["said"]
    assert said["Untried."] == {"replies": 8 * 9, "right": 8 * 9}  # pulls 2-10 of every instance
    assert said["Best."] == {"replies": 8 * 6, "right": 8 * 6} and r["final_coverage"] == [1.0] * 8

    class SaysBest:  # the word without the arm: a random button every time
        name = "says-best"

        def act(self, requests: list[Any]) -> list[Any]:
            from turnrl.rollout.policies import Reply

            return [Reply(f"Best.\nACTION={r.rng.choice(g.LABELS)}") for r in requests]

    monkeypatch.setattr(g, "_model_policy", lambda *a, **k: SaysBest())
    r = g.bandit_eval("says-best", env, ids, 16, g.BANDIT_INSTRUCTION)
    assert r["said"]["Best."]["replies"] == 8 * 15 and r["said"]["Untried."]["replies"] == 0
    assert 0 < r["said"]["Best."]["right"] < 8 * 15 * 0.6
    env_kd = {"arms": 10, "noise": "medium", "horizon": 4, "context": 1}
    assert "said" not in g.bandit_eval("says-best", env_kd, ids[:2], 16, g.BANDIT_INSTRUCTION)


def test_study_training_stages_hold_the_stage_lock(tmp_path: Path, monkeypatch) -> None:
    """A worker of a killed ``--jobs`` study outlives it and may still train a stage: a rerun's stage
    takes the stage's lock (waiting for that worker) and only then reads whether the stage is done."""
    import contextlib

    import turnrl.greedy_study as g
    import turnrl.pipelines.iterative as it

    held: list[Path] = []

    @contextlib.contextmanager
    def lock(out: Path, poll: float = 5.0):
        held.append(out)
        (out / "summary.json").write_text("{}")  # the other worker finished while we waited
        yield

    monkeypatch.setattr(it, "stage_lock", lock)
    for name, call in (("sft", lambda o: g._sft(tmp_path / "data.jsonl", o, 1, 1e-3, 1)),
                       ("ppo", lambda o: g._ppo(tmp_path / "m", "bandit", o, {}))):
        (tmp_path / name).mkdir()
        assert call(tmp_path / name) == tmp_path / name / "model"  # done once the lock was ours: no training
    assert held == [tmp_path / "sft", tmp_path / "ppo"]


def test_study_pools_the_said_counts_of_a_row_over_its_seeds(tmp_path: Path) -> None:
    """A row of several seeds reports the ``said`` counts summed over them; a row without them none."""
    import json

    from turnrl.greedy_study import BEST_SUMMARY, aggregate_bandit

    def report(i: int, said: bool) -> str:
        r = {"final_regret": [10.0 + i, 12.0], "final_coverage": [0.1, 0.2 * i], "regret": {"mean": [1.0], "lo": [0.5], "hi": [1.5]},
             "coverage": {"mean": [0.1], "lo": [0.0], "hi": [0.2]}, "actions_pct": {"optimal": 1.0, "greedy": 90.0, "other": 9.0}, "invalid": 0.0}
        if said:
            r["said"] = {"Best.": {"replies": 10 * i, "right": 5 * i}, "Untried.": {"replies": i, "right": i}}
        path = tmp_path / f"{i}-{said}.json"
        path.write_text(json.dumps(r))
        return str(path)

    evals = {"RLFT": [("", None, (report(i, True),)) for i in (1, 2)], "start": [("", None, (report(3, False),))]}
    rows = aggregate_bandit(tmp_path, 2, BEST_SUMMARY, evals)["rows"]
    assert rows["RLFT"]["said"] == {"Best.": {"replies": 30, "right": 15}, "Untried.": {"replies": 3, "right": 3}}
    assert "said" not in rows["start"]
    # a row with one seed's evaluation missing (a study still running) is not reported as if complete
    evals["RLFT"].append(("", None, (str(tmp_path / "missing.json"),)))
    res = aggregate_bandit(tmp_path, 3, BEST_SUMMARY, evals)
    assert "RLFT" not in res["rows"] and res["not_run"] == ["RLFT"] and "start" in res["rows"]


def test_study_best_summary_design_collects_its_start_and_references(tmp_path: Path) -> None:
    """The best-summary design: the prompt names the best tried arm and the untried ones (no history
    line); the start's data is epsilon-greedy with ``Best.`` / ``Other.`` / ``Untried.`` rationales,
    the explore-first reference says ``Untried.`` until every arm is tried, then ``Best.``."""
    from turnrl.data.io import iter_trajectories
    from turnrl.greedy_study import BEST_SUMMARY, collect_bandit, plan_bandit

    cfg = {**BEST_SUMMARY, "sft_episodes": 6, "bandit_env": {**BEST_SUMMARY["bandit_env"], "horizon": 14}}
    plan = plan_bandit(tmp_path, 3, cfg)
    assert list(plan["evals"]) == ["untrained", "greedy-like SFT", "UCB SFT", "explore-first SFT", "RLFT",
                                   "RLFT + bonus"]
    assert all(t[2][3]["env_opts"]["summary"] == "best" and t[2][3]["lr"] == 5e-4 for t in plan["rl"])
    collect_bandit(tmp_path, cfg)
    words: dict[str, list[str]] = {}
    for key in ("greedy", "explore-first"):
        for traj in iter_trajectories(tmp_path / "data" / f"{key}.jsonl"):
            users = [m.content for m in traj.messages if m.role == "user"]
            assert all("Step=" not in u for u in users) and "Untried:" in users[1]
            words.setdefault(key, []).extend(m.content.split("\n")[0] for m in traj.messages if m.role == "assistant")
    assert {"Best.", "Other.", "Untried."} <= set(words["greedy"])
    assert words["explore-first"][:14] == ["Start.", *["Untried."] * 9, *["Best."] * 4]


def test_study_untried_copy_design_explores_only_with_untried_labels(tmp_path: Path) -> None:
    """The untried-copy design: the best-summary prompt and references, but the start's exploring
    replies say ``Untried.`` and play a label the prompt lists as untried (never ``Other.`` while one
    is left), about 30% of those steps; PPO discounts with gamma 0.5, all else as before."""
    from turnrl.data.io import iter_trajectories
    from turnrl.greedy_study import BEST_SUMMARY, UNTRIED_COPY, collect_bandit, plan_bandit

    cfg = {**UNTRIED_COPY, "sft_episodes": 30, "bandit_env": {**UNTRIED_COPY["bandit_env"], "horizon": 12}}
    plan = plan_bandit(tmp_path, 3, cfg)
    assert [t[2][1].name for t in plan["ref_sft"]] == [t[2][1].name for t in plan_bandit(tmp_path, 3, BEST_SUMMARY)["ref_sft"]]
    assert {t[2][3]["gamma"] for t in plan["rl"]} == {0.5} and {t[2][3]["exploration_bonus"] for t in plan["rl"]} == {0.0, 1.0}
    assert {k: v for k, v in UNTRIED_COPY["ppo"].items() if k != "gamma"} == {
        k: v for k, v in BEST_SUMMARY["ppo"].items() if k != "gamma"}
    collect_bandit(tmp_path, cfg)
    untried_states = untried_replies = 0
    for traj in iter_trajectories(tmp_path / "data" / "greedy.jsonl"):
        msgs = traj.messages[1:]
        for user, reply in zip(msgs[2::2], msgs[3::2], strict=True):
            listed = user.content.split("Untried: ")[1].split(".")[0].split(", ") if "Untried: " in user.content else []
            word = reply.content.split("\n")[0]
            if listed:
                untried_states += 1
                assert word in ("Best.", "Untried.")
                untried_replies += word == "Untried."
                assert (reply.action in listed) == (word == "Untried.")
    assert untried_states > 200 and 0.2 < untried_replies / untried_states < 0.4


def test_study_tictactoe_rlft_starts_from_minimax_sft_and_pairs_by_opponent_seed(tmp_path: Path) -> None:
    """Tic-tac-toe RLFT starts from the minimax SFT (trained first, as the claim's start); RLFT
    seed s and every one-model row meet opponent seed 1000 + s; the paired difference is per seed."""
    from turnrl.greedy_study import FULL, aggregate_ttt, plan_ttt

    plan = plan_ttt(tmp_path, 3, FULL)
    assert plan["main"] == ("minimax SFT", "RLFT")
    assert [t[2][1] for t in plan["sft"]] == [tmp_path / "ttt-sft-minimax"]
    assert [t[2][1] for t in plan["ref_sft"]] == [tmp_path / "ttt-sft-random"]
    assert all(t[2][0] == tmp_path / "ttt-sft-minimax" / "model" for t in plan["rl"])
    assert [t[2][3]["seed"] for t in plan["rl"]] == [0, 1, 2]
    for tasks in plan["evals"].values():
        for opp in ("random", "minimax"):
            assert [t[2][5] for t in tasks if t[2][2] == opp] == [1000, 1001, 1002]

    # hand-made evaluations: the start returns 0.5 / 0.4 / 0.6 against random, RLFT 0.7 / 0.5 / 0.9
    means = {("minimax SFT", "random"): [0.5, 0.4, 0.6], ("RLFT", "random"): [0.7, 0.5, 0.9],
             ("minimax SFT", "minimax"): [-0.5, -0.5, -0.5], ("RLFT", "minimax"): [-0.5, -0.25, -0.75]}
    evals = {label: plan["evals"][label] for label in ("minimax SFT", "RLFT")}
    for label, tasks in evals.items():
        for t in tasks:
            m = means[(label, t[2][2])][t[2][5] - 1000]
            Path(t[2][0]).parent.mkdir(parents=True, exist_ok=True)
            Path(t[2][0]).write_text(json.dumps({"mean": m, "returns": [m, m], "invalid": 0.1, "win": 0.5}))
    res = aggregate_ttt(3, FULL, {**evals, "untrained": plan["evals"]["untrained"]})
    assert res["not_run"] == ["untrained"]
    assert res["rows"]["RLFT"]["random"]["per_seed"] == [0.7, 0.5, 0.9]
    d = res["paired"]["RLFT"]["random"]  # 0.2, 0.1, 0.3
    assert d["mean"] == pytest.approx(0.2) and d["n"] == 3 and d["ci95"][0] < 0.2 < d["ci95"][1]
    assert res["paired"]["RLFT"]["minimax"]["mean"] == pytest.approx(0.0)


@pytest.mark.slow
def test_study_tictactoe_fast_runs_end_to_end_in_two_workers(tiny_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """The study's tic-tac-toe part on toy sizes, two worker processes: every row is evaluated
    (an RLFT row's evaluation waits for its training) and the report names the paired difference."""
    import shutil

    from turnrl.greedy_study import run_study
    from turnrl.models.tiny import TINY_VERSION

    home = tmp_path / "home"
    shutil.copytree(tiny_dir, home / TINY_VERSION)
    monkeypatch.setenv("TURNRL_HOME", str(home))
    res = run_study(tmp_path / "study", seeds=2, fast=True, parts=("tictactoe",), jobs=2)
    t = res["tictactoe"]
    assert "not_run" not in t
    assert set(t["rows"]) == {"untrained", "random-move SFT", "minimax SFT", "RLFT"}
    assert all(len(r["random"]["per_seed"]) == 2 for r in t["rows"].values())
    assert (tmp_path / "study" / "ttt-rlft-s1" / "model" / "config.json").is_file()
    assert "RLFT minus minimax SFT (its start)" in (tmp_path / "study" / "rlft-tables.md").read_text()


def test_split_modules_takes_a_module_apart_by_name() -> None:
    t = {k: torch.full((1,), float(i)) for i, k in enumerate(
        ["model.embed.weight", "value_head.weight", "value_head.bias", "base.model.value_head.x.weight",
         "model.value_headless.weight", "lm_head.value_head"])}
    kept, apart = split_modules(t, ("value_head", "critic"))
    assert sorted(kept) == ["lm_head.value_head", "model.embed.weight", "model.value_headless.weight"]
    assert list(apart) == ["value_head"]  # no parameter of "critic": no entry
    assert sorted(apart["value_head"]) == ["bias", "weight", "x.weight"]
    assert apart["value_head"]["weight"].item() == 1.0 and apart["value_head"]["x.weight"].item() == 3.0
    assert split_modules(t, ()) == (t, {})


def test_a_saved_value_head_that_does_not_fit_is_a_one_line_error(tiny_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_dir))
    assert new_value_head(model, tiny_dir).weight.abs().sum() == 0  # no saved head: a zero one
    hidden = int(model.config.hidden_size)
    save_file({"weight": torch.ones(1, hidden), "bias": torch.full((1,), 2.0)}, str(tmp_path / "value_head.safetensors"))
    head = new_value_head(model, tmp_path)
    assert head.weight.sum().item() == hidden and head.bias.item() == 2.0
    save_file({"weight": torch.ones(1, hidden + 1), "bias": torch.ones(1)}, str(tmp_path / "value_head.safetensors"))
    with pytest.raises(TurnRLError, match=r"value_head\.safetensors: not a value head for this model") as e:
        new_value_head(model, tmp_path)
    assert "\n" not in str(e.value)
    (tmp_path / "value_head.safetensors").write_text("xx")
    with pytest.raises(TurnRLError, match="not a value head"):
        new_value_head(model, tmp_path)


@pytest.mark.slow
def test_ppo_lora_gae_keeps_the_value_head_beside_the_merged_model(tiny_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    cfg = PPOConfig(instruction=TTT_INSTRUCTION, iterations=1, episodes_per_iter=2, batch_size=1, minibatches=1,
                    ppo_epochs=1, max_new_tokens=4, row_tokens=1024, lr=1e-3, lora={"r": 4, "alpha": 8})
    train_ppo(str(tiny_dir), "tictactoe", tmp_path / "o", cfg)
    model_dir = tmp_path / "o" / "model"
    assert not any("value_head" in k or "lora" in k for k in load_file(str(model_dir / "model.safetensors")))
    assert set(load_file(str(model_dir / "parts" / "value_head.safetensors"))) == {"weight", "bias"}
    assert sorted(p.name for p in model_dir.glob("*.safetensors")) == ["model.safetensors"]  # all vLLM reads


def test_ppo_rollouts_stop_at_the_generation_configs_end_ids_as_evaluation_does(tiny_dir: Path, tmp_path: Path,
                                                                                  monkeypatch) -> None:
    """The tiny model's generation config ends a reply at ``<|endoftext|>`` too (not only the
    tokenizer's ``<|im_end|>``): ``turnrl eval`` and ArCHer stop there, so PPO's rollouts must."""
    from transformers import AutoTokenizer

    from turnrl.rollout.policies import load_policy
    from turnrl.train import ppo

    seen: dict[str, Any] = {}

    def stop(self: Any, resume: bool = False) -> Any:
        seen["stops"] = list(self.before_step.__self__.chat.stop_token_ids)
        raise RuntimeError("stop before training")

    monkeypatch.setattr(ppo.Trainer, "train", stop)
    with pytest.raises(RuntimeError, match="stop before training"):
        train_ppo(str(tiny_dir), "bandit", tmp_path / "o", bandit_cfg(iterations=1))
    end = AutoTokenizer.from_pretrained(tiny_dir).convert_tokens_to_ids("<|endoftext|>")
    assert end in seen["stops"]
    assert set(seen["stops"]) == set(load_policy(str(tiny_dir)).chat.stop_token_ids)


def test_ppo_eval_every_without_eval_episodes_is_a_one_line_error(tiny_dir: Path, tmp_path: Path, capsys) -> None:
    """Evaluation needs both settings; one alone used to be silently ignored (no eval/ rows)."""
    from turnrl.cli import main

    small = ["iterations=1", "episodes_per_iter=2", "num_envs=2", "max_new_tokens=4", "minibatches=1", "batch_size=2",
             "--env-opt", "arms=3", "--env-opt", "horizon=2"]
    for setting in ("eval_every=1", "eval_episodes=2"):
        with pytest.raises(SystemExit) as exc:
            main(["train", "ppo", "--model", str(tiny_dir), "--env", "bandit", "--out", str(tmp_path / setting),
                  setting, *small])
        assert exc.value.code != 0
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "eval_every" in err and "eval_episodes" in err, err
        assert not (tmp_path / setting / "summary.json").exists()


def test_ppo_resume_may_change_when_it_checkpoints(tiny_dir: Path, tmp_path: Path) -> None:
    """As every trainer-core run (docs/training.md): ``save_every`` and ``keep_checkpoints`` are not
    part of the config a resume must repeat (they were hashed through the run config)."""
    cfg = bandit_cfg(iterations=1, save_every=4)
    first = train_ppo(str(tiny_dir), "bandit", tmp_path / "run", cfg)
    again = train_ppo(str(tiny_dir), "bandit", tmp_path / "run",
                      cfg.model_copy(update={"save_every": 0, "keep_checkpoints": 3}), resume=True)
    assert again.steps == first.steps and again.final_loss == pytest.approx(first.final_loss)
    with pytest.raises(TurnRLError, match=r"config changed since this checkpoint was written \(run\.ppo\.lr: "
                                          r"0\.001, now 0\.002; train\.lr: 0\.001, now 0\.002\)"):
        train_ppo(str(tiny_dir), "bandit", tmp_path / "run", cfg.model_copy(update={"lr": 2e-3}), resume=True)


def test_study_bandit_eval_does_not_credit_random_stand_ins_for_invalid_replies() -> None:
    """The untrained tiny model writes no valid arm: every pull is the sampler's random stand-in, which
    the knowing-doing shares must not score as the model's optimal or greedy action."""
    from turnrl.greedy_study import bandit_eval

    out = bandit_eval("tiny", {"horizon": 6, "context": 3}, ["bandit-100000", "bandit-100001", "bandit-100002"],
                      max_new_tokens=6, instruction="Pick an arm. Answer as: ACTION=<arm>")
    assert out["invalid"] == 1.0
    assert out["actions_pct"] == {"optimal": 0.0, "greedy": 0.0, "other": 100.0}


def test_ppo_gae_values_every_turn_epsilon_greedy_ones_included(tiny_dir: Path, tmp_path: Path,
                                                                 monkeypatch) -> None:
    """GAE needs V(s_t) at every turn: an epsilon-greedy turn (not the model's tokens, not trained)
    is still tokenized for its state's value instead of entering GAE with V = 0."""
    from turnrl.train import ppo

    passes: list[list[tuple[int, int, bool]]] = []
    runner: dict[str, Any] = {}
    orig = ppo.PPORunner._old_pass

    def record(self: Any, episodes: Any, *, values: bool) -> None:
        runner["it"] = self
        passes.append([(s.episode, s.turn, s.trained) for eps in episodes for s in eps])
        orig(self, episodes, values=values)

    monkeypatch.setattr(ppo.PPORunner, "_old_pass", record)
    train_ppo(str(tiny_dir), "bandit", tmp_path / "run", bandit_cfg(iterations=1, advantage="gae", epsilon=0.7))
    (seen,) = passes
    trajs = runner["it"].last_rollout
    assert sorted((e, t) for e, t, _ in seen) == [(e, t) for e, tr in enumerate(trajs) for t in range(tr.num_turns)]
    aid = {(e, t) for e, tr in enumerate(trajs) for t, m in enumerate(m for m in tr.messages if m.role == "assistant")
           if not m.token_ids}
    assert aid and {(e, t) for e, t, trained in seen if not trained} == aid
    assert all(s.trained for eps in runner["it"].buffer.items for s in eps)  # only the model's turns train


def test_a_minibatch_spans_the_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under several processes the core's global batch is batch_size x grad_accum x processes: a
    minibatch stays episodes_per_iter / minibatches episodes (checked with 2 processes under
    torchrun: the same epochs and units per step as one process)."""
    from turnrl.train import ppo

    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun and accelerate launch set it: no accelerate state built
    assert ppo._num_processes() == 2
    ppo._check(bandit_cfg(episodes_per_iter=4, minibatches=2, batch_size=1), "bandit")
    with pytest.raises(TurnRLError, match="times the 2 processes"):
        ppo._check(bandit_cfg(episodes_per_iter=4, minibatches=2, batch_size=2), "bandit")
