"""Pipelines: stage skipping, kill-and-resume of the ETO pipeline, config errors, compare aggregation."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from turnrl.config import load_config
from turnrl.errors import TurnRLError
from turnrl.pipelines.iterative import is_done, iter_dir, marker_path, read_done, run_stage

# ----------------------------------------------------------------------------- the skeleton


def test_a_copied_or_moved_run_reads_its_own_stage_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A finished stage's result names paths in the run (a model folder): in a copy of the run they
    are the copy's, and a moved run still finds them (absolute and relative outs alike)."""
    import shutil

    def train(p: Path) -> dict[str, Any]:
        (p / "model").mkdir(parents=True)
        return {"model": str(p / "model"), "elsewhere": "/opt/models/base", "n": 3,
                "beside": str(p.parent.parent / "other" / "model")}  # outside the marker's folder: left

    monkeypatch.chdir(tmp_path)
    for a, b in ((tmp_path / "A", tmp_path / "B"), (Path("runs/A"), Path("runs/B")),
                 (tmp_path / "runs" / "exp", tmp_path / "runs" / "archive" / "exp")):
        run_stage(a / "iter-1" / "train", train)
        shutil.copytree(a, b)
        got = run_stage(b / "iter-1" / "train", lambda p: pytest.fail("a finished stage ran again"))
        assert got == {"model": str(b / "iter-1" / "train" / "model"), "elsewhere": "/opt/models/base", "n": 3,
                       "beside": str(a / "other" / "model")}
        assert Path(got["model"]).is_dir()
        shutil.rmtree(a)
        (b / "moved").mkdir()
        shutil.move(str(b / "iter-1"), str(b / "moved" / "iter-1"))
        assert read_done(b / "moved" / "iter-1" / "train")["model"] == str(b / "moved" / "iter-1" / "train" / "model")


def test_a_model_replaced_in_place_is_another_setting(tmp_path: Path) -> None:
    from turnrl.pipelines.iterative import check_settings, start_model_fingerprints

    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"one")
    check_settings(tmp_path / "run", {"lr": 1, **start_model_fingerprints(model=model, base="tiny")})
    check_settings(tmp_path / "run", {"lr": 1, **start_model_fingerprints(model=model, base="tiny")})  # same: resumes
    (model / "model.safetensors").write_bytes(b"two")
    with pytest.raises(TurnRLError, match="model_fingerprints.model"):
        check_settings(tmp_path / "run", {"lr": 1, **start_model_fingerprints(model=model, base="tiny")})
    assert start_model_fingerprints(base="tiny", model=None) == {}


def test_stage_runs_once_then_is_skipped(tmp_path: Path) -> None:
    calls: list[Path] = []

    def stage(out: Path) -> dict[str, int]:
        calls.append(out)
        out.write_text("data\n")
        return {"n": 1}

    out = tmp_path / "a.jsonl"
    assert run_stage(out, stage) == {"n": 1}
    assert is_done(out) and marker_path(out).name == "a.jsonl.done.json"
    logs: list[str] = []
    assert run_stage(out, stage, log=logs.append) == {"n": 1}  # skipped: the recorded result
    assert calls == [out]
    assert logs == ["skip a.jsonl (done)"]
    assert read_done(out) == {"n": 1}


def test_failed_stage_leaves_no_marker_and_reruns(tmp_path: Path) -> None:
    out = tmp_path / "b.jsonl"

    def boom(p: Path) -> None:
        p.write_text("half")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        run_stage(out, boom)
    assert out.exists() and not is_done(out)  # a partial output is never taken for complete
    assert run_stage(out, lambda p: p.write_text("whole") and "ok") == "ok"
    assert out.read_text() == "whole"


def test_check_settings_refuses_to_resume_with_other_settings(tmp_path: Path) -> None:
    from turnrl.pipelines.iterative import check_settings

    out = tmp_path / "run"
    check_settings(out, {"iterations": 1, "train": {"lr": 1e-5, "beta": 0.1}, "env": "tictactoe"}, free=("iterations",))
    assert json.loads((out / "settings.json").read_text())["train"] == {"lr": 1e-5, "beta": 0.1}
    # the same settings, more iterations (free), a key the file does not know: accepted, and recorded
    check_settings(out, {"iterations": 3, "train": {"lr": 1e-5, "beta": 0.1}, "env": "tictactoe", "new": 1},
                   free=("iterations",))
    assert json.loads((out / "settings.json").read_text())["iterations"] == 3
    with pytest.raises(TurnRLError) as err:
        check_settings(out, {"iterations": 3, "train": {"lr": 3e-5, "beta": 0.1}, "env": "bandit"}, free=("iterations",))
    assert str(err.value) == (f"{out}: made with other settings (train.lr: 1e-05, now 3e-05; env: \"tictactoe\", now "
                              "\"bandit\"): its finished stages would be reused as if run with these; choose another out "
                              "or remove it")
    assert json.loads((out / "settings.json").read_text())["env"] == "tictactoe"  # a refused run records nothing
    with pytest.raises(TurnRLError, match="iterations: 3, now 4"):
        check_settings(out, {"iterations": 4})  # not free here
    # a free-form dict (env options, compare's sppo section) is compared whole: an option added is a difference
    opts = tmp_path / "opts"
    check_settings(opts, {"env_opts": {"opponent": "random"}, "sppo": {}})
    for changed, shown in (({"env_opts": {"opponent": "random", "noise": 0.5}, "sppo": {}}, "env_opts"),
                           ({"env_opts": {"opponent": "random"}, "sppo": {"select": "best_worst"}}, "sppo")):
        with pytest.raises(TurnRLError, match=rf"\({shown}: "):
            check_settings(opts, changed)
    (out / "settings.json").write_text("{")
    with pytest.raises(TurnRLError, match=r"settings\.json: unreadable .*remove it"):
        check_settings(out, {"iterations": 4})


def test_check_settings_sees_a_setting_turned_from_null_into_a_section(tmp_path: Path) -> None:
    """``train.lora: null`` then ``train.lora: {r: 8}`` (or back) flattens to keys only one side
    knows; it is still a change: the finished full fine-tuning must not be reused as a LoRA run."""
    from turnrl.pipelines.eto import EtoConfig
    from turnrl.pipelines.iterative import check_settings

    full = EtoConfig().model_dump(mode="json", exclude={"out"})
    lora = load_config(EtoConfig, overrides=["train.lora={r: 8}"]).model_dump(mode="json", exclude={"out"})
    for first, then, shown in ((full, lora, r"\(train\.lora: null, now \{.*\"r\": 8.*\}\)"),
                               (lora, full, r"\(train\.lora: \{.*\"r\": 8.*\}, now null\)")):
        out = tmp_path / f"run-{len(list(tmp_path.iterdir()))}"
        check_settings(out, first)
        with pytest.raises(TurnRLError, match=shown):
            check_settings(out, then)
    check_settings(out, lora)  # unchanged: accepted


def test_pipelines_refuse_an_out_made_with_other_settings(tmp_path: Path) -> None:
    """``turnrl compare``, ``eto`` and ``sppo`` check OUT/settings.json before any work."""
    from turnrl.pipelines.compare import CompareConfig, run_compare
    from turnrl.pipelines.eto import EtoConfig, run_pipeline
    from turnrl.pipelines.iterative import check_settings
    from turnrl.pipelines.sppo import SPPOConfig, run_sppo

    out = tmp_path / "c"
    made = CompareConfig(out=str(out), best_of_n=5)
    check_settings(out, made.model_dump(mode="json", exclude={"out", "seeds", "methods"}))
    with pytest.raises(TurnRLError, match=r"best_of_n: 5, now 10"):
        run_compare(CompareConfig(out=str(out), seeds=[7], methods=["sft"]))
    assert sorted(p.name for p in out.iterdir()) == ["settings.json"]
    for cfg, run in ((EtoConfig(out=str(tmp_path / "e")), run_pipeline), (SPPOConfig(out=str(tmp_path / "s")), run_sppo)):
        check_settings(cfg.out, cfg.model_copy(update={"eval_episodes": 7}).model_dump(mode="json", exclude={"out"}))
        with pytest.raises(TurnRLError, match=r"eval_episodes: 7, now 100"):
            run(cfg)  # type: ignore[operator]
        assert sorted(p.name for p in Path(cfg.out).iterdir()) == ["settings.json"]


def test_stage_lock_left_with_our_own_pid_is_taken_over(tmp_path: Path) -> None:
    """A killed run's lock holds its pid; a rerun that got the same pid (pid 1 in a container) takes
    it over instead of waiting for itself forever."""
    out = tmp_path / "stage"
    lock = out.with_name("stage.lock")
    lock.write_text(str(os.getpid()))
    os.utime(lock, (0, 0))  # written long ago
    assert _taken_in_a_thread(out) and not lock.exists()


def _taken_in_a_thread(out: Path) -> bool:
    """Whether a thread takes ``out``'s stage lock within 10 s."""
    import threading

    from turnrl.pipelines.iterative import stage_lock

    taken = threading.Event()

    def take() -> None:
        with stage_lock(out, poll=0.01):
            taken.set()

    t = threading.Thread(target=take, daemon=True)
    t.start()
    t.join(timeout=10)
    return taken.is_set()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="process start times are read from /proc")
def test_stage_lock_of_a_reused_pid_is_taken_over_and_a_live_holder_is_waited_for(tmp_path: Path) -> None:
    """A lock names its holder by pid and start time. A killed run's pid that another process got
    since (after a container's restart) is not the holder: the lock is taken over, where a pid alone
    kept a resumed pipeline waiting forever. A live holder is waited for, and the wait is said once."""
    import subprocess
    import threading

    from turnrl.pipelines.iterative import _holder, _started, stage_lock

    out, said = tmp_path / "stage", []
    lock = out.with_name("stage.lock")
    other = subprocess.Popen(["sleep", "60"])
    try:
        for started, waits in ((f"{_started(other.pid)}-before", False), (_started(other.pid), True)):
            lock.write_text(str(other.pid))  # the bare pid, as code of before 30 Nov 2026 reads it too
            lock.with_name("stage.lock.start").write_text(f"{other.pid} {started}")
            os.utime(lock, (0, 0))  # written long ago
            taken = threading.Event()

            def take(taken: threading.Event = taken) -> None:
                with stage_lock(out, poll=0.01, log=said.append):
                    taken.set()

            t = threading.Thread(target=take, daemon=True)
            t.start()
            t.join(timeout=0.5 if waits else 10)
            assert taken.is_set() is not waits
        assert said == [f"waiting for process {other.pid}, which is running this stage ({lock} names it)"]
        other.kill()
        other.wait()
        t.join(timeout=10)  # the holder died: its lock is taken over
        assert taken.is_set() and not lock.exists() and not lock.with_name("stage.lock.start").exists()
        # a lock held now reads as older code reads it (a bare pid), and a start file left by another
        # holder does not count for it
        with stage_lock(out, poll=0.01):
            assert int(lock.read_text()) == os.getpid()
            assert lock.with_name("stage.lock.start").read_text() == f"{os.getpid()} {_started(os.getpid())}"
        lock.write_text(str(other.pid))
        lock.with_name("stage.lock.start").write_text(f"{os.getpid()} some-start")
        assert _holder(lock) == (other.pid, "")
    finally:
        other.kill()


def _hold_stage(out: str, log: str, go: Any) -> None:
    import time

    from turnrl.pipelines.iterative import stage_lock

    go.wait()
    with stage_lock(Path(out), poll=0.001):
        start = time.time()
        time.sleep(0.02)
        with open(log, "a") as f:
            f.write(f"{start} {time.time()}\n")


