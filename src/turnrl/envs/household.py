"""Household tasks in the style of ALFWorld, generated with TextWorld and cached on disk
(optional extra: ``pip install 'turnrl[textworld]'``; without it the env is not registered).

Tasks. A small house (2-3 rooms joined by open passages) with receptacles (containers,
closed or open, and supporters), a sink basin, a microwave and a fridge, and household
objects. One task per game, four kinds as in ALFWorld:

- ``put``: "put some apple in cabinet" / "... on countertop";
- ``clean``: "put a clean mug in drawer" (``clean mug with sinkbasin`` first);
- ``heat``: "heat some egg and put it on dining table" (``heat egg with microwave``);
- ``cool``: "cool some bottle and put it in box" (``cool bottle with fridge``).

Games are TextWorld games: the world, the quest (the win condition is the final placement
*and* the clean / hot / cool state) and the mechanics are compiled by TextWorld's Inform 7
pipeline. Clean, heat and cool are not in TextWorld's standard logic; this module adds
them as a small logic file (:data:`HOUSEHOLD_TWL`: types ``sinkbasin``, ``microwave`` and
``fridge`` with their rules, commands and Inform 7 actions) to TextWorld's own.

Generation and cache. A task id is ``hh-<split>-<n>``; its game is generated from the seed
``(split, n)`` the first time it is played (about two seconds: one Inform 7 compile, then
the walkthrough is played through once to check that it wins) and cached under
``$TURNRL_HOME/household/<version>/<task id>/``; later resets load it from there.
:func:`prebuild` builds a split's games ahead of time, in parallel.

Splits. ``train`` and ``seen`` games use the same vocabulary (rooms kitchen, living room,
bedroom...; objects apple, mug, book...; receptacles cabinet, countertop...), with
different seeds; ``unseen`` games use only held-out room, object and receptacle names
(office, garage...; tomato, kettle, vase...; chest, dresser...). ``num_tasks`` sets the
number of train tasks (default 300); seen and unseen have a fifth of that each.

Observations are terse and ALFWorld-like, rendered from the game's facts: ``You are in the
kitchen. You see a closed fridge, a countertop (on it: an apple), ... Exits: east (the
hallway).`` after moving or ``look``; otherwise the game's own one-line feedback ("You take
the apple from the countertop."). ``valid_actions`` are TextWorld's admissible commands.
Reward 1 when the task is done (terminated, ``success``), else 0 (ALFWorld's binary
reward); episodes are truncated after 50 turns.

Expert: the game's walkthrough (generated with it), played by position among the valid commands
(an invalid command leaves the game, and the plan, where they were), with a templated thought per
command.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from turnrl.envs import register
from turnrl.envs.base import ExpertStep, TextEnv
from turnrl.errors import TurnRLError

GAME_VERSION = "v1"

HOUSEHOLD_TWL = '''\
# household appliances for ALFWorld-like tasks: clean / heat / cool
type sinkbasin : c {
    predicates {
        dirty(o);
        clean(o);
    }

    rules {
        clean/sinkbasin :: $at(P, r) & $at(sinkbasin, r) & $in(o, I) & dirty(o) -> clean(o);
    }

    inform7 {
        type {
            kind :: "sink-like";
            definition :: "sink-like is a kind of container.";
        }

        predicates {
            dirty(o) :: "The {o} is dirty";
            clean(o) :: "The {o} is clean";
        }

        commands {
            clean/sinkbasin :: "clean {o} with {sinkbasin}" :: "cleaning the {o} with the {sinkbasin}";
        }

        code :: """
            A thing can be clean or dirty. A thing is usually dirty.
            Cleaning it with is an action applying to one carried thing and one thing.
            Check cleaning something with something (this is the cleaning needs a sink rule):
                if the second noun is not a sink-like:
                    say "You can only clean things in a sink basin." instead.
            Carry out cleaning something (called the item) with something:
                now the item is clean;
                say "You clean the [item] in the [second noun].".
            Understand "clean [something] with/in/using [something]" as cleaning it with.
        """;
    }
}

type microwave : c {
    predicates {
        unheated(o);
        hot(o);
    }

    rules {
        heat/microwave :: $at(P, r) & $at(microwave, r) & $in(o, I) & unheated(o) -> hot(o);
    }

    inform7 {
        type {
            kind :: "microwave-like";
            definition :: "microwave-like is a kind of container.";
        }

        predicates {
            unheated(o) :: "The {o} is unheated";
            hot(o) :: "The {o} is hot";
        }

        commands {
            heat/microwave :: "heat {o} with {microwave}" :: "heating the {o} with the {microwave}";
        }

        code :: """
            A thing can be hot or unheated. A thing is usually unheated.
            Heating it with is an action applying to one carried thing and one thing.
            Check heating something with something (this is the heating needs a microwave rule):
                if the second noun is not a microwave-like:
                    say "You can only heat things with a microwave." instead.
            Carry out heating something (called the item) with something:
                now the item is hot;
                say "You heat the [item] with the [second noun].".
            Understand "heat [something] with/in/using [something]" as heating it with.
        """;
    }
}

type fridge : c {
    predicates {
        uncooled(o);
        cool(o);
    }

    rules {
        cool/fridge :: $at(P, r) & $at(fridge, r) & $in(o, I) & uncooled(o) -> cool(o);
    }

    inform7 {
        type {
            kind :: "fridge-like";
            definition :: "fridge-like is a kind of container.";
        }

        predicates {
            uncooled(o) :: "The {o} is uncooled";
            cool(o) :: "The {o} is cool";
        }

        commands {
            cool/fridge :: "cool {o} with {fridge}" :: "cooling the {o} with the {fridge}";
        }

        code :: """
            A thing can be cool or uncooled. A thing is usually uncooled.
            Cooling it with is an action applying to one carried thing and one thing.
            Check cooling something with something (this is the cooling needs a fridge rule):
                if the second noun is not a fridge-like:
                    say "You can only cool things with a fridge." instead.
            Carry out cooling something (called the item) with something:
                now the item is cool;
                say "You cool the [item] with the [second noun].".
            Understand "cool [something] with/in/using [something]" as cooling it with.
        """;
    }
}
'''

# -- vocabulary: (seen, unseen) ------------------------------------------------------------

ROOMS = (("kitchen", "living room", "bedroom", "bathroom", "hallway", "dining room"),
         ("office", "garage", "pantry", "laundry room", "attic", "basement"))
CONTAINERS = (("cabinet", "drawer", "box", "safe", "garbage can"),
              ("chest", "basket", "crate", "locker"))
SUPPORTERS = (("countertop", "dining table", "side table", "desk", "shelf", "coffee table", "sofa", "bed"),
              ("dresser", "nightstand", "bench", "workbench", "ottoman", "armchair"))
OBJECTS = (("apple", "mug", "plate", "bowl", "cup", "egg", "bread", "potato", "spoon", "fork", "knife",
            "book", "pen", "towel", "sponge", "soap bar", "cloth", "bottle"),
           ("tomato", "lettuce", "pan", "pot", "kettle", "glass", "candle", "vase", "watch", "remote",
            "spatula", "ladle"))
_FOOD = {"apple", "egg", "bread", "potato", "tomato", "lettuce"}
_DISHES = {"mug", "plate", "bowl", "cup", "glass", "pot", "pan", "kettle"}
CAN = {
    "heat": _FOOD | _DISHES,
    "cool": _FOOD | _DISHES | {"bottle"},
    "clean": _FOOD | _DISHES | {"spoon", "fork", "knife", "towel", "cloth", "sponge", "bottle", "vase", "spatula",
                                "ladle"},
}
KINDS = ("put", "clean", "heat", "cool")
APPLIANCE = {"clean": "sinkbasin", "heat": "microwave", "cool": "fridge"}
_DIRS = ("north", "south", "east", "west")
_REVERSE = {"north": "south", "south": "north", "east": "west", "west": "east"}

INSTRUCTION = """\
You are in a house. Complete the household task by typing one command per turn: look, \
inventory, go <direction>, examine X, open X, close X, take X from Y, put X on Y (a surface), \
insert X into Y (a container), clean X with sinkbasin, heat X with microwave, cool X with \
fridge. Containers must be open to take things out or put things in. Finishing the task \
gives reward 1.
Respond in exactly this format:
Thought: <one short sentence>
Action: <command>"""


@dataclass
class TaskSpec:
    """What a generated game holds (saved next to it as ``task.json``)."""

    task_id: str
    kind: str
    obj: str
    target: str
    target_is_container: bool
    goal: str
    rooms: list[str]
    walkthrough: list[str]
    thoughts: list[str]


def _article(name: str) -> str:
    return ("an " if name[0] in "aeiou" else "a ") + name


def _goal_text(kind: str, obj: str, target: str, container: bool) -> str:
    prep = "in" if container else "on"
    return {
        "put": f"put some {obj} {prep} {target}",
        "clean": f"put a clean {obj} {prep} {target}",
        "heat": f"heat some {obj} and put it {prep} {target}",
        "cool": f"cool some {obj} and put it {prep} {target}",
    }[kind]


def _words_clash(names: Sequence[str]) -> bool:
    sets = [set(n.split()) for n in names]
    return any(i != j and a <= b for i, a in enumerate(sets) for j, b in enumerate(sets))


@dataclass
class _Layout:
    rooms: list[str]
    links: list[tuple[str, str, str]]  # (room, direction, other room)
    appliances: dict[str, str]  # appliance -> room
    receptacles: dict[str, tuple[str, bool, bool]]  # name -> (room, is_container, closed)
    objects: dict[str, str]  # object -> receptacle
    kind: str
    obj: str
    target: str


def _layout(split: str, k: int) -> _Layout:
    rng = random.Random(f"household/{GAME_VERSION}/{split}/{k}")
    v = 1 if split == "unseen" else 0
    while True:
        rooms = rng.sample(ROOMS[v], rng.choice((2, 3)))
        links: list[tuple[str, str, str]] = []
        used: dict[str, set[str]] = {r: set() for r in rooms}
        for a, b in zip(rooms, rooms[1:], strict=False):
            d = rng.choice([d for d in _DIRS if d not in used[a] and _REVERSE[d] not in used[b]])
            links.append((a, d, b))
            used[a].add(d)
            used[b].add(_REVERSE[d])
        appliances = {a: rng.choice(rooms) for a in ("sinkbasin", "microwave", "fridge")}
        recs: dict[str, tuple[str, bool, bool]] = {}
        names = rng.sample(CONTAINERS[v], 2) + rng.sample(SUPPORTERS[v], rng.choice((2, 3)))
        for n in names:
            container = n in CONTAINERS[v]
            recs[n] = (rng.choice(rooms), container, container and rng.random() < 0.7)
        kind = rng.choice(KINDS)
        pool = [o for o in OBJECTS[v] if kind == "put" or o in CAN[kind]]
        obj = rng.choice(pool)
        others = rng.sample([o for o in OBJECTS[v] if o != obj], 3)
        objects = {o: rng.choice(names) for o in [obj, *others]}
        target = rng.choice([n for n in names if n != objects[obj]])
        every = rooms + list(appliances) + names + [obj, *others]
        if not _words_clash(every):
            return _Layout(rooms, links, appliances, recs, objects, kind, obj, target)


def _path(links: list[tuple[str, str, str]], start: str, goal: str) -> list[tuple[str, str]]:
    """``[(direction, room entered), ...]`` from ``start`` to ``goal``."""
    edges: dict[str, list[tuple[str, str]]] = {}
    for a, d, b in links:
        edges.setdefault(a, []).append((d, b))
        edges.setdefault(b, []).append((_REVERSE[d], a))
    frontier: list[tuple[str, list[tuple[str, str]]]] = [(start, [])]
    seen = {start}
    while frontier:
        room, path = frontier.pop(0)
        if room == goal:
            return path
        for d, nxt in edges.get(room, []):
            if nxt not in seen:
                seen.add(nxt)
                frontier.append((nxt, [*path, (d, nxt)]))
    raise AssertionError("rooms are connected")


def _walkthrough(lay: _Layout, start: str) -> tuple[list[str], list[str]]:
    cmds: list[str] = []
    thoughts: list[str] = []
    here = start
    opened: set[str] = set()

    def go(room: str, why: str) -> None:
        nonlocal here
        for d, nxt in _path(lay.links, here, room):
            cmds.append(f"go {d}")
            thoughts.append(f"{why} is in the {room}; I go {d} to the {nxt}.")
            here = nxt

    def open_if_closed(rec: str) -> None:
        _, container, closed = lay.receptacles[rec]
        if container and closed and rec not in opened:
            cmds.append(f"open {rec}")
            thoughts.append(f"The {rec} is closed; I open it.")
            opened.add(rec)

    src = lay.objects[lay.obj]
    go(lay.receptacles[src][0], f"The {lay.obj}")
    open_if_closed(src)
    cmds.append(f"take {lay.obj} from {src}")
    thoughts.append(f"I take the {lay.obj} from the {src}.")
    if lay.kind != "put":
        appliance = APPLIANCE[lay.kind]
        go(lay.appliances[appliance], f"The {appliance}")
        cmds.append(f"{lay.kind} {lay.obj} with {appliance}")
        thoughts.append(f"The task needs the {lay.obj} {'clean' if lay.kind == 'clean' else lay.kind.replace('heat', 'hot')}, "
                        f"so I {lay.kind} it with the {appliance}.")
    room, container, _ = lay.receptacles[lay.target]
    go(room, f"The {lay.target}")
    open_if_closed(lay.target)
    cmds.append(f"insert {lay.obj} into {lay.target}" if container else f"put {lay.obj} on {lay.target}")
    thoughts.append(f"Now I put the {lay.obj} {'in' if container else 'on'} the {lay.target} to finish the task.")
    return cmds, thoughts


# -- TextWorld -----------------------------------------------------------------------------


def available() -> bool:
    import importlib.util

    return importlib.util.find_spec("textworld") is not None


def cache_root() -> Path:
    from turnrl.models.loading import turnrl_home

    return turnrl_home() / "household" / GAME_VERSION


def _knowledge_base() -> Any:
    """TextWorld's own logic plus :data:`HOUSEHOLD_TWL`, assembled in the cache."""
    import textworld.generator.data as twdata
    from textworld.generator.data import KnowledgeBase

    src = Path(twdata.__file__).parent / "logic"
    logic = cache_root() / "kb" / "logic"
    marker = logic / "household.twl"
    if not marker.is_file() or marker.read_text() != HOUSEHOLD_TWL:
        cache_root().mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="kb-", dir=cache_root()))
        for f in src.glob("*.twl"):
            shutil.copy(f, tmp / f.name)
        (tmp / "household.twl").write_text(HOUSEHOLD_TWL)
        shutil.rmtree(logic, ignore_errors=True)
        logic.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(tmp, logic)
        except OSError:  # another process assembled it first
            shutil.rmtree(tmp, ignore_errors=True)
    return KnowledgeBase.load(logic_path=str(logic))


