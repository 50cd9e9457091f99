"""ScienceWorld (Wang et al., 2022) through the ``scienceworld`` package, which runs the
simulator in a Java process (optional extra: ``pip install 'turnrl[scienceworld]'`` and a
Java runtime >= 8 on the PATH; without them the env is not registered).

Tasks and splits. All 30 tasks, every variation: ``train`` = the package's train
variations, ``seen`` = its dev variations, ``unseen`` = its test variations, as ETO and
DMPO evaluate. A task id is ``<task name>-v<variation>`` (``boil-v21``); each split lists
its ids round-robin over tasks (variation 1 of every task, then variation 2...), so the
first N episodes of a split cover every task. Unknown task names or variations (a
variation outside its task's range) are one-line errors. ``task_names`` restricts the env
to some tasks; ``simplification`` passes ScienceWorld's simplifications (``easy``,
``openDoors``...). ETO evaluates on the same dev / test split but on 24 tasks, at most 10
test variations each, with ``easy`` and its own step limits (``task_names``,
``simplification``, ``max_turns`` match that).

Episodes. The first observation is ``look around``; the task description is part of the
instruction. An action is any ScienceWorld command (``open door to kitchen``, ``focus on
the water``, ``0`` to answer an ambiguity question). The reward of a step is the change of
``max(score, 0) / 100`` from 0 at reset, so an episode's return is its final score / 100 in
[0, 1] (the first step's reward includes the score the task starts with: 8 for the find-*
tasks after ``look around``).
Episodes end (terminated) when the task completes (``success``) or fails (a negative
score, e.g. focusing on the wrong object), and are truncated after the task's step limit
(:data:`STEP_LIMITS`, about 1.5x its longest gold path seen, and never below the gold path
of the episode plus 10 once that path is known: generated for the expert, in this process or
in the ``gold_dir`` cache; ``reset`` reads the cache, so every player of a known task gets the
same limit).

Valid actions. ScienceWorld's parser accepts many phrasings of an action, and the
action-object combinations the package lists leave out a third of its own gold actions
(other referents for the same objects), so ``valid_actions`` is None (free text) and the
sampler never overrides an action; with ``admissible_actions=True`` the package's list is
put in ``info["admissible_actions"]`` of ``reset`` and of every step as a hint (it costs more
than the step itself).

Expert. The package's gold action sequence, played from the start of the episode, with
a templated thought per action (``I need the metal pot, so I pick it up.``). Gold paths
are generated lazily (only when the expert is asked) and cached in memory and under
``$TURNRL_HOME/scienceworld/gold`` (``gold_cache=False`` turns the disk cache off),
because the package's generator does not always produce the same path twice (it picks
among equivalent routes), and a cached path keeps expert episodes reproducible. The
expert follows the path by position, so it is meaningful only while every earlier action
was the expert's. A few gold paths stop short of a full score (see docs/environments.md).

Java failures. Every call into Java runs with a timeout (``step_timeout``,
``load_timeout``). When a call times out or the Java process dies, the process is killed
and a fresh one is started for the next episode; the running episode ends at once
(truncated, ``success=False``, ``info["outcome"] = "env_error"``, the reason in
``info["error"]`` and in the observation), so a collection records it as a failed episode
and goes on. A failure while loading a task is retried once on a fresh process before it
is raised.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import shutil
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, TypeVar

from turnrl.envs import register
from turnrl.envs.base import ExpertStep, TextEnv
from turnrl.errors import TurnRLError, did_you_mean

T = TypeVar("T")

#: (ScienceWorld task id, task name, end of train variations, end of dev variations, number
#: of variations): the package's splits are contiguous ranges [0, train) [train, dev) [dev, n).
TASKS: tuple[tuple[str, str, int, int, int], ...] = (
    ("1-1", "boil", 14, 21, 30),
    ("1-2", "melt", 14, 21, 30),
    ("1-3", "freeze", 14, 21, 30),
    ("1-4", "change-the-state-of-matter-of", 14, 21, 30),
    ("2-1", "use-thermometer", 270, 405, 540),
    ("2-2", "measure-melting-point-known-substance", 218, 327, 436),
    ("2-3", "measure-melting-point-unknown-substance", 150, 225, 300),
    ("3-1", "power-component", 10, 15, 20),
    ("3-2", "power-component-renewable-vs-nonrenewable-energy", 10, 15, 20),
    ("3-3", "test-conductivity", 450, 675, 900),
    ("3-4", "test-conductivity-of-unknown-substances", 300, 450, 600),
    ("4-1", "find-living-thing", 150, 225, 300),
    ("4-2", "find-non-living-thing", 150, 225, 300),
    ("4-3", "find-plant", 150, 225, 300),
    ("4-4", "find-animal", 150, 225, 300),
    ("5-1", "grow-plant", 62, 93, 126),
    ("5-2", "grow-fruit", 62, 93, 126),
    ("6-1", "chemistry-mix", 16, 24, 32),
    ("6-2", "chemistry-mix-paint-secondary-color", 18, 27, 36),
    ("6-3", "chemistry-mix-paint-tertiary-color", 18, 27, 36),
    ("7-1", "lifespan-longest-lived", 62, 93, 125),
    ("7-2", "lifespan-shortest-lived", 62, 93, 125),
    ("7-3", "lifespan-longest-lived-then-shortest-lived", 62, 93, 125),
    ("8-1", "identify-life-stages-1", 6, 9, 14),
    ("8-2", "identify-life-stages-2", 4, 6, 10),
    ("9-1", "inclined-plane-determine-angle", 84, 126, 168),
    ("9-2", "inclined-plane-friction-named-surfaces", 692, 1038, 1386),
    ("9-3", "inclined-plane-friction-unnamed-surfaces", 80, 120, 162),
    ("10-1", "mendelian-genetics-known-plant", 60, 90, 120),
    ("10-2", "mendelian-genetics-unknown-plant", 240, 360, 480),
)
TASK_NAMES = tuple(t[1] for t in TASKS)
_BY_NAME = {t[1]: t for t in TASKS}

#: Agent turns per episode, per task: about 1.5x the longest gold path found in a sample of
#: variations, rounded up to 10, at least 30 (boil: 160, above boil-v20's 142-action gold path + 10).
STEP_LIMITS: dict[str, int] = {
    "boil": 160, "melt": 100, "freeze": 130, "change-the-state-of-matter-of": 100,
    "use-thermometer": 40, "measure-melting-point-known-substance": 120,
    "measure-melting-point-unknown-substance": 150, "power-component": 30,
    "power-component-renewable-vs-nonrenewable-energy": 50, "test-conductivity": 50,
    "test-conductivity-of-unknown-substances": 50, "find-living-thing": 30, "find-non-living-thing": 30,
    "find-plant": 30, "find-animal": 30, "grow-plant": 120, "grow-fruit": 160, "chemistry-mix": 60,
    "chemistry-mix-paint-secondary-color": 30, "chemistry-mix-paint-tertiary-color": 40,
    "lifespan-longest-lived": 30, "lifespan-shortest-lived": 30,
    "lifespan-longest-lived-then-shortest-lived": 30, "identify-life-stages-1": 70,
    "identify-life-stages-2": 30, "inclined-plane-determine-angle": 120,
    "inclined-plane-friction-named-surfaces": 170, "inclined-plane-friction-unnamed-surfaces": 290,
    "mendelian-genetics-known-plant": 230, "mendelian-genetics-unknown-plant": 220,
}
SIMPLIFICATIONS = ("easy", "noElectricalAction", "openContainers", "openDoors", "selfWateringFlowerPots",
                   "teleportAction")
_ELECTRICAL = ("power-component", "test-conductivity")
NO_MATCH = "No known action matches that input."

INSTRUCTION = """\
You are an agent in ScienceWorld, a text-based virtual world for elementary science \
experiments. Complete the task by typing one command per turn, for example: look around, \
look at OBJ, open OBJ, close OBJ, go to LOCATION, pick up OBJ, put down OBJ, move OBJ to OBJ, \
pour OBJ into OBJ, mix OBJ, activate OBJ, deactivate OBJ, use OBJ on OBJ, connect OBJ to OBJ, \
focus on OBJ (only on the object the task names; focusing on a wrong one fails the task), \
wait, wait1, inventory. When the game asks which object you mean, answer with its number.
Respond in exactly this format:
Thought: <one short sentence>
Action: <command>"""


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("scienceworld")
    except PackageNotFoundError:
        return "unknown"


def available() -> bool:
    """Whether the ``scienceworld`` package and a ``java`` executable are installed."""
    return importlib.util.find_spec("scienceworld") is not None and shutil.which("java") is not None


class JavaFailure(Exception):
    """A call into the ScienceWorld Java process timed out or the process died."""


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


class JavaProcess:
    """One ScienceWorld simulator (one Java process) whose calls run with a timeout."""

    def __init__(self, start_timeout: float):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scienceworld")
        self.env: Any = None
        self.alive = False
        from scienceworld import ScienceWorldEnv

        self.env = self.call(lambda: ScienceWorldEnv("", envStepLimit=10**9), start_timeout, "starting Java")
        self.alive = True

    @property
    def pid(self) -> int | None:
        proc = getattr(getattr(self.env, "_gateway", None), "java_process", None)
        return getattr(proc, "pid", None)

    def call(self, fn: Callable[[], T], timeout: float, what: str) -> T:
        """Run ``fn`` on the worker thread; a timeout or any error kills the process and
        raises :class:`JavaFailure`."""
        future = self._pool.submit(fn)
        try:
            return future.result(timeout=timeout)
        except FutureTimeout:
            self.kill()
            raise JavaFailure(f"{what} timed out after {timeout:g} s") from None
        except Exception as e:
            self.kill()
            raise JavaFailure(f"{what} failed ({_first_line(e)})") from None

    def kill(self) -> None:
        """Kill the Java process (idempotent) and abandon the worker thread."""
        self.alive = False
        proc = getattr(getattr(self.env, "_gateway", None), "java_process", None)
        if proc is not None and proc.poll() is None:
            proc.kill()
            try:
                proc.wait(timeout=10)
            except Exception:  # pragma: no cover - a zombie the OS reaps later
                pass
        gateway = getattr(self.env, "_gateway", None)
        if gateway is not None:
            threading.Thread(target=_quiet_shutdown, args=(gateway,), daemon=True).start()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def close(self, timeout: float = 10.0) -> None:
        if self.alive and self.env is not None:
            try:
                self.call(self.env.close, timeout, "closing Java")
            except JavaFailure:
                pass
        self.kill()


def _quiet_shutdown(gateway: Any) -> None:
    try:
        gateway.shutdown()
    except Exception:
        pass


# ---------------------------------------------------------------------------------------
# Tasks


def parse_task(task_id: object) -> tuple[str, int]:
    """``(task name, variation)`` of ``<task>-v<variation>``; bad ids raise TurnRLError."""
    m = re.fullmatch(r"(.+)-v([0-9]+)", task_id) if isinstance(task_id, str) else None
    if m is None:
        raise TurnRLError(f"scienceworld: unknown task id {task_id!r}; expected '<task name>-v<variation>', "
                          "e.g. 'boil-v21'")
    name, var = m.group(1), int(m.group(2))
    if name not in _BY_NAME:
        raise TurnRLError(f"scienceworld: unknown task {name!r}{did_you_mean(name, TASK_NAMES)}; "
                          f"choose from: {', '.join(TASK_NAMES)}")
    n = _BY_NAME[name][4]
    if var >= n:
        raise TurnRLError(f"scienceworld: task {name!r} has variations 0-{n - 1}, not {var}")
    return name, var


def split_of(name: str, variation: int) -> str:
    _, _, train, dev, _ = _BY_NAME[name]
    return "train" if variation < train else ("seen" if variation < dev else "unseen")


def _split_ids(names: Sequence[str], split: str) -> list[str]:
    ranges = []
    for name in names:
        _, _, train, dev, n = _BY_NAME[name]
        ranges.append((name, {"train": range(0, train), "seen": range(train, dev), "unseen": range(dev, n)}[split]))
    out = []
    for k in range(max(len(r) for _, r in ranges)):
        out += [f"{name}-v{r[k]}" for name, r in ranges if k < len(r)]
    return out


def _thought(action: str) -> str:
    """A templated one-line rationale for a gold action."""
    a = action.strip()
    patterns: tuple[tuple[str, Callable[..., str]], ...] = (
        (r"look around", lambda: "I look around to see what is here."),
        (r"(?:go|teleport) to (.+)", lambda x: f"Next I go to the {x}."),
        (r"open (.+)", lambda x: f"I open the {x}."),
        (r"close (.+)", lambda x: f"I close the {x}."),
        (r"pick up (.+)", lambda x: f"I need the {x}, so I pick it up."),
        (r"put down (.+)", lambda x: f"I put down the {x}."),
        (r"focus on (.+)", lambda x: f"The task is about the {x}, so I focus on it."),
        (r"move (.+) to (.+)", lambda x, y: f"I move the {x} to the {y}."),
        (r"pour (.+) into (.+)", lambda x, y: f"I pour the {x} into the {y}."),
        (r"dunk (.+) into (.+)", lambda x, y: f"I dunk the {x} into the {y}."),
        (r"use (.+) on (.+)", lambda x, y: f"I use the {x} on the {y}."),
        (r"connect (.+) to (.+)", lambda x, y: f"I connect the {x} to the {y}."),
        (r"disconnect (.+)", lambda x: f"I disconnect the {x}."),
        (r"activate (.+)", lambda x: f"I turn on the {x}."),
        (r"deactivate (.+)", lambda x: f"I turn off the {x}."),
        (r"(?:look at|examine) (.+)", lambda x: f"I look at the {x} to check its state."),
        (r"look in (.+)", lambda x: f"I look in the {x}."),
        (r"read (.+)", lambda x: f"I read the {x}."),
        (r"mix (.+)", lambda x: f"I mix what is in the {x}."),
        (r"eat (.+)", lambda x: f"I eat the {x}."),
        (r"wait1?", lambda: "I wait for the process to go on."),
        (r"inventory", lambda: "I check what I am carrying."),
        (r"([0-9]+)", lambda x: f"The game asks which one I mean; I choose option {x}."),
    )
    for pattern, make in patterns:
        m = re.fullmatch(pattern, a)
        if m:
            return make(*m.groups())
    return f"The next step is to {a}."


def _stepper(action: str) -> Callable[[Any], str]:
    return lambda server: str(server.step(action))


def _gold_path(directory: Path | None, name: str, variation: int, simplification: str) -> Path | None:
    if directory is None:
        return None
    tag = f"-{simplification.replace(',', '+')}" if simplification else ""
    return directory / f"{name}-v{variation}{tag}.json"


# ---------------------------------------------------------------------------------------
# The environment

_GOLD_MEMORY: dict[tuple[str, int, str], list[str]] = {}


class ScienceWorld(TextEnv):
    """ScienceWorld tasks played in a Java process (see module doc)."""

    name = "scienceworld"
    max_turns = max(STEP_LIMITS.values())
    #: a hint for corpus builders (the tiny model's tokenizer): episodes are slow and long
    corpus_episodes_per_split = 1

    def __init__(
        self,
        *,
        task_names: str | Sequence[str] | None = None,
        simplification: str = "",
        step_timeout: float = 30.0,
        load_timeout: float = 300.0,
        gold_cache: bool = True,
        admissible_actions: bool = False,
        max_turns: int | None = None,
    ) -> None:
        if task_names is None:
            names = list(TASK_NAMES)
        elif not isinstance(task_names, Sequence):  # a str is a Sequence too
            raise TurnRLError(f"scienceworld: task_names must be a comma-separated string or a list of task names "
                              f"(got {task_names!r})")
        else:
            names = [n.strip() for n in task_names.split(",")] if isinstance(task_names, str) else list(task_names)
            for n in names:
                if n not in _BY_NAME:
                    raise TurnRLError(f"scienceworld: unknown task {n!r}{did_you_mean(str(n), TASK_NAMES)}; "
                                      f"choose from: {', '.join(TASK_NAMES)}")
            if not names:
                raise TurnRLError("scienceworld: task_names is empty")
        if not isinstance(simplification, str):
            raise TurnRLError(f"scienceworld: simplification must be a comma-separated string (got {simplification!r})")
        for s in filter(None, simplification.split(",")):
            if s not in SIMPLIFICATIONS:
                raise TurnRLError(f"scienceworld: unknown simplification {s!r}{did_you_mean(s, SIMPLIFICATIONS)}; "
                                  f"choose from: {', '.join(SIMPLIFICATIONS)}")
        for key, val in (("step_timeout", step_timeout), ("load_timeout", load_timeout)):
            if isinstance(val, bool) or not isinstance(val, int | float) or val <= 0:
                raise TurnRLError(f"scienceworld: {key} must be a positive number of seconds (got {val!r})")
        for key, flag in (("gold_cache", gold_cache), ("admissible_actions", admissible_actions)):
            if not isinstance(flag, bool):
                raise TurnRLError(f"scienceworld: {key} must be true or false (got {flag!r})")
        if max_turns is not None and (isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1):
            raise TurnRLError(f"scienceworld: max_turns must be a positive integer (got {max_turns!r})")
        self.task_names = names
        self.simplification = simplification
        self.step_timeout = float(step_timeout)
        self.load_timeout = float(load_timeout)
        self.admissible = admissible_actions
        self.fixed_max_turns = max_turns
        self.max_turns = max_turns or max(STEP_LIMITS[n] for n in names)
        self.gold_dir: Path | None = None
        if gold_cache:
            from turnrl.models.loading import turnrl_home

            self.gold_dir = turnrl_home() / "scienceworld" / f"gold-{_package_version()}"
        self._java: JavaProcess | None = None
        self._task_id = ""
        self._task: tuple[str, int] | None = None
        self._description = ""
        self._history: list[str] = []
        self._gold: list[str] | None = None
        self._score = 0
        self._done = False
        self._failure: str | None = None
        self.restarts = 0

    # -- contract ------------------------------------------------------------------------

    @property
    def instruction(self) -> str:
        if not self._description:
            return INSTRUCTION
        return f"{INSTRUCTION}\nTask: {self._description}"

    def task_ids(self, split: str) -> list[str]:
        if split not in ("train", "seen", "unseen"):
            raise TurnRLError(f"scienceworld: unknown split {split!r}; choose from: train, seen, unseen")
        return _split_ids(self.task_names, split)

    @property
    def java_pid(self) -> int | None:
        """The pid of the running Java process (None before the first reset)."""
        return self._java.pid if self._java is not None and self._java.alive else None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        task_id = self.choose_task(seed, options)
        name, variation = parse_task(task_id)
        if name not in self.task_names:
            raise TurnRLError(f"scienceworld: task {name!r} is not among this env's task_names")
        if "noElectricalAction" in self.simplification and name.startswith(_ELECTRICAL):
            raise TurnRLError(f"scienceworld: task {name!r} needs electrical actions; drop noElectricalAction")
        self._task_id, self._task = task_id, (name, variation)
        self._history, self._gold, self._score, self._failure = [], None, 0, None
        self._done = False
        self.max_turns = self.fixed_max_turns or STEP_LIMITS[name]
        gold = None if self.fixed_max_turns else self._cached_gold()
        if gold is not None:  # the floor the expert's episodes get, for every player of a known task
            self.max_turns = max(self.max_turns, len(gold) + 10)
        for attempt in (1, 2):
            try:
                obs = self._load(gold=False)
                self._description = self._call(lambda s: str(s.getTaskDescription()), "reading the task")
                info_extra = self._admissible() if self.admissible else {}  # the first turn's list too
                break
            except JavaFailure as e:
                if attempt == 2:
                    raise TurnRLError(f"scienceworld: Java failed twice loading {task_id}: {e}") from None
        info = self._info()
        info.update(info_extra)
        return obs, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.running(self._task, over=self._done)
        text = " ".join(action.split()) if isinstance(action, str) else ""
        if self._failure is None:
            try:
                obs = self._call(lambda s: str(s.step(text)), f"step {len(self._history) + 1} ({text!r})")
                score, completed = self._call(
                    lambda s: (int(round(100 * s.getScore())), bool(s.getCompleted())), "reading the score")
                info_extra = self._admissible() if self.admissible else {}
            except JavaFailure as e:
                self._failure = str(e)
        if self._failure is not None:
            return self._fail(self._failure)
        self._history.append(text)
        reward = (max(score, 0) - max(self._score, 0)) / 100.0
        self._score = score
        info = self._info(invalid=obs.strip() == NO_MATCH)
        info.update(info_extra)
        if completed or score < 0:
            self._done = True
            success = completed and score >= 0
            info.update(won=success, success=success, outcome="completed" if success else "task_failed")
            return obs, reward, True, False, info
        if len(self._history) >= self.max_turns:
            self._done = True
            info.update(won=False, success=False, outcome="step_limit")
            return obs, reward, False, True, info
        return obs, reward, False, False, info

    def valid_actions(self) -> list[str] | None:
        return None

    def expert(self, rng: random.Random) -> ExpertStep:
        if self._task is None or self._done:
            raise TurnRLError("scienceworld: no expert move: the episode is not running (call reset())")
        if self._failure is None and self._gold is None:
            try:
                self._gold = self._gold_actions()
            except JavaFailure as e:
                self._failure = str(e)
        if self._failure is not None:
            return ExpertStep("look around", "ScienceWorld stopped responding; the episode will end.")
        assert self._gold is not None
        k = len(self._history)
        if k < len(self._gold):
            action = self._gold[k]
            return ExpertStep(action, _thought(action))
        return ExpertStep("look around", "I have done every step I know; I look around.")

    def close(self) -> None:
        if self._java is not None:
            self._java.close()
            self._java = None

    # -- internals -----------------------------------------------------------------------

    def _process(self) -> JavaProcess:
        if self._java is None or not self._java.alive:
            from turnrl.envs import require

            require("scienceworld")
            if self._java is not None:
                self.restarts += 1
            self._java = JavaProcess(self.load_timeout)
        return self._java

    def _call(self, fn: Callable[[Any], T], what: str, timeout: float | None = None) -> T:
        java = self._process()
        return java.call(lambda: fn(java.env.server), timeout or self.step_timeout, what)

    def _load(self, *, gold: bool) -> str:
        """Load the current task on a live process; returns the ``look around`` text."""
        assert self._task is not None
        name, variation = self._task
        java = self._process()
        java.call(lambda: java.env.load(name, variation, self.simplification, generateGoldPath=gold),
                  self.load_timeout, f"loading {self._task_id}")
        return java.call(lambda: str(java.env.server.step("look around")), self.step_timeout,
                         f"starting {self._task_id}")

    def _cached_gold(self) -> list[str] | None:
        """The task's gold path if it was generated before (in this process or under ``gold_dir``)."""
        assert self._task is not None
        name, variation = self._task
        gold = _GOLD_MEMORY.get((name, variation, self.simplification))
        path = _gold_path(self.gold_dir, name, variation, self.simplification)
        if gold is None and path is not None and path.is_file():
            try:
                gold = [str(a) for a in json.loads(path.read_text())["actions"]]
                _GOLD_MEMORY[(name, variation, self.simplification)] = gold  # read once a process
            except (ValueError, KeyError, TypeError):
                gold = None  # a damaged cache file: generate again
        return gold

    def _gold_actions(self) -> list[str]:
        assert self._task is not None
        name, variation = self._task
        key = (name, variation, self.simplification)
        gold = self._cached_gold()
        path = _gold_path(self.gold_dir, name, variation, self.simplification)
        if gold is None:
            # generating the gold path reloads the task: replay the actions taken so far
            self._load(gold=True)
            gold = self._call(lambda s: [str(a) for a in s.getGoldActionSequence()], "reading the gold path")
            for k, done in enumerate(self._history):
                self._call(_stepper(done), f"replaying step {k + 1}")
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
                tmp.write_text(json.dumps({"task": name, "variation": variation,
                                           "simplification": self.simplification, "actions": gold}) + "\n")
                os.replace(tmp, path)
        _GOLD_MEMORY[key] = gold
        if self.fixed_max_turns is None:
            self.max_turns = max(self.max_turns, len(gold) + 10)
        return list(gold)

    def _admissible(self) -> dict[str, Any]:
        acts = self._call(lambda s: [str(a) for a in s.getValidActionObjectCombinations()], "listing actions")
        return {"admissible_actions": sorted(set(acts))}

    def _fail(self, reason: str) -> tuple[str, float, bool, bool, dict]:
        """End the episode after a Java failure; the next reset starts a new process."""
        self._done = True
        info = self._info()
        info.update(won=False, success=False, outcome="env_error", error=reason)
        return f"ScienceWorld failed: {reason}. The episode ends.", 0.0, False, True, info

    def _info(self, *, invalid: bool = False) -> dict[str, Any]:
        return {"task_id": self._task_id, "score": max(self._score, 0), "raw_score": self._score,
                "moves": len(self._history), "invalid": invalid, "restarts": self.restarts}


if available():
    register("scienceworld", ScienceWorld)
