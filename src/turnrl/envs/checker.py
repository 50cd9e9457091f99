"""Check that an env keeps the text-environment contract (DESIGN 2.1).

Like Gymnasium's ``utils/env_checker.py``, but it collects problems instead of stopping at
the first one: :func:`check_env` returns a list of one-line problem descriptions (empty
when the contract holds), and :func:`assert_env` raises :class:`CheckFailed` with them.
An exception raised by an env method becomes a problem (``"step raised ValueError: ..."``),
never a crash of the checker.

What is checked:

- ``instruction`` is a non-empty string (read after a reset);
- ``task_ids`` of ``train`` / ``seen`` / ``unseen`` are non-empty lists of strings, and
  no two splits share an id; ``reset(options={"task_id": id})`` plays that task;
- ``reset`` returns ``(str, dict)`` with ``task_id`` in the dict, and two resets with the
  same seed give the same observation and info;
- ``step`` returns ``(str, float-like, bool, bool, dict)`` with ``task_id`` in the dict,
  and ``valid_actions`` (in info or from ``env.valid_actions()``) is a list of strings;
- expert episodes (an :class:`ExpertStep` each turn, its action among the valid actions
  when they are known) end within ``env.max_turns`` turns with ``won`` or ``success`` in
  the final info; episodes of random valid actions end too (where a state lists no actions, such as a
  shop's search page or ScienceWorld's free-text commands, the expert's action is played there);
- an expert episode replayed with the same seed and the same expert rng gives the same
  trajectory.
"""

from __future__ import annotations

import numbers
import random
from collections.abc import Callable
from typing import Any, TypeVar

from turnrl.envs.base import SPLITS, ExpertStep, TextEnv
from turnrl.errors import TurnRLError

T = TypeVar("T")


class CheckFailed(TurnRLError):
    """An env broke its contract; ``problems`` lists what :func:`check_env` found."""

    def __init__(self, env_name: str, problems: list[str]):
        self.problems = list(problems)
        super().__init__(f"env '{env_name}' failed {len(problems)} check(s): " + "; ".join(problems))


class _Stop(Exception):
    """Abandon the current check (the problem is already recorded)."""


def _bool_like(x: object) -> bool:
    return isinstance(x, bool) or type(x).__name__ == "bool_"  # numpy.bool_ too


def _float_like(x: object) -> bool:
    return isinstance(x, numbers.Real) and not _bool_like(x)


def _same(a: object, b: object) -> bool:
    try:
        return bool(a == b)
    except Exception:  # e.g. arrays whose == is elementwise
        return repr(a) == repr(b)