@pytest.mark.skipif(sys.platform != "linux", reason="forks processes that share a lock")
def test_stage_lock_of_a_dead_holder_is_taken_by_one_waiter(tmp_path: Path) -> None:
    """Eight processes find a dead holder's lock at once: one takes it at a time. Before, each that
    found it dead deleted the file, and a slower one deleted a faster one's fresh lock (24 overlaps
    in 10 rounds of 8)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    out, spans = tmp_path / "stage", []
    for r in range(4):
        dead = subprocess.Popen(["true"])
        dead.wait()
        lock = tmp_path / "stage.lock"
        lock.write_text(str(dead.pid))
        os.utime(lock, (0, 0))
        log, go = tmp_path / f"log{r}", ctx.Event()
        procs = [ctx.Process(target=_hold_stage, args=(str(out), str(log), go)) for _ in range(8)]
        for proc in procs:
            proc.start()
        go.set()
        for proc in procs:
            proc.join(timeout=60)
        assert [proc.exitcode for proc in procs] == [0] * 8
        held = sorted(tuple(map(float, line.split())) for line in log.read_text().splitlines())
        assert len(held) == 8 and not lock.exists()
        spans += [(a, b) for a, b in zip(held, held[1:], strict=False) if b[0] < a[1]]
    assert spans == []  # no hold began before the one before it ended


def _hold_and_fork(out: str, ready: Any) -> None:
    """Hold the stage, fork a child that lives on (a worker forked without exec), then wait to be killed."""
    import time

    from turnrl.pipelines.iterative import stage_lock

    with stage_lock(Path(out), poll=0.01):
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        ready.set()
        time.sleep(60)


@pytest.mark.skipif(sys.platform != "linux", reason="forks processes that share a lock")
def test_a_child_the_holder_forked_does_not_keep_its_lock(tmp_path: Path) -> None:
    """The holder's flock is on a file its forked children inherit: killed, it kept the stage locked
    until they exited (a forked worker that never exits would lock it for good)."""
    import multiprocessing
    import signal

    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_and_fork, args=(str(tmp_path / "stage"), ready))
    holder.start()
    assert ready.wait(30)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join()
    assert _taken_in_a_thread(tmp_path / "stage")  # within 10 s, not after the child's 30


def _fork_inside_the_stage(out: str, result: str) -> None:
    """A child forked inside the stage that leaves it (unwinding the lock's context) as its parent holds it."""
    from turnrl.pipelines.iterative import stage_lock

    with stage_lock(Path(out), poll=0.01):
        child = os.fork()
        if child:
            _, status = os.waitpid(child, 0)
            Path(result).write_text(f"{status} {Path(out).with_name('stage.lock').exists()}")
    if child == 0:
        os._exit(0)


@pytest.mark.skipif(sys.platform != "linux", reason="forks processes that share a lock")
def test_a_child_forked_inside_the_stage_leaves_the_lock_to_its_parent(tmp_path: Path) -> None:
    """Its exit from the block closed a descriptor the fork handler had closed (EBADF) and deleted the
    lock file its parent still held."""
    import multiprocessing

    proc = multiprocessing.get_context("fork").Process(
        target=_fork_inside_the_stage, args=(str(tmp_path / "stage"), str(tmp_path / "result")))
    proc.start()
    proc.join(30)
    assert (tmp_path / "result").read_text() == "0 True"  # the child exited cleanly; the lock was still held


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="a zombie is told from /proc")
def test_stage_lock_of_a_zombie_is_taken_over(tmp_path: Path) -> None:
    """A holder that died but that its parent has not reaped yet (a zombie) still has a pid; it
    does not hold the lock."""
    import time

    out = tmp_path / "stage"
    zombie = subprocess.Popen(["true"])
    try:
        for _ in range(200):  # until it has exited, not reaped
            if Path(f"/proc/{zombie.pid}/stat").read_text().split(") ")[1][:1] == "Z":
                break
            time.sleep(0.01)
        out.with_name("stage.lock").write_text(str(zombie.pid))
        assert _taken_in_a_thread(out)
    finally:
        zombie.wait()


def test_iter_dir(tmp_path: Path) -> None:
    d = iter_dir(tmp_path / "run", 2)
    assert d == tmp_path / "run" / "iter-2" and d.is_dir()


# ----------------------------------------------------------------------------- config errors


def test_config_unknown_key_is_one_line() -> None:
    from turnrl.pipelines.eto import EtoConfig

    with pytest.raises(TurnRLError) as e:
        load_config(EtoConfig, overrides=["iteratons=2"])
    msg = str(e.value)
    assert "unknown key 'iteratons'" in msg and "iterations" in msg and "\n" not in msg
    with pytest.raises(TurnRLError, match=r"unknown key 'train.betta'.*beta"):
        load_config(EtoConfig, overrides=["train.betta=0.1"])
    with pytest.raises(TurnRLError, match=r"bad value for 'loss'"):
        load_config(EtoConfig, overrides=["loss=kto"])


def test_config_error_names_the_override_or_the_file_line_that_set_the_key(tmp_path: Path) -> None:
    from turnrl.pipelines.eto import EtoConfig

    cfg = tmp_path / "c.yaml"
    cfg.write_text("env: tictactoe\niterations: 2\ntrain:\n  lr: 1.0e-5\n  beta: oops\n")
    with pytest.raises(TurnRLError) as e:
        load_config(EtoConfig, cfg)
    assert str(e.value).startswith(f"{cfg}:5: bad value for 'train.beta'")
    # a bad override is reported against the override, not the file it overrides
    with pytest.raises(TurnRLError) as e:
        load_config(EtoConfig, cfg, ["train.beta=0.1", "iterations=many"])
    assert str(e.value).startswith("override 'iterations=many': bad value for 'iterations'")
    with pytest.raises(TurnRLError) as e:
        load_config(EtoConfig, cfg, ["train.beta=0.1", "train.lrr=1"])
    assert str(e.value).startswith("override 'train.lrr=1': unknown key 'train.lrr'")
    cfg.write_text("env: tictactoe\ntrain:\n  lr: 1.0e-5\n  betta: 0.1\n")
    with pytest.raises(TurnRLError, match=rf"^{re.escape(str(cfg))}:4: unknown key 'train.betta'"):
        load_config(EtoConfig, cfg)


def test_invalid_reply_settings_reach_every_rollout_of_the_pipelines(tmp_path: Path) -> None:
    """``invalid_action`` / ``invalid_penalty`` of an agent pipeline decide what an invalid reply
    does in its rollouts (here: ends a tic-tac-toe game at -1), and SPPO's compare seeds inherit
    them from the compare config's pipeline."""
    from types import SimpleNamespace

    from turnrl.pipelines.eto import EtoConfig, _play
    from turnrl.pipelines.sppo import compare_config
    from turnrl.rollout.policies import Reply
    from turnrl.rollout.sampler import EpisodeSpec

    class Occupier:  # plays the centre, then the centre again
        name = "occupier"

        def act(self, requests: Any) -> list[Reply]:
            return [Reply("Thought: centre.\nAction: 4") for _ in requests]

    specs = [EpisodeSpec(i, "train", f"ttt-s{i}", i) for i in range(3)]
    strict = EtoConfig(invalid_action="end", invalid_penalty=-1.0)
    trajs = _play(Occupier(), strict, specs, tmp_path / "strict.jsonl")
    assert [(t.num_turns, t.return_, t.success) for t in trajs] == [(2, -1.0, False)] * 3
    lenient = _play(Occupier(), EtoConfig(), specs, tmp_path / "lenient.jsonl")
    assert all(t.num_turns > 2 for t in lenient)  # a random legal move was played for it
    run = SimpleNamespace(pipe=strict, sft="sft-model", dir=tmp_path, cfg=SimpleNamespace(sppo={}))
    sppo = compare_config(run)
    assert (sppo.invalid_action, sppo.invalid_penalty) == ("end", -1.0)
    assert sppo.eto_view().prompt().invalid_penalty == -1.0
    with pytest.raises(TurnRLError, match=r"bad value for 'invalid_action'"):
        load_config(EtoConfig, overrides=["invalid_action=stop"])


def test_a_comparison_on_another_env_takes_that_envs_prompt_and_options(tmp_path: Path) -> None:
    """``pipeline: {env: bandit}`` kept the quickstart's tic-tac-toe instruction and history 0 (the
    section was completed from the tic-tac-toe defaults before the pipeline's env defaults could apply),
    as ``turnrl eto env=bandit`` does not; and SPPO's rows merged the pipeline's ``env_opts`` into
    tic-tac-toe's, so they failed on an unknown ``opponent`` after the other rows had run."""
    from types import SimpleNamespace

    from turnrl.pipelines.compare import CompareConfig
    from turnrl.pipelines.eto import EtoConfig
    from turnrl.pipelines.sppo import compare_config

    alone = load_config(EtoConfig, None, ["env=bandit"])
    for overrides in (["pipeline.env=bandit"], ["pipeline.env=bandit", "pipeline.env_opts={arms: 3}"]):
        pipe = load_config(CompareConfig, None, overrides).pipeline
        assert (pipe.instruction, pipe.history) == (alone.instruction, alone.history) == (None, None)
        run = SimpleNamespace(pipe=pipe, sft="sft-model", dir=tmp_path, cfg=SimpleNamespace(sppo={}))
        assert compare_config(run).env_opts == pipe.env_opts
    kept = load_config(CompareConfig, None, ["pipeline.env=bandit", "pipeline.history=2"]).pipeline
    assert kept.history == 2
    ttt = load_config(CompareConfig, None, ["pipeline.env_opts={opponent: minimax}"]).pipeline
    assert ttt.instruction == EtoConfig().instruction and ttt.env_opts == {"opponent": "minimax"}
    run = SimpleNamespace(pipe=ttt, sft="sft-model", dir=tmp_path, cfg=SimpleNamespace(sppo={}))
    assert compare_config(run).env_opts == {"opponent": "minimax"}  # not tic-tac-toe's default ties added


def test_eval_temperature_reaches_every_evaluation_but_best_of_n(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``eval_temperature`` is the temperature of the pipelines' evaluation games (0, greedy, by
    default); Best-of-N samples at 1 whatever it is; SPPO's evaluations inherit it; below 0 it is
    a one-line error naming the key."""
    from turnrl.pipelines import eto
    from turnrl.pipelines.sppo import SPPOConfig
    from turnrl.rollout.policies import Reply

    seen: list[float] = []

    class Centre:  # an occupied centre gets a random legal move played for it
        name = "centre"

        def act(self, requests: Any) -> list[Reply]:
            return [Reply("Thought: centre.\nAction: 4") for _ in requests]

    def fake_policy(model: str, cfg: Any, temperature: float) -> Centre:
        seen.append(temperature)
        return Centre()

    monkeypatch.setattr(eto, "_policy", fake_policy)
    small = {"eval_splits": ["seen"], "eval_episodes": 2}
    eto.evaluate_model(eto.EtoConfig(**small), "m", tmp_path / "greedy.json", "a")
    eto.evaluate_model(eto.EtoConfig(**small, eval_temperature=0.7), "m", tmp_path / "sampled.json", "b")
    eto.best_of_n(eto.EtoConfig(**small, eval_temperature=0.7), "m", tmp_path / "bon.json", n=2)
    eto.best_of_n(eto.EtoConfig(**small), "m", tmp_path / "bon1.json", n=1)  # one sample, not the greedy game
    eto.evaluate_model(SPPOConfig(**small, eval_temperature=0.5).eto_view(), "m", tmp_path / "sppo.json", "c")
    assert seen == [0.0, 0.7, 1.0, 1.0, 0.5]
    assert json.loads((tmp_path / "sampled.json").read_text())["results"][0]["episodes"] == 2
    with pytest.raises(TurnRLError, match="eval_temperature"):
        load_config(eto.EtoConfig, overrides=["eval_temperature=-1"])


def test_history_reaches_sft_and_rft_as_it_reaches_rollouts_and_preference_training(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent acts with ``history`` earlier exchanges; its SFT and RFT trainings must see the
    same window (``sft.history``'s default, 0, used to stay whatever ``history`` said)."""
    from dataclasses import replace
    from types import SimpleNamespace

    from turnrl.data.io import read_trajectories
    from turnrl.pipelines import eto
    from turnrl.train import sft as sft_mod

    seen: list[Any] = []

    def fake_sft(model: str, data: Path, out: Path, cfg: Any, resume: bool = False) -> Any:
        seen.append(cfg.history)
        return SimpleNamespace(model_dir=Path(out) / "model")

    monkeypatch.setattr(sft_mod, "train_sft", fake_sft)
    cfg = eto.EtoConfig(base="some-model", history=2, expert_episodes=2)
    model, expert = eto.prepare_base(cfg, tmp_path / "run")
    won = replace(read_trajectories(expert)[0], success=True)
    eto.rft(cfg, "base", model, expert, [won], tmp_path / "rft", 1)
    assert seen == [2, 2]


