"""Env failures: the threaded sampler stops where the plain one does, ProcessEnv after a worker
failure, scienceworld's admissible actions at reset (a stand-in package, no Java) and one-line
errors for option values of the wrong type."""

from __future__ import annotations

import os
import random
import sys
import types
from typing import Any

import pytest

from turnrl.envs.alfworld import ALFWorld
from turnrl.envs.base import ExpertStep, TextEnv
from turnrl.envs.scienceworld import ScienceWorld
from turnrl.envs.workers import ProcessEnv, ThreadedSampler
from turnrl.errors import TurnRLError
from turnrl.rollout import ExpertPolicy
from turnrl.rollout.sampler import EpisodeSpec, Sampler

# -- ThreadedSampler: an env that raises -------------------------------------------------


class OneStep(TextEnv):
    """Episodes of one step; task ``bad`` raises in step, ``badreset`` in reset."""

    name = "one_step"
    max_turns = 5

    def __init__(self) -> None:
        self.tid: str | None = None
        self.done = False

    @property
    def instruction(self) -> str:
        return "Say a."

    def task_ids(self, split: str) -> list[str]:
        return ["ok", "bad", "badreset"]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        self.tid, self.done = self.choose_task(seed, options), False
        if self.tid == "badreset":
            raise TurnRLError("one_step: cannot load task badreset")
        return "start", {"task_id": self.tid, "valid_actions": ["a"]}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.running(self.tid, over=self.done)
        if self.tid == "bad":
            raise TurnRLError("one_step: the server went away")
        self.done = True
        return "end", 1.0, True, False, {"task_id": self.tid, "valid_actions": [], "success": True}

    def expert(self, rng: random.Random) -> ExpertStep:
        return ExpertStep("a", "Say a.")


def _specs(*tasks: str) -> list[EpisodeSpec]:
    return [EpisodeSpec(i, "train", t, i + 1) for i, t in enumerate(tasks)]


def _run_until_error(cls: type, specs: list[EpisodeSpec], num_envs: int) -> tuple[list[str], str, list[str]]:
    """(episodes written before the error, the error, the episodes of a later run of good tasks)."""
    written: list[str] = []
    sampler = cls(OneStep, ExpertPolicy(), env_name="one_step", num_envs=num_envs)
    try:
        with pytest.raises(TurnRLError) as e:
            sampler.run(specs, on_episode=lambda t: written.append(t.id))
        after = [t.id for t in sampler.run(_specs("ok", "ok", "ok"))]  # the sampler is still usable
    finally:
        sampler.close()
    return written, str(e.value), after


@pytest.mark.parametrize(("tasks", "num_envs", "written", "error"), [
    (("ok", "bad"), 2, ["one_step-train-000000"], "the server went away"),  # a step raises
    (("ok", "bad", "ok"), 3, ["one_step-train-000000"], "the server went away"),
    (("bad", "ok"), 2, [], "the server went away"),  # the failing slot comes first: nothing written
    (("ok", "badreset"), 1, ["one_step-train-000000"], "cannot load task badreset"),  # the next reset raises
    (("ok", "ok", "badreset", "ok"), 2, ["one_step-train-000000", "one_step-train-000001"],
     "cannot load task badreset"),
    (("badreset", "ok"), 2, [], "cannot load task badreset"),  # a first reset raises
], ids=["step-2envs", "step-3envs", "step-first-slot", "reset-1env", "reset-2envs", "first-reset"])
def test_threaded_sampler_writes_the_episodes_before_an_env_error_as_the_sampler_does(
        tasks: tuple[str, ...], num_envs: int, written: list[str], error: str) -> None:
    specs = _specs(*tasks)
    plain = _run_until_error(Sampler, specs, num_envs)
    threaded = _run_until_error(ThreadedSampler, specs, num_envs)
    assert plain[:2] == (written, f"one_step: {error}")
    assert threaded == plain


# -- ProcessEnv after a worker failure ---------------------------------------------------


class Crashy(TextEnv):
    """Counts to 3; its process dies at step ``crash_at``."""

    name = "crashy"
    max_turns = 5

    def __init__(self, crash_at: int = -1) -> None:
        self.crash_at, self.n, self.tid = crash_at, 0, ""

    @property
    def instruction(self) -> str:
        return "Say +1 three times."

    def task_ids(self, split: str) -> list[str]:
        return [f"{split}-{k}" for k in range(3)]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        self.tid, self.n = self.choose_task(seed, options), 0
        return "at 0", {"task_id": self.tid, "valid_actions": ["+1"]}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.n += 1
        if self.n == self.crash_at:
            os._exit(3)
        done = self.n >= 3
        return f"at {self.n}", float(done), done, False, {"task_id": self.tid, "valid_actions": [] if done else ["+1"]}

    def expert(self, rng: random.Random) -> ExpertStep:
        return ExpertStep("+1", "One more.")


def make_crashy(**opts: Any) -> Crashy:
    return Crashy(**opts)


