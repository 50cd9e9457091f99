"""Environment registry: ``make(name, **kwargs)``, ``register``, ``names``."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from turnrl.envs.base import SPLITS, ExpertStep, TextEnv
from turnrl.errors import TurnRLError, did_you_mean, unknown

_REGISTRY: dict[str, Callable[..., TextEnv]] = {}


def register(name: str, factory: Callable[..., TextEnv]) -> None:
    """Register an env factory under ``name`` (a later registration replaces it)."""
    _REGISTRY[name] = factory


def names() -> list[str]:
    """All registered env names, sorted."""
    _load_builtins()
    return sorted(_REGISTRY)


def make(name: str, **kwargs: Any) -> TextEnv:
    """Build a registered env; unknown names and options are one-line errors."""
    _load_builtins()
    if name not in _REGISTRY:
        raise unknown("env", name, _REGISTRY)
    accepted = env_options(name)
    for key in kwargs:
        if accepted is not None and key not in accepted:
            raise TurnRLError(
                f"unknown option '{key}' for env '{name}'{did_you_mean(key, accepted)}; "
                f"options: {', '.join(accepted) or '(none)'}"
            )
    try:
        return _REGISTRY[name](**kwargs)
    except TypeError as e:  # an unexpected keyword from a factory's signature
        raise TurnRLError(f"env '{name}': {e}") from None


def env_options(name: str) -> list[str] | None:
    """The keyword options an env accepts (None when its factory takes ``**kwargs``)."""
    _load_builtins()
    sig = inspect.signature(_REGISTRY[name])
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return None
    return [n for n, p in sig.parameters.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]


def env_defaults(name: str) -> dict[str, Any]:
    """The default value of each option of env ``name`` that has one (from its factory's signature)."""
    _load_builtins()
    if name not in _REGISTRY:
        raise unknown("env", name, _REGISTRY)
    sig = inspect.signature(_REGISTRY[name])
    return {n: p.default for n, p in sig.parameters.items()
            if p.default is not p.empty and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


_loaded = False


def _load_builtins() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    import turnrl.envs.bandit  # noqa: F401  (registers itself)
    import turnrl.envs.contextual_bandit  # noqa: F401  (registers itself)
    from turnrl.envs import tictactoe  # noqa: F401  (registers itself)

    # text-agent envs; each registers itself (webshop only when TURNRL_WEBSHOP_URL is set,
    # scienceworld, household and alfworld only when their optional packages are installed)
    for module in ("twenty_questions", "shop", "webshop", "scienceworld", "household", "alfworld"):
        importlib.import_module(f"turnrl.envs.{module}")


__all__ = ["SPLITS", "ExpertStep", "TextEnv", "env_defaults", "env_options", "make", "names", "register"]
