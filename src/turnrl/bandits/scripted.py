"""Scripted bandit agents acting in a bandit env (no model, no torch).

:class:`ScriptedAgent` wraps an :class:`~turnrl.bandits.algorithms.Algorithm` for one env
at a time: it rebuilds the algorithm's statistics from the env's history (incrementally,
cached per env and episode), picks an arm, and writes the templated rationale with its
UCB values. The bandit envs' ``expert`` and the sampler policies of
:mod:`turnrl.bandits.policies` both act through it.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from turnrl.bandits.algorithms import Algorithm, Setting, State
from turnrl.bandits.rationale import thought


class BanditView(Protocol):
    """What a scripted agent reads from a bandit env (both bandit envs provide it)."""

    setting: Setting
    history: list[tuple[int | None, float]]
    episode: int

    def labels_now(self) -> list[str]: ...

    def context_at(self, t: int) -> np.ndarray | None: ...


@dataclass(frozen=True)
class Decision:
    arm: int
    label: str
    thought: str
    #: the UCB values written in the rationale (one per arm, in arm order)
    ucb: tuple[float, ...]
    explored: bool = False

    @property
    def reply(self) -> str:
        """The reply text in the paper's format: rationale, then ``ACTION=X``."""
        return f"{self.thought}\nACTION={self.label}"


class ScriptedAgent:
    """An algorithm acting in bandit envs; one cached state per (env, episode)."""

    def __init__(self, algo: Algorithm):
        self.algo = algo
        self._cache: weakref.WeakKeyDictionary[Any, tuple[int, int, State]] = weakref.WeakKeyDictionary()

    def state(self, env: BanditView) -> State:
        """The algorithm's statistics after the env's history so far."""
        hit = self._cache.get(env)
        if hit is None or hit[0] != env.episode or hit[1] > len(env.history):
            hit = (env.episode, 0, self.algo.init(1, env.setting))
        _, done, state = hit
        for t in range(done, len(env.history)):
            arm, reward = env.history[t]
            if arm is None:
                continue
            self.algo.update(state, np.array([arm]), np.array([reward]), _row(env.context_at(t)))
        self._cache[env] = (env.episode, len(env.history), state)
        return state

    def decide(self, env: BanditView, rng: np.random.Generator) -> Decision:
        state = self.state(env)
        ctx = _row(env.context_at(len(env.history)))
        ucb = self.algo.ucb(state, ctx)[0]
        arms, explore = self.algo.choose(state, ctx, rng)
        arm, explored = int(arms[0]), bool(explore[0])
        labels = env.labels_now()
        last = next((a for a, _ in reversed(env.history) if a is not None), None)
        # LinUCB writes its own values (on a plain bandit too, where they are not the UCB1 values the
        # instruction defines: its action is their argmax); the others' ``ucb`` is context-free UCB1
        name = "LinUCB" if self.algo.name == "linucb" else "UCB"
        text = thought(self.algo.name, labels, ucb.tolist(), arm, counts=state.counts[0].tolist(),
                       means=state.means()[0].tolist(), explored=explored, values_name=name, last_arm=last)
        return Decision(arm, labels[arm], text, tuple(float(v) for v in ucb), explored)


def _row(ctx: np.ndarray | None) -> np.ndarray | None:
    return None if ctx is None else np.asarray(ctx, dtype=float).reshape(1, -1)


__all__ = ["BanditView", "Decision", "ScriptedAgent"]
