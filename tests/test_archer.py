"""ArCHer, CHAI and filtered BC: target networks, TD regression on a hand-built MDP,
transitions, kill-and-resume with the replay buffer, end-to-end runs on the tiny model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from turnrl.data.schema import Message, Trajectory
from turnrl.train.archer import (
    CriticExample,
    CriticObjective,
    OnlineConfig,
    OnlineTrainer,
    ReplayBuffer,
    normalize_advantages,
    train_online,
    transitions,
)
from turnrl.train.core import _make_accelerator
from turnrl.train.critic import CriticConfig, build_critic, make_target, polyak_update

SMALL_CRITIC = {"hidden": 32, "intermediate": 64, "layers": 1, "heads": 2}


def _critic(tok, **kw):
    cfg = CriticConfig(**{**SMALL_CRITIC, **kw})
    return build_critic(cfg, tok, seed=0), cfg


def test_polyak_moves_target_by_exactly_tau(tiny_tokenizer) -> None:
    critic, _ = _critic(tiny_tokenizer)
    target = make_target(critic)
    assert all(not p.requires_grad for p in target.parameters())
    with torch.no_grad():  # make online and target differ everywhere
        for p in critic.parameters():
            p.add_(torch.randn_like(p))
    before = [p.detach().clone() for p in target.parameters()]
    online = [p.detach().clone() for p in critic.parameters()]
    for step in range(3):
        polyak_update(target, critic, 0.1)
        for b, o, t in zip(before, online, target.parameters(), strict=True):
            expected = b + 0.1 * (o - b)
            assert torch.allclose(t, expected, atol=1e-6, rtol=0), f"update {step}"
            b.copy_(t)
    polyak_update(target, critic, 0.0)
    assert all(torch.equal(b, t) for b, t in zip(before, target.parameters(), strict=True))
    polyak_update(target, critic, 1.0)
    assert all(torch.equal(o, t) for o, t in zip(online, target.parameters(), strict=True))
    # the target shares the tokenizer instead of copying it
    assert target.encoder.tokenizer is critic.encoder.tokenizer
    with pytest.raises(ValueError, match="tau"):
        polyak_update(target, critic, 1.5)


def test_q_regression_on_a_two_step_mdp_converges_to_the_true_values(tiny_tokenizer, tmp_path: Path) -> None:
    """start --left--> middle (r 0) --go--> end (r 2); start --right--> end (r 1).
    The policy plays left then go. gamma 0.9: Q(middle, go) = V(middle) = 2,
    Q(start, left) = 0 + 0.9 * 2 = 1.8 = V(start), Q(start, right) = 1."""
    gamma, tau = 0.9, 0.1
    critic, cfg = _critic(tiny_tokenizer, lr=3e-3, batch_size=3)
    target = make_target(critic)
    trainer = OnlineTrainer(critic, cfg, tmp_path, CriticObjective(gamma, v_use_min=False), total_steps=400,
                            accelerator=_make_accelerator("no"))
    online = trainer.unwrapped_model
    data = [("room: start", "left", 0.0, "room: middle", 0.0), ("room: start", "right", 1.0, "room: end", 1.0),
            ("room: middle", "go", 2.0, "room: end", 1.0)]
    policy = {"room: start": "left", "room: middle": "go"}
    for _ in range(400):
        with torch.no_grad():
            tq1, tq2 = target.q([d[0] for d in data], [policy[d[0]] for d in data])
            tv1, tv2 = target.v([d[3] for d in data])
        examples = [CriticExample(s, a, r, done, float(tv1[i]), float(tv2[i]), float(tq1[i]), float(tq2[i]))
                    for i, (s, a, r, _, done) in enumerate(data)]
        trainer.step_on(examples)
        polyak_update(target, online, tau)
    with torch.no_grad():
        q1, q2 = online.q([d[0] for d in data], [d[1] for d in data])
        v1, v2 = online.v(["room: start", "room: middle"])
    for q in (q1, q2):
        assert q.tolist() == pytest.approx([1.8, 1.0, 2.0], abs=0.1)
    for v in (v1, v2):
        assert v.tolist() == pytest.approx([1.8, 2.0], abs=0.1)


def test_transitions_of_an_episode() -> None:
    msgs = [Message("system", "sys"), Message("user", "o0"), Message("assistant", "a0"),
            Message("user", "o1"), Message("assistant", "a1")]
    traj = Trajectory(id="e", env="x", task_id="t", messages=msgs, rewards=[0.0, 1.0], return_=1.0,
                      terminated=True, meta={"final_observation": "won"})
    tr = transitions(traj, history=None)
    assert [t["a"] for t in tr] == ["a0", "a1"] and [t["r"] for t in tr] == [0.0, 1.0]
    assert [t["done"] for t in tr] == [0.0, 1.0]
    assert tr[0]["s"] == "system: sys\nuser: o0"
    assert tr[0]["s2"] == tr[1]["s"] == "system: sys\nuser: o0\nassistant: a0\nuser: o1"
    assert tr[1]["s2"].endswith("assistant: a1\nuser: won")
    assert [m["role"] for m in tr[1]["view"]] == ["system", "user", "assistant", "user"]
    assert transitions(traj, history=0)[1]["s"] == "system: sys\nuser: o1"
    traj.terminated, traj.truncated = False, True  # a truncated episode bootstraps
    assert transitions(traj, history=None)[-1]["done"] == 0.0


@pytest.mark.parametrize("history", [0, 1])
def test_the_last_next_state_is_rendered_like_every_state_with_a_short_history(history: int) -> None:
    """A truncated episode bootstraps from V(s') of its last transition: that s' must be the view
    the agent would have before a next turn (the last ``history`` exchanges and the final
    observation), as every ``s`` is, not the last view with one more exchange appended."""
    msgs = [Message("system", "sys"), Message("user", "o0"), Message("assistant", "a0"),
            Message("user", "o1"), Message("assistant", "a1")]
    traj = Trajectory(id="e", env="x", task_id="t", messages=msgs, rewards=[0.0, 0.0], return_=0.0,
                      terminated=False, truncated=True, meta={"final_observation": "o2"})
    longer = Trajectory(id="f", env="x", task_id="t", messages=[*msgs, Message("user", "o2"),
                                                                   Message("assistant", "a2")],
                        rewards=[0.0, 0.0, 0.0], return_=0.0, terminated=True)
    tr = transitions(traj, history=history)
    assert tr[-1]["done"] == 0.0
    assert tr[-1]["s2"] == transitions(longer, history=history)[2]["s"]
    assert tr[-1]["s2"] == {0: "system: sys\nuser: o2", 1: "system: sys\nuser: o1\nassistant: a1\nuser: o2"}[history]


def test_replay_buffer_is_fifo_and_round_trips(tmp_path: Path) -> None:
    buf = ReplayBuffer(3)
    buf.add([{"i": i} for i in range(5)])
    assert [r["i"] for r in buf.items] == [2, 3, 4]
    buf.save(tmp_path / "r.jsonl")
    other = ReplayBuffer(3)
    other.load(tmp_path / "r.jsonl")
    assert other.items == buf.items


ENV_ARGS = ["prompt.history=0", "env_opts.opponent=random", "episodes_per_iteration=4", "num_envs=4",
            "sampling.max_new_tokens=12", "critic_steps=2", "critic.batch_size=8", "actor.batch_size=4",
            "critic.hidden=32", "critic.intermediate=64", "critic.layers=1", "critic.heads=2"]


def _overrides(items: list[str]) -> OnlineConfig:
    from turnrl.config import load_config

    return load_config(OnlineConfig, None, items)


@pytest.mark.parametrize("algo", ["archer", pytest.param("chai", marks=pytest.mark.slow),
                                  pytest.param("filtered_bc", marks=pytest.mark.slow)])
def test_a_few_iterations_run_end_to_end(algo: str, tiny_dir: Path, tmp_path: Path,
                                        caplog: pytest.LogCaptureFixture) -> None:
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    cfg = _overrides([*ENV_ARGS, "iterations=2", "warmup_iterations=1", "eval_every=2", "eval_episodes=4",
                      "bc_top=0.5", "bc_steps=1"])
    summary = train_online(algo, str(tiny_dir), "tictactoe", tmp_path / "run", cfg)  # type: ignore[arg-type]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    assert summary["iterations"] == 2 and summary["env_steps"] == rows[-1]["env_steps"] > 0
    assert [e["iteration"] for e in summary["eval"]] == [0, 2]
    assert (tmp_path / "run" / "checkpoints").is_dir()
    assert "Removed shared tensor" not in caplog.text  # the tied LM head is stored once, quietly
    before = AutoModelForCausalLM.from_pretrained(tiny_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "model").state_dict()
    changed = max((before[k] - after[k]).abs().max().item() for k in before)
    if algo == "archer":
        assert "critic/loss" in rows[1] and "actor/loss" not in rows[1]  # warm-up: critic only
        assert all(torch.isfinite(torch.tensor(rows[2][k])) for k in ("actor/loss", "critic/loss"))
        assert "actor/kl" not in rows[2]  # actor_kl 0 computes no KL: a logged 0 would read as no drift
        assert changed > 0
    elif algo == "chai":
        assert "critic/loss" in rows[2] and "actor/loss" not in rows[2] and changed == 0  # frozen actor
        assert (tmp_path / "run" / "critic.pt").is_file()
    else:
        assert "bc/loss" in rows[2] and changed > 0
        assert rows[2]["bc/skipped_too_long"] == rows[2]["bc/dropped_turns"] == 0  # what BC_MAX_LENGTH cut: nothing
    with pytest.raises(Exception, match="already holds"):
        train_online(algo, str(tiny_dir), "tictactoe", tmp_path / "run", cfg)  # type: ignore[arg-type]


def test_bad_config_is_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "TURNRL_PROGRESS": "0"}
    r = subprocess.run([sys.executable, "-m", "turnrl", "train", "archer", "--model", "tiny", "--env", "tictactoe",
                        "--out", str(tmp_path / "x"), "critic.tua=0.1"], env=env, capture_output=True, text=True)
    assert r.returncode == 2 and "critic.tua" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "turnrl", "train", "chai", "--model", "tiny", "--env", "tictactoe",
                        "--out", str(tmp_path / "y"), "tau=2"], env=env, capture_output=True, text=True)
    assert r.returncode == 2 and "tau" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(("setting", "named"), [
    ("actor.max_steps=3", "actor.max_steps"), ("actor.seed=3", "actor.seed"),
    ("critic.save_every=2", "critic.save_every"), ("actor.epochs=2", "actor.epochs"),
    ("critic.mixed_precision=bf16", "critic.mixed_precision"), ("critic.lora.r=4", "critic.lora"),
    ("critic.gradient_checkpointing=true", "critic.gradient_checkpointing"),
])
def test_trainer_settings_the_loop_ignores_or_cannot_do_are_one_line_errors(setting: str, named: str,
                                                                             tmp_path: Path, capsys) -> None:
    """``actor.max_steps`` etc. were silently overridden by the loop; ``critic.lora`` and
    ``critic.gradient_checkpointing`` ended in an AttributeError traceback."""
    from turnrl.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["train", "archer", "--model", "tiny", "--env", "tictactoe", "--out", str(tmp_path / "o"), setting])
    assert exc.value.code != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and named in err, err
    assert not (tmp_path / "o").exists()


def test_a_resume_may_change_when_it_checkpoints(tiny_dir: Path, tmp_path: Path) -> None:
    """``save_every`` and ``keep_checkpoints`` may differ on resume (as for the trainer core's runs,
    docs/training.md); any other setting may not."""
    import shutil

    torch.set_num_threads(1)
    cfg = _overrides([*ENV_ARGS, "iterations=2", "warmup_iterations=1", "actor_steps=1"])
    out = tmp_path / "run"
    train_online("archer", str(tiny_dir), "tictactoe", out, cfg)
    (out / "summary.json").unlink()  # as if killed after the first iteration's checkpoint
    shutil.rmtree(out / "checkpoints" / "iter-000002")
    with pytest.raises(Exception, match=r"config changed since this checkpoint was written \(run\.online\.gamma: "
                                        r"[0-9.]+, now 0\.9\)"):
        train_online("archer", str(tiny_dir), "tictactoe", out, cfg.model_copy(update={"gamma": 0.9}), resume=True)
    # a checkpoint of an earlier version, which hashed the cadence too, resumes with the same settings
    from turnrl.train.core import config_hash

    old = tmp_path / "old"
    shutil.copytree(out, old)
    state_file = old / "checkpoints" / "iter-000001" / "loop_state.json"
    state = json.loads(state_file.read_text())
    online = cfg.model_dump(mode="json")  # as that version dumped it: no dropout settings yet
    online["actor"].pop("dropout")
    online["critic"].pop("dropout")
    state["config_hash"] = config_hash(cfg.actor, {"algo": "archer", "model": str(tiny_dir), "env": "tictactoe",
                                                   "online": online}, exempt=frozenset({"dropout"}))
    state_file.write_text(json.dumps(state))
    assert train_online("archer", str(tiny_dir), "tictactoe", old, cfg, resume=True)["iterations"] == 2
    done = train_online("archer", str(tiny_dir), "tictactoe", out,
                        cfg.model_copy(update={"save_every": 2, "keep_checkpoints": 3}), resume=True)
    assert done["iterations"] == 2
    # a finished run answers a resume with another config as a checkpoint would, not with its old result
    with pytest.raises(Exception, match="config changed since this run finished"):
        train_online("archer", str(tiny_dir), "tictactoe", out, cfg.model_copy(update={"gamma": 0.9}), resume=True)
    assert train_online("archer", str(tiny_dir), "tictactoe", out, cfg, resume=True)["iterations"] == 2


def _cmd(tiny_dir: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "turnrl", "train", "archer", "--model", str(tiny_dir), "--env", "tictactoe",
            "--out", str(out), *ENV_ARGS, "iterations=5", "warmup_iterations=1", *extra]


@pytest.mark.slow
def test_sigkill_then_resume_keeps_the_replay_buffer_and_the_result(tiny_dir: Path, tmp_path: Path) -> None:
    env = {**os.environ, "TURNRL_PROGRESS": "0", "OMP_NUM_THREADS": "1"}
    ref = tmp_path / "ref"
    subprocess.run(_cmd(tiny_dir, ref), check=True, env=env, capture_output=True)

    out = tmp_path / "killed"
    proc = subprocess.Popen(_cmd(tiny_dir, out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt = out / "checkpoints" / "iter-000002"
    deadline = time.time() + 300
    while time.time() < deadline and not (ckpt / "loop_state.json").is_file():
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "summary.json").exists(), "the run finished before it could be killed"
    ref_rows = [json.loads(x) for x in (ref / "metrics.jsonl").read_text().splitlines()]
    latest = sorted((out / "checkpoints").glob("iter-??????"))[-1]
    it = json.loads((latest / "loop_state.json").read_text())["iteration"]
    replay = (latest / "replay.jsonl").read_text().splitlines()
    assert len(replay) == ref_rows[it - 1]["replay"] > 0  # the buffer was saved whole with its checkpoint
    again = subprocess.run(_cmd(tiny_dir, out), env=env, capture_output=True, text=True)
    assert again.returncode != 0 and "--resume" in again.stderr
    subprocess.run([*_cmd(tiny_dir, out), "--resume"], check=True, env=env, capture_output=True)

    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4, 5]
    for a, b in zip(ref_rows, rows, strict=True):
        for k in ("env_steps", "train/return", "replay", "critic/loss", "actor/loss"):
            if k in a:
                assert b[k] == pytest.approx(a[k], abs=1e-5), k
    final = "checkpoints/iter-000005/replay.jsonl"
    assert (out / final).read_text() == (ref / final).read_text()
    from transformers import AutoModelForCausalLM

    wa = AutoModelForCausalLM.from_pretrained(ref / "model").state_dict()
    wb = AutoModelForCausalLM.from_pretrained(out / "model").state_dict()
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-5
    ca, cb = torch.load(ref / "critic.pt")["critic"], torch.load(out / "critic.pt")["critic"]
    assert max((ca[k] - cb[k]).abs().max().item() for k in ca) < 1e-5


def test_joint_critic_reads_state_and_action_together(tiny_tokenizer) -> None:
    critic, _ = _critic(tiny_tokenizer, joint=True)
    with torch.no_grad():
        out = critic(["user: board A", "user: board B"], ["Action: 4", "Action: 4"])
        q_a, _ = critic.q(["user: board A"], ["Action: 4"])
        q_b, _ = critic.q(["user: board A"], ["Action: 5"])
    assert set(out) == {"q1", "q2", "v1", "v2"} and all(v.shape == (2,) for v in out.values())
    assert out["q1"][0] == pytest.approx(float(q_a[0]), abs=1e-5)  # batched == single
    assert float(q_a[0]) != float(q_b[0])  # the action changes Q


def test_repeated_states_are_encoded_once_with_the_same_values_and_gradients(tiny_tokenizer) -> None:
    critic, _ = _critic(tiny_tokenizer)
    seen: list[int] = []
    critic.encoder.backbone.register_forward_hook(lambda m, args, kw, out: seen.append(kw["input_ids"].shape[0]),
                                                 with_kwargs=True)
    states = ["user: board A"] * 3 + ["user: board B"] * 2
    s = critic.encode_states(states)
    assert seen == [2]  # two distinct states, one row each
    alone = torch.cat([critic.encode_states([t]) for t in states])
    assert torch.allclose(s, alone, atol=1e-5)
    # gradients flow through the shared rows as if each copy had been encoded
    w = torch.arange(5.0).unsqueeze(-1)
    (s * w).sum().backward()
    g_shared = [p.grad.clone() for p in critic.encoder.parameters() if p.grad is not None]
    critic.zero_grad()
    (alone * w).sum().backward()
    g_alone = [p.grad for p in critic.encoder.parameters() if p.grad is not None]
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(g_shared, g_alone, strict=True))


def test_normalize_advantages_hand_values() -> None:
    adv = torch.tensor([-1.0, -2.0, -3.0, -6.0])  # a lagging V: every raw advantage negative
    assert torch.equal(normalize_advantages(adv, "none"), adv)
    assert torch.allclose(normalize_advantages(adv, "center"), torch.tensor([2.0, 1.0, 0.0, -3.0]))
    # centred [2, 1, 0, -3], population std sqrt(14 / 4)
    std = (14.0 / 4.0) ** 0.5
    assert torch.allclose(normalize_advantages(adv, "whiten"), torch.tensor([2.0, 1.0, 0.0, -3.0]) / std)
    # the ranking survives, the common negative offset does not
    assert normalize_advantages(adv, "whiten").argsort().tolist() == adv.argsort().tolist()
    assert torch.equal(normalize_advantages(torch.full((3,), -0.7), "whiten"), torch.zeros(3))
    with pytest.raises(Exception, match="advantage_norm"):
        normalize_advantages(adv, "scale")


def test_actor_kl_penalty_is_zero_against_itself_and_k3_by_hand(tiny_dir: Path, tiny_tokenizer) -> None:
    """``actor_kl``: against an identical reference the loss is ArCHer's alone and the KL 0;
    against another reference it adds ``coef * sum_h (e^d - 1 - d)``, ``d = log pi_ref - log pi``,
    over the sampled tokens (computed here from the two models' token log-probs)."""
    import copy

    from transformers import AutoModelForCausalLM

    from turnrl.tokenization import ChatFormat
    from turnrl.train.archer import ActorExample, ActorObjective
    from turnrl.train.forward import pack, token_logps

    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    chat = ChatFormat(tiny_tokenizer)
    views = [[Message("user", "Board: 0 1 2"), Message("assistant", "Action: 4")],
             [Message("user", "Board: X 1 2"), Message("assistant", "Thought: take 1\nAction: 1")]]
    examples = []
    for i, v in enumerate(views):
        enc = chat.encode(v, trainable_turns=[0])
        assert enc is not None
        examples.append(ActorExample(enc, value=0.5 - i, baseline=0.1))
    pad = tiny_tokenizer.pad_token_id or 0
    base, _ = ActorObjective(4096, pad)(model, examples)
    same, m_same = ActorObjective(4096, pad, copy.deepcopy(model), 0.7)(model, examples)
    torch.testing.assert_close(same, base)
    assert m_same["kl"] == pytest.approx(0.0, abs=1e-6)

    ref = copy.deepcopy(model)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    total, m = ActorObjective(4096, pad, ref, 0.7)(model, examples)
    batch = pack([e.enc for e in examples], row_tokens=4096, pad_id=pad)
    with torch.no_grad():
        d = token_logps(ref, batch) - token_logps(model, batch)
    want_kl = float((torch.expm1(d) - d).sum())
    assert want_kl > 1e-3 and m["kl"] == pytest.approx(want_kl, rel=1e-5)
    assert float((total - base).detach()) == pytest.approx(0.7 * want_kl, rel=1e-5)


def test_actor_kl_under_lora_uses_the_adapter_disabled_model(tiny_dir: Path, tiny_tokenizer) -> None:
    """With ``ref=None`` (the LoRA path) the reference is the base model: KL 0 while the
    adapter is the identity, and after the adapter moves, the k3 sum against a separate copy of
    the base weights."""
    import copy

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from turnrl.tokenization import ChatFormat
    from turnrl.train.archer import ActorExample, ActorObjective
    from turnrl.train.forward import pack, token_logps

    base = AutoModelForCausalLM.from_pretrained(tiny_dir)
    start = copy.deepcopy(base)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    chat = ChatFormat(tiny_tokenizer)
    enc = chat.encode([Message("user", "Board: 0 1 2"), Message("assistant", "Thought: centre\nAction: 4")],
                      trainable_turns=[0])
    assert enc is not None
    examples = [ActorExample(enc, value=0.3, baseline=0.0)]
    pad = tiny_tokenizer.pad_token_id or 0
    objective = ActorObjective(4096, pad, None, 0.5)
    _, m0 = objective(model, examples)
    assert m0["kl"] == pytest.approx(0.0, abs=1e-6)

    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(0.05 * torch.randn_like(p))
    model.train()
    _, m = objective(model, examples)
    assert model.training  # the reference pass leaves the mode as it found it
    batch = pack([enc], row_tokens=4096, pad_id=pad)
    with torch.no_grad():
        d = token_logps(start, batch) - token_logps(model, batch)
    want = float((torch.expm1(d) - d).sum())
    assert want > 1e-4 and m["kl"] == pytest.approx(want, rel=1e-4)


def test_actor_shared_prefix_gives_plain_packings_loss_and_gradients_with_fewer_tokens(
        tiny_dir: Path, tiny_tokenizer) -> None:
    """``shared_prefix`` (the default) sorts the actor's samples and computes each unit's common
    prefix once: the loss, the KL and every gradient equal plain packing's, each sample keeps its
    own value and baseline (the samples are given out of token order), and fewer tokens are
    computed."""
    import copy

    from transformers import AutoModelForCausalLM

    from turnrl.tokenization import ChatFormat
    from turnrl.train.archer import ActorExample, ActorObjective

    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    ref = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    chat = ChatFormat(tiny_tokenizer)
    system = Message("system", "You play tic-tac-toe as X against O. Cells are 0-8. Reply with Action: N.")
    boards = ["X O . / . . . / . . .", ". . . / . X . / . . O", "X O . / . . . / . . .", "O . . / . . . / . . X",
              ". . . / . . . / . . ."]
    replies = ["Action: 4", "Thought: corner\nAction: 0", "Action: 8", "Action: 1", "Thought: centre\nAction: 4"]
    examples = []
    for i, (board, reply) in enumerate(zip(boards, replies, strict=True)):
        enc = chat.encode([system, Message("user", f"Board: {board}"), Message("assistant", reply)],
                          trainable_turns=[0])
        assert enc is not None
        examples.append(ActorExample(enc, value=0.5 - 0.3 * i, baseline=0.1 * i))
    pad = tiny_tokenizer.pad_token_id or 0
    shared, plain = ActorObjective(4096, pad, ref, 0.7), ActorObjective(4096, pad, ref, 0.7, shared_prefix=False)
    ordered, batch = shared.pack(examples)
    assert [e.enc.input_ids for e in ordered] == sorted(e.enc.input_ids for e in examples)
    assert ordered != examples  # the test gives them out of order
    assert batch.real_tokens < plain.pack(examples)[1].real_tokens

    results = []
    for objective in (shared, plain):
        model.zero_grad()
        loss, metrics = objective(model, examples)
        loss.backward()
        results.append((loss.detach(), metrics, [p.grad.clone() for p in model.parameters()]))
    (loss_s, m_s, g_s), (loss_p, m_p, g_p) = results
    torch.testing.assert_close(loss_s, loss_p, rtol=1e-5, atol=1e-6)
    assert m_s == pytest.approx(m_p, rel=1e-5, abs=1e-6)
    assert m_s["kl"] > 1e-3
    for a, b in zip(g_s, g_p, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_first_token_pooling_keeps_the_first_token_of_a_state_cut_from_the_left() -> None:
    """A state longer than max_tokens keeps its end (the newest observation); with first-token
    pooling ([CLS] / <s>) that first token must stay, or the pooled vector reads an ordinary token."""
    from types import SimpleNamespace

    import torch

    from turnrl.train.critic import TextEncoder

    class Tok:
        pad_token_id = 0

        def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
            return {"input_ids": [7] + [ord(c) for c in text]}  # 7: the [CLS] of this tokenizer

    class Echo(torch.nn.Module):  # the hidden state of each position is its token id
        def __init__(self) -> None:
            super().__init__()
            self.unused = torch.nn.Parameter(torch.zeros(1))  # where the encoder finds its device

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> SimpleNamespace:
            return SimpleNamespace(last_hidden_state=input_ids.unsqueeze(-1).float())

    enc = TextEncoder(Echo(), Tok(), 1, "first")
    assert enc(["abcdefgh", "ab"], max_tokens=4).flatten().tolist() == [7.0, 7.0]
    last = TextEncoder(Echo(), Tok(), 1, "last")
    assert last(["abcdefgh"], max_tokens=4).flatten().tolist() == [float(ord("h"))]


class _FixedCritic:
    """Stands in for the online critic in the actor phase: fixed heads per call."""

    def __init__(self, q1: list[float], q2: list[float], v1: list[float], v2: list[float]) -> None:
        self.out = {k: torch.tensor(v) for k, v in (("q1", q1), ("q2", q2), ("v1", v1), ("v2", v2))}

    def __call__(self, states: list[str], actions: list[str]) -> dict[str, torch.Tensor]:
        return {k: v[: len(states)] for k, v in self.out.items()}

    def eval(self) -> None:
        pass

    def train(self) -> None:
        pass


def _wiring_run(algo: str, tiny_dir: Path, tmp_path: Path):
    from turnrl.train.archer import OnlineRun

    torch.set_num_threads(1)
    cfg = _overrides([*ENV_ARGS, "critic_steps=1", "critic.batch_size=4", "actor.batch_size=2", "actor_steps=1",
                      "chai_k=3"])
    run = OnlineRun(algo, str(tiny_dir), "tictactoe", tmp_path / algo, cfg)  # type: ignore[arg-type]
    view = [{"role": "system", "content": "sys"}, {"role": "user", "content": "o"}]
    run.replay.add([
        {"view": view, "s": "state A", "a": "act A", "r": 0.0, "s2": "state B", "done": 0.0},
        {"view": view, "s": "state B", "a": "act B", "r": 1.0, "s2": "state B won", "done": 1.0},
    ])
    return run


def test_critic_phase_feeds_each_transition_its_own_targets(tiny_dir: Path, tmp_path: Path) -> None:
    """The TD example of a transition holds its r and done, the target V heads at *s'* and the
    target Q heads at (s, a_hat) -- not at s, not at the replayed a, nor a forced done."""
    run = _wiring_run("archer", tiny_dir, tmp_path)
    run.sample_actions = lambda views: [Message("assistant", "A_HAT") for _ in views]  # type: ignore[method-assign]
    seen: list[CriticExample] = []
    run.critic_trainer.step_on = lambda ex: seen.extend(ex) or {}  # type: ignore[method-assign,func-returns-value]
    with torch.no_grad():
        v_next = {s: [float(x) for x in run.target.v([s])] for s in ("state B", "state B won")}
        q_hat = {s: [float(x) for x in run.target.q([s], ["A_HAT"])] for s in ("state A", "state B")}
        q_a = {s: [float(x) for x in run.target.q([s], [a])] for s, a in (("state A", "act A"), ("state B", "act B"))}
    run.critic_phase()
    assert len(seen) == 4 and {e.s for e in seen} == {"state A", "state B"}
    for e in seen:
        nxt = "state B" if e.s == "state A" else "state B won"
        assert (e.a, e.r, e.done) == (("act A", 0.0, 0.0) if e.s == "state A" else ("act B", 1.0, 1.0))
        assert [e.target_v1_next, e.target_v2_next] == pytest.approx(v_next[nxt], abs=1e-6)
        assert [e.target_q1_hat, e.target_q2_hat] == pytest.approx(q_hat[e.s], abs=1e-6)
        assert [e.target_q1_hat, e.target_q2_hat] != pytest.approx(q_a[e.s], abs=1e-6)


def test_actor_phase_weights_replies_by_min_q_minus_min_v(tiny_dir: Path, tmp_path: Path) -> None:
    run = _wiring_run("archer", tiny_dir, tmp_path)
    run.critic = _FixedCritic(q1=[1.0, 0.5], q2=[0.8, 0.9], v1=[0.3, 0.7], v2=[0.6, 0.2])  # type: ignore[assignment]
    seen: list = []
    run.actor_trainer.step_on = lambda ex: seen.extend(ex) or {}  # type: ignore[method-assign,func-returns-value]
    run.actor_phase()
    # value = min(q1, q2); baseline = value - advantage = min(v1, v2) (advantage_norm none)
    assert [x for e in seen for x in (e.value, e.baseline)] == pytest.approx([0.8, 0.3, 0.5, 0.2], abs=1e-6)


def test_chai_critic_targets_the_reply_it_would_act_with(tiny_dir: Path, tmp_path: Path) -> None:
    """CHAI's a_hat is the best of chai_k actor samples by the target critic's min Q (the authors'
    CHAIAgent.get_action), not one plain sample."""
    run = _wiring_run("chai", tiny_dir, tmp_path)
    calls: list[int] = []

    def sample(views):
        calls.append(len(views))
        return [Message("assistant", f"c{i % 3}") for i in range(len(views))]

    run.sample_actions = sample  # type: ignore[method-assign]
    run.target_min_q = lambda states, acts: torch.tensor(  # type: ignore[method-assign]
        [{"c0": 0.1, "c1": 0.9, "c2": 0.5}[a] for a in acts])
    batch = [run.replay.items[0], run.replay.items[1]]
    assert run.critic_actions(batch) == ["c1", "c1"] and calls == [6]


def test_online_steps_train_in_training_mode_and_name_the_loop_checkpoint(tiny_dir: Path, tmp_path: Path) -> None:
    """A step runs in training mode whatever mode the phases before it left (dropout on every
    step, and the same on a resume); a non-finite step names the update and the loop's
    checkpoint; the actor's final save leaves summary.json to the loop, which writes it last."""
    run = _wiring_run("archer", tiny_dir, tmp_path)
    ct = run.critic_trainer
    modes: list[bool] = []
    ct._optimizer_step = lambda step: modes.append(ct.model.training) or {}  # type: ignore[method-assign,func-returns-value]
    run.critic.eval()
    ct.step_on([None] * ct.examples_per_step)
    assert modes == [True]
    assert "critic update" in str(ct._non_finite("loss", 0)) and "(none)" in str(ct._non_finite("loss", 0))
    run.save_checkpoint()
    assert "(iter-000000)" in str(run.actor_trainer._non_finite("gradient norm", 4))
    run.actor_trainer._save_final(0.0, 0.0, summary=False)
    assert (run.out / "model" / "config.json").is_file() and not (run.out / "summary.json").exists()


def test_td_targets_keep_float32_under_bf16_heads() -> None:
    from turnrl.losses import archer_q_loss, archer_v_loss

    q = torch.tensor([0.5, 1.0], dtype=torch.bfloat16)
    reward, done = torch.tensor([0.0, 1.0]), torch.tensor([0.0, 1.0])
    v_next = torch.tensor([1.2345678, 3.0])
    _, m = archer_q_loss(q, q, reward, done, v_next, v_next, gamma=0.95)
    assert m["target_q1"].dtype == torch.float32 and m["target_q1"][0].item() == pytest.approx(0.95 * 1.2345678, abs=1e-6)
    _, m = archer_v_loss(q, q, v_next, v_next)
    assert m["target_v1"].dtype == torch.float32 and m["target_v1"][0].item() == pytest.approx(1.2345678, abs=1e-6)


def test_a_critic_encoder_that_does_not_exist_is_named_by_its_key(tiny_tokenizer, tmp_path: Path) -> None:
    from turnrl.errors import TurnRLError

    with pytest.raises(TurnRLError, match=r"^critic\.encoder: .*nowhere"):
        build_critic(CriticConfig(encoder=str(tmp_path / "nowhere")), tiny_tokenizer)


def test_tiny_encoder_sizes_with_a_loaded_encoder_are_refused(tiny_dir: Path, tiny_tokenizer) -> None:
    """critic.hidden/layers/heads/intermediate size the tiny encoder: with a loaded one they did nothing."""
    from turnrl.errors import TurnRLError

    with pytest.raises(TurnRLError, match=r"^critic\.hidden=32, critic\.layers=1: sizes of the tiny encoder, but "
                                          r"critic\.encoder=.* brings its own; leave them out$"):
        build_critic(CriticConfig(encoder=str(tiny_dir), hidden=32, layers=1), tiny_tokenizer)
    assert build_critic(CriticConfig(hidden=32, layers=1, heads=2, intermediate=64), tiny_tokenizer) is not None


def test_a_critic_encoder_is_refused_a_state_longer_than_its_positions(tiny_tokenizer, tmp_path: Path) -> None:
    """A learned position table (RoBERTa's) bounds how long a state the critic reads: a longer
    ``max_state_tokens`` is refused when the critic is built, naming the key, not with an index
    error at the first long state; one that fits builds and encodes a state of that length."""
    from transformers import RobertaConfig, RobertaModel

    from turnrl.errors import TurnRLError
    from turnrl.train.critic import CriticConfig, build_critic

    pad = tiny_tokenizer.pad_token_id
    conf = RobertaConfig(vocab_size=len(tiny_tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=pad + 1 + 40, pad_token_id=pad)
    RobertaModel(conf).save_pretrained(tmp_path / "enc")
    tiny_tokenizer.save_pretrained(tmp_path / "enc")
    enc = str(tmp_path / "enc")
    critic = build_critic(CriticConfig(encoder=enc, max_state_tokens=40, max_action_tokens=8), tiny_tokenizer)
    assert critic.v(["x " * 200])[0].shape == (1,)  # cut to 40 tokens: reads
    with pytest.raises(TurnRLError, match=r"^critic\.max_state_tokens: 41 tokens are more than critic\.encoder"):
        build_critic(CriticConfig(encoder=enc, max_state_tokens=41, max_action_tokens=8), tiny_tokenizer)
    with pytest.raises(TurnRLError, match=r"^critic\.max_state_tokens \+ critic\.max_action_tokens: 48 tokens"):
        build_critic(CriticConfig(encoder=enc, max_state_tokens=40, max_action_tokens=8, joint=True), tiny_tokenizer)
