"""Shared fixtures: the tiny model, built once per test session (nothing is downloaded)."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from turnrl.models.tiny import build_tiny

    return build_tiny(tmp_path_factory.mktemp("models") / "tiny", episodes_per_split=10)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture(scope="session")
def tiny_model(tiny_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_dir)


@pytest.fixture(scope="session")
def ttt_demos_and_pairs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """16 expert tic-tac-toe demos (noisy opponent) and 12 expert-over-random trajectory pairs."""
    from turnrl.collect import run_policy
    from turnrl.data import pairs as P
    from turnrl.data.io import write_jsonl
    from turnrl.rollout import ExpertPolicy, RandomPolicy

    d = tmp_path_factory.mktemp("ttt-data")
    write_jsonl(d / "demos.jsonl", run_policy(ExpertPolicy(), "tictactoe", episodes=16,
                                              env_opts={"opponent": "noisy"}))
    opts = {"opponent": "random"}
    pairs = P.trajectory_pairs(run_policy(ExpertPolicy(), "tictactoe", episodes=40, env_opts=opts),
                               run_policy(RandomPolicy(), "tictactoe", episodes=40, env_opts=opts))
    assert len(pairs) >= 12
    write_jsonl(d / "pairs.jsonl", pairs[:12])
    return d / "demos.jsonl", d / "pairs.jsonl"


@pytest.fixture(scope="session")
def load_script() -> Callable[[str], ModuleType]:
    """``load_script("name")``: the module ``scripts/name.py`` (scripts are no package)."""

    def load(name: str) -> ModuleType:
        path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod

    return load