def build_game(task_id: str, out_dir: Path) -> TaskSpec:
    """Generate, compile and check the game of ``task_id`` into ``out_dir``."""
    import textworld
    from textworld import GameMaker
    from textworld.generator.game import Event, Quest

    split, k = parse_task(task_id)
    lay = _layout(split, k)
    rng = random.Random(f"household/{GAME_VERSION}/{split}/{k}/start")
    start = rng.choice(lay.rooms)
    options = textworld.GameOptions()
    options.kb = _knowledge_base()
    options.seeds = k
    M = GameMaker(options)
    rooms = {r: M.new_room(r) for r in lay.rooms}
    for a, d, b in lay.links:
        M.connect(getattr(rooms[a], d), getattr(rooms[b], _REVERSE[d]))
    M.set_player(rooms[start])
    ents: dict[str, Any] = {}
    for name, room in lay.appliances.items():
        e = M.new(type=name, name=name)
        rooms[room].add(e)
        e.add_property("open" if name == "sinkbasin" else "closed")
        ents[name] = e
    for name, (room, container, closed) in lay.receptacles.items():
        e = M.new(type="c" if container else "s", name=name)
        rooms[room].add(e)
        if container:
            e.add_property("closed" if closed else "open")
        ents[name] = e
    for name, rec in lay.objects.items():
        e = M.new(type="o", name=name)
        ents[rec].add(e)
        for prop in ("dirty", "unheated", "uncooled"):
            e.add_property(prop)
        ents[name] = e
    _, container, _ = lay.receptacles[lay.target]
    obj, target = ents[lay.obj], ents[lay.target]
    conditions = [M.new_fact("in" if container else "on", obj, target)]
    if lay.kind != "put":
        conditions.append(M.new_fact({"clean": "clean", "heat": "hot", "cool": "cool"}[lay.kind], obj))
    cmds, thoughts = _walkthrough(lay, start)
    M.quests = [Quest(win_events=[Event(conditions=conditions, commands=cmds)], commands=cmds)]
    goal = _goal_text(lay.kind, lay.obj, lay.target, container)
    spec = TaskSpec(task_id, lay.kind, lay.obj, lay.target, container, goal, lay.rooms, cmds, thoughts)
    out_dir.mkdir(parents=True, exist_ok=True)
    game_file = M.compile(str(out_dir / "game.z8"))
    env = textworld.start(game_file, request_infos=textworld.EnvInfos(won=True, admissible_commands=True))
    try:
        state = env.reset()
        for i, cmd in enumerate(cmds):
            if cmd not in state.admissible_commands:
                raise RuntimeError(f"{task_id}: walkthrough command {cmd!r} is not admissible")
            state, _, done = env.step(cmd)
            if done != (i == len(cmds) - 1) or (done and not state.won):
                raise RuntimeError(f"{task_id}: the walkthrough does not win at its last command")
    finally:
        env.close()
    (out_dir / "task.json").write_text(json.dumps(asdict(spec), indent=1) + "\n")
    return spec


