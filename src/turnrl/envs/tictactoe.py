"""Tic-tac-toe against a scripted opponent (DESIGN 4; the RLFT paper's game, seed 004).

Rules. A 3x3 board, cells numbered 0..8 row by row::

    0 1 2
    3 4 5
    6 7 8

X always moves first. The agent plays X when ``agent_first`` (the default), else O; when
the opponent is to move at the start of an episode, its move is applied inside ``reset``.
An action is a cell number as a string (``"4"``, surrounding whitespace allowed).
The step that ends the game gives +1 (agent won), 0 (draw) or -1 (agent lost; the
opponent's winning reply counts on the agent's step); every other step gives 0.

An invalid action (not a number 0-8, or an occupied cell) raises nothing: the env returns
the same board with an ``Invalid move ...`` line first, reward 0, ``info["invalid"] =
True``; what to do about it is the agent layer's decision. Agent turns are counted,
invalid ones included, and the episode is truncated after ``max_turns`` (9) turns without
an end, which only repeated invalid actions can cause.

Opponents: ``random`` (a uniformly random legal move), ``minimax`` (perfect play, ties
broken at random) and ``noisy`` (minimax, but a random move with probability ``noise``).
Their randomness comes from a ``random.Random`` seeded by the task, so a task id fixes the
whole episode given the agent's actions.

Tasks. A task id encodes the opening (marks already on the board) and the opponent's seed:

- ``ttt-s{seed}``: empty board;
- ``ttt-o{cells}-s{seed}``: an opening, ``cells`` being the cells of the marks placed so
  far in move order, X first (``ttt-o40-s7``: X on 4, O on 0, opponent seed 7).

Any well-formed id is playable, but for an opening after which the opponent moves first and could
end the game before the agent moves (refused at reset); the splits are fixed lists of them:

- ``train``: empty board, opponent seeds 0..999 (1000 tasks);
- ``seen``: empty board, opponent seeds 100000..100199 (200 held-out seeds of the training
  distribution);
- ``unseen``: out of distribution, one X and one O already on the board and X to move, a
  start position never met in training: the 72 (X cell, O cell) openings in a fixed
  shuffled order, cycled, with opponent seeds 200000..200199 (200 tasks). With
  ``agent_first=False`` (the agent plays O) it is 200 of the 504 openings of two X and one O
  instead, so that here too the agent moves first from the opening.

The expert is minimax (perfect play; faster wins and slower losses preferred), ties broken
with the caller's ``rng`` (``expert_ties="random"``, the default) or by a fixed preference
for the centre, then corners, then edges (``expert_ties="ordered"``: the expert's move is a
function of the board, an easier target for a small model trained from scratch), with a
one-line templated rationale that ends with the cell.

The pure game logic (:func:`winner`, :func:`legal_moves`, :func:`to_move`,
:func:`minimax_value`, :func:`move_scores`, :func:`best_moves`, :func:`winning_cells`)
works on a board given as 9 characters ``'X'``, ``'O'``, ``'.'`` (a string or a list).
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Sequence
from functools import cache
from typing import Any

from turnrl.envs import register
from turnrl.envs.base import ExpertStep, TextEnv
from turnrl.errors import TurnRLError

EMPTY = "."
LINES: tuple[tuple[int, int, int], ...] = (
    (0, 1, 2), (3, 4, 5), (6, 7, 8),  # rows
    (0, 3, 6), (1, 4, 7), (2, 5, 8),  # columns
    (0, 4, 8), (2, 4, 6),  # diagonals
)  # fmt: skip
OPPONENTS = ("random", "minimax", "noisy")
EXPERT_TIES = ("random", "ordered")
#: ``expert_ties="ordered"``: among equally good moves the expert takes the first in this
#: order (centre, corners, edges), so its move is a function of the board
TIE_ORDER = (4, 0, 2, 6, 8, 1, 3, 5, 7)

# ---------------------------------------------------------------------------------------
# Pure game logic


def _key(board: Sequence[str]) -> str:
    return board if isinstance(board, str) else "".join(board)


def other(mark: str) -> str:
    """The other player's mark."""
    return "O" if mark == "X" else "X"


def winner(board: Sequence[str]) -> str | None:
    """``'X'`` or ``'O'`` if that mark has three in a line, else None."""
    for a, b, c in LINES:
        if board[a] != EMPTY and board[a] == board[b] == board[c]:
            return board[a]
    return None


