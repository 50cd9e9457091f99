"""Where models run and how evaluation keeps its random draws apart from training's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


def default_device(device: str | None = None) -> str:
    """Where inference (policies, judges) puts a model: ``device`` when given, else ``cuda``
    when a GPU is visible, else ``cpu``."""
    import torch

    return device or ("cuda" if torch.cuda.is_available() else "cpu")


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
