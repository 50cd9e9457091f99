"""`workers=N`: collections with envs in N worker processes equal in-process collections."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from turnrl.cli import main
from turnrl.collect import run_policy
from turnrl.envs.workers import ProcessEnv, ThreadedSampler, worker_pool_factory
from turnrl.errors import TurnRLError
from turnrl.rollout import ExpertPolicy, RandomPolicy, SamplingConfig, load_policy
from turnrl.rollout.sampler import plan_episodes


def _dump(trajs: list[Any]) -> list[str]:
    return [json.dumps(t.to_dict(), sort_keys=True) for t in trajs]


@pytest.mark.parametrize("policy", [ExpertPolicy(), RandomPolicy()], ids=["expert", "random"])
def test_shop_with_two_workers_equals_one_and_none(policy: Any) -> None:
    kw: dict[str, Any] = {"split": "seen", "episodes": 10, "num_envs": 4, "seed": 7}
    inproc = run_policy(policy, "shop", **kw)
    one = run_policy(policy, "shop", workers=1, **kw)
    two = run_policy(policy, "shop", workers=2, **kw)
    assert len(two) == 10 and _dump(one) == _dump(two) == _dump(inproc)
    assert len({t.task_id for t in two}) > 1 and sum(t.num_turns for t in two) > 10
    if isinstance(policy, ExpertPolicy):
        assert all(t.success for t in two)


@pytest.mark.parametrize("env", ["tictactoe", pytest.param("shop", marks=pytest.mark.slow)])
def test_tiny_model_greedy_with_two_workers_equals_one(tiny_dir: Path, env: str) -> None:
    policy = load_policy(str(tiny_dir), sampling=SamplingConfig(temperature=0.0, max_new_tokens=12))
    kw: dict[str, Any] = {"split": "seen", "episodes": 4, "num_envs": 4, "seed": 1}
    one = run_policy(policy, env, workers=1, **kw)
    two = run_policy(policy, env, workers=2, **kw)
    assert _dump(one) == _dump(two)
    assert all(m.token_ids for t in two for m in t.messages if m.role == "assistant")


def start_shared_pool(envs: list[Any]) -> tuple[list[int | None], list[str]]:
    """Four twenty-questions proxies of a 2-worker pool: check that envs 0/2 and 1/3 share a
    worker that is not this process, start an episode in each; their pids and task ids."""
    pids = [e.worker_pid for e in envs]
    assert pids[0] == pids[2] and pids[1] == pids[3] and pids[0] != pids[1] and os.getpid() not in pids
    ids = envs[0].task_ids("seen")
    for e, task in zip(envs, ids, strict=False):
        e.reset(options={"task_id": task, "split": "seen"})
    return pids, ids


def test_pool_shares_processes_and_a_dead_worker_fails_its_episodes() -> None:
    make = worker_pool_factory("twenty_questions", workers=2)
    envs = [make() for _ in range(4)]
    try:
        pids, ids = start_shared_pool(envs)
        os.kill(pids[0] or 0, signal.SIGKILL)
        for e in (envs[0], envs[2]):  # both envs of the dead worker lose their episode
            obs, _, term, trunc, info = e.step("Is it an animal?")
            assert trunc and not term and info["outcome"] == "env_error"
        _, _, _, trunc, info = envs[1].step("Is it an animal?")
        assert info.get("outcome") != "env_error"  # the other worker is untouched
        envs[0].reset(options={"task_id": ids[0], "split": "seen"})  # a fresh worker
        envs[2].reset(options={"task_id": ids[2], "split": "seen"})
        assert envs[0].worker_pid == envs[2].worker_pid not in (None, pids[0])
        assert envs[2].step("Is it an animal?")[4].get("outcome") != "env_error"
    finally:
        for e in envs:
            e.close()
    assert all(e.worker_pid is None for e in envs)  # the last env closed stops its process
    with pytest.raises(TurnRLError, match="workers must be >= 1"):
        worker_pool_factory("shop", workers=0)
    with pytest.raises(TurnRLError, match="workers must be >= 0"):
        run_policy(ExpertPolicy(), "shop", episodes=1, workers=-1)


def test_pool_with_threaded_sampler_runs_more_envs_than_workers() -> None:
    probe = ProcessEnv("tictactoe")
    try:
        specs = plan_episodes(probe, "seen", 9, seed=2)
    finally:
        probe.close()  # its worker process stops
    sampler = ThreadedSampler(worker_pool_factory("tictactoe", workers=2), RandomPolicy(), env_name="tictactoe",
                              num_envs=5)
    try:
        trajs = sampler.run(specs)
        pids = {e.worker_pid for e in sampler._envs}
    finally:
        sampler.close()
    assert len(trajs) == 9 and len(pids) == 2


def test_cli_collect_with_workers(tmp_path: Path) -> None:
    outs = []
    for workers in (0, 2):
        out = tmp_path / f"w{workers}.jsonl"
        main(["collect", "--env", "shop", "--policy", "expert", "--out", str(out), "--episodes", "6",
              "--num-envs", "3", "--workers", str(workers)])
        outs.append(out.read_text())
    assert outs[0] == outs[1] and len(outs[0].splitlines()) == 6


@pytest.mark.parametrize("policy", ["ucb", "greedy"])
def test_scripted_bandit_policies_refuse_workers_before_writing(tmp_path: Path, policy: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A scripted bandit policy (and the epsilon-greedy / try-all aids) reads the env object's arms, which
    a worker keeps in its own process: refused up front, with nothing written; in-process it runs."""
    out = tmp_path / "b.jsonl"
    args = ["collect", "--env", "bandit", "--policy", policy, "--env-opt", "horizon=3", "--episodes", "2", "--out", str(out)]
    with pytest.raises(SystemExit) as exc:
        main([*args, "--workers", "1"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code != 0 and err == f"error: policy '{policy}' reads the env's state in this process: run it " \
        "without workers (--workers)"
    assert not out.exists()
    main(args)
    assert len(out.read_text().splitlines()) == 2


def test_cli_collect_progress_bar_goes_to_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The bar is on stderr (whose terminal decides whether it shows), never in stdout's output."""
    monkeypatch.setenv("TURNRL_PROGRESS", "1")  # stderr is not a terminal under pytest: force the bar
    out = tmp_path / "w.jsonl"
    main(["collect", "--env", "shop", "--policy", "expert", "--out", str(out), "--episodes", "2", "--num-envs", "2"])
    captured = capsys.readouterr()
    assert "collect shop/train" in captured.err and "2/2" in captured.err
    assert "collect shop/train" not in captured.out and "━" not in captured.out
    assert "2 episodes in" in captured.out
