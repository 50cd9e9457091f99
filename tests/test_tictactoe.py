"""Tic-tac-toe: rules against an independent reference, the minimax expert, splits, errors."""

from __future__ import annotations

import random

import pytest

from turnrl.envs import make
from turnrl.envs.tictactoe import (
    TicTacToe,
    best_moves,
    legal_moves,
    minimax_value,
    winner,
)
from turnrl.errors import TurnRLError

# ---------------------------------------------------------------------------------------
# An independent reference: a 2D grid, lines enumerated explicitly, moves found by scanning.

Grid = list[list[str]]


def ref_grid(flat: list[str]) -> Grid:
    return [[flat[3 * r + c] for c in range(3)] for r in range(3)]


def ref_winner(g: Grid) -> str | None:
    lines = []
    for i in range(3):
        lines.append([g[i][0], g[i][1], g[i][2]])  # row i
        lines.append([g[0][i], g[1][i], g[2][i]])  # column i
    lines.append([g[0][0], g[1][1], g[2][2]])
    lines.append([g[0][2], g[1][1], g[2][0]])
    for line in lines:
        if line[0] in ("X", "O") and line.count(line[0]) == 3:
            return line[0]
    return None


def ref_empty(g: Grid) -> list[int]:
    out = []
    for r in range(3):
        for c in range(3):
            if g[r][c] == ".":
                out.append(r * 3 + c)
    return out


def ref_over(g: Grid) -> bool:
    return ref_winner(g) is not None or not ref_empty(g)


def ref_next(g: Grid) -> str:
    xs = sum(row.count("X") for row in g)
    os_ = sum(row.count("O") for row in g)
    return "X" if xs == os_ else "O"


_REF_VALUES: dict[str, int] = {}


