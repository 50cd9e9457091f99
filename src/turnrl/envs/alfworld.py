"""An adapter for ALFWorld's text games, loaded from a directory the user has.

ALFWorld (Shridhar et al., 2021) ships its games as ``game.tw-pddl`` files (a PDDL domain
and problem plus a TextWorld text grammar) in the layout
``json_2.1.1/<train|valid_seen|valid_unseen>/<task>/<trial>/game.tw-pddl``. This env plays
them with TextWorld's PDDL backend (``pip install 'turnrl[alfworld]'``, which builds
``fast-downward-textworld``; TextWorld ``.z8`` games in the same layout play without it).

- ``data_dir``: the directory holding ``json_2.1.1`` (ALFWorld's ``$ALFWORLD_DATA``), or
  ``json_2.1.1`` itself; it defaults to ``$ALFWORLD_DATA``.
- Splits: ``train`` = ``train``, ``seen`` = ``valid_seen``, ``unseen`` = ``valid_unseen``
  (the seen / unseen evaluation sets ETO reports). A task id is the game's directory
  relative to ``json_2.1.1`` (``valid_seen/pick_and_place_simple-Mug-None-Desk-308/trial_T2019...``).
- Object names are demangled as ALFWorld does (``Mug_bar__minus_00_dot_39...`` becomes
  ``mug 3``: numbered per kind, the ids in sorted order from the kind's count down to 1).
- Observations are the game's text; the first one is ALFWorld's intro ("You are in the
  middle of a room... Your task is to: put a clean mug in coffeemachine."), whose task
  line is also the instruction's. ``valid_actions`` are the game's admissible commands.
  Reward 1 when the goal holds (terminated, ``success``), else 0; truncated after
  ``max_turns`` (50) turns.
- Expert: the PDDL planner's plan from the current state (TextWorld's
  ``policy_commands``, re-planned every turn, so it recovers from any earlier action),
  falling back to the game's stored walkthrough by position; thoughts are templated.

The env registers as ``alfworld`` only when TextWorld is installed and ``$ALFWORLD_DATA``
is set; otherwise build it directly: ``ALFWorld(data_dir="/data/alfworld")``.
"""

from __future__ import annotations

import importlib.util
import os
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any

from turnrl.envs import register
from turnrl.envs.base import ExpertStep, TextEnv
from turnrl.errors import TurnRLError

SPLIT_DIRS = {"train": "train", "seen": "valid_seen", "unseen": "valid_unseen"}
GAME_FILES = ("game.tw-pddl", "*.z8")

INSTRUCTION = """\
Interact with a household to solve a task. Each turn, give one command from the admissible \
ones, e.g. go to X, open X, close X, take X from Y, move X to Y, put X in/on Y, clean X with \
Y, heat X with Y, cool X with Y, use X, examine X, look, inventory. Completing the task \
gives reward 1.
Respond in exactly this format:
Thought: <one short sentence>
Action: <command>"""


def available() -> bool:
    return importlib.util.find_spec("textworld") is not None


def demangle(ids: list[str]) -> dict[str, str]:
    """ALFWorld's object names: ``Mug_bar__minus_00_dot_39...`` -> ``mug 3``, as ALFWorld's
    ``Demangler`` names them: per kind (an id with ``basin`` in it adds ``basin`` to its kind),
    the ids in sorted order take the numbers from the kind's count down to 1; ids without
    ``_bar_`` keep their name."""
    def kind(ident: str) -> str:
        name = ident.split("_bar_", 1)[0]
        return (name + "basin" if "basin" in ident else name).lower()

    left = Counter(kind(i) for i in ids if "_bar_" in i)
    out: dict[str, str] = {}
    for ident in sorted(ids):
        if "_bar_" not in ident:
            out[ident] = ident
            continue
        k = kind(ident)
        out[ident] = f"{k} {left[k]}"
        left[k] -= 1
    return out


def _thought(cmd: str) -> str:
    patterns = (
        (r"go to (.+)", "I go to the {0}."),
        (r"open (.+)", "I open the {0} to look inside."),
        (r"close (.+)", "I close the {0}."),
        (r"take (.+) from (.+)", "I take the {0} from the {1}."),
        (r"(?:move|put) (.+) (?:to|in/on|in|on) (.+)", "I put the {0} in the {1}."),
        (r"clean (.+) with (.+)", "I clean the {0} with the {1}."),
        (r"heat (.+) with (.+)", "I heat the {0} with the {1}."),
        (r"cool (.+) with (.+)", "I cool the {0} with the {1}."),
        (r"use (.+)", "I use the {0}."),
        (r"examine (.+)", "I examine the {0}."),
    )
    for pattern, text in patterns:
        m = re.fullmatch(pattern, cmd)
        if m:
            return text.format(*m.groups())
    return f"Next: {cmd}."


def _inner(env: Any) -> Any:
    """The backend env under TextWorld wrappers."""
    seen = 0
    while not hasattr(env, "_entity_infos") and hasattr(env, "_wrapped") and seen < 10:
        env, seen = env._wrapped, seen + 1
    return env