@pytest.mark.parametrize(("overrides", "message"), [
    (["step_turns=all"], "step_turns=all chooses the turns of step-wise exploration; pairs=trajectory explores none"),
    (["pairs=takeover", "step_turns=all"], "pairs=takeover explores none"),
    (["self_play=true", "explore_temperature=0.5"], "explore_temperature=0.5: self_play samples the tasks at "
                                                     "sample_temperature"),
    (["train.gamma=0.1"], "train.gamma=0.1: read by loss=dmpo only, and this pipeline trains with loss=dpo"),
    (["loss=ipo", "train.eta=5"], "train.eta=5.0: read by loss=sppo only, and this pipeline trains with loss=ipo"),
    (["loss=dmpo", "train.sppo_variant=hard"], "train.sppo_variant=hard: read by loss=sppo only"),
])
def test_eto_refuses_settings_nothing_of_the_run_reads(overrides: list[str], message: str) -> None:
    """Each was accepted and changed nothing (``truncate_k`` with step pairs was already refused)."""
    from turnrl.pipelines.eto import EtoConfig

    with pytest.raises(TurnRLError, match=re.escape(message)):
        load_config(EtoConfig, None, overrides).check()
    for ok in (["pairs=step", "step_turns=all"], ["pairs=mixed", "step_turns=all"], ["loss=dmpo", "train.gamma=0.1"],
               ["self_play=true", "sample_temperature=0.5"]):
        load_config(EtoConfig, None, ok).check()


def test_config_cross_checks() -> None:
    from turnrl.pipelines.compare import CompareConfig, _check
    from turnrl.pipelines.eto import EtoConfig

    with pytest.raises(TurnRLError, match="self_play"):
        EtoConfig(self_play=True, pairs="step").check()
    with pytest.raises(TurnRLError, match="eval_splits"):
        EtoConfig(eval_splits=["test"]).check()
    with pytest.raises(TurnRLError, match=r"unknown method 'dpmo'.*dmpo"):
        _check(CompareConfig(methods=["sft", "dpmo"]))
    with pytest.raises(TurnRLError, match="gamma"):
        _check(CompareConfig(dmpo_gammas=[0.0]))
    with pytest.raises(TurnRLError, match=r"truncate_ks: .*k >= 0 \(got -1\)"):
        _check(CompareConfig(truncate_ks=[-1]))
    with pytest.raises(TurnRLError, match=r"^dmpo_iterations must be >= 1 \(got 0\)$"):
        _check(CompareConfig(dmpo_iterations=0))
    with pytest.raises(TurnRLError, match=r"^dmpo_iterations=3: the DPO row is ETO's iteration of that number, and "
                                          r"ETO runs pipeline.iterations=2; raise pipeline.iterations"):
        _check(CompareConfig(dmpo_iterations=3))
    _check(CompareConfig(dmpo_iterations=3, dpo_from_eto=False))
    _check(CompareConfig(dmpo_iterations=2))
    _check(CompareConfig(dmpo_iterations=3, methods=["sft", "eto", "dmpo"], loser_settings=["clean"]))  # no ETO row
    # a run without eto is refused too: a later `methods=[eto]` on the same out could not give the DPO row
    with pytest.raises(TurnRLError, match=r"^dmpo_iterations=3: the DPO row is ETO's iteration"):
        _check(CompareConfig(dmpo_iterations=3, methods=["sft", "dmpo"]))
    with pytest.raises(TurnRLError, match=r"^dmpo_iterations=3: the DPO row is ETO's iteration"):
        _check(CompareConfig(dmpo_iterations=3, methods=["loser_length"]))
    _check(CompareConfig(dmpo_iterations=3, methods=["sft", "dmpo"], dpo_from_eto=False))
    # nothing to train, named by its section, before the demos and the model
    for section in ("sft", "train"):
        with pytest.raises(TurnRLError, match=rf"^{section}.epochs=0 and {section}.max_steps=0: nothing would be"):
            load_config(EtoConfig, overrides=[f"{section}.epochs=0"]).check()
    # losers of step and takeover pairs are not cut: truncate_k there would do nothing
    for pairs in ("step", "takeover"):
        with pytest.raises(TurnRLError, match=rf"^truncate_k=0 cuts trajectory pairs' losers; pairs={pairs} trains"):
            EtoConfig(pairs=pairs, truncate_k=0).check()
        with pytest.raises(TurnRLError, match=rf"^methods: loser_length cuts .*pipeline.pairs={pairs} has none"):
            _check(CompareConfig(pipeline=EtoConfig(pairs=pairs)))
        _check(CompareConfig(pipeline=EtoConfig(pairs=pairs), truncate_ks=[]))
    EtoConfig(pairs="mixed", truncate_k=0).check()
    # self-play pairs have no expert loser to cut, and its first iteration is RFT, no preference row
    with pytest.raises(TurnRLError, match=r"^truncate_k=0 cuts the losers of expert pairs; self_play"):
        EtoConfig(self_play=True, truncate_k=0).check()
    with pytest.raises(TurnRLError, match="loser_length cuts expert pairs' losers; pipeline.self_play"):
        _check(CompareConfig(methods=["sft", "loser_length"], dmpo_iterations=2,
                             pipeline=EtoConfig(self_play=True, iterations=2)))
    for methods, key in ((["sft", "eto"], "pipeline.iterations"), (["sft", "dmpo"], "dmpo_iterations")):
        with pytest.raises(TurnRLError, match=rf"self-play's RFT, not preference training: set {key} >= 2"):
            _check(CompareConfig(methods=methods, pipeline=EtoConfig(self_play=True, iterations=1)))
    _check(CompareConfig(methods=["sft", "eto"], pipeline=EtoConfig(self_play=True, iterations=2)))
    with pytest.raises(TurnRLError, match=r"samples_per_task must be >= 2 \(got 1\)"):
        EtoConfig(self_play=True, samples_per_task=1).check()
    # the pipeline's loss is what trains: another train.loss would be ignored
    with pytest.raises(TurnRLError, match=r"^train\.loss=ipo is not used: this pipeline trains with loss=dpo; set "
                                          r"loss=ipo instead$"):
        load_config(EtoConfig, overrides=["train.loss=ipo"]).check()
    load_config(EtoConfig, overrides=["loss=ipo", "train.loss=ipo"]).check()
    with pytest.raises(TurnRLError, match="set pipeline.data_seed too"):
        _check(CompareConfig(sft_seed=3))
    with pytest.raises(TurnRLError, match="set one of them"):
        _check(CompareConfig(sft_seed=3, pipeline=EtoConfig(data_seed=1, model="runs/sft")))
    # the reference of every iteration is the agent it starts from: a train.ref_model would be ignored
    ignored = r"^train\.ref_model=runs/sft/model: .*remove train\.ref_model$"
    with pytest.raises(TurnRLError, match=ignored):
        load_config(EtoConfig, overrides=["train.ref_model=runs/sft/model"]).check()
    with pytest.raises(TurnRLError, match=ignored):
        _check(load_config(CompareConfig, overrides=["pipeline.train.ref_model=runs/sft/model"]))
    from turnrl.pipelines.sppo import SPPOConfig

    with pytest.raises(TurnRLError, match=r"^train\.ref_model=m: "):
        load_config(SPPOConfig, overrides=["train.ref_model=m"]).check()


def test_sppo_settings_that_would_fail_or_do_nothing_late_are_refused_up_front() -> None:
    """A model oracle without its model fails when the oracle is built, after SFT and sampling:
    ``check`` says so first. In a comparison, the sppo section's ``base``, ``sft`` and
    ``expert_episodes`` would do nothing (SPPO starts from the seed's SFT agent): refused."""
    from turnrl.pipelines.compare import CompareConfig, _check
    from turnrl.pipelines.sppo import SPPOConfig

    with pytest.raises(TurnRLError, match=r"^oracle\.kind=judge needs oracle\.model"):
        SPPOConfig(oracle={"kind": "judge"}).check()
    with pytest.raises(TurnRLError, match=r"^oracle\.model: /no/such/model: not a pairwise preference model \(no such folder\)"):
        SPPOConfig(oracle={"kind": "pairwise_model", "model": "/no/such/model"}).check()
    with pytest.raises(TurnRLError, match=r"^compare config, section sppo: oracle\.kind=pairwise_model needs"):
        _check(CompareConfig(methods=["sppo"], sppo={"oracle": {"kind": "pairwise_model"}}))
    for key, value in (("sft", {"epochs": 9.0}), ("expert_episodes", 3), ("base", "tiny")):
        with pytest.raises(TurnRLError, match=rf"section sppo: '{key}' would have no effect.*set pipeline\.{key}$"):
            _check(CompareConfig(methods=["sppo"], sppo={key: value}))
    _check(CompareConfig(methods=["sppo"], sppo={"oracle": {"kind": "env_reward", "tau": 0.5}}))
    # a train.loss no row takes, and no iteration, failed (or gave no record) only at the sppo rows
    with pytest.raises(TurnRLError, match=r"^compare config, section sppo: train\.loss=ipo is not used"):
        _check(CompareConfig(methods=["sppo", "sppo_dpo"], sppo={"train": {"loss": "ipo"}}))
    with pytest.raises(TurnRLError, match=r"^compare config, section sppo: iterations=0: the sppo rows need at least 1"):
        _check(CompareConfig(methods=["sppo"], sppo={"iterations": 0}))
    _check(CompareConfig(methods=["sppo", "sppo_dpo"], sppo={"train": {"loss": "sppo"}, "iterations": 2}))


def test_compare_sft_seed_trains_one_start_for_every_seed(tiny_dir: Path, tmp_path: Path) -> None:
    """With ``sft_seed`` one SFT agent (OUT/start-S) is every seed's start: no seed trains its
    own, and the sft rows are the same agent on the same games."""
    from turnrl.pipelines.compare import CompareConfig, run_compare, seed_run
    from turnrl.pipelines.eto import EtoConfig

    pipe = EtoConfig(base=str(tiny_dir), data_seed=1, expert_episodes=4, eval_episodes=3, eval_splits=["seen"],
                     max_new_tokens=8, sft={"epochs": 1.0, "batch_size": 4, "lr": 2e-3, "row_tokens": 512})
    out = tmp_path / "c"
    cfg = CompareConfig(out=str(out), seeds=[0, 1], methods=["sft"], sft_seed=5, pipeline=pipe)
    run_compare(cfg)
    assert is_done(out / "start-5" / "sft") and not list(out.glob("seed-*/sft"))
    recs = json.loads((out / "compare.json").read_text())["results"]
    sft = [{k: v for k, v in r.items() if k != "seed"} for r in recs if r["method"] == "sft"]
    assert len(sft) == 2 and sft[0] == sft[1]
    run = seed_run(cfg, 1)
    assert run.sft == str(out / "start-5" / "sft" / "model") and run.base_model == str(tiny_dir)  # 'base' is still the base
    assert "one SFT agent for every seed (trained with seed 5)" in (out / "compare.md").read_text()


def test_a_moved_compare_folder_resumes_its_unfinished_eto_row(tiny_dir: Path, tmp_path: Path) -> None:
    """A compare folder moved while an eto row was unfinished (killed during its evaluation) was refused:
    the row's settings pinned the seed's SFT agent, demos and exploration by their old paths, and the
    partial evaluation file named the trained model by its old path. It resumes to the same records."""
    import shutil

    from turnrl.pipelines.compare import CompareConfig, run_compare
    from turnrl.pipelines.eto import EtoConfig

    pipe = EtoConfig(base=str(tiny_dir), expert_episodes=8, explore_tasks=4, eval_episodes=6, eval_splits=["seen"],
                     iterations=1, num_envs=2, max_new_tokens=16,
                     sft={"epochs": 1.0, "batch_size": 8, "lr": 2e-3, "row_tokens": 512},
                     train={"epochs": 1.0, "batch_size": 4, "lr": 1e-4, "row_tokens": 512, "max_length": 512})
    a, b = tmp_path / "a", tmp_path / "moved" / "b"
    run_compare(CompareConfig(out=str(a), seeds=[0], methods=["sft", "eto"], pipeline=pipe))
    whole = json.loads((a / "compare.json").read_text())["results"]
    it = a / "seed-0" / "eto" / "iter-1"
    marker_path(a / "seed-0" / "eto.json").unlink()  # killed after 2 of its 6 evaluation games
    marker_path(it / "eval.json").unlink()
    games = (it / "eval-seen.jsonl").read_text().splitlines(keepends=True)
    (it / "eval-seen.jsonl").write_text("".join(games[:2]))
    shutil.move(a, b)
    run_compare(CompareConfig(out=str(b), seeds=[0], methods=["sft", "eto"], pipeline=pipe))
    assert json.loads((b / "compare.json").read_text())["results"] == whole
    assert len((b / "seed-0" / "eto" / "iter-1" / "eval-seen.jsonl").read_text().splitlines()) == 6


