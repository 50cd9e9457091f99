"""Multi-process training through ``accelerate launch``: 2 CPU processes (gloo) equal 1.

The launched runs use the shipped ``configs/accelerate/ddp_cpu.yaml`` and the same global
batch as the single-process run (``batch_size`` halves per process), so the trainer core's
exact accumulation must give the same loss curve and the same weights up to float rounding.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from turnrl.train.core import _cpu_only_launch

ROOT = Path(__file__).resolve().parents[1]
DDP_CPU = ROOT / "configs" / "accelerate" / "ddp_cpu.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "TURNRL_PROGRESS": "0", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "TURNRL_HOME": str(home), "TOKENIZERS_PARALLELISM": "false",
            "CUDA_VISIBLE_DEVICES": ""}  # both runs on the CPU, also on a machine with a GPU


def _run(args: list[str], home: Path, *, processes: int) -> None:
    if processes == 1:
        cmd = [sys.executable, "-m", "turnrl", *args]
    else:
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(DDP_CPU),
               "--main_process_port", str(_free_port()), "-m", "turnrl", *args]
    proc = subprocess.run(cmd, env=_env(home), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def _assert_same_run(one: Path, two: Path, steps: int) -> None:
    a, b = _metrics(one), _metrics(two)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, steps + 1))
    # the same global batches: the same epochs (the global batch size) and units
    assert [r["epoch"] for r in a] == [r["epoch"] for r in b]
    assert [r["units"] for r in a] == [r["units"] for r in b]
    assert [r["loss"] for r in a] == pytest.approx([r["loss"] for r in b], abs=2e-5)
    assert [r["grad_norm"] for r in a] == pytest.approx([r["grad_norm"] for r in b], rel=1e-4)
    assert a[-1]["loss"] != pytest.approx(a[0]["loss"], abs=1e-3)  # it trained
    wa, wb = _weights(one / "model"), _weights(two / "model")
    assert wa.keys() == wb.keys()
    # Adam divides each gradient entry by its own scale, so an entry whose gradient is at float-rounding
    # size can step differently in the two runs (by up to lr); a wrong accumulation moves most entries.
    # So: all but ten entries in a million agree to 1e-5, and none differs by more than one step.
    diffs = torch.cat([(wa[k] - wb[k]).abs().flatten() for k in wa])
    assert int((diffs > 1e-5).sum()) <= diffs.numel() * 1e-5
    assert float(diffs.max()) < 1e-3


def test_cpu_only_launch_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert _cpu_only_launch() is False
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert _cpu_only_launch() is (not torch.cuda.is_available())


def test_shipped_accelerate_configs_parse() -> None:
    import yaml

    names = sorted(p.name for p in DDP_CPU.parent.glob("*.yaml"))
    assert names == ["ddp.yaml", "ddp_cpu.yaml", "deepspeed_zero2.yaml", "deepspeed_zero3.yaml", "fsdp.yaml"]
    for p in DDP_CPU.parent.glob("*.yaml"):
        cfg = yaml.safe_load(p.read_text())
        assert cfg["compute_environment"] == "LOCAL_MACHINE" and cfg["num_processes"] >= 2, p.name
    cpu = yaml.safe_load(DDP_CPU.read_text())
    assert cpu["use_cpu"] is True and cpu["num_processes"] == 2


@pytest.mark.integration
def test_sft_on_two_cpu_processes_equals_one(tiny_dir: Path, ttt_demos_and_pairs: tuple[Path, Path], tmp_path: Path) -> None:
    demos, _ = ttt_demos_and_pairs
    common = ["--model", str(tiny_dir), "--data", str(demos), "max_steps=3", "lr=1e-3", "row_tokens=1024",
              "warmup_ratio=0"]
    _run(["train", "sft", *common, "--out", str(tmp_path / "one"), "batch_size=4"], tmp_path / "home", processes=1)
    _run(["train", "sft", *common, "--out", str(tmp_path / "two"), "batch_size=2"], tmp_path / "home", processes=2)
    _assert_same_run(tmp_path / "one", tmp_path / "two", 3)
    assert _metrics(tmp_path / "two")[0]["epoch"] == pytest.approx(4 / 16)  # global batch 2 x 2 processes


@pytest.mark.integration
def test_dpo_on_two_cpu_processes_equals_one(tiny_dir: Path, ttt_demos_and_pairs: tuple[Path, Path], tmp_path: Path) -> None:
    _, pairs = ttt_demos_and_pairs
    common = ["--model", str(tiny_dir), "--pairs", str(pairs), "max_steps=3", "lr=1e-3", "warmup_ratio=0"]
    _run(["train", "dpo", *common, "--out", str(tmp_path / "one"), "batch_size=4"], tmp_path / "home", processes=1)
    _run(["train", "dpo", *common, "--out", str(tmp_path / "two"), "batch_size=2"], tmp_path / "home", processes=2)
    _assert_same_run(tmp_path / "one", tmp_path / "two", 3)
    assert _metrics(tmp_path / "two")[-1]["accuracy"] == pytest.approx(_metrics(tmp_path / "one")[-1]["accuracy"])