def _short(x: object, limit: int = 80) -> str:
    text = repr(x)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Checker:
    def __init__(self, env: TextEnv, episodes: int, seed: int):
        self.env = env
        self.episodes = episodes
        self.seed = seed
        self.problems: list[str] = []

    def problem(self, text: str) -> None:
        line = " ".join(text.split())
        if line not in self.problems:
            self.problems.append(line)

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call an env method; an exception becomes a problem and stops the current check."""
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            first = str(e).splitlines()[0] if str(e) else ""
            self.problem(f"{what} raised {type(e).__name__}: {first}")
            raise _Stop from None

    # -- pieces --------------------------------------------------------------------------

    def reset(self, what: str, **kwargs: Any) -> tuple[str, dict]:
        out = self.call(what, self.env.reset, **kwargs)
        if not (isinstance(out, tuple) and len(out) == 2):
            self.problem(f"{what} must return (observation, info), got {_short(out)}")
            raise _Stop
        obs, info = out
        if not isinstance(obs, str):
            self.problem(f"{what}: observation must be a str, got {type(obs).__name__}")
        if not isinstance(info, dict):
            self.problem(f"{what}: info must be a dict, got {type(info).__name__}")
            raise _Stop
        if "task_id" not in info:
            self.problem(f"{what}: info has no 'task_id'")
        self.valid_actions(what, info)
        return obs, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        out = self.call("step", self.env.step, action)
        if not (isinstance(out, tuple) and len(out) == 5):
            self.problem(f"step must return (obs, reward, terminated, truncated, info), got {_short(out)}")
            raise _Stop
        obs, reward, terminated, truncated, info = out
        if not isinstance(obs, str):
            self.problem(f"step: observation must be a str, got {type(obs).__name__}")
        if not _float_like(reward):
            self.problem(f"step: reward must be a number, got {type(reward).__name__}")
        for key, val in (("terminated", terminated), ("truncated", truncated)):
            if not _bool_like(val):
                self.problem(f"step: {key} must be a bool, got {type(val).__name__}")
        if not isinstance(info, dict):
            self.problem(f"step: info must be a dict, got {type(info).__name__}")
            raise _Stop
        if "task_id" not in info:
            self.problem("step: info has no 'task_id'")
        self.valid_actions("step", info)
        return obs, reward, bool(terminated), bool(truncated), info

    def valid_actions(self, what: str, info: dict) -> list[str] | None:
        """The valid actions now (from info, else from the env), checking their type."""
        acts = info.get("valid_actions")
        if acts is None:
            acts = self.call("valid_actions", self.env.valid_actions)
            what = "valid_actions()"
        else:
            what = f"{what}: info['valid_actions']"
        if acts is None:
            return None
        if not isinstance(acts, list) or not all(isinstance(a, str) for a in acts):
            self.problem(f"{what} must be a list of str, got {_short(acts)}")
            return None
        return acts

    def max_turns(self) -> int:
        n = self.call("max_turns", getattr, self.env, "max_turns", None)  # a property may raise
        if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
            self.problem(f"max_turns must be a positive int, got {_short(n)}")
            raise _Stop
        return n

    def episode(self, seed: int, policy: str, rng: random.Random) -> list[tuple[Any, ...]]:
        """Play one episode with the expert or random valid actions (the expert's where none are
        listed); return its trajectory."""
        obs, info = self.reset(f"reset(seed={seed})", seed=seed)
        trajectory: list[tuple[Any, ...]] = [(obs, info.get("task_id"))]
        limit = self.max_turns()
        for _ in range(limit):
            acts = self.valid_actions("step", info)
            if policy == "expert" or not acts:  # where no actions are listed (a search page, free text) too
                step = self.call("expert", self.env.expert, rng)
                if not isinstance(step, ExpertStep):
                    self.problem(f"expert must return an ExpertStep, got {_short(step)}")
                    raise _Stop
                if not isinstance(step.action, str) or not isinstance(step.thought, str):
                    self.problem(f"expert: action and thought must be str, got {_short(step)}")
                    raise _Stop
                if not step.thought.strip():
                    self.problem("expert: empty thought")
                if acts and step.action not in acts:
                    self.problem(f"expert action {step.action!r} is not among valid_actions {_short(acts)}")
                action = step.action
            else:
                action = rng.choice(acts)
            obs, reward, terminated, truncated, info = self.step(action)
            trajectory.append((action, obs, float(reward), terminated, truncated))
            if terminated or truncated:
                if "won" not in info and "success" not in info:
                    self.problem(
                        f"{policy} episode (seed {seed}): final info has neither 'won' nor 'success'"
                    )
                return trajectory
        self.problem(f"{policy} episode (seed {seed}) did not end within max_turns={limit} turns")
        raise _Stop

    # -- checks --------------------------------------------------------------------------

    def check_splits(self) -> None:
        ids: dict[str, list[str]] = {}
        for split in SPLITS:
            got = self.call(f"task_ids({split!r})", self.env.task_ids, split)
            if not isinstance(got, list) or not got or not all(isinstance(t, str) for t in got):
                self.problem(f"task_ids({split!r}) must be a non-empty list of str, got {_short(got)}")
                continue
            ids[split] = got
        for first, split in (("train", "seen"), ("train", "unseen"), ("seen", "unseen")):
            shared = set(ids.get(first, [])) & set(ids.get(split, []))
            if shared:
                self.problem(f"{first} and {split} share {len(shared)} task id(s), e.g. {sorted(shared)[0]!r}")
        for got in ids.values():
            _, info = self.reset(f"reset(task_id={got[0]!r})", seed=self.seed, options={"task_id": got[0]})
            if info.get("task_id") != got[0]:
                self.problem(f"reset(options={{'task_id': {got[0]!r}}}) played task {info.get('task_id')!r}")

    def check_reset(self) -> None:
        first = self.reset(f"reset(seed={self.seed})", seed=self.seed)
        instruction = self.call("instruction", getattr, self.env, "instruction")
        if not isinstance(instruction, str) or not instruction.strip():
            self.problem(f"instruction must be a non-empty str, got {_short(instruction)}")
        again = self.reset(f"reset(seed={self.seed})", seed=self.seed)
        if not _same(first[0], again[0]):
            self.problem(f"reset(seed={self.seed}) is not deterministic: the observation differs")
        elif not _same(first[1], again[1]):
            self.problem(f"reset(seed={self.seed}) is not deterministic: the info differs")

    def check_step(self) -> None:
        _, info = self.reset(f"reset(seed={self.seed})", seed=self.seed)
        acts = self.valid_actions("reset", info)
        action = acts[0] if acts else self.call("expert", self.env.expert, random.Random(0)).action
        self.step(action)

    def check_episodes(self) -> None:
        for i in range(self.episodes):
            seed = self.seed + i
            first = self.episode(seed, "expert", random.Random(seed))
            if i == 0:
                again = self.episode(seed, "expert", random.Random(seed))
                if not _same(first, again):
                    self.problem(
                        f"expert episode (seed {seed}) is not reproducible with the same seed and rng"
                    )
            self.episode(seed, "random", random.Random(seed))

    def run(self) -> list[str]:
        for check in (self.check_reset, self.check_splits, self.check_step, self.check_episodes):
            try:
                check()
            except _Stop:
                pass
        return self.problems


def _resolve(env_or_name: TextEnv | str, kwargs: dict[str, Any]) -> tuple[TextEnv | None, str, list[str]]:
    if isinstance(env_or_name, str):
        from turnrl.envs import make

        try:
            return make(env_or_name, **kwargs), env_or_name, []
        except Exception as e:
            return None, env_or_name, [f"make raised {type(e).__name__}: {e}"]
    if kwargs:
        raise TurnRLError("check_env: keyword options apply only when the env is given by name")
    return env_or_name, getattr(env_or_name, "name", "") or type(env_or_name).__name__, []


def check_env(env_or_name: TextEnv | str, *, episodes: int = 3, seed: int = 0, **kwargs: Any) -> list[str]:
    """Check an env (or ``make(name, **kwargs)``) against the contract; return the problems.

    ``episodes`` expert episodes and as many random-action episodes are played from seeds
    ``seed, seed + 1, ...``. An empty list means the contract holds.
    """
    env, _, problems = _resolve(env_or_name, kwargs)
    if env is None:
        return problems
    return _run_checker(env, env_or_name, episodes, seed)


def _run_checker(env: TextEnv, given: TextEnv | str, episodes: int, seed: int) -> list[str]:
    """The checker's problems; an env built here from a name is closed after (its worker, its JVM)."""
    try:
        return _Checker(env, episodes, seed).run()
    finally:
        if isinstance(given, str):
            env.close()


def assert_env(env_or_name: TextEnv | str, *, episodes: int = 3, seed: int = 0, **kwargs: Any) -> None:
    """Like :func:`check_env`, but raise :class:`CheckFailed` when there are problems."""
    env, name, problems = _resolve(env_or_name, kwargs)
    if env is not None:
        problems = _run_checker(env, env_or_name, episodes, seed)
    if problems:
        raise CheckFailed(name, problems)


__all__ = ["CheckFailed", "assert_env", "check_env"]
