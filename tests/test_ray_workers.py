"""`worker_backend="ray"`: envs in Ray actors give the episodes of in-process envs.

The Ray tests need the optional extra (``pip install 'turnrl[ray]'``) and are skipped
without it; the missing-extra error is tested without Ray.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_collect_workers import start_shared_pool

from turnrl.cli import main
from turnrl.collect import run_policy
from turnrl.envs.ray_workers import MISSING_RAY, RayEnv, ray_pool_factory
from turnrl.errors import TurnRLError
from turnrl.rollout import ExpertPolicy, RandomPolicy


def _dump(trajs: list[Any]) -> list[str]:
    return [json.dumps(t.to_dict(), sort_keys=True) for t in trajs]


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
        raise SystemExit(0)
    return int(exc.value.code or 0), capsys.readouterr().err


# --------------------------------------------------------------------------- no ray needed
def test_missing_ray_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    for call in (lambda: ray_pool_factory("tictactoe", workers=2), lambda: RayEnv("tictactoe"),
                 lambda: run_policy(ExpertPolicy(), "tictactoe", episodes=1, workers=2, worker_backend="ray")):
        with pytest.raises(TurnRLError) as e:
            call()
        assert str(e.value) == MISSING_RAY == "the ray backend needs the optional extra: pip install 'turnrl[ray]'"
    code, err = _cli(["collect", "--env", "tictactoe", "--policy", "expert", "--out", str(tmp_path / "x.jsonl"),
                      "--workers", "2", "--worker-backend", "ray"], capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and MISSING_RAY in lines[0]


def test_bad_worker_backend_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(TurnRLError, match="unknown worker backend 'threads'; choose from: process, ray"):
        run_policy(ExpertPolicy(), "tictactoe", episodes=1, workers=2, worker_backend="threads")
    with pytest.raises(TurnRLError, match="give N >= 1"):
        run_policy(ExpertPolicy(), "tictactoe", episodes=1, worker_backend="ray")
    code, err = _cli(["eval", "--env", "tictactoe", "--policy", "expert", "--out", str(tmp_path / "x.json"),
                      "--workers", "2", "--worker-backend", "thread"], capsys)
    assert code == 2 and "unknown worker backend 'thread'" in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------------------ with ray
@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_two_actors_equal_in_process(ray_cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kw: dict[str, Any] = {"split": "seen", "episodes": 10, "num_envs": 4, "seed": 7}
    for policy in (ExpertPolicy(), RandomPolicy()):
        inproc = run_policy(policy, "tictactoe", **kw)
        two = run_policy(policy, "tictactoe", workers=2, worker_backend="ray", **kw)
        assert len(two) == 10 and _dump(two) == _dump(inproc)
        assert len({t.task_id for t in two}) > 1 and sum(t.num_turns for t in two) > 10
    outs = []
    for extra in ([], ["--workers", "2", "--worker-backend", "ray"]):
        out = tmp_path / f"c{len(extra)}.jsonl"
        code, _ = _cli(["collect", "--env", "twenty_questions", "--policy", "expert", "--out", str(out),
                        "--episodes", "6", "--num-envs", "3", *extra], capsys)
        assert code == 0
        outs.append(out.read_text())
    assert outs[0] == outs[1] and len(outs[0].splitlines()) == 6


def _wait_gone(pid: int, limit: float = 60.0) -> None:
    """Wait until process ``pid`` has exited (or is a zombie)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    return
        except (ProcessLookupError, FileNotFoundError):
            return
        time.sleep(0.1)
    raise AssertionError(f"actor process {pid} still alive {limit:g} s after ray.kill")


@pytest.mark.slow
def test_a_dead_actor_fails_its_episodes_and_the_next_reset_starts_a_fresh_one(ray_cluster: Any) -> None:
    make = ray_pool_factory("twenty_questions", workers=2)
    envs = [make() for _ in range(4)]
    try:
        pids, ids = start_shared_pool(envs)
        ray_cluster.kill(envs[0].actor)
        _wait_gone(pids[0] or 0)  # ray.kill is asynchronous: a call sent right after it may still be served
        for e in (envs[0], envs[2]):  # both envs of the dead actor lose their episode
            obs, _, term, trunc, info = e.step("Is it an animal?")
            assert trunc and not term and info["outcome"] == "env_error" and "Ray actor died" in info["error"]
            with pytest.raises(TurnRLError, match="no expert move"):  # the failed step ended the episode
                e.expert(random.Random(0))
        assert envs[1].step("Is it an animal?")[4].get("outcome") != "env_error"  # the other actor is untouched
        envs[0].reset(options={"task_id": ids[0], "split": "seen"})  # a fresh actor
        envs[2].reset(options={"task_id": ids[2], "split": "seen"})
        assert envs[0].worker_pid == envs[2].worker_pid not in (None, pids[0]) and envs[0].restarts == 1
        assert envs[2].step("Is it an animal?")[4].get("outcome") != "env_error"
        with pytest.raises(TurnRLError, match="unknown task id"):
            envs[3].reset(options={"task_id": "20q-nothing"})  # env errors are the env's, not a failure
    finally:
        for e in envs:
            e.close()
    assert all(e.actor is None for e in envs)  # the last env closed kills its actor
    with pytest.raises(TurnRLError, match="workers must be >= 1"):
        ray_pool_factory("twenty_questions", workers=0)


@pytest.mark.slow
def test_a_hung_actor_times_out(ray_cluster: Any) -> None:
    env = RayEnv("twenty_questions", timeout=3)
    pid = env.worker_pid
    try:
        ids = env.task_ids("seen")
        env.reset(options={"task_id": ids[0], "split": "seen"})
        assert pid is not None and pid != os.getpid()
        os.kill(pid, signal.SIGSTOP)  # the actor's process (local here) stops answering
        obs, _, term, trunc, info = env.step("Is it an animal?")
        assert trunc and not term and info["outcome"] == "env_error" and "timed out after 3 s" in info["error"]
        obs, _ = env.reset(options={"task_id": ids[1], "split": "seen"})
        assert obs and env.restarts == 1 and env.worker_pid not in (None, pid)
        assert env.step("Is it an animal?")[4].get("outcome") != "env_error"
    finally:
        env.close()
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)  # the stopped process, in case Ray left it
            except (ProcessLookupError, PermissionError):
                pass
