"""``check_env`` passes on every registered env and catches broken ones."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import turnrl.envs
from turnrl.envs.base import ExpertStep, TextEnv
from turnrl.envs.checker import CheckFailed, assert_env, check_env
from turnrl.errors import TurnRLError

#: envs whose check takes seconds (a Java process, gold paths): run with ``-m slow``
SLOW_ENVS = {"scienceworld"}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_ENVS else n for n in turnrl.envs.names()]
)
def test_registered_envs_pass(name: str) -> None:
    assert check_env(name) == []


@pytest.mark.parametrize("name", [n for n in turnrl.envs.names() if n not in SLOW_ENVS])
def test_reset_chooses_the_task_by_task_id_else_by_seed_within_the_split(name: str) -> None:
    env = turnrl.envs.make(name)
    seen = env.task_ids("seen")
    for seed in (0, 3, len(seen) + 2):
        assert env.reset(seed=seed, options={"split": "seen"})[1]["task_id"] == seen[seed % len(seen)]
    assert env.reset(seed=5)[1]["task_id"] == env.task_ids("train")[5 % len(env.task_ids("train"))]
    assert env.reset(seed=1, options={"task_id": seen[-1]})[1]["task_id"] == seen[-1]
    assert all(env.reset(options={"split": "seen"})[1]["task_id"] in seen for _ in range(5))
    with pytest.raises(TurnRLError, match=rf"^{name}: unknown reset option 'spilt'; choose from: split, task_id$"):
        env.reset(seed=0, options={"spilt": "seen"})
    for bad in (["task_id"], ("split",), "train"):  # options that are no mapping
        with pytest.raises(TurnRLError, match=rf"^{name}: reset options must be a dict"):
            env.reset(seed=0, options=bad)  # type: ignore[arg-type]
    # a seed that is no integer, a task id that is no string, a split that does not exist: one line each
    assert env.reset(seed=np.int64(3), options={"split": "seen"})[1]["task_id"] == seen[3 % len(seen)]
    for bad in ("3", 2.5, True):
        with pytest.raises(TurnRLError, match=rf"^{name}: reset seed must be an integer"):
            env.reset(seed=bad)  # type: ignore[arg-type]
    with pytest.raises(TurnRLError, match="task_id must be a string"):
        env.reset(options={"task_id": [seen[0]]})
    with pytest.raises(TurnRLError, match="unknown split 'nope'"):
        env.reset(options={"task_id": seen[0], "split": "nope"})


@pytest.mark.parametrize("name", [n for n in turnrl.envs.names() if n not in SLOW_ENVS])
def test_step_refuses_before_the_first_reset_and_after_the_episode_ends(name: str) -> None:
    env = turnrl.envs.make(name)
    with pytest.raises(TurnRLError, match=rf"^{name}: call reset\(\) before step\(\)$"):
        env.step("x")
    env.reset(seed=0)
    rng, done, turns = random.Random(0), False, 0
    while not done:
        _, _, terminated, truncated, _ = env.step(env.expert(rng).action)
        done, turns = terminated or truncated, turns + 1
        assert turns <= env.max_turns
    with pytest.raises(TurnRLError, match=rf"^{name}: the episode is over; call reset\(\) to start a new one$"):
        env.step("x")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"opponent": "minimax", "agent_first": False},
        {"opponent": "noisy", "noise": 1.0, "show_legal_moves": False},
    ],
)
def test_tictactoe_variants_pass(kwargs: dict) -> None:
    assert check_env("tictactoe", episodes=5, seed=11, **kwargs) == []


class Counter(TextEnv):
    """A well-behaved toy: count up to ``target`` with actions "+1"; broken by flags."""

    name = "counter"
    max_turns = 10

    def __init__(self, **flags: bool) -> None:
        self.flags = flags
        self.n = 0
        self.target = 3
        self.task = "c3"
        self.calls = self.turns = 0

    @property
    def instruction(self) -> str:
        return "" if self.flags.get("no_instruction") else "Count to the target. Action: +1"

    def task_ids(self, split: str) -> list[str]:
        if self.flags.get("overlap"):
            return ["c3", "c4"]
        if self.flags.get("seen_unseen_overlap"):
            return {"train": ["c3", "c4"], "seen": ["c5", "c9"], "unseen": ["c9"]}[split]
        return {"train": ["c3", "c4"], "seen": ["c5"], "unseen": ["c9"]}[split]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        self.calls += 1
        self.n = self.turns = 0
        self.task = (options or {}).get("task_id", f"c{3 + (seed or 0) % 2}")
        self.target = int(self.task[1:])
        if self.flags.get("nondeterministic"):
            self.target += self.calls
        return f"at {self.n}, target {self.target}", {"task_id": self.task, "valid_actions": ["+1", "+0"]}

    def step(self, action: str) -> Any:
        if self.flags.get("raises"):
            raise ValueError("boom")
        self.turns += 1
        if action == "+1":
            self.n += 1
        if self.flags.get("never_ends"):
            self.n = 0
        done = self.n >= self.target
        truncated = not done and self.turns >= self.max_turns and not self.flags.get("never_ends")
        info: dict[str, Any] = {"task_id": self.task, "valid_actions": [] if done else ["+1", "+0"]}
        if (done or truncated) and not self.flags.get("no_success"):
            info["success"] = done
        if self.flags.get("four_tuple"):
            return f"at {self.n}", 1.0 if done else 0.0, done, info
        if self.flags.get("bad_types"):
            return f"at {self.n}", "1", int(done), False, info
        return f"at {self.n}", 1.0 if done else 0.0, done, truncated, info

    def expert(self, rng: random.Random) -> ExpertStep:
        if self.flags.get("bad_expert"):
            return ExpertStep(action="jump", thought="")
        return ExpertStep(action="+1", thought="One more.")


def test_random_episodes_are_checked_where_states_list_no_actions() -> None:
    """The shop's search page lists no actions; the random episode plays the expert's search there and
    random clicks after, so an env whose random play never ends is caught (it used to stop before
    its first step and pass)."""
    from turnrl.envs.shop import Shop

    class NeverEndingShop(Shop):  # any move but the expert's lifts the step limit
        def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
            if action != self.expert(random.Random(0)).action:
                self.max_turns = 10**9
            return super().step(action)

    assert check_env(Shop(), episodes=2) == []
    problems = check_env(NeverEndingShop(), episodes=2)
    assert any("random episode" in p and "did not end within max_turns" in p for p in problems), problems


def test_toy_env_passes() -> None:
    assert check_env(Counter()) == []
    assert_env(Counter())


@pytest.mark.parametrize(
    ("flag", "needle"),
    [
        ("no_instruction", "instruction must be a non-empty str"),
        ("overlap", "train and seen share"),
        ("seen_unseen_overlap", "seen and unseen share 1 task id(s), e.g. 'c9'"),
        ("nondeterministic", "not deterministic"),
        ("raises", "step raised ValueError: boom"),
        ("never_ends", "did not end within max_turns"),
        ("no_success", "neither 'won' nor 'success'"),
        ("four_tuple", "step must return (obs, reward, terminated, truncated, info)"),
        ("bad_types", "reward must be a number"),
        ("bad_expert", "not among valid_actions"),
    ],
)
def test_broken_envs_are_reported(flag: str, needle: str) -> None:
    problems = check_env(Counter(**{flag: True}))
    assert any(needle in p for p in problems), problems
    assert all("\n" not in p for p in problems)
    with pytest.raises(CheckFailed) as e:
        assert_env(Counter(**{flag: True}))
    assert e.value.problems == problems and "\n" not in str(e.value)


def test_a_max_turns_that_raises_is_a_problem_not_a_crash() -> None:
    class Broken(Counter):
        @property  # type: ignore[override]
        def max_turns(self) -> int:
            raise RuntimeError("no limit known")

    problems = check_env(Broken())
    assert any(p.endswith("max_turns raised RuntimeError: no limit known") for p in problems), problems


def test_bad_types_are_all_named() -> None:
    problems = check_env(Counter(bad_types=True))
    assert any("terminated must be a bool" in p for p in problems)


def test_by_name_errors() -> None:
    assert check_env("no-such-env") == [
        "make raised TurnRLError: unknown env 'no-such-env'; choose from: "
        + ", ".join(sorted({*turnrl.envs.names(), *turnrl.envs.OPTIONAL}))  # with the envs not installed here
    ]
    with pytest.raises(TurnRLError, match="by name"):
        check_env(Counter(), opponent="random")


def test_a_built_in_env_whose_packages_are_missing_names_what_to_install(monkeypatch) -> None:
    """Such an env was 'unknown' (with no word of the extra), and its class built directly failed in
    ``reset`` with an ImportError traceback."""
    import turnrl.envs.alfworld
    import turnrl.envs.household
    from turnrl.envs import _REGISTRY, env_defaults, make
    from turnrl.envs.household import Household
    from turnrl.errors import TurnRLError

    turnrl.envs.names()  # the built-ins registered
    for name in ("household", "alfworld", "webshop"):
        monkeypatch.delitem(_REGISTRY, name, raising=False)
    with pytest.raises(TurnRLError, match=r"env 'webshop' is not available here: set TURNRL_WEBSHOP_URL"):
        make("webshop")  # its module has no available(): it registers when a server is named
    monkeypatch.setattr(turnrl.envs.household, "available", lambda: False)
    hint = r"env 'household' is not available here: pip install 'turnrl\[textworld\]'"
    for build in (lambda: make("household"), lambda: env_defaults("household"), lambda: Household().reset(seed=0)):
        with pytest.raises(TurnRLError, match=hint):
            build()
    # with TextWorld but without $ALFWORLD_DATA, alfworld is not registered; given data_dir, it builds
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    monkeypatch.setattr(turnrl.envs.alfworld, "available", lambda: True)
    data = Path(__file__).parent / "fixtures" / "alfworld"
    assert type(make("alfworld", data_dir=str(data))).__name__ == "ALFWorld"
    with pytest.raises(TurnRLError, match="alfworld: give data_dir"):
        make("alfworld")
    # an optional env that is registered (scienceworld where Java is installed) is named once
    monkeypatch.setitem(_REGISTRY, "household", Household)
    with pytest.raises(TurnRLError) as e:
        make("no-such-env")
    assert str(e.value).count("household") == 1
