"""Bandit algorithms, vectorised over many bandit instances at once.

Every algorithm works on a batch of ``N`` independent instances with ``K`` arms each. It
keeps its statistics in a :class:`State` and exposes:

- ``select(state, ctx, rng) -> arms[N]``: the arms it pulls now (``choose`` also says
  which instances explored at random);
- ``probs(state, ctx) -> [N, K]``: its action distribution now (what the frequency-bias
  diagnostic reads for scripted policies);
- ``scores(state, ctx) -> [N, K]``: its internal scores (UCB values, posterior means...);
- ``ucb(state, ctx) -> [N, K]``: the UCB values it writes in its rationales (UCB1 values
  with its ``c``, context-free, on every env; LinUCB's own values for ``linucb``, on every env);
- ``update(state, arms, rewards, ctx)``: learn from the pulls just made.

``ctx`` is the ``[N, d]`` context of this step (the user's features on a contextual
bandit, ``None`` on a plain one). Algorithms that do not use contexts ignore it; LinUCB on
a plain bandit uses the constant context ``[1]``.

Definitions (t = pulls so far, n_a = pulls of arm a, m_a = their mean reward):

- ``ucb`` (``c``, default 1): m_a + c·sqrt(ln t / n_a); an untried arm is +inf.
  Ties (several untried arms) are broken uniformly at random.
- ``greedy`` (``init``, default -inf): pure exploitation, the best m_a among the arms
  tried so far (the first pull is uniformly random); an untried arm counts as ``init``,
  so by default greedy never explores and stays with its first arm -- the extreme of the
  greediness failure of seed 004. ``greedy:init=0`` is Sutton & Barto's greedy with zero
  initial estimates (it tries a new arm while every tried arm's mean is below 0);
  ``init=0.5`` (the mean of U(0, 1)) tries new arms until one looks better than average.
- ``epsilon-greedy`` (``eps``, default 0.1; ``init`` as greedy): a uniformly random arm
  with probability ``eps``, else greedy. ``untried=1``: the exploring step takes a uniformly
  random *untried* arm instead, and is greedy once every arm has been tried.
- ``thompson``: Gaussian rewards: prior N(``prior_mean`` 0.5, ``prior_std`` 1) per arm and
  the env's noise ``sigma`` as known likelihood noise; posterior sample, argmax.
  Bernoulli rewards: Beta(1 + successes, 1 + failures).
- ``linucb`` (``alpha``, default 1; ``lam``, default 1): disjoint LinUCB (Li et al. 2010):
  per arm A_a = lam·I + Σ x xᵀ, b_a = Σ r x, θ_a = A_a⁻¹ b_a, score θ_a·x + alpha·sqrt(xᵀ A_a⁻¹ x).
- ``random`` (alias ``uniform``): a uniformly random arm.
- ``lose-shift`` (alias ``wsls``; ``threshold``, default -0.5): win-stay, lose-shift. It repeats the
  last arm unless that pull's reward was below ``threshold``, then takes the next arm in index
  order (cyclic); the first pull is uniformly random. It needs only the last pull, so a model shown
  one history line (``context=1``) can play it. On 10 Gaussian arms with means U(0, 1) and sigma 1
  it has regret@50 of about 15, against 20 for committing to one arm (docs/rlft.md).
  ``follow`` (default 1) is the probability that a low reward does make it shift: below 1/2 the
  most likely action always repeats the last arm, so a model SFT'd on it and decoded greedily
  commits to its first arm although its rationale (``Low.``) says to move on -- the
  knowing-doing gap of seed 004, the greedy-like start of the greedy-agents study.

Every algorithm takes ``c`` (the constant of the UCB values it reports). Specs are written
``name`` or ``name:key=value,key=value`` (``ucb:c=2``, ``epsilon-greedy:eps=0.2``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from turnrl.errors import TurnRLError, did_you_mean

DEFAULT_C = 1.0


@dataclass(frozen=True)
class Setting:
    """What an algorithm may know about the problem: arms, context size, reward family."""

    arms: int
    dim: int = 1
    dist: str = "gaussian"
    #: reward noise standard deviation (Gaussian), the likelihood Thompson sampling assumes
    sigma: float = 1.0


@dataclass
class State:
    """Statistics of ``n`` instances: pull counts and reward sums per arm (always kept),
    plus what an algorithm adds in ``extra``."""

    counts: np.ndarray  # [N, K] float
    sums: np.ndarray  # [N, K]
    setting: Setting
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.counts.shape[0])

    @property
    def t(self) -> np.ndarray:
        """Pulls so far per instance, [N]."""
        return self.counts.sum(axis=1)

    def means(self) -> np.ndarray:
        """Mean reward per arm (0 where untried), [N, K]."""
        return np.divide(self.sums, self.counts, out=np.zeros_like(self.sums), where=self.counts > 0)


def ucb_values(counts: np.ndarray, sums: np.ndarray, c: float = DEFAULT_C) -> np.ndarray:
    """UCB1-style values m_a + c·sqrt(ln t / n_a), +inf for untried arms (any leading shape)."""
    counts = np.asarray(counts, dtype=float)
    sums = np.asarray(sums, dtype=float)
    t = counts.sum(axis=-1, keepdims=True)
    safe = np.maximum(counts, 1.0)
    bonus = c * np.sqrt(np.log(np.maximum(t, 1.0)) / safe)
    vals = sums / safe + bonus
    return np.where(counts > 0, vals, np.inf)


def argmax_sets(values: np.ndarray, tol: float = 1e-9) -> np.ndarray:
    """Boolean mask of the maximal entries of each row (``inf`` ties with ``inf``)."""
    top = values.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        return np.asarray((values == top) | (np.isfinite(top) & (top - values <= tol)))


def random_argmax(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Row-wise argmax with ties broken uniformly at random."""
    mask = argmax_sets(values)
    noise = rng.random(values.shape)
    return np.asarray(np.where(mask, noise, -1.0).argmax(axis=-1))