def test_cli_config_error_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from turnrl.cli import main

    bad = tmp_path / "c.yaml"
    bad.write_text("seeds: [0, 1, 2]\npipelin:\n  iterations: 1\n")
    for args in (["eto", "iteratons=1"], ["dmpo", "train.gama=0.5"], ["compare", "--config", str(bad)]):
        with pytest.raises(SystemExit) as exc:
            main(args)
        err = capsys.readouterr().err
        assert exc.value.code == 2, (args, err)
        assert "Traceback" not in err
        assert len(err.strip().splitlines()) == 1, err
    assert "pipeline" in err  # the suggestion for 'pipelin'


def test_compare_config_files_load() -> None:
    from turnrl.pipelines.compare import CompareConfig, _check

    root = Path(__file__).resolve().parents[1] / "configs" / "compare"
    files = sorted(root.glob("*.yaml"))
    assert files
    for f in files:
        cfg = load_config(CompareConfig, f)
        _check(cfg)
        assert len(cfg.seeds) >= 3


# ----------------------------------------------------------------------------- aggregation


def _rec(method: str, seed: int, split: str, reward: float, **kw: Any) -> dict[str, Any]:
    return {"method": method, "seed": seed, "split": split, "env": "tictactoe", "episodes": 10, "avg_reward": reward,
            "success_rate": reward, "avg_turns": 3.0, "invalid_action_rate": 0.0, "ci95": [reward, reward], **kw}


def test_paired_by_unit_hand_computed() -> None:
    from turnrl.stats import paired_by_unit

    treated = [{"a": 1.0, "b": 0.0, "c": 1.0}, {"a": 1.0, "b": 1.0, "c": -1.0}]
    control = [{"a": 0.0, "b": 0.0, "c": 0.0}, {"a": 1.0, "b": 0.0, "c": 0.0, "d": 5.0}]  # d: not in every run
    # per unit, the mean over runs of treated - control: a (1 + 0)/2, b (0 + 1)/2, c (1 - 1)/2
    mean, (lo, hi), n, up, down = paired_by_unit(treated, control)
    half = 4.303 * math.sqrt(1 / 12) / math.sqrt(3)  # sd of (0.5, 0.5, 0) is sqrt(1/12); t(2) = 4.303
    assert n == 3 and mean == pytest.approx(1 / 3)
    assert (up, down) == (2, 0)  # a and b above 0, c at 0
    assert (lo, hi) == pytest.approx((1 / 3 - half, 1 / 3 + half))
    with pytest.raises(ValueError, match="as many treated as control runs"):
        paired_by_unit(treated, control[:1])


def test_aggregate_uses_last_iteration_and_ci_across_seeds() -> None:
    from turnrl.pipelines.compare import (
        CompareConfig,
        _with_dmpo_iteration,
        aggregate,
        iteration_rows,
        verdicts,
    )
    from turnrl.stats import mean_ci95

    recs = [_rec("sft", s, "seen", r) for s, r in enumerate([0.1, 0.2, 0.15])]
    recs += [_rec("eto", s, "seen", 0.0, iteration=1) for s in range(3)]
    recs += [_rec("eto", s, "seen", r, iteration=2) for s, r in enumerate([0.6, 0.7, 0.65])]
    rows = {r["method"]: r for r in aggregate(recs)}
    m, ci = mean_ci95([0.6, 0.7, 0.65])
    assert rows["eto"]["avg_reward"] == pytest.approx(m, abs=1e-4)
    assert rows["eto"]["ci95"] == pytest.approx(list(ci), abs=1e-4)
    assert rows["eto"]["seeds"] == 3
    it = iteration_rows(recs)
    assert [r["iteration"] for r in it] == [0, 1, 2]
    assert it[1]["avg_reward"] == 0.0
    assert rows["sft"]["vs_sft"] is None
    m, ci = mean_ci95([0.5, 0.5, 0.5])  # paired with the same seed's SFT: 0.6-0.1, 0.7-0.2, 0.65-0.15
    assert rows["eto"]["vs_sft"] == {"mean": pytest.approx(0.5), "ci95": pytest.approx(list(ci), abs=1e-4),
                                     "seeds": 3, "up": 3, "down": 0}
    v = verdicts(CompareConfig(methods=["sft", "eto"]), list(rows.values()))
    assert any("eto vs sft" in line and "above (CIs do not overlap)" in line
               and "paired difference +0.500" in line and "(above 0; 3 up, 0 down)" in line for line in v)
    # a row clearly below its comparison is "below", not "not separated" (ETO's first iteration here: 0.0)
    low = aggregate([r for r in recs if not (r["method"] == "eto" and r["iteration"] == 2)])
    assert any("eto vs sft" in line and "**below (CIs do not overlap)**" in line
               for line in verdicts(CompareConfig(methods=["sft", "eto"]), low))
    one = aggregate([_rec("sft", 0, "seen", 0.1), _rec("eto", 0, "seen", 0.9, iteration=1)])
    assert "no verdict" in verdicts(CompareConfig(methods=["sft", "eto"]), one)[0]
    recs += [_rec("sppo", s, "seen", r, iteration=3) for s, r in enumerate([0.3, 0.1, 0.2])]
    recs += [_rec("sppo_dpo", s, "seen", r, iteration=3) for s, r in enumerate([0.2, 0.2, 0.2])]
    it = iteration_rows(recs)
    assert [(r["method"], r["iteration"]) for r in it] == [("eto", 0), ("eto", 1), ("eto", 2), ("sppo", 0),
                                                           ("sppo", 3), ("sppo_dpo", 0), ("sppo_dpo", 3)]
    assert it[3]["avg_reward"] == pytest.approx(0.15) and it[4]["avg_reward"] == pytest.approx(0.2)
    v = verdicts(CompareConfig(methods=["sft", "eto", "sppo", "sppo_dpo"]), aggregate(recs))
    assert any(line.startswith("- sppo vs sft") and "not separated" in line  # 0.3-0.1, 0.1-0.2, 0.2-0.15
               and "+0.050 [" in line and "(contains 0; 2 up, 1 down)" in line for line in v)
    # a seed whose SFT agent is missing is left out of the pairing, not paired with another seed's
    partial = aggregate([r for r in recs if not (r["method"] == "sft" and r["seed"] == 2)])
    assert next(r for r in partial if r["method"] == "eto")["vs_sft"]["seeds"] == 2
    assert any(line.startswith("- sppo vs sppo_dpo") and "not separated" in line for line in v)
    # DMPO without its DPO baseline (ETO's first iteration, not run) says so instead of dropping the claim
    dm_recs = recs + [_rec("dmpo-g0.1-noisy", s, "seen", 0.3, iteration=1) for s in range(3)]
    dm = aggregate(dm_recs)
    lone = verdicts(CompareConfig(methods=["sft", "dmpo"], dmpo_gammas=[0.1]),
                    [r for r in dm if r["method"] != "eto"])
    assert "- noisy losers, seen: DMPO gamma=0.1 has no DPO row to compare with (the DPO baseline is ETO's " \
           "iteration 1, dpo_from_eto: run eto too)" in lone
    cfg1 = CompareConfig(methods=["sft", "eto", "dmpo"], dmpo_gammas=[0.1])
    both = verdicts(cfg1, _with_dmpo_iteration(cfg1, dm, dm_recs))
    assert any(line.startswith("- noisy losers, seen: DMPO gamma=0.1 0.300") and "vs DPO 0.000" in line
               and "DMPO at least as good" in line for line in both)
    # with dmpo_iterations=2 DMPO's DPO row is ETO's iteration 2 (0.65), not its first (0.0)
    dm2_recs = recs + [_rec("dmpo-g0.1-noisy", s, "seen", 0.3, iteration=i) for s in range(3) for i in (1, 2)]
    cfg2 = CompareConfig(methods=["sft", "eto", "dmpo"], dmpo_gammas=[0.1], dmpo_iterations=2)
    two = verdicts(cfg2, _with_dmpo_iteration(cfg2, aggregate(dm2_recs), dm2_recs))
    assert any(line.startswith("- noisy losers, seen: DMPO gamma=0.1 0.300") and "vs DPO 0.650" in line
               and "DPO higher" in line for line in two)


def test_aggregate_pairs_rows_with_sft_game_by_game() -> None:
    """``vs_sft_by_game``: per game, the row minus the same seed's SFT agent, averaged over seeds,
    with a CI across games; in the table and the claims. Seeds without games' returns are left out."""
    from turnrl.pipelines.compare import CompareConfig, aggregate, report
    from turnrl.stats import mean_ci95

    recs = [_rec("sft", 0, "seen", 0.0, game_returns=[1.0, 0.0, -1.0, 0.0]),
            _rec("sft", 1, "seen", 0.0, game_returns=[1.0, 0.0, -1.0, 0.0]),
            _rec("sft", 2, "seen", 0.0),  # written before games' returns were kept
            _rec("eto", 0, "seen", 0.5, iteration=1, game_returns=[1.0, 1.0, 0.0, 0.0]),
            _rec("eto", 1, "seen", 0.0, iteration=1, game_returns=[1.0, 1.0, -1.0, -1.0]),
            _rec("eto", 2, "seen", 0.25, iteration=1)]
    rows = {r["method"]: r for r in aggregate(recs)}
    # per game, the mean over seeds 0 and 1 of eto - sft: 0, 1, 0.5, -0.5
    m, ci = mean_ci95([0.0, 1.0, 0.5, -0.5])
    g = rows["eto"]["vs_sft_by_game"]
    assert (g["games"], g["seeds"], g["mean"]) == (4, 2, pytest.approx(m)) and g["ci95"] == pytest.approx(list(ci))
    assert (g["up"], g["down"]) == (2, 1)  # games 1 and 2 go up, game 3 down
    assert rows["sft"]["vs_sft_by_game"] is None and rows["eto"]["vs_sft"]["seeds"] == 3
    md = report(CompareConfig(methods=["sft", "eto"]), list(rows.values()), recs)
    # the by-game figure says it rests on fewer seeds than the paired one beside it
    assert f"| {m:+.3f} [{ci[0]:.3f}, {ci[1]:.3f}], 2 of 3 seeds |" in md
    assert f"by game {m:+.3f} [{ci[0]:.3f}, {ci[1]:.3f}] over 4 games, 2 of 3 seeds (contains 0; 2 up, 1 down)" in md
    both = [r for r in recs if r["seed"] != 2]
    md = report(CompareConfig(methods=["sft", "eto"]), aggregate(both), both)
    assert f"| {m:+.3f} [{ci[0]:.3f}, {ci[1]:.3f}] |" in md and "over 4 games (contains 0" in md


def test_one_seed_tables_print_no_ci_across_seeds_and_claims_give_no_verdict() -> None:
    """With one seed a CI across seeds is a point: printed as [0.250, 0.250] it read as an interval
    that excludes 0, and the DMPO-vs-DPO claim still picked a side. The by-game CI (across games)
    stays."""
    from turnrl.pipelines.compare import CompareConfig, _with_dmpo_iteration, aggregate, report

    games = {"sft": [1.0, 0.0, -1.0, 0.0], "eto": [1.0, 1.0, 0.0, 0.0], "dmpo-g0.1-noisy": [1.0, 1.0, 1.0, 0.0]}
    recs = [_rec(m, 0, "seen", sum(g) / 4, game_returns=g, **({} if m == "sft" else {"iteration": 1}))
            for m, g in games.items()]
    cfg = CompareConfig(methods=["sft", "eto", "dmpo"], dmpo_gammas=[0.1])
    rows = _with_dmpo_iteration(cfg, aggregate(recs), recs)
    md = report(cfg, rows, recs)
    assert "| sft | seen | 1 | 0.000 | (one seed: no CI) |" in md
    assert "| +0.500 (one seed: no CI) | +0.500 [" in md  # paired across seeds: none; by game: a CI
    assert "noisy losers, seen: DMPO gamma=0.1 0.750 (one seed: no CI) vs DPO 0.500 (one seed: no CI) -> " \
           "one seed: no CI across seeds, no verdict" in md
    assert "[0.250, 0.250]" not in md and "[0.000, 0.000]" not in md