def legal_moves(board: Sequence[str]) -> list[int]:
    """Empty cells in increasing order; ``[]`` once the game is over."""
    if winner(board) is not None:
        return []
    return [i for i in range(9) if board[i] == EMPTY]


def is_over(board: Sequence[str]) -> bool:
    """True when someone has won or the board is full."""
    return winner(board) is not None or EMPTY not in board


def to_move(board: Sequence[str]) -> str:
    """Whose turn it is: X when both have placed as many marks, else O."""
    return "X" if sum(c == "X" for c in board) == sum(c == "O" for c in board) else "O"


def play(board: Sequence[str], cell: int, mark: str | None = None) -> str:
    """The board (as a string) after ``mark`` (default: the player to move) takes ``cell``."""
    b = _key(board)
    return b[:cell] + (mark or to_move(b)) + b[cell + 1 :]


def winning_cells(board: Sequence[str], mark: str) -> list[int]:
    """Empty cells where ``mark`` would complete a line at once, in increasing order."""
    cells = set()
    for line in LINES:
        marks = [board[i] for i in line]
        if marks.count(mark) == 2 and marks.count(EMPTY) == 1:
            cells.add(line[marks.index(EMPTY)])
    return sorted(cells)


@cache
def _value(board: str) -> int:
    if winner(board) is not None:  # the previous mover won; sooner = more empty cells
        return -(1 + board.count(EMPTY))
    if EMPTY not in board:
        return 0
    return max(-_value(play(board, c)) for c in legal_moves(board))


def minimax_value(board: Sequence[str]) -> int:
    """Game value for the player to move under perfect play: > 0 win, 0 draw, < 0 loss.

    A won game scores ``1 + empty cells`` at the end, so a faster win (or a slower loss)
    scores higher. Memoized by board.
    """
    return _value(_key(board))


def move_scores(board: Sequence[str]) -> dict[int, int]:
    """Minimax score of each legal move for the player to move (higher is better)."""
    b = _key(board)
    return {c: -_value(play(b, c)) for c in legal_moves(b)}


def best_moves(board: Sequence[str]) -> list[int]:
    """The legal moves with the best minimax score, in increasing order."""
    scores = move_scores(board)
    if not scores:
        return []
    best = max(scores.values())
    return [c for c, s in scores.items() if s == best]


def render(board: Sequence[str]) -> str:
    """``Board:`` and three rows like ``X 1 O``: marks, and empty cells shown by their number
    (easier for small models than a placeholder: the legal moves are on the board)."""
    cells = [c if c != EMPTY else str(i) for i, c in enumerate(board)]
    rows = [" ".join(cells[r * 3 : r * 3 + 3]) for r in range(3)]
    return "Board:\n" + "\n".join(rows)


# ---------------------------------------------------------------------------------------
# Tasks and splits

_TASK_RE = re.compile(r"ttt-(?:o([0-8]+)-)?s([0-9]+)")
_TASK_FORMAT = "expected 'ttt-s<seed>' or 'ttt-o<cells>-s<seed>', e.g. 'ttt-s7' or 'ttt-o40-s7'"


def _unseen_ids(marks: int) -> tuple[str, ...]:
    """200 openings of ``marks`` marks (X first) in a fixed shuffled order, cycled, opponent seeds 200000+."""
    openings = list(itertools.permutations(range(9), marks))
    random.Random(7919).shuffle(openings)
    return tuple(f"ttt-o{''.join(map(str, cells))}-s{200000 + i}" for i, cells in enumerate(openings * 3) if i < 200)


_SPLIT_IDS: dict[str, tuple[str, ...]] = {
    "train": tuple(f"ttt-s{s}" for s in range(1000)),
    "seen": tuple(f"ttt-s{s}" for s in range(100000, 100200)),
    "unseen": _unseen_ids(2),  # one X and one O: the agent (X) to move
}
#: the agent plays O (``agent_first=False``): two X and one O, so that the agent is to move here too (after
#: one X and one O the opponent would move first, from openings of which 48 of 72 are won for X)
_UNSEEN_SECOND = _unseen_ids(3)


