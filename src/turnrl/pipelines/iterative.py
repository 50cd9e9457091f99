"""A small resumable skeleton for iterative pipelines.

A pipeline is a sequence of *stages*; each stage is a function that writes its output (a
file or a directory) and returns a small JSON-able result. :func:`run_stage` runs a stage
unless its **completion marker** ``<output>.done.json`` exists; the marker, which holds the
stage's result, is written last and atomically (temporary file then rename), so a marker
on disk means the output is complete. A pipeline killed in the middle of a stage reruns
only that stage, and the stage itself resumes from what it left:

* collection stages append one finished episode at a time to a JSONL file and skip the
  episodes already there (:func:`turnrl.collect.run_policy`);
* training stages resume from the trainer core's newest checkpoint (``resume=True``);
* pure stages (pair building, reports) are cheap and are simply redone.

Iteration ``i`` of a pipeline writes under ``OUT/iter-i/`` (:func:`iter_dir`): its
trajectories, pairs, checkpoint (the trainer's output directory) and eval report.

A marker does not record the settings its stage ran with, so a pipeline first calls
:func:`check_settings`: ``OUT/settings.json`` keeps the settings ``OUT`` was made with, and a
later run with other settings is refused (a finished stage would otherwise be reused as if it
had run with the new ones), except for the settings named free (e.g. ``iterations``: more
iterations add stages and change none). It also records the command that made ``OUT``
(``"command"``): another command's folder (``turnrl eto``'s given to ``turnrl quickstart``) is refused.

Example::

    explored = run_stage(it / "explore.jsonl", lambda p: explore(model, p))
    pairs = run_stage(it / "pairs.jsonl", lambda p: build_pairs(p, explored_path))
    run_stage(it / "train", lambda p: train(ref=model, pairs=pairs_path, out=p))
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnrl.errors import TurnRLError, check_output
from turnrl.train.core import atomic_write_json, flat_settings

StageFn = Callable[[Path], Any]
"""A stage: receives its output path, writes it, returns a JSON-able result (or None)."""

__all__ = ["Stage", "StageFn", "check_settings", "is_done", "iter_dir", "made_by", "mark_done", "marker_path",
           "read_done", "run_stage"]

SETTINGS_FILE = "settings.json"
#: The key of ``settings.json`` naming the command that made the folder (:func:`check_settings`).
COMMAND_KEY = "command"
#: The key of ``settings.json`` recording where the folder holding OUT was (absolute and as given):
#: paths under it in the settings may follow a moved folder (:func:`check_settings`).
LOCATION_KEY = "location"
#: Commands that run one pipeline and may resume each other's folders (``turnrl dmpo`` is
#: ``turnrl eto loss=dmpo``): compared as the command they map to.
SAME_PIPELINE = {"dmpo": "eto"}

_command: contextvars.ContextVar[str | None] = contextvars.ContextVar("turnrl_command", default=None)


@contextlib.contextmanager
def made_by(command: str) -> Iterator[None]:
    """Within it, :func:`check_settings` records (and checks) ``command`` as the command that makes
    a pipeline's folder, unless it is given one: the command line wraps each pipeline command in it."""
    token = _command.set(command)
    try:
        yield
    finally:
        _command.reset(token)


def marker_path(output: str | Path) -> Path:
    """The completion marker of ``output``: ``<output>.done.json`` next to it."""
    output = Path(output)
    return output.with_name(output.name + ".done.json")


def is_done(output: str | Path) -> bool:
    """True when ``output``'s stage has finished (its marker exists)."""
    return marker_path(output).is_file()


def read_done(output: str | Path) -> Any:
    """The result a finished stage recorded in its marker. Paths in it that point into the run's
    folder follow the folder when it was copied or moved since (the marker records where it was)."""
    record = json.loads(marker_path(output).read_text())
    then_abs, then_given = record.get("dir"), record.get("dir_as_given")
    if not isinstance(then_abs, str) or not isinstance(then_given, str):
        return record["result"]  # a marker of before 29 Nov 2026: as recorded
    return _rebase(record["result"], (then_abs, str(Path(output).resolve().parent)),
                   (then_given, str(Path(output).parent)))


def mark_done(output: str | Path, result: Any = None, seconds: float | None = None) -> None:
    """Write ``output``'s completion marker (atomically); call it after the output is complete."""
    atomic_write_json(marker_path(output), {"result": result, "seconds": seconds,
                                            "dir": str(Path(output).resolve().parent),
                                            "dir_as_given": str(Path(output).parent)})


