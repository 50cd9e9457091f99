"""Training: the shared trainer core (:mod:`turnrl.train.core`) and the algorithms built on it."""

from turnrl.train.core import (
    LoraSettings,
    Objective,
    TrainConfig,
    Trainer,
    TrainResult,
    atomic_write_json,
    config_hash,
    latest_checkpoint,
    list_checkpoints,
    set_seed,
)

__all__ = [
    "LoraSettings",
    "Objective",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "atomic_write_json",
    "config_hash",
    "latest_checkpoint",
    "list_checkpoints",
    "set_seed",
]
