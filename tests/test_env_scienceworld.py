"""scienceworld: task ids and splits (no Java needed); episodes, the gold expert and Java
failures (kill, hang) on the real simulator (slow; skipped without the package and Java)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
from collections.abc import Sequence
from pathlib import Path

import pytest

from turnrl.collect import run_policy
from turnrl.envs.checker import check_env
from turnrl.envs.scienceworld import (
    STEP_LIMITS,
    TASK_NAMES,
    TASKS,
    ScienceWorld,
    _thought,
    available,
    parse_task,
)
from turnrl.errors import TurnRLError
from turnrl.rollout import ExpertPolicy
from turnrl.rollout.policies import Reply, Request

needs_java = pytest.mark.skipif(not available(), reason="needs the scienceworld package and Java")
QUICK = "find-living-thing,find-plant"


# -- without Java ------------------------------------------------------------------------


def test_task_ids_and_one_line_errors() -> None:
    assert parse_task("boil-v21") == ("boil", 21)
    assert parse_task("identify-life-stages-1-v3") == ("identify-life-stages-1", 3)
    for bad, needle in [
        ("boil", "expected '<task name>-v<variation>'"),
        ("boill-v1", "unknown task 'boill' (did you mean 'boil'?)"),
        ("boil-v30", "task 'boil' has variations 0-29, not 30"),
        (7, "unknown task id 7"),
    ]:
        with pytest.raises(TurnRLError, match=re.escape(needle)) as e:
            parse_task(bad)
        assert "\n" not in str(e.value)
    with pytest.raises(TurnRLError, match="unknown task 'melting'"):
        ScienceWorld(task_names="boil,melting")
    with pytest.raises(TurnRLError, match="unknown simplification 'eazy'"):
        ScienceWorld(simplification="eazy")
    with pytest.raises(TurnRLError, match="step_timeout must be a positive number"):
        ScienceWorld(step_timeout=0)
    with pytest.raises(TurnRLError, match="not among this env's task_names"):
        ScienceWorld(task_names="boil").reset(options={"task_id": "melt-v0"})


def test_splits_are_the_packages_variation_ranges_round_robin() -> None:
    env = ScienceWorld()
    ids = {s: env.task_ids(s) for s in ("train", "seen", "unseen")}
    assert len(ids["train"]) == sum(t[2] for t in TASKS)
    assert len(ids["seen"]) == sum(t[3] - t[2] for t in TASKS)
    assert len(ids["unseen"]) == sum(t[4] - t[3] for t in TASKS)
    assert [parse_task(t)[0] for t in ids["seen"][:30]] == list(TASK_NAMES)
    assert ids["seen"][0] == "boil-v14" and ids["unseen"][0] == "boil-v21"
    assert not set(ids["train"]) & (set(ids["seen"]) | set(ids["unseen"]))
    assert set(STEP_LIMITS) == set(TASK_NAMES)
    small = ScienceWorld(task_names=["power-component", "boil"])
    assert small.task_ids("unseen") == ["power-component-v15", "boil-v21", "power-component-v16", "boil-v22",
                                        "power-component-v17", "boil-v23", "power-component-v18", "boil-v24",
                                        "power-component-v19", "boil-v25", "boil-v26", "boil-v27", "boil-v28",
                                        "boil-v29"]
    assert small.max_turns == STEP_LIMITS["boil"]


def test_thought_templates() -> None:
    assert _thought("pick up metal pot") == "I need the metal pot, so I pick it up."
    assert _thought("move metal pot to sink") == "I move the metal pot to the sink."
    assert _thought("focus on substance in metal pot") == "The task is about the substance in metal pot, so I focus on it."
    assert _thought("0") == "The game asks which one I mean; I choose option 0."
    assert _thought("flush toilet") == "The next step is to flush toilet."


# -- with Java ---------------------------------------------------------------------------


@needs_java
@pytest.mark.slow
def test_package_tasks_match_the_table() -> None:
    from scienceworld import ScienceWorldEnv

    sw = ScienceWorldEnv("", envStepLimit=100)
    try:
        assert sorted(sw.get_task_names()) == sorted(TASK_NAMES)
        for _, name, train, dev, n in TASKS:
            sw.load(name, 0)
            assert list(sw.get_variations_train()) == list(range(0, train)), name
            assert list(sw.get_variations_dev()) == list(range(train, dev)), name
            assert list(sw.get_variations_test()) == list(range(dev, n)), name
    finally:
        sw.close()


@needs_java
@pytest.mark.slow
def test_checker_and_gold_expert(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNRL_HOME", str(tmp_path))
    env = ScienceWorld(task_names=QUICK)
    try:
        assert check_env(env, episodes=2) == []
        obs, info = env.reset(options={"task_id": "find-plant-v160"})
        assert "This room is called" in obs and "Your task is to find a(n) plant" in env.instruction
        assert info["score"] == 0 and env.valid_actions() is None
        rng, total = random.Random(0), 0.0
        for _ in range(env.max_turns):
            step = env.expert(rng)
            obs, reward, term, trunc, info = env.step(step.action)
            total += reward
            if term or trunc:
                break
        assert term and info["success"] and total == pytest.approx(1.0) and info["outcome"] == "completed"
        cached = list((tmp_path / "scienceworld").glob("gold-*/find-plant-v160.json"))
        assert len(cached) == 1 and json.loads(cached[0].read_text())["actions"]
        # focusing on the wrong thing fails the task: terminated, reward back to 0
        env.reset(options={"task_id": "find-plant-v160"})
        _, r, *_ = env.step("look around")
        obs, r, term, trunc, info = env.step("focus on air")
        assert term and not info["success"] and info["outcome"] == "task_failed" and info["score"] == 0
        env.reset(options={"task_id": "find-plant-v160"})
        assert env.step("jump over the moon")[4]["invalid"]
    finally:
        env.close()


class KillingExpert(ExpertPolicy):
    """The expert; at one episode's turn ``turn`` it first kills that env's Java process."""

    def __init__(self, task_id: str, turn: int, sig: int = signal.SIGKILL):
        self.task_id, self.turn, self.sig = task_id, turn, sig
        self.killed: int | None = None

    def act(self, requests: Sequence[Request]) -> list[Reply]:
        for r in requests:
            env = r.env
            if self.killed is None and getattr(env, "_task_id", None) == self.task_id and r.turn == self.turn:
                self.killed = env.java_pid  # type: ignore[attr-defined]
                assert self.killed is not None
                os.kill(self.killed, self.sig)
        return super().act(requests)


@needs_java
@pytest.mark.slow
def test_killing_java_mid_collection_loses_no_episode(tmp_path: Path) -> None:
    out = tmp_path / "episodes.jsonl"
    opts = {"task_names": QUICK, "gold_cache": False}
    policy = KillingExpert("find-plant-v150", turn=2)
    trajs = run_policy(policy, "scienceworld", split="seen", episodes=6, env_opts=opts, num_envs=2, out=out)
    assert policy.killed is not None
    assert len(trajs) == 6 and len(out.read_text().splitlines()) == 6
    by_task = {t.task_id: t for t in trajs}
    failed = by_task["find-plant-v150"]
    assert not failed.success and failed.truncated and failed.num_turns == 3
    assert failed.meta["outcome"] == "env_error" and "ScienceWorld failed" in failed.meta["final_observation"]
    assert all(t.success for t in trajs if t.task_id != "find-plant-v150")


@needs_java
@pytest.mark.slow
def test_hung_java_times_out_and_restarts() -> None:
    env = ScienceWorld(task_names=QUICK, step_timeout=3, gold_cache=False)
    try:
        env.reset(options={"task_id": "find-living-thing-v150"})
        pid = env.java_pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)  # hangs every call
        obs, r, term, trunc, info = env.step("look around")
        assert trunc and not term and info["outcome"] == "env_error" and "timed out after 3 s" in info["error"]
        with pytest.raises(TurnRLError, match="episode is over"):
            env.step("look around")
        obs, info = env.reset(options={"task_id": "find-living-thing-v150"})  # a fresh process
        assert env.java_pid not in (None, pid) and info["restarts"] == 1 and "This room is called" in obs
        # a process that died between episodes is replaced inside reset, unseen by the caller
        os.kill(env.java_pid or 0, signal.SIGKILL)
        obs, info = env.reset(options={"task_id": "find-plant-v150"})
        assert "This room is called" in obs and info["restarts"] == 2
    finally:
        env.close()
