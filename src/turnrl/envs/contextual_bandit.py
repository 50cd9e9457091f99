"""A contextual bandit as text: recommend one of K movies to each arriving user (DESIGN 4,
seed 004).

At every step a synthetic user arrives -- gender, age, occupation, location and a
preference vector over four genres -- and the agent recommends one of ``items`` movies
(labels ``Moonfall``, ``Redline``, ...; the movies' genre mixes are listed in the task's
instruction). The reward is linear in the user's and the movie's features plus noise:

    x = [1, g, a, p_action, p_comedy, p_drama, p_romance]       (user features, d = 7)
    mu(user, movie i) = b_i + g·(γ_g·y_i) + a·(γ_a·y_i) + p·y_i
    reward = round(mu + sigma·N(0, 1), 2)

with g = +1 / −1 / 0 for female / male / non-binary, a = (age − 44) / 26, p the user's
preferences in [−1, 1], y_i ∈ [0, 1]^4 the movie's genre mix, b_i ∈ U(0, 0.5) its hidden
popularity and γ_g, γ_a ∈ U(−0.5, 0.5)^4 the task's hidden demographic effects. So every
movie's expected reward is linear in x: mu = θ_i·x with θ_i = [b_i, γ_g·y_i, γ_a·y_i, y_i],
which is what disjoint LinUCB (the expert) assumes. Occupation matters through the
preferences (each occupation has a typical taste the user's preferences scatter around);
location is descriptive.

Options: ``items`` (5; 2..20), ``noise`` (``medium``: sigma 0.1 / 0.5 / 1.0 for ``low`` /
``medium`` / ``high``), ``horizon`` (50), ``context`` (10 past steps shown),
``summary``, ``randomize_labels``, ``rationale`` (``short`` | ``ucb``: write
``LinUCB values: Moonfall=..., ...`` first), ``ucb_c`` -- as for ``bandit``; here it is the
expert LinUCB's exploration constant (``alpha``: score θ_i·x + ucb_c·sqrt(xᵀ A_i⁻¹ x)).

Tasks: ``cb-<seed>`` (train: seeds 0..999; seen: 100000..100199) with users of eight
occupations, and ``cb-new-<seed>`` (unseen: 200000..200199) whose users all have the two
occupations never met in training (``nurse``, ``pilot``). A task fixes the movies, the
hidden effects, the stream of users and every reward. An episode is a success when its
regret is at most 3/4 of choosing at random's expected regret (:data:`SUCCESS_SHARE`): the
expert LinUCB succeeds in 72-76% of the seen tasks and 77-84% of the unseen ones, choosing at
random in 0.5-1.5% (200 tasks each, the defaults; the ranges over three seedings of the policies'
random draws). Before 30 Nov 2026 the share was 1/2, which the expert met in 10% of the seen tasks
at horizon 50.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from turnrl.bandits.algorithms import Setting, make_algorithm
from turnrl.bandits.scripted import ScriptedAgent
from turnrl.bandits.simulate import Instance
from turnrl.envs import register
from turnrl.envs.bandit import BanditEnvBase, check_choice, check_int
from turnrl.errors import TurnRLError

TITLES = (
    "Moonfall", "Redline", "Paperhearts", "Ironwood", "Starlight", "Quicksand", "Bluebird",
    "Nightshift", "Goldrush", "Wildfire", "Snowglobe", "Riverbend", "Firefly", "Driftwood",
    "Sunburst", "Thunderclap", "Moonstone", "Lighthouse", "Wanderlust", "Afterglow",
)  # fmt: skip
GENRES = ("action", "comedy", "drama", "romance")
GENDERS = ("female", "male", "non-binary")
OCCUPATIONS = ("student", "engineer", "artist", "doctor", "teacher", "farmer", "lawyer", "chef",
               "nurse", "pilot")
#: occupations of the ``unseen`` split's users (never met in train / seen)
NEW_OCCUPATIONS = ("nurse", "pilot")
LOCATIONS = ("Lisbon", "Oslo", "Nairobi", "Lima", "Osaka", "Denver", "Cairo", "Perth")
NOISE_SIGMA = {"low": 0.1, "medium": 0.5, "high": 1.0}
#: an episode is a success when its regret is at most this share of choosing at random's expected regret
SUCCESS_SHARE = 0.75
#: each occupation's typical taste (action, comedy, drama, romance); users scatter around it
TASTES = np.array([
    [0.6, 0.5, -0.4, 0.0],   # student
    [0.7, -0.2, 0.0, -0.5],  # engineer
    [-0.5, 0.2, 0.7, 0.3],   # artist
    [-0.2, 0.3, 0.6, -0.1],  # doctor
    [-0.3, 0.4, 0.3, 0.5],   # teacher
    [0.3, 0.6, -0.2, 0.2],   # farmer
    [0.2, -0.4, 0.8, -0.2],  # lawyer
    [0.0, 0.5, -0.3, 0.7],   # chef
    [-0.4, 0.1, 0.4, 0.8],   # nurse
    [0.8, -0.3, -0.5, 0.1],  # pilot
])  # fmt: skip
DIM = 3 + len(GENRES)


def _signed(v: float) -> str:
    return f"{v:+.1f}"


class ContextualBandit(BanditEnvBase):
    """Movie recommendation to a stream of synthetic users (see the module doc)."""

    name = "contextual_bandit"
    noun = "movie"
    _task_re = re.compile(r"cb-(new-)?([0-9]+)")
    _task_format = "expected 'cb-<seed>' or 'cb-new-<seed>', e.g. 'cb-7'"
    _split_ids = {
        "train": tuple(f"cb-{s}" for s in range(1000)),
        "seen": tuple(f"cb-{s}" for s in range(100000, 100200)),
        "unseen": tuple(f"cb-new-{s}" for s in range(200000, 200200)),
    }

    def __init__(
        self,
        *,
        items: int = 5,
        noise: str = "medium",
        horizon: int = 50,
        context: int = 10,
        summary: bool | str = False,
        randomize_labels: bool = False,
        rationale: str = "short",
        ucb_c: float = 1.0,
    ) -> None:
        self.items = check_int("contextual_bandit", "items", items, 2, len(TITLES))
        self.noise = check_choice("contextual_bandit", "noise", noise, tuple(NOISE_SIGMA))
        super().__init__(horizon=horizon, context=context, summary=summary, randomize_labels=randomize_labels,
                         rationale=rationale, ucb_c=ucb_c, expert="linucb")
        # LinUCB explores with ``alpha`` (its ``c`` only scales the UCB1 values of a plain bandit)
        self._expert = ScriptedAgent(make_algorithm(f"linucb:c={self.ucb_c!r},alpha={self.ucb_c!r}"))
        self.labels = list(TITLES[: self.items])
        self.setting = Setting(arms=self.items, dim=DIM, dist="gaussian", sigma=NOISE_SIGMA[self.noise])

    # -- task ----------------------------------------------------------------------------

    def instance(self, task_id: str, horizon: int | None = None) -> Instance:
        """Movies, hidden effects, users, expected rewards and the reward table of a task."""
        new, seed = self.parse_task(task_id)
        h = self.horizon if horizon is None else horizon
        k = self.items
        rng = np.random.default_rng([seed, 0])
        genres = np.round(rng.uniform(0.0, 1.0, (k, len(GENRES))), 1)
        popularity = rng.uniform(0.0, 0.5, k)
        gamma_g = rng.uniform(-0.5, 0.5, len(GENRES))
        gamma_a = rng.uniform(-0.5, 0.5, len(GENRES))
        theta = np.concatenate([popularity[:, None], (genres @ gamma_g)[:, None], (genres @ gamma_a)[:, None],
                                genres], axis=1)  # [K, d]
        urng = np.random.default_rng([seed, 3])
        occs = [OCCUPATIONS.index(o) for o in (NEW_OCCUPATIONS if new else OCCUPATIONS[:8])]
        users: list[dict[str, Any]] = []
        ctx = np.zeros((h, DIM))
        for t in range(h):
            gender = GENDERS[int(urng.integers(len(GENDERS)))]
            age = int(urng.integers(18, 71))
            occ = occs[int(urng.integers(len(occs)))]
            loc = LOCATIONS[int(urng.integers(len(LOCATIONS)))]
            prefs = np.clip(np.round(TASTES[occ] + 0.5 * urng.standard_normal(len(GENRES)), 1), -1.0, 1.0)
            users.append({"gender": gender, "age": age, "occupation": OCCUPATIONS[occ], "location": loc,
                          "preferences": [float(p) for p in prefs]})
            g = {"female": 1.0, "male": -1.0}.get(gender, 0.0)
            ctx[t] = [1.0, g, (age - 44) / 26, *prefs]
        mu = ctx @ theta.T  # [H, K]
        noise = np.random.default_rng([seed, 1]).standard_normal((h, k))
        rewards = np.round(mu + NOISE_SIGMA[self.noise] * noise, 2)
        perms = None
        if self.randomize_labels:
            prng = np.random.default_rng([seed, 2])
            perms = np.stack([prng.permutation(k) for _ in range(h)])
        meta = {"users": users, "genres": genres.tolist()}
        return Instance(task_id, mu, rewards, ctx, perms, meta)

    def context_at(self, t: int) -> np.ndarray | None:
        inst = self._inst
        if inst is None or inst.contexts is None:
            return None
        return np.asarray(inst.contexts[min(t, inst.horizon - 1)])

    # -- text ----------------------------------------------------------------------------

    @property
    def instruction(self) -> str:
        k, h = self.items, self.horizon
        movies = ", ".join(self.labels)
        if self._inst is not None and self.randomize_labels:  # the labels name other movies at every step
            movies_text = (f"The movies are {movies}; a label names another movie at every step, and each step "
                           "lists the movies' genre mix (0 = none, 1 = fully) under that step's labels.")
        elif self._inst is not None:
            movies_text = "The movies and their genre mix (0 = none, 1 = fully):\n" + self._genre_lines(0)
        else:
            movies_text = f"The movies are {movies}."
        if self.rationale == "ucb":
            output = (f"First write an upper confidence bound of every movie's reward for this user in one line, "
                      f"exactly as 'LinUCB values: {self.labels[0]}=..., {self.labels[1]}=..., ...', then one "
                      f"short sentence, then your answer on its own line as ACTION=X, where X is one of: {movies}.")
        else:
            output = ("Give a short rationale (one sentence), then your answer on its own line as ACTION=X, "
                      f"where X is one of: {movies}.")
        return (
            f"You are a movie recommender. At each of {h} steps a new user arrives, described by gender, age, "
            f"occupation, location and genre preferences (from -1 = dislikes to +1 = loves), and you "
            f"recommend one of {k} movies. The reward is how much the user liked it; it depends on the user "
            f"and the movie, plus noise. Your goal is to maximize the total reward over the {h} steps.\n"
            f"{movies_text}\n"
            f"At each step you see past users, recommendations and rewards as lines "
            f"Step=i User=... Action=a Reward=r.\n{output}"
        )

    def _user(self, t: int) -> dict[str, Any]:
        if self._inst is None:
            raise TurnRLError("contextual_bandit: call reset() first")
        users: list[dict[str, Any]] = self._inst.meta["users"]
        return users[min(t, len(users) - 1)]

    def _line(self, t: int, arm: int | None, reward: float, labels: Sequence[str]) -> str:
        u = self._user(t)
        prefs = ",".join(_signed(p) for p in u["preferences"])
        act = labels[arm] if arm is not None else "invalid"
        return (f"Step={t + 1} User={u['gender']}/{u['age']}/{u['occupation']}/{u['location']}/[{prefs}] "
                f"Action={act} Reward={reward:.2f}")

    def _genre_lines(self, t: int) -> str:
        """Each movie's genre mix under its label at step ``t`` (the labels change per step only
        with ``randomize_labels``)."""
        inst = self._inst
        assert inst is not None
        perm = range(len(self.labels)) if inst.perms is None else inst.perms[min(t, inst.horizon - 1)]
        genres = inst.meta["genres"]
        return "\n".join(f"{self.labels[j]}: " + ", ".join(f"{g} {v:.1f}" for g, v in zip(GENRES, genres[arm], strict=True))
                         for arm, j in enumerate(perm))

    def _question(self, t: int, horizon: int) -> str:
        u = self._user(t)
        prefs = ", ".join(f"{g} {_signed(p)}" for g, p in zip(GENRES, u["preferences"], strict=True))
        head = (f"Step {t + 1} of {horizon}. New user: {u['gender']}, {u['age']} years old, {u['occupation']} "
                f"from {u['location']}; genre preferences: {prefs}.")
        if self.randomize_labels:
            return f"{head}\nThe movies at this step:\n{self._genre_lines(t)}\nWhich movie do you recommend?"
        return f"{head} Which movie do you recommend?"

    def _info(self, *, arm: int | None = None, reward: float = 0.0, invalid: bool = False) -> dict[str, Any]:
        info = super()._info(arm=arm, reward=reward, invalid=invalid)
        if len(self.history) < self.horizon:
            info["user"] = dict(self._user(len(self.history)))
        return info

    def _success(self) -> bool:
        inst = self._inst
        assert inst is not None
        mu = inst.mu[: len(self.history)]
        random_regret = float((mu.max(axis=1) - mu.mean(axis=1)).sum())
        return bool(self._regret <= SUCCESS_SHARE * random_regret)


register("contextual_bandit", ContextualBandit)