def parse_task(task_id: str) -> tuple[str, int]:
    """``(start board, opponent seed)`` of a task id; malformed ids raise TurnRLError."""
    m = _TASK_RE.fullmatch(task_id) if isinstance(task_id, str) else None
    if m is None:
        raise TurnRLError(f"tictactoe: unknown task id {task_id!r}; {_TASK_FORMAT}")
    board = EMPTY * 9
    for ch in m.group(1) or "":
        cell = int(ch)
        if board[cell] != EMPTY or is_over(board):
            raise TurnRLError(
                f"tictactoe: bad opening in task id {task_id!r}: cell {cell} is taken or the game is over"
            )
        board = play(board, cell)
    if is_over(board):
        raise TurnRLError(f"tictactoe: bad opening in task id {task_id!r}: the game is already over")
    return board, int(m.group(2))


# ---------------------------------------------------------------------------------------
# The environment

INSTRUCTION = """\
You are playing tic-tac-toe against an opponent on a 3x3 board. Players take turns placing \
their mark in an empty cell; X always moves first. You play X or O, as the observation says. \
The first player with three marks in a row, column or diagonal wins; if the board fills up \
first, it is a draw. A win gives reward +1, a draw 0 and a loss -1.
The cells are numbered 0-8, row by row:
0 1 2
3 4 5
6 7 8
On the board shown to you, an empty cell shows its number. On your turn, choose one empty cell.
Respond in exactly this format:
Thought: <one short sentence>
Action: <cell number>"""