def uniform_over(mask: np.ndarray) -> np.ndarray:
    """Rows of a boolean mask as uniform distributions over their True entries."""
    m = mask.astype(float)
    return m / m.sum(axis=-1, keepdims=True)


class Algorithm:
    """Base class: count/sum bookkeeping and spec metadata. See the module docstring."""

    name: ClassVar[str] = ""
    #: parameter names and defaults (every algorithm also takes ``c``)
    defaults: ClassVar[dict[str, float]] = {}

    def __init__(self, **params: float) -> None:
        self.params = {"c": DEFAULT_C, **self.defaults, **params}
        self.c = float(self.params["c"])

    @property
    def spec(self) -> str:
        """The canonical spec string (``ucb:c=2``; defaults omitted)."""
        changed = {k: v for k, v in self.params.items() if v != {"c": DEFAULT_C, **self.defaults}.get(k)}
        if not changed:
            return self.name
        return self.name + ":" + ",".join(f"{k}={_fmt(v)}" for k, v in sorted(changed.items()))

    def init(self, n: int, setting: Setting) -> State:
        k = setting.arms
        return State(np.zeros((n, k)), np.zeros((n, k)), setting)

    def update(self, state: State, arms: np.ndarray, rewards: np.ndarray, ctx: np.ndarray | None = None) -> None:
        rows = np.arange(state.n)
        valid = np.asarray(arms) >= 0
        np.add.at(state.counts, (rows[valid], np.asarray(arms)[valid]), 1.0)
        np.add.at(state.sums, (rows[valid], np.asarray(arms)[valid]), np.asarray(rewards, dtype=float)[valid])

    def ucb(self, state: State, ctx: np.ndarray | None = None) -> np.ndarray:
        return ucb_values(state.counts, state.sums, self.c)

    def scores(self, state: State, ctx: np.ndarray | None = None) -> np.ndarray:
        return self.ucb(state, ctx)

    def probs(self, state: State, ctx: np.ndarray | None = None) -> np.ndarray:
        return uniform_over(argmax_sets(self.scores(state, ctx)))

    def select(self, state: State, ctx: np.ndarray | None, rng: np.random.Generator) -> np.ndarray:
        return random_argmax(self.scores(state, ctx), rng)

    def choose(self, state: State, ctx: np.ndarray | None, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``select`` plus which instances explored at random (for rationales), [N] each."""
        return self.select(state, ctx, rng), np.zeros(state.n, dtype=bool)


class UCB(Algorithm):
    name = "ucb"


class RandomAlgo(Algorithm):
    name = "random"

    def scores(self, state: State, ctx: np.ndarray | None = None) -> np.ndarray:
        return np.zeros_like(state.counts)

    def select(self, state: State, ctx: np.ndarray | None, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(0, state.setting.arms, size=state.n)


class Greedy(Algorithm):
    name = "greedy"
    defaults = {"init": -math.inf}

    def scores(self, state: State, ctx: np.ndarray | None = None) -> np.ndarray:
        return np.where(state.counts > 0, state.means(), float(self.params["init"]))


class EpsilonGreedy(Greedy):
    name = "epsilon-greedy"
    defaults = {"eps": 0.1, "init": -math.inf, "untried": 0.0}

    @property
    def eps(self) -> float:
        return float(self.params["eps"])

    def _explore_mask(self, state: State, ctx: np.ndarray | None) -> np.ndarray:
        """The arms an exploring step draws from, uniformly: every arm, or with ``untried`` the
        untried ones (the greedy set of a row with none left)."""
        if not self.params["untried"]:
            return np.ones(state.counts.shape, dtype=bool)
        untried = state.counts == 0
        return np.where(untried.any(axis=-1, keepdims=True), untried, argmax_sets(self.scores(state, ctx)))

    def probs(self, state: State, ctx: np.ndarray | None = None) -> np.ndarray:
        explore = uniform_over(self._explore_mask(state, ctx))
        return self.eps * explore + (1.0 - self.eps) * super().probs(state, ctx)

    def choose(self, state: State, ctx: np.ndarray | None, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        explore = rng.random(state.n) < self.eps
        greedy = random_argmax(self.scores(state, ctx), rng)
        if self.params["untried"]:
            rand = random_argmax(np.where(self._explore_mask(state, ctx), 0.0, -1.0), rng)
            # with every arm tried the exploring step is greedy: it explored nothing (its rationale says so)
            explore = explore & (state.counts == 0).any(axis=-1)
        else:
            rand = rng.integers(0, state.setting.arms, size=state.n)
        return np.where(explore, rand, greedy), explore

    def select(self, state: State, ctx: np.ndarray | None, rng: np.random.Generator) -> np.ndarray:
        return self.choose(state, ctx, rng)[0]


class Thompson(Algorithm):
    name = "thompson"
    defaults = {"prior_mean": 0.5, "prior_std": 1.0}

    def posterior(self, state: State) -> tuple[np.ndarray, np.ndarray]:
        """Gaussian posterior (mean, std) per arm; for Bernoulli, the Beta's (mean, std)."""
        if state.setting.dist == "bernoulli":
            a, b = 1.0 + state.sums, 1.0 + state.counts - state.sums
            mean = a / (a + b)
            return mean, np.sqrt(a * b / ((a + b) ** 2 * (a + b + 1.0)))
        s2 = max(state.setting.sigma, 1e-6) ** 2
        p0 = 1.0 / float(self.params["prior_std"]) ** 2
        prec = p0 + state.counts / s2
        mean = (float(self.params["prior_mean"]) * p0 + state.sums / s2) / prec
        return mean, np.sqrt(1.0 / prec)

    def scores(self, state: State, ctx: np.ndarray | None = None) -> np.ndarray:
        return self.posterior(state)[0]

    def sample(self, state: State, rng: np.random.Generator, size: int | None = None) -> np.ndarray:
        """Posterior samples, [N, K] (or [size, N, K])."""
        shape = state.counts.shape if size is None else (size, *state.counts.shape)
        if state.setting.dist == "bernoulli":
            return rng.beta(1.0 + state.sums, 1.0 + state.counts - state.sums, size=shape)
        mean, std = self.posterior(state)
        return mean + std * rng.standard_normal(shape)

    def select(self, state: State, ctx: np.ndarray | None, rng: np.random.Generator) -> np.ndarray:
        return random_argmax(self.sample(state, rng), rng)

    def probs(self, state: State, ctx: np.ndarray | None = None, samples: int = 4000) -> np.ndarray:
        """P(arm has the largest posterior sample), estimated from ``samples`` draws (seeded)."""
        draws = self.sample(state, np.random.default_rng(0), size=samples)  # [S, N, K]
        best = draws.argmax(axis=-1)  # [S, N]
        k = state.setting.arms
        return np.stack([(best == a).mean(axis=0) for a in range(k)], axis=-1)


class LinUCB(Algorithm):
    name = "linucb"
    defaults = {"alpha": 1.0, "lam": 1.0}

    def init(self, n: int, setting: Setting) -> State:
        state = super().init(n, setting)
        d, k = setting.dim, setting.arms
        lam = float(self.params["lam"])
        state.extra["a_inv"] = np.broadcast_to(np.eye(d) / lam, (n, k, d, d)).copy()
        state.extra["b"] = np.zeros((n, k, d))
        return state

    @staticmethod
    def _ctx(state: State, ctx: np.ndarray | None) -> np.ndarray:
        if ctx is None:
            return np.ones((state.n, state.setting.dim))
        return np.asarray(ctx, dtype=float).reshape(state.n, -1)

    def update(self, state: State, arms: np.ndarray, rewards: np.ndarray, ctx: np.ndarray | None = None) -> None:
        super().update(state, arms, rewards, ctx)
        x = self._ctx(state, ctx)
        for i in np.flatnonzero(np.asarray(arms) >= 0):
            a = int(arms[i])
            ainv = state.extra["a_inv"][i, a]
            v = ainv @ x[i]
            ainv -= np.outer(v, v) / (1.0 + x[i] @ v)  # Sherman-Morrison
            state.extra["b"][i, a] += float(rewards[i]) * x[i]

    def estimates(self, state: State, ctx: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """(θ_a·x, sqrt(xᵀ A_a⁻¹ x)) per arm, each [N, K]."""
        x = self._ctx(state, ctx)
        ainv, b = state.extra["a_inv"], state.extra["b"]
        theta = np.einsum("nkij,nkj->nki", ainv, b)
        mean = np.einsum("nki,ni->nk", theta, x)
        width = np.sqrt(np.maximum(np.einsum("ni,nkij,nj->nk", x, ainv, x), 0.0))
        return mean, width

    def scores(self, state: State, ctx: np.ndarray | None = None) -> np.ndarray:
        mean, width = self.estimates(state, ctx)
        return mean + float(self.params["alpha"]) * width

    def ucb(self, state: State, ctx: np.ndarray | None = None) -> np.ndarray:
        """Its own values, the ones it acts on, on every env (on a plain bandit, with the constant
        context, ``theta_a + alpha / sqrt(1 + n_a)``, not UCB1's): a rationale stating UCB1 values
        while the action was LinUCB's argmax contradicted itself in 219 of 300 steps."""
        return self.scores(state, ctx)


class LoseShift(Algorithm):
    name = "lose-shift"
    defaults = {"threshold": -0.5, "follow": 1.0}

    def init(self, n: int, setting: Setting) -> State:
        state = super().init(n, setting)
        state.extra["last_arm"] = np.full(n, -1, dtype=np.int64)
        state.extra["last_reward"] = np.zeros(n)
        return state

    def update(self, state: State, arms: np.ndarray, rewards: np.ndarray, ctx: np.ndarray | None = None) -> None:
        super().update(state, arms, rewards, ctx)
        valid = np.asarray(arms) >= 0
        state.extra["last_arm"][valid] = np.asarray(arms)[valid]
        state.extra["last_reward"][valid] = np.asarray(rewards, dtype=float)[valid]

    def shifts(self, state: State) -> np.ndarray:
        """Which instances move on now: a last pull whose reward was below the threshold, [N]."""
        return np.asarray((state.extra["last_arm"] >= 0) & (state.extra["last_reward"] < float(self.params["threshold"])))

    def probs(self, state: State, ctx: np.ndarray | None = None) -> np.ndarray:
        """After a low reward ``follow`` on the next arm and ``1 - follow`` on the last, else 1 on
        the last arm; uniform before the first pull."""
        last, k = state.extra["last_arm"], state.setting.arms
        tried = np.flatnonzero(last >= 0)
        follow = np.where(self.shifts(state), float(self.params["follow"]), 0.0)[tried]
        out = np.full((state.n, k), 1.0 / k)
        out[tried] = 0.0
        np.add.at(out, (tried, last[tried]), 1.0 - follow)
        np.add.at(out, (tried, (last[tried] + 1) % k), follow)
        return out

    def scores(self, state: State, ctx: np.ndarray | None = None) -> np.ndarray:
        """1 on the most likely next arm(s), else 0 (all 1 before the first pull: a uniform tie; with
        ``follow`` 1/2 the last and the next arm tie)."""
        p = self.probs(state, ctx)
        return np.asarray(p >= p.max(axis=-1, keepdims=True) - 1e-12, dtype=float)

    def choose(self, state: State, ctx: np.ndarray | None, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Sampled from :meth:`probs`. The second array (what a rationale explains) is whether the last
        reward was low, also when ``follow`` < 1 keeps the arm; with ``follow`` 1 that is exactly the
        shifts, and the draws are exactly those from before ``follow`` existed."""
        last, k = state.extra["last_arm"], state.setting.arms
        shift = self.shifts(state)
        plan = np.where(shift, (last + 1) % k, last)
        onehot = np.zeros((state.n, k))
        tried = np.flatnonzero(last >= 0)
        onehot[tried, plan[tried]] = 1.0
        arms = random_argmax(onehot, rng)  # uniform before the first pull
        if float(self.params["follow"]) < 1.0:
            moves = shift & (rng.random(state.n) < float(self.params["follow"]))
            arms = np.where(moves | (last < 0), arms, last)
        return arms, shift

    def select(self, state: State, ctx: np.ndarray | None, rng: np.random.Generator) -> np.ndarray:
        return self.choose(state, ctx, rng)[0]


ALGORITHMS: dict[str, type[Algorithm]] = {
    cls.name: cls for cls in (UCB, Greedy, EpsilonGreedy, Thompson, LinUCB, RandomAlgo, LoseShift)
}
ALIASES = {"eps-greedy": "epsilon-greedy", "egreedy": "epsilon-greedy", "ts": "thompson", "ucb1": "ucb",
           "uniform": "random", "wsls": "lose-shift"}


def _fmt(v: float) -> str:
    return f"{v:g}"


def _param_error(name: str, key: str, value: Any, why: str) -> TurnRLError:
    return TurnRLError(f"bandit policy '{name}': {key} {why} (got {value!r})")


def _check(name: str, params: dict[str, float]) -> None:
    for key, val in params.items():
        if not math.isfinite(val) and not (key == "init" and val < 0):
            raise _param_error(name, key, val, "must be a finite number")
    if params.get("c", 0.0) < 0:
        raise _param_error(name, "c", params["c"], "must be >= 0")
    for key in ("eps", "follow"):
        if not 0.0 <= params.get(key, 0.0) <= 1.0:
            raise _param_error(name, key, params[key], "must be in [0, 1]")
    if params.get("untried", 0.0) not in (0.0, 1.0):
        raise _param_error(name, "untried", params["untried"], "must be 0 or 1")
    for key in ("prior_std", "lam"):
        if key in params and params[key] <= 0:
            raise _param_error(name, key, params[key], "must be > 0")
    if 0 < params.get("prior_std", 1.0) < 1e-6:  # its square, the prior's variance, would underflow
        raise _param_error(name, "prior_std", params["prior_std"], "must be >= 1e-6")
    if params.get("alpha", 0.0) < 0:
        raise _param_error(name, "alpha", params["alpha"], "must be >= 0")


def is_algorithm_spec(spec: str) -> bool:
    """Whether ``spec`` names a scripted bandit algorithm (``ucb``, ``ucb:c=2``, ...)."""
    head = spec.split(":", 1)[0].strip().lower()
    return head in ALGORITHMS or head in ALIASES


def make_algorithm(spec: str) -> Algorithm:
    """Build an algorithm from ``name`` or ``name:key=value,...``; bad specs are one-line errors."""
    head, _, rest = spec.partition(":")
    name = ALIASES.get(head.strip().lower(), head.strip().lower())
    if name not in ALGORITHMS:
        choices = sorted(ALGORITHMS)
        raise TurnRLError(
            f"unknown bandit policy '{head}'{did_you_mean(name, choices)}; choose from: {', '.join(choices)}"
        )
    cls = ALGORITHMS[name]
    allowed = ["c", *cls.defaults]
    params: dict[str, float] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq:
            raise TurnRLError(f"bandit policy '{spec}': expected key=value, got {item!r}")
        if key not in allowed:
            raise TurnRLError(
                f"bandit policy '{name}': unknown parameter '{key}'{did_you_mean(key, allowed)}; "
                f"choose from: {', '.join(allowed)}"
            )
        try:
            params[key] = float(value)
        except ValueError:
            raise _param_error(name, key, value.strip(), "must be a number") from None
    _check(name, {"c": DEFAULT_C, **cls.defaults, **params})
    return cls(**params)


def with_env_c(spec: str, ucb_c: float, *, contextual: bool = False) -> str:
    """``spec`` with the env's UCB constant where it gives none: ``c`` (the UCB values a rationale
    states, and UCB's exploration), and on the contextual bandit LinUCB's ``alpha`` too, as the env's
    expert takes it (its ``c`` scales only the context-free UCB1 values). The env's instruction and
    the knowing-doing truth use that constant, so a policy with its own default would state and act
    on other values than those its data and scores are about."""
    head, _, rest = spec.partition(":")
    given = {p.partition("=")[0].strip() for p in rest.split(",") if p.strip()}
    name = ALIASES.get(head.strip().lower(), head.strip().lower())
    add = [f"{k}={ucb_c!r}" for k in ("c", *(("alpha",) if contextual and name == "linucb" else ()))
           if k not in given]
    if not add:
        return spec
    return f"{head}:{','.join(filter(None, [rest.strip(), *add]))}"


__all__ = [
    "ALGORITHMS", "DEFAULT_C", "Algorithm", "EpsilonGreedy", "Greedy", "LinUCB", "LoseShift", "RandomAlgo", "Setting",
    "State",
    "Thompson", "UCB", "argmax_sets", "is_algorithm_spec", "make_algorithm", "random_argmax", "ucb_values",
    "uniform_over", "with_env_c",
]