@pytest.mark.parametrize("factory", [Crashy, make_crashy])
def test_process_env_after_a_worker_failure_names_the_env_and_has_no_expert_move(factory: Any) -> None:
    env = ProcessEnv(factory=factory, env_opts={"crash_at": 1}, timeout=20, start_method="fork")
    try:
        env.reset(options={"task_id": "seen-0"})
        _, _, term, trunc, info = env.step("+1")
        assert trunc and not term and info["outcome"] == "env_error" and "exit code 3" in info["error"]
        with pytest.raises(TurnRLError, match=r"^crashy: the episode is over \(the environment failed\)"):
            env.step("+1")
        with pytest.raises(TurnRLError, match=r"^crashy: no expert move: the episode is not running"):
            env.expert(random.Random(0))
        env.reset(options={"task_id": "seen-1"})  # a fresh worker: a new episode has an expert again
        assert env.expert(random.Random(0)).action == "+1"
    finally:
        env.close()


# -- scienceworld (a stand-in package: only what the adapter calls) ----------------------


def _fake_scienceworld(fail_listing: list[int]) -> types.ModuleType:
    """A ``scienceworld`` module; the first ``fail_listing[0]`` action listings raise."""

    class Server:
        def __init__(self) -> None:
            self.score, self.done = 0.0, False

        def step(self, action: str) -> str:
            if action == "focus on water":
                self.score, self.done = 1.0, True
            return f"You did {action}."

        def getScore(self) -> float:
            return self.score

        def getCompleted(self) -> bool:
            return self.done

        def getTaskDescription(self) -> str:
            return "Your task is to boil water."

        def getValidActionObjectCombinations(self) -> list[str]:
            if fail_listing[0] > 0:
                fail_listing[0] -= 1
                raise RuntimeError("py4j: the gateway went away")
            return ["open door", "look around", "focus on water", "look around"]

    class ScienceWorldEnv:
        def __init__(self, taskName: str = "", envStepLimit: int = 100) -> None:
            self.server, self._gateway = Server(), None

        def load(self, name: str, variation: int, simplification: str = "", generateGoldPath: bool = False
                 ) -> None:
            self.server = Server()

        def close(self) -> None:
            pass

    module = types.ModuleType("scienceworld")
    module.ScienceWorldEnv = ScienceWorldEnv  # type: ignore[attr-defined]
    return module


@pytest.mark.parametrize("failures", [0, 1])  # 1: the listing fails once, and reset retries on a fresh process
def test_scienceworld_admissible_actions_are_in_resets_info(monkeypatch: pytest.MonkeyPatch, failures: int) -> None:
    monkeypatch.setitem(sys.modules, "scienceworld", _fake_scienceworld([failures]))
    monkeypatch.setattr("turnrl.envs.scienceworld.available", lambda: True)  # the stand-in needs no Java
    env = ScienceWorld(task_names="boil", admissible_actions=True, gold_cache=False)
    try:
        obs, info = env.reset(options={"task_id": "boil-v0"})
        assert obs == "You did look around."
        assert info["admissible_actions"] == ["focus on water", "look around", "open door"]
        assert info["restarts"] == failures
        _, _, _, _, info = env.step("look around")
        assert info["admissible_actions"] == ["focus on water", "look around", "open door"]
    finally:
        env.close()
    plain = ScienceWorld(task_names="boil", gold_cache=False)  # off: no listing at all
    try:
        _, info = plain.reset(options={"task_id": "boil-v0"})
        assert "admissible_actions" not in info
    finally:
        plain.close()


# -- option values of the wrong type -------------------------------------------------------


_TASK_NAMES = "scienceworld: task_names must be a comma-separated string or a list of task names"
_DATA_DIR = "alfworld: data_dir must be a directory path"


@pytest.mark.parametrize(("build", "needle"), [
    (lambda: ScienceWorld(task_names=5), f"{_TASK_NAMES} (got 5)"),  # type: ignore[arg-type]
    (lambda: ScienceWorld(task_names=True), f"{_TASK_NAMES} (got True)"),  # type: ignore[arg-type]
    (lambda: ALFWorld(data_dir=5), f"{_DATA_DIR} (got 5)"),  # type: ignore[arg-type]
    (lambda: ALFWorld(data_dir=True), f"{_DATA_DIR} (got True)"),  # type: ignore[arg-type]
], ids=["sw-task_names-int", "sw-task_names-bool", "alf-data_dir-int", "alf-data_dir-bool"])
def test_option_values_of_the_wrong_type_are_one_line_errors_naming_the_option(build: Any, needle: str) -> None:
    with pytest.raises(TurnRLError) as e:
        build()
    assert str(e.value) == needle


def test_a_worker_leaves_ctrl_c_to_its_parent() -> None:
    """Ctrl-C in a terminal reaches the whole process group: each worker printed a KeyboardInterrupt
    traceback and died; the parent, which shuts the workers down, prints one line."""
    import signal
    import time

    env = ProcessEnv("tictactoe", timeout=20, start_method="spawn")
    try:
        env.reset(options={"task_id": "ttt-s0"})
        os.kill(env.worker_pid or 0, signal.SIGINT)
        time.sleep(0.5)
        obs, _, _, _, info = env.step("4")  # the worker is still serving
        assert info.get("outcome") != "env_error" and "Board" in obs
    finally:
        env.close()