def ensure_game(task_id: str) -> tuple[Path, TaskSpec]:
    """The cached game of ``task_id`` (built on first use; safe across processes)."""
    final = cache_root() / task_id
    if not (final / "task.json").is_file():
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"{task_id}.tmp-", dir=final.parent))
        try:
            build_game(task_id, tmp)
            try:
                os.replace(tmp, final)
            except OSError:  # built meanwhile by another process
                pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    spec = TaskSpec(**json.loads((final / "task.json").read_text()))
    return final / "game.z8", spec


def prebuild(split: str, num_tasks: int = 300, workers: int = 4) -> int:
    """Build the games of a split ahead of time in ``workers`` processes; returns how many."""
    from concurrent.futures import ProcessPoolExecutor

    ids = Household(num_tasks=num_tasks).task_ids(split)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        list(pool.map(ensure_game, ids))
    return len(ids)


def parse_task(task_id: object) -> tuple[str, int]:
    m = re.fullmatch(r"hh-(train|seen|unseen)-(0|[1-9][0-9]*)", task_id) if isinstance(task_id, str) else None
    if m is None:
        raise TurnRLError(f"household: unknown task id {task_id!r}; expected 'hh-<train|seen|unseen>-<n>', "
                          "e.g. 'hh-train-0'")
    return m.group(1), int(m.group(2))