class ALFWorld(TextEnv):
    """ALFWorld games from a local data directory (see module doc)."""

    name = "alfworld"
    max_turns = 50

    def __init__(self, *, data_dir: str | None = None, max_turns: int = 50) -> None:
        if data_dir is not None and not isinstance(data_dir, str | os.PathLike):
            raise TurnRLError(f"alfworld: data_dir must be a directory path (got {data_dir!r})")
        raw = data_dir or os.environ.get("ALFWORLD_DATA")
        if not raw:
            raise TurnRLError("alfworld: give data_dir (the directory holding json_2.1.1) or set ALFWORLD_DATA")
        root = Path(raw).expanduser()
        if (root / "json_2.1.1").is_dir():
            root = root / "json_2.1.1"
        if not root.is_dir():
            raise TurnRLError(f"alfworld: data_dir {str(root)!r} is not a directory")
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise TurnRLError(f"alfworld: max_turns must be a positive integer (got {max_turns!r})")
        self.root = root
        self.max_turns = max_turns
        self._games: dict[str, dict[str, Path]] = {}
        for split, sub in SPLIT_DIRS.items():
            files: dict[str, Path] = {}
            for pattern in GAME_FILES:
                for f in sorted((root / sub).glob(f"**/{pattern}")):
                    files.setdefault(f.parent.relative_to(root).as_posix(), f)
            self._games[split] = dict(sorted(files.items()))
        if not any(self._games.values()):
            raise TurnRLError(f"alfworld: no ALFWorld games (game.tw-pddl) under {str(root)!r}")
        self._env: Any = None
        self._state: Any = None
        self._task_id = ""
        self._goal = ""
        self._walkthrough: list[str] = []
        self._turns = 0
        self._done = True

    # -- contract ------------------------------------------------------------------------

    @property
    def instruction(self) -> str:
        return INSTRUCTION + (f"\nYour task is to: {self._goal}" if self._goal else "")

    def task_ids(self, split: str) -> list[str]:
        if split not in self._games:
            raise TurnRLError(f"alfworld: unknown split {split!r}; choose from: train, seen, unseen")
        ids = list(self._games[split])
        if not ids:
            raise TurnRLError(f"alfworld: no games under {str(self.root / SPLIT_DIRS[split])!r}")
        return ids

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        task_id = self.choose_task(seed, options)
        path = next((g[task_id] for g in self._games.values() if task_id in g), None)
        if path is None:
            raise TurnRLError(f"alfworld: unknown task id {task_id!r}; expected a game directory under "
                              f"{str(self.root)!r}, e.g. {next(iter(next(g for g in self._games.values() if g)))!r}")
        self.close()
        self._env = self._start(path)
        self._state = self._env.reset()
        self._task_id = task_id
        self._walkthrough = list(self._state.get("extra.walkthrough") or [])
        m = re.search(r"Your task is to:\s*(.+)", self._state.feedback or "")
        self._goal = m.group(1).strip() if m else ""
        self._turns = 0
        self._done = False
        return str(self._state.feedback).strip(), self._info()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.running(self._env, over=self._done)
        self._turns += 1
        cmd = " ".join(action.split()) if isinstance(action, str) else ""
        valid = cmd in (self._state.admissible_commands or [])
        if valid:  # other text never reaches the interpreter ("quit", "restart", chained commands)
            self._state, _, _ = self._env.step(cmd)
            obs = str(self._state.feedback).strip() or "Nothing happens."
        else:  # what ALFWorld's PDDL backend answers, with the game left as it was
            obs = "Nothing happens."
        info = self._info(invalid=not valid)
        if self._state.won:
            self._done = True
            info.update(won=True, success=True, valid_actions=[])
            return obs, 1.0, True, False, info
        if self._turns >= self.max_turns:
            self._done = True
            info.update(won=False, success=False, valid_actions=[])
            return obs, 0.0, False, True, info
        return obs, 0.0, False, False, info

    def valid_actions(self) -> list[str]:
        if self._state is None or self._done:
            return []
        return sorted(self._state.admissible_commands or [])

    def expert(self, rng: random.Random) -> ExpertStep:
        if self._state is None or self._done:
            raise TurnRLError("alfworld: no expert move: the episode is not running (call reset())")
        plan = list(self._state.get("policy_commands") or [])
        if plan:
            return ExpertStep(plan[0], _thought(plan[0]))
        if self._turns < len(self._walkthrough):
            cmd = self._walkthrough[self._turns]
            return ExpertStep(cmd, _thought(cmd))
        return ExpertStep("look", "I have no plan left; I look around.")

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None

    # -- internals -----------------------------------------------------------------------

    def _start(self, path: Path) -> Any:
        from turnrl.envs import require

        require("alfworld")
        import textworld

        pddl = path.suffix == ".tw-pddl"
        if pddl and importlib.util.find_spec("fast_downward") is None:
            raise TurnRLError("alfworld: playing game.tw-pddl files needs TextWorld's PDDL backend: "
                              "pip install 'turnrl[alfworld]' (builds fast-downward-textworld)")
        infos = textworld.EnvInfos(admissible_commands=True, won=True, policy_commands=pddl,
                                   extras=["walkthrough"] if pddl else [])
        env = textworld.start(str(path), request_infos=infos)
        inner = _inner(env)
        entity_infos = getattr(inner, "_entity_infos", None)
        if pddl and entity_infos:
            names = demangle(list(entity_infos))
            for ident, info in entity_infos.items():
                info.name = names[ident]
        return env

    def _info(self, *, invalid: bool = False) -> dict[str, Any]:
        return {"task_id": self._task_id, "turn": self._turns, "invalid": invalid,
                "valid_actions": self.valid_actions()}


def maybe_register() -> bool:
    """Register ``alfworld`` when TextWorld is installed and ``$ALFWORLD_DATA`` is set."""
    if available() and os.environ.get("ALFWORLD_DATA"):
        register("alfworld", ALFWorld)
        return True
    return False


maybe_register()