def test_report_tables_round_a_statistic_once() -> None:
    """SFT's CI in the method table and in the by-iteration table is one number printed twice:
    these ten seeds' lower bound is 0.45549..., which rounding to 4 decimals first turned into
    0.456 in one table while the other printed 0.455; ETO's ten seeds average 0.4975, which
    rounding to 6 decimals first printed 0.497 against the other table's 0.498."""
    from turnrl.pipelines.compare import _ci, aggregate, iteration_rows
    from turnrl.stats import mean_ci95

    sft = [0.545, 0.33, 0.61, 0.66, 0.36, 0.66, 0.52, 0.59, 0.58, 0.51]
    recs = [_rec("sft", s, "seen", r) for s, r in enumerate(sft)]
    recs += [_rec("sppo", s, "seen", 0.6, iteration=3) for s in range(10)]
    eto = [0.67, -0.04, 0.635, 0.78, 0.2, 0.78, 0.62, 0.65, 0.63, 0.05]
    recs += [_rec("eto", s, "seen", r, iteration=1) for s, r in enumerate(eto)]
    rows = {r["method"]: r for r in aggregate(recs)}
    its = {(r["method"], r["iteration"]): r for r in iteration_rows(recs)}
    assert _ci(rows["sft"]) == _ci(its["sppo", 0]) == "[0.455, 0.618]"
    assert f"{rows['eto']['avg_reward']:.3f}" == f"{its['eto', 1]['avg_reward']:.3f}"
    # nor on the order of the seeds
    means = {f"{mean_ci95(order)[0]:.3f}" for order in (eto, eto[::-1], sorted(eto))}
    assert len(means) == 1


# ----------------------------------------------------------------------------- kill and resume

DRIVER = """
import json, os, signal, sys
import torch
torch.set_num_threads(1)
kill = os.environ.get("TURNRL_TEST_KILL", "")

def die():
    os.kill(os.getpid(), signal.SIGKILL)

if kill == "explore":  # after 5 explored episodes were written
    from turnrl.data import io
    orig_write = io.JsonlWriter.write
    count = [0]
    def write(self, record):
        orig_write(self, record)
        if str(self.path).endswith("explore.jsonl"):
            count[0] += 1
            if count[0] == 5:
                die()
    io.JsonlWriter.write = write
elif kill == "pairs":  # half the pairs file written, no marker
    import turnrl.pipelines.eto as eto
    def write_jsonl(path, records, **kw):
        records = list(records)
        eto_orig(path, records[: len(records) // 2])
        die()
    eto_orig = eto.write_jsonl
    eto.write_jsonl = write_jsonl
elif kill == "train":  # after optimizer step 3; the last checkpoint is step 2
    from turnrl.train import core
    orig_step = core.Trainer._optimizer_step
    def step(self, s):
        out = orig_step(self, s)
        if s == 3:
            die()
        return out
    core.Trainer._optimizer_step = step

from turnrl.pipelines.eto import EtoConfig, run_pipeline
cfg = EtoConfig.model_validate(json.loads(sys.argv[1]))
run_pipeline(cfg, sys.argv[2], eval_start=False)
"""


def _pipeline_cfg(tiny: Path, sft: str) -> dict[str, Any]:
    # num_envs=1: a resumed exploration plays the remaining episodes in other batches, and a
    # barely trained agent's near-tied logits can flip under another batch's padding numerics
    return {"base": str(tiny), "model": sft, "expert_episodes": 8, "iterations": 1, "eval_episodes": 4,
            "eval_splits": ["seen"], "num_envs": 1, "max_new_tokens": 16, "pairs": "mixed", "loss": "dmpo",
            "train": {"epochs": 2.0, "batch_size": 2, "lr": 3e-4, "save_every": 2, "row_tokens": 512,
                      "max_length": 512}}


def _drive(cfg: dict[str, Any], out: Path, kill: str = "") -> int:
    env = {**os.environ, "TURNRL_TEST_KILL": kill, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(cfg), str(out)], env=env, capture_output=True,
                       text=True, timeout=1800)
    if kill:
        assert r.returncode == -9, r.stderr[-2000:]
    else:
        assert r.returncode == 0, r.stderr[-2000:]
    return r.returncode


@pytest.fixture(scope="module")
def sft_agent(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A (barely) trained agent, so that explorations write real actions quickly."""
    from turnrl.collect import run_policy
    from turnrl.quickstart import ENV, ENV_OPTS, PROMPT
    from turnrl.rollout.policies import ExpertPolicy
    from turnrl.train.sft import SFTConfig, train_sft

    d = tmp_path_factory.mktemp("sft")
    run_policy(ExpertPolicy(), ENV, split="train", episodes=24, env_opts=ENV_OPTS, prompt=PROMPT, out=d / "demos.jsonl")
    cfg = SFTConfig(epochs=1.0, batch_size=8, lr=2e-3, row_tokens=1024, history=0)
    return str(train_sft(str(tiny_dir), d / "demos.jsonl", d / "sft", cfg).model_dir)


@pytest.mark.integration
def test_killed_pipeline_resumes_to_the_same_result(tiny_dir: Path, sft_agent: str, tmp_path: Path) -> None:
    """Killed (SIGKILL) during exploration, then pair building, then training: each rerun resumes,
    the finished run equals an uninterrupted one (explorations, pairs, training log, eval)."""
    cfg = _pipeline_cfg(tiny_dir, sft_agent)
    ref, run = tmp_path / "ref", tmp_path / "killed"
    _drive(cfg, ref)

    _drive(cfg, run, kill="explore")
    explore = run / "iter-1" / "explore.jsonl"
    assert len(explore.read_text().splitlines()) == 5 and not is_done(explore)
    assert not (run / "eval_start.json").exists()
    _drive(cfg, run, kill="pairs")
    assert is_done(explore) and not is_done(run / "iter-1" / "pairs.jsonl")
    _drive(cfg, run, kill="train")
    assert is_done(run / "iter-1" / "pairs.jsonl") and not is_done(run / "iter-1" / "train")
    assert (run / "iter-1" / "train" / "checkpoints").is_dir()
    _drive(cfg, run)

    def lines(p: Path) -> list[dict[str, Any]]:
        return [json.loads(x) for x in p.read_text().splitlines()]

    def strip(d: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in d.items() if k not in ("time", "elapsed", "seconds", "tokens_per_sec")}

    ex_ref = sorted(lines(ref / "iter-1" / "explore.jsonl"), key=lambda t: t["id"])
    ex_run = sorted(lines(explore), key=lambda t: t["id"])
    assert [t["messages"] for t in ex_run] == [t["messages"] for t in ex_ref]
    assert lines(run / "iter-1" / "pairs.jsonl") == lines(ref / "iter-1" / "pairs.jsonl")
    assert len(lines(ref / "iter-1" / "pairs.jsonl")) > 0
    m_ref = [strip(r) for r in lines(ref / "iter-1" / "train" / "metrics.jsonl")]
    m_run = [strip(r) for r in lines(run / "iter-1" / "train" / "metrics.jsonl")]
    assert [r.get("step") for r in m_run] == [r.get("step") for r in m_ref]
    for a, b in zip(m_run, m_ref, strict=True):
        if "loss" in a:
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-6)
    s_ref = json.loads((ref / "summary.json").read_text())
    s_run = json.loads((run / "summary.json").read_text())
    assert s_run["iterations"][0]["results"] == s_ref["iterations"][0]["results"]
    assert s_run["iterations"][0]["pairs"] == s_ref["iterations"][0]["pairs"]


@pytest.mark.integration
def test_killed_sampled_exploration_resumes_to_the_same_episodes(tiny_dir: Path, sft_agent: str,
                                                                 tmp_path: Path) -> None:
    """An exploration at temperature 1 killed (SIGKILL) after 5 episodes resumes with exactly the
    episodes an uninterrupted run samples (each turn draws from its own keyed stream), here with
    three environments, so the resumed episodes run in other batches than the uninterrupted ones."""
    cfg = {**_pipeline_cfg(tiny_dir, sft_agent), "explore_temperature": 1.0, "num_envs": 3}
    ref, run = tmp_path / "ref", tmp_path / "killed"
    _drive(cfg, ref)
    _drive(cfg, run, kill="explore")
    explore = run / "iter-1" / "explore.jsonl"
    assert len(explore.read_text().splitlines()) == 5 and not is_done(explore)
    _drive(cfg, run)

    def replies(p: Path) -> list[Any]:
        ts = sorted((json.loads(x) for x in p.read_text().splitlines()), key=lambda t: t["id"])
        return [[{k: v for k, v in m.items() if k != "logprobs"} for m in t["messages"]] for t in ts]

    assert replies(explore) == replies(ref / "iter-1" / "explore.jsonl")
    assert len({json.dumps(r) for r in replies(explore)}) > 1
    s_ref = json.loads((ref / "summary.json").read_text())
    s_run = json.loads((run / "summary.json").read_text())
    assert s_run["iterations"][0]["pairs"] == s_ref["iterations"][0]["pairs"]


@pytest.mark.integration
def test_compare_end_to_end_from_the_cli(tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``turnrl compare`` on the tiny model, 2 seeds: SFT and SPPO first (no ETO/DMPO, so no
    shared exploration), then the same out with ETO added: the finished stages are skipped,
    the exploration runs, and compare.json/.md and the plots cover every method and seed."""
    from turnrl.cli import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"""
out: {tmp_path / "out"}
seeds: [0, 1]
methods: [sft, sppo]
pipeline:
  base: {tiny_dir}
  expert_episodes: 8
  explore_tasks: 4
  eval_episodes: 4
  eval_splits: [seen]
  max_new_tokens: 16
  sft: {{epochs: 1.0, batch_size: 8, lr: 2.0e-3, row_tokens: 512, history: 0}}
  train: {{epochs: 1.0, batch_size: 4, lr: 1.0e-4, row_tokens: 512, max_length: 512}}
sppo: {{iterations: 1, train_tasks: 2, samples_per_task: 2, train: {{batch_size: 4, row_tokens: 512}}}}
""")
    out = tmp_path / "out"
    main(["compare", "--config", str(cfg)])
    assert not list(out.glob("seed-*/explore-sft.jsonl"))  # nothing read it
    capsys.readouterr()
    main(["compare", "--config", str(cfg), "methods=[sft,sppo,eto]"])
    logged = "".join(capsys.readouterr())
    for stage in ("seed-0/sft", "seed-1/sppo"):
        assert f"skip {stage} (done)" in logged and f"run {stage}" not in logged, logged[-2000:]
    for seed in (0, 1):
        assert is_done(out / f"seed-{seed}" / "explore-sft.jsonl")
        assert is_done(out / f"seed-{seed}" / "sppo.json") and is_done(out / f"seed-{seed}" / "eto.json")
    recs = json.loads((out / "compare.json").read_text())["results"]
    got = {(r["method"], r["seed"]) for r in recs if r["split"] == "seen"}
    assert got == {(m, s) for m in ("sft", "sppo", "eto") for s in (0, 1)}
    assert all(-1.0 <= r["avg_reward"] <= 1.0 and r["episodes"] == 4 for r in recs)
    table = (out / "compare.md").read_text()
    assert all(f"| {m} " in table for m in ("sft", "sppo", "eto"))
    assert "![reward by iteration](reward_by_iteration.png)" in table and "dmpo_gamma" not in table
    assert (out / "reward_by_iteration.png").stat().st_size > 0 and not (out / "dmpo_gamma.png").exists()


