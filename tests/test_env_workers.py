"""Env worker processes and the threaded lock-step sampler."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from turnrl import envs
from turnrl.data.io import JsonlWriter, read_trajectories
from turnrl.envs.checker import check_env
from turnrl.envs.scienceworld import available as scienceworld_available
from turnrl.envs.workers import ProcessEnv, ThreadedSampler, worker_factory
from turnrl.errors import TurnRLError
from turnrl.rollout import ExpertPolicy
from turnrl.rollout.policies import RandomPolicy, Reply, Request
from turnrl.rollout.sampler import Sampler, plan_episodes


def _dump(trajs: list[Any]) -> list[str]:
    return [json.dumps(t.to_dict() if hasattr(t, "to_dict") else t.__dict__, sort_keys=True, default=str)
            for t in trajs]


@pytest.mark.parametrize(("name", "policy"), [("twenty_questions", ExpertPolicy()), ("shop", ExpertPolicy()),
                                              ("tictactoe", RandomPolicy())])
def test_threaded_sampler_gives_the_samplers_trajectories(name: str, policy: Any) -> None:
    env = envs.make(name)
    specs = plan_episodes(env, "seen", 13, seed=4)
    plain = Sampler(lambda: envs.make(name), policy, env_name=name, num_envs=4)
    threaded = ThreadedSampler(lambda: envs.make(name), policy, env_name=name, num_envs=4)
    try:
        seen: list[str] = []
        a = plain.run(specs)
        b = threaded.run(specs, on_episode=lambda t: seen.append(t.id))
    finally:
        plain.close()
        threaded.close()
    assert _dump(a) == _dump(b)
    assert sorted(seen) == sorted(t.id for t in b)


class SlowCounter(envs.TextEnv):
    """Count to 3; every call sleeps (a stand-in for a slow simulator)."""

    name = "slow_counter"
    max_turns = 5

    def __init__(self, delay: float = 0.05, crash_at: int = -1, crash_expert_at: int = -1) -> None:
        self.delay, self.crash_at, self.crash_expert_at = delay, crash_at, crash_expert_at
        self.n, self.task = 0, "c0"

    @property
    def instruction(self) -> str:
        return "Say +1 three times."

    def task_ids(self, split: str) -> list[str]:
        return [f"{split}-{k}" for k in range(20)]

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        time.sleep(self.delay)
        self.n, self.task = 0, (options or {}).get("task_id", "train-0")
        return "at 0", {"task_id": self.task, "valid_actions": ["+1"]}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        time.sleep(self.delay)
        self.n += 1
        if self.n == self.crash_at:
            os._exit(3)  # the process dies
        done = self.n >= 3
        info: dict = {"task_id": self.task, "valid_actions": [] if done else ["+1"]}
        if done:
            info["success"] = True
        return f"at {self.n}", float(done), done, False, info

    def expert(self, rng: random.Random) -> envs.ExpertStep:
        if self.n == self.crash_expert_at:
            os._exit(4)
        rng.random()
        return envs.ExpertStep("+1", "One more.")


def slow_counter(**opts: Any) -> SlowCounter:
    return SlowCounter(**opts)


def test_process_env_keeps_the_contract() -> None:
    env = ProcessEnv(factory=slow_counter, env_opts={"delay": 0.0}, start_method="fork")
    try:
        assert check_env(env, episodes=2) == []
        assert env.worker_pid not in (None, os.getpid()) and env.remote("delay") == 0.0
        rng = random.Random(5)
        env.reset(options={"task_id": "seen-3"})
        env.expert(rng)
        ref = random.Random(5)
        ref.random()
        assert rng.getstate() == ref.getstate()  # the worker's draws advance the caller's rng
    finally:
        env.close()
    with pytest.raises(TurnRLError, match="give exactly one of env_name and factory"):
        ProcessEnv()
    bad = ProcessEnv("twenty_questions")
    try:
        with pytest.raises(TurnRLError, match="unknown task id"):
            bad.reset(options={"task_id": "20q-nothing"})
    finally:
        bad.close()


def test_threaded_sampler_with_process_envs() -> None:
    specs = plan_episodes(SlowCounter(), "seen", 8)
    sampler = ThreadedSampler(lambda: ProcessEnv(factory=slow_counter, env_opts={"delay": 0.01}, start_method="fork"), ExpertPolicy(),
                              env_name="slow_counter", num_envs=4)
    try:
        trajs = sampler.run(specs)
        again = sampler.run(specs)  # the same workers, reused
    finally:
        sampler.close()
    assert [t.success for t in trajs] == [True] * 8 and [t.num_turns for t in trajs] == [3] * 8
    assert _dump(trajs) == _dump(again)


class KillWorker(ExpertPolicy):
    def __init__(self, task: str) -> None:
        self.task, self.killed = task, False

    def act(self, requests: list[Request]) -> list[Reply]:  # type: ignore[override]
        for r in requests:
            if not self.killed and r.env._task_id == self.task and r.turn == 1:  # type: ignore[attr-defined]
                os.kill(r.env.worker_pid, signal.SIGKILL)  # type: ignore[attr-defined]
                self.killed = True
        return super().act(requests)


def test_a_dead_worker_fails_its_episode_and_the_collection_goes_on(tmp_path: Path) -> None:
    out = tmp_path / "episodes.jsonl"
    specs = plan_episodes(SlowCounter(), "seen", 6)
    policy = KillWorker(specs[2].task_id)
    sampler = ThreadedSampler(lambda: ProcessEnv(factory=slow_counter, env_opts={"delay": 0.0}, timeout=20, start_method="fork"),
                              policy, env_name="slow_counter", num_envs=3)
    try:
        with JsonlWriter(out, append=True) as writer:
            trajs = sampler.run(specs, on_episode=writer.write)
    finally:
        sampler.close()
    assert policy.killed and len(read_trajectories(out)) == 6
    failed = [t for t in trajs if not t.success]
    assert [t.task_id for t in failed] == [specs[2].task_id]
    assert failed[0].meta["outcome"] == "env_error" and "worker process died" in failed[0].meta["final_observation"]


@pytest.mark.parametrize("mode", ["random", "error", "end"])
def test_a_worker_that_dies_in_expert_ends_the_episode_as_an_env_error(mode: str) -> None:
    """The expert's move after a crash must reach the env, whose step ends the episode as an
    env_error: a made-up move counted as the agent's invalid one (a penalty; under ``error`` a
    loop of penalties up to max_turns)."""
    from turnrl.agent.prompting import PromptConfig

    sampler = Sampler(lambda: ProcessEnv(factory=slow_counter, env_opts={"delay": 0.0, "crash_expert_at": 1},
                                         timeout=20, start_method="fork"),
                      ExpertPolicy(), env_name="slow_counter", num_envs=1,
                      prompt=PromptConfig(invalid_action=mode, invalid_penalty=-1.0))  # type: ignore[arg-type]
    try:
        (t,) = sampler.run(plan_episodes(SlowCounter(), "seen", 1))
    finally:
        sampler.close()
    assert t.meta["outcome"] == "env_error" and t.truncated and t.num_turns == 2
    assert t.rewards == [0.0, 0.0] and all(m.valid is not False for m in t.messages if m.role == "assistant")


def test_a_hung_worker_times_out() -> None:
    env = ProcessEnv(factory=slow_counter, env_opts={"delay": 0.0}, timeout=2, start_method="fork")
    try:
        env.reset(options={"task_id": "seen-0"})
        os.kill(env.worker_pid or 0, signal.SIGSTOP)
        obs, _, term, trunc, info = env.step("+1")
        assert trunc and not term and "timed out after 2 s" in info["error"]
        with pytest.raises(TurnRLError, match="no expert move"):  # the failed step ended the episode
            env.expert(random.Random(0))
        obs, info = env.reset(options={"task_id": "seen-1"})
        assert obs == "at 0" and env.restarts == 1
    finally:
        env.close()


def test_a_killed_worker_reports_its_exit_code_and_the_episode_then_ends() -> None:
    env = ProcessEnv(factory=slow_counter, env_opts={"delay": 0.0}, timeout=20, start_method="fork")
    try:
        env.reset(options={"task_id": "seen-0"})
        os.kill(env.worker_pid or 0, signal.SIGKILL)
        time.sleep(0.2)
        _, _, term, trunc, info = env.step("+1")
        assert trunc and not term and info["outcome"] == "env_error"
        assert "exit code -9" in info["error"], info["error"]
        with pytest.raises(TurnRLError, match="the episode is over"):  # as every env after its last step
            env.step("+1")
        assert env.reset(options={"task_id": "seen-1"})[0] == "at 0"
    finally:
        env.close()


@pytest.mark.parametrize("op", ["step", "reset"])
def test_closing_an_env_whose_worker_a_hung_call_holds_stops_the_worker(op: str) -> None:
    """After Ctrl-C, closing the collection waited for the lock a hung env's call held, for up to its
    timeout (600 s by default), with the worker alive; now close stops the worker after RELEASE_WAIT.
    A hung step ends its episode as an env error; a hung reset, which is retried in a fresh worker,
    gets none (the retry hung again, for another timeout) and fails."""
    import threading

    from turnrl.envs import workers

    env = ProcessEnv(factory=slow_counter, env_opts={"delay": 0.0}, timeout=600, start_method="fork")
    env.reset(options={"task_id": "seen-0"})
    pid = env.worker_pid or 0
    os.kill(pid, signal.SIGSTOP)  # hung
    result: list[Any] = []

    def call() -> None:
        try:
            result.append(env.step("+1") if op == "step" else env.reset(options={"task_id": "seen-1"}))
        except TurnRLError as e:
            result.append(e)

    calling = threading.Thread(target=call, daemon=True)
    calling.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    env.close()
    closed = time.monotonic() - t0
    calling.join(timeout=10)
    assert not calling.is_alive() and closed < workers.RELEASE_WAIT + 5  # not the 600 s timeout
    if op == "step":
        _, _, term, trunc, info = result[0]
        assert trunc and not term and info["outcome"] == "env_error" and "died" in info["error"]
    else:
        assert isinstance(result[0], TurnRLError) and "the env is being closed" in str(result[0])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the worker is gone


def test_a_call_interrupted_while_it_waits_leaves_no_reply_for_the_next_one() -> None:
    """Ctrl-C during a step left the worker's reply in the pipe: the next reset read the step's reply
    (too many values to unpack) and every later call its predecessor's. The worker now goes, as a dead
    one does: the episode is over, and the next reset starts a fresh worker."""
    env = ProcessEnv(factory=slow_counter, env_opts={"delay": 0.5}, timeout=20, start_method="fork")

    def interrupt(*_: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        env.reset(options={"task_id": "seen-1"})
        signal.setitimer(signal.ITIMER_REAL, 0.2)  # mid-step: the worker sleeps 0.5 s before it answers
        with pytest.raises(KeyboardInterrupt):
            env.step("+1")
        assert env.reset(options={"task_id": "seen-7"}) == ("at 0", {"task_id": "seen-7", "valid_actions": ["+1"]})
        assert env.step("+1")[0] == "at 1" and env.step("+1")[0] == "at 2" and env.restarts == 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        env.close()


@pytest.mark.slow
@pytest.mark.skipif(not scienceworld_available(), reason="needs the scienceworld package and Java")
def test_scienceworld_in_worker_processes(tmp_path: Path) -> None:
    opts = {"task_names": "find-living-thing,find-plant", "gold_cache": False}
    make = worker_factory("scienceworld", opts)
    probe = envs.make("scienceworld", **opts)
    specs = plan_episodes(probe, "unseen", 6)
    sampler = ThreadedSampler(make, ExpertPolicy(), env_name="scienceworld", num_envs=3)
    try:
        trajs = sampler.run(specs)
    finally:
        sampler.close()
    assert all(t.success and t.return_ == pytest.approx(1.0) for t in trajs)


def test_an_env_that_fails_to_start_does_not_keep_its_worker() -> None:
    """A proxy whose env raises when it is built never counts as a user of the worker: a pool
    worker it started is stopped, not left running with no env."""
    from turnrl.envs.workers import _Worker

    worker = _Worker(None, {"delay": 0.0, "fail": True}, lambda **kw: SlowCounter(**{"delay": 0.0})
                     if not kw.get("fail") else (_ for _ in ()).throw(ValueError("no such board")),
                     timeout=20, start_timeout=20, start_method="fork")
    with pytest.raises(TurnRLError, match="no such board"):
        ProcessEnv(worker=worker)
    assert worker.users == 0 and not worker.alive()
