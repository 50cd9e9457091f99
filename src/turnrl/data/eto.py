"""Import trajectories in the format of ETO (Song et al., 2024; seed 001).

ETO (and FastChat / ShareGPT before it) stores one trajectory as::

    {"id": 17, "conversations": [{"from": "human", "value": "..."},
                                 {"from": "gpt", "value": "OK"},
                                 {"from": "human", "value": "<observation>"},
                                 {"from": "gpt", "value": "Thought: ...\\nAction: ..."}, ...],
     "reward": 0.75, "game_file": "...", ...}

either as a JSON file holding a list of such objects (``webshop_sft.json``), as JSON
Lines, one object a line (a ``.jsonl`` file is always read so, even of one line), or as one
(pretty-printed) object in a JSON file, as ETO writes each exploration output
(``outputs/.../<task id>.json``; the ``id`` then defaults to the file name). By ETO's
convention the first human message holds the task instruction (often with an in-context
example) and the first gpt reply is an "OK" acknowledgement; after that, human = observation
and gpt = the agent's turn.

The mapping is faithful, message for message: every ``human`` becomes a ``user`` message,
every ``gpt`` an ``assistant`` message (the "OK" included, as ETO trains on it), and a
``system`` entry (FastChat allows one) a ``system`` message. An assistant message's
``action`` is the text after its last ``Action:``, stripped, or None when it has none. An
item without a ``gpt`` entry is an error: a trajectory with no agent turn has nothing to train
on (training counts the agent's tokens only).

Rewards: ``reward`` (or, in ETO's exploration outputs, ``meta.reward``) becomes the
trajectory's ``return``; ``true``/``false`` read as 1/0 (ALFWorld). ``success`` is
``reward >= 1``: ETO's environments score a full success as 1 (WebShop's reward is in
[0, 1] with 1 only for a perfect purchase; ScienceWorld's score is rescaled to [0, 1];
ALFWorld's is 0 or 1). Per-step rewards are unknown, so ``rewards`` is empty. Items without
a reward key get ``default_reward`` (None: return 0, not a success); ETO's expert files carry
none for ScienceWorld and ALFWorld, where every expert trajectory succeeds, so pass
``default_reward=1.0`` for those. A reward given as null (ETO writes ``meta.reward: null``
for an episode that errored) stays missing: return 0, not a success, ``meta.reward_missing``. ``task_id`` is the ``id`` as a string; every other key
of the item goes to ``meta``, together with ``meta["eto_index"]`` (the item's position).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from turnrl.data.io import (
    NonFiniteLiteral,
    PathLike,
    check_finite,
    finite_float,
    is_finite_number,
    iter_jsonl,
    line_of_literal,
    reject_non_finite,
    unique_keys,
    write_jsonl,
)
from turnrl.data.schema import SOURCES, Message, Role, Trajectory
from turnrl.errors import TurnRLError

__all__ = ["convert_eto", "eto_item_to_trajectory", "import_eto", "parse_action"]

_ROLE_OF: dict[str, Role] = {"human": "user", "gpt": "assistant", "system": "system"}


def parse_action(text: str) -> str | None:
    """The text after the last ``Action:`` in ``text``, stripped; None if there is none."""
    i = text.rfind("Action:")
    return None if i < 0 else text[i + len("Action:") :].strip()


def _show(value: Any) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."


def _names_reward(item: dict[str, Any]) -> bool:
    """Whether the item has a reward key (``reward`` or ``meta.reward``), null or not."""
    return "reward" in item or (isinstance(item.get("meta"), dict) and "reward" in item["meta"])


def _reward(item: dict[str, Any], where: str) -> float | None:
    key, value = "reward", item.get("reward")
    if value is None and isinstance(item.get("meta"), dict):
        key, value = "meta.reward", item["meta"].get("reward")
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    if not is_finite_number(value):  # an integer too large for a float is not
        raise TurnRLError(f"{where}: '{key}' is not a number (got {_show(value)})")
    return float(value)


def eto_item_to_trajectory(
    item: Any,
    where: str,
    *,
    index: int = 0,
    env: str = "unknown",
    source: str = "import",
    split: str = "train",
    default_reward: float | None = None,
    id_prefix: str = "eto",
) -> Trajectory:
    """Convert one ETO object (already parsed) to a :class:`Trajectory`; see the module doc.

    ``where`` (``"FILE:LINE"`` or ``"FILE: item N"``) prefixes every error; ``index`` is
    the item's position in its file, used for the trajectory ``id``
    (``f"{id_prefix}-{index}"``) since ETO's ``id`` repeats across explored samples.
    """
    if not isinstance(item, dict):
        raise TurnRLError(f"{where}: expected a JSON object, got {type(item).__name__} {_show(item)}")
    for key in ("id", "conversations"):
        if key not in item:
            raise TurnRLError(f"{where}: missing key '{key}'")
    task_id = item["id"]
    if isinstance(task_id, bool) or not isinstance(task_id, str | int):
        raise TurnRLError(f"{where}: 'id' must be a string or an integer (got {_show(task_id)})")
    turns = item["conversations"]
    if not isinstance(turns, list):
        raise TurnRLError(f"{where}: 'conversations' must be a list (got {_show(turns)})")
    messages: list[Message] = []
    for i, turn in enumerate(turns):
        name = f"conversations[{i}]"
        if not isinstance(turn, dict):
            raise TurnRLError(f"{where}: {name} must be a JSON object (got {_show(turn)})")
        for key in ("from", "value"):
            if key not in turn:
                raise TurnRLError(f"{where}: missing key '{name}.{key}'")
        sender, value = turn["from"], turn["value"]
        if sender not in _ROLE_OF:
            raise TurnRLError(f"{where}: {name}.from must be one of human, gpt, system (got {_show(sender)})")
        if not isinstance(value, str):
            raise TurnRLError(f"{where}: '{name}.value' must be a string (got {_show(value)})")
        role = _ROLE_OF[sender]
        action = parse_action(value) if role == "assistant" else None
        messages.append(Message(role=role, content=value, action=action))
    if not any(m.role == "assistant" for m in messages):
        raise TurnRLError(f"{where}: no 'gpt' entry in 'conversations': a trajectory without an agent turn "
                          "has nothing to train on")

    reward = _reward(item, where)
    if reward is None and not _names_reward(item):  # an explicit null (ETO: the episode failed) stays missing
        reward = default_reward
    meta = {k: v for k, v in item.items() if k not in ("id", "conversations", "reward")}
    check_finite(meta, where, "the item's other keys")  # 1e400 reads as infinity: no writer takes it
    meta["eto_index"] = index
    if reward is None:
        meta["reward_missing"] = True
    return Trajectory(
        id=f"{id_prefix}-{index}",
        env=env,
        task_id=str(task_id),
        messages=messages,
        return_=0.0 if reward is None else reward,
        success=reward is not None and reward >= 1.0,
        split=split,
        source=source,
        meta=meta,
    )


def _iter_items(path: Path) -> Iterator[tuple[str, Any]]:
    """Yield ``(where, item)`` from a JSON list file or a JSONL file (told apart by content)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096).lstrip().lstrip(b"\xef\xbb\xbf").lstrip()
    except FileNotFoundError:
        raise TurnRLError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TurnRLError(f"{path}: is a directory, not an ETO file") from None
    jsonl = path.suffix.lower() == ".jsonl"  # JSON lines by name, even of one line: each needs its "id"
    if head.startswith(b"{") and not jsonl and (not first_line_is_json(path) or _one_line(path)):
        # One object, pretty-printed or on one line, as ETO writes an exploration output (one
        # file a task, named by the task id and without an "id" key): one item, id from the file name.
        item = _load_json(path)
        if isinstance(item, dict):
            item.setdefault("id", path.stem)
        yield str(path), item
        return
    if not head.startswith(b"["):
        for lineno, obj in iter_jsonl(path):
            yield f"{path}:{lineno}", obj
        return
    data = _load_json(path)
    for n, item in enumerate(data):
        yield f"{path}: item {n}", item


