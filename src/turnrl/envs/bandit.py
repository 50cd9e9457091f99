"""Multi-armed bandits as text (DESIGN 4; the RLFT paper's bandits, seed 004).

Each step the agent pulls one of ``arms`` arms and receives a reward; an episode lasts
``horizon`` steps. The prompt follows the paper: the instruction (what the arms are, the
goal), an output instruction (a short rationale, then ``ACTION=X``), and the last
``context`` steps as ``Step=i Action=a Reward=r`` lines.

Options (keyword-only; a bad value is a one-line :class:`~turnrl.errors.TurnRLError`):

- ``arms`` (10): 2..20 (the paper uses 5, 10 and 20);
- ``dist`` (``gaussian``): ``gaussian`` -- arm means ~ U(0, 1), rewards N(mean, sigma)
  with sigma 0.1 / 1 / 3 for noise ``low`` / ``medium`` / ``high``, shown with two
  decimals; ``bernoulli`` -- rewards 0 or 1, one best arm with success probability
  0.5 + gap/2 and all others 0.5 − gap/2, gap 0.5 / 0.2 / 0.1 for ``low`` / ``medium`` /
  ``high`` (the "easy" and "hard" instances of Krishnamurthy et al. 2024 are gaps 0.5
  and 0.2);
- ``noise`` (``medium``): ``low``, ``medium``, ``high``;
- ``variant`` (``button``): ``button`` -- coloured buttons (``blue``, ``green``, ...);
  ``continuous`` -- arms numbered ``0`` .. ``arms-1``;
- ``horizon`` (50): steps per episode, 1..1000;
- ``context`` (50): how many of the last steps the observation shows (0..1000);
- ``summary`` (false): append per-arm counts and mean rewards (the "context summary"
  exploration aid); ``best`` appends them pre-digested: the tried arm of the highest
  mean reward, then the untried arms (``Best so far: red 0.83 (3x). Untried: green,
  yellow.``), so that acting greedily is copying one label and exploring is copying an
  untried one -- for models too small to take an argmax over ten printed means (the tiny
  model's greedy-agents study); ``best-kv`` writes the same line as ``key=value`` pairs
  (``Best=red 0.83 (3x). Untried=green,yellow.``), each label exactly as a reply writes its
  action (``ACTION=red``): a byte-level tokenizer reads `` red`` after a space and ``red``
  after ``=`` as two different tokens, so a small model copies the label more easily;
- ``randomize_labels`` (false): shuffle which label names which arm at every step; the
  whole shown history uses the current step's labels (the "context randomization" aid);
- ``rationale`` (``short``): ``short`` asks for a short rationale; ``ucb`` asks the model
  to write its UCB value of every arm first, in the block the knowing-doing diagnostic
  reads (``UCB values: blue=1.32, green=inf, ...``), computed as
  mean + ``ucb_c``·sqrt(ln t / n);
- ``ucb_c`` (1.0): that constant, also the expert's.

Tasks. A task id fixes the instance (arm means, every reward, label permutations):
``bandit-<seed>`` (train: seeds 0..999; seen: 100000..100199) and, out of distribution,
``bandit-hard-<seed>`` (unseen: 200000..200199) -- harder instances whose arm means are
squeezed into U(0.25, 0.75) (Gaussian) or whose gap is halved (Bernoulli). Rewards are
drawn up front into a [horizon, arms] table (:meth:`Bandit.instance`), so a task's reward
for pulling arm ``a`` at step ``t`` does not depend on earlier choices, and the table of a
longer horizon starts with the table of a shorter one.

Info: ``task_id``, ``valid_actions`` (the labels), ``turn``, ``arm`` (the arm index just
pulled), ``reward``, ``invalid``, ``means`` (every arm's mean, for metrics), ``best_arm``,
``labels`` (the label of each arm at the next step), ``regret`` (cumulative expected
regret so far); after a step, ``expected_reward`` (the pulled arm's mean at that step, 0 for an
unknown label: the expected value of the step's reward, which ``turnrl train ppo
reward_source=expected`` trains on). An episode ends (``terminated``) after ``horizon`` steps; it is a success
when the arm pulled most often is the best arm. An unknown label pulls nothing, pays 0 and
counts as a step (``info["invalid"]``); its regret is the worst arm's (the contextual bandit's means
can all be negative, where paying 0 would beat every arm; the sampler never sends one: it plays a
valid action for an invalid reply).

The expert is UCB with ``c = ucb_c`` (ties broken with the caller's rng) and its templated
rationale with its UCB values.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any, Literal, cast

import numpy as np

from turnrl.bandits.algorithms import Setting, make_algorithm
from turnrl.bandits.scripted import ScriptedAgent
from turnrl.bandits.simulate import Instance, Instances
from turnrl.envs import register
from turnrl.envs.base import ExpertStep, TextEnv
from turnrl.errors import TurnRLError

COLOURS = (
    "blue", "green", "red", "yellow", "purple", "orange", "pink", "brown", "black", "white",
    "gray", "cyan", "magenta", "teal", "lime", "navy", "maroon", "olive", "gold", "silver",
)  # fmt: skip
NOISE_LEVELS = ("low", "medium", "high")
GAUSSIAN_SIGMA = {"low": 0.1, "medium": 1.0, "high": 3.0}
BERNOULLI_GAP = {"low": 0.5, "medium": 0.2, "high": 0.1}
#: the longest ``horizon`` an instance may have
MAX_HORIZON = 1000

# ---------------------------------------------------------------------------------------
# option checks shared by the bandit envs


def check_choice(env: str, key: str, value: Any, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise TurnRLError(f"{env}: {key} must be one of {', '.join(choices)} (got {value!r})")
    return value


def check_int(env: str, key: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise TurnRLError(f"{env}: {key} must be an integer from {lo} to {hi} (got {value!r})")
    return value


def check_bool(env: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TurnRLError(f"{env}: {key} must be true or false (got {value!r})")
    return value


def check_number(env: str, key: str, value: Any, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise TurnRLError(f"{env}: {key} must be a number in [{lo:g}, {hi:g}] (got {value!r})")
    return float(value)


def as_bandit(env: Any, who: str) -> BanditEnvBase:
    """``env`` if it is one of the bandit envs, else a one-line error naming ``who``."""
    if isinstance(env, BanditEnvBase):
        return env
    inner = getattr(env, "env_name", None)  # an env run in a worker process (turnrl.envs.workers)
    if inner in ("bandit", "contextual_bandit"):
        raise TurnRLError(f"{who} reads the {inner}'s arms in this process: run it without workers (--workers)")
    raise TurnRLError(f"{who} needs a bandit env (bandit, contextual_bandit), got '{inner or getattr(env, 'name', env)}'")


def fmt_reward(r: float, dist: str = "gaussian") -> str:
    return str(int(round(r))) if dist == "bernoulli" else f"{r:.2f}"


def arm_stats(history: Sequence[tuple[int | None, float]], arms: int) -> tuple[np.ndarray, np.ndarray]:
    """Pull counts and reward sums per arm of a history of ``(arm, reward)`` pairs (an
    invalid pull, arm None, counts nowhere)."""
    counts, sums = np.zeros(arms), np.zeros(arms)
    for arm, r in history:
        if arm is not None:
            counts[arm] += 1
            sums[arm] += r
    return counts, sums


def best_tried(counts: np.ndarray, sums: np.ndarray) -> int:
    """The tried arm of the highest mean reward (ties: the lowest index); -1 if none."""
    tried = [i for i in range(len(counts)) if counts[i]]
    return min(tried, key=lambda i: (-sums[i] / counts[i], i)) if tried else -1


#: the ``summary`` values that name the best tried arm and the untried ones
BEST_SUMMARIES = ("best", "best-kv")


def best_summary(counts: np.ndarray, sums: np.ndarray, labels: Sequence[str], kv: bool = False) -> str:
    """``summary=best``'s line: the best tried arm (the greedy choice), then the untried arms;
    ``kv`` (``summary=best-kv``) writes them as ``key=value`` pairs."""
    b = best_tried(counts, sums)
    untried = [labels[i] for i in range(len(counts)) if not counts[i]] or ["none"]
    if b < 0:  # only invalid pulls so far: no tried arm to name
        if kv:
            return f"Best=none. Untried={','.join(untried)}."
        return f"Best so far: none. Untried: {', '.join(untried)}."
    if kv:
        return f"Best={labels[b]} {sums[b] / counts[b]:.2f} ({int(counts[b])}x). Untried={','.join(untried)}."
    return f"Best so far: {labels[b]} {sums[b] / counts[b]:.2f} ({int(counts[b])}x). Untried: {', '.join(untried)}."


class BanditEnvBase(TextEnv):
    """What the plain and the contextual bandit share: the step loop, history, labels,
    rendering of ``Step=i Action=a Reward=r`` lines, splits, the scripted expert.

    Subclasses define ``labels`` (arm index -> label), ``setting``, :meth:`instance`,
    :meth:`_line`, :meth:`_question`, ``_split_ids`` and ``_task_re``.
    """

    noun = "arm"
    _task_re: re.Pattern[str]
    _split_ids: dict[str, tuple[str, ...]]
    _task_format = ""

    def __init__(self, *, horizon: int, context: int, summary: bool | str, randomize_labels: bool, rationale: str,
                 ucb_c: float, expert: str) -> None:
        env = self.name
        self.horizon = check_int(env, "horizon", horizon, 1, MAX_HORIZON)
        self.context = check_int(env, "context", context, 0, 1000)
        if not (isinstance(summary, bool) or summary in BEST_SUMMARIES):
            raise TurnRLError(f"{env}: summary must be true, false, best or best-kv (got {summary!r})")
        #: False, "counts" (``summary=true``), "best" or "best-kv"
        self.summary = cast(Literal[False, "counts", "best", "best-kv"],
                            summary if summary in BEST_SUMMARIES else "counts" if summary else False)
        self.randomize_labels = check_bool(env, "randomize_labels", randomize_labels)
        self.rationale = check_choice(env, "rationale", rationale, ("short", "ucb"))
        self.ucb_c = check_number(env, "ucb_c", ucb_c, 0.0, 100.0)
        self.max_turns = self.horizon
        self.labels: list[str] = []
        self.setting = Setting(arms=1)
        self.history: list[tuple[int | None, float]] = []
        #: incremented at every reset (scripted agents key their cached state on it)
        self.episode = 0
        self._inst: Instance | None = None
        self._task_id = ""
        self._regret = 0.0
        #: the scripted expert (``expert`` names its algorithm; it reports UCB values with ``ucb_c``)
        self._expert = ScriptedAgent(make_algorithm(f"{expert}:c={self.ucb_c:g}"))

    # -- to define in subclasses ---------------------------------------------------------

    def instance(self, task_id: str, horizon: int | None = None) -> Instance:
        raise NotImplementedError

    def _line(self, t: int, arm: int | None, reward: float, labels: Sequence[str]) -> str:
        raise NotImplementedError

    def _question(self, t: int, horizon: int) -> str:
        raise NotImplementedError

    def context_at(self, t: int) -> np.ndarray | None:
        """The context (user features) of step ``t``; None for a plain bandit."""
        return None

    # -- contract ------------------------------------------------------------------------

    def task_ids(self, split: str) -> list[str]:
        if split not in self._split_ids:
            raise TurnRLError(f"{self.name}: unknown split {split!r}; choose from: {', '.join(self._split_ids)}")
        return list(self._split_ids[split])

    def parse_task(self, task_id: Any) -> tuple[bool, int]:
        """``(out_of_distribution, seed)`` of a task id; malformed ids are one-line errors."""
        m = self._task_re.fullmatch(task_id) if isinstance(task_id, str) else None
        if m is None:
            raise TurnRLError(f"{self.name}: unknown task id {task_id!r}; {self._task_format}")
        return bool(m.group(1)), int(m.group(2))

    def instances(self, task_ids: Sequence[str], horizon: int | None = None) -> Instances:
        """Several tasks stacked, for vectorised simulation and metrics."""
        return Instances.stack([self.instance(t, horizon) for t in task_ids], self.setting)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        task_id = self.choose_task(seed, options)
        self._inst = self.instance(task_id)
        self._task_id = task_id
        self.history = []
        self._regret = 0.0
        self.episode += 1
        return self.render(), self._info()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        inst = self._running()
        labels = self.labels_now()
        text = action.strip().lower() if isinstance(action, str) else ""
        lookup = {lab.lower(): i for i, lab in enumerate(labels)}
        arm = lookup.get(text)
        t = len(self.history)
        reward = float(inst.rewards[t, arm]) if arm is not None else 0.0
        expected = float(inst.mu[t, arm]) if arm is not None else 0.0
        # an invalid step pulls nothing (reward 0) and is charged the regret of the worst arm: never less
        # (contextual means can all be negative, where 0 would beat every arm)
        self._regret += float(inst.mu[t].max()) - (expected if arm is not None else float(inst.mu[t].min()))
        self.history.append((arm, reward))
        done = len(self.history) >= self.horizon
        info = self._info(arm=arm, reward=reward, invalid=arm is None)
        info["expected_reward"] = expected
        if done:
            won = self._success()
            info.update(won=won, success=won)
        obs = self.render()
        if arm is None:
            obs = f"Invalid action {str(action).strip()!r}: choose one of {', '.join(self.labels)}.\n" + obs
        return obs, reward, done, False, info

    def valid_actions(self) -> list[str]:
        if self._inst is None or len(self.history) >= self.horizon:
            return []
        return list(self.labels)

    def expert(self, rng: random.Random) -> ExpertStep:
        """The scripted expert's arm, with its rationale (UCB values first)."""
        self._running()
        d = self._expert.decide(self, np.random.default_rng(rng.getrandbits(64)))
        return ExpertStep(action=d.label, thought=d.thought)

    # -- views ---------------------------------------------------------------------------

    def labels_now(self) -> list[str]:
        """The label of each arm at the current step (they change per step only with
        ``randomize_labels``)."""
        inst = self._inst
        if inst is None or inst.perms is None:
            return list(self.labels)
        t = min(len(self.history), inst.horizon - 1)
        return [self.labels[j] for j in inst.perms[t]]

    @property
    def t(self) -> int:
        """Steps taken in this episode."""
        return len(self.history)

    def render(self) -> str:
        """The observation now: recent history, optional summary, the question (or the end)."""
        return self.render_history(self.history, self.labels_now(), horizon=self.horizon, context=self.context)

    def render_history(self, history: Sequence[tuple[int | None, float]], labels: Sequence[str], *,
                       horizon: int, context: int | None) -> str:
        """Render any history (``(arm, reward)`` pairs) with ``labels``; ``context`` limits
        the steps shown (None: all). Also used to build diagnostic prompts."""
        t = len(history)
        keep = t if context is None else min(t, context)
        lines: list[str] = []
        if t == 0:
            lines.append(f"No {self.noun}s chosen yet.")
        elif keep == 0:
            lines.append("(Earlier steps are not shown.)")
        elif keep < t:
            lines.append(f"(Showing the last {keep} of {t} steps.)")
        for i in range(t - keep, t):
            arm, reward = history[i]
            lines.append(self._line(i, arm, reward, labels))
        if self.summary and t:
            lines.append(self._summary(history, labels))
        if t >= horizon:
            total = sum(r for _, r in history)
            lines.append(f"All {horizon} steps are done. Total reward: {total:.2f}.")
        else:
            lines.append(self._question(t, horizon))
        return "\n".join(lines)

    def _summary(self, history: Sequence[tuple[int | None, float]], labels: Sequence[str]) -> str:
        counts, sums = arm_stats(history, len(labels))
        if self.summary in BEST_SUMMARIES:
            return best_summary(counts, sums, labels, kv=self.summary == "best-kv")
        by_label = {lab: i for i, lab in enumerate(labels)}
        parts = []
        for lab in self.labels:
            i = by_label[lab]
            parts.append(f"{lab} {int(counts[i])}x mean {sums[i] / counts[i]:.2f}" if counts[i] else f"{lab} 0x")
        return "Summary: " + "; ".join(parts) + "."

    # -- internals -----------------------------------------------------------------------

    def _running(self) -> Instance:
        return self.running(self._inst, over=len(self.history) >= self.horizon)

    def _success(self) -> bool:
        """Whether the finished episode counts as a success (the most pulled arm is the best)."""
        inst = self._inst
        assert inst is not None
        counts = np.bincount([a for a, _ in self.history if a is not None], minlength=self.setting.arms)
        best = int(np.argmax(inst.mu[0]))
        return bool(counts[best] > 0 and counts[best] >= counts.max())

    def _info(self, *, arm: int | None = None, reward: float = 0.0, invalid: bool = False) -> dict[str, Any]:
        inst = self._inst
        assert inst is not None
        t = len(self.history)
        done = t >= self.horizon
        row = inst.mu[min(t, inst.horizon - 1)]
        return {
            "task_id": self._task_id,
            "valid_actions": [] if done else list(self.labels),
            "turn": t,
            "arm": arm,
            "reward": reward,
            "invalid": invalid,
            "means": [float(v) for v in row],
            "best_arm": int(np.argmax(row)),
            "labels": self.labels_now(),
            "regret": round(self._regret, 6),
        }


