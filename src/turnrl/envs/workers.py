"""Slow environments in parallel: env worker processes and a threaded lock-step sampler.

Two pieces that compose with the lock-step :class:`~turnrl.rollout.sampler.Sampler`:

- :class:`ProcessEnv` runs one env in a worker process and forwards the contract
  (``reset``, ``step``, ``expert``, ``instruction``, ``task_ids``, ``valid_actions``,
  ``max_turns``) over a pipe. A worker that dies or does not answer within ``timeout``
  (``start_timeout`` while it starts) is killed: a ``step`` then ends its episode as failed (truncated, ``success=False``,
  ``info["outcome"] = "env_error"``, the reason in ``info["error"]``), and the next
  ``reset`` starts a fresh worker (a failing ``reset`` is retried once). A crash in the env's
  native code (a JVM, an interpreter) cannot take the collection down with it.
- :class:`ThreadedSampler` is the lock-step sampler with the environment side run in
  threads: after the one batched policy call of a round, every active episode is advanced
  (reply parsed, env stepped) concurrently, and an episode that ends has the reset of the
  next planned episode started right away in the same thread. Its results are the
  :class:`Sampler`'s, episode for episode (same planning, same per-episode randomness; it
  reuses the sampler's own ``_start`` / ``_act`` / ``_advance``); only the wall time
  differs. An env call that raises in a thread is raised where the :class:`Sampler` raises it,
  after the same finished episodes went to ``on_episode``. Envs whose calls release the GIL run in parallel: :class:`ProcessEnv` (pipes),
  ScienceWorld (each env has its own Java process), anything waiting on I/O.

:func:`worker_pool_factory` hosts many envs in a fixed number of shared worker processes
(round-robin); ``run_policy(..., workers=N)`` and ``turnrl collect|eval --workers N`` use it
with the threaded sampler, and give the episodes of in-process envs.
:mod:`turnrl.envs.ray_workers` does the same with Ray actors (``--worker-backend ray``).

Use them together for slow envs::

    make_env = worker_factory("scienceworld", {"task_names": "boil"})
    sampler = ThreadedSampler(make_env, ExpertPolicy(), env_name="scienceworld", num_envs=16)
    trajectories = sampler.run(plan_episodes(probe_env, "seen", 64), on_episode=writer.write)
"""

from __future__ import annotations

import dataclasses
import itertools
import multiprocessing as mp
import os
import random
import signal
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

from turnrl.envs.base import ExpertStep, TextEnv
from turnrl.errors import TurnRLError

#: How long closing an env waits for its worker while another thread's call holds it, before it stops
#: the worker (that call is waiting on a hung env: see :meth:`_WorkerBase.release`)
RELEASE_WAIT = 5.0


class WorkerFailure(Exception):
    """The worker process died or did not answer in time."""


def _build(env_name: str | None, env_opts: dict[str, Any], factory: Callable[..., TextEnv] | None) -> TextEnv:
    if factory is not None:
        return factory(**env_opts)
    from turnrl import envs

    assert env_name is not None
    return envs.make(env_name, **env_opts)


def _snapshot(env: TextEnv) -> dict[str, Any]:
    """What the proxy caches after each reset / step."""
    try:
        instruction = env.instruction
    except Exception:
        instruction = ""
    return {"instruction": instruction, "max_turns": env.max_turns, "valid_actions": env.valid_actions()}


