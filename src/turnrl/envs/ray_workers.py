"""Envs in Ray actors: the worker pool of :mod:`turnrl.envs.workers` spread over a Ray cluster.

:class:`RayEnv` is :class:`~turnrl.envs.workers.ProcessEnv` with the env hosted in a Ray
actor instead of a local worker process: the same contract (``reset``, ``step``,
``expert``, ``instruction``, ``task_ids``, ``valid_actions``, ``max_turns``), the same
host code inside the actor, and the same failure handling: an actor that dies or does not
answer within ``timeout`` (``start_timeout`` while it starts) is killed, a ``step`` then
ends its episode as failed (``info["outcome"] = "env_error"``), and the next ``reset``
starts a fresh actor. :func:`ray_pool_factory` is :func:`~turnrl.envs.workers.worker_pool_factory`
with actors; ``run_policy(..., workers=N, worker_backend="ray")`` and
``turnrl collect|eval --workers N --worker-backend ray`` use it with the threaded sampler.

Ray is an optional extra (``pip install 'turnrl[ray]'``), imported on first use. Unless
the program has called ``ray.init`` itself (to pass a ``runtime_env``, say), the first
actor calls ``ray.init(address=...)``: ``None`` starts a local Ray (or joins the cluster
named by ``RAY_ADDRESS``), ``"auto"`` joins the cluster this machine belongs to. turnrl
(and the env's own packages) must be importable on every node.

Each actor asks for ``actor_options`` (default ``{"num_cpus": 1, "scheduling_strategy":
"SPREAD"}``: one CPU each, spread over the nodes); an actor the cluster has no room for
waits, and its env fails to start after ``start_timeout``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from turnrl.envs.base import TextEnv
from turnrl.envs.workers import ProcessEnv, WorkerFailure, _Host, _pool, _WorkerBase
from turnrl.errors import TurnRLError

MISSING_RAY = "the ray backend needs the optional extra: pip install 'turnrl[ray]'"
DEFAULT_ACTOR_OPTIONS: dict[str, Any] = {"num_cpus": 1, "scheduling_strategy": "SPREAD"}

_INIT_LOCK = threading.Lock()
_ACTOR_CLASS: Any = None


def import_ray() -> Any:
    """The ``ray`` module, or a one-line :class:`TurnRLError` naming the extra."""
    try:
        import ray
    except ImportError:
        raise TurnRLError(MISSING_RAY) from None
    return ray


def _connect(address: str | None) -> Any:
    """``ray``, initialized (``ray.init(address=address)`` unless the program did it already)."""
    ray = import_ray()
    with _INIT_LOCK:
        if not ray.is_initialized():
            try:
                ray.init(address=address)
            except Exception as e:
                first = (str(e).strip().splitlines() or [""])[0]
                where = address or os.environ.get("RAY_ADDRESS")
                raise TurnRLError(f"could not start or join Ray (address={where!r}): "
                                  f"{type(e).__name__}: {first}") from None
    return ray


def _actor_class(ray: Any) -> Any:
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        _ACTOR_CLASS = ray.remote(_Host)
    return _ACTOR_CLASS


class _RayWorker(_WorkerBase):
    """One Ray actor hosting the envs of one or more :class:`RayEnv` proxies."""

    def __init__(self, env_name: str | None, env_opts: dict[str, Any], factory: Callable[..., TextEnv] | None,
                 *, timeout: float, start_timeout: float, address: str | None = None,
                 actor_options: dict[str, Any] | None = None) -> None:
        super().__init__(env_name, env_opts, factory, timeout=timeout, start_timeout=start_timeout)
        self.address = address
        self.actor_options = dict(DEFAULT_ACTOR_OPTIONS if actor_options is None else actor_options)
        self.actor: Any = None
        self._pid: int | None = None

    def ready(self) -> bool:
        return self.actor is not None

    def pid(self) -> int | None:
        return self._pid if self.actor is not None else None

    def ensure(self) -> None:
        if self.actor is not None:
            return
        ray = _connect(self.address)
        if self.generation:
            self.restarts += 1
        self.actor = _actor_class(ray).options(**self.actor_options).remote(
            self.env_name, self.env_opts, self.factory)
        self.generation += 1
        status, payload = self._get(self.actor.start.remote(), self.start_timeout, "starting the Ray actor",
                                    hint=f" (is there room in the cluster for an actor with {self.actor_options}? "
                                         "see `ray status`)")
        if status != "ok":
            self.kill()
            raise TurnRLError(f"env worker could not start: {payload}")
        self._pid = int(payload)

    def _get(self, ref: Any, timeout: float, what: str, hint: str = "") -> Any:
        import ray

        try:
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            self.kill()
            raise WorkerFailure(f"{what} timed out after {timeout:g} s{hint}") from None
        except ray.exceptions.RayError as e:
            self.kill()
            raise WorkerFailure(f"the Ray actor died during {what} ({type(e).__name__})") from None

    def lost(self, op: str) -> str:
        return f"the Ray actor died before {op}"

    def _request(self, proxy: ProcessEnv, op: str, args: Any, timeout: float) -> tuple[str, Any]:
        assert self.actor is not None
        return self._get(self.actor.handle.remote(id(proxy), op, args), timeout, op)

    def kill(self) -> None:
        actor, self.actor, self._pid = self.actor, None, None
        if actor is not None:
            import ray

            try:
                ray.kill(actor, no_restart=True)
            except Exception:
                pass


class RayEnv(ProcessEnv):
    """A registered env (or ``factory(**env_opts)``) run in a Ray actor (see module doc).

    With ``worker`` (from :func:`ray_pool_factory`) the actor is shared with other proxies;
    otherwise the env has an actor of its own.
    """

    def __init__(self, env_name: str | None = None, env_opts: dict[str, Any] | None = None, *,
                 factory: Callable[..., TextEnv] | None = None, timeout: float = 600.0,
                 start_timeout: float = 300.0, address: str | None = None,
                 actor_options: dict[str, Any] | None = None, worker: _WorkerBase | None = None) -> None:
        if worker is None:
            if (env_name is None) == (factory is None):
                raise TurnRLError("RayEnv: give exactly one of env_name and factory")
            _connect(address)
            worker = _RayWorker(env_name, dict(env_opts or {}), factory, timeout=float(timeout),
                                start_timeout=float(start_timeout), address=address, actor_options=actor_options)
        super().__init__(worker=worker)

    @property
    def actor(self) -> Any:
        """The Ray actor holding the env (None while none runs)."""
        return getattr(self._worker, "actor", None)


def ray_factory(env_name: str, env_opts: dict[str, Any] | None = None, *, timeout: float = 600.0,
                address: str | None = None, actor_options: dict[str, Any] | None = None
                ) -> Callable[[], RayEnv]:
    """A ``make_env`` for samplers: each call starts one :class:`RayEnv` (one actor per env)."""
    opts = dict(env_opts or {})
    _connect(address)
    return lambda: RayEnv(env_name, opts, timeout=timeout, address=address, actor_options=actor_options)


def ray_pool_factory(env_name: str, env_opts: dict[str, Any] | None = None, *, workers: int,
                     timeout: float = 600.0, start_timeout: float = 300.0, address: str | None = None,
                     actor_options: dict[str, Any] | None = None) -> Callable[[], ProcessEnv]:
    """A ``make_env`` whose envs live in ``workers`` shared Ray actors, assigned round-robin.

    An actor starts with its first env and is killed when its last env is closed. An actor
    that dies or hangs takes the episodes of all its envs with it (each ends as
    ``env_error``); the next reset starts a fresh actor.
    """
    if workers < 1:
        raise TurnRLError(f"workers must be >= 1 (got {workers})")
    opts = dict(env_opts or {})
    _connect(address)
    return _pool(workers, lambda: _RayWorker(env_name, opts, None, timeout=timeout, start_timeout=start_timeout,
                                             address=address, actor_options=actor_options), RayEnv)