# -- the environment -----------------------------------------------------------------------

_FEEDBACK_END = re.compile(r"\n\s*>|\*\*\* The End \*\*\*|Your score has just gone up by")


def _clean_feedback(text: str) -> str:
    m = _FEEDBACK_END.search(text)
    body = text[: m.start()] if m else text
    return " ".join(body.split())


def _join(items: list[str]) -> str:
    return ", ".join(items[:-1]) + f" and {items[-1]}" if len(items) > 1 else (items[0] if items else "")


class Household(TextEnv):
    """ALFWorld-like household tasks in generated TextWorld games (see module doc)."""

    name = "household"
    max_turns = 50
    #: a hint for corpus builders: each episode may compile a game the first time
    corpus_episodes_per_split = 3

    def __init__(self, *, num_tasks: int = 300, max_turns: int = 50) -> None:
        if isinstance(num_tasks, bool) or not isinstance(num_tasks, int) or num_tasks < 5:
            raise TurnRLError(f"household: num_tasks must be an integer >= 5 (got {num_tasks!r})")
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise TurnRLError(f"household: max_turns must be a positive integer (got {max_turns!r})")
        self.num_tasks = num_tasks
        self.max_turns = max_turns
        self._env: Any = None
        self._spec: TaskSpec | None = None
        self._state: Any = None
        self._turns = 0
        self._moves = 0
        self._done = False

    @property
    def instruction(self) -> str:
        if self._spec is None:
            return INSTRUCTION
        return f"{INSTRUCTION}\nYour task is to: {self._spec.goal}."

    def task_ids(self, split: str) -> list[str]:
        n = {"train": self.num_tasks, "seen": self.num_tasks // 5, "unseen": self.num_tasks // 5}.get(split)
        if n is None:
            raise TurnRLError(f"household: unknown split {split!r}; choose from: train, seen, unseen")
        return [f"hh-{split}-{k}" for k in range(n)]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        from turnrl.envs import require

        require("household")
        import textworld

        task_id = self.choose_task(seed, options)
        parse_task(task_id)
        game, spec = ensure_game(task_id)
        self.close()
        infos = textworld.EnvInfos(admissible_commands=True, facts=True, won=True, lost=True)
        self._env = textworld.start(str(game), request_infos=infos)
        self._state = self._env.reset()
        self._spec = spec
        self._turns = 0
        self._moves = 0  # valid commands: an invalid one leaves the game as it was, and the plan where it was
        self._done = False
        return self._view(), self._info()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.running(self._spec, over=self._done)
        self._turns += 1
        cmd = " ".join(action.split()).lower() if isinstance(action, str) else ""
        valid = cmd in self._state.admissible_commands
        if not valid:  # not stepped: the interpreter would run what no listed command does (quit, restart,
            obs = "Nothing happens."  # a chain of commands, an unlisted direction; a NUL byte hangs it)
        else:
            self._moves += 1
            self._state, _, _ = self._env.step(cmd)
            obs = (self._view() if cmd == "look" or cmd.startswith("go ")
                   else _clean_feedback(self._state.feedback) or "Nothing happens.")
        won = bool(self._state.won)
        info = self._info(invalid=not valid)
        if won:
            self._done = True
            info.update(won=True, success=True, valid_actions=[])
            return f"{obs} You have completed the task.", 1.0, True, False, info
        if self._turns >= self.max_turns:
            self._done = True
            info.update(won=False, success=False, valid_actions=[])
            return obs, 0.0, False, True, info
        return obs, 0.0, False, False, info

    def valid_actions(self) -> list[str]:
        if self._state is None or self._done:
            return []
        return sorted(self._state.admissible_commands)

    def expert(self, rng: random.Random) -> ExpertStep:
        if self._spec is None or self._done:
            raise TurnRLError("household: no expert move: the episode is not running (call reset())")
        k = self._moves
        if k < len(self._spec.walkthrough):
            return ExpertStep(self._spec.walkthrough[k], self._spec.thoughts[k])
        return ExpertStep("look", "I have done every step of the plan; I look around.")

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None

    # -- internals -------------------------------------------------------------------------

    def _view(self) -> str:
        """A terse ALFWorld-like view of the player's room, rendered from the game's facts."""
        facts = [(f.name, [a.name for a in f.arguments]) for f in self._state.facts]
        at = {args[0]: args[1] for name, args in facts if name == "at"}
        here = at.get("P", "")
        state = {args[0]: name for name, args in facts if name in ("open", "closed") and len(args) == 1}
        inside: dict[str, list[str]] = {}
        for name, args in facts:
            if name in ("in", "on") and len(args) == 2 and args[1] != "I":
                inside.setdefault(args[1], []).append(args[0])
        things = []
        for thing in sorted(t for t, r in at.items() if r == here and t != "P"):
            if thing in state:
                text = f"{_article(state[thing] + ' ' + thing) if thing != 'sinkbasin' else _article(thing)}"
                if state[thing] == "open" and inside.get(thing):
                    text += f" (in it: {_join([_article(o) for o in sorted(inside[thing])])})"
            else:
                text = _article(thing)
                if inside.get(thing):
                    text += f" (on it: {_join([_article(o) for o in sorted(inside[thing])])})"
            things.append(text)
        exits = []
        for name, args in facts:
            m = re.fullmatch(r"(north|south|east|west)_of", name)
            if m and len(args) == 2 and args[1] == here:
                exits.append(f"{m.group(1)} (the {args[0]})")
        text = f"You are in the {here}."
        if things:
            text += f" You see {_join(things)}."
        if exits:
            text += f" Exits: {', '.join(sorted(exits))}."
        return text

    def _info(self, *, invalid: bool = False) -> dict[str, Any]:
        assert self._spec is not None
        return {"task_id": self._spec.task_id, "kind": self._spec.kind, "turn": self._turns, "invalid": invalid,
                "valid_actions": self.valid_actions()}


if available():
    register("household", Household)