class _Host:
    """The envs of one worker, keyed by the proxies' ids: runs in a worker process
    (:func:`_serve`) or in a Ray actor (:mod:`turnrl.envs.ray_workers`).

    Every call answers ``(status, payload)``: ``ok``; ``user_error`` (a
    :class:`~turnrl.errors.TurnRLError`, shown as is); ``error`` or ``build_error`` (any
    other exception, with its type).
    """

    def __init__(self, env_name: str | None, env_opts: dict[str, Any],
                 factory: Callable[..., TextEnv] | None) -> None:
        self.env_name, self.env_opts, self.factory = env_name, env_opts, factory
        self.envs: dict[int, TextEnv] = {}

    def start(self) -> tuple[str, Any]:
        """Import the env registry once, before the first env; the payload is the pid."""
        try:
            if self.factory is None:
                from turnrl import envs as _registry  # noqa: F401
            return "ok", os.getpid()
        except Exception as e:
            return "error", f"{type(e).__name__}: {e}"

    def handle(self, key: int, op: str, args: Any) -> tuple[str, Any]:
        try:
            if op == "new":
                try:
                    self.envs[key] = _build(self.env_name, self.env_opts, self.factory)
                except TurnRLError:
                    raise
                except Exception as e:
                    return "build_error", f"{type(e).__name__}: {e}"
                out: Any = {**_snapshot(self.envs[key]), "name": str(self.envs[key].name)}
            elif op == "close":
                env = self.envs.pop(key, None)
                if env is not None:
                    env.close()
                out = len(self.envs)
            else:
                env = self.envs[key]
                if op == "reset":
                    out = (*env.reset(**args), _snapshot(env))
                elif op == "step":
                    out = (*env.step(args), _snapshot(env))
                elif op == "expert":
                    rng = random.Random()
                    rng.setstate(args)
                    out = (env.expert(rng), rng.getstate())
                elif op == "task_ids":
                    out = env.task_ids(args)
                elif op == "attr":
                    out = getattr(env, args)
                else:
                    raise ValueError(f"unknown operation {op!r}")
            return "ok", out
        except TurnRLError as e:
            return "user_error", str(e)
        except Exception as e:
            return "error", f"{type(e).__name__}: {e}"

    def close_all(self) -> None:
        for env in self.envs.values():
            try:
                env.close()
            except Exception:
                pass
        self.envs.clear()


def _serve(conn: Connection, env_name: str | None, env_opts: dict[str, Any],
           factory: Callable[..., TextEnv] | None) -> None:  # pragma: no cover - runs in the worker
    """Host envs in a worker process; messages are ``(key, op, args)``. Ctrl-C in a terminal reaches
    the whole process group: the worker leaves it to the parent, which shuts it down."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    host = _Host(env_name, env_opts, factory)
    started = host.start()
    conn.send(started)
    if started[0] != "ok":
        return
    while True:
        try:
            key, op, args = conn.recv()
        except (EOFError, OSError):
            break
        conn.send(host.handle(key, op, args))
    host.close_all()


class _WorkerBase:
    """Where the envs of one or more :class:`ProcessEnv` proxies live (a process, a Ray actor).

    Calls are serialized by a lock (threads of a :class:`ThreadedSampler` may share a
    worker). ``generation`` counts the workers started: a proxy whose env lived in an
    earlier one has lost its episode. Subclasses start, reach and stop the worker; a worker
    that dies or does not answer in time raises :class:`WorkerFailure` (and is stopped).
    """

    def __init__(self, env_name: str | None, env_opts: dict[str, Any], factory: Callable[..., TextEnv] | None,
                 *, timeout: float, start_timeout: float) -> None:
        self.env_name, self.env_opts, self.factory = env_name, env_opts, factory
        self.timeout, self.start_timeout = timeout, start_timeout
        self.lock = threading.RLock()
        #: set by :meth:`release` when it stops a worker a hung call held: no fresh one is started after
        #: it (a hung reset's retry would hang again, for another ``timeout``)
        self.closing = False
        self.generation = 0
        self.restarts = 0
        self.users = 0

    # -- the backend ---------------------------------------------------------------------

    def ready(self) -> bool:
        """Started and, as far as is known, alive."""
        raise NotImplementedError

    def ensure(self) -> None:
        """Start the worker unless it is ready (a fresh one bumps ``generation``)."""
        raise NotImplementedError

    def _request(self, proxy: ProcessEnv, op: str, args: Any, timeout: float) -> tuple[str, Any]:
        raise NotImplementedError

    def lost(self, op: str) -> str:
        """Why ``op`` cannot run mid-episode (the worker holding the episode is gone)."""
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError

    def interrupt(self) -> None:
        """Stop the worker from another thread than the one whose call holds its lock (a call waiting
        on a hung env): that call then fails as after a crash. The default stops nothing (the caller
        waits for the lock as before)."""

    def pid(self) -> int | None:
        return None

    # -- shared --------------------------------------------------------------------------

    def call(self, proxy: ProcessEnv, op: str, args: Any, timeout: float | None = None) -> Any:
        """Run ``op`` on ``proxy``'s env; builds it first in a fresh worker (not mid-episode)."""
        with self.lock:
            if op in ("step", "expert") and not (self.ready() and proxy._generation == self.generation):
                # mid-episode: a fresh worker would not hold the episode, so this one fails
                raise WorkerFailure(self.lost(op))
            if self.closing and not self.ready():
                raise WorkerFailure(f"the env is being closed, so no worker is started for {op}")
            self.ensure()
            if proxy._generation != self.generation:
                proxy._generation = 0
                status, payload = self._request(proxy, "new", None, self.start_timeout)
                if status != "ok":
                    raise TurnRLError(f"env worker could not build the env: {payload}")
                proxy._update(payload)
                proxy._generation = self.generation
                if op == "new":
                    return payload
            status, payload = self._request(proxy, op, args, timeout or self.timeout)
        if status == "user_error":
            raise TurnRLError(payload)
        if status in ("error", "build_error"):
            raise TurnRLError(f"env worker: {op} raised {payload}")
        return payload

    def release(self, proxy: ProcessEnv) -> None:
        """``proxy`` is done: close its env; the last user stops the worker. Where another thread's call
        holds the worker past :data:`RELEASE_WAIT` s (an env hung, for up to ``timeout``: a Ctrl-C or an
        error elsewhere is closing the collection), the worker is stopped instead of waited for."""
        if not self.lock.acquire(timeout=RELEASE_WAIT):
            self.closing = True
            self.interrupt()
            self.lock.acquire()
        try:
            self.users -= 1
            if self.ready() and proxy._generation == self.generation:
                try:
                    self._request(proxy, "close", None, 10.0)
                except WorkerFailure:
                    pass
            if self.users <= 0:
                self.kill()
        finally:
            self.lock.release()


