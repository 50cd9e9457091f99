"""Trainer core: exact accumulation, kill-and-resume, non-finite stops, run-dir guards,
LoRA, and the learning-rate schedule. A 2-layer Llama with a 64-token vocabulary and a
next-token NLL objective over random token lists keep every test fast on a CPU."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from turnrl.errors import TurnRLError
from turnrl.train import LoraSettings, TrainConfig, Trainer, latest_checkpoint

TESTS_DIR = Path(__file__).resolve().parent


def build_model(seed: int = 0, dropout: float = 0.0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        attention_dropout=dropout,
    )
    return LlamaForCausalLM(cfg)


def make_data(n: int = 40, seed: int = 1) -> list[list[int]]:
    """Token lists of lengths 3..20, so examples carry very different numbers of units."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 21, (n,), generator=g).tolist()
    return [torch.randint(1, 64, (length,), generator=g).tolist() for length in lengths]


class NLL:
    """Next-token NLL summed over predicted tokens; units = number of predicted tokens."""

    def units(self, examples: Sequence[list[int]]) -> float:
        return float(sum(len(x) - 1 for x in examples))

    def __call__(self, model: Any, examples: Sequence[list[int]]) -> tuple[torch.Tensor, dict[str, float]]:
        width = max(len(x) for x in examples)
        ids = torch.zeros(len(examples), width, dtype=torch.long)
        mask = torch.zeros(len(examples), width, dtype=torch.long)
        for i, x in enumerate(examples):
            ids[i, : len(x)] = torch.tensor(x)
            mask[i, : len(x)] = 1
        device = next(model.parameters()).device  # the trainer places the model (a GPU when there is one)
        ids, mask = ids.to(device), mask.to(device)
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
        logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
        target_mask = mask[:, 1:].float()
        nll = -(logp * target_mask).sum()
        correct = ((logits[:, :-1].argmax(-1) == ids[:, 1:]).float() * target_mask).sum()
        return nll, {"correct": float(correct)}


def base_cfg(**kw: Any) -> TrainConfig:
    defaults: dict[str, Any] = dict(lr=1e-2, batch_size=4, warmup_ratio=0.0, max_grad_norm=1.0, seed=3)
    defaults.update(kw)
    return TrainConfig(**defaults)


def run(tmp: Path, cfg: TrainConfig, objective: Any = None, **kw: Any) -> tuple[Trainer, Any]:
    resume = kw.pop("resume", False)
    trainer = Trainer(
        build_model(kw.pop("dropout", 0.0)), cfg, tmp, make_data(kw.pop("n", 40)), objective or NLL(), **kw
    )
    return trainer, trainer.train(resume=resume)


def read_metrics(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "model" / "model.safetensors"))


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=0, msg=k)


def test_accumulation_is_exact(tmp_path: Path) -> None:
    """8 x 1 and 2 x 4 (and 4 x 2) see the same global batches and give the same curve,
    including each epoch's partial last batch (36 examples, global batch 8)."""
    results = {}
    for bs, accum in [(8, 1), (2, 4), (4, 2)]:
        cfg = base_cfg(batch_size=bs, grad_accum=accum, epochs=2.0)
        trainer, res = run(tmp_path / f"{bs}x{accum}", cfg, n=36)
        assert res.steps == 10 and trainer.batches_per_epoch == 5
        results[(bs, accum)] = (res, final_weights(res.out_dir))
    ref, ref_w = results[(8, 1)]
    assert [h["units"] for h in ref.history][4] == sum(len(x) - 1 for x in make_data(36)) - sum(
        h["units"] for h in ref.history[:4]
    )
    for key in [(2, 4), (4, 2)]:
        res, w = results[key]
        assert [h["step"] for h in res.history] == list(range(1, 11))
        for a, b in zip(ref.history, res.history, strict=True):
            assert a["units"] == b["units"]
            assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
            assert a["grad_norm"] == pytest.approx(b["grad_norm"], abs=1e-5)
            assert a["correct"] == pytest.approx(b["correct"], abs=1e-6)
        assert_same_weights(ref_w, w)
    assert ref.history[-1]["loss"] < ref.history[0]["loss"]


KILL_SCRIPT = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from test_trainer_core import NLL, base_cfg, build_model, make_data
from turnrl.train import Trainer

kill_at = int(os.environ.get("TURNRL_TEST_KILL_AT", "0"))