def test_report_and_plots_from_records(tmp_path: Path) -> None:
    from turnrl.pipelines.compare import CompareConfig, aggregate, plot_all, report
    from turnrl.stats import mean_ci95

    cfg = CompareConfig(dmpo_gammas=[0.1, 0.9])
    recs: list[dict[str, Any]] = []
    for s in range(3):
        for split in ("seen", "unseen"):
            recs += [_rec("base", s, split, 0.3), _rec("sft", s, split, 0.2 + 0.01 * s),
                     _rec("best_of_n", s, split, 0.9), _rec("rft", s, split, 0.4)]
            for i in (1, 2):
                recs.append(_rec("eto", s, split, 0.5 + 0.1 * i, iteration=i, loss="dpo", losers="noisy",
                                 loser_turns=4.0))
            for losers in ("clean", "noisy"):
                for g in (0.1, 0.9):
                    recs.append(_rec(f"dmpo-g{g:g}-{losers}", s, split, 0.6 + g / 10, iteration=1, loss="dmpo",
                                     gamma=g, losers=losers, loser_turns=4.0))
            recs.append(_rec("dpo-clean", s, split, 0.55, iteration=1, loss="dpo", losers="clean", loser_turns=3.0))
            recs.append(_rec("dpo-noisy-k0", s, split, 0.5, iteration=1, loss="dpo", losers="noisy",
                             truncate_k=0, loser_turns=3.0))
            recs.append(_rec("dmpo-g0.1-noisy-k0", s, split, 0.62, iteration=1, loss="dmpo", gamma=0.1,
                             losers="noisy", truncate_k=0, loser_turns=3.0))
    rows = aggregate(recs)
    md = report(cfg, rows, recs)
    assert "| eto | seen | 3 | 0.700 |" in md
    m, (lo, hi) = mean_ci95([0.5, 0.49, 0.48])  # ETO 0.7 minus SFT 0.20, 0.21, 0.22
    assert f"| {m:+.3f} [{lo:.3f}, {hi:.3f}] |" in md
    assert "DMPO gamma=0.1 0.610" in md and "DPO 0.600" in md  # compared with ETO's first iteration
    assert "random valid action played for it" in md and "Best-of-10" in md
    strict = cfg.model_copy(update={"methods": ["sft", "eto"], "pipeline": cfg.pipeline.model_copy(
        update={"invalid_action": "end", "invalid_penalty": -1.0})})
    head = report(strict, rows, recs).split("\n")[2]
    assert "ends the episode, reward -1)" in head and "Best-of" not in head and "data_seed" not in head
    fixed = strict.model_copy(update={"pipeline": strict.pipeline.model_copy(update={"data_seed": 7})})
    assert "one set of 200 demos for every seed: data_seed 7" in report(fixed, rows, recs).split("\n")[2]
    names = ["reward_by_method", "reward_by_iteration", "dmpo_gamma", "loser_length"]
    assert plot_all(cfg, recs, rows, tmp_path) == [f"{n}.png" for n in names]
    for name in names:
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
    assert "![dmpo gamma](dmpo_gamma.png)" in report(cfg, rows, recs, [f"{n}.png" for n in names])
    # without DMPO or ETO rows: no gamma or loser-length plot, and the stale ones go
    plain = [r for r in recs if r["method"] in ("sft", "rft")]
    assert plot_all(cfg, plain, aggregate(plain), tmp_path) == ["reward_by_method.png"]
    assert not (tmp_path / "dmpo_gamma.png").exists() and not (tmp_path / "loser_length.png").exists()
    # ETO without the loser-length study: no lone "DPO" point; without ETO's iteration dmpo_iterations
    # (here 2 of a 1-iteration ETO) no DPO line or verdict from another iteration
    eto_only = [r for r in recs if r["method"] in ("sft", "eto")]
    assert plot_all(cfg.model_copy(update={"methods": ["sft", "eto"]}), eto_only, aggregate(eto_only),
                    tmp_path) == ["reward_by_method.png", "reward_by_iteration.png"]
    one = [r for r in recs if r["method"] == "sft" or r["method"] == "eto" and r["iteration"] == 1
           or r["method"] == "dmpo-g0.1-noisy"]
    later = cfg.model_copy(update={"dmpo_iterations": 2})
    assert "has no DPO row to compare with (no row of ETO's iteration 2 among these)" in report(later, aggregate(one), one)
    # a DMPO study without the loser-length study: no loser-length plot at all (no lone DMPO point)
    dm = [r for r in recs if r["method"] in ("sft", "eto") or r["method"].startswith("dmpo-g") and "-k" not in r["method"]]
    assert "loser_length.png" not in plot_all(cfg.model_copy(update={"methods": ["sft", "eto", "dmpo"]}), dm,
                                              aggregate(dm), tmp_path)
    # loser turns are kept unrounded and rounded once, in the report
    uneven = [_rec("eto", s, "seen", 0.5, iteration=1, loss="dpo", losers="noisy", loser_turns=t)
              for s, t in ((0, 10 / 10), (1, 12 / 11))]
    assert aggregate(uneven)[0]["loser_turns"] == pytest.approx((1 + 12 / 11) / 2, abs=1e-12)


@pytest.mark.parametrize("turns", ["random", "all"])
def test_step_plan_replays_the_experts_prefix_for_one_or_every_turn(turns: str) -> None:
    """Step-wise exploration: one random t in 1..T-1 a task, or every one; indices after the
    trajectory episodes', distinct, and the same plan on every call (a resume replays it)."""
    from turnrl.collect import run_policy
    from turnrl.pipelines.eto import EtoConfig, _train_specs, step_plan
    from turnrl.rollout import ExpertPolicy

    cfg = EtoConfig(expert_episodes=12, pairs="step", step_turns=turns).check()
    specs = _train_specs(cfg)
    experts = run_policy(ExpertPolicy(), cfg.env, specs=specs, env_opts=cfg.env_opts)
    plan = step_plan(cfg, specs, experts, 1)
    assert plan == step_plan(cfg, specs, experts, 1)
    assert len({s.index for s in plan}) == len(plan) and min(s.index for s in plan) >= len(specs)
    turns_of: dict[str, list[int]] = {}
    for s in plan:
        turns_of.setdefault(s.task_id, []).append(s.expert_turns)
    for e in experts:
        got = turns_of.get(e.task_id, [])
        if turns == "all":
            assert got == list(range(1, e.num_turns))
        else:
            assert len(got) == (e.num_turns > 1) and all(1 <= t < e.num_turns for t in got)
    if turns == "random":  # the plan of runs made before step_turns: task j's episode is len(specs) + j
        index_of = {s.task_id: s.index for s in specs}
        assert all(s.index == len(specs) + index_of[s.task_id] for s in plan)


class _FixedCells:
    """A scripted agent that plays cell 4t mod 9 at turn t, occupied or not (an invalid move then gets a
    random legal one), with made-up token ids and log-probs; it draws nothing from the episode's rng."""

    name = "fixed-cells"

    def act(self, requests: Any) -> list[Any]:
        from turnrl.agent.prompting import format_turn
        from turnrl.rollout.policies import Reply

        return [Reply(format_turn("my cell", str(4 * r.turn % 9)), [100 + r.turn, 7], [-0.5, -0.25]) for r in requests]


def _takeover_setup(tmp_path: Path, losers: str = "noisy") -> tuple[Any, list[Any], list[Any], list[Any]]:
    from turnrl.collect import run_policy
    from turnrl.data.io import read_trajectories
    from turnrl.pipelines.eto import EtoConfig, _train_specs, takeover
    from turnrl.rollout import ExpertPolicy

    cfg = EtoConfig(expert_episodes=30, pairs="takeover", losers=losers).check()
    specs = _train_specs(cfg)
    experts = run_policy(ExpertPolicy(), cfg.env, specs=specs, env_opts=cfg.env_opts, prompt=cfg.prompt())
    explored = run_policy(_FixedCells(), cfg.env, specs=specs, env_opts=cfg.env_opts, prompt=cfg.prompt())
    stats = takeover(cfg, explored, tmp_path / "takeover.jsonl")
    takeovers = read_trajectories(tmp_path / "takeover.jsonl")
    assert stats["episodes"] == len(takeovers) == sum(x.num_turns - 1 for x in explored if not x.success) > 0
    return cfg, experts, explored, takeovers


def test_takeover_replays_the_agents_own_game_then_the_expert_plays_on(tmp_path: Path) -> None:
    """Each lost game is replayed for its first t turns, t = 1..T-1 (sampled ids, log-probs, the
    random move played for an invalid one, the observations: the same game), then the expert plays."""
    from turnrl.pipelines.eto import EtoConfig, takeover

    _, _, explored, takeovers = _takeover_setup(tmp_path)
    game = {(x.task_id, x.meta["seed"]): x for x in explored}
    assert any(m.valid is False for x in explored for m in x.messages)  # replays cover invalid moves
    seen: dict[tuple[str, int], list[int]] = {}
    for y in takeovers:
        x, t = game[(y.task_id, y.meta["seed"])], y.meta["replayed_turns"]
        seen.setdefault((y.task_id, y.meta["seed"]), []).append(t)
        upto = [i for i, m in enumerate(x.messages) if m.role == "assistant"][t]  # agent turn t
        assert y.messages[:upto] == x.messages[:upto]  # the same game, up to turn t's observation
        assert y.messages[upto].token_ids is None and y.messages[upto].valid  # the expert's turn
    assert all(sorted(ts) == list(range(1, game[k].num_turns)) for k, ts in seen.items())
    won = [x for x in explored if x.success]  # nothing to take over: an empty stage file, still written
    assert takeover(EtoConfig(), won, tmp_path / "none.jsonl")["episodes"] == 0
    assert (tmp_path / "none.jsonl").read_text() == ""


def test_takeover_pairs_take_the_latest_turn_the_expert_does_better_from(tmp_path: Path) -> None:
    from turnrl.data.pairs import takeover_pairs

    _, experts, explored, takeovers = _takeover_setup(tmp_path)
    stats: dict[str, int] = {}
    pairs = takeover_pairs(experts, explored, takeovers, stats=stats)
    assert pairs and stats["pairs"] == len(pairs) and "prefix_mismatch" not in stats
    won = sum(x.success for x in explored)  # counted apart from the lost games no takeover beats
    assert stats.get("agent_won", 0) == won
    assert stats["pairs"] + stats.get("no_better_takeover", 0) + won == len(explored)
    of_game: dict[tuple[str, int], list[Any]] = {}
    for y in takeovers:
        of_game.setdefault((y.task_id, y.meta["seed"]), []).append(y)
    expert_of = {e.task_id: e for e in experts}
    for p in pairs:
        x, t = p.rejected, p.meta["train_from_turn"]
        assert p.meta["kind"] == "takeover" and p.chosen.return_ > x.return_
        assert p.meta["diverge_turn"] == t  # the first trained turn of both sides has the same context
        later = [y for y in of_game[(x.task_id, x.meta["seed"])] if y.meta["replayed_turns"] > t]
        assert all(y.return_ <= x.return_ for y in later)
        if t == 0:  # no takeover did better: the expert's own game, as in a trajectory pair
            assert p.chosen is expert_of[x.task_id]
        else:
            assert p.chosen.meta["replayed_turns"] == t and p.chosen.actions[t] != x.actions[t]
    # a takeover whose replayed prefix is not the game's is not paired with it
    forged = [y for y in takeovers if y.meta["replayed_turns"] == 1]
    for y in forged:
        y.messages[1].content += " (edited)"
    stats = {}
    assert len(takeover_pairs(experts, explored, forged, stats=stats)) <= len(pairs)
    assert stats["prefix_mismatch"] == len(forged)


def test_takeover_pairs_fall_back_on_the_expert_game_of_the_same_task_and_seed(tmp_path: Path) -> None:
    """A task the plan plays twice (two env seeds) has two expert games; each explored game falls back
    on the one of its own seed, so every lost game the expert's own game beats is paired."""

    from turnrl.collect import run_policy
    from turnrl.data.pairs import takeover_pairs
    from turnrl.pipelines.eto import EtoConfig, _train_specs
    from turnrl.rollout import ExpertPolicy
    from turnrl.rollout.sampler import EpisodeSpec

    cfg = EtoConfig(expert_episodes=15).check()
    once = _train_specs(cfg)
    specs = once + [EpisodeSpec(len(once) + i, s.split, s.task_id, s.seed + 1) for i, s in enumerate(once)]
    experts = run_policy(ExpertPolicy(), cfg.env, specs=specs, env_opts=cfg.env_opts, prompt=cfg.prompt())
    explored = run_policy(_FixedCells(), cfg.env, specs=specs, env_opts=cfg.env_opts, prompt=cfg.prompt())
    stats: dict[str, int] = {}
    pairs = takeover_pairs(experts, explored, [], stats=stats)  # no takeovers: the fallback alone
    expert_of = {(e.task_id, e.meta["seed"]): e for e in experts}
    beaten = [x for x in explored if expert_of[(x.task_id, x.meta["seed"])].return_ > x.return_]
    assert len(beaten) > len(once) // 2 and len(pairs) == len(beaten) and "no_expert" not in stats
    assert all(p.chosen is expert_of[(p.rejected.task_id, p.rejected.meta["seed"])] for p in pairs)
    stats = {}
    # the second seed's expert games missing: its games fall back on the task's other expert game
    pairs = takeover_pairs(experts[: len(once)], explored, [], stats=stats)
    assert "no_expert" not in stats and {p.chosen.meta["seed"] for p in pairs} <= {s.seed for s in once}
    stats = {}
    takeover_pairs(experts[1:len(once)], explored[: len(once)], [], stats=stats)  # no expert game of task 0
    assert stats["no_expert"] == 1