def _rebase(value: Any, absolute: tuple[str, str], given: tuple[str, str]) -> Any:
    """``value`` with every path string under the marker's folder as it was (``(then, now)``: the
    absolute folder for absolute paths, the folder as given for relative ones) moved under the
    folder as it is now. Paths elsewhere are left alone; each string moves at most once."""
    if isinstance(value, str):
        old, new = absolute if os.path.isabs(value) else given
        if old != new and (value == old or value.startswith(old.rstrip("/") + "/")):
            return new + value[len(old):]
        return value
    if isinstance(value, list):
        return [_rebase(v, absolute, given) for v in value]
    if isinstance(value, dict):
        return {k: _rebase(v, absolute, given) for k, v in value.items()}
    return value


#: Settings that are free-form dicts (an env's options, compare's ``sppo`` section) rather than
#: configs: compared whole, so that an option added to or dropped from one is a difference. A key
#: of a config that only one side knows (a setting another turnrl version added) is not compared.
FREE_FORM = ("env_opts", "sppo")


def _flat(settings: dict[str, Any]) -> dict[str, Any]:
    """``{"train": {"lr": 1e-5}}`` -> ``{"train.lr": 1e-5}`` (lists and :data:`FREE_FORM` dicts stay whole)."""
    return flat_settings(settings, whole=FREE_FORM)


def _get(tree: dict[str, Any], key: str) -> Any:
    """``tree``'s value at the dotted ``key`` (a section of :func:`_flat`'s keys)."""
    for part in key.split("."):
        tree = tree[part]
    return tree


def start_model_fingerprints(**models: str | Path | None) -> dict[str, Any]:
    """Settings entries that pin the weights of the models a run starts from (given by folder or hub
    id; None, the embedded ``tiny``, which OUT builds, and a hub id not in the hub cache yet are left
    out): a model replaced in place under the same path is then another setting, and its finished
    stages are not reused. Folders
    made before this key existed lack it and resume as before (a key one side lacks is not compared)."""
    from turnrl.models.loading import model_files, model_fingerprint

    # a hub id not downloaded yet is left out: its name's fingerprint would differ from the snapshot's
    # once the run downloads it, refusing the run's own resume
    prints = {k: model_fingerprint(str(v)) for k, v in models.items()
              if v is not None and str(v) != "tiny" and model_files(str(v)) is not None}
    return {"model_fingerprints": prints} if prints else {}


def check_settings(out: str | Path, settings: dict[str, Any], *, free: tuple[str, ...] = (),
                   command: str | None = None, what: str = "out") -> None:
    """Refuse to resume ``out`` with settings other than those it was made with.

    ``OUT/settings.json`` holds the settings of the run that made ``out`` (written by the first
    run). A later run must agree on every key both know, except those in ``free`` and below them
    (``"iterations"``, ``"seeds"``): the first differing keys are named in a one-line error.
    A key only one side knows (a setting added or removed by another turnrl version) is not
    compared; a setting that is a value on one side and a section on the other is (``lora: null``
    then ``lora: {r: 8}``). A folder made before settings were recorded (it holds stage markers) is
    taken as made with these; any other folder that holds files is refused (:func:`_check_unclaimed`).

    ``command`` (default: the one :func:`made_by` set, if any) is recorded as settings.json's
    ``"command"``: a folder another command made (``turnrl eto``'s in ``turnrl quickstart``) is
    refused, whatever the settings; a folder whose settings.json names none is compared as above.
    ``out`` must be a folder or a path that can become one (``what`` names it in the error).

    settings.json also records where the folder holding ``out`` was (``"location"``): a setting that
    is a path under it then (``turnrl compare`` gives its eto rows the seed's SFT agent, demos and
    exploration) equals the same path under that folder now, so a moved or copied run resumes."""
    check_output(out, what, directory=True)  # a file, or a path under one: one line, not a traceback
    path = Path(out) / SETTINGS_FILE
    now = json.loads(json.dumps(settings, default=str))
    command = command if command is not None else _command.get()
    if not path.is_file():
        _check_unclaimed(Path(out), what)
    if path.is_file():
        try:
            before = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise TurnRLError(f"{path}: unreadable ({e}); remove it to accept this run's settings") from None
        before = dict(before) if isinstance(before, dict) else {}
        made = before.pop(COMMAND_KEY, None)
        if isinstance(made, str) and command is not None and \
                SAME_PIPELINE.get(made, made) != SAME_PIPELINE.get(command, command):
            raise TurnRLError(f"{what} {out}: made by 'turnrl {made}' ({path}), not by 'turnrl {command}': its "
                              f"finished stages are another command's; choose another {what} or remove it")
        if command is None and isinstance(made, str):
            command = made  # a library call resuming a command's folder keeps its record
        where = before.pop(LOCATION_KEY, None)
        old, new = _flat(before), _flat(now)
        moved = _moved(where, out)
        changed = {k: (old[k], new[k]) for k in new
                   if k in old and old[k] != new[k] and (moved is None or _rebase(old[k], *moved) != new[k])}
        # a setting that is a value on one side and a section on the other (``lora: null`` then
        # ``lora: {r: 8}``) flattens to keys only one side knows, but it is no added setting: it changed
        for k in [*new, *old]:
            parts = k.split(".")
            for p in (".".join(parts[:j]) for j in range(1, len(parts))):
                if p in old and p not in new:  # a value before, a section now
                    changed.setdefault(p, (old[p], _get(now, p)))
                elif p in new and p not in old:  # a section before, a value now
                    changed.setdefault(p, (_get(before, p), new[p]))
        diff = [k for k in changed if not any(k == f or k.startswith(f + ".") for f in free)]
        if diff:
            shown = "; ".join(f"{k}: {json.dumps(changed[k][0])}, now {json.dumps(changed[k][1])}" for k in diff[:3])
            more = f" and {len(diff) - 3} more" if len(diff) > 3 else ""
            raise TurnRLError(f"{out}: made with other settings ({shown}{more}): its finished stages would be reused "
                              f"as if run with these; choose another {what} or remove it")
    Path(out).mkdir(parents=True, exist_ok=True)
    location = {"dir": str(Path(out).resolve().parent), "dir_as_given": str(Path(out).parent)}
    atomic_write_json(path, {**now, **({COMMAND_KEY: command} if command is not None else {}), LOCATION_KEY: location})