def eval_fn(model, step):
    if step == kill_at:  # after step's optimizer update, before its log line and checkpoint
        os.kill(os.getpid(), signal.SIGKILL)
    return {{"step_seen": float(step)}}

cfg = base_cfg(save_every=2, eval_every=1, epochs=1.0, lora=None)
model = build_model(dropout=0.2)  # dropout: resume must restore the RNG states too
Trainer(model, cfg, sys.argv[1], make_data(), NLL(), eval_fn=eval_fn).train(resume=True)
"""


def kill_eval(model: Any, step: int) -> dict[str, float]:
    return {"step_seen": float(step)}


def test_sigkill_then_resume_matches_uninterrupted(tmp_path: Path) -> None:
    script = tmp_path / "train_script.py"
    script.write_text(textwrap.dedent(KILL_SCRIPT.format(tests=str(TESTS_DIR))))
    out = tmp_path / "killed"
    env = {**os.environ, "TURNRL_TEST_KILL_AT": "6", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(script), str(out)], env=env, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr[-2000:]
    ckpt = latest_checkpoint(out)
    assert ckpt is not None and ckpt.name == "step-000004"
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3, 4, 5]
    assert not (out / "summary.json").exists() and not (out / "model").exists()
    leftover = out / "checkpoints" / "step-000006.tmp-12345"
    leftover.mkdir()
    (leftover / "junk").write_text("half-written")

    env["TURNRL_TEST_KILL_AT"] = "0"
    proc = subprocess.run([sys.executable, str(script), str(out)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not leftover.exists()
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000008", "step-000010"]

    ref_out = tmp_path / "uninterrupted"
    ref_cfg = base_cfg(save_every=2, eval_every=1, epochs=1.0)
    Trainer(build_model(dropout=0.2), ref_cfg, ref_out, make_data(), NLL(), eval_fn=kill_eval).train()
    got, want = read_metrics(out), read_metrics(ref_out)
    assert [r["step"] for r in got] == list(range(1, 11))  # no duplicates, no gaps
    for a, b in zip(got, want, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["lr"] == pytest.approx(b["lr"], rel=1e-9)
        assert a["eval/step_seen"] == b["eval/step_seen"] == a["step"]
    assert_same_weights(final_weights(out), final_weights(ref_out))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 10 and summary["final_loss"] == pytest.approx(got[-1]["loss"], abs=1e-5)


class NaNAt(NLL):
    """NLL that turns non-finite on its ``at``-th call."""

    def __init__(self, at: int):
        self.at, self.calls = at, 0

    def __call__(self, model: Any, examples: Sequence[list[int]]) -> tuple[torch.Tensor, dict[str, float]]:
        self.calls += 1
        loss, metrics = super().__call__(model, examples)
        return (loss * float("nan") if self.calls == self.at else loss), metrics


def test_non_finite_loss_stops_before_the_step(tmp_path: Path) -> None:
    cfg = base_cfg(save_every=2, max_steps=6)
    with pytest.raises(
        TurnRLError, match=r"non-finite loss at step 4; the last checkpoint \(step-000002\) is intact"
    ):
        run(tmp_path, cfg, NaNAt(4))
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-000002"]
    assert not (tmp_path / "summary.json").exists() and not (tmp_path / "model").exists()
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
    # the checkpoint is loadable: resuming finishes the run
    _, res = run(tmp_path, cfg, resume=True)
    assert res.steps == 6 and math.isfinite(res.final_loss)
    assert [r["step"] for r in read_metrics(tmp_path)] == list(range(1, 7))

    with pytest.raises(TurnRLError, match=r"step 1; the last checkpoint \(none\)"):
        run(tmp_path / "fresh", cfg, NaNAt(1))


class LongestOf(NLL):
    """NLL that also reports each micro-batch's longest example, a max metric."""

    max_metrics = frozenset({"longest"})

    def __call__(self, model: Any, examples: Sequence[list[int]]) -> tuple[torch.Tensor, dict[str, float]]:
        loss, metrics = super().__call__(model, examples)
        return loss, {**metrics, "longest": float(max(len(x) for x in examples))}


def test_max_metrics_are_the_steps_maximum_over_micro_batches(tmp_path: Path) -> None:
    """A metric an objective names in ``max_metrics`` is the max over the step's micro-batches, not a
    unit-weighted sum (PPO's ratio_max_dev)."""
    data = make_data(8)
    trainer, _ = run(tmp_path, base_cfg(batch_size=2, grad_accum=2, max_steps=2), LongestOf(), n=8)
    for r in read_metrics(tmp_path):
        batch = [data[i] for i in trainer.global_batch_indices(r["step"] - 1)]
        assert r["longest"] == max(len(x) for x in batch)