def test_expert_games_are_matched_by_seed_and_sample_groups_by_task(tmp_path: Path) -> None:
    """A plan with more episodes than the split has tasks plays a task again with another env seed,
    which draws other random moves of the sampler (the expert's tie-breaks here). Trajectory and step
    pairs compare an explored game with the expert game of its own seed (else the task's last): on
    twenty questions (54 train tasks, 49 of which the expert plays differently with another seed) an
    agent that replays the expert's own games gives no pair at all. SPPO's win rates and self-play
    pairs group every sample of a task, whatever its seed (as `turnrl collect` gives each its own)."""
    from collections import Counter

    from turnrl.data.pairs import self_play_pairs, step_pairs, trajectory_pairs
    from turnrl.oracles import EnvRewardOracle, score_samples
    from turnrl.pipelines.eto import EtoConfig, _play, _train_specs, step_plan
    from turnrl.rollout import ExpertPolicy, RandomPolicy

    cfg = EtoConfig(env="twenty_questions", env_opts={}, instruction=None, expert_episodes=120, num_envs=16)
    specs = _train_specs(cfg)
    assert len({s.task_id for s in specs}) < len(specs)  # tasks played twice or three times
    experts = _play(ExpertPolicy(), cfg, specs, tmp_path / "expert.jsonl")
    replayed = _play(ExpertPolicy(), cfg, specs, tmp_path / "replayed.jsonl")
    by_task = Counter(e.task_id for e in experts)
    assert any(len({e.return_ for e in experts if e.task_id == t}) > 1 for t, n in by_task.items() if n > 1)
    stats: dict[str, int] = {}
    assert trajectory_pairs(experts, replayed, stats=stats) == [] and stats["same_return"] == len(specs)
    every = cfg.model_copy(update={"step_turns": "all"})
    plan = step_plan(every, specs, experts, 1)  # every turn of each game's own expert game (of its seed)
    own = {e.game: e for e in experts}
    assert len(plan) == sum(e.num_turns - 1 for e in experts)
    assert all(0 < s.expert_turns < own[(s.task_id, s.seed)].num_turns for s in plan)
    steps = _play(ExpertPolicy(), cfg, plan, tmp_path / "steps.jsonl")
    stats = {}
    assert step_pairs(experts, steps, stats=stats) == [] and "prefix_mismatch" not in stats and "no_step" not in stats

    # every sample of a task is one group: here the task's expert games (2 or 3 seeds) and random games
    randoms = _play(RandomPolicy(), cfg, specs, tmp_path / "random.jsonl")
    scored = score_samples(experts + randoms, EnvRewardOracle(1.0))
    for t in scored:
        group = [u for u in experts + randoms if u.task_id == t.task_id]
        assert t.meta["group_size"] == len(group) == 2 * by_task[t.task_id]
        want = sum(0.5 if u.return_ == t.return_ else 1 / (1 + math.exp(u.return_ - t.return_)) for u in group)
        assert t.meta["win_rate"] == pytest.approx(want / len(group))
    pairs = self_play_pairs(experts + randoms)
    assert len(pairs) == len(by_task) and all(p.chosen.task_id == p.rejected.task_id for p in pairs)


def test_episode_spec_replays_expert_turns_or_replies_not_both() -> None:
    from turnrl.rollout.policies import Reply
    from turnrl.rollout.sampler import EpisodeSpec

    with pytest.raises(ValueError, match="not both"):
        EpisodeSpec(0, "train", "t", 1, expert_turns=1, replay=(Reply("Action: 4"),))


def test_compare_refuses_a_finished_dmpo_stage_of_another_iteration_count(tmp_path: Path) -> None:
    from turnrl.pipelines.compare import _check_iterations

    recs = [{"method": "dmpo-g0.1-noisy", "iteration": 1}]
    _check_iterations(tmp_path / "dmpo.json", recs, 1)
    with pytest.raises(TurnRLError, match=r"dmpo.json: holds 1 DMPO iteration\(s\), this run asks for "
                                          r"dmpo_iterations=2; choose another out or remove it$"):
        _check_iterations(tmp_path / "dmpo.json", recs, 2)
    _check_iterations(tmp_path / "dmpo.json", [{**recs[0], "iteration": i} for i in (1, 2)], 2)


def test_takeover_pairs_clean_drops_losers_with_invalid_moves(tmp_path: Path) -> None:
    from turnrl.data.pairs import takeover_pairs

    _, experts, explored, takeovers = _takeover_setup(tmp_path, losers="clean")
    stats: dict[str, int] = {}
    pairs = takeover_pairs(experts, explored, takeovers, losers="clean", stats=stats)
    noisy = takeover_pairs(experts, explored, takeovers, losers="noisy")
    assert stats.get("dropped_invalid_action", 0) > 0
    assert len(pairs) == len(noisy) - stats["dropped_invalid_action"]
    assert all(m.valid is not False for p in pairs for m in p.rejected.messages)


def test_takeover_iteration_writes_its_stage_and_pairs_from_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``pairs=takeover``: iteration i explores, writes OUT/iter-i/takeover.jsonl (a done stage), pairs
    from it and trains on them; another pair strategy writes no takeover stage."""
    from turnrl.collect import run_policy
    from turnrl.data.io import read_pairs
    from turnrl.pipelines import eto
    from turnrl.rollout import ExpertPolicy

    trained: list[Path] = []
    monkeypatch.setattr(eto, "_policy", lambda model, cfg, temperature: _FixedCells())
    monkeypatch.setattr(eto, "train_pairs", lambda cfg, model, pairs, out, i: trained.append(pairs) or "new")
    monkeypatch.setattr(eto, "evaluate_model", lambda cfg, model, out, label: [])
    for pairs in ("takeover", "trajectory"):
        cfg = eto.EtoConfig(expert_episodes=12, pairs=pairs).check()
        expert = tmp_path / pairs / "expert.jsonl"
        run_policy(ExpertPolicy(), cfg.env, specs=eto._train_specs(cfg), env_opts=cfg.env_opts, prompt=cfg.prompt(),
                   out=expert)
        new, _, stats = eto.run_iteration(cfg, tmp_path / pairs, 1, "sft", expert)
        it = tmp_path / pairs / "iter-1"
        assert new == "new" and trained[-1] == it / "pairs.jsonl" and stats["pairs"] > 0
        kinds = {p.meta["kind"] for p in read_pairs(it / "pairs.jsonl")}
        assert kinds == ({"takeover"} if pairs == "takeover" else {"trajectory"})
        assert is_done(it / "takeover.jsonl") == (pairs == "takeover")


def test_an_iteration_without_pairs_says_what_the_builder_counted(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The error named one guess ("every explored return equals the expert's?") whatever happened, in
    self-play too, which has no expert; it gives the pair builder's counts."""
    from turnrl.collect import run_policy
    from turnrl.pipelines import eto
    from turnrl.rollout import ExpertPolicy

    monkeypatch.setattr(eto, "_policy", lambda model, cfg, temperature: ExpertPolicy())  # plays as the expert
    cfg = eto.EtoConfig(expert_episodes=6).check()
    expert = tmp_path / "expert.jsonl"
    run_policy(ExpertPolicy(), cfg.env, specs=eto._train_specs(cfg), env_opts=cfg.env_opts, prompt=cfg.prompt(),
               out=expert)
    with pytest.raises(TurnRLError, match=r"iter-1/pairs\.jsonl: no pairs \(same_return 6\)$"):
        eto.run_iteration(cfg, tmp_path / "run", 1, "sft", expert)


def test_cli_pairs_takeover_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``turnrl pairs --mode takeover --takeovers F`` writes the pairs takeover_pairs builds; without
    ``--takeovers`` it is a one-line error."""
    from test_cli import one_line_error, run

    from turnrl.data.io import read_pairs, write_jsonl
    from turnrl.data.pairs import takeover_pairs

    _, experts, explored, takeovers = _takeover_setup(tmp_path)
    for name, trajs in (("e", experts), ("x", explored)):
        write_jsonl(tmp_path / f"{name}.jsonl", trajs)
    files = ["--expert", str(tmp_path / "e.jsonl"), "--explored", str(tmp_path / "x.jsonl"), "--mode", "takeover"]
    code, out, _ = run(["pairs", *files, "--takeovers", str(tmp_path / "takeover.jsonl"), "--out",
                        str(tmp_path / "p.jsonl")], capsys)
    assert code == 0 and "pairs" in out
    want = takeover_pairs(experts, explored, takeovers)
    got = read_pairs(tmp_path / "p.jsonl")
    assert [p.meta for p in got] == [p.meta for p in want] and len(got) > 0
    code, _, err = run(["pairs", *files, "--out", str(tmp_path / "q.jsonl")], capsys)
    assert "--takeovers" in one_line_error(code, err)
    code, _, err = run(["pairs", *files, "--takeovers", str(tmp_path / "takeover.jsonl"), "--truncate-k", "0",
                        "--out", str(tmp_path / "q.jsonl")], capsys)
    assert "--mode takeover has none to cut" in one_line_error(code, err)
    code, _, err = run(["pairs", *files[:4], "--takeovers", str(tmp_path / "takeover.jsonl"), "--out",
                        str(tmp_path / "q.jsonl")], capsys)
    assert "--takeovers is for --mode takeover (got --mode trajectory)" in one_line_error(code, err)
    assert not (tmp_path / "q.jsonl").exists()


def test_self_play_rft_init_base_retrains_the_base_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Self-play's first iteration is RFT; ``rft_init: base`` retrains the base model (``base``), not
    the SFT agent the pipeline starts from (it was handed the SFT agent as the base)."""
    from turnrl.pipelines import eto

    bases: list[str] = []
    monkeypatch.setattr(eto, "rft", lambda cfg, base, model, *a, **kw: bases.append(base) or "rft-model")
    monkeypatch.setattr(eto, "_policy", lambda model, cfg, temperature: _FixedCells())
    monkeypatch.setattr(eto, "evaluate_model", lambda cfg, model, out, label: [])
    cfg = eto.EtoConfig(base="the-base", self_play=True, rft_init="base", expert_episodes=4, iterations=1).check()
    summary = eto.run_pipeline(cfg, tmp_path / "run", model="sft", expert=tmp_path / "unused.jsonl", eval_start=False)
    assert bases == ["the-base"] and summary["final_model"] == "rft-model"
    with pytest.raises(TurnRLError, match="model and expert are given together"):
        eto.run_pipeline(cfg, tmp_path / "half", model="sft")
    assert not (tmp_path / "half" / "settings.json").exists()  # refused before anything is written
    given = cfg.model_copy(update={"model": "the-start"})  # a given start model is the base (as in compare)
    eto.run_pipeline(given, tmp_path / "given", model="sft", expert=tmp_path / "unused.jsonl", eval_start=False)
    assert bases[-1] == "the-start" and not (tmp_path / "given" / "tiny").exists()


def test_compare_base_row_is_one_evaluation_when_greedy_and_one_a_seed_when_sampled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The untrained model plays the same greedy games whatever the seed, so the seeds share one
    evaluation; sampled evaluation games depend on the seed, so each seed plays its own (a shared
    one gave the base row a CI of width 0 across seeds)."""
    from turnrl.pipelines import compare
    from turnrl.pipelines.eto import EtoConfig

    outs: list[Path] = []
    monkeypatch.setattr(compare, "evaluate_model",
                        lambda pipe, model, out, label, **kw: outs.append(out) or [{"split": "seen", "seed": pipe.seed}])
    for temp in (0.0, 1.0):
        root = tmp_path / f"t{temp}"
        cfg = compare.CompareConfig(out=str(root), pipeline=EtoConfig(eval_temperature=temp))
        for s in (0, 1):
            run = compare.SeedRun(cfg, s, root / f"seed-{s}", cfg.pipeline.model_copy(update={"seed": s}), "base",
                                  "sft", root / "expert.jsonl")
            assert compare._base(run)[0]["method"] == "base"
    assert outs == [tmp_path / "t0.0" / "base-eval.json", tmp_path / "t1.0" / "seed-0" / "base-eval.json",
                    tmp_path / "t1.0" / "seed-1" / "base-eval.json"]


def test_compare_base_row_is_the_untrained_model_when_pipeline_model_gives_the_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``pipeline.model`` (the start agent, the sft row) the base row evaluated that same agent."""
    from turnrl.pipelines import compare
    from turnrl.pipelines.eto import EtoConfig

    seen: list[str] = []
    outs: list[Path] = []
    monkeypatch.setattr(compare, "evaluate_model",
                        lambda pipe, model, out, label, **kw: seen.append(model) or outs.append(out) or [{}])
    cfg = compare.CompareConfig(out=str(tmp_path), pipeline=EtoConfig(model="start-agent", base="untrained"))
    run = compare.SeedRun(cfg, 0, tmp_path / "seed-0", cfg.pipeline, "start-agent", "start-agent",
                          tmp_path / "expert.jsonl")
    compare._base(run)
    # in a file of its own: an older folder's base-eval.json holds the start agent's games
    assert seen == ["untrained"] and outs == [tmp_path / "base-eval-untrained.json"]


