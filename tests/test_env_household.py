"""household: generated layouts, vocabulary splits and walkthroughs (no TextWorld needed);
compiled games, the checker and the walkthrough expert (slow; needs textworld)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from turnrl.envs.checker import check_env
from turnrl.envs.household import (
    CAN,
    CONTAINERS,
    OBJECTS,
    ROOMS,
    SUPPORTERS,
    Household,
    _layout,
    _walkthrough,
    available,
    parse_task,
)
from turnrl.errors import TurnRLError

needs_textworld = pytest.mark.skipif(not available(), reason="needs the textworld package")


def test_task_ids_splits_and_errors() -> None:
    env = Household(num_tasks=20)
    assert env.task_ids("train")[:2] == ["hh-train-0", "hh-train-1"] and len(env.task_ids("unseen")) == 4
    assert parse_task("hh-seen-3") == ("seen", 3)
    for bad in ("hh-test-1", "household-1", 3, "hh-seen-03"):
        with pytest.raises(TurnRLError, match="unknown task id") as e:
            parse_task(bad)
        assert "\n" not in str(e.value)
    with pytest.raises(TurnRLError, match="num_tasks must be an integer"):
        Household(num_tasks=2)


def test_unseen_games_use_only_held_out_vocabulary() -> None:
    for vocab in (ROOMS, CONTAINERS, SUPPORTERS, OBJECTS):
        assert not set(vocab[0]) & set(vocab[1])
    for split, v in (("train", 0), ("seen", 0), ("unseen", 1)):
        for k in range(30):
            lay = _layout(split, k)
            assert set(lay.rooms) <= set(ROOMS[v]) and set(lay.objects) <= set(OBJECTS[v])
            assert set(lay.receptacles) <= set(CONTAINERS[v]) | set(SUPPORTERS[v])
            assert lay.kind == "put" or lay.obj in CAN[lay.kind]
            assert lay.target != lay.objects[lay.obj]
    assert _layout("train", 5) == _layout("train", 5)
    kinds = {_layout("train", k).kind for k in range(40)}
    assert kinds == {"put", "clean", "heat", "cool"}


def test_walkthrough_visits_the_appliance_then_the_target() -> None:
    lay = next(_layout("train", k) for k in range(50) if _layout("train", k).kind == "heat")
    cmds, thoughts = _walkthrough(lay, lay.rooms[0])
    assert len(cmds) == len(thoughts) and all(thoughts)
    take = cmds.index(f"take {lay.obj} from {lay.objects[lay.obj]}")
    heat = cmds.index(f"heat {lay.obj} with microwave")
    assert take < heat < len(cmds) - 1 and cmds[-1].endswith(lay.target)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with pytest.MonkeyPatch.context() as mp:
        path = tmp_path_factory.mktemp("turnrl_home")
        mp.setenv("TURNRL_HOME", str(path))
        yield path


@needs_textworld
@pytest.mark.slow
def test_games_compile_cache_and_the_walkthrough_wins(home: Path) -> None:
    env = Household(num_tasks=5)
    try:
        assert check_env(env, episodes=2) == []
        for tid in ("hh-train-2", "hh-seen-0", "hh-unseen-0"):
            obs, info = env.reset(options={"task_id": tid})
            assert obs.startswith("You are in the ") and info["valid_actions"]
            assert "Your task is to: " in env.instruction
            rng, total = random.Random(0), 0.0
            for _ in range(env.max_turns):
                step = env.expert(rng)
                assert step.action in info["valid_actions"]
                _, reward, term, trunc, info = env.step(step.action)
                total += reward
                if term or trunc:
                    break
            assert term and total == 1.0 and info["success"]
            assert (home / "household" / "v1" / tid / "game.z8").is_file()
        # skipping the clean / heat / cool step does not win
        env.reset(options={"task_id": "hh-train-2"})
        spec = env._spec
        assert spec is not None
        for cmd in spec.walkthrough:
            if cmd.split()[0] in ("clean", "heat", "cool"):
                continue
            _, reward, term, _, info = env.step(cmd)
        assert spec.kind == "clean" and reward == 0.0 and not term
        obs, *_ = env.step("dance")
    finally:
        env.close()


@needs_textworld
@pytest.mark.slow
def test_text_that_is_no_listed_command_leaves_the_game_as_it_was(home: Path) -> None:
    """Only admissible commands reach the interpreter: a chain of the walkthrough's commands in one
    action used to win the game in one turn, ``quit`` froze it, and a NUL byte hung it."""
    env = Household(num_tasks=5)
    try:
        obs0, info = env.reset(options={"task_id": "hh-train-2"})
        spec = env._spec
        assert spec is not None
        for bad in (". ".join(spec.walkthrough), "quit", "restart", "look\x00", "east"):
            obs, reward, term, trunc, info = env.step(bad)
            assert (obs, reward, term, trunc, info["invalid"]) == ("Nothing happens.", 0.0, False, False, True), bad
        total, term = 0.0, False
        for cmd in spec.walkthrough:  # the game was not touched: the walkthrough still wins
            _, reward, term, _, info = env.step(cmd)
            assert not info["invalid"]
            total += reward
        assert term and total == 1.0 and info["success"]
    finally:
        env.close()


@needs_textworld
@pytest.mark.slow
def test_the_expert_goes_on_with_its_plan_after_an_invalid_command(home: Path) -> None:
    """The walkthrough is played by position among valid commands: an invalid one (which leaves the
    game as it was) used to make the expert skip a command of the plan and never win."""
    env = Household(num_tasks=5)
    try:
        env.reset(options={"task_id": "hh-train-2"})
        rng, total, term = random.Random(0), 0.0, False
        env.step("dance")
        for _ in range(20):
            _, reward, term, trunc, info = env.step(env.expert(rng).action)
            total += reward
            if term or trunc:
                break
        assert term and total == 1.0 and info["success"]
    finally:
        env.close()