def test_run_dir_guards(tmp_path: Path) -> None:
    cfg = base_cfg(max_steps=3)
    _, res = run(tmp_path, cfg)
    assert (tmp_path / "summary.json").is_file() and res.steps == 3
    with pytest.raises(TurnRLError, match="already holds a run; pass --resume"):
        run(tmp_path, cfg)
    with pytest.raises(TurnRLError, match=r"config changed since this checkpoint was written \(train\.lr: [-0-9.e]+, "
                                          r"now 0\.005\); resume with the same config"):  # names the setting
        run(tmp_path, base_cfg(max_steps=3, lr=5e-3), resume=True)
    # resuming a finished run with the same config does nothing and reports the same result
    mtime = (tmp_path / "summary.json").stat().st_mtime_ns
    _, again = run(tmp_path, base_cfg(max_steps=3, save_every=7), resume=True)
    assert again.final_loss == pytest.approx(res.final_loss)
    assert (tmp_path / "summary.json").stat().st_mtime_ns == mtime
    # resume with nothing to resume from starts fresh
    _, fresh = run(tmp_path / "new", cfg, resume=True)
    assert fresh.steps == 3


def test_lora_trains_only_the_adapter(tmp_path: Path) -> None:
    cfg = base_cfg(max_steps=4, lora=LoraSettings(r=4, alpha=8, dropout=0.05))
    original = {k: v.clone() for k, v in build_model().state_dict().items()}
    trainer, res = run(tmp_path, cfg)
    peft_model = trainer.unwrapped_model.cpu()  # the trainer puts it on the GPU when there is one
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    base = peft_model.get_base_model()
    q = base.model.layers[0].self_attn.q_proj
    torch.testing.assert_close(q.base_layer.weight, original["model.layers.0.self_attn.q_proj.weight"])
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    assert res.adapter_dir == tmp_path / "adapter"

    merged = AutoModelForCausalLM.from_pretrained(str(res.model_dir))
    assert not any("lora" in k for k in merged.state_dict())
    assert not torch.allclose(
        merged.model.layers[0].self_attn.q_proj.weight, original["model.layers.0.self_attn.q_proj.weight"]
    )
    ids = torch.tensor([make_data(1)[0]])
    peft_model.eval()
    with torch.no_grad():
        torch.testing.assert_close(
            merged(input_ids=ids).logits, peft_model(input_ids=ids).logits, atol=1e-5, rtol=0
        )
    # the adapter folder given where a model is expected: the error points at the merged model
    from turnrl.models.loading import resolve_model_path

    with pytest.raises(TurnRLError, match=r"adapter: not a model directory \(no config\.json\); it is a LoRA "
                                          r"adapter: the merged model is .*model$"):
        resolve_model_path(str(tmp_path / "adapter"))
    # an adapter alone (no merged model beside it) is named as one too, with its base
    import shutil

    alone = tmp_path / "alone" / "adapter"
    shutil.copytree(tmp_path / "adapter", alone)
    with pytest.raises(TurnRLError, match=r"adapter: not a model directory \(no config\.json\); it is a LoRA adapter: "
                                          r"merge it into its base model first"):
        resolve_model_path(str(alone))
    config = json.loads((alone / "adapter_config.json").read_text())
    (alone / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "org/base-7b"}))
    with pytest.raises(TurnRLError, match=r"it is a LoRA adapter of org/base-7b: merge it into its base model first"):
        resolve_model_path(str(alone))


def test_lora_on_a_half_precision_base_trains_float32(tmp_path: Path) -> None:
    """A bf16 base (LoRA under mixed precision on a GPU) with a trainable ``modules_to_save``
    copy: every trainable parameter is float32, the frozen base stays bf16."""
    cfg = base_cfg(max_steps=1, mixed_precision="bf16",
                   lora=LoraSettings(r=4, alpha=8, modules_to_save=["lm_head"]))
    trainer = Trainer(build_model().to(torch.bfloat16), cfg, tmp_path, make_data(8), NLL())
    params = list(trainer.unwrapped_model.named_parameters())
    trainable = {p.dtype for _, p in params if p.requires_grad}
    assert trainable == {torch.float32} and any("modules_to_save" in n for n, p in params if p.requires_grad)
    assert {p.dtype for _, p in params if not p.requires_grad} == {torch.bfloat16}