@pytest.mark.parametrize(("overrides", "message"), [
    (["pipeline.train.gamma=0.3"], r"^pipeline\.train\.gamma=0\.3: no method reads it"),
    (["methods=[eto]", "pipeline.iterations=0"], r"^pipeline\.iterations=0: method eto needs at least one"),
    (["methods=[sppo]", "pipeline.iterations=0"], r"^pipeline\.iterations=0: SPPO takes it and needs >= 1"),
    (["methods=[sppo_dpo]", "pipeline.samples_per_task=1"], r"^pipeline\.samples_per_task=1: SPPO takes it"),
])
def test_compare_refuses_settings_it_would_ignore_or_clamp(overrides: list[str], message: str) -> None:
    """Each was accepted: the gamma was overwritten by dmpo_gammas, no eto row was made, and SPPO's
    iterations and K were raised to 1 and 2 without a word."""
    from turnrl.errors import TurnRLError
    from turnrl.pipelines.compare import CompareConfig, _check

    with pytest.raises(TurnRLError, match=message):
        _check(load_config(CompareConfig, None, overrides))
    # the SPPO section may give its own (the pipeline's value is then not SPPO's)
    _check(load_config(CompareConfig, None, ["methods=[sppo]", "pipeline.samples_per_task=1",
                                             "sppo.samples_per_task=5"]))


def test_compare_settings_pin_a_given_start_models_weights(tmp_path: Path, tiny_dir: Path) -> None:
    """A start model replaced in place under the same path made compare reuse every finished stage."""
    import shutil

    from turnrl.errors import TurnRLError
    from turnrl.pipelines.compare import CompareConfig, compare_settings
    from turnrl.pipelines.iterative import check_settings

    model = tmp_path / "start"
    shutil.copytree(tiny_dir, model)
    cfg = load_config(CompareConfig, None, [f"out={tmp_path / 'c'}", f"pipeline.model={model}"])
    check_settings(cfg.out, compare_settings(cfg))
    check_settings(cfg.out, compare_settings(cfg))  # the same weights: resumes
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-5}))
    with pytest.raises(TurnRLError, match=r"model_fingerprints\.model"):
        check_settings(cfg.out, compare_settings(cfg))
    assert "model_fingerprints" not in compare_settings(load_config(CompareConfig, None, []))  # tiny: built in OUT


def test_a_pipeline_out_that_is_a_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from test_cli import one_line_error, run

    regfile = tmp_path / "regfile"
    regfile.write_text("mine\n")
    for command in ("eto", "dmpo", "sppo", "compare"):
        for out, what in ((regfile, "is a file, not a folder"), (regfile / "sub", f"{regfile} is a file")):
            code, _, err = run([command, f"out={out}"], capsys)
            line = one_line_error(code, err)
            assert code == 2 and line.startswith(f"error: out {out}: ") and what in line, (command, line)
    assert regfile.read_text() == "mine\n" and sorted(p.name for p in tmp_path.iterdir()) == ["regfile"]


def test_settings_record_the_command_and_another_commands_folder_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``turnrl quickstart --out`` on a ``turnrl eto`` folder rewrote its settings.json, and eto then reused
    stages made with other settings: settings.json names its command, and another command is refused."""
    from test_cli import one_line_error, run

    from turnrl.pipelines.iterative import check_settings, made_by

    out = tmp_path / "e"
    with made_by("eto"):
        check_settings(out, {"env": "tictactoe", "env_opts": {}, "loss": "dpo"})
    made = (out / "settings.json").read_text()
    assert json.loads(made)["command"] == "eto"
    code, _, err = run(["quickstart", "--out", str(out)], capsys)
    line = one_line_error(code, err)
    assert "made by 'turnrl eto'" in line and "not by 'turnrl quickstart'" in line and "--out" in line
    assert (out / "settings.json").read_text() == made and sorted(p.name for p in out.iterdir()) == ["settings.json"]
    with pytest.raises(TurnRLError, match="made by 'turnrl eto'.*not by 'turnrl sppo'"):
        check_settings(out, {"env": "tictactoe", "env_opts": {}, "loss": "dpo"}, command="sppo")
    check_settings(out, {"env": "tictactoe", "env_opts": {}, "loss": "dpo"}, command="dmpo")  # one pipeline
    check_settings(out, {"env": "tictactoe", "env_opts": {}, "loss": "dpo"})  # a library call keeps the record
    assert json.loads((out / "settings.json").read_text())["command"] == "dmpo"
    q = tmp_path / "q"  # a quickstart folder is refused by turnrl eto
    check_settings(q, {"env": "tictactoe"}, command="quickstart")
    code, _, err = run(["eto", f"out={q}"], capsys)
    assert "made by 'turnrl quickstart'" in one_line_error(code, err)
    old = tmp_path / "old"  # a folder made before commands were recorded: compared as before
    old.mkdir()
    (old / "settings.json").write_text(json.dumps({"env": "tictactoe"}))
    check_settings(old, {"env": "tictactoe"}, command="quickstart")
    with pytest.raises(TurnRLError, match=r"env: \"tictactoe\", now \"bandit\""):
        check_settings(old, {"env": "bandit"}, command="quickstart")


@pytest.mark.parametrize(("args", "named"), [
    (["dmpo", "loss=dpo"], "'turnrl dmpo' trains with loss=dmpo"),
    (["eto", "seed=-2"], "'seed': must be in [0, 2147483647]"),
    (["eto", "out="], "out is empty"),
    (["eto", "eval_splits=[]"], "eval_splits is empty"),
    (["compare", "seeds=[-1]"], "'seeds': must be in [0, 2147483647]"),
    (["compare", "seeds=[99999999999999999999]"], "'seeds': must be in"),
    (["compare", "methods=[]"], "methods is empty"),
    (["compare", "pipeline.loss=ipo"], "pipeline.loss=ipo: each method sets its loss"),
    (["compare", "pipeline.seed=7"], "pipeline.seed=7: the seeds are `seeds`"),
    (["compare", "pipeline.out=/elsewhere"], "pipeline.out=/elsewhere"),
])
def test_pipeline_settings_that_cannot_work_are_one_line_errors_before_any_work(
        args: list[str], named: str, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_cli import one_line_error, run

    monkeypatch.chdir(tmp_path)
    out = [] if any(a.startswith("out=") for a in args) else [f"out={tmp_path / 'run'}"]
    assert named in one_line_error(*run([*args, *out], capsys)[::2])
    assert not (tmp_path / "run").exists() and list(tmp_path.iterdir()) == []


def test_plots_are_written_whole_under_their_name(tmp_path: Path) -> None:
    from turnrl.report import _plt, atomic_savefig

    plt = _plt()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    (tmp_path / "p.png").write_bytes(b"old")
    atomic_savefig(fig, tmp_path / "p.png", dpi=50)
    plt.close(fig)
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and sorted(os.listdir(tmp_path)) == ["p.png"]


def test_another_env_takes_its_own_prompt_and_options() -> None:
    """The pipeline's prompt defaults are the quickstart's tic-tac-toe ones; env=bandit must not play
    the bandit with a tic-tac-toe instruction or a tic-tac-toe option."""
    from turnrl.pipelines.eto import EtoConfig

    cfg = load_config(EtoConfig, None, ["env=bandit"])
    assert cfg.instruction is None and cfg.env_opts == {} and cfg.history is None
    assert load_config(EtoConfig, None, ["env=bandit", "history=2", "env_opts.arms=3"]).env_opts == {"arms": 3}
    ttt = load_config(EtoConfig, None, [])
    assert ttt.instruction is not None and "tic-tac-toe" in ttt.instruction and ttt.history == 0


def test_eto_refuses_start_settings_nothing_reads(tmp_path: Path, tiny_dir: Path, capsys) -> None:
    """With ``model`` no SFT runs: ``sft.epochs=50`` ran to the end without a word; so did ``rft_*``
    in a run without self-play."""
    from test_cli import one_line_error, run

    out = tmp_path / "o"
    for args, said in ((["sft.epochs=50"], "sft.epochs=50.0 is not used: model=.* is the start and no SFT runs"),
                       (["self_play=true", "sft.warmup_ratio=0.2"],
                        "sft.warmup_ratio=0.2 is not used: .*self-play's RFT from the agent trains rft_epochs"),
                       (["rft_epochs=2"], "rft_epochs=2.0 sets self-play's RFT; this run is not self_play")):
        code, _, err = run(["eto", f"out={out}", f"model={tiny_dir}", *args], capsys)
        assert re.search(said, one_line_error(code, err)), err
    assert not out.exists()
    # a folder made before the check, with such a setting, resumes with it: settings.json decides there
    out.mkdir()
    (out / "settings.json").write_text(json.dumps({"sft": {"epochs": 49.0}}))
    code, _, err = run(["eto", f"out={out}", f"model={tiny_dir}", "sft.epochs=50"], capsys)
    assert "made with other settings (sft.epochs: 49.0, now 50.0)" in one_line_error(code, err)
    from turnrl.pipelines.eto import EtoConfig

    # what is read passes: self-play's RFT reads sft.lr, and from the base model every sft setting
    for args in ([f"model={tiny_dir}", "self_play=true", "sft.lr=0.001"],
                 [f"model={tiny_dir}", "self_play=true", "rft_init=base", "sft.epochs=5"],
                 ["sft.epochs=5"]):  # SFT runs
        load_config(EtoConfig, None, args).check_start_settings()


def test_a_folder_no_pipeline_made_is_not_taken_over(tmp_path: Path) -> None:
    """A folder without settings.json was adopted: `turnrl quickstart --out` on a `turnrl train sft`
    run replaced its summary.json and report.md. A pipeline's folder of before settings were
    recorded holds stage markers, and is still taken."""
    from turnrl.pipelines.iterative import check_settings

    user = tmp_path / "user"
    user.mkdir()
    (user / "summary.json").write_text('{"schema": "turnrl.train_summary/v1"}')
    (user / ".hidden").write_text("")
    with pytest.raises(TurnRLError, match=r"^--out .*user: holds files \(summary\.json\) but no settings\.json"):
        check_settings(user, {"a": 1}, command="quickstart", what="--out")
    assert sorted(p.name for p in user.iterdir()) == [".hidden", "summary.json"]
    legacy = tmp_path / "legacy"
    (legacy / "seed-0").mkdir(parents=True)
    (legacy / "seed-0" / "sft.done.json").write_text("{}")
    check_settings(legacy, {"a": 1})
    study = tmp_path / "study"  # a greedy study's folder of before 27 Nov 2026: its study.json, no markers
    (study / "bandit").mkdir(parents=True)
    (study / "study.json").write_text("{}")
    check_settings(study, {"a": 1})
    empty = tmp_path / "empty"
    empty.mkdir()
    check_settings(empty, {"a": 1})
    assert (legacy / "settings.json").is_file() and (empty / "settings.json").is_file()


def test_a_budget_that_trains_nothing_is_refused_only_where_read_and_by_its_key() -> None:
    """sft.epochs=0 matters only where the pipeline trains its start (no model given), train.epochs=0
    only with iterations (in a comparison: rows that train it); the key is named as the config has it."""
    from turnrl.pipelines.compare import CompareConfig, _check
    from turnrl.pipelines.eto import EtoConfig

    load_config(EtoConfig, overrides=["model=tiny", "sft.epochs=0"]).check()  # SFT does not run
    load_config(EtoConfig, overrides=["iterations=0", "train.epochs=0"]).check()  # no preference step
    with pytest.raises(TurnRLError, match=r"^pipeline.sft.epochs=0 and pipeline.sft.max_steps=0: nothing"):
        _check(load_config(CompareConfig, overrides=["pipeline.sft.epochs=0"]))
    _check(load_config(CompareConfig, overrides=["methods=[sft,rft]", "pipeline.train.epochs=0"]))
    with pytest.raises(TurnRLError, match=r"^pipeline.train.epochs=0 and pipeline.train.max_steps=0"):
        _check(load_config(CompareConfig, overrides=["methods=[sft,eto]", "pipeline.train.epochs=0"]))
    with pytest.raises(TurnRLError, match=r"^compare config, section sppo: train.epochs=0 and train.max_steps=0"):
        _check(load_config(CompareConfig, overrides=["methods=[sft,sppo]", "sppo={train: {epochs: 0}}"]))
