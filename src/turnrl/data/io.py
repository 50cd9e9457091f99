"""Reading and writing trajectories and pairs as JSON Lines (DESIGN 2.2 and 7).

Two ways to write:

- :class:`JsonlWriter` appends one record a line and flushes after each, so a collection
  that is killed keeps every episode it finished. Reopening a file whose last line was cut
  short by a crash drops that partial line first, so the file stays valid.
- :func:`write_jsonl` writes a whole derived file (pairs, filtered sets) to a temporary
  file in the same folder and renames it into place: the target either holds every record
  or does not change, never half a file that looks complete.

Every reader validates every line and fails with a one-line
:class:`~turnrl.errors.TurnRLError` that says where and what, e.g.
``runs/x.jsonl:17: messages[3].role must be one of system, user, assistant (got 'bot')``.
Unknown keys are errors too (a typo must not pass silently), except inside ``meta``.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import re
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any, NoReturn

from turnrl.data.schema import PAIR_SCHEMA, ROLES, SOURCES, TRAJECTORY_SCHEMA, Message, Pair, Trajectory
from turnrl.errors import TurnRLError, did_you_mean, unknown

__all__ = [
    "SCHEMAS",
    "JsonlWriter",
    "output_target",
    "iter_jsonl",
    "iter_pairs",
    "iter_records",
    "iter_trajectories",
    "pair_from_dict",
    "read_pairs",
    "read_records",
    "read_trajectories",
    "record_from_dict",
    "summarize",
    "trajectory_from_dict",
    "write_jsonl",
]

log = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]

#: The record schemas a turnrl JSONL file may hold.
SCHEMAS = (TRAJECTORY_SCHEMA, PAIR_SCHEMA)

_TRAJECTORY_KEYS = (
    "schema", "id", "env", "task_id", "split", "source", "messages", "rewards", "return",
    "success", "terminated", "truncated", "num_turns", "meta",
)  # fmt: skip
_TRAJECTORY_REQUIRED = ("id", "env", "task_id", "messages")
_PAIR_KEYS = ("schema", "task_id", "chosen", "rejected", "meta")
_PAIR_REQUIRED = ("schema", "task_id", "chosen", "rejected")
_MESSAGE_KEYS = ("role", "content", "action", "valid", "token_ids", "logprobs", "note", "cut")
_AGENT_ONLY_KEYS = ("action", "valid", "token_ids", "logprobs", "note", "cut")


# --------------------------------------------------------------------------- validation


def _fail(where: str, msg: str) -> NoReturn:
    raise TurnRLError(f"{where}: {msg}" if where else msg)


def _show(value: Any) -> str:
    """A short ``repr`` of a bad value, for error messages (one line, at most 60 chars)."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."