@pytest.mark.filterwarnings("error:.*gradient_checkpointing_enable.*:FutureWarning")
@pytest.mark.parametrize("lora", [False, True])
def test_gradient_checkpointing_changes_no_loss_or_gradient(tmp_path: Path, lora: bool) -> None:
    """Recomputing activations in the backward pass gives the same losses and gradient norms,
    through the API the installed transformers names (no deprecation warning); the saved model's
    config keeps its own ``use_cache``, which training turned off."""
    kw: dict[str, Any] = {"max_steps": 3, "lora": LoraSettings(r=4, alpha=8, dropout=0.0) if lora else None}
    plain, _ = run(tmp_path / "plain", base_cfg(**kw))
    ckpt, _ = run(tmp_path / "ckpt", base_cfg(gradient_checkpointing=True, **kw))
    base = ckpt.unwrapped_model.get_base_model() if lora else ckpt.unwrapped_model
    assert base.model.gradient_checkpointing  # it was switched on
    a, b = read_metrics(tmp_path / "plain"), read_metrics(tmp_path / "ckpt")
    assert [r["loss"] for r in a] == pytest.approx([r["loss"] for r in b], rel=1e-5)
    assert [r["grad_norm"] for r in a] == pytest.approx([r["grad_norm"] for r in b], rel=1e-4)
    assert not (plain.unwrapped_model.get_base_model() if lora else plain.unwrapped_model).model.gradient_checkpointing
    assert base.config.use_cache is False  # off while training
    saved = json.loads((tmp_path / "ckpt" / "model" / "config.json").read_text())
    assert build_model().config.use_cache is True
    assert saved.get("use_cache", True) is True  # transformers leaves a default value out


def test_lr_warmup_then_cosine(tmp_path: Path) -> None:
    lr, total, warmup = 1e-3, 10, 2
    _, res = run(tmp_path, base_cfg(lr=lr, max_steps=total, warmup_ratio=0.2))
    lrs = [r["lr"] for r in read_metrics(tmp_path)]
    want = [lr * (s + 1) / (warmup + 1) for s in range(warmup)]
    want += [
        lr * 0.5 * (1 + math.cos(math.pi * (s - warmup) / (total - warmup))) for s in range(warmup, total)
    ]
    assert lrs == pytest.approx(want, rel=1e-9)
    assert lrs[0] < lrs[1] < lrs[2] == pytest.approx(lr)
    assert all(a > b for a, b in zip(lrs[2:], lrs[3:], strict=False))
    row = read_metrics(tmp_path)[0]
    assert {"step", "epoch", "loss", "lr", "grad_norm", "units", "correct", "time"} <= row.keys()


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_optimizer_first_step_by_hand(tmp_path: Path, optimizer: str) -> None:
    """One full-batch step, no clipping, constant lr. SGD: w1 = w0 - lr * g; AdamW's first
    (bias-corrected) step moves every weight with a non-zero gradient by about lr, whatever
    the gradient's size: the difference the ``optimizer`` option exists for."""
    lr, data = 1e-2, make_data(12)
    model = build_model()
    w0 = {k: v.detach().clone() for k, v in model.named_parameters()}
    loss, _ = NLL()(model, data)
    (loss / NLL().units(data)).backward()
    grads = {k: v.grad.detach().clone() for k, v in model.named_parameters()}
    cfg = base_cfg(optimizer=optimizer, lr=lr, batch_size=12, max_steps=1, max_grad_norm=0.0, lr_schedule="constant")
    _, res = run(tmp_path, cfg, n=12)
    w1 = final_weights(res.out_dir)
    for k, g in grads.items():
        step = w1[k] - w0[k]
        if optimizer == "sgd":
            torch.testing.assert_close(step, -lr * g, atol=1e-6, rtol=1e-4, msg=k)
        else:
            moved = g.abs() > 1e-6
            torch.testing.assert_close(step[moved].abs(), torch.full_like(step[moved], lr), atol=1e-4, rtol=0, msg=k)


def test_sgd_momentum_is_rejected_for_adamw() -> None:
    with pytest.raises(ValueError, match="momentum"):
        TrainConfig(optimizer="adamw", momentum=0.9)


