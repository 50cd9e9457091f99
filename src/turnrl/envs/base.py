"""The text-environment contract (DESIGN 2.1).

A :class:`TextEnv` is Gymnasium-shaped, text in and text out::

    obs, info = env.reset(seed=3, options={"task_id": "..."})
    obs, reward, terminated, truncated, info = env.step("4")

``info`` carries at least ``task_id``; ``valid_actions`` (a list of strings) where the env
can enumerate its actions (``shown_actions``, where given, is what an invalid reply is shown
instead: a list that would give the task away); and ``won``/``success`` at the end of an episode. Each env
names its task ``instruction`` (what the agent must achieve), its task ``splits``
(``train``, ``seen`` = held-out tasks of the training distribution, ``unseen`` =
out-of-distribution tasks) and an ``expert`` that acts with a short templated rationale.
"""

from __future__ import annotations

import abc
import numbers
import random
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from turnrl.errors import TurnRLError

SPLITS = ("train", "seen", "unseen")
_State = TypeVar("_State")


@dataclass(frozen=True)
class ExpertStep:
    """What an expert (or any scripted policy) does: the action and why, in one line."""

    action: str
    thought: str


class TextEnv(abc.ABC):
    """Base class of every environment. Subclasses set ``name`` and implement the methods.

    Construction takes only keyword options (``make("tictactoe", opponent="random")``);
    an unknown or bad option raises :class:`~turnrl.errors.TurnRLError` naming it.
    """

    name: ClassVar[str] = ""
    #: Upper bound on agent turns in one episode (the sampler stops there, truncated).
    max_turns: int = 50
    #: Draws the task of a reset with no seed (made on first use, one per env instance).
    _unseeded: random.Random | None = None

    @abc.abstractmethod
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        """Start an episode. ``options["task_id"]`` picks a task; else ``seed`` draws one
        from ``options.get("split", "train")``. Same seed and options -> same episode."""

    @abc.abstractmethod
    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        """Apply one action; returns ``(obs, reward, terminated, truncated, info)``."""

    @property
    @abc.abstractmethod
    def instruction(self) -> str:
        """The task instruction for the current episode (what the agent must achieve),
        including how to format actions."""

    @abc.abstractmethod
    def task_ids(self, split: str) -> list[str]:
        """The task ids of a split (``train`` / ``seen`` / ``unseen``), in a fixed order."""

    @abc.abstractmethod
    def expert(self, rng: random.Random) -> ExpertStep:
        """The expert's next action in the current state, with a templated rationale."""

    def choose_task(self, seed: int | None, options: dict[str, Any] | None) -> Any:
        """The task a :meth:`reset` starts: ``options["task_id"]`` as given (the env checks it),
        else ``task_ids(options.get("split", "train"))[seed % len]``, or a random task of that
        split when ``seed`` is None. Any other option raises :class:`~turnrl.errors.TurnRLError`
        naming it."""
        if options is not None and not isinstance(options, dict):
            raise TurnRLError(f"{self.name}: reset options must be a dict such as {{'task_id': ...}} (got {options!r})")
        options = options or {}
        extra = sorted(set(options) - {"task_id", "split"})
        if extra:
            raise TurnRLError(f"{self.name}: unknown reset option {extra[0]!r}; choose from: split, task_id")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
            raise TurnRLError(f"{self.name}: reset seed must be an integer (got {seed!r})")
        split = options.get("split", "train")
        if "task_id" in options:  # (the sampler's case, every reset: no list of ids is built)
            if split not in SPLITS:
                raise TurnRLError(f"{self.name}: unknown split {split!r}; choose from: {', '.join(SPLITS)}")
            if not isinstance(options["task_id"], str):
                raise TurnRLError(f"{self.name}: task_id must be a string (got {options['task_id']!r})")
            return options["task_id"]
        ids = self.task_ids(split)
        if seed is not None:
            return ids[int(seed) % len(ids)]
        if self._unseeded is None:
            self._unseeded = random.Random()
        return self._unseeded.choice(ids)

    def running(self, state: _State | None, *, over: bool) -> _State:
        """The state of the episode a :meth:`step` continues (whatever the env keeps while an
        episode runs: its board, goal, process...). Raises :class:`~turnrl.errors.TurnRLError`
        before the first reset (``state`` None) and after the episode ended (``over``)."""
        if state is None:
            raise TurnRLError(f"{self.name}: call reset() before step()")
        if over:
            raise TurnRLError(f"{self.name}: the episode is over; call reset() to start a new one")
        return state

    def valid_actions(self) -> list[str] | None:
        """The actions allowed now, or None where the env cannot enumerate them."""
        return None

    def close(self) -> None:  # noqa: B027  (optional hook, not abstract)
        """Release external resources (processes, files)."""

    def __enter__(self) -> TextEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