def _check_unclaimed(out: Path, what: str) -> None:
    """Refuse a folder without settings.json that holds files, unless a pipeline made it before
    settings were recorded (it then holds stage markers, ``*.done.json``, or a greedy study's
    ``study.json``, its record before 27 Nov 2026): a folder of the user's or of another command
    (``turnrl train sft``'s) would be taken over, and its ``summary.json`` replaced."""
    if not out.is_dir():
        return
    held = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    if not held or "study.json" in held or any(out.glob("*.done.json")) or any(out.glob("*/*.done.json")):
        return
    shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
    raise TurnRLError(f"{what} {out}: holds files ({shown}) but no {SETTINGS_FILE}, so no pipeline made it: its files "
                      f"would be replaced; choose another {what} or empty it")


def _moved(where: Any, out: str | Path) -> tuple[tuple[str, str], tuple[str, str]] | None:
    """The ``(then, now)`` folder pairs (absolute, as given) that :func:`_rebase` takes, from a
    settings.json's :data:`LOCATION_KEY` record; None when it has none (made before 30 Nov 2026)."""
    if not isinstance(where, dict) or not isinstance(where.get("dir"), str) or \
            not isinstance(where.get("dir_as_given"), str):
        return None
    return (where["dir"], str(Path(out).resolve().parent)), (where["dir_as_given"], str(Path(out).parent))


def iter_dir(out: str | Path, i: int) -> Path:
    """``OUT/iter-i``, created."""
    d = Path(out) / f"iter-{i}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists and, where ``/proc`` tells, is not a zombie (a dead
    process its parent has not reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X")