class _Worker(_WorkerBase):
    """One worker process hosting the envs of one or more :class:`ProcessEnv` proxies."""

    def __init__(self, env_name: str | None, env_opts: dict[str, Any], factory: Callable[..., TextEnv] | None,
                 *, timeout: float, start_timeout: float, start_method: str) -> None:
        super().__init__(env_name, env_opts, factory, timeout=timeout, start_timeout=start_timeout)
        self._ctx: Any = mp.get_context(start_method)
        self.proc: Any = None
        self.conn: Connection | None = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def ready(self) -> bool:
        return self.alive() and self.conn is not None

    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.alive() else None

    def ensure(self) -> None:
        if self.ready():
            return
        if self.proc is not None:
            self.kill()
            self.restarts += 1
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_serve, args=(child, self.env_name, self.env_opts, self.factory),
                                 daemon=True)
        proc.start()
        child.close()
        self.proc, self.conn = proc, parent
        self.generation += 1
        status, payload = self.receive(self.start_timeout, "starting the worker")
        if status != "ok":
            self.kill()
            raise TurnRLError(f"env worker could not start: {payload}")

    def receive(self, timeout: float, what: str) -> tuple[str, Any]:
        assert self.conn is not None
        try:
            if not self.conn.poll(timeout):
                self.kill()
                raise WorkerFailure(f"{what} timed out after {timeout:g} s")
            return self.conn.recv()
        except WorkerFailure:
            raise
        except (EOFError, OSError, ConnectionError) as e:
            self.kill()  # joins the process: its exit code is known after this, not before
            code = self.proc.exitcode if self.proc is not None else None
            raise WorkerFailure(f"the worker process died during {what} (exit code {code})") from e
        except BaseException:
            # interrupted while waiting (Ctrl-C): the reply may still come, and the next request would read
            # it as its own; the worker goes, as a dead one does (its episodes fail, a reset starts afresh)
            self.kill()
            raise

    def lost(self, op: str) -> str:
        if self.alive():  # a live worker of another generation: an env sharing it restarted it
            return f"the worker was restarted before {op} (by another env sharing it), so the episode is gone"
        self.kill()
        code = self.proc.exitcode if self.proc is not None else None
        return f"the worker process died before {op} (exit code {code})"

    def _request(self, proxy: ProcessEnv, op: str, args: Any, timeout: float) -> tuple[str, Any]:
        assert self.conn is not None
        try:
            self.conn.send((id(proxy), op, args))
        except (OSError, ConnectionError) as e:
            self.kill()
            raise WorkerFailure(f"the worker process died before {op}") from e
        except BaseException:  # interrupted mid-send: the worker may hold half a request
            self.kill()
            raise
        return self.receive(timeout, op)

    def interrupt(self) -> None:
        proc = self.proc  # the pipe is the waiting call's: it sees the end of it and cleans up
        if proc is not None and proc.is_alive():
            proc.kill()

    def kill(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(timeout=10)


class ProcessEnv(TextEnv):
    """A registered env (or ``factory(**env_opts)``) run in a worker process (see module doc).

    With ``worker`` (from :func:`worker_pool_factory`) the process is shared with other
    proxies; otherwise the env has a process of its own. :class:`~turnrl.envs.ray_workers.RayEnv`
    is this proxy with the envs in a Ray actor.
    """

    def __init__(self, env_name: str | None = None, env_opts: dict[str, Any] | None = None, *,
                 factory: Callable[..., TextEnv] | None = None, timeout: float = 600.0,
                 start_timeout: float = 300.0, start_method: str = "spawn", worker: _WorkerBase | None = None) -> None:
        if worker is None and (env_name is None) == (factory is None):
            raise TurnRLError("ProcessEnv: give exactly one of env_name and factory")
        self.env_name = env_name if worker is None else worker.env_name
        self.env_opts = dict(env_opts or {}) if worker is None else worker.env_opts
        self.factory = factory if worker is None else worker.factory
        #: the env's name in this proxy's own errors: the registered name, else the env's ``name``
        #: (known once the worker built it), else the factory's
        self.label = _label(self.env_name, self.factory)
        self._worker = worker or _Worker(self.env_name, self.env_opts, self.factory, timeout=float(timeout),
                                         start_timeout=float(start_timeout), start_method=start_method)
        self._worker.users += 1
        self.timeout = self._worker.timeout
        self._generation = 0
        self._cache: dict[str, Any] = {"instruction": "", "max_turns": 50, "valid_actions": None}
        self._listed: list[str] | None = None
        self._task_ids: dict[str, list[str]] = {}
        self._task_id = ""
        self._failed: str | None = None
        self._failure_told = False  # the step that ends the episode on the failure has returned
        self._closed = False
        try:
            self._call("new", None, timeout=self._worker.start_timeout)
        except (WorkerFailure, TurnRLError) as e:
            with self._worker.lock:  # this proxy never came to be: it must not keep a shared worker alive
                self._worker.users -= 1
                if self._worker.users <= 0:
                    self._worker.kill()
            if isinstance(e, TurnRLError):
                raise
            raise TurnRLError(f"env worker could not start: {e}") from None
        self.max_turns = int(self._cache["max_turns"])

    # -- contract ------------------------------------------------------------------------

    @property
    def instruction(self) -> str:
        return str(self._cache["instruction"])

    def task_ids(self, split: str) -> list[str]:
        if split not in self._task_ids:
            self._task_ids[split] = list(self._call("task_ids", split))
        return list(self._task_ids[split])

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        self._failed, self._failure_told = None, False
        args = {"seed": seed, "options": options}
        for attempt in (1, 2):
            try:
                obs, info, snap = self._call("reset", args)
                break
            except WorkerFailure as e:
                if attempt == 2:
                    raise TurnRLError(f"env worker failed twice at reset: {e}") from None
        self._update(snap, info)
        self._task_id = str(info.get("task_id", ""))
        return obs, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self._failed is None:
            try:
                obs, reward, terminated, truncated, info, snap = self._call("step", action)
                self._update(snap, info)
                return obs, reward, terminated, truncated, info
            except WorkerFailure as e:
                self._failed = str(e)
        elif self._failure_told:  # as every env: no step after the episode's end
            raise TurnRLError(f"{self.label}: the episode is over (the environment failed); call reset() "
                              "to start a new one")
        self._failure_told = True
        info = {"task_id": self._task_id, "won": False, "success": False, "outcome": "env_error",
                "error": self._failed, "valid_actions": []}
        self._cache["valid_actions"], self._listed = [], []
        return f"The environment failed: {self._failed}. The episode ends.", 0.0, False, True, info

    def valid_actions(self) -> list[str] | None:
        acts = self._cache["valid_actions"]
        return None if acts is None else list(acts)

    def expert(self, rng: random.Random) -> ExpertStep:
        if self._failure_told:  # as every env: no expert move after the episode's end
            raise TurnRLError(f"{self.label}: no expert move: the episode is not running (call reset())")
        if self._failed is None:
            try:
                step, state = self._call("expert", rng.getstate())
                rng.setstate(state)
                return step
            except WorkerFailure as e:
                self._failed = str(e)
        # an action the sampler takes as valid, so that it steps the env, whose step ends the episode
        # as an env_error (a made-up action would count as the agent's invalid move)
        acts = self._cache["valid_actions"] or self._listed
        return ExpertStep(acts[0] if acts else "look", "The environment failed; the episode will end.")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._worker.release(self)

    # -- extras ------------------------------------------------------------------------

    @property
    def worker_pid(self) -> int | None:
        """The pid of the worker process (for a Ray actor, on its node); None while none runs."""
        return self._worker.pid()

    @property
    def restarts(self) -> int:
        return self._worker.restarts

    def remote(self, attribute: str) -> Any:
        """An attribute of the env inside the worker (``proxy.remote("java_pid")``)."""
        return self._call("attr", attribute)

    # -- internals -----------------------------------------------------------------------

    def _call(self, op: str, args: Any, timeout: float | None = None) -> Any:
        return self._worker.call(self, op, args, timeout)

    def _update(self, snap: dict[str, Any], info: dict[str, Any] | None = None) -> None:
        self._cache.update(snap)
        self.max_turns = int(snap["max_turns"])
        if not self.env_name and snap.get("name"):  # built by a factory: the env's own name (from "new")
            self.label = str(snap["name"])
        #: the actions the last observation listed (``info["valid_actions"]``, what the sampler reads)
        self._listed = None if info is None else info.get("valid_actions")


def _label(env_name: str | None, factory: Callable[..., TextEnv] | None) -> str:
    """What a proxy calls its env: ``env_name``, else the factory's env ``name`` (a
    :class:`TextEnv` class), else the factory's own name."""
    if env_name:
        return env_name
    name = getattr(factory, "name", None)
    if isinstance(name, str) and name:
        return name
    return str(getattr(factory, "__qualname__", None) or type(factory).__name__)


def worker_factory(env_name: str, env_opts: dict[str, Any] | None = None, *, timeout: float = 600.0
                   ) -> Callable[[], ProcessEnv]:
    """A ``make_env`` for samplers: each call starts one :class:`ProcessEnv` (one process per env)."""
    opts = dict(env_opts or {})
    return lambda: ProcessEnv(env_name, opts, timeout=timeout)


def worker_pool_factory(env_name: str, env_opts: dict[str, Any] | None = None, *, workers: int,
                        timeout: float = 600.0, start_timeout: float = 300.0,
                        start_method: str = "spawn") -> Callable[[], ProcessEnv]:
    """A ``make_env`` whose envs live in ``workers`` shared processes, assigned round-robin.

    A process starts with its first env and stops when its last env is closed. A worker that
    dies or hangs takes the episodes of all its envs with it (each ends as ``env_error``);
    the next reset starts a fresh process.
    """
    opts = dict(env_opts or {})
    return _pool(workers, lambda: _Worker(env_name, opts, None, timeout=timeout, start_timeout=start_timeout,
                                          start_method=start_method), ProcessEnv)


def _pool(workers: int, new_worker: Callable[[], _WorkerBase],
          proxy: Callable[..., ProcessEnv]) -> Callable[[], ProcessEnv]:
    """A ``make_env`` whose proxies share ``workers`` workers (started by ``new_worker``), round-robin."""
    if workers < 1:
        raise TurnRLError(f"workers must be >= 1 (got {workers})")
    pool: list[_WorkerBase] = []
    counter = itertools.count()

    def make() -> ProcessEnv:
        k = next(counter) % workers
        if k == len(pool):
            pool.append(new_worker())
        return proxy(worker=pool[k])

    return make


_THREADED: type | None = None


def _threaded_sampler_class() -> type:
    """Build :class:`ThreadedSampler` on first use: it subclasses the rollout sampler, whose
    package imports torch, which the worker processes (importing this module) do not need."""
    from turnrl.data.schema import Trajectory
    from turnrl.rollout.sampler import EpisodeSpec, Sampler, _Slot

    class ThreadedSampler(Sampler):
        """The lock-step sampler with env steps and resets run in threads (see module doc)."""

        def __init__(self, *args: Any, threads: int | None = None, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._pool = ThreadPoolExecutor(max_workers=threads or self.num_envs, thread_name_prefix="env")
            self._queue: deque[EpisodeSpec] = deque()
            # what a thread's _advance / reset gave, an exception included: raised where Sampler raises it
            self._advanced: dict[int, Trajectory | None | Exception] = {}
            self._prefetched: dict[tuple[int, int], _Slot | Exception] = {}

        def close(self) -> None:
            super().close()
            self._pool.shutdown(wait=True)

        def run(self, specs: Iterable[EpisodeSpec], *,
                on_episode: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
            specs = list(specs)
            self._queue = deque(specs)
            n = min(self.num_envs, len(specs))
            while len(self._envs) < n:
                self._envs.append(self.make_env())
            try:
                self._prefetch(list(zip(self._envs[:n], specs[:n], strict=True)))  # first resets, in parallel
                return super().run(specs, on_episode=on_episode)
            finally:
                self._advanced.clear()
                self._prefetched.clear()

        def _prefetch(self, pairs: Sequence[tuple[TextEnv, EpisodeSpec]]) -> None:
            """Reset ``env`` for ``spec`` in a thread, into a shadow slot :meth:`_start` copies (or
            the reset's exception, which :meth:`_start` raises where the plain sampler's reset would)."""

            def start(env: TextEnv, spec: EpisodeSpec) -> _Slot:
                shadow = _Slot(env)
                Sampler._start(self, shadow, spec)
                return shadow

            futures = [((id(env), spec.index), self._pool.submit(start, env, spec)) for env, spec in pairs]
            for key, future in futures:
                try:
                    self._prefetched[key] = future.result()
                except Exception as e:
                    self._prefetched[key] = e

        def _start(self, slot: _Slot, spec: EpisodeSpec) -> None:
            if self._queue and self._queue[0] is spec:
                self._queue.popleft()
            shadow = self._prefetched.pop((id(slot.env), spec.index), None)
            if isinstance(shadow, Exception):
                raise shadow
            if shadow is None:
                super()._start(slot, spec)
                return
            for f in dataclasses.fields(_Slot):
                setattr(slot, f.name, getattr(shadow, f.name))

        def _act(self, active: Sequence[_Slot], requests: Sequence[Any]) -> list[Any]:
            replies = super()._act(active, requests)
            futures = [self._pool.submit(Sampler._advance, self, slot, reply)
                       for slot, reply in zip(active, replies, strict=True)]
            finished: list[_Slot] = []
            failed = False
            for slot, future in zip(active, futures, strict=True):
                try:
                    result: Trajectory | None | Exception = future.result()
                except Exception as e:  # raised by _advance, in slot order, after the episodes before it
                    result, failed = e, True
                self._advanced[id(slot)] = result
                if isinstance(result, Trajectory):
                    finished.append(slot)
            if not failed:  # the run stops at the failed slot: no next episode starts
                upcoming = list(itertools.islice(self._queue, len(finished)))
                self._prefetch([(slot.env, spec) for slot, spec in zip(finished, upcoming, strict=False)])
            return replies

        def _advance(self, slot: _Slot, reply: Any) -> Trajectory | None:
            if id(slot) in self._advanced:
                result = self._advanced.pop(id(slot))
                if isinstance(result, Exception):
                    raise result
                return result
            return super()._advance(slot, reply)

    return ThreadedSampler


def __getattr__(name: str) -> Any:
    global _THREADED
    if name == "ThreadedSampler":
        if _THREADED is None:
            _THREADED = _threaded_sampler_class()
        return _THREADED
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
