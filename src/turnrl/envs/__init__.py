"""Environment registry: ``make(name, **kwargs)``, ``register``, ``names``."""

from __future__ import annotations

import importlib
import inspect
import json
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


#: built-in envs registered only where what they need is here: env -> (module, class, what it needs)
OPTIONAL: dict[str, tuple[str, str, str]] = {
    "scienceworld": ("scienceworld", "ScienceWorld",
                     "pip install 'turnrl[scienceworld]' and a Java runtime (>= 8) on the PATH"),
    "household": ("household", "Household", "pip install 'turnrl[textworld]'"),
    "alfworld": ("alfworld", "ALFWorld", "pip install 'turnrl[alfworld]', and ALFWorld's games: set ALFWORLD_DATA "
                 "or pass data_dir"),
    "webshop": ("webshop", "WebShopHTTP", "set TURNRL_WEBSHOP_URL to a running WebShop server "
                "(docs/environments.md)"),
}


def _factory(name: str) -> Callable[..., TextEnv]:
    """The factory of env ``name``: a registered one, or a built-in env whose packages are installed
    but which did not register (``alfworld`` without ``ALFWORLD_DATA``: its ``data_dir`` option
    then says what it needs). An unknown name, or a built-in env whose packages are missing, is a
    one-line error; the latter names what to install."""
    _load_builtins()
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name in OPTIONAL:
        require(name)
        module_name, cls, _ = OPTIONAL[name]
        return getattr(importlib.import_module(f"turnrl.envs.{module_name}"), cls)
    raise unknown("env", name, sorted({*_REGISTRY, *OPTIONAL}))  # an optional env may be registered too


def require(name: str) -> None:
    """Raise the one-line error of :func:`_factory` where built-in env ``name``'s packages are missing:
    for its class built directly (``ScienceWorld()``), whose ``reset`` would meet an ImportError."""
    module_name, _, needs = OPTIONAL[name]
    available = getattr(importlib.import_module(f"turnrl.envs.{module_name}"), "available", None)
    if available is None or not available():  # webshop has none: it registers when its server is named
        raise TurnRLError(f"env '{name}' is not available here: {needs}")


def make(name: str, **kwargs: Any) -> TextEnv:
    """Build a registered env; unknown names and options are one-line errors."""
    factory = _factory(name)
    accepted = env_options(name)
    for key in kwargs:
        if accepted is not None and key not in accepted:
            raise TurnRLError(
                f"unknown option '{key}' for env '{name}'{did_you_mean(key, accepted)}; "
                f"options: {', '.join(accepted) or '(none)'}"
            )
    try:
        return factory(**kwargs)
    except TypeError as e:  # an unexpected keyword from a factory's signature
        raise TurnRLError(f"env '{name}': {e}") from None


def env_options(name: str) -> list[str] | None:
    """The keyword options an env accepts (None when its factory takes ``**kwargs``)."""
    sig = inspect.signature(_factory(name))
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return None
    return [n for n, p in sig.parameters.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]


def env_defaults(name: str) -> dict[str, Any]:
    """The default value of each option of env ``name`` that has one (from its factory's signature)."""
    sig = inspect.signature(_factory(name))
    return {n: p.default for n, p in sig.parameters.items()
            if p.default is not p.empty and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


def resolved_options(name: str, opts: dict[str, Any]) -> Any:
    """``opts`` as a trajectory file records and reads them back, with env ``name``'s defaults filled
    in: ``opponent=random`` given equals it left unset, and a tuple reads back as a list. Two such
    values compare equal when the env was built alike (``1 == 1.0``). An env not registered here (an
    import's) has no defaults to fill."""
    defaults = env_defaults(name) if name in names() else {}
    return json.loads(json.dumps({**defaults, **opts}, default=repr))


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


__all__ = ["OPTIONAL", "SPLITS", "ExpertStep", "TextEnv", "env_defaults", "env_options", "make", "names", "register", "require"]
