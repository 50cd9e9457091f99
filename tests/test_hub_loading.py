"""Loading by hub id without network (a model saved into a hub-cache layout, HF_HUB_OFFLINE=1),
and the shipped hub-model configs (LoRA, bf16, gradient checkpointing)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from turnrl.config import load_config
from turnrl.models.loading import resolve_model_path
from turnrl.train.preference import PreferenceConfig
from turnrl.train.sft import SFTConfig

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "configs" / "models"
HUB_ID = "turnrl-test/tiny-chat"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def hf_home(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``$HF_HOME`` whose hub cache holds the tiny model as ``turnrl-test/tiny-chat``."""
    home = tmp_path_factory.mktemp("hf_home")
    repo = home / "hub" / ("models--" + HUB_ID.replace("/", "--"))
    shutil.copytree(tiny_dir, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return home


def _offline_env(hf_home: Path) -> dict[str, str]:
    return {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_CACHE": str(hf_home / "hub"), "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TURNRL_PROGRESS": "0"}


PROBE = """
import json, sys
from turnrl.errors import TurnRLError
from turnrl.models.loading import load_model, load_tokenizer, resolve_model_path
out = {}
for name in sys.argv[1:]:
    try:
        tok, model = load_tokenizer(name), load_model(name)
        out[name] = {"resolved": resolve_model_path(name), "class": type(model).__name__,
                     "params": sum(p.numel() for p in model.parameters()), "vocab": len(tok),
                     "first": float(next(model.parameters()).flatten()[0])}
    except TurnRLError as e:
        out[name] = {"error": str(e)}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_hub_id_and_local_path_load_the_same_model_offline(hf_home: Path, tiny_dir: Path) -> None:
    absent = "turnrl-test/absent"
    proc = subprocess.run([sys.executable, "-c", PROBE, HUB_ID, str(tiny_dir), absent, str(tiny_dir / "nope")],
                          env=_offline_env(hf_home), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    hub, local = out[HUB_ID], out[str(tiny_dir)]
    assert hub["resolved"] == HUB_ID  # passed to transformers as a hub id, found in the cache
    assert {k: v for k, v in hub.items() if k != "resolved"} == {k: v for k, v in local.items() if k != "resolved"}
    assert hub["class"] == "LlamaForCausalLM"
    err = out[absent]["error"]
    assert err.startswith(f"cannot load tokenizer '{absent}'") and "\n" not in err
    assert f"offline: hub id '{absent}' is not in the hub cache {hf_home / 'hub'}" in err
    assert out[str(tiny_dir / "nope")]["error"] == f"model path not found: {tiny_dir / 'nope'}"


def test_hub_ids_and_paths_are_told_apart(tiny_dir: Path) -> None:
    assert resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert resolve_model_path(str(tiny_dir)) == str(tiny_dir)


@pytest.mark.parametrize("name", ["qwen2.5-0.5b-lora", "qwen2.5-1.5b-lora", "llama3-8b-lora"])
def test_hub_model_configs_load_for_sft_and_preference(name: str) -> None:
    for cls in (SFTConfig, PreferenceConfig):
        cfg = load_config(cls, MODELS / f"{name}.yaml")
        assert cfg.mixed_precision == "bf16" and cfg.gradient_checkpointing is True
        assert cfg.lora is not None and cfg.lora.r >= 8 and "q_proj" in cfg.lora.target_modules
    assert sorted(p.stem for p in MODELS.glob("*.yaml")) == ["llama3-8b-lora", "qwen2.5-0.5b-lora",
                                                             "qwen2.5-1.5b-lora"]


@pytest.mark.integration
def test_sft_by_hub_id_with_a_hub_model_config(hf_home: Path, tmp_path: Path) -> None:
    """`turnrl train sft --model ORG/NAME --config configs/models/...` offline: LoRA, bf16
    autocast and gradient checkpointing on the tiny model (CPU), adapter and merged model saved."""
    from turnrl.collect import run_policy
    from turnrl.data.io import write_jsonl
    from turnrl.rollout import ExpertPolicy

    demos = tmp_path / "demos.jsonl"
    write_jsonl(demos, run_policy(ExpertPolicy(), "tictactoe", episodes=4))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "turnrl", "train", "sft", "--model", HUB_ID, "--data", str(demos), "--out", str(out),
           "--config", str(MODELS / "qwen2.5-0.5b-lora.yaml"), "max_steps=2", "batch_size=2", "grad_accum=1",
           "lr=1e-3"]
    proc = subprocess.run(cmd, env=_offline_env(hf_home), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["train_config"]["mixed_precision"] == "bf16" and summary["train_config"]["lora"]["r"] == 16
    assert summary["run_config"]["model"] == HUB_ID
    assert (out / "adapter" / "adapter_config.json").is_file() and (out / "model" / "config.json").is_file()


def test_a_hub_ids_fingerprint_reads_its_cached_snapshot(hf_home: Path, tiny_dir: Path, tmp_path: Path) -> None:
    """A hub id is fingerprinted by the snapshot ``main`` points at, as the same folder would be: an
    update under the same id (a new revision with other weights) is another model."""
    probe = ("import sys; from turnrl.models.loading import model_fingerprint as f; "
             "print(f(sys.argv[1]), f(sys.argv[2]), f('turnrl-test/not-cached'))")
    home = tmp_path / "hf"
    shutil.copytree(hf_home, home, symlinks=True)
    repo = home / "hub" / ("models--" + HUB_ID.replace("/", "--"))

    def run() -> list[str]:
        out = subprocess.run([sys.executable, "-c", probe, HUB_ID, str(tiny_dir)], env=_offline_env(home),
                             capture_output=True, text=True, check=True)
        return out.stdout.split()

    by_id, by_dir, missing = run()
    assert by_id == by_dir and missing != by_id
    new = "f" * 40
    shutil.copytree(repo / "snapshots" / COMMIT, repo / "snapshots" / new)
    weights = next((repo / "snapshots" / new).glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # other weights under the same id
    weights.write_bytes(bytes(data))
    (repo / "refs" / "main").write_text(new)
    assert run()[0] != by_id


@pytest.mark.parametrize("damage", ["cut weights", "config that does not fit"])
def test_a_damaged_model_folder_is_a_one_line_error(tiny_dir: Path, tmp_path: Path, damage: str) -> None:
    """safetensors' error for a cut file and torch's RuntimeError for a config the weights do not fit
    were tracebacks; both are one line naming the model now."""
    from turnrl.errors import TurnRLError
    from turnrl.models.loading import load_model

    bad = tmp_path / "bad"
    shutil.copytree(tiny_dir, bad)
    if damage == "cut weights":
        weights = bad / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:100_000])
    else:
        cfg = json.loads((bad / "config.json").read_text())
        cfg["hidden_size"] = cfg["hidden_size"] + 4
        (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(TurnRLError, match=rf"^cannot load model '{bad}': .*\(is the folder complete\?\)$") as e:
        load_model(bad)
    assert "\n" not in str(e.value)


def test_a_config_whose_values_do_not_fit_together_is_a_one_line_error(tiny_dir: Path, tmp_path: Path) -> None:
    """transformers validates a config through huggingface_hub's strict dataclasses, whose error is
    no ValueError: a hidden size the heads do not divide was a traceback."""
    from turnrl.errors import TurnRLError
    from turnrl.models.loading import load_model

    bad = tmp_path / "heads"
    shutil.copytree(tiny_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "num_attention_heads": 5, "num_key_value_heads": 5}))
    with pytest.raises(TurnRLError, match=rf"^cannot load model '{bad}': ") as e:
        load_model(bad)
    assert "\n" not in str(e.value)
    with pytest.raises(TurnRLError, match=r"^unknown dtype 'half'; choose from: auto, float32"):
        load_model(tiny_dir, dtype="half")


def test_a_devices_spelling_or_absence_is_a_one_line_error(tiny_dir: Path) -> None:
    import torch

    from turnrl.devices import check_device, default_device
    from turnrl.errors import TurnRLError
    from turnrl.rollout import load_policy

    assert check_device("cpu") == "cpu" and default_device("cpu") == "cpu"
    with pytest.raises(TurnRLError, match=r"^device 'gpu': not a device torch knows"):
        load_policy(str(tiny_dir), device="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(TurnRLError, match=r"^device 'cuda': no CUDA GPU is visible here"):
            load_policy(str(tiny_dir), device="cuda")
    else:
        with pytest.raises(TurnRLError, match=r"^device 'cuda:99': this machine has"):
            check_device("cuda:99")


def test_a_fingerprint_reads_no_hidden_folder(tiny_dir: Path, tmp_path: Path) -> None:
    """``huggingface-cli download --local-dir`` keeps ``.cache/huggingface/download/*.metadata``
    beside the weights and rewrites its time on every download: the same weights fingerprinted
    otherwise each time (a resumed collection then refused them as other weights)."""
    from turnrl.models.loading import model_fingerprints

    local = tmp_path / "local"
    shutil.copytree(tiny_dir, local)
    before = model_fingerprints(local)
    meta = local / ".cache" / "huggingface" / "download" / "model.safetensors.metadata"
    meta.parent.mkdir(parents=True)
    meta.write_text("abc\n1764400000.1\n")
    first = model_fingerprints(local)
    assert first[0] == before[0]
    meta.write_text("abc\n1764400001.7\n")
    assert model_fingerprints(local)[0] == before[0]
    # the form before 29 Nov 2026 reads them still, as the episodes and checkpoints it made did
    assert first[1] != before[1]
    (local / "extra.txt").write_text("a file of the model's")  # one outside a hidden folder still counts
    assert model_fingerprints(local)[0] != before[0]


def test_a_start_model_not_downloaded_yet_is_not_pinned_by_its_name(tiny_dir: Path) -> None:
    """A hub id's fingerprint is its name's until the run downloads it, and its snapshot's after:
    pinned by name, the run's own resume was refused."""
    from turnrl.pipelines.iterative import start_model_fingerprints

    assert start_model_fingerprints(model="turnrl-test/never-downloaded", base="tiny") == {}
    got = start_model_fingerprints(model="turnrl-test/never-downloaded", base=str(tiny_dir))
    assert list(got["model_fingerprints"]) == ["base"]


def test_a_policy_is_fingerprinted_after_its_model_loads(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hub id is fingerprinted by its snapshot in the hub cache, which the first load makes: taken
    before the load, the first run recorded the name's fingerprint and its resume was refused."""
    from turnrl.models import loading
    from turnrl.rollout import load_policy

    calls: list[str] = []
    real_load, real_prints = loading.load_model, loading.model_fingerprints
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: calls.append("load") or real_load(*a, **k))
    monkeypatch.setattr(loading, "model_fingerprints", lambda p: calls.append("fingerprint") or real_prints(p))
    policy = load_policy(str(tiny_dir))
    assert calls == ["load", "fingerprint"] and policy.fingerprint == real_prints(tiny_dir)[0]


def test_building_the_tiny_model_leaves_the_callers_random_stream_alone(tmp_path: Path) -> None:
    """The build seeded torch's global generator, so a policy's sampling salt depended on whether the
    tiny model was built in that process or found in the cache."""
    import torch

    from turnrl.models.tiny import build_tiny

    torch.manual_seed(1)
    build_tiny(tmp_path / "t", episodes_per_split=4)
    after_build = torch.rand(3)
    torch.manual_seed(1)
    assert torch.equal(after_build, torch.rand(3))


def test_the_trainers_stop_ids_are_the_samplers_without_a_generation_config(tiny_dir: Path, tmp_path: Path) -> None:
    """Without generation_config.json transformers makes the sampler's from config.json; the trainer
    read none, so a reply that stopped on an EOS id only config.json names was re-encoded."""
    from turnrl.models.loading import load_tokenizer
    from turnrl.rollout import load_policy
    from turnrl.rollout.policies import training_chat

    bare = tmp_path / "bare"
    shutil.copytree(tiny_dir, bare)
    (bare / "generation_config.json").unlink()
    cfg = json.loads((bare / "config.json").read_text())
    (bare / "config.json").write_text(json.dumps({**cfg, "eos_token_id": [cfg["eos_token_id"], 0]}))
    sampler_stops = set(load_policy(str(bare)).chat.stop_token_ids)
    assert 0 in sampler_stops
    assert set(training_chat(str(bare), load_tokenizer(bare)).stop_token_ids) == sampler_stops


def test_a_folder_missing_tensors_or_with_a_broken_generation_config_is_refused(tiny_dir: Path,
                                                                              tmp_path: Path) -> None:
    """transformers fills tensors a weight file lacks with random values and drops a broken
    generation_config.json (and the stop ids it names), each with a warning the CLI silences: a run
    then went on with random weights or other stop ids and exit 0. Both are one line now."""
    from safetensors.torch import load_file, save_file

    from turnrl.errors import TurnRLError
    from turnrl.models.loading import load_model

    bad = tmp_path / "missing"
    shutil.copytree(tiny_dir, bad)
    tensors = load_file(str(bad / "model.safetensors"))
    key = next(k for k in sorted(tensors) if "q_proj" in k)
    del tensors[key]
    save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(TurnRLError, match=rf"^cannot load model '{bad}': its weight files lack 1 tensor\(s\) "
                                          rf"\({re.escape(key)}\), which would start random"):
        load_model(bad)
    broken = tmp_path / "genconfig"
    shutil.copytree(tiny_dir, broken)
    (broken / "generation_config.json").write_text("{")
    with pytest.raises(TurnRLError, match=r"generation_config.json: not valid JSON"):
        load_model(broken)
    load_model(tiny_dir)  # a whole folder loads


def test_tiny_is_refused_where_a_tiny_folder_is_too(tiny_dir: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`--model tiny` is the embedded model; with a ./tiny here (`turnrl model init-tiny --out tiny` with
    another preset, or a pipeline's OUT/tiny) it silently passed the folder over."""
    from turnrl.errors import TurnRLError
    from turnrl.models.loading import check_model_name, load_tokenizer

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny").mkdir()
    with pytest.raises(TurnRLError, match=r"^model: 'tiny' names the embedded model, and there is a ./tiny here"):
        check_model_name("tiny")
    with pytest.raises(TurnRLError, match=r"write ./tiny for that folder"):
        load_tokenizer("tiny")
    # a run in the working folder (out=.) builds its own ./tiny: its callers name it ./tiny, and a
    # pipeline's base=tiny (build the model into OUT/tiny) is no name to check
    from turnrl.models.loading import model_ref
    from turnrl.pipelines.eto import EtoConfig

    (tmp_path / "tiny").rmdir()
    shutil.copytree(tiny_dir, tmp_path / "tiny")
    assert model_ref(Path(".") / "tiny") == "./tiny" and model_ref(tmp_path / "tiny") == str(tmp_path / "tiny")
    assert load_tokenizer(model_ref(Path(".") / "tiny")) is not None
    EtoConfig(out=".").check()


def test_a_tokenizer_error_keeps_its_whole_message(tiny_dir: Path, tmp_path: Path) -> None:
    """A folder without tokenizer.json gave "Couldn't instantiate the backend tokenizer from one of: "
    and nothing after it (only the first line of the message was kept)."""
    from turnrl.errors import TurnRLError
    from turnrl.models.loading import load_tokenizer

    bad = tmp_path / "notok"
    shutil.copytree(tiny_dir, bad)
    (bad / "tokenizer.json").unlink()
    with pytest.raises(TurnRLError) as e:
        load_tokenizer(bad)
    assert "\n" not in str(e.value) and not str(e.value).rstrip().endswith(":")
