"""Helpers shared by the benchmark scripts beside this file (run as ``python benchmarks/X.py``)."""

from __future__ import annotations

import argparse
import tempfile
import time

import torch


def clock(cuda: bool) -> float:
    """Wall time on a GPU (after synchronizing); the process's CPU time on a CPU, where wall time on a
    shared machine mostly measures the other jobs."""
    if cuda:
        torch.cuda.synchronize()
        return time.perf_counter()
    return time.process_time()


def positive(text: str) -> int:
    """An ``argparse`` type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def model_or_tiny(model_dir: str | None) -> str:
    """``model_dir``, or a fresh tiny model built in a temporary folder."""
    if model_dir is not None:
        return model_dir
    from turnrl.models.tiny import build_tiny

    return str(build_tiny(tempfile.mkdtemp() + "/tiny", episodes_per_split=10))
