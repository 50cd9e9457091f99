"""The SPPO pipeline: data building from oracle win rates, config errors, end to end with kill and resume."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from test_cli import one_line_error, run

from turnrl.data.io import read_pairs, read_trajectories
from turnrl.data.schema import Message, Trajectory
from turnrl.errors import TurnRLError
from turnrl.pipelines.sppo import SPPOConfig, build_data

s = lambda x: 1.0 / (1.0 + math.exp(-x))  # noqa: E731


def _traj(task: str, ret: float, k: int) -> Trajectory:
    msgs = [Message("system", "play"), Message("user", "Board"),
            Message("assistant", f"Thought: {k}\nAction: {k}", action=str(k), valid=True)]
    return Trajectory(id=f"{task}-{k}", env="tictactoe", task_id=task, messages=msgs, rewards=[ret], return_=ret)


SAMPLES = [_traj("a", 1.0, 0), _traj("a", 0.0, 1), _traj("a", -1.0, 2), _traj("a", 0.0, 3),
           _traj("b", 0.0, 0), _traj("b", 0.0, 1), _traj("b", 0.0, 2), _traj("b", 0.0, 3)]


def test_build_data_sppo_all_and_best_worst(tmp_path: Path) -> None:
    cfg = SPPOConfig(samples_per_task=4)
    stats = build_data(cfg, SAMPLES, tmp_path / "scored.jsonl", tmp_path / "data.jsonl")
    scored = {t.id: t.meta["win_rate"] for t in read_trajectories(tmp_path / "scored.jsonl")}
    # a: returns 1, 0, -1, 0 -> win rate of the winner = (1/2 + s(1) + s(2) + s(1)) / 4
    assert scored["a-0"] == pytest.approx((0.5 + 2 * s(1) + s(2)) / 4)
    assert scored["a-2"] == pytest.approx((0.5 + 2 * s(-1) + s(-2)) / 4)
    assert scored["a-1"] == pytest.approx((0.5 + s(-1) + s(1) + 0.5) / 4) == pytest.approx(0.5)
    assert all(scored[f"b-{k}"] == 0.5 for k in range(4))
    assert stats["train_samples"] == 8 and stats["decided_tasks"] == 1 and stats["oracle"] == "env_reward"
    cfg = SPPOConfig(samples_per_task=4, select="best_worst")
    build_data(cfg, SAMPLES, tmp_path / "s2.jsonl", tmp_path / "d2.jsonl")
    kept = read_trajectories(tmp_path / "d2.jsonl")
    assert [t.id for t in kept] == ["a-0", "a-2"]  # task b's samples all tie: no signal, dropped


def test_build_data_dpo_pairs_best_vs_worst(tmp_path: Path) -> None:
    cfg = SPPOConfig(samples_per_task=4, loss="dpo")
    stats = build_data(cfg, SAMPLES, tmp_path / "scored.jsonl", tmp_path / "pairs.jsonl")
    pairs = read_pairs(tmp_path / "pairs.jsonl")
    assert stats["train_pairs"] == 1 and len(pairs) == 1
    p = pairs[0]
    assert p.chosen.id == "a-0" and p.rejected.id == "a-2"
    assert p.chosen.return_ == 1.0 and p.rejected.return_ == -1.0  # env returns restored
    assert "env_return" not in p.chosen.meta and p.meta["kind"] == "self_play_oracle"
    # the pair's record states returns as returns and win rates as win rates (it used to give the
    # win rates, the ranking key, as the returns)
    assert (p.meta["chosen_return"], p.meta["rejected_return"]) == (1.0, -1.0)
    assert p.meta["chosen_win_rate"] == pytest.approx((0.5 + 2 * s(1) + s(2)) / 4)
    assert p.meta["rejected_win_rate"] == pytest.approx((0.5 + 2 * s(-1) + s(-2)) / 4)
    with pytest.raises(TurnRLError, match="no pairs"):
        build_data(cfg, SAMPLES[4:], tmp_path / "s.jsonl", tmp_path / "p.jsonl")


def test_build_data_says_when_every_task_ties(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """With ``select=all`` every sample of tied tasks trains on the target eta * (1/2 - 1/2) = 0: from the
    reference, whose log-ratio is 0, such an iteration trains nothing. It runs (a long run goes on), and
    says so; ``best_worst`` has no sample to train on and is an error."""
    stats = build_data(SPPOConfig(samples_per_task=4), SAMPLES[4:], tmp_path / "s.jsonl", tmp_path / "d.jsonl")
    assert stats["decided_tasks"] == 0 and "this iteration's targets are all 0 and it trains nothing" in caplog.text
    with pytest.raises(TurnRLError, match=r"no training samples \(every task's samples tie under the oracle\)"):
        build_data(SPPOConfig(samples_per_task=4, select="best_worst"), SAMPLES[4:], tmp_path / "s2.jsonl",
                   tmp_path / "d2.jsonl")


def test_sppo_refuses_a_setting_neither_of_its_losses_reads() -> None:
    """``train.gamma`` (DMPO's) was accepted and did nothing. One config serves both of the pipeline's runs
    (configs/sppo/study.py runs ``loss=dpo`` on the SPPO run's file), so SPPO's settings pass with dpo."""
    from turnrl.config import load_config

    for loss in ("sppo", "dpo"):
        with pytest.raises(TurnRLError, match=r"^train\.gamma=0\.5: read by loss=dmpo only, and this pipeline trains "
                                              r"with loss=sppo/dpo: remove it$"):
            load_config(SPPOConfig, None, [f"loss={loss}", "train.gamma=0.5"]).check()
        load_config(SPPOConfig, None, [f"loss={loss}", "train.eta=3", "train.sppo_variant=hard", "select=best_worst",
                                       "train.beta=0.5"]).check()


def test_config_errors(capsys, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="samples_per_task"):
        SPPOConfig(samples_per_task=1)
    with pytest.raises(ValidationError, match="temperature"):
        SPPOConfig(temperature=float("nan"))  # nan passed the old `< 0` check
    with pytest.raises(ValidationError, match="temperature"):
        SPPOConfig(temperature=0.0)  # a task's K copies (one env seed) played greedily are one sample K times
    with pytest.raises(TurnRLError, match="eval_splits"):
        SPPOConfig(eval_splits=["test"]).check()
    code, _, err = run(["sppo", "samples_per_tsk=3"], capsys)
    assert "samples_per_task" in one_line_error(code, err)
    with pytest.raises(TurnRLError, match=r"^train\.loss=ipo is not used: this pipeline trains with loss=sppo"):
        SPPOConfig.model_validate({"train": {"loss": "ipo"}}).check()
    SPPOConfig.model_validate({"loss": "dpo", "train": {"loss": "dpo"}}).check()  # the baseline, said twice
    with pytest.raises(TurnRLError, match=r"^oracle\.model=m is not used by oracle\.kind=env_reward"):
        SPPOConfig.model_validate({"oracle": {"model": "m"}}).check()
    # settings the chosen oracle kind does not read were accepted and did nothing
    for oracle, said in (({"tau": 0.5, "kind": "judge", "model": "tiny"}, "oracle.tau=0.5 is not used by oracle.kind=judge"),
                         ({"batch_size": 2}, "oracle.batch_size=2 is not used by oracle.kind=env_reward"),
                         ({"max_tokens": 64}, "oracle.max_tokens=64 is not used by oracle.kind=env_reward")):
        with pytest.raises(TurnRLError, match="^" + re.escape(said)):
            SPPOConfig.model_validate({"oracle": oracle}).check()
    SPPOConfig.model_validate({"oracle": {"tau": 0.5}}).check()
    SPPOConfig.model_validate({"oracle": {"kind": "judge", "model": "tiny", "max_tokens": 64, "batch_size": 2}}).check()
    bad = tmp_path / "c.yaml"
    bad.write_text("oracle: {kind: pairwise}\n")
    code, _, err = run(["sppo", "--config", str(bad)], capsys)
    assert "oracle.kind" in one_line_error(code, err)


def _config(tmp_path: Path, tiny_dir: Path) -> Path:
    cfg = {
        "out": str(tmp_path / "run"), "base": str(tiny_dir), "expert_episodes": 24,
        "sft": {"epochs": 2.0, "batch_size": 8, "lr": 2e-3, "history": 0, "save_every": 0},
        "train_tasks": 6, "samples_per_task": 3, "iterations": 2, "eval_splits": ["seen"], "eval_episodes": 6,
        "num_envs": 18, "max_new_tokens": 24,
        "train": {"loss": "sppo", "epochs": 2.0, "batch_size": 3, "lr": 3e-4, "save_every": 1,
                  "lr_schedule": "constant"},
    }
    path = tmp_path / "sppo.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.integration
@pytest.mark.slow
def test_sppo_pipeline_end_to_end_resumes_after_kill(tmp_path: Path, tiny_dir: Path) -> None:
    config = _config(tmp_path, tiny_dir)
    out = tmp_path / "run"
    env = {**os.environ, "TURNRL_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "turnrl", "sppo", "--config", str(config)]
    # kill (SIGKILL) the run in the middle of iteration 1's training, after a checkpoint
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ckpts = out / "iter-1" / "train" / "checkpoints"
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if ckpts.is_dir() and any(d.name.startswith("step-") and ".tmp" not in d.name for d in ckpts.iterdir()):
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "summary.json").exists() and not (out / "iter-1" / "train.done.json").exists()
    sampled = (out / "iter-1" / "samples.jsonl.done.json").stat().st_mtime_ns
    scored = (out / "iter-1" / "data.jsonl.done.json").stat().st_mtime_ns

    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    # finished stages were skipped, the training resumed from its checkpoint
    assert (out / "iter-1" / "samples.jsonl.done.json").stat().st_mtime_ns == sampled
    assert (out / "iter-1" / "data.jsonl.done.json").stat().st_mtime_ns == scored
    steps = [json.loads(x)["step"] for x in (out / "iter-1" / "train" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, len(steps) + 1))  # each step logged once: no step redone or lost
    summary = json.loads((out / "summary.json").read_text())
    assert [it["iteration"] for it in summary["iterations"]] == [1, 2]
    assert summary["method"] == "sppo" and summary["start"]["results"][0]["split"] == "seen"
    for i in (1, 2):
        it = out / f"iter-{i}"
        assert len(read_trajectories(it / "samples.jsonl")) == 6 * 3
        data = read_trajectories(it / "data.jsonl")
        assert all(0.0 <= t.meta["win_rate"] <= 1.0 for t in data)
        # the reference of iteration i is the agent at its start
        ref = json.loads((it / "train" / "summary.json").read_text())["run_config"]["model"]
        assert ref == (str(out / "sft" / "model") if i == 1 else str(out / "iter-1" / "train" / "model"))
    # a third run does nothing and returns the same summary
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "skip iter-2/train" in r.stdout and "run iter-" not in r.stdout
    assert json.loads((out / "summary.json").read_text())["iterations"] == summary["iterations"]


def test_preference_units_with_a_history_window_sum_the_agent_views(tiny_dir: Path) -> None:
    """history=0: a side's per-turn log-probs are those of each turn in the context the agent had."""
    from dataclasses import replace

    import torch

    from turnrl.agent.prompting import agent_view
    from turnrl.collect import run_policy
    from turnrl.data.io import write_jsonl
    from turnrl.data.schema import Pair
    from turnrl.models.loading import load_model, load_tokenizer
    from turnrl.rollout import RandomPolicy
    from turnrl.tokenization import ChatFormat
    from turnrl.train.forward import pack, token_logps
    from turnrl.train.preference import PreferenceConfig, load_units, unit_turn_logps

    a, b = run_policy(RandomPolicy(), "tictactoe", episodes=2, env_opts={"opponent": "random"})
    tok, model = load_tokenizer(str(tiny_dir)), load_model(str(tiny_dir))
    chat = ChatFormat(tok)
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "pairs.jsonl"
        write_jsonl(path, [Pair(a.task_id, a, replace(b, task_id=a.task_id), {})])  # a pair's sides play one task
        cfg = PreferenceConfig(loss="dpo", history=0)
        units, _ = load_units(path, chat, cfg)
        full, _ = load_units(path, chat, PreferenceConfig(loss="dpo"))
    (u,) = units
    assert u.num_turns == [a.num_turns, b.num_turns] and len(u.seqs) == a.num_turns + b.num_turns
    with torch.no_grad():
        got = unit_turn_logps(model, units, cfg, tok.pad_token_id)[0]
        got_full = unit_turn_logps(model, full, PreferenceConfig(loss="dpo"), tok.pad_token_id)[0]
        for side, traj in enumerate((a, b)):
            for t in range(traj.num_turns):
                view, local = agent_view(traj.messages, t, 0)
                enc = chat.encode(view, trainable_turns=[local])
                batch = pack([enc], row_tokens=4096, pad_id=tok.pad_token_id)
                want = float(token_logps(model, batch).sum())
                assert float(got[side, t]) == pytest.approx(want, abs=1e-4)
    # turn 0 sees the same context either way; later turns do not
    assert float(got[0, 0]) == pytest.approx(float(got_full[0, 0]), abs=1e-4)
    assert not torch.allclose(got[0, 1:a.num_turns], got_full[0, 1:a.num_turns])


def test_compare_accepts_sppo() -> None:
    from turnrl.pipelines.compare import METHODS, CompareConfig, _check

    assert "sppo" in METHODS
    _check(CompareConfig(methods=["sft", "sppo"]))  # no error
    assert "sppo_dpo" in METHODS
    both = {"train": {"lr": 1e-5, "eta": 2.0}, "select": "best_worst"}  # a section both rows share
    _check(CompareConfig(methods=["sppo", "sppo_dpo"], sppo=both))
    with pytest.raises(TurnRLError, match=r"section sppo: select=best_worst chooses the samples SPPO trains on"):
        _check(CompareConfig(methods=["sppo_dpo"], sppo=both))  # no sppo row reads them
    with pytest.raises(TurnRLError, match=r"section sppo: train\.eta=2\.0: read by loss=sppo only, and the sppo "
                                          r"rows train with loss=dpo"):
        _check(CompareConfig(methods=["sppo_dpo"], sppo={"train": {"eta": 2.0}}))


def test_compare_sppo_section_is_checked_and_applied(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from turnrl.errors import TurnRLError
    from turnrl.pipelines.compare import CompareConfig, _check
    from turnrl.pipelines.eto import EtoConfig
    from turnrl.pipelines.sppo import compare_config

    with pytest.raises(TurnRLError, match=r"section sppo: unknown key 'train.lrr'"):
        _check(CompareConfig(methods=["sppo"], sppo={"train": {"lrr": 1.0}}))
    with pytest.raises(TurnRLError, match=r"section sppo: 'model' is set by the comparison"):
        _check(CompareConfig(methods=["sppo"], sppo={"model": "x"}))
    with pytest.raises(TurnRLError, match=r"section sppo: 'eval_seed' is shared by every method; set pipeline.eval_seed"):
        _check(CompareConfig(methods=["sppo"], sppo={"eval_seed": 7}))  # SPPO would play other games than SFT
    with pytest.raises(TurnRLError, match=r"bad value for 'select'"):
        _check(CompareConfig(methods=["sppo"], sppo={"select": "median"}))
    cfg = CompareConfig(methods=["sppo"], sppo={"train": {"lr": 1e-5}, "train_tasks": 7})
    run = SimpleNamespace(cfg=cfg, pipe=EtoConfig(expert_episodes=50, iterations=2, seed=3), sft="SFT",
                          dir=tmp_path)
    got = compare_config(run)
    assert (got.train.lr, got.train.loss, got.train.eta, got.train_tasks) == (1e-5, "sppo", 5.0, 7)
    assert (got.model, got.seed, got.iterations, got.out) == ("SFT", 3, 2, str(tmp_path / "sppo"))
    dpo = compare_config(run, "dpo")
    assert (dpo.loss, dpo.out, dpo.train.lr) == ("dpo", str(tmp_path / "sppo_dpo"), 1e-5)


def test_self_play_dpo_records_name_their_method_and_count_their_pairs(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``sppo_dpo`` (SPPO's samples, DPO on best-vs-worst pairs) evaluates under its method's name and
    its compare records count the pairs it trained on, as ``sppo``'s count its samples."""
    from types import SimpleNamespace

    from turnrl.pipelines import sppo
    from turnrl.pipelines.compare import CompareConfig
    from turnrl.pipelines.eto import EtoConfig

    labels: list[str] = []

    def fake_stage(output: Path, fn: object, log: object = None, name: str | None = None) -> object:
        step = (name or "").split("/")[-1]
        if step == "eval":
            return fn(output)  # type: ignore[operator]
        return {"sample": {}, "oracle": {"train_pairs": 4}, "train": "new-model"}[step]

    def fake_evaluate(cfg: object, model: str, out: Path, label: str) -> list[dict[str, object]]:
        labels.append(label)
        return [{"split": "seen", "avg_reward": 0.5}]

    monkeypatch.setattr(sppo, "run_stage", fake_stage)
    monkeypatch.setattr(sppo, "evaluate", fake_evaluate)
    run = SimpleNamespace(cfg=CompareConfig(methods=["sppo_dpo"]), pipe=EtoConfig(iterations=2, seed=3), sft="SFT",
                          dir=tmp_path, log=None)
    recs = sppo.compare_method(run, "dpo")
    assert labels == ["sppo_dpo-iter1", "sppo_dpo-iter2"]
    assert [(r["method"], r["iteration"], r["samples"]) for r in recs] == [("sppo_dpo", 1, 4), ("sppo_dpo", 2, 4)]


def test_data_seed_fixes_the_train_task_plan_across_seeds(tmp_path: Path) -> None:
    """``data_seed`` fixes which games the demos and SPPO's samples play; ``seed`` alone varies them."""
    from types import SimpleNamespace

    from turnrl.pipelines.compare import CompareConfig
    from turnrl.pipelines.eto import EtoConfig, _train_specs
    from turnrl.pipelines.sppo import compare_config

    def plan(**kw: int) -> list[int]:
        return [s.seed for s in _train_specs(EtoConfig(expert_episodes=20, **kw))]

    assert plan(seed=1) != plan(seed=2)
    assert plan(seed=1, data_seed=7) == plan(seed=2, data_seed=7) == plan(seed=7)
    run = SimpleNamespace(cfg=CompareConfig(methods=["sppo"]), pipe=EtoConfig(seed=3, data_seed=7), sft="SFT",
                          dir=tmp_path)
    got = compare_config(run)
    assert (got.seed, got.data_seed, got.plan_seed()) == (3, 7, 7)
    with pytest.raises(Exception, match=r"'data_seed' is set by the comparison"):
        compare_config(SimpleNamespace(**{**vars(run), "cfg": CompareConfig(methods=["sppo"], sppo={"data_seed": 1})}))