def _started(pid: int) -> str:
    """When process ``pid`` started, in clock ticks since boot (``/proc/PID/stat``'s 22nd field), with
    the boot's id: with its pid, this names one process, which a pid alone does not (pids are reused,
    after a container's restart from 1). ``""`` where ``/proc`` does not tell (not Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""
    fields = stat[stat.rfind(")") + 2:].split()  # after the command name, which may hold spaces
    return f"{boot}:{fields[19]}" if len(fields) > 19 else ""


def _holder(lock: Path) -> tuple[int, str]:
    """The pid a lock file names and the start (:func:`_started`) that its ``.start`` file beside it
    records for that pid; ``0`` and ``""`` where unreadable. The lock file holds the bare pid, as code
    of before 30 Nov 2026 writes and reads it, so that a run of that code beside one of this reads a
    live lock as held."""
    try:
        pid = int(lock.read_text().strip() or 0)
    except (OSError, ValueError):
        pid = 0
    try:
        of, _, started = _start_file(lock).read_text().strip().partition(" ")
    except OSError:
        return pid, ""
    return pid, started if of == str(pid) else ""  # another holder's (a dead one's, left by older code)


def _start_file(lock: Path) -> Path:
    return lock.with_name(lock.name + ".start")


def _holds(pid: int, started: str) -> bool:
    """Whether the process a lock names still runs: its pid, and where a start is recorded, the same
    start (a pid reused by another process after the holder died is not the holder)."""
    if not pid or pid == os.getpid() or not _alive(pid):  # our own pid: a killed run's, reused
        return False
    return not started or _started(pid) in ("", started)


#: the lock files this process holds open (:func:`stage_lock`); a child forked without exec (multiprocessing,
#: a DataLoader worker) closes them at once, so that its copy of the flock does not outlive a killed holder
_HELD: set[int] = set()


def _close_held_in_child() -> None:
    for fd in _HELD:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_close_held_in_child)


@contextlib.contextmanager
def stage_lock(output: Path, poll: float = 5.0, log: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold ``<output>.lock``; wait while a live process holds it, take over a dead one's. Lets
    several processes share one pipeline directory. ``log`` is told once when the wait begins, with
    the holder's pid.

    The holder keeps an exclusive ``flock`` on the lock file, which the kernel drops when the
    holder exits however it dies, so a dead holder's lock is taken by exactly one waiter: the one
    whose ``flock`` succeeds. (Checking the holder's pid and then deleting its file, as before,
    let two waiters that both found it dead each delete the other's fresh lock and run the stage
    at once.) The file's inode is checked after the ``flock``: a holder deletes the file as it
    leaves, and a lock taken on a deleted file is tried again.

    The file still holds the holder's bare pid, and ``<output>.lock.start`` its start time
    (:func:`_started`). Code of before 30 Nov 2026 takes no ``flock``; it creates the file
    exclusively and then writes its pid, so a file this code did not create is taken only where the
    pid it names is not a live holder (:func:`_holds`), and an empty one only after ``2 * poll``."""
    lock = output.with_name(output.name + ".lock")
    told = False
    while True:
        created = True
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
        except FileExistsError:
            created = False
            try:
                fd = os.open(lock, os.O_RDWR)
            except FileNotFoundError:  # its holder just left
                continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            taken = _same_file(fd, lock) and (created or not _held_by_older(lock, poll))
        except BlockingIOError:  # a live holder of this code
            taken = False
        if taken:
            break
        os.close(fd)  # drops our flock, if we took it
        pid, _ = _holder(lock)
        if pid and log is not None and not told:
            log(f"waiting for process {pid}, which is running this stage ({lock} names it)")
            told = True
        time.sleep(poll)
    _HELD.add(fd)
    owner = os.getpid()
    try:
        os.ftruncate(fd, 0)
        os.write(fd, str(owner).encode())
        with contextlib.suppress(OSError):  # without it, a reader judges the lock by its pid alone
            _start_file(lock).write_text(f"{owner} {_started(owner)}")
        yield
    finally:
        if os.getpid() == owner:  # not in a child forked inside the stage, which left it: the lock is its parent's
            for path in (_start_file(lock), lock):  # deleted while our flock holds, then released
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            _HELD.discard(fd)
            os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (its holder may have deleted it)."""
    try:
        return os.path.samestat(os.fstat(fd), path.stat())
    except FileNotFoundError:
        return False


def _held_by_older(lock: Path, poll: float) -> bool:
    """Whether a lock file nobody ``flock``s is held by code of before 30 Nov 2026 (which takes no
    ``flock``): it names a live holder, or it is empty and young (being written)."""
    pid, started = _holder(lock)
    if pid:
        return _holds(pid, started)
    return time.time() - _mtime(lock) <= 2 * poll


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def run_stage(output: str | Path, fn: StageFn, *, log: Callable[[str], None] | None = None,
              name: str | None = None) -> Any:
    """Run ``fn(output)`` unless ``output`` is complete; return its (recorded) result.

    A stage another live process is running is waited for (:func:`stage_lock`), so parallel
    processes (e.g. one a seed or a method of ``turnrl compare``) can share a directory."""
    output = Path(output)
    label = name or output.name
    if is_done(output):
        if log is not None:
            log(f"skip {label} (done)")
        return read_done(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    with stage_lock(output, log=log):
        if is_done(output):  # finished by another process while we waited
            return read_done(output)
        if log is not None:
            log(f"run {label}")
        t0 = time.time()
        result = fn(output)
        mark_done(output, result, round(time.time() - t0, 2))
    return result


@dataclass(frozen=True)
class Stage:
    """A named stage with its output path, for pipelines that list their stages up front."""

    name: str
    output: Path
    fn: StageFn

    def run(self, log: Callable[[str], None] | None = None) -> Any:
        return run_stage(self.output, self.fn, log=log, name=self.name)

    @property
    def done(self) -> bool:
        return is_done(self.output)