def _qual(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_finite_number(value: Any) -> bool:
    """A number that is a finite float (an integer too large for a float is not)."""
    try:
        return _is_number(value) and math.isfinite(value)
    except OverflowError:
        return False


def check_finite(value: Any, where: str, name: str) -> None:
    """A one-line error naming the first number under ``value`` that is not finite (``1e400``
    reads as infinity, and no writer here writes it back)."""
    if isinstance(value, float) and not math.isfinite(value):
        _fail(where, f"{name} is not a finite number (got {value})")
    elif isinstance(value, dict):
        for k, v in value.items():
            check_finite(v, where, f"{name}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            check_finite(v, where, f"{name}[{i}]")


def _check_object(value: Any, where: str, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        _fail(where, f"{name} must be a JSON object (got {_show(value)})")
    return value


def _check_keys(
    d: Mapping[str, Any], allowed: tuple[str, ...], required: tuple[str, ...], where: str, prefix: str
) -> None:
    """Unknown keys first (a typo then gets a suggestion), then missing keys."""
    for key in d:
        if key not in allowed:
            _fail(where, f"unknown key '{_qual(prefix, key)}'{did_you_mean(key, allowed)}")
    for key in required:
        if key not in d:
            _fail(where, f"missing key '{_qual(prefix, key)}'")


def _get_str(d: Mapping[str, Any], key: str, where: str, prefix: str, default: str | None = None) -> str:
    value = d.get(key, default)
    if not isinstance(value, str):
        _fail(where, f"'{_qual(prefix, key)}' must be a string (got {_show(value)})")
    return value


def _get_opt_str(d: Mapping[str, Any], key: str, where: str, prefix: str) -> str | None:
    value = d.get(key)
    if value is not None and not isinstance(value, str):
        _fail(where, f"'{_qual(prefix, key)}' must be a string or null (got {_show(value)})")
    return value


def _get_bool(d: Mapping[str, Any], key: str, where: str, prefix: str, default: bool = False) -> bool:
    value = d.get(key, default)
    if not isinstance(value, bool):
        _fail(where, f"'{_qual(prefix, key)}' must be true or false (got {_show(value)})")
    return value


def _get_number(d: Mapping[str, Any], key: str, where: str, prefix: str, default: float) -> float:
    value = d.get(key, default)
    if not is_finite_number(value):
        _fail(where, f"'{_qual(prefix, key)}' is not a number (got {_show(value)})")
    return float(value)


def _number_list(value: Any, what: str, where: str, *, integers: bool = False) -> list[Any]:
    kind = "integers" if integers else "numbers"
    if not isinstance(value, list):
        _fail(where, f"{what} must be a list of {kind} (got {_show(value)})")
    for i, x in enumerate(value):
        ok = (
            isinstance(x, int) and not isinstance(x, bool) if integers else is_finite_number(x)
        )
        if not ok:
            _fail(where, f"{what} must be a list of {kind} (item {i} is {_show(x)})")
    return value if integers else [float(x) for x in value]


def _message(d: Any, where: str, name: str) -> Message:
    d = _check_object(d, where, name)
    _check_keys(d, _MESSAGE_KEYS, ("role", "content"), where, name)
    role = d["role"]
    if role not in ROLES:
        _fail(where, f"{name}.role must be one of {', '.join(ROLES)} (got {_show(role)})")
    content = _get_str(d, "content", where, name)
    if role != "assistant":
        for key in _AGENT_ONLY_KEYS:
            if key in d:
                _fail(where, f"{name}.{key} is only allowed on assistant messages (this one is '{role}')")
    action = _get_opt_str(d, "action", where, name)
    note = _get_opt_str(d, "note", where, name)
    valid, cut = d.get("valid"), d.get("cut")
    for key, value in (("valid", valid), ("cut", cut)):
        if value is not None and not isinstance(value, bool):
            _fail(where, f"'{name}.{key}' must be true, false or null (got {_show(value)})")
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    if d.get("token_ids") is not None:
        token_ids = _number_list(d["token_ids"], f"{name}.token_ids", where, integers=True)
        bad = next((i for i, t in enumerate(token_ids) if not 0 <= t < 2**31), None)
        if bad is not None:  # a tokenizer decodes ids of 32 bits at most: larger ones crashed training
            _fail(where, f"{name}.token_ids[{bad}] must be a token id in [0, 2**31) (got {token_ids[bad]})")
    if d.get("logprobs") is not None:
        if token_ids is None:
            _fail(where, f"{name}.logprobs needs {name}.token_ids (one log-prob per token)")
        logprobs = _number_list(d["logprobs"], f"{name}.logprobs", where)
        if len(logprobs) != len(token_ids):
            _fail(where, f"{name}.logprobs has {len(logprobs)} entries but token_ids has {len(token_ids)}")
    return Message(
        role=role,
        content=content,
        action=action,
        valid=valid,
        token_ids=token_ids,
        logprobs=logprobs,
        note=note,
        cut=cut,
    )


def _check_schema(d: Mapping[str, Any], expected: str, where: str, prefix: str) -> None:
    if "schema" not in d:
        return
    schema = d["schema"]
    if schema == expected:
        return
    inside = f" in '{prefix}'" if prefix else ""
    if schema in SCHEMAS:
        _fail(where, f"expected a '{expected}' record{inside}, got a '{schema}' one")
    _fail(
        where,
        f"unknown schema {_show(schema)}{inside}{did_you_mean(str(schema), SCHEMAS)}; expected '{expected}'",
    )


def _trajectory(d: Any, where: str, prefix: str, *, need_schema: bool) -> Trajectory:
    d = _check_object(d, where, prefix or "a record")
    required = ("schema", *_TRAJECTORY_REQUIRED) if need_schema else _TRAJECTORY_REQUIRED
    _check_schema(d, TRAJECTORY_SCHEMA, where, prefix)  # first: another record has other keys
    _check_keys(d, _TRAJECTORY_KEYS, required, where, prefix)

    def q(key: str) -> str:
        return _qual(prefix, key)

    messages_raw = d["messages"]
    if not isinstance(messages_raw, list):
        _fail(where, f"{q('messages')} must be a list of messages (got {_show(messages_raw)})")
    messages = [_message(m, where, f"{q('messages')}[{i}]") for i, m in enumerate(messages_raw)]
    n_agent = sum(1 for m in messages if m.role == "assistant")

    rewards = _number_list(d.get("rewards", []), q("rewards"), where)
    if rewards and len(rewards) != n_agent:
        _fail(
            where,
            f"{q('rewards')} has {len(rewards)} entries but there are {n_agent} assistant messages "
            "(one reward per agent turn, or none)",
        )
    if "num_turns" in d:
        num_turns = d["num_turns"]
        if not isinstance(num_turns, int) or isinstance(num_turns, bool):
            _fail(where, f"'{q('num_turns')}' must be an integer (got {_show(num_turns)})")
        if num_turns != n_agent:
            _fail(where, f"{q('num_turns')} is {num_turns} but there are {n_agent} assistant messages")
    source = _get_str(d, "source", where, prefix, "policy")
    if source not in SOURCES:
        _fail(where, f"{q('source')} must be one of {', '.join(SOURCES)} (got {_show(source)})")
    meta = d.get("meta", {})
    if not isinstance(meta, dict):
        _fail(where, f"{q('meta')} must be a JSON object (got {_show(meta)})")
    check_finite(meta, where, q("meta"))
    return Trajectory(
        id=_get_str(d, "id", where, prefix),
        env=_get_str(d, "env", where, prefix),
        task_id=_get_str(d, "task_id", where, prefix),
        messages=messages,
        rewards=rewards,
        return_=_get_number(d, "return", where, prefix, math.fsum(rewards)),
        success=_get_bool(d, "success", where, prefix),
        terminated=_get_bool(d, "terminated", where, prefix),
        truncated=_get_bool(d, "truncated", where, prefix),
        split=_get_str(d, "split", where, prefix, "train"),
        source=source,
        meta=meta,
    )


def trajectory_from_dict(d: Mapping[str, Any], where: str = "") -> Trajectory:
    """Validate one parsed JSON object as a ``turnrl.trajectory/v1`` record.

    ``where`` (``"FILE:LINE"``) prefixes every error. Required keys: ``schema``, ``id``,
    ``env``, ``task_id``, ``messages``; the rest take the :class:`Trajectory` defaults
    (``return`` defaults to the sum of ``rewards``). Checks: no unknown keys (outside
    ``meta``), types, roles, the agent-only message keys (``action``, ``valid``,
    ``token_ids``, ``logprobs``, ``note``) appear on assistant messages only, ``logprobs``
    has one entry per token id, ``rewards`` is empty or has one entry per assistant message,
    ``num_turns`` (if given) equals the number of assistant messages, numbers are finite.

    Raises:
        TurnRLError: ``"FILE:LINE: what is wrong"``.
    """
    return _trajectory(d, where, "", need_schema=True)


def pair_from_dict(d: Mapping[str, Any], where: str = "") -> Pair:
    """Validate one parsed JSON object as a ``turnrl.pair/v1`` record.

    ``chosen`` and ``rejected`` are validated as trajectories (their own ``schema`` key may
    be left out); errors inside them name the path, e.g. ``chosen.messages[2].role``. Both are
    of the pair's ``task_id`` and of one env (``unknown``, an import's default, matches any).

    Raises:
        TurnRLError: ``"FILE:LINE: what is wrong"``.
    """
    d = _check_object(d, where, "a record")
    _check_schema(d, PAIR_SCHEMA, where, "")
    _check_keys(d, _PAIR_KEYS, _PAIR_REQUIRED, where, "")
    meta = d.get("meta", {})
    if not isinstance(meta, dict):
        _fail(where, f"meta must be a JSON object (got {_show(meta)})")
    check_finite(meta, where, "meta")
    pair = Pair(
        task_id=_get_str(d, "task_id", where, ""),
        chosen=_trajectory(d["chosen"], where, "chosen", need_schema=False),
        rejected=_trajectory(d["rejected"], where, "rejected", need_schema=False),
        meta=meta,
    )
    for side in ("chosen", "rejected"):  # both sides play the pair's task: a preference between two prompts is none
        if getattr(pair, side).task_id != pair.task_id:
            _fail(where, f"{side}.task_id {_show(getattr(pair, side).task_id)} is not the pair's task_id "
                         f"{_show(pair.task_id)}")
    envs = {pair.chosen.env, pair.rejected.env} - {"unknown"}  # an import's default env matches any
    if len(envs) > 1:
        _fail(where, f"chosen.env {_show(pair.chosen.env)} and rejected.env {_show(pair.rejected.env)} differ")
    return pair


def record_from_dict(d: Mapping[str, Any], where: str = "") -> Trajectory | Pair:
    """Validate one parsed object as whichever record its ``schema`` key names."""
    d = _check_object(d, where, "a record")
    if "schema" not in d:
        _fail(where, "missing key 'schema'")
    schema = d["schema"]
    if schema == TRAJECTORY_SCHEMA:
        return trajectory_from_dict(d, where)
    if schema == PAIR_SCHEMA:
        return pair_from_dict(d, where)
    _fail(where, str(unknown("schema", str(schema), SCHEMAS)))


# --------------------------------------------------------------------------- reading


def iter_jsonl(path: PathLike) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for each non-blank line of a JSONL file.

    Line numbers start at 1. Raises :class:`TurnRLError` for a missing file
    (``FILE: no such file``), a line that is not valid UTF-8 or JSON
    (``FILE:LINE: invalid JSON: <reason>``) or not a JSON object.
    """
    name = str(path)
    try:
        f = open(path, "rb")  # bytes, so that a bad byte gets its line number
    except FileNotFoundError:
        raise TurnRLError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise TurnRLError(f"{name}: is a directory, not a JSONL file") from None
    except PermissionError:
        raise TurnRLError(f"{name}: permission denied") from None
    with f:
        for lineno, raw in enumerate(f, start=1):
            where = f"{name}:{lineno}"
            try:
                text = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise TurnRLError(f"{where}: invalid JSON: not UTF-8 text (byte {e.start + 1})") from None
            if not text.strip(" \t\r\n"):  # str.strip() would also take control and Unicode spaces
                continue
            try:
                obj = json.loads(text.rstrip("\r\n"), parse_constant=reject_non_finite, object_pairs_hook=unique_keys)
            except json.JSONDecodeError as e:
                hint = (
                    ""
                    if raw.endswith(b"\n")
                    else "; the last line is incomplete (was the writer interrupted?)"
                )
                raise TurnRLError(f"{where}: invalid JSON: {e.msg} (column {e.colno}){hint}") from None
            except ValueError as e:  # e.g. an integer literal longer than Python converts
                raise TurnRLError(f"{where}: invalid JSON: {e}") from None
            except RecursionError:
                raise TurnRLError(f"{where}: invalid JSON: nested too deeply") from None
            if not isinstance(obj, dict):
                raise TurnRLError(f"{where}: expected a JSON object, got {type(obj).__name__} {_show(obj)}")
            yield lineno, obj


def iter_records(path: PathLike) -> Iterator[Trajectory | Pair]:
    """Yield each validated record of a file, a :class:`Trajectory` or :class:`Pair` by its schema."""
    for lineno, obj in iter_jsonl(path):
        yield record_from_dict(obj, f"{path}:{lineno}")


def iter_trajectories(path: PathLike) -> Iterator[Trajectory]:
    """Yield the trajectories of a file one at a time; any other record is an error."""
    for lineno, obj in iter_jsonl(path):
        yield trajectory_from_dict(obj, f"{path}:{lineno}")


def iter_pairs(path: PathLike) -> Iterator[Pair]:
    """Yield the pairs of a file one at a time; any other record is an error."""
    for lineno, obj in iter_jsonl(path):
        yield pair_from_dict(obj, f"{path}:{lineno}")


def read_trajectories(path: PathLike) -> list[Trajectory]:
    """Read and validate a file of trajectories."""
    return list(iter_trajectories(path))


def read_pairs(path: PathLike) -> list[Pair]:
    """Read and validate a file of preference pairs."""
    return list(iter_pairs(path))


def read_records(path: PathLike) -> list[Trajectory | Pair]:
    """Read and validate a file that may mix trajectories and pairs (dispatch on ``schema``)."""
    return list(iter_records(path))


# --------------------------------------------------------------------------- writing


def _record_dict(record: Any) -> dict[str, Any]:
    if hasattr(record, "to_dict") and callable(record.to_dict):
        d = record.to_dict()
    else:
        d = record
    if not isinstance(d, Mapping):
        raise TypeError(
            f"cannot write a {type(record).__name__}: expected a dict or an object with to_dict()"
        )
    return dict(d)


class NonFiniteLiteral(ValueError):
    """A number literal that reads as no finite float; ``literal`` is its text as written."""

    def __init__(self, literal: str, message: str):
        super().__init__(message)
        self.literal = literal


def finite_float(text: str) -> float:
    """``json.loads(..., parse_float=finite_float)``: a literal too large for a float (``1e400``)
    is refused where it is read, as ``NaN`` is (:func:`reject_non_finite`)."""
    value = float(text)
    if not math.isfinite(value):
        raise NonFiniteLiteral(text, f"{text} is too large for a float")
    return value


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads(..., object_pairs_hook=unique_keys)``: a key given twice in one object is refused
    (Python's reader keeps the last value in silence, so ``"return": 1, ..., "return": -1`` read as -1)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"key '{key}' given twice in one object")
            seen.add(key)
    return obj


def reject_non_finite(name: str) -> Any:
    """``json.loads(..., parse_constant=reject_non_finite)``: Python's reader takes ``NaN`` and
    ``Infinity``, which are not JSON and which no turnrl writer can write back; refuse them where
    they are read, so the error names the input rather than a later output."""
    raise NonFiniteLiteral(name, f"{name} is not a JSON number")


def line_of_literal(text: str, literal: str) -> int | None:
    """The 1-based line of the first ``literal`` in JSON ``text`` outside a string (where the reader
    met it: it reads in order), or None if there is none. Python's reader gives no position for a
    literal its callbacks refuse, so a multi-line file's error finds it again this way."""
    pattern = re.compile(r'"(?:[^"\\]|\\.)*"|(?<![\w.+-])' + re.escape(literal) + r"(?![\w.])")
    for m in pattern.finditer(text):
        if not m.group().startswith('"'):
            return text.count("\n", 0, m.start()) + 1
    return None


def _encode(record: Any, path: Path) -> bytes:
    try:
        line = json.dumps(_record_dict(record), ensure_ascii=False, allow_nan=False)
    except ValueError as e:  # NaN or infinity: not JSON, and no reader would take it back
        raise ValueError(f"{path}: cannot write a record with a non-finite number: {e}") from None
    return (line + "\n").encode("utf-8")


def _is_complete_line(data: bytes) -> bool:
    try:
        return isinstance(json.loads(data.decode("utf-8")), dict)
    except (UnicodeDecodeError, ValueError):
        return False


def _lock(f: IO[bytes], path: Path) -> None:
    """An exclusive, non-blocking ``flock`` on ``f`` (released when it closes); a one-line error
    when another writer holds it. Without ``fcntl`` (Windows) there is no lock."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        return
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise TurnRLError(f"{path}: another writer has it open (a run still going?); wait for it to end "
                          "or write elsewhere") from None
    except OSError as e:  # a file system without flock (NFS without a lock daemon, some Lustre mounts)
        if e.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
            raise
        log.warning("%s: cannot be locked on this file system (%s); two writers of it would not be told apart",
                    path, e.strerror)


def _repair_tail(path: Path, durable: bool) -> int:
    """Make ``path`` end with a newline: a last line cut short by a crash is dropped,
    a complete last line that only lacks its newline gets one. Returns bytes dropped."""
    with open(path, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        pos, keep = size, 0
        while pos > 0:  # find the last newline, reading backwards in chunks
            start = max(0, pos - (1 << 16))
            f.seek(start)
            i = f.read(pos - start).rfind(b"\n")
            if i >= 0:
                keep = start + i + 1
                break
            pos = start
        f.seek(keep)
        if _is_complete_line(f.read()):
            f.seek(size)
            f.write(b"\n")
            dropped = 0
        else:
            f.truncate(keep)
            dropped = size - keep
        f.flush()
        if durable:
            os.fsync(f.fileno())
    return dropped


class JsonlWriter:
    """Append records to a JSONL file, one line each, flushed as it is written.

    Use as a context manager::

        with JsonlWriter("runs/x/trajectories.jsonl") as out:
            for episode in episodes:
                out.write(episode)          # a Trajectory, a Pair, or a dict

    Args:
        path: the file; missing parent folders are created.
        append: add to an existing file (default) or start it afresh.
        durable: also ``os.fsync`` after each record (survives power loss, not only a
            killed process; slower).

    When appending to a file whose last line is incomplete (the previous writer died
    mid-write), that partial line is removed first and :attr:`dropped_bytes` says how many
    bytes went; a complete last line that only lacks its newline is kept.

    A writer holds an exclusive lock on a regular file (``flock``, where the file system has it)
    from :meth:`open` to :meth:`close`: a second writer of the same file, in this process or
    another, is refused with a one-line :class:`~turnrl.errors.TurnRLError` before it repairs
    or truncates anything (repairing under a running writer would cut its finished records).
    Devices and pipes (``/dev/null``, a FIFO) are written as they are.
    """

    def __init__(self, path: PathLike, *, append: bool = True, durable: bool = False):
        self.path = Path(path)
        self.append = append
        self.durable = durable
        #: Bytes of an incomplete last line removed when the file was opened.
        self.dropped_bytes = 0
        #: Records written through this writer.
        self.count = 0
        self._file: IO[bytes] | None = None

    def open(self) -> JsonlWriter:
        """Open the file (done by ``with``); returns ``self``."""
        if self._file is not None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        existed = self.path.exists()
        regular = not existed or self.path.is_file()
        # a file is truncated below, under the lock, when not appending; a pipe is opened as it is
        f = open(self.path, "ab" if self.append or regular else "wb")
        try:
            if regular:  # a device or a pipe (/dev/null, a FIFO) has no records to guard or repair
                _lock(f, self.path)
            if not self.append:
                if regular:
                    f.truncate(0)
            elif existed and regular:
                self.dropped_bytes = _repair_tail(self.path, self.durable)
                if self.dropped_bytes:
                    log.warning(
                        "%s: dropped an incomplete last line (%d bytes) left by an interrupted write",
                        self.path,
                        self.dropped_bytes,
                    )
        except BaseException:
            f.close()
            raise
        self._file = f
        return self

    def write(self, record: Any) -> None:
        """Write one record (a dict, or an object with ``to_dict()``) as one line, then flush."""
        if self._file is None:
            raise ValueError(f"{self.path}: writer is not open (use 'with JsonlWriter(...) as w:')")
        self._file.write(_encode(record, self.path))
        self._file.flush()
        if self.durable:
            os.fsync(self._file.fileno())
        self.count += 1

    def close(self) -> None:
        """Close the file (done by ``with``)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    @property
    def closed(self) -> bool:
        return self._file is None

    def __enter__(self) -> JsonlWriter:
        return self.open()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def output_target(path: PathLike) -> tuple[Path, bool]:
    """Where a whole-file write to ``path`` lands, and whether it must go straight in: a symlink's
    target (renaming a new file over the link would leave its target stale), and True for a
    special file (a device such as ``/dev/null``, a FIFO), which a rename would replace."""
    real = Path(os.path.realpath(path))
    return real, real.exists() and not real.is_file() and not real.is_dir()


def write_jsonl(path: PathLike, records: Iterable[Any], *, durable: bool = True) -> int:
    """Write a whole JSONL file atomically and return how many records it holds.

    The records go to a temporary file in the target's folder, which is then renamed over
    the target; if anything fails on the way, the temporary file is removed and the target
    is left as it was. For derived outputs (pairs, filtered sets), so that nothing
    half-written ever looks complete. Records are dicts or objects with ``to_dict()``.
    """
    target, special = output_target(path)
    if special:  # nothing to make atomic: written through
        written = 0
        with open(target, "wb") as f:
            for record in records:
                f.write(_encode(record, Path(path)))
                written += 1
        return written
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    count = 0
    try:
        with os.fdopen(fd, "wb") as f:
            for record in records:
                f.write(_encode(record, target))
                count += 1
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    if durable and hasattr(os, "O_DIRECTORY"):
        dir_fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return count


# --------------------------------------------------------------------------- summary


def _mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _margin(pair: Pair) -> float:
    """The returns that decided ``pair``: ``meta.chosen_return`` / ``meta.rejected_return`` where the
    builder recorded them, else the sides' own (the same for uncut sides)."""
    got = [pair.meta.get(f"{side}_return") for side in ("chosen", "rejected")]
    ours = [pair.chosen.return_, pair.rejected.return_]
    chosen, rejected = (float(g) if isinstance(g, (int, float)) and not isinstance(g, bool) else o
                        for g, o in zip(got, ours, strict=True))
    return chosen - rejected


def summarize(path: PathLike) -> dict[str, Any]:
    """Validate a file and describe it (what ``turnrl data validate`` prints).

    Returns a JSON-ready dict: ``path``, ``records``, ``trajectories``, ``pairs``;
    over the trajectories ``by_env``, ``by_split``, ``by_source`` (counts),
    ``success_rate``, ``avg_return``, ``avg_turns`` (None without trajectories); and over
    the pairs ``pairs_by_env`` (the chosen trajectory's env) and ``avg_return_margin``
    (chosen minus rejected return, as the pair recorded them where it did: a side cut after a turn
    (step pairs, ``--truncate-k``) keeps its kept turns' rewards only; None without pairs).
    """
    trajectories: list[Trajectory] = []
    pairs: list[Pair] = []
    for record in iter_records(path):
        if isinstance(record, Pair):
            pairs.append(record)
        else:
            trajectories.append(record)
    return {
        "path": str(path),
        "records": len(trajectories) + len(pairs),
        "trajectories": len(trajectories),
        "pairs": len(pairs),
        "by_env": dict(sorted(Counter(t.env for t in trajectories).items())),
        "by_split": dict(sorted(Counter(t.split for t in trajectories).items())),
        "by_source": dict(sorted(Counter(t.source for t in trajectories).items())),
        "success_rate": _mean([float(t.success) for t in trajectories]),
        "avg_return": _mean([t.return_ for t in trajectories]),
        "avg_turns": _mean([float(t.num_turns) for t in trajectories]),
        "pairs_by_env": dict(sorted(Counter(p.chosen.env for p in pairs).items())),
        "avg_return_margin": _mean([_margin(p) for p in pairs]),
    }