def test_mixed_precision_loads_float32_master_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """Full fine-tuning always trains float32 weights (autocast does the half-precision
    math); only a LoRA run's frozen base loads in half precision, and only on a GPU."""
    from turnrl.config import parse_overrides
    from turnrl.models.loading import training_dtype

    for gpu in (False, True):
        monkeypatch.setattr(torch.cuda, "is_available", lambda gpu=gpu: gpu)
        assert [training_dtype(mp, lora=False) for mp in ("no", "bf16", "fp16")] == ["float32"] * 3
        want = ["float32", "bfloat16", "float16"] if gpu else ["float32"] * 3
        assert [training_dtype(mp, lora=True) for mp in ("no", "bf16", "fp16")] == want
    # DeepSpeed keeps its own float32 copy and runs the model in half precision (no autocast)
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    assert [training_dtype(mp, lora=False) for mp in ("no", "bf16", "fp16")] == ["float32", "bfloat16", "float16"]
    # YAML reads a bare ``no`` as false
    assert TrainConfig(**parse_overrides(["mixed_precision=no"])).mixed_precision == "no"
    with pytest.raises(ValueError, match="mixed_precision"):
        TrainConfig(mixed_precision=True)  # type: ignore[arg-type]


def test_override_values_parse_as_yaml_but_prose_stays_text() -> None:
    """``key=value`` values are YAML scalars, lists and brace mappings; a value with ``: `` in it
    (an instruction) stays the text it is instead of becoming a one-key mapping."""
    from turnrl.config import parse_overrides
    from turnrl.train.ppo import PPOConfig

    got = parse_overrides(["lr=0.5", "a.b=[1, 2]", "env_opts={horizon: 5}", "flag=true",
                           "instruction=You press buttons: red, blue. Answer: ACTION=X", "n="])
    assert got == {"lr": 0.5, "a": {"b": [1, 2]}, "env_opts": {"horizon": 5}, "flag": True,
                   "instruction": "You press buttons: red, blue. Answer: ACTION=X", "n": ""}
    assert PPOConfig(**parse_overrides(["instruction=Rule: stay."])).instruction == "Rule: stay."
    prose = ["x=Pick arm #1 first", "x=- be brief", "x=a #", "x='quoted: yes'", "x=[a, b]", "x=#1"]
    assert [parse_overrides([p])["x"] for p in prose] == [
        "Pick arm #1 first", "- be brief", "a #", "quoted: yes", ["a", "b"], "#1"]