class TicTacToe(TextEnv):
    """Tic-tac-toe against a random, minimax or noisy-minimax opponent (see module doc)."""

    name = "tictactoe"
    max_turns = 9

    def __init__(
        self,
        *,
        opponent: str = "random",
        noise: float = 0.3,
        agent_first: bool = True,
        show_legal_moves: bool = True,
        expert_ties: str = "random",
    ) -> None:
        if opponent not in OPPONENTS:
            raise TurnRLError(f"tictactoe: opponent must be one of {', '.join(OPPONENTS)} (got {opponent!r})")
        if isinstance(noise, bool) or not isinstance(noise, int | float) or not 0.0 <= noise <= 1.0:
            raise TurnRLError(f"tictactoe: noise must be a number in [0, 1] (got {noise!r})")
        for key, val in (("agent_first", agent_first), ("show_legal_moves", show_legal_moves)):
            if not isinstance(val, bool):
                raise TurnRLError(f"tictactoe: {key} must be true or false (got {val!r})")
        if expert_ties not in EXPERT_TIES:
            raise TurnRLError(f"tictactoe: expert_ties must be one of {', '.join(EXPERT_TIES)} (got {expert_ties!r})")
        self.expert_ties = expert_ties
        self.opponent = opponent
        self.noise = float(noise)
        self.agent_first = agent_first
        self.show_legal_moves = show_legal_moves
        self.agent_mark = "X" if agent_first else "O"
        self._board: str | None = None
        self._task_id = ""
        self._rng = random.Random(0)
        self._turns = 0
        self._done = False

    # -- contract ------------------------------------------------------------------------

    @property
    def instruction(self) -> str:
        """The fixed game instruction, including the response format."""
        return INSTRUCTION

    def task_ids(self, split: str) -> list[str]:
        """The task ids of ``train`` / ``seen`` / ``unseen`` in a fixed order."""
        if split not in _SPLIT_IDS:
            raise TurnRLError(f"tictactoe: unknown split {split!r}; choose from: {', '.join(_SPLIT_IDS)}")
        return list(_UNSEEN_SECOND if split == "unseen" and not self.agent_first else _SPLIT_IDS[split])

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        """Start a task: ``options["task_id"]``, else ``task_ids(options.get("split",
        "train"))[seed % len]`` (a random one when ``seed`` is None)."""
        task_id = self.choose_task(seed, options)
        board, opp_seed = parse_task(task_id)
        if to_move(board) != self.agent_mark and any(is_over(play(board, c)) for c in legal_moves(board)):
            # the opponent's first move, played here, could end the game before the agent plays (decided
            # for every opponent and seed alike, not by the move the seed draws)
            raise TurnRLError(f"tictactoe: task id {task_id!r}: the opponent moves first and could end the game "
                              f"before the agent (playing {self.agent_mark}) moves; give a shorter opening")
        self._task_id = task_id
        self._rng = random.Random(opp_seed)
        self._board = board
        self._turns = 0
        self._done = False
        prefix, opp = "", None
        if to_move(board) != self.agent_mark:
            opp = str(self._opponent_move())
            prefix = f"Opponent played {opp}.\n"
        return prefix + self._view(), self._info(opponent_move=opp)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        """Play the agent's cell, then the opponent's reply (see module doc)."""
        board = self.running(self._board, over=self._done)
        self._turns += 1
        text = action.strip() if isinstance(action, str) else ""
        # digits only, at most a few past leading zeros: a long string is an invalid move, not int()'s ValueError
        cell = int(text.lstrip("0") or "0") if re.fullmatch(r"0*[0-9]{1,3}", text) else -1
        if not 0 <= cell <= 8 or board[cell] != EMPTY:
            why = f"cell {cell} is taken" if 0 <= cell <= 8 else "choose an empty cell 0-8"
            truncated = self._turns >= self.max_turns
            self._done = truncated
            info = self._info(invalid=True)
            if truncated:
                info.update(won=False, success=False)
            return (
                f"Invalid move {str(action).strip()!r}: {why}.\n" + self._view(),
                0.0,
                False,
                truncated,
                info,
            )

        self._board = play(board, cell, self.agent_mark)
        prefix, opp = "", None
        if not is_over(self._board):
            opp = str(self._opponent_move())
            prefix = f"Opponent played {opp}.\n"
        self._done = is_over(self._board)
        if self._done:
            w = winner(self._board)
            outcome = "draw" if w is None else ("win" if w == self.agent_mark else "loss")
            reward = {"win": 1.0, "draw": 0.0, "loss": -1.0}[outcome]
            said = {"win": "you won", "draw": "draw", "loss": "you lost"}[outcome]
            info = self._info(opponent_move=opp)
            info.update(won=outcome == "win", success=outcome == "win", outcome=outcome)
            obs = prefix + render(self._board) + f"\nGame over: {said}."
            return obs, reward, True, False, info
        truncated = self._turns >= self.max_turns
        self._done = truncated
        info = self._info(opponent_move=opp)
        if truncated:
            info.update(won=False, success=False)
        return prefix + self._view(), 0.0, False, truncated, info

    def valid_actions(self) -> list[str]:
        """Legal moves as strings in cell order; ``[]`` before reset and after the end."""
        if self._board is None or self._done:
            return []
        return [str(c) for c in legal_moves(self._board)]

    def expert(self, rng: random.Random) -> ExpertStep:
        """Minimax move (ties broken with ``rng``) and a templated one-line rationale."""
        if self._board is None or self._done:
            raise TurnRLError("tictactoe: no expert move: the episode is not running (call reset())")
        board = self._board
        scores = move_scores(board)
        best = max(scores.values())
        ties = [c for c, s in scores.items() if s == best]
        cell = min(ties, key=TIE_ORDER.index) if self.expert_ties == "ordered" else rng.choice(ties)
        me = self.agent_mark
        # Every rationale ends with the cell, right before "Action:": a fixed distance from the
        # cell in the thought to the action, which small models trained from scratch copy far
        # more reliably than a cell named mid-sentence.
        if winner(play(board, cell, me)) == me:
            why = "I can win immediately"
        elif cell in winning_cells(board, other(me)):
            why = "I must block the opponent's line"
        elif best > 0:
            why = "This keeps a winning position"
        elif best == 0:
            why = "Minimax rates this move strongest"
        else:
            why = "This delays the loss as long as possible"
        thought = f"{why}: I take {cell}."
        return ExpertStep(action=str(cell), thought=thought)

    # -- internals -----------------------------------------------------------------------

    def _opponent_move(self) -> int:
        assert self._board is not None
        moves = legal_moves(self._board)
        greedy = self.opponent == "minimax" or (self.opponent == "noisy" and self._rng.random() >= self.noise)
        cell = self._rng.choice(best_moves(self._board) if greedy else moves)
        self._board = play(self._board, cell, other(self.agent_mark))
        return cell

    def _view(self) -> str:
        assert self._board is not None
        line = f"You play {self.agent_mark}."
        if self.show_legal_moves:
            line += " Legal moves: " + ", ".join(str(c) for c in legal_moves(self._board))
        return render(self._board) + "\n" + line

    def _info(self, *, invalid: bool = False, opponent_move: str | None = None) -> dict[str, Any]:
        assert self._board is not None
        return {
            "task_id": self._task_id,
            "valid_actions": [] if self._done else [str(c) for c in legal_moves(self._board)],
            "board": list(self._board),
            "agent_mark": self.agent_mark,
            "turn": self._turns,
            "invalid": invalid,
            "opponent_move": opponent_move,
        }


register("tictactoe", TicTacToe)
