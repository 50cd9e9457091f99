"""The trainer core: one optimisation loop that every algorithm reuses.

SFT, the preference losses (DPO, DMPO, IPO, SPPO), PPO and the ArCHer actor differ only in
their :class:`Objective` -- a callable that maps a model and a list of examples to a loss
*summed* over the examples' units (action tokens, pairs, ...) plus metric sums. Everything
else lives here: accelerate, LoRA, mixed precision, the data order, exact gradient
accumulation, the learning-rate schedule, checkpoints, resume, logging and the final save.

Exact accumulation
------------------
A *global batch* is ``batch_size x grad_accum x num_processes`` examples (the last global
batch of an epoch may be smaller; it is kept). For each optimizer step the trainer

1. computes ``U = sum(objective.units(share))`` over the whole global batch, summed across
   processes, before any forward pass;
2. runs ``grad_accum`` micro-batches; each contributes ``loss_sum / U`` (times
   ``num_processes``, because DDP averages gradients across processes) and calls
   ``backward`` under ``accelerator.no_sync`` on all but the last micro-batch;
3. clips the gradient norm, steps the optimizer and the scheduler, zeroes the gradients.

So the gradient is that of ``(sum of per-unit losses over the global batch) / U`` whatever
the split: batch 8 x accum 1 and batch 2 x accum 4 give the same loss curve and weights up
to float rounding, even with examples of different lengths (averaging per micro-batch,
as naive accumulation does, would weight short examples more). Logged ``loss`` is the sum
of the micro-batch losses, i.e. the global per-unit loss; logged metrics are metric sums
divided by ``U``. accelerate's own ``accumulate()`` is not used.

Data order
----------
Epoch ``e`` visits the dataset in the order ``np.random.default_rng([seed, e]).permutation``;
global batches are consecutive slices of it. Within a global batch, micro-batch ``j`` is
the slice ``[j*b*P, (j+1)*b*P)`` (``b`` = batch_size, ``P`` = processes) and process ``r``
takes its every ``P``-th element starting at ``r``. The order depends only on the seed and
the step, so a resumed run reads exactly the examples an uninterrupted run would.

Checkpoints and resume
----------------------
``out_dir/checkpoints/step-NNNNNN`` holds ``accelerator.save_state`` (model, optimizer,
scheduler, RNG states) and ``trainer_state.json``. It is written to
``step-NNNNNN.tmp-<pid>`` and renamed into place, so a directory without ``.tmp`` is always
complete; leftovers are deleted on the next start. ``train(resume=True)`` continues from
the newest complete checkpoint and ends with the same weights and the same
``metrics.jsonl`` as an uninterrupted run. ``summary.json`` is written last; its presence
marks a finished run.

Departures and limits: under fp16 a non-finite gradient norm is the loss scaler's business
(the step is skipped, as in the HF Trainer); under bf16/fp32 it stops the run. DeepSpeed's
engine steps after every backward and clips with its own ``gradient_clipping`` setting, so
under DeepSpeed ``grad_accum`` must be 1 (a global batch is then one micro-batch per
process, still exact); DDP and FSDP accumulate exactly over micro-batches too.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import hashlib
import importlib.util
import json
import logging
import math
import os
import random
import re
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list
from pydantic import ValidationInfo, field_validator
from safetensors.torch import save_file
from torch.optim.lr_scheduler import LambdaLR

from turnrl.config import Config, Range
from turnrl.devices import forked_rng
from turnrl.errors import TurnRLError

__all__ = [
    "LoraSettings",
    "Objective",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "atomic_write_json",
    "config_changes",
    "config_facts",
    "config_hash",
    "latest_checkpoint",
    "list_checkpoints",
    "set_seed",
]

CHECKPOINTS = "checkpoints"
#: the folder under ``OUT/model`` that holds the modules saved apart (``Trainer(save_apart=...)``)
PARTS = "parts"
TRAINER_STATE = "trainer_state.json"
SUMMARY = "summary.json"
METRICS = "metrics.jsonl"
_CKPT_RE = re.compile(r"^step-(\d+)$")
# Keys of TrainConfig that do not change what is computed; they may differ on resume.
_HASH_EXEMPT = frozenset({"save_every", "keep_checkpoints", "log_every"})


class LoraSettings(Config):
    """LoRA adapter settings (peft ``LoraConfig``)."""

    r: int = 8
    alpha: int = 16
    dropout: float = 0.05
    target_modules: list[str] | str = "all-linear"
    #: modules trained in full next to the adapter (e.g. PPO's ``value_head``)
    modules_to_save: list[str] | None = None

    value_ranges = {"r": Range(1), "alpha": Range(1), "dropout": Range(0, 1, hi_open=True)}

    @field_validator("target_modules")
    @classmethod
    def _a_pattern_compiles(cls, v: list[str] | str) -> list[str] | str:
        if isinstance(v, str) and v != "all-linear":  # peft matches a string as a regular expression
            try:
                re.compile(v)
            except re.error as e:
                raise ValueError(f"not a valid regular expression ({e})") from None
        return v


def check_out_dir(out_dir: Path, resume: bool) -> Path | None:
    """What :meth:`Trainer.check_out` checks before it knows the run's config (a trainer calls it
    before minutes of work it does ahead of the trainer, such as a reference pass): without
    ``resume``, an ``out_dir`` that holds a run; a ``model/`` or ``adapter/`` of no run. Returns the
    newest checkpoint."""
    ckpt = latest_checkpoint(out_dir)
    if not resume and (ckpt is not None or (out_dir / SUMMARY).exists()):
        raise TurnRLError(f"{out_dir}: already holds a run; pass --resume to continue it or choose another --out")
    # a resume with no checkpoint starts over, and so replaces model/ too: only a run's own (one killed
    # in its final save has its metrics file, which training opens before its first step)
    ours = resume and ((out_dir / SUMMARY).exists() or (out_dir / METRICS).exists())
    if ckpt is None and not ours:
        beside = f"no checkpoint, {SUMMARY} or {METRICS}" if resume else f"no checkpoint or {SUMMARY}"
        for name in ("model", "adapter"):
            if (out_dir / name).exists():
                raise TurnRLError(f"{out_dir / name}: exists and is no run's output ({beside} beside it); "
                                  "the final save would replace it: choose another --out")
    return ckpt


class TrainConfig(Config):
    """Optimisation settings shared by every trainer."""

    lr: float = 1e-4
    batch_size: int = 8
    """Micro-batch size per process."""
    grad_accum: int = 1
    epochs: float = 1.0
    max_steps: int = 0
    """Optimizer steps; 0 = ``ceil(epochs x global batches per epoch)``."""
    seed: int = 0
    warmup_ratio: float = 0.05
    lr_schedule: Literal["cosine", "linear", "constant"] = "cosine"
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    """Clip the gradient norm to this; 0 = no clipping (the norm is still logged)."""
    adam_betas: tuple[float, float] = (0.9, 0.999)
    optimizer: Literal["adamw", "sgd"] = "adamw"
    """``adamw`` moves every weight by about ``lr`` a step whatever its gradient's size;
    ``sgd`` (with ``momentum``) moves each weight in proportion to its gradient, so a small
    preference step leaves the weights it barely touches almost where they were."""
    momentum: float = 0.0
    """SGD momentum in [0, 1) (``optimizer=sgd`` only)."""
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"
    """``bf16``/``fp16``: autocast forwards on float32 master weights (LoRA: a half-precision
    frozen base); ``no``: float32 throughout."""
    gradient_checkpointing: bool = False
    dropout: bool = True
    """Keep the model's dropout while training. The trainers that compare the policy with a
    reference or with the log-probs it sampled with (preference, PPO, ArCHer's actor) default to
    false, as TRL does: those log-probs are taken without dropout, so a policy trained with it
    would not match them even at step 0 (a DPO loss other than log 2 before any update)."""
    save_every: int = 0
    """Optimizer steps between checkpoints; 0 = only at the end."""
    keep_checkpoints: int = 2
    log_every: int = 1
    eval_every: int = 0
    lora: LoraSettings | None = None

    #: ``max_length``, ``row_tokens`` and ``history`` are the text trainers' (SFT, preference, PPO)
    value_ranges = {**dict.fromkeys(("lr", "epochs", "weight_decay", "max_grad_norm", "max_steps", "save_every",
                                     "eval_every", "history"), Range(0)),
                    **dict.fromkeys(("batch_size", "grad_accum", "log_every", "keep_checkpoints", "max_length",
                                     "row_tokens"), Range(1)),
                    "warmup_ratio": Range(0, 1), "momentum": Range(0, 1, hi_open=True)}

    def check_budget(self, prefix: str = "") -> None:
        """One line where nothing would be trained: ``epochs=0`` with ``max_steps=0`` (called before
        the data and the model load; ``prefix`` names the section, ``sft.`` in a pipeline)."""
        if self.max_steps <= 0 and self.epochs <= 0:
            raise TurnRLError(f"{prefix}epochs={self.epochs:g} and {prefix}max_steps=0: nothing would be trained; "
                              f"set {prefix}epochs > 0 or {prefix}max_steps > 0")

    @field_validator("mixed_precision", mode="before")
    @classmethod
    def _yaml_no(cls, v: Any) -> Any:
        return "no" if v is False else v  # YAML reads a bare ``no`` (``mixed_precision=no``) as false

    @field_validator("adam_betas")
    @classmethod
    def _betas_in_unit_interval(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in v):
            raise ValueError("each beta must be in [0, 1)")  # the error adds what was given
        return v

    @field_validator("momentum")
    @classmethod
    def _momentum_needs_sgd(cls, v: float, info: ValidationInfo) -> float:
        if v and info.data.get("optimizer") != "sgd":
            raise ValueError("is an SGD setting: set optimizer=sgd too")
        return v

    @field_validator("optimizer")
    @classmethod
    def _sgd_has_no_betas(cls, v: str, info: ValidationInfo) -> str:
        # (a nested section is filled with every default, so a default adam_betas cannot tell "not set")
        betas = info.data.get("adam_betas")
        if v == "sgd" and betas is not None and tuple(betas) != cls.model_fields["adam_betas"].default:
            raise ValueError(f"SGD ignores adam_betas={list(betas)}, an AdamW setting: leave it out (SGD's is "
                             "momentum)")
        return v


class Objective(Protocol):
    """What an algorithm plugs into :class:`Trainer`."""

    def units(self, examples: Sequence[Any]) -> float:
        """Normaliser of these examples (e.g. their number of action tokens, or of pairs)."""
        ...

    def __call__(self, model: Any, examples: Sequence[Any]) -> tuple[torch.Tensor, dict[str, float]]:
        """Return (loss summed over the units of ``examples``, metric sums over them).

        ``model`` is wherever the trainer placed it (a GPU when there is one, under
        autocast with mixed precision): build input tensors on its device."""
        ...


@dataclass
class TrainResult:
    """What :meth:`Trainer.train` returns."""

    steps: int
    final_loss: float
    out_dir: Path
    model_dir: Path
    history: list[dict[str, Any]] = field(default_factory=list)
    adapter_dir: Path | None = None


# --------------------------------------------------------------------------- helpers


def set_seed(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file, fsync, ``os.replace``): a reader
    sees the old file or the whole new one, never a half-written one. A symlink's target is
    written, and a device or FIFO (``/dev/stdout``) straight, not replaced (:func:`~turnrl.data.io.output_target`)."""
    from turnrl.data.io import output_target

    path, special = output_target(path)
    if special:
        with open(path, "w") as f:
            f.write(text)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (:func:`atomic_write_text`)."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def list_checkpoints(out_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run (``step-N`` holding ``trainer_state.json``), oldest first."""
    root = Path(out_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = []
    for d in root.iterdir():
        m = _CKPT_RE.match(d.name)
        if m and d.is_dir() and (d / TRAINER_STATE).is_file():
            found.append((int(m.group(1)), d))
    return [d for _, d in sorted(found)]


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run, or ``None``."""
    ckpts = list_checkpoints(out_dir)
    return ckpts[-1] if ckpts else None


#: float attributes in which transformers' attention modules keep their dropout rate
_DROPOUT_RATES = ("attention_dropout", "attn_dropout", "dropout")


def dropout_modules(model: Any) -> list[str]:
    """Names of the modules that drop activations in training mode: ``nn.Dropout`` with p > 0,
    and attention modules whose dropout rate is a float attribute > 0 (``attention_dropout``)."""
    out = []
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Dropout):
            if m.p > 0:
                out.append(name)
        elif any(isinstance(getattr(m, a, None), float) and getattr(m, a) > 0 for a in _DROPOUT_RATES):
            out.append(name)
    return out


def _tied_embedding(model: Any) -> torch.nn.Parameter | None:
    """The weight a model's input embeddings and LM head share (``tie_word_embeddings``), else None."""
    get_in, get_out = getattr(model, "get_input_embeddings", None), getattr(model, "get_output_embeddings", None)
    if get_in is None or get_out is None:
        return None
    try:
        inp, out = get_in(), get_out()
    except NotImplementedError:  # transformers' default where it cannot find them (remote-code models)
        return None
    weight = getattr(inp, "weight", None)
    return weight if weight is not None and getattr(out, "weight", None) is weight else None


def _adapted_with(model: Any, weight: torch.nn.Parameter) -> list[str]:
    """Modules of a peft ``model`` that LoRA adapts (or trains a copy of) whose base weight is ``weight``.

    Merging such an adapter writes into a tensor that another module shares, so the merged model
    would change both modules where training changed one."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils import ModulesToSaveWrapper

    names = []
    for name, m in model.named_modules():
        if isinstance(m, BaseTunerLayer):
            base = m.get_base_layer()
        elif isinstance(m, ModulesToSaveWrapper):
            base = m.original_module
        else:
            continue
        if getattr(base, "weight", None) is weight:
            names.append(name.removeprefix("base_model.model."))
    return names


def has_dropout(model: Any, cfg: TrainConfig) -> bool:
    """Whether training ``model`` with ``cfg`` drops anything out: its own modules, or LoRA's."""
    return bool(dropout_modules(model)) or (cfg.lora is not None and cfg.lora.dropout > 0)


def disable_dropout(model: Any) -> None:
    """Set every dropout rate of ``model``'s modules to 0 (see :func:`dropout_modules`); the saved
    config keeps its rates, so a model saved after training drops out as before when trained again."""
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
            continue
        for a in _DROPOUT_RATES:
            if isinstance(getattr(m, a, None), float):
                setattr(m, a, 0.0)


def config_hash(
    cfg: TrainConfig, run_config: dict[str, Any] | None = None, extra: dict[str, Any] | None = None,
    *, exempt: frozenset[str] = frozenset(),
) -> str:
    """Hash of what determines a run's result: the train config (minus save/log cadence and
    ``exempt``: settings that cannot change this run), the caller's run config (model, data,
    algorithm settings) and ``extra`` facts."""
    blob = json.dumps(_hashed(cfg, run_config, extra, exempt), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _hashed(cfg: TrainConfig, run_config: dict[str, Any] | None, extra: dict[str, Any] | None,
            exempt: frozenset[str]) -> dict[str, Any]:
    train = {k: v for k, v in cfg.model_dump(mode="json").items() if k not in _HASH_EXEMPT | exempt}
    return {"train": train, "run": run_config or {}, **(extra or {})}


def config_facts(
    cfg: TrainConfig, run_config: dict[str, Any] | None = None, extra: dict[str, Any] | None = None,
    *, exempt: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """What :func:`config_hash` hashes, as JSON: a checkpoint keeps it, so that a resume with other
    settings can be told which ones (:func:`config_changes`)."""
    return dict(json.loads(json.dumps(_hashed(cfg, run_config, extra, exempt), default=str)))


def flat_settings(tree: dict[str, Any], prefix: str = "", *, whole: Sequence[str] = ()) -> dict[str, Any]:
    """``{"train": {"lr": 1e-5}}`` -> ``{"train.lr": 1e-5}``; lists, empty dicts and the sections named in
    ``whole`` stay whole."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value and key not in whole:
            flat.update(flat_settings(value, f"{prefix}{key}.", whole=whole))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def config_changes(before: Any, now: dict[str, Any]) -> str:
    """The settings that differ between two :func:`config_facts`, as ``" (train.lr: 0.001, now
    0.0005)"``; ``""`` where ``before`` is not known (a checkpoint written before 30 Nov 2026)."""
    if not isinstance(before, dict):
        return ""
    old, new = flat_settings(before), flat_settings(json.loads(json.dumps(now, default=str)))
    diff = [k for k in sorted(old.keys() | new.keys()) if old.get(k, "(unset)") != new.get(k, "(unset)")]
    if not diff:
        return ""
    shown = "; ".join(f"{k}: {json.dumps(old.get(k, '(unset)'))}, now {json.dumps(new.get(k, '(unset)'))}"
                      for k in diff[:3])
    return f" ({shown}{f' and {len(diff) - 3} more' if len(diff) > 3 else ''})"


class _Schedule:
    """LR multiplier: linear warm-up to 1 over ``warmup`` steps, then cosine/linear decay
    towards 0 at ``total`` (or constant). Step ``s`` (0-based) uses ``self(s)``; warm-up
    starts at ``1/(warmup+1)``, not 0, so no step is wasted."""

    def __init__(self, kind: str, warmup: int, total: int):
        self.kind, self.warmup, self.total = kind, warmup, total

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / (self.warmup + 1)
        if self.kind == "constant":
            return 1.0
        progress = (step - self.warmup) / max(1, self.total - self.warmup)
        progress = min(max(progress, 0.0), 1.0)
        if self.kind == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))


def _make_accelerator(mixed_precision: str) -> Accelerator:
    """An ``Accelerator`` for ``mixed_precision`` (CPU when there is no GPU).

    accelerate keeps one process-wide state; a single process may switch precision between
    runs (the state is reset), a launched multi-process job may not.
    """
    from accelerate.state import AcceleratorState, PartialState

    if AcceleratorState._shared_state:
        current = str(AcceleratorState().mixed_precision)
        if current != mixed_precision:
            if PartialState().num_processes > 1:
                raise TurnRLError(
                    f"train.mixed_precision={mixed_precision} differs from the launcher's ({current}); "
                    "set them to the same value"
                )
            AcceleratorState._reset_state()
    return Accelerator(mixed_precision=mixed_precision, step_scheduler_with_optimizer=False, cpu=_cpu_only_launch())


def _cpu_only_launch() -> bool:
    """True in a multi-process launch (``WORLD_SIZE`` > 1) on a machine without a GPU.

    ``accelerate launch`` starts processes with torchrun (``distributed_type: MULTI_GPU``) or,
    for ``MULTI_CPU``, only through mpirun; under torchrun accelerate picks the gloo CPU
    backend only when told ``cpu=True``, otherwise each process would train alone.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    xpu = getattr(torch, "xpu", None)
    return not torch.cuda.is_available() and not (xpu is not None and xpu.is_available())


def _is_peft(model: Any) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a dependency
        return False
    return isinstance(model, PeftModel)


# --------------------------------------------------------------------------- trainer


class _TiedWeightFilter(logging.Filter):
    """Drops accelerate's ``Removed shared tensor {...} while saving`` when every tensor it names
    is a parameter the model ties to another one (a tied LM head): safetensors stores one copy,
    the model re-ties it on load, and the warning would repeat at every checkpoint. A record
    naming any other tensor passes."""

    def __init__(self, tied: set[str]):
        super().__init__()
        self.tied = tied

    def filter(self, record: logging.LogRecord) -> bool:
        m = re.search(r"Removed shared tensor (\{.*\}) while saving", record.getMessage())
        if m is None:
            return True
        try:
            names = ast.literal_eval(m.group(1))
        except (ValueError, SyntaxError):
            return True
        return not (isinstance(names, set) and names <= self.tied)


def split_modules(state_dict: dict[str, torch.Tensor], names: Sequence[str]
                  ) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """``state_dict`` without the parameters of the modules named ``names`` (a key belongs to
    module ``n`` when one of its dotted parts is ``n``), and those parameters per name, keyed
    relative to the module (``value_head.weight`` -> ``weight``). A name with no parameters
    is left out."""
    kept: dict[str, torch.Tensor] = {}
    apart: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state_dict.items():
        parts = key.split(".")
        name = next((n for n in names if n in parts[:-1]), None)
        if name is None:
            kept[key] = value
        else:
            apart.setdefault(name, {})[".".join(parts[parts.index(name) + 1:])] = value
    return kept, apart


def tied_parameter_names(*models: torch.nn.Module) -> set[str]:
    """Names under which a parameter appears a second time (``lm_head.weight`` of a tied head)."""
    names: set[str] = set()
    for model in models:
        names |= {n for n, _ in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}
    return names


@contextlib.contextmanager
def quiet_tied_weight_warning(*models: torch.nn.Module) -> Any:
    """Silence accelerate's shared-tensor warning for the models' tied parameters while saving."""
    log = logging.getLogger("accelerate.utils.other")
    f = _TiedWeightFilter(tied_parameter_names(*models))
    log.addFilter(f)
    try:
        yield
    finally:
        log.removeFilter(f)


def _zero_stage(acc: Any) -> int | None:
    """DeepSpeed's ZeRO stage under ``acc`` (None without DeepSpeed)."""
    plugin = getattr(getattr(acc, "state", None), "deepspeed_plugin", None)
    stage = getattr(plugin, "zero_stage", None)
    return int(stage) if stage is not None else None


def check_lora_sharding(distributed_type: str, zero_stage: int | None, lora: bool) -> None:
    """Refuse LoRA where the parameters are sharded across processes (FSDP, DeepSpeed ZeRO-3). The
    final save writes the adapter and the merged model from the main process's own copy of the
    parameters, which there holds a shard (or nothing) of each: the files would be broken. Not run on
    GPUs here, so refused rather than left to fail at the end of a run. LoRA's trainable state is
    small: DDP (``ddp.yaml``) or ZeRO-2 fit it."""
    sharded = "FSDP" in distributed_type or ("DEEPSPEED" in distributed_type and zero_stage == 3)
    if lora and sharded:
        what = "FSDP" if "FSDP" in distributed_type else "DeepSpeed ZeRO-3"
        raise TurnRLError(f"lora under {what}: the final save would write the adapter and merged model from sharded "
                          "parameters; launch with configs/accelerate/ddp.yaml or deepspeed_zero2.yaml (LoRA's "
                          "trainable state is small), or train without lora")


class Trainer:
    """Runs ``objective`` over ``dataset`` with exact accumulation, checkpoints and resume.

    The model is wrapped with LoRA when ``cfg.lora`` is set, then model, optimizer (AdamW on
    trainable parameters) and scheduler go through ``accelerator.prepare``. After
    :meth:`train`, :attr:`unwrapped_model` is the trained model and ``out_dir/model`` holds
    it in ``save_pretrained`` format (merged under LoRA; the adapter is in ``out_dir/adapter``).
    The parameters of each module named in ``save_apart`` (e.g. PPO's ``value_head``, which no
    ``from_pretrained`` class knows) go in a folder of their own, ``out_dir/model/parts/<name>.safetensors``,
    so that the model folder loads without unexpected keys, in transformers and in vLLM alike.

    ``run_config`` is everything besides ``cfg`` that determines the result (model path,
    data files, algorithm settings); it is hashed so that a resume with a different config
    is refused, and written to ``summary.json``. ``legacy_run_configs`` are the same run's
    config as earlier turnrl versions hashed it: their checkpoints resume too. ``hash_exempt``
    names settings of ``cfg`` left out of the hash (settings added later, at the value that
    behaves as before they existed).
    """

    def __init__(
        self,
        model: Any,
        cfg: TrainConfig,
        out_dir: str | Path,
        dataset: Sequence[Any],
        objective: Objective,
        *,
        tokenizer: Any = None,
        eval_fn: Callable[[Any, int], dict[str, float]] | None = None,
        accelerator: Accelerator | None = None,
        run_config: dict[str, Any] | None = None,
        before_step: Callable[[int], dict[str, float] | None] | None = None,
        save_apart: Sequence[str] = (),
        legacy_run_configs: Sequence[dict[str, Any]] = (),
        hash_exempt: Sequence[str] = (),
    ):
        if len(dataset) == 0:
            raise TurnRLError("training data is empty: nothing to train on")
        cfg.check_budget()
        self.cfg = cfg
        self.out_dir = Path(out_dir)
        self.dataset = dataset
        self.objective = objective
        self.tokenizer = tokenizer
        self.eval_fn = eval_fn
        self.run_config = run_config
        #: called with the 0-based step before each optimizer step (online algorithms collect
        #: new data into ``dataset`` there, e.g. PPO's rollouts); returned numbers are logged
        #: in that step's record. It must be deterministic given the model and the RNG state.
        self.before_step = before_step
        self.save_apart = tuple(save_apart)
        self._use_cache: bool | None = None  # the model config's use_cache, where training turns it off
        # hashed only where it changes what trains: dropout turned off in a model that has some. Kept on
        # (every run before the setting existed) or on a model without dropout, runs resume as before
        drops = has_dropout(model, cfg)
        exempt = frozenset(hash_exempt) | (frozenset() if drops and not cfg.dropout else frozenset({"dropout"}))
        self.config_hash = config_hash(cfg, run_config, {"examples": len(dataset)}, exempt=exempt)
        self.config_facts = config_facts(cfg, run_config, {"examples": len(dataset)}, exempt=exempt)
        self.legacy_hashes = {config_hash(cfg, rc, {"examples": len(dataset)}, exempt=exempt)
                              for rc in legacy_run_configs}
        self.accelerator = accelerator or _make_accelerator(cfg.mixed_precision)
        acc = self.accelerator
        if str(acc.distributed_type).endswith("DEEPSPEED") and cfg.grad_accum != 1:
            raise TurnRLError(
                f"grad_accum={cfg.grad_accum} under DeepSpeed: its engine steps after every backward; "
                "set grad_accum=1 and raise batch_size (or the number of processes) instead"
            )
        check_lora_sharding(str(acc.distributed_type), _zero_stage(acc), cfg.lora is not None or _is_peft(model))
        if cfg.mixed_precision == "fp16" and acc.device.type == "cpu":
            raise TurnRLError("mixed_precision=fp16 needs a GPU: on the CPU accelerate does no fp16 autocast "
                              "and would train in float32; use bf16 or no")
        if cfg.eval_every and eval_fn is None:
            nothing = (f"eval_every={cfg.eval_every}: this run has nothing to evaluate on (SFT has no evaluation; "
                       "preference training evaluates on --eval-pairs, the preference model on --eval-data or "
                       "eval_fraction)")
            if latest_checkpoint(self.out_dir) is None:
                raise TurnRLError(f"{nothing}; set it to 0")
            # eval_every is in the run's hash: a run checkpointed before this check resumes with it
            logging.getLogger(__name__).warning("%s; it evaluates nothing", nothing)
        self.num_processes = acc.num_processes
        self.global_batch = cfg.batch_size * cfg.grad_accum * self.num_processes
        self.batches_per_epoch = math.ceil(len(dataset) / self.global_batch)
        if cfg.max_steps > 0:
            self.total_steps = cfg.max_steps
        else:
            self.total_steps = max(1, math.ceil(round(cfg.epochs * self.batches_per_epoch, 9)))

        set_seed(cfg.seed)  # LoRA init is seeded
        if cfg.lora is not None and not _is_peft(model):
            from peft import LoraConfig, get_peft_model

            names = [n for n, _ in model.named_modules()]
            for want in cfg.lora.modules_to_save or []:  # peft matches a name as the end of a module's
                if not any(n.endswith(want) for n in names):
                    raise TurnRLError(f"lora.modules_to_save: no module of the model is named {want!r}")
            if isinstance(cfg.lora.target_modules, list):  # peft fails only when no name matches at all
                for want in cfg.lora.target_modules:
                    if not any(n == want or n.endswith("." + want) for n in names):
                        raise TurnRLError(f"lora.target_modules: no module of the model is named {want!r}")
            tied = _tied_embedding(model)
            try:
                model = get_peft_model(
                    model,
                    LoraConfig(
                        task_type="CAUSAL_LM",
                        r=cfg.lora.r,
                        lora_alpha=cfg.lora.alpha,
                        lora_dropout=cfg.lora.dropout,
                        target_modules=cfg.lora.target_modules,
                        modules_to_save=cfg.lora.modules_to_save,
                    ),
                )
            except ValueError as e:  # peft's: e.g. no module named by lora.target_modules
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise TurnRLError(f"lora.target_modules={cfg.lora.target_modules!r}: {first}") from None
            if tied is not None and (bad := _adapted_with(model, tied)):
                raise TurnRLError(
                    f"lora: {', '.join(bad)}: this model's input embeddings and LM head share one weight "
                    "(tie_word_embeddings), so a merged model could not hold what LoRA trains there; leave "
                    "them out of lora.target_modules and lora.modules_to_save, or train without LoRA"
                )
        if not cfg.dropout:
            disable_dropout(model)
        if cfg.mixed_precision != "no":  # what trains keeps float32 master weights (a half-precision
            for p in model.parameters():  # base's modules_to_save copies stay half otherwise)
                if p.requires_grad and p.dtype != torch.float32:
                    p.data = p.data.float()
        if cfg.gradient_checkpointing:
            # transformers >= 5.24 names it activation checkpointing (the old name warns, and goes in 6)
            enable = getattr(model, "activation_checkpointing_enable", None)
            if enable is not None:
                enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if getattr(model, "config", None) is not None and hasattr(model.config, "use_cache"):
                self._use_cache = model.config.use_cache  # what the saved model's config keeps
                model.config.use_cache = False
            if _is_peft(model):
                model.enable_input_require_grads()
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise TurnRLError("the model has no trainable parameters")
        optimizer: torch.optim.Optimizer
        if cfg.optimizer == "sgd":
            optimizer = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
        else:
            optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.adam_betas, weight_decay=cfg.weight_decay)
        warmup = math.ceil(cfg.warmup_ratio * self.total_steps)
        scheduler = LambdaLR(optimizer, _Schedule(cfg.lr_schedule, warmup, self.total_steps))
        self.model, self.optimizer, self.scheduler = acc.prepare(model, optimizer, scheduler)
        # Step the raw scheduler: accelerate's wrapper steps it num_processes times a call.
        self._raw_scheduler: Any = getattr(self.scheduler, "scheduler", self.scheduler)
        self._params = [p for p in self.model.parameters() if p.requires_grad]
        self.history: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ properties

    @property
    def unwrapped_model(self) -> Any:
        """The trained model without accelerate's wrappers (a ``PeftModel`` under LoRA)."""
        return self.accelerator.unwrap_model(self.model)

    @property
    def is_main(self) -> bool:
        return bool(self.accelerator.is_main_process)

    # ------------------------------------------------------------------ data order

    def global_batch_indices(self, step: int) -> list[int]:
        """Dataset indices of the global batch of optimizer step ``step`` (0-based)."""
        epoch, pos = divmod(step, self.batches_per_epoch)
        order = np.random.default_rng([self.cfg.seed, epoch]).permutation(len(self.dataset))
        return [int(i) for i in order[pos * self.global_batch : (pos + 1) * self.global_batch]]

    def micro_batches(self, indices: Sequence[int]) -> list[list[int]]:
        """This process's micro-batches of a global batch; every process gets the same
        number of them (an empty one is possible only in the last, partial batch)."""
        chunk = self.cfg.batch_size * self.num_processes
        rank, world = self.accelerator.process_index, self.num_processes
        n_micro = max(1, math.ceil(len(indices) / chunk))
        return [list(indices[j * chunk : (j + 1) * chunk][rank::world]) for j in range(n_micro)]

    # ------------------------------------------------------------------ train

    def check_out(self, resume: bool) -> None:
        """Called by :meth:`train`, and by a trainer before it writes files of its own there. Without
        ``resume``, refuse an ``out_dir`` that holds a run (a checkpoint or a summary), or a ``model/``
        or ``adapter/`` of no run (the final save replaces them: they may be the user's, even the input
        model; with ``resume`` too, where no checkpoint, summary or metrics file shows a run). With
        ``resume``, refuse a newest checkpoint of another config or process count."""
        ckpt = check_out_dir(self.out_dir, resume)
        if not resume or ckpt is None:
            return
        state = json.loads((ckpt / TRAINER_STATE).read_text())
        if state.get("config_hash") != self.config_hash and state.get("config_hash") not in self.legacy_hashes:
            changed = config_changes(state.get("config"), self.config_facts) or \
                f" (hash {state.get('config_hash')} != {self.config_hash})"
            raise TurnRLError(f"{ckpt}: the config changed since this checkpoint was written{changed}; "
                              "resume with the same config or choose another --out")
        if int(state.get("num_processes", self.num_processes)) != self.num_processes:
            raise TurnRLError(
                f"{ckpt}: written by {state['num_processes']} processes, this run has "
                f"{self.num_processes}; resume with the same number of processes"
            )

    def train(self, resume: bool = False) -> TrainResult:
        """Train to ``total_steps``; with ``resume``, continue from the newest checkpoint."""
        acc = self.accelerator
        ckpt_root = self.out_dir / CHECKPOINTS
        summary_path = self.out_dir / SUMMARY
        self.check_out(resume)  # a checkpoint of another config or process count is refused there
        ckpt = latest_checkpoint(self.out_dir)
        start_step, elapsed0 = 0, 0.0
        state: dict[str, Any] = {}
        if ckpt is not None:
            state = json.loads((ckpt / TRAINER_STATE).read_text())
        acc.wait_for_everyone()
        if self.is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            if ckpt_root.is_dir():
                for d in ckpt_root.iterdir():
                    if ".tmp" in d.name:
                        shutil.rmtree(d, ignore_errors=True)
            self._truncate_metrics(int(state.get("global_step", 0)))
            if int(state.get("global_step", 0)) < self.total_steps:  # this run is not finished: a
                summary_path.unlink(missing_ok=True)  # stale summary would mark it so while it trains
        acc.wait_for_everyone()
        if ckpt is not None:
            acc.load_state(str(ckpt))
            start_step = int(state["global_step"])
            elapsed0 = float(state.get("elapsed", 0.0))
        else:
            set_seed(self.cfg.seed)
        self.history = self._read_metrics()
        if ckpt is not None and start_step >= self.total_steps and summary_path.exists():
            summary = json.loads(summary_path.read_text())  # finished run: nothing to do
            return self._result(summary.get("final_loss", math.nan))

        self.model.train()
        t0 = time.time() - elapsed0
        last_loss = math.nan
        last_ckpt_step = start_step if ckpt is not None else -1
        writer = self._tensorboard()
        metrics_file = open(self.out_dir / METRICS, "a") if self.is_main else None
        try:
            with self._progress() as progress:
                task = progress.add_task("train", total=self.total_steps, completed=start_step, loss="-")
                for step in range(start_step, self.total_steps):
                    pre = self.before_step(step) if self.before_step is not None else None
                    record = self._optimizer_step(step)
                    record.update(pre or {})
                    last_loss = record["loss"]
                    done = step + 1
                    record["time"] = round(time.time() - t0, 3)
                    # every eval_every steps, and at the last step whenever there is something to evaluate
                    # on (held-out pairs given without eval_every were otherwise never read)
                    evaluated = self.eval_fn is not None and (
                        done == self.total_steps or bool(self.cfg.eval_every) and done % self.cfg.eval_every == 0
                    )
                    if evaluated:
                        record.update(self._evaluate(done))
                    if evaluated or done % max(1, self.cfg.log_every) == 0 or done == self.total_steps:
                        self._log(record, metrics_file, writer)
                    progress.update(task, completed=done, loss=f"{last_loss:.4f}")
                    if self.cfg.save_every and done % self.cfg.save_every == 0 and done < self.total_steps:
                        self._save_checkpoint(done, time.time() - t0)
                        last_ckpt_step = done
            if last_ckpt_step != self.total_steps:
                self._save_checkpoint(self.total_steps, time.time() - t0)
        finally:
            if metrics_file is not None:
                metrics_file.close()
            if writer is not None:
                writer.close()
        if math.isnan(last_loss):
            last_loss = next((h["loss"] for h in reversed(self.history) if "loss" in h), math.nan)
        self._save_final(last_loss, time.time() - t0)
        return self._result(last_loss)

    # ------------------------------------------------------------------ one step

    def _optimizer_step(self, step: int) -> dict[str, Any]:
        """Forward/backward over one global batch, then clip and step. Returns the record."""
        acc = self.accelerator
        indices = self.global_batch_indices(step)
        micros = self.micro_batches(indices)
        mine = [self.dataset[i] for m in micros for i in m]
        local_units = float(self.objective.units(mine)) if mine else 0.0
        units = float(
            acc.reduce(torch.tensor([local_units], dtype=torch.float64, device=acc.device), "sum").item()
        )
        scale = self.num_processes / units if units > 0 else 0.0

        loss_sum = torch.zeros((), dtype=torch.float64, device=acc.device)
        metric_sums: dict[str, float] = {}
        # metrics the objective reports as maxima (``max_metrics``) are reduced by max, not summed
        max_keys = frozenset(getattr(self.objective, "max_metrics", ()))
        metric_max: dict[str, float] = {}
        for j, micro in enumerate(micros):
            weight = 1.0
            if not micro:  # keep DDP's collective calls aligned: a zero-weight dummy
                micro, weight = [indices[0]], 0.0
            examples = [self.dataset[i] for i in micro]
            sync = j == len(micros) - 1
            with contextlib.nullcontext() if sync else acc.no_sync(self.model):
                with acc.autocast():  # also covers an objective's frozen reference model
                    loss, metrics = self.objective(self.model, examples)
                loss = loss * weight
                acc.backward(loss * scale)
            loss_sum += loss.detach().to(torch.float64)
            for k, v in metrics.items():
                if k in max_keys:
                    metric_max[k] = max(metric_max.get(k, -math.inf), float(v) if weight else -math.inf)
                else:
                    metric_sums[k] = metric_sums.get(k, 0.0) + float(v) * weight

        keys = sorted(metric_sums)
        packed = torch.tensor(
            [loss_sum.item()] + [metric_sums[k] for k in keys], dtype=torch.float64, device=acc.device
        )
        packed = acc.reduce(packed, "sum")
        denom = units if units > 0 else 1.0
        loss_value = float(packed[0].item()) / denom
        norm = acc.clip_grad_norm_(self._params, self.cfg.max_grad_norm if self.cfg.max_grad_norm > 0 else math.inf)
        grad_norm = float(norm) if norm is not None else math.nan  # DeepSpeed may not report it
        bad_norm = norm is not None and not math.isfinite(grad_norm) and self.cfg.mixed_precision != "fp16"
        if not math.isfinite(loss_value) or bad_norm:
            self.optimizer.zero_grad(set_to_none=True)
            raise self._non_finite("loss" if not math.isfinite(loss_value) else "gradient norm", step)
        lr = float(self.optimizer.param_groups[0]["lr"])
        self.optimizer.step()
        if not acc.optimizer_step_was_skipped:
            self._raw_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

        record: dict[str, Any] = {
            "step": step + 1,
            "epoch": round((step + 1) / self.batches_per_epoch, 6),
            "loss": loss_value,
            "lr": lr,
            "grad_norm": grad_norm,
            "units": units,
        }
        for k, v in zip(keys, packed[1:].tolist(), strict=True):
            record[k] = v / denom
        if max_keys:  # every process gathers every declared key (-inf where it has none), or they would hang
            max_names = sorted(max_keys)
            local = torch.tensor([metric_max.get(k, -math.inf) for k in max_names], dtype=torch.float64,
                                 device=acc.device)
            for k, v in zip(max_names, acc.gather(local[None]).amax(dim=0).tolist(), strict=True):
                if math.isfinite(v):
                    record[k] = v
        return record

    # ------------------------------------------------------------------ eval / logging

    def _evaluate(self, step: int) -> dict[str, float]:
        """Run ``eval_fn`` on the unwrapped model in eval mode, with forked RNG state so that
        evaluation never changes the training randomness (and resume stays exact)."""
        if self.eval_fn is None:
            return {}
        model = self.unwrapped_model
        py_state, np_state = random.getstate(), np.random.get_state()
        was_training = model.training
        try:
            with forked_rng(), self.accelerator.autocast():  # the precision training's forwards run in
                model.eval()
                out = self.eval_fn(model, step) or {}
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)
            model.train(was_training)
        return {f"eval/{k}": float(v) for k, v in out.items()}

    def _log(self, record: dict[str, Any], f: Any, writer: Any) -> None:
        self.history.append(record)
        if f is not None:
            f.write(json.dumps(record) + "\n")
            f.flush()
        if writer is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)):
                    writer.add_scalar(k, v, record["step"])

    def _read_metrics(self) -> list[dict[str, Any]]:
        path = self.out_dir / METRICS
        rows: list[dict[str, Any]] = []
        if path.is_file():
            for line in path.read_text().splitlines():
                with contextlib.suppress(json.JSONDecodeError):
                    row = json.loads(line)
                    if isinstance(row, dict):
                        rows.append(row)
        return rows

    def _truncate_metrics(self, upto: int) -> None:
        """Keep only the metrics lines of steps <= ``upto`` (and drop a torn last line)."""
        path = self.out_dir / METRICS
        if not path.exists():
            return
        kept = [r for r in self._read_metrics() if int(r.get("step", 0)) <= upto]
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))

    def _tensorboard(self) -> Any:
        if not self.is_main or importlib.util.find_spec("tensorboard") is None:
            return None
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(str(self.out_dir / "tensorboard"))

    def _progress(self) -> Any:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        console = Console(stderr=True)
        return Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TimeRemainingColumn(),
            console=console,
            transient=True,
            disable=not (self.is_main and console.is_terminal),
        )

    # ------------------------------------------------------------------ saving

    def _save_checkpoint(self, step: int, elapsed: float) -> None:
        """Write ``checkpoints/step-N`` atomically (tmp dir + rename), keep the newest few."""
        acc = self.accelerator
        root = self.out_dir / CHECKPOINTS
        name = f"step-{step:06d}"
        pid = broadcast_object_list([os.getpid()])[0]  # one tmp dir shared by all processes
        tmp = root / f"{name}.tmp-{pid}"
        if self.is_main:
            root.mkdir(parents=True, exist_ok=True)
        acc.wait_for_everyone()
        with quiet_tied_weight_warning(self.model, acc.unwrap_model(self.model)):
            acc.save_state(str(tmp))
        if self.is_main:
            epoch, position = divmod(step, self.batches_per_epoch)
            atomic_write_json(
                tmp / TRAINER_STATE,
                {
                    "global_step": step,
                    "epoch": epoch,
                    "position": position,
                    "total_steps": self.total_steps,
                    "seed": self.cfg.seed,
                    "config_hash": self.config_hash,
                    "config": self.config_facts,
                    "num_processes": self.num_processes,
                    "elapsed": elapsed,
                },
            )
        acc.wait_for_everyone()
        if self.is_main:
            final = root / name
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            for old in list_checkpoints(self.out_dir)[: -max(1, self.cfg.keep_checkpoints)]:
                shutil.rmtree(old, ignore_errors=True)
        acc.wait_for_everyone()

    def _non_finite(self, what: str, step: int) -> TurnRLError:
        """The error that stops the run on a non-finite ``what`` at optimizer step ``step`` (0-based)."""
        last = latest_checkpoint(self.out_dir)
        return TurnRLError(f"non-finite {what} at step {step + 1}; the last checkpoint "
                           f"({last.name if last else 'none'}) is intact")

    def _save_final(self, final_loss: float, elapsed: float, *, summary: bool = True) -> None:
        """Save the model (merged under LoRA) and tokenizer, then ``summary.json`` last (unless not
        ``summary``: a caller that saves more after the model writes its own summary last)."""
        acc = self.accelerator
        acc.wait_for_everyone()
        model = self.unwrapped_model
        state_dict = acc.get_state_dict(self.model)
        if self.is_main:
            model_dir, adapter_dir = self.out_dir / "model", self.out_dir / "adapter"
            for d in (model_dir, adapter_dir):
                if d.exists():
                    shutil.rmtree(d)
            # gradient checkpointing turned the KV cache off for training; the saved config keeps the model's own
            config = getattr(model, "config", None)
            if self._use_cache is not None and config is not None:
                config.use_cache = self._use_cache
            if _is_peft(model):
                model.save_pretrained(str(adapter_dir))
                merged = copy.deepcopy(model).merge_and_unload()
                kept, apart = split_modules(merged.state_dict(), self.save_apart)
                merged.save_pretrained(str(model_dir), state_dict=kept)
                del merged
            else:
                kept, apart = split_modules(state_dict, self.save_apart)
                model.save_pretrained(str(model_dir), state_dict=kept)
            # in a folder of their own: vLLM reads every *.safetensors of the model's folder as its weights
            for name, tensors in apart.items():
                (model_dir / PARTS).mkdir(exist_ok=True)
                save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()},
                          str(model_dir / PARTS / f"{name}.safetensors"))
            if self._use_cache is not None and config is not None:
                config.use_cache = False  # training may go on (a caller that saves and trains more)
            if self.tokenizer is not None:
                self.tokenizer.save_pretrained(str(model_dir))
                if _is_peft(model):
                    self.tokenizer.save_pretrained(str(adapter_dir))
        if self.is_main and summary:
            atomic_write_json(
                self.out_dir / SUMMARY,
                {
                    "schema": "turnrl.train_summary/v1",
                    "steps": self.total_steps,
                    "final_loss": final_loss,
                    "model_dir": str(model_dir),
                    "adapter_dir": str(adapter_dir) if _is_peft(model) else None,
                    "elapsed_s": round(elapsed, 3),
                    "config_hash": self.config_hash,
                    "train_config": self.cfg.model_dump(mode="json"),
                    "run_config": self.run_config,
                },
            )
        acc.wait_for_everyone()

    def _result(self, final_loss: float) -> TrainResult:
        peft = _is_peft(self.unwrapped_model)
        return TrainResult(
            steps=self.total_steps,
            final_loss=float(final_loss),
            out_dir=self.out_dir,
            model_dir=self.out_dir / "model",
            history=list(self.history),
            adapter_dir=self.out_dir / "adapter" if peft else None,
        )