def test_auto_dtype_is_float32_off_the_gpu(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``dtype='auto'`` means bf16 only for a model placed on a GPU: a model left on the
    CPU (for a trainer to place, or evaluated there) stays float32 even when a GPU exists."""
    from turnrl.devices import default_device
    from turnrl.models.loading import load_model

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert default_device() == "cuda" and default_device("cpu") == "cpu"
    assert next(load_model(str(tiny_dir)).parameters()).dtype == torch.float32
    assert next(load_model(str(tiny_dir), device="cpu").parameters()).dtype == torch.float32


@pytest.mark.slow
def test_gpu_precision_check_script_runs_on_the_cpu(tmp_path: Path, load_script: Any,
                                                    monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """``scripts/gpu_precision_check.py`` (the docs' one-GPU table) also runs on the CPU
    (bf16 autocast there): float32 weights saved, DPO's first loss at log 2."""
    mod = load_script("gpu_precision_check")
    monkeypatch.setattr(sys, "argv", ["gpu_precision_check.py", str(tmp_path)])
    mod.main()
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["new_sft_dtype"] == ["torch.float32"] and res["new_sft_moved_share"] > 0.9
    assert abs(res["new_dpo_step1_loss_minus_log2"]) < 1e-5
    assert all(d < 0.02 for d in res["new_ppo_first_minibatch_ratio_max_dev"])


def test_forked_rng_seeds_inside_and_restores_outside() -> None:
    from turnrl.devices import forked_rng

    torch.manual_seed(5)
    want = torch.rand(4)
    torch.manual_seed(5)
    with forked_rng(1):
        inside = torch.rand(4)
    assert torch.equal(torch.rand(4), want)
    torch.manual_seed(1)
    assert torch.equal(torch.rand(4), inside)


def test_checkpoints_of_a_tied_head_save_quietly_and_resume_tied(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A tied LM head (the tiny model's) is stored once by accelerate's ``save_state``, whose
    shared-tensor warning the trainer drops for exactly the tied names; a resumed run is tied
    again and ends where an uninterrupted one does."""
    from turnrl.train.core import _TiedWeightFilter

    def tied_model() -> LlamaForCausalLM:
        m = build_model()
        m.config.tie_word_embeddings = True
        m.tie_weights()
        return m

    cfg = base_cfg(max_steps=4, save_every=2)
    with caplog.at_level(logging.WARNING):
        whole = Trainer(tied_model(), cfg, tmp_path / "whole", make_data(), NLL()).train()
    assert latest_checkpoint(tmp_path / "whole") is not None
    assert not [r for r in caplog.records if "shared tensor" in r.getMessage()]
    Trainer(tied_model(), cfg, tmp_path / "half", make_data(), NLL()).train()
    # as if killed after the step-2 checkpoint: no summary, no final model, no step-4 checkpoint
    (tmp_path / "half" / "summary.json").unlink()
    shutil.rmtree(tmp_path / "half" / "model")
    shutil.rmtree(tmp_path / "half" / "checkpoints" / "step-000004")
    resumed = Trainer(tied_model(), cfg, tmp_path / "half", make_data(), NLL())
    res = resumed.train(resume=True)
    m = resumed.unwrapped_model
    assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()
    assert res.final_loss == pytest.approx(whole.final_loss, abs=1e-6)
    # the filter drops only a record that names tied tensors
    f = _TiedWeightFilter({"lm_head.weight"})
    msg = "[RANK 0] Removed shared tensor {%s} while saving. This should be OK"

    def record(names: str) -> logging.LogRecord:
        return logging.LogRecord("accelerate.utils.other", logging.WARNING, __file__, 0, msg % names, None, None)

    assert not f.filter(record("'lm_head.weight'"))
    assert f.filter(record("'lm_head.weight', 'model.norm.weight'"))
    assert f.filter(record("'model.norm.weight'"))


def test_bad_adam_betas_and_lora_modules_are_one_line_errors(tmp_path: Path) -> None:
    """Checked before training: betas outside [0, 1) at config time; LoRA target modules the model
    does not have when the adapter is made, naming the key."""
    from turnrl.config import load_config
    from turnrl.errors import TurnRLError

    with pytest.raises(TurnRLError, match=r"adam_betas.*\[0, 1\)"):
        load_config(TrainConfig, overrides=["adam_betas=[0.9,1.0]"])
    with pytest.raises(TurnRLError, match=r"^override 'adam_betas=\[0.9,1.5\]': bad value for 'adam_betas': each "
                                          r"beta must be in \[0, 1\) \(got \[0.9, 1.5\]\)$"):  # "got" once
        load_config(TrainConfig, overrides=["adam_betas=[0.9,1.5]"])
    # a misspelled name in a list adapted the other names alone; peft fails only when none matches
    for names in (["no_such_proj"], ["q_proj", "v_prj"]):
        cfg = base_cfg(max_steps=1, lora=LoraSettings(r=4, alpha=8, target_modules=names))
        with pytest.raises(TurnRLError, match=rf"^lora.target_modules: no module of the model is named '{names[-1]}'$"):
            run(tmp_path, cfg)
    cfg = base_cfg(max_steps=1, lora=LoraSettings(r=4, alpha=8, target_modules=".*no_such_proj"))  # a pattern
    with pytest.raises(TurnRLError, match=r"^lora.target_modules='.\*no_such_proj': "):
        run(tmp_path, cfg)
    # a bad pattern was a traceback from peft's re.fullmatch; a huge int one from math.isfinite
    with pytest.raises(TurnRLError, match=r"bad value for 'lora.target_modules': not a valid regular expression"):
        load_config(TrainConfig, overrides=["lora.target_modules=q_proj("])
    with pytest.raises(TurnRLError, match=r"bad value for 'batch_size': must be >= 1"):
        load_config(TrainConfig, overrides=["batch_size=-" + "9" * 400])
    with pytest.raises(TurnRLError, match=r"bad value for 'seed': must be in \[0, "):
        load_config(TrainConfig, overrides=["seed=" + "9" * 400])


def test_settings_that_would_change_nothing_are_refused_before_training(tmp_path: Path) -> None:
    """Keys accepted and then ignored are errors naming them: ``adam_betas`` with SGD, ``eval_every``
    where the run has nothing to evaluate, a ``lora.modules_to_save`` name no module ends with (peft
    would train as if it were unset), and fp16 on the CPU (accelerate does no fp16 autocast there)."""
    from turnrl.config import load_config

    with pytest.raises(TurnRLError, match=r"bad value for 'optimizer': SGD ignores adam_betas=\[0.5, 0.5\]"):
        load_config(TrainConfig, overrides=["optimizer=sgd", "adam_betas=[0.5,0.5]"])
    assert load_config(TrainConfig, overrides=["optimizer=sgd", "momentum=0.9"]).adam_betas == (0.9, 0.999)
    # a nested section is filled with every default: SGD there is fine (ETO's train., ArCHer's actor.)
    from turnrl.pipelines.eto import EtoConfig

    assert load_config(EtoConfig, overrides=["train.optimizer=sgd"]).train.optimizer == "sgd"
    with pytest.raises(TurnRLError, match=r"^eval_every=2: this run has nothing to evaluate on"):
        run(tmp_path / "e", base_cfg(max_steps=1, eval_every=2))
    # a run checkpointed before the check (eval_every is in its hash) still resumes, with a warning
    run(tmp_path / "old", base_cfg(max_steps=4, save_every=2, eval_every=2), eval_fn=lambda m, step: {"x": 1.0})
    (tmp_path / "old" / "summary.json").unlink()
    run(tmp_path / "old", base_cfg(max_steps=4, save_every=2, eval_every=2), resume=True)
    run(tmp_path / "e2", base_cfg(max_steps=1, eval_every=2), eval_fn=lambda m, step: {"x": 1.0})
    with pytest.raises(TurnRLError, match=r"^lora.modules_to_save: no module of the model is named 'foo'"):
        run(tmp_path / "m", base_cfg(max_steps=1, lora=LoraSettings(r=4, alpha=8, modules_to_save=["foo"])))
    if not torch.cuda.is_available():
        with pytest.raises(TurnRLError, match=r"^mixed_precision=fp16 needs a GPU"):
            run(tmp_path / "h", base_cfg(max_steps=1, mixed_precision="fp16"))
    assert not any((tmp_path / d).exists() for d in ("e", "m", "h"))


def test_a_model_that_cannot_name_its_embeddings_trains_under_lora() -> None:
    """transformers' default ``get_input_embeddings`` raises NotImplementedError where it cannot find
    them (remote-code models): the tied-weight check treats that as untied."""
    from turnrl.train.core import _tied_embedding

    class NoEmbeddings(torch.nn.Module):
        def get_input_embeddings(self) -> Any:
            raise NotImplementedError("not auto-handled")

        def get_output_embeddings(self) -> Any:
            return None

    assert _tied_embedding(NoEmbeddings()) is None
    tiny = build_model()
    assert _tied_embedding(tiny) is None  # LlamaConfig's default: untied


@pytest.mark.parametrize("lora", [dict(target_modules=["lm_head"]), dict(target_modules=["q_proj"],
                                                                        modules_to_save=["embed_tokens"])])
def test_lora_on_a_tied_embedding_is_refused(tiny_dir: Path, tmp_path: Path, lora: dict[str, Any]) -> None:
    """The tiny model ties its LM head to its input embeddings: a merged adapter on either would be
    written into the one shared tensor, so ``model/`` would differ from the trained model. Refused,
    naming the module; untied models and the default targets train as before."""
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    with pytest.raises(TurnRLError, match=r"^lora: .*(lm_head|embed_tokens).*share one weight"):
        Trainer(model, base_cfg(max_steps=1, lora=LoraSettings(r=4, alpha=8, **lora)), tmp_path, make_data(), NLL())
    untied = build_model()  # LlamaConfig's default: no tying
    assert untied.get_output_embeddings().weight is not untied.get_input_embeddings().weight
    Trainer(untied, base_cfg(max_steps=1, lora=LoraSettings(r=4, alpha=8, **lora)), tmp_path / "u", make_data(), NLL())
    Trainer(AutoModelForCausalLM.from_pretrained(tiny_dir), base_cfg(max_steps=1, lora=LoraSettings(r=4, alpha=8)),
            tmp_path / "d", make_data(), NLL())


def test_a_rerun_without_checkpoints_drops_the_old_summary_before_training(tmp_path: Path) -> None:
    """``summary.json`` marks a finished run: a resume that has no checkpoint to resume from (they were
    deleted) trains from scratch, so the old summary must not stay beside that run's partial output."""
    cfg = base_cfg(max_steps=3)
    run(tmp_path, cfg)
    shutil.rmtree(tmp_path / "checkpoints")
    with pytest.raises(TurnRLError, match="non-finite loss at step 2"):
        run(tmp_path, cfg, NaNAt(2), resume=True)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1]
    assert not (tmp_path / "summary.json").exists()


def test_a_checkpoint_hashed_the_way_of_an_earlier_version_resumes(tmp_path: Path) -> None:
    """A caller that changes what it hashes passes the earlier form as ``legacy_run_configs``: checkpoints
    written under it resume; a run config that is neither is still refused."""
    cfg = base_cfg(save_every=2, max_steps=6)
    with pytest.raises(TurnRLError, match="non-finite loss at step 4"):
        run(tmp_path, cfg, NaNAt(4), run_config={"algo": "x", "cadence": 1})  # leaves step-000002
    with pytest.raises(TurnRLError, match="config changed"):
        run(tmp_path, cfg, resume=True, run_config={"algo": "x"})
    _, res = run(tmp_path, cfg, resume=True, run_config={"algo": "x"},
                 legacy_run_configs=[{"algo": "x", "cadence": 1}])
    assert res.steps == 6 and [r["step"] for r in read_metrics(tmp_path)] == list(range(1, 7))


def test_dropout_setting_is_hashed_only_for_a_model_that_drops_out(tmp_path: Path) -> None:
    """``dropout`` changes nothing for a model without dropout, so its checkpoints resume across the
    setting (and across its addition to TrainConfig); for a model with dropout it is part of the run.
    ``dropout=false`` zeroes every rate of the trained model: training then computes as eval mode does."""
    from turnrl.train.core import dropout_modules

    def trainer(out: str, dropout: float, keep: bool) -> Trainer:
        return Trainer(build_model(0, dropout), base_cfg(dropout=keep), tmp_path / out, make_data(8), NLL())

    from turnrl.train.core import config_hash

    assert trainer("a", 0.0, True).config_hash == trainer("b", 0.0, False).config_hash
    assert trainer("c", 0.2, True).config_hash != trainer("d", 0.2, False).config_hash
    # kept on (every run before the setting existed): the hash is the one made without the setting
    before = config_hash(base_cfg(dropout=True), None, {"examples": 8}, exempt=frozenset({"dropout"}))
    assert trainer("g", 0.2, True).config_hash == before
    exempt = Trainer(build_model(0, 0.2), base_cfg(dropout=True, lr=0.5), tmp_path / "h", make_data(8), NLL(),
                     hash_exempt=["lr"])  # a caller's settings left out (PPO's kl_gradient at its default)
    assert exempt.config_hash == config_hash(base_cfg(), None, {"examples": 8}, exempt=frozenset({"dropout", "lr"}))
    assert exempt.config_hash != before
    kept, dropped = trainer("e", 0.2, True), trainer("f", 0.2, False)
    assert len(dropout_modules(kept.unwrapped_model)) == 2 and dropout_modules(dropped.unwrapped_model) == []
    x = torch.tensor([make_data(1)[0]])
    model = dropped.unwrapped_model.train()
    with torch.no_grad():
        assert torch.equal(model(input_ids=x).logits, model.eval()(input_ids=x).logits)


def test_lora_is_refused_where_parameters_are_sharded() -> None:
    """Under FSDP or ZeRO-3 the main process's copy of a parameter is a shard: the final save wrote the
    adapter and merged model from it. LoRA is refused there (DDP and ZeRO-2 keep whole parameters)."""
    from turnrl.train.core import check_lora_sharding

    for kind, stage in (("DistributedType.FSDP", None), ("DistributedType.DEEPSPEED", 3)):
        with pytest.raises(TurnRLError, match=r"^lora under (FSDP|DeepSpeed ZeRO-3): the final save would write"):
            check_lora_sharding(kind, stage, lora=True)
        check_lora_sharding(kind, stage, lora=False)  # a full fine-tune is gathered on save
    for kind, stage in (("DistributedType.MULTI_GPU", None), ("DistributedType.DEEPSPEED", 2), ("DistributedType.NO", None)):
        check_lora_sharding(kind, stage, lora=True)


def test_a_run_with_something_to_evaluate_evaluates_its_last_step(tmp_path: Path) -> None:
    """Held-out data given without eval_every (its default, 0) were never read: only the untrained start
    was evaluated. The last step is evaluated whenever there is an eval_fn; eval_every adds steps."""
    steps: list[int] = []

    def seen(model: Any, step: int) -> dict[str, float]:
        steps.append(step)
        return {"x": float(step)}

    run(tmp_path / "a", base_cfg(max_steps=3), eval_fn=seen)
    assert steps == [3]
    lines = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("eval/x") for r in lines] == [None, None, 3.0]
    steps.clear()
    run(tmp_path / "b", base_cfg(max_steps=5, eval_every=2), eval_fn=seen)
    assert steps == [2, 4, 5]
