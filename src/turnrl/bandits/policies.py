"""Scripted bandit policies for the sampler: ``load_policy("ucb:c=2")`` and friends.

A :class:`ScriptedBanditPolicy` plays an algorithm of :mod:`turnrl.bandits.algorithms` in
bandit envs through the normal sampler, writing the templated rationale with its UCB
values and ``ACTION=X`` (so ``turnrl collect --env bandit --policy ucb`` writes
thought-cloning data). Its randomness comes from each episode's rng, so collections are
reproducible and do not depend on the number of environments.

Specs: ``ucb``, ``ucb:c=2``, ``linucb``, ``linucb:alpha=0.5``, ``thompson``,
``epsilon-greedy:eps=0.1``, ``greedy``, ``greedy:init=0``, ``uniform`` (random arms with
the UCB-value rationale). A spec without ``c`` takes the env's ``ucb_c`` (and ``linucb`` on the
contextual bandit its ``alpha``), the constant of the env's instruction and expert. ``random``
stays the generic random policy of :mod:`turnrl.rollout.policies` for ``load_policy``; in
``turnrl diagnose`` it is the scripted one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from turnrl.bandits.algorithms import Algorithm, is_algorithm_spec, make_algorithm, with_env_c
from turnrl.bandits.scripted import Decision, ScriptedAgent
from turnrl.rollout.policies import Reply, Request


def bandit_env(env: Any, who: str) -> Any:
    """``env`` if it is one of the bandit envs, else a one-line error naming ``who``."""
    from turnrl.envs.bandit import as_bandit

    return as_bandit(env, who)


class ScriptedBanditPolicy:
    """A bandit algorithm as a sampler policy (see the module doc)."""

    #: reads the env object itself (its arms and history), so it cannot act on envs in workers
    reads_env = True

    def __init__(self, algo: Algorithm, spec: str | None = None):
        self.algo = algo
        self.name = algo.spec
        self.agent = ScriptedAgent(algo)
        #: the spec as given: each env's UCB constant fills in what it leaves out (:meth:`agent_for`)
        self.spec = spec
        self._agents: dict[tuple[float, bool], ScriptedAgent] = {}
        #: the last decision per request of the latest ``act`` call (arm, UCB values...)
        self.last: list[Decision] = []

    def agent_for(self, env: Any) -> ScriptedAgent:
        """The agent that plays ``env``: with a spec, the algorithm with the env's ``ucb_c`` where the
        spec gives no constant (:func:`~turnrl.bandits.algorithms.with_env_c`), as the env's
        instruction and expert use it; a policy made from an algorithm plays it as it is."""
        if self.spec is None:
            return self.agent
        key = (float(env.ucb_c), env.setting.dim > 1)
        if key not in self._agents:
            self._agents[key] = ScriptedAgent(make_algorithm(with_env_c(self.spec, key[0], contextual=key[1])))
        return self._agents[key]

    def check_env(self, env: Any) -> None:
        """One line, before any episode, where ``env`` is no bandit env."""
        bandit_env(env, f"bandit policy '{self.name}'")

    def act(self, requests: Sequence[Request]) -> list[Reply]:
        self.last = []
        out = []
        for r in requests:
            env = bandit_env(r.env, f"bandit policy '{self.name}'")
            d = self.agent_for(env).decide(env, np.random.default_rng(r.rng.getrandbits(64)))
            self.last.append(d)
            out.append(Reply(d.reply, meta={"arm": d.arm, "ucb": list(d.ucb), "explored": d.explored}))
        return out


def load_scripted(spec: str) -> ScriptedBanditPolicy | None:
    """The scripted policy for ``spec``, or None when ``spec`` names no bandit algorithm
    (``random`` is left to the generic random policy)."""
    if spec.strip().lower() == "random" or not is_algorithm_spec(spec):
        return None
    return ScriptedBanditPolicy(make_algorithm(spec), spec)


__all__ = ["ScriptedBanditPolicy", "bandit_env", "load_scripted"]
