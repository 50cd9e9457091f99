"""Settings PPO and the online loop (ArCHer, CHAI, filtered BC) accepted and ignored, PPO's rollout
statistics under ``log_every``, first-token pooling on a causal critic encoder, and an online run's
``--out`` holding another run's files."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from turnrl.config import load_config
from turnrl.errors import TurnRLError

# --------------------------------------------------------------------------- helpers


def _one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    from turnrl.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def _ppo_cfg(**kw):
    from turnrl.train.ppo import PPOConfig

    base = {"iterations": 2, "episodes_per_iter": 4, "batch_size": 2, "minibatches": 2, "ppo_epochs": 1,
            "max_new_tokens": 6, "lr": 1e-3, "warmup_ratio": 0.0, "row_tokens": 1024, "num_envs": 4,
            "env_opts": {"arms": 3, "horizon": 3, "context": 2},
            "instruction": "Press blue, green or red. Reply ACTION=X."}
    return PPOConfig(**{**base, **kw})


# --------------------------------------------------------------------------- 1. PPO: settings with no effect

#: a run of seconds, should the setting under test not be refused
PPO_SMALL = ["iterations=1", "episodes_per_iter=2", "minibatches=1", "batch_size=2", "ppo_epochs=1",
             "max_new_tokens=4", "num_envs=2", "row_tokens=1024"]


@pytest.mark.parametrize("setting", ["vf_coef=100", "value_clip=0.01", "gae_lambda=0", "value_trunk=false"])
def test_ppo_refuses_value_head_settings_without_a_value_head(setting: str, tiny_dir: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """With ``advantage=mc`` (the bandits' default, or asked for) there is no value head: its settings were
    accepted, hashed, and changed nothing."""
    base = ["train", "ppo", "--model", str(tiny_dir), "--out", str(tmp_path / "o")]
    key = setting.split("=")[0]
    err = _one_line_error([*base, "--env", "bandit", "--env-opt", "horizon=3", *PPO_SMALL, setting], capsys)
    assert key in err and "advantage=mc" in err
    assert key in _one_line_error([*base, "--env", "tictactoe", *PPO_SMALL, "advantage=mc", setting], capsys)
    assert not (tmp_path / "o").exists()
    from turnrl.train.ppo import _check

    k, v = setting.split("=")
    value = {"false": False}.get(v, v)
    _check(_ppo_cfg(**{k: value}, env_opts={}), "tictactoe")  # GAE (tic-tac-toe's default) reads them
    _check(_ppo_cfg(**{k: value}, advantage="gae"), "bandit")
    _check(_ppo_cfg(vf_coef=0.5, gae_lambda=0.95, value_trunk=True), "bandit")  # the defaults, spelled out


def test_ppo_refuses_kl_gradient_with_the_exact_kl(tiny_dir: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from turnrl.train.ppo import _check

    err = _one_line_error(["train", "ppo", "--model", str(tiny_dir), "--out", str(tmp_path / "o"), "--env", "bandit",
                           "--env-opt", "horizon=3", *PPO_SMALL, "kl_estimator=full", "kl_gradient=full"], capsys)
    assert "kl_gradient=full" in err and "kl_estimator=full" in err
    _check(_ppo_cfg(kl_estimator="full"), "bandit")
    _check(_ppo_cfg(kl_estimator="k3", kl_gradient="full"), "bandit")
    _check(_ppo_cfg(kl_estimator="k1", kl_gradient="full"), "bandit")


# --------------------------------------------------------------------------- 2. PPO: log_every


def test_ppo_logs_each_iterations_rollout_under_log_every(tiny_dir: Path, tmp_path: Path) -> None:
    """The rollout statistics rode on the first step of each iteration only: with ``log_every`` 2 that step is
    never logged, and no ``rollout/*`` reached metrics.jsonl. Now each iteration's first logged step has them,
    once; a ``log_every`` larger than an iteration (whose lines some iterations would lack) is refused."""
    from turnrl.train.ppo import _check, train_ppo

    torch.set_num_threads(1)
    train_ppo(str(tiny_dir), "bandit", tmp_path / "le2", _ppo_cfg(log_every=2))
    rows = [json.loads(x) for x in (tmp_path / "le2" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 4]
    assert [r["iteration"] for r in rows if "rollout/return" in r] == [0.0, 1.0]
    assert all("rollout/invalid" in r and "rollout/reward_scale" in r for r in rows)

    train_ppo(str(tiny_dir), "bandit", tmp_path / "le1", _ppo_cfg(log_every=1))
    ones = [json.loads(x) for x in (tmp_path / "le1" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in ones if "rollout/return" in r] == [1, 3]  # as before: the first step, once
    for it in (0, 1):  # the same run: the same rollout statistics, whichever step carries them
        a = next(r for r in ones if r["iteration"] == it and "rollout/return" in r)
        b = next(r for r in rows if r["iteration"] == it)
        assert {k: v for k, v in a.items() if k.startswith("rollout/")} == \
            {k: v for k, v in b.items() if k.startswith("rollout/")}
    with pytest.raises(TurnRLError, match=r"log_every \(3\) is more than the steps per iteration"):
        _check(_ppo_cfg(log_every=3), "bandit")


# --------------------------------------------------------------------------- 3. online: unread settings

ONLINE = ["prompt.history=0", "env_opts.opponent=random", "episodes_per_iteration=2", "num_envs=2",
          "sampling.max_new_tokens=8", "actor.batch_size=2", "iterations=1", "bc_steps=1", "bc_top=0.5",
          "critic_steps=1", "critic.batch_size=2", "critic.hidden=32", "critic.intermediate=64", "critic.layers=1",
          "critic.heads=2", "warmup_iterations=0", "actor_steps=1", "chai_k=2"]


@pytest.mark.parametrize(("algo", "setting", "named"), [
    ("filtered_bc", "actor_kl=5.0", "actor_kl"), ("filtered_bc", "advantage_norm=whiten", "advantage_norm"),
    ("filtered_bc", "critic.lr=1.0", "critic.lr"), ("filtered_bc", "gamma=0.1", "gamma"),
    ("filtered_bc", "tau=0.5", "tau"), ("filtered_bc", "v_target=min", "v_target"),
    ("filtered_bc", "critic.pooling=last", "critic.pooling"), ("filtered_bc", "actor.shared_prefix=false",
                                                               "actor.shared_prefix"),
    ("chai", "actor.lr=1.0", "actor.lr"), ("chai", "actor_kl=5.0", "actor_kl"),
    ("chai", "advantage_norm=center", "advantage_norm"),
    ("chai", "actor.dropout=true", "actor.dropout"),
    ("archer", "eval_episodes=7", "eval_episodes"), ("filtered_bc", "eval_temperature=0.3", "eval_temperature"),
    ("chai", "eval_seed=3", "eval_seed"), ("archer", "eval_split=unseen", "eval_split"),
])
def test_online_refuses_a_setting_its_algorithm_does_not_read(algo: str, setting: str, named: str, tiny_dir: Path,
                                                              tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    err = _one_line_error(["train", algo.replace("_", "-"), "--model", str(tiny_dir), "--env", "tictactoe",
                           "--out", str(tmp_path / "o"), *ONLINE, setting], capsys)
    assert named in err, err
    assert (algo in err) if not named.startswith("eval_") else ("eval_every=0" in err)
    assert not (tmp_path / "o").exists()


def test_online_accepts_what_its_algorithm_reads_and_shared_sizes() -> None:
    """Each algorithm's own settings pass; so do the sizes of the other algorithms' phases, which one set of
    overrides for all three carries (tests/test_archer.py, scripts/archer_study.py)."""
    from turnrl.train.archer import OnlineConfig, check_online_config

    def cfg(*extra: str) -> OnlineConfig:
        return load_config(OnlineConfig, None, [*ONLINE, *extra])

    for algo in ("archer", "chai", "filtered_bc"):
        check_online_config(cfg("state_system=false", "eval_every=2", "eval_episodes=4", "eval_temperature=0.5",
                                "actor.mixed_precision=no"), algo)
    check_online_config(cfg("actor_kl=0.2", "advantage_norm=whiten", "gamma=0.9", "critic.lr=1e-3",
                            "critic.joint=true", "critic.pooling=last", "actor.lr=2e-4", "actor.shared_prefix=false"),
                        "archer")
    check_online_config(cfg("gamma=0.9", "tau=0.2", "v_target=min", "critic.lr=1e-3", "critic.joint=true",
                            "chai_k=3"), "chai")
    # CHAI loads its frozen actor as every actor is loaded: in half precision under actor.lora
    check_online_config(cfg("actor.lora.r=4", "actor.mixed_precision=bf16"), "chai")
    check_online_config(cfg("actor.lr=2e-4", "actor.lora.r=4", "bc_top=0.2", "bc_steps=3"), "filtered_bc")


@pytest.mark.parametrize("setting", ["sampling.temperature=0.5", "sampling.top_p=0.9"])
def test_archer_refuses_sampling_that_is_not_its_actors_policy(setting: str) -> None:
    """ArCHer's actor step takes -A log pi (and its KL) at temperature 1 on the replies it samples; sampled at
    another temperature or top_p they are not pi's, and a constant advantage then moved the policy. CHAI and
    filtered BC, which take no policy-gradient step, keep the setting."""
    from turnrl.train.archer import OnlineConfig, check_online_config

    cfg = load_config(OnlineConfig, None, [*ONLINE, setting])
    with pytest.raises(TurnRLError, match=rf"archer: {re.escape(setting)}: the actor's update"):
        check_online_config(cfg, "archer")
    for algo in ("chai", "filtered_bc"):
        check_online_config(cfg, algo)


# --------------------------------------------------------------------------- 4. critic: first-token pooling


def test_first_token_pooling_is_refused_on_a_causal_encoder(tiny_dir: Path, tmp_path: Path) -> None:
    """On a causal encoder the first position reads no later token: every state (they all start with the same
    token) encoded alike, so V was one constant. A bidirectional encoder ([CLS]) is still accepted."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from turnrl.train.critic import CriticConfig, build_critic

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    small = {"hidden": 32, "intermediate": 64, "layers": 1, "heads": 2}
    with pytest.raises(TurnRLError, match="critic.pooling=first: critic.encoder 'tiny' is causal"):
        build_critic(CriticConfig(pooling="first", **small), tok)
    build_critic(CriticConfig(pooling="mean", **small), tok)

    enc = tmp_path / "bert"
    BertModel(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=512)).save_pretrained(enc)
    tok.save_pretrained(enc)
    critic = build_critic(CriticConfig(encoder=str(enc), pooling="first", max_state_tokens=128), tok).eval()
    with torch.no_grad():
        v1, _ = critic.v(["user: Board: X . . / . O .", "user: something else entirely"])
    assert abs(float(v1[0] - v1[1])) > 0


# --------------------------------------------------------------------------- 5. online: --out


def _fbc(tiny_dir: Path, out: Path):
    """Filtered BC, the cheapest online run (no critic)."""
    from turnrl.train.archer import OnlineConfig, OnlineRun

    torch.set_num_threads(1)
    return OnlineRun("filtered_bc", str(tiny_dir), "tictactoe", out, load_config(OnlineConfig, None, ONLINE))


@pytest.mark.parametrize("foreign", ["model", "adapter", "critic.pt", "summary.json"])
def test_online_out_with_another_runs_files_is_refused(foreign: str, tiny_dir: Path, tmp_path: Path) -> None:
    """A ``model/`` of no run (even the input model), an ``adapter/``, a ``critic.pt``, or another command's
    summary.json: the online loop trained into the folder and replaced them; the trainer core refuses."""
    out = tmp_path / "o"
    out.mkdir()
    path = out / foreign
    if foreign in ("model", "adapter"):
        shutil.copytree(tiny_dir, path)
    elif foreign == "critic.pt":
        path.write_bytes(b"not ours")
    else:
        path.write_text(json.dumps({"schema": "turnrl.train_summary/v1", "steps": 10, "final_loss": 0.5}))
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    with pytest.raises(TurnRLError, match="choose another --out"):
        _fbc(tiny_dir, out).run()
    with pytest.raises(TurnRLError, match="choose another --out"):
        _fbc(tiny_dir, out).run(resume=True)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before
    if foreign == "summary.json":
        assert json.loads(path.read_text())["schema"] == "turnrl.train_summary/v1"


def test_online_run_killed_in_its_final_save_still_resumes(tiny_dir: Path, tmp_path: Path) -> None:
    """The online loop's own model/ (a final save cut before summary.json) sits beside its checkpoints: a
    resume finishes the run; a fresh start is asked for --resume, as before."""
    out = tmp_path / "run"
    first = _fbc(tiny_dir, out).run()
    (out / "summary.json").unlink()  # killed after the model was saved, before the summary
    assert (out / "model").is_dir() and (out / "checkpoints").is_dir()
    with pytest.raises(TurnRLError, match="pass --resume"):
        _fbc(tiny_dir, out).run()
    again = _fbc(tiny_dir, out).run(resume=True)
    assert again["iterations"] == first["iterations"] == 1 and again["config_hash"] == first["config_hash"]
    assert _fbc(tiny_dir, out).run(resume=True)["iterations"] == 1  # finished: answered from its summary


def test_archer_actor_samples_cut_at_max_new_tokens_train_no_end_of_turn_marker(tiny_dir: Path, tmp_path: Path) -> None:
    """ArCHer's a_hat is built by the online loop, not the sampler: a reply cut short is marked ``cut`` as
    the sampler marks it, so the actor phase does not train a marker the reply never wrote."""
    from turnrl.train.archer import OnlineConfig, OnlineRun

    cfg = load_config(OnlineConfig, None, [*ONLINE, "sampling.max_new_tokens=2"])
    run = OnlineRun("archer", str(tiny_dir), "tictactoe", tmp_path / "o", cfg)
    view = [{"role": "system", "content": "sys"}, {"role": "user", "content": "board"}]
    (hat,) = run.sample_actions([view])
    stops = set(run.chat.stop_token_ids)
    assert len(hat.token_ids) == 2 and hat.token_ids[-1] not in stops  # the tiny model writes more than 2 tokens
    assert hat.cut is True
    enc = run.chat.encode([*view, hat], trainable_turns=[0])  # as the actor phase encodes it
    assert enc is not None
    assert [i for i, m in zip(enc.input_ids, enc.action_mask, strict=True) if m] == hat.token_ids


def test_ppo_refuses_an_eval_split_with_evaluation_off() -> None:
    """``eval_split`` is read only by the evaluation (``eval_every`` and ``eval_episodes``); with it off the
    setting was accepted and changed nothing."""
    from turnrl.train.ppo import _check

    with pytest.raises(TurnRLError, match=r"eval_split=unseen: evaluation is off"):
        _check(_ppo_cfg(eval_split="unseen"), "bandit")
    _check(_ppo_cfg(eval_split="unseen", eval_every=2, eval_episodes=2), "bandit")


@pytest.mark.parametrize(("key", "value"), [("kl_estimator", "full"), ("kl_gradient", "full")])
def test_ppo_refuses_kl_settings_with_the_kl_term_off(key: str, value: str) -> None:
    """``kl_estimator`` and ``kl_gradient`` are read only by the KL term; with ``beta_kl=0`` they were
    accepted and did nothing."""
    from turnrl.train.ppo import _check

    with pytest.raises(TurnRLError, match=rf"ppo: {key}={value}: the KL term is off \(beta_kl=0\)"):
        _check(_ppo_cfg(beta_kl=0.0, **{key: value}), "bandit")
    _check(_ppo_cfg(beta_kl=0.1, **{key: value}), "bandit")
    _check(_ppo_cfg(beta_kl=0.0), "bandit")


def test_ppo_refuses_up_front_what_failed_or_did_nothing_after_a_rollout() -> None:
    """``reward_source=expected`` on an env without expected rewards failed after the first rollout (an empty
    metrics file left); ``epsilon=1`` made every turn a random, untrained one: nothing trained."""
    from turnrl.train.ppo import _check

    with pytest.raises(TurnRLError, match=r"ppo: reward_source=expected: env 'tictactoe' does not report"):
        _check(_ppo_cfg(reward_source="expected"), "tictactoe")
    _check(_ppo_cfg(reward_source="expected"), "bandit")
    with pytest.raises(TurnRLError, match=r"ppo: epsilon=1: every turn would be a random action"):
        _check(_ppo_cfg(epsilon=1.0), "bandit")
    _check(_ppo_cfg(epsilon=0.99), "bandit")
    _check(_ppo_cfg(), "bandit")


def test_archer_refuses_a_run_whose_actor_is_never_updated() -> None:
    """With warmup_iterations >= iterations (the default warm-up is 5) or actor_steps=0 the actor never
    trains: the run would finish with exit 0 and write its start as the trained model."""
    from turnrl.train.archer import OnlineConfig, check_online_config

    def cfg(*extra: str) -> OnlineConfig:
        return load_config(OnlineConfig, None, [*ONLINE, *extra])

    with pytest.raises(TurnRLError, match=r"^archer: warmup_iterations=5 >= iterations=3: the actor would never"):
        check_online_config(cfg("iterations=3", "warmup_iterations=5"), "archer")
    with pytest.raises(TurnRLError, match=r"^archer: actor_steps=0: the actor would never be updated"):
        check_online_config(cfg("iterations=3", "warmup_iterations=1", "actor_steps=0"), "archer")
    check_online_config(cfg("iterations=3", "warmup_iterations=2"), "archer")
    check_online_config(cfg("iterations=3", "warmup_iterations=5"), "chai")  # CHAI's actor is frozen anyway
