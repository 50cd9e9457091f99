"""The ALFWorld adapter on a tiny ALFWorld-format data set (tests/fixtures/alfworld)."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

import turnrl.envs
from turnrl.envs.alfworld import ALFWorld, _thought, demangle, maybe_register
from turnrl.envs.checker import check_env
from turnrl.errors import TurnRLError

DATA = Path(__file__).parent / "fixtures" / "alfworld"
playable = pytest.mark.skipif(
    importlib.util.find_spec("textworld") is None or importlib.util.find_spec("fast_downward") is None,
    reason="needs textworld with its PDDL backend (fast_downward)",
)


def test_demangle_and_thoughts() -> None:
    # as ALFWorld's Demangler: the first id in sorted order takes the kind's highest number
    ids = ["Mug_bar__plus_01_dot_2", "Mug_bar__minus_00_dot_3", "CounterTop_bar__plus_00", "agent1",
           "Sink_bar__plus_00_dot_1", "Sink_bar__plus_00_dot_1_bar_basin"]
    assert demangle(ids) == {"Mug_bar__minus_00_dot_3": "mug 2", "Mug_bar__plus_01_dot_2": "mug 1",
                             "CounterTop_bar__plus_00": "countertop 1", "agent1": "agent1",
                             "Sink_bar__plus_00_dot_1": "sink 1", "Sink_bar__plus_00_dot_1_bar_basin": "sinkbasin 1"}
    assert _thought("take mug 1 from desk 1") == "I take the mug 1 from the desk 1."
    assert _thought("put mug 1 in/on cabinet 2") == "I put the mug 1 in the cabinet 2."


def test_data_dir_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    with pytest.raises(TurnRLError, match="give data_dir"):
        ALFWorld()
    with pytest.raises(TurnRLError, match="no ALFWorld games"):
        ALFWorld(data_dir=str(tmp_path))
    env = ALFWorld(data_dir=str(DATA))  # the directory holding json_2.1.1
    assert [len(env.task_ids(s)) for s in ("train", "seen", "unseen")] == [1, 1, 1]
    assert env.task_ids("seen")[0].startswith("valid_seen/pick_and_place_simple-Mug")
    with pytest.raises(TurnRLError, match="unknown task id 'valid_seen/nothing'"):
        env.reset(options={"task_id": "valid_seen/nothing"})


@playable
@pytest.mark.slow
def test_fixture_games_play_and_the_planner_expert_wins() -> None:
    env = ALFWorld(data_dir=str(DATA / "json_2.1.1"))
    try:
        assert check_env(env, episodes=1) == []
        for split in ("train", "seen", "unseen"):
            obs, info = env.reset(options={"task_id": env.task_ids(split)[0]})
            assert "Your task is to: put some" in obs and "Your task is to: put some" in env.instruction
            assert all("_bar_" not in a for a in info["valid_actions"])
            rng, total = random.Random(0), 0.0
            for _ in range(env.max_turns):
                _, reward, term, trunc, info = env.step(env.expert(rng).action)
                total += reward
                if term or trunc:
                    break
            assert term and info["success"] and total == 1.0
        # the planner re-plans from wherever the agent is
        env.reset(options={"task_id": env.task_ids("train")[0]})
        env.step("go to fridge 1")
        assert env.expert(random.Random(0)).action == "go to countertop 1"
        _, _, _, _, info = env.step("fly away")
        assert info["invalid"]
    finally:
        env.close()


def test_registered_only_with_alfworld_data(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    assert maybe_register() is False
    if importlib.util.find_spec("textworld") is None:
        return
    monkeypatch.setenv("ALFWORLD_DATA", str(DATA))
    try:
        assert maybe_register() is True
        assert isinstance(turnrl.envs.make("alfworld"), ALFWorld)
    finally:
        turnrl.envs._REGISTRY.pop("alfworld", None)


def test_only_admissible_commands_reach_the_game() -> None:
    """As in household: other text ("quit", "restart", two commands in one) leaves the game as it
    was, answered "Nothing happens." and flagged invalid (checked on a stand-in engine: CI has no
    TextWorld)."""
    from types import SimpleNamespace

    stepped: list[str] = []
    state = SimpleNamespace(admissible_commands=["go to desk 1", "look"], feedback="You arrive.", won=False)

    class Engine:
        def step(self, cmd: str):
            stepped.append(cmd)
            return SimpleNamespace(admissible_commands=["look"], feedback=f"did {cmd}", won=False), 0, False

    env = ALFWorld.__new__(ALFWorld)
    env._env, env._state, env._done, env._turns, env.max_turns, env._task_id = Engine(), state, False, 0, 50, "t"
    for text in ("quit", "go to desk 1. look", "restart"):
        obs, reward, term, trunc, info = env.step(text)
        assert (obs, reward, term, trunc, info["invalid"]) == ("Nothing happens.", 0.0, False, False, True)
    assert stepped == [] and env._state is state
    obs, _, _, _, info = env.step("go  to desk 1")
    assert obs == "did go to desk 1" and not info["invalid"] and stepped == ["go to desk 1"]