def ref_brute_value(g: Grid) -> int:
    """Plain negamax without depth: +1 win, 0 draw, -1 loss for the player to move."""
    key = "".join("".join(row) for row in g)
    if key in _REF_VALUES:
        return _REF_VALUES[key]
    w = ref_winner(g)
    if w is not None:
        return 1 if w == ref_next(g) else -1
    moves = ref_empty(g)
    if not moves:
        return 0
    me = ref_next(g)
    best = -2
    for m in moves:
        g[m // 3][m % 3] = me
        best = max(best, -ref_brute_value(g))
        g[m // 3][m % 3] = "."
    _REF_VALUES[key] = best
    return best


# ---------------------------------------------------------------------------------------
# (a) the env agrees with the reference on random games


def _play_against_reference(env: TicTacToe, rng: random.Random, options: dict, seed: int) -> None:
    obs, info = env.reset(seed=seed, options=options)
    me, opp = ("X", "O") if env.agent_first else ("O", "X")
    assert info["agent_mark"] == me
    g = ref_grid(info["board"])
    placed = 9 - len(ref_empty(g))
    opening = 0 if info["task_id"].startswith("ttt-s") else 2
    assert placed == opening + (0 if env.agent_first else 1)
    assert not ref_over(g)
    assert ref_next(g) == me, "the agent is to move after reset"
    assert f"You play {me}." in obs
    total_steps = 0
    while True:
        legal = ref_empty(g)
        assert info["valid_actions"] == [str(m) for m in legal]
        assert env.valid_actions() == [str(m) for m in legal]
        move = rng.choice(legal)
        before = [row[:] for row in g]
        g[move // 3][move % 3] = me
        obs, reward, terminated, truncated, info = env.step(str(move))
        total_steps += 1
        assert not truncated and info["invalid"] is False
        board = info["board"]
        if not ref_over(g):  # the opponent must have placed exactly one mark on an empty cell
            changed = [i for i in range(9) if board[i] != g[i // 3][i % 3]]
            assert len(changed) == 1
            cell = changed[0]
            assert before[cell // 3][cell % 3] == "." and g[cell // 3][cell % 3] == "."
            assert board[cell] == opp and ref_next(g) == opp
            assert info["opponent_move"] == str(cell)
            assert obs.startswith(f"Opponent played {cell}.\n")
            g[cell // 3][cell % 3] = opp
        assert board == [g[r][c] for r in range(3) for c in range(3)]
        if ref_over(g):
            w = ref_winner(g)
            expected = 0.0 if w is None else (1.0 if w == me else -1.0)
            assert terminated and reward == expected
            assert info["outcome"] == {1.0: "win", 0.0: "draw", -1.0: "loss"}[expected]
            assert info["won"] is info["success"] is (w == me)
            assert info["valid_actions"] == [] and env.valid_actions() == []
            assert "Game over:" in obs
            assert winner(board) == w
            return
        assert not terminated and reward == 0.0
        assert total_steps <= 5


@pytest.mark.parametrize("agent_first", [True, False])
@pytest.mark.parametrize("opponent", ["random", "minimax", "noisy"])
def test_rules_match_reference(agent_first: bool, opponent: str) -> None:
    env = TicTacToe(opponent=opponent, agent_first=agent_first, noise=0.5)
    rng = random.Random(f"{agent_first}-{opponent}")
    splits = ["train", "seen", "unseen"]
    for i in range(520):  # 6 configurations x 520 = 3120 games
        _play_against_reference(env, rng, {"split": splits[i % 3]}, seed=rng.randrange(10**6))


def test_pure_logic_matches_reference_on_all_reachable_boards() -> None:
    seen: set[str] = set()
    stack = ["." * 9]
    while stack:
        b = stack.pop()
        if b in seen:
            continue
        seen.add(b)
        g = ref_grid(list(b))
        assert winner(b) == ref_winner(g)
        assert legal_moves(b) == ([] if ref_winner(g) else ref_empty(g))
        if not ref_over(g):
            value = minimax_value(b)
            assert (value > 0) - (value < 0) == ref_brute_value(g)
            for m in ref_empty(g):
                stack.append(b[:m] + ref_next(g) + b[m + 1 :])
    assert len(seen) == 5478  # the number of reachable tic-tac-toe positions


def test_minimax_prefers_the_fastest_win() -> None:
    # X to move can win at 2 now (row 0) or set up other wins later.
    board = "XX.OO...."
    assert best_moves(board) == [2]
    # O to move must block at 2 (X threatens row 0) and cannot win at once.
    assert best_moves("XX.O.....") == [2]


# ---------------------------------------------------------------------------------------
# (b) the expert never loses; (c) its thoughts mention its cell


def _expert_game(env: TicTacToe, seed: int, rng: random.Random) -> tuple[float, list[str]]:
    obs, info = env.reset(seed=seed)
    thoughts = []
    while True:
        step = env.expert(rng)
        assert step.action in info["valid_actions"]
        assert step.action in step.thought
        thoughts.append(step.thought)
        obs, reward, terminated, truncated, info = env.step(step.action)
        if terminated or truncated:
            assert terminated and info["invalid"] is False
            return reward, thoughts


@pytest.mark.parametrize("agent_first", [True, False])
def test_expert_never_loses(agent_first: bool) -> None:
    rng = random.Random(1)
    vs_random = [
        _expert_game(TicTacToe(opponent="random", agent_first=agent_first), s, rng)[0] for s in range(300)
    ]
    assert min(vs_random) >= 0.0 and sum(vs_random) > 150  # wins most games against random
    vs_minimax = [
        _expert_game(TicTacToe(opponent="minimax", agent_first=agent_first), s, rng)[0] for s in range(150)
    ]
    assert vs_minimax == [0.0] * 150
    vs_noisy = [
        _expert_game(TicTacToe(opponent="noisy", agent_first=agent_first), s, rng)[0] for s in range(150)
    ]
    assert min(vs_noisy) >= 0.0


def test_expert_thoughts() -> None:
    env = TicTacToe(opponent="random")
    all_thoughts: list[str] = []
    rng = random.Random(0)
    for s in range(100):
        all_thoughts += _expert_game(env, s, rng)[1]
    text = "\n".join(all_thoughts)
    assert "I can win immediately: I take" in text
    assert "I must block the opponent's line: I take" in text
    # a position with an immediate win: the expert takes it and says so
    env.reset(options={"task_id": "ttt-o0314-s0"})  # X: 0, 1; O: 3, 4; X to move
    step = env.expert(random.Random(0))
    assert step == step.__class__(action="2", thought="I can win immediately: I take 2.")


def test_expert_is_deterministic_given_rng() -> None:
    env = TicTacToe(opponent="noisy")
    a = [_expert_game(env, 5, random.Random(3)) for _ in range(2)]
    assert a[0] == a[1]


# ---------------------------------------------------------------------------------------
# (d) splits and determinism


def test_splits_are_disjoint_and_fixed() -> None:
    env = TicTacToe()
    train, seen, unseen = (env.task_ids(s) for s in ("train", "seen", "unseen"))
    assert (len(train), len(seen), len(unseen)) == (1000, 200, 200)
    for ids in (train, seen, unseen):
        assert len(set(ids)) == len(ids)
    assert not set(train) & set(seen) and not set(train) & set(unseen) and not set(seen) & set(unseen)
    assert train[:2] == ["ttt-s0", "ttt-s1"] and seen[0] == "ttt-s100000"
    assert TicTacToe().task_ids("unseen") == unseen
    # unseen openings: one X and one O, never the empty start of training
    for tid in unseen:
        _, info = env.reset(options={"task_id": tid})
        assert info["board"].count("X") == 1 and info["board"].count("O") == 1
    assert len({tid.split("-s")[0] for tid in unseen}) == 72
    # the openings' order, as every documented unseen number was measured on
    openings = [(x, o) for x in range(9) for o in range(9) if x != o]
    random.Random(7919).shuffle(openings)
    assert unseen == [f"ttt-o{x}{o}-s{200000 + i}" for i, (x, o) in enumerate(openings * 3) if i < 200]


def test_unseen_openings_leave_the_agent_to_move_on_either_side() -> None:
    """With ``agent_first=False`` the unseen split was the same one-X-one-O openings, so the opponent (X)
    moved first from them, from 48 of 72 won for X: a minimax expert lost 134 of 200 to minimax. The
    agent playing O now gets openings of two X and one O, and moves first from each."""
    second = TicTacToe(agent_first=False, opponent="minimax")
    ids = second.task_ids("unseen")
    assert len(ids) == len(set(ids)) == 200 and not set(ids) & set(TicTacToe().task_ids("unseen"))
    outcomes = []
    for tid in ids:
        _, info = second.reset(options={"task_id": tid})
        assert (info["board"].count("X"), info["board"].count("O")) == (2, 1)  # the opponent has not moved
        value, rng = minimax_value(info["board"]), random.Random(tid)
        while True:  # perfect play on both sides ends as the opening's value says
            _, reward, terminated, truncated, info = second.step(second.expert(rng).action)
            if terminated or truncated:
                break
        assert reward == (value > 0) - (value < 0), tid
        outcomes.append(reward)
    assert {-1.0, 0.0, 1.0} <= set(outcomes) and outcomes.count(0.0) > len(outcomes) / 3


def test_reset_is_deterministic() -> None:
    for kwargs in ({"opponent": "noisy"}, {"opponent": "random", "agent_first": False}):
        a, b = TicTacToe(**kwargs), TicTacToe(**kwargs)
        for seed in range(20):
            for options in (None, {"split": "unseen"}, {"task_id": "ttt-o40-s3"}):
                assert a.reset(seed=seed, options=options) == b.reset(seed=seed, options=options)
                for action in ("0", "8", "1", "7", "2", "6", "3", "5", "4"):
                    if action in a.valid_actions():
                        assert a.step(action) == b.step(action)
    env = TicTacToe()
    assert env.reset(seed=7, options={"split": "seen"})[1]["task_id"] == env.task_ids("seen")[7]
    assert env.reset(seed=1007)[1]["task_id"] == "ttt-s7"


def test_observation_format() -> None:
    env = TicTacToe(show_legal_moves=True)
    obs, _ = env.reset(options={"task_id": "ttt-o40-s0"})
    assert obs == "Board:\nO 1 2\n3 X 5\n6 7 8\nYou play X. Legal moves: 1, 2, 3, 5, 6, 7, 8"
    env = TicTacToe(show_legal_moves=False)
    obs, _ = env.reset(options={"task_id": "ttt-o40-s0"})
    assert obs == "Board:\nO 1 2\n3 X 5\n6 7 8\nYou play X."
    instruction = env.instruction
    assert instruction.endswith("Thought: <one short sentence>\nAction: <cell number>")
    assert "0 1 2\n3 4 5\n6 7 8" in instruction


# ---------------------------------------------------------------------------------------
# (e) errors; (f) invalid actions


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"opponent": "minmax"}, "'minmax'"),
        ({"noise": 2}, "noise"),
        ({"noise": -0.1}, "-0.1"),
        ({"agent_first": "yes"}, "agent_first"),
        ({"show_legal_moves": 1}, "show_legal_moves"),
    ],
)
def test_bad_kwargs(kwargs: dict, needle: str) -> None:
    with pytest.raises(TurnRLError) as e:
        make("tictactoe", **kwargs)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_bad_kwarg_messages() -> None:
    with pytest.raises(TurnRLError, match=r"opponent must be one of random, minimax, noisy \(got 'minmax'\)"):
        make("tictactoe", opponent="minmax")
    with pytest.raises(TurnRLError, match=r"noise must be a number in \[0, 1\] \(got 2\)"):
        make("tictactoe", noise=2)
    with pytest.raises(TurnRLError, match="colour"):
        make("tictactoe", colour="red")


@pytest.mark.parametrize("task_id", ["ttt-x5", "ttt-o44-s1", "ttt-o9-s1", "nope", "ttt-o03142-s1"])
def test_unknown_task_id(task_id: str) -> None:
    with pytest.raises(TurnRLError) as e:
        TicTacToe().reset(options={"task_id": task_id})
    assert task_id in str(e.value) and "\n" not in str(e.value)


def test_unknown_split_and_option() -> None:
    with pytest.raises(TurnRLError, match="'test'"):
        TicTacToe().task_ids("test")
    with pytest.raises(TurnRLError, match="'tsk'"):
        TicTacToe().reset(seed=0, options={"tsk": "ttt-s1"})


def test_invalid_actions_are_reported() -> None:
    env = TicTacToe(opponent="random")
    obs0, info0 = env.reset(options={"task_id": "ttt-o40-s0"})
    for bad in ("4", "0", "9", "-1", "x", "", "4 5"):
        obs, reward, terminated, truncated, info = env.step(bad)
        assert obs.startswith("Invalid move") and obs.endswith(obs0)
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert info["invalid"] is True and info["board"] == info0["board"]
        assert info["valid_actions"] == info0["valid_actions"]
    obs, reward, terminated, truncated, info = env.step("  8\n")  # whitespace is fine
    assert info["invalid"] is False and info["board"][8] == "X"


def test_repeated_invalid_actions_truncate() -> None:
    env = TicTacToe()
    env.reset(seed=0)
    results = [env.step("9") for _ in range(env.max_turns)]
    assert [r[3] for r in results] == [False] * 8 + [True]
    assert results[-1][4]["success"] is False and results[-1][4]["valid_actions"] == []
    with pytest.raises(TurnRLError, match="reset"):
        env.step("0")


@pytest.mark.parametrize(("agent_first", "task_id"), [(True, "ttt-o03148-s1"), (False, "ttt-o0314-s1")])
def test_an_opening_the_opponent_could_end_before_the_agent_moves_is_refused(agent_first: bool, task_id: str) -> None:
    """The opponent's first move, played in reset, could end the game, and the agent then played on a
    finished board (both sides with three in a row; the expert crashed on no legal move)."""
    env = make("tictactoe", agent_first=agent_first)
    with pytest.raises(TurnRLError, match=rf"task id '{task_id}': the opponent moves first and could end the game"):
        env.reset(options={"task_id": task_id})
    for split in ("train", "seen", "unseen"):  # no task of the splits is such an opening
        for t in env.task_ids(split)[:: 7]:
            env.reset(options={"task_id": t})


def test_a_long_digit_string_is_an_invalid_move() -> None:
    """``int()`` refuses more than 4300 digits: a 5000-digit reply raised ValueError out of ``step``
    (the env promises an invalid move, not an exception). Leading zeros still name a cell."""
    env = make("tictactoe", opponent="random")
    env.reset(options={"task_id": env.task_ids("train")[0]})
    obs, reward, _, _, info = env.step("1" * 5000)
    assert obs.startswith("Invalid move") and info["invalid"] and reward == 0.0
    assert not env.step("004")[4]["invalid"]
