"""The data model (DESIGN 2.2): trajectories and preference pairs.

One trajectory is one episode of one task, as a chat: a ``system`` message with the task
instruction, ``user`` messages with observations, and ``assistant`` messages with the
agent's turns (the only tokens ever trained on). Each is one JSON object on one line of a
``.jsonl`` file, tagged with its ``schema``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

TRAJECTORY_SCHEMA = "turnrl.trajectory/v1"
PAIR_SCHEMA = "turnrl.pair/v1"
ROLES = ("system", "user", "assistant")
SOURCES = ("expert", "policy", "import")

Role = Literal["system", "user", "assistant"]


@dataclass
class Message:
    """One chat message. Assistant messages may carry what the agent did with it:

    - ``action``: the parsed action, as executed (None where nothing parsed);
    - ``valid``: whether the written action was valid;
    - ``token_ids`` / ``logprobs``: the sampled tokens (content then end-of-turn) and their
      log-probabilities under the sampling model, so training sees exactly what was sampled;
    - ``note``: what the invalid-action policy did (e.g. the random action executed);
    - ``cut``: True when the reply ran into ``max_new_tokens`` before its end-of-turn token
      (its ``token_ids`` then end without one; training still closes the turn).
    """

    role: Role
    content: str
    action: str | None = None
    valid: bool | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    note: str | None = None
    cut: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class Trajectory:
    """One episode. ``rewards`` has one entry per agent turn; ``return_`` is their sum
    (serialized as ``return``)."""

    id: str
    env: str
    task_id: str
    messages: list[Message]
    rewards: list[float] = field(default_factory=list)
    return_: float = 0.0
    success: bool = False
    terminated: bool = False
    truncated: bool = False
    split: str = "train"
    source: str = "policy"
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def num_turns(self) -> int:
        return sum(1 for m in self.messages if m.role == "assistant")

    @property
    def actions(self) -> list[str | None]:
        return [m.action for m in self.messages if m.role == "assistant"]

    @property
    def game(self) -> tuple[str, Any]:
        """``(task_id, meta["seed"])``: the game played. A plan that visits a task more than once
        gives every visit its own env seed, so one task can hold several games (an imported
        trajectory without a seed has ``None``; a seed that is a JSON list or object, as an imported
        file's ``meta`` may hold, is its JSON text, so that games can key a dict)."""
        seed = self.meta.get("seed")
        if isinstance(seed, (list, dict)):
            seed = json.dumps(seed, sort_keys=True)
        return (self.task_id, seed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": TRAJECTORY_SCHEMA,
            "id": self.id,
            "env": self.env,
            "task_id": self.task_id,
            "split": self.split,
            "source": self.source,
            "messages": [m.to_dict() for m in self.messages],
            "rewards": list(self.rewards),
            "return": self.return_,
            "success": self.success,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "num_turns": self.num_turns,
            "meta": self.meta,
        }


@dataclass
class Pair:
    """A preference pair: ``chosen`` is preferred over ``rejected`` for ``task_id``."""

    task_id: str
    chosen: Trajectory
    rejected: Trajectory
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": PAIR_SCHEMA,
            "task_id": self.task_id,
            "chosen": self.chosen.to_dict(),
            "rejected": self.rejected.to_dict(),
            "meta": self.meta,
        }


def by_game(trajs: Iterable[Trajectory]) -> dict[tuple[str, Any], list[Trajectory]]:
    """Trajectories grouped by :attr:`Trajectory.game`, in order of first appearance."""
    out: dict[tuple[str, Any], list[Trajectory]] = {}
    for t in trajs:
        out.setdefault(t.game, []).append(t)
    return out
