"""Where models run and how evaluation keeps its random draws apart from training's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


def default_device(device: str | None = None) -> str:
    """Where inference (policies, judges) puts a model: ``device`` when given (checked by
    :func:`check_device`), else ``cuda`` when a GPU is visible, else ``cpu``."""
    import torch

    return check_device(device) if device else ("cuda" if torch.cuda.is_available() else "cpu")


def check_device(device: str) -> str:
    """``device`` if torch can place a model there, else a one-line error naming it: a spelling
    torch does not know (``gpu``), or a GPU this machine does not have."""
    import torch

    from turnrl.errors import TurnRLError

    try:
        where = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise TurnRLError(f"device '{device}': not a device torch knows; give cpu, cuda, cuda:N or mps") from None
    if where.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise TurnRLError(f"device '{device}': no CUDA GPU is visible here; give cpu or leave it unset")
        if where.index is not None and where.index >= count:
            raise TurnRLError(f"device '{device}': this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")
    elif where.type == "mps" and not torch.backends.mps.is_available():
        raise TurnRLError(f"device '{device}': MPS is not available here; give cpu or leave it unset")
    return device


@contextlib.contextmanager
def forked_rng(seed: int | None = None) -> Iterator[None]:
    """Fork torch's RNG of the CPU and of the current GPU (both restored on exit), seeded with
    ``seed`` inside: an evaluation's sampling never moves the training's random stream."""
    import torch

    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        if seed is not None:
            torch.manual_seed(seed)
        yield