def _one_line(path: Path) -> bool:
    """Whether the file holds one non-blank line (read up to its second)."""
    seen = 0
    with open(path, "rb") as f:
        for raw in f:
            seen += bool(raw.strip(b" \t\r\n\xef\xbb\xbf"))
            if seen > 1:
                return False
    return seen == 1


def first_line_is_json(path: Path) -> bool:
    """Whether the first non-blank line is a JSON value by itself (so the file is JSONL)."""
    with open(path, "rb") as f:
        for raw in f:
            if raw.strip(b" \t\r\n\xef\xbb\xbf"):
                try:
                    json.loads(raw.decode("utf-8-sig"))
                except (UnicodeDecodeError, ValueError):
                    return False
                return True
    return False


def _load_json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise TurnRLError(f"{path}: invalid JSON: not UTF-8 text") from None
    try:
        return json.loads(text, parse_constant=reject_non_finite, parse_float=finite_float,
                          object_pairs_hook=unique_keys)
    except NonFiniteLiteral as e:
        line = line_of_literal(text, e.literal)
        raise TurnRLError(f"{path}{'' if line is None else f':{line}'}: invalid JSON: {e}") from None
    except json.JSONDecodeError as e:
        raise TurnRLError(f"{path}:{e.lineno}: invalid JSON: {e.msg} (column {e.colno})") from None
    except ValueError as e:  # e.g. an integer literal longer than Python converts
        raise TurnRLError(f"{path}: invalid JSON: {e}") from None
    except RecursionError:
        raise TurnRLError(f"{path}: invalid JSON: nested too deeply") from None


def import_eto(
    path: PathLike,
    *,
    env: str = "unknown",
    source: str = "import",
    split: str = "train",
    default_reward: float | None = None,
) -> list[Trajectory]:
    """Read an ETO trajectory file (a JSON list or JSONL) as turnrl trajectories.

    Args:
        path: the file. A JSON list is recognised by its first character ``[``.
        env: the turnrl env name to record (ETO files do not say).
        source: ``"import"`` (default), or ``"expert"`` / ``"policy"`` where known.
        split: the split to record.
        default_reward: the return of items without a reward (see the module doc).

    Errors name the item and the key, as ``FILE:LINE: ...`` for JSONL or
    ``FILE: item N: ...`` (N counted from 0) for a JSON list.
    """
    if source not in SOURCES:
        raise TurnRLError(f"source must be one of {', '.join(SOURCES)} (got {_show(source)})")
    p = Path(path)
    return [
        eto_item_to_trajectory(
            item,
            where,
            index=n,
            env=env,
            source=source,
            split=split,
            default_reward=default_reward,
            id_prefix=p.stem,
        )
        for n, (where, item) in enumerate(_iter_items(p))
    ]


def convert_eto(in_path: PathLike, out_path: PathLike, **kw: Any) -> int:
    """Convert an ETO file to turnrl JSONL (written atomically); returns the trajectory count.

    Keyword arguments go to :func:`import_eto`. Nothing is written if any item is bad, or if there
    is none (an empty file, e.g. a download cut short, would be an empty output that looks complete).
    """
    trajectories = import_eto(in_path, **kw)
    if not trajectories:
        raise TurnRLError(f"{in_path}: holds no ETO items (an empty file or list); nothing written to {out_path}")
    return write_jsonl(out_path, trajectories)