# ---------------------------------------------------------------------------------------
# The plain multi-armed bandit

_INSTRUCTION = """\
You are a bandit algorithm in a room with {k} {things} labeled {labels}. Each {thing} is \
associated with a {family} distribution with a fixed but unknown mean; the means of the \
{things} can differ. When you {verb} a {thing}, you get a reward drawn from its \
distribution. You have {h} time steps, and at each step you can choose any {thing} and \
receive its reward. Your goal is to maximize the total reward over the {h} time steps.
At each step you see your past choices and rewards as lines Step=i Action=a Reward=r.
{output}"""

_OUTPUT_SHORT = "Give a short rationale (one sentence), then your answer on its own line as ACTION=X, \
where X is one of: {labels}."
_OUTPUT_UCB = "First write the UCB value of every {thing} in one line, exactly as \
'UCB values: {example}' (UCB value = mean reward + {c:g} * sqrt(ln(t) / n), where t is the \
number of steps so far and n the number of times that {thing} was chosen; inf if it was \
never chosen), then one short sentence, then your answer on its own line as ACTION=X, where \
X is one of: {labels}."


class Bandit(BanditEnvBase):
    """A Gaussian or Bernoulli multi-armed bandit with button or numbered-arm text (see
    the module doc)."""

    name = "bandit"
    _task_re = re.compile(r"bandit-(hard-)?([0-9]+)")
    _task_format = "expected 'bandit-<seed>' or 'bandit-hard-<seed>', e.g. 'bandit-7'"
    _split_ids = {
        "train": tuple(f"bandit-{s}" for s in range(1000)),
        "seen": tuple(f"bandit-{s}" for s in range(100000, 100200)),
        "unseen": tuple(f"bandit-hard-{s}" for s in range(200000, 200200)),
    }

    def __init__(
        self,
        *,
        arms: int = 10,
        dist: str = "gaussian",
        noise: str = "medium",
        variant: str = "button",
        horizon: int = 50,
        context: int = 50,
        summary: bool | str = False,
        randomize_labels: bool = False,
        rationale: str = "short",
        ucb_c: float = 1.0,
    ) -> None:
        self.arms = check_int("bandit", "arms", arms, 2, len(COLOURS))
        self.dist = check_choice("bandit", "dist", dist, ("gaussian", "bernoulli"))
        self.noise = check_choice("bandit", "noise", noise, NOISE_LEVELS)
        self.variant = check_choice("bandit", "variant", variant, ("button", "continuous"))
        super().__init__(horizon=horizon, context=context, summary=summary, randomize_labels=randomize_labels,
                         rationale=rationale, ucb_c=ucb_c, expert="ucb")
        self.noun = "button" if self.variant == "button" else "arm"
        self.labels = list(COLOURS[: self.arms]) if self.variant == "button" else [str(i) for i in range(self.arms)]
        sigma = GAUSSIAN_SIGMA[self.noise] if self.dist == "gaussian" else 0.5
        self.setting = Setting(arms=self.arms, dim=1, dist=self.dist, sigma=sigma)

    @property
    def instruction(self) -> str:
        thing = self.noun
        labels = ", ".join(self.labels)
        if self.rationale == "ucb":
            example = ", ".join(f"{lab}=..." for lab in self.labels[:3]) + ", ..."
            output = _OUTPUT_UCB.format(thing=thing, example=example, c=self.ucb_c, labels=labels)
        else:
            output = _OUTPUT_SHORT.format(labels=labels)
        return _INSTRUCTION.format(
            k=self.arms, things=thing + "s", thing=thing, labels=labels, h=self.horizon,
            family="Gaussian" if self.dist == "gaussian" else "Bernoulli",
            verb="press" if self.variant == "button" else "pull", output=output,
        )

    def instance(self, task_id: str, horizon: int | None = None) -> Instance:
        """The arm means, the [horizon, arms] reward table and the label permutations of a task."""
        hard, seed = self.parse_task(task_id)
        h = self.horizon if horizon is None else horizon
        k = self.arms
        rng_means = np.random.default_rng([seed, 0])
        if self.dist == "gaussian":
            means = rng_means.uniform(0.25, 0.75, k) if hard else rng_means.uniform(0.0, 1.0, k)
            noise = np.random.default_rng([seed, 1]).standard_normal((h, k))
            rewards = np.round(means + GAUSSIAN_SIGMA[self.noise] * noise, 2)
        else:
            gap = BERNOULLI_GAP[self.noise] / (2 if hard else 1)
            means = np.full(k, 0.5 - gap / 2)
            means[int(rng_means.integers(k))] = 0.5 + gap / 2
            u = np.random.default_rng([seed, 1]).random((h, k))
            rewards = (u < means).astype(float)
        perms = None
        if self.randomize_labels:
            rng_perm = np.random.default_rng([seed, 2])
            perms = np.stack([rng_perm.permutation(k) for _ in range(h)])
        return Instance(task_id, np.broadcast_to(means, (h, k)).copy(), rewards, None, perms)

    def _line(self, t: int, arm: int | None, reward: float, labels: Sequence[str]) -> str:
        act = labels[arm] if arm is not None else "invalid"
        return f"Step={t + 1} Action={act} Reward={fmt_reward(reward, self.dist)}"

    def _question(self, t: int, horizon: int) -> str:
        verb = "press" if self.variant == "button" else "pull"
        return f"Step {t + 1} of {horizon}. Which {self.noun} do you {verb}?"


register("bandit", Bandit)
