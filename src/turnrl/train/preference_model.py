"""Train the pairwise preference model (:mod:`turnrl.oracles.pairwise`) on labelled comparisons.

``turnrl train preference-model --data COMPARISONS.jsonl --out DIR`` runs the trainer core
(checkpoints, resume, ``metrics.jsonl``, exact accumulation) with this objective:

.. math::  d = f(a, b) - f(b, a), \\qquad
           L = -[\\,y \\log\\sigma(d) + (1 - y)\\log\\sigma(-d)\\,]

(binary cross-entropy of :math:`P(a \\succ b) = \\sigma(d)` against the label ``y``, which may
be soft; ties are ``y = 1/2``), summed over comparisons and divided by the number of
comparisons in the global batch. Metric: ``accuracy`` on comparisons whose label is not a tie.

Comparisons come from :func:`turnrl.oracles.comparisons_from_trajectories` (``turnrl
comparisons``): pairs of trajectories of the same task labelled by the env-reward oracle.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from turnrl.config import Range
from turnrl.errors import TurnRLError
from turnrl.oracles import Comparison, read_comparisons
from turnrl.oracles.pairwise import (
    PairEncoder,
    PairwiseModel,
    PairwiseSettings,
    build_pairwise_model,
    pair_margins,
)
from turnrl.train.core import TrainConfig, Trainer, TrainResult, atomic_write_json
from turnrl.train.sft import file_hash


class PreferenceModelConfig(TrainConfig):
    """Settings of ``turnrl train preference-model``: the trainer core's plus the model's."""

    lr: float = 5e-4
    epochs: float = 4.0
    batch_size: int = 16
    model: PairwiseSettings = PairwiseSettings()
    eval_fraction: float = 0.0
    """Share of the data's tasks held out for ``eval_accuracy`` when no ``--eval-data`` is given."""

    value_ranges = {**TrainConfig.value_ranges, "eval_fraction": Range(0, 1, hi_open=True)}


@dataclass
class EncodedComparison:
    ab: list[int]
    ba: list[int]
    label: float


def encode_comparisons(comps: Sequence[Comparison], encoder: PairEncoder) -> list[EncodedComparison]:
    out = []
    for c in comps:
        ab, ba = encoder.encode(c.a, c.b)
        out.append(EncodedComparison(ab, ba, c.label))
    return out


def comparison_loss(margins: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    r"""Per-comparison BCE of :math:`\sigma(d)` against soft labels, and detached metrics.

    .. math::  L = y\,\mathrm{softplus}(-d) + (1-y)\,\mathrm{softplus}(d)

    Example: :math:`d = 0` gives :math:`L = \log 2` whatever the label; :math:`d = 2, y = 1`
    gives :math:`\log(1 + e^{-2}) \approx 0.1269`.

    Returns ``(losses [B], {"correct": [B], "decided": [B]})``; ``correct`` is 1 where the sign of
    ``d`` agrees with a non-tie label, ``decided`` is 1 on non-tie labels.
    """
    y = labels.to(margins.dtype)
    losses = y * F.softplus(-margins) + (1 - y) * F.softplus(margins)
    decided = (y != 0.5).to(margins.dtype)
    correct = (((margins > 0) & (y > 0.5)) | ((margins < 0) & (y < 0.5))).to(margins.dtype) * decided
    return losses, {"correct": correct.detach(), "decided": decided.detach()}


class PreferenceModelObjective:
    """Trainer-core objective: BCE summed over comparisons; units = comparisons."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def units(self, examples: Sequence[EncodedComparison]) -> float:
        return float(len(examples))

    def __call__(self, model: Any, examples: Sequence[EncodedComparison]) -> tuple[torch.Tensor, dict[str, float]]:
        d = pair_margins(model, [e.ab for e in examples], [e.ba for e in examples], self.pad_id)
        labels = torch.tensor([e.label for e in examples], device=d.device)
        losses, m = comparison_loss(d, labels)
        return losses.sum(), {"correct": float(m["correct"].sum()), "decided": float(m["decided"].sum())}


def _unwrap(model: Any) -> Any:
    return getattr(model, "module", model)


@torch.no_grad()
def agreement(model: PairwiseModel, data: Sequence[EncodedComparison], pad_id: int,
              batch: int = 32) -> dict[str, float]:
    """Mean loss and accuracy (agreement with the labels on non-tie comparisons)."""
    was = model.training
    model.eval()
    loss = correct = decided = 0.0
    try:
        for i in range(0, len(data), batch):
            chunk = data[i : i + batch]
            d = model.margins([e.ab for e in chunk], [e.ba for e in chunk], pad_id)
            losses, m = comparison_loss(d, torch.tensor([e.label for e in chunk], device=d.device))
            loss += float(losses.sum())
            correct += float(m["correct"].sum())
            decided += float(m["decided"].sum())
    finally:
        model.train(was)
    return {"loss": loss / max(1, len(data)), "accuracy": correct / decided if decided else math.nan,
            "decided": decided}


def _split_by_task(comps: list[Comparison], fraction: float) -> tuple[list[Comparison], list[Comparison]]:
    """Hold out the last ``round(len(tasks) * fraction)`` tasks (sorted), at least one and at most
    all but one when ``fraction > 0``; fewer than two tasks cannot be split."""
    tasks = sorted({c.task_id for c in comps})
    if fraction <= 0:
        return list(comps), []
    if len(tasks) < 2:
        raise TurnRLError(f"eval_fraction={fraction} holds out whole tasks, but the data has {len(tasks)} task(s); "
                          f"give --eval-data or set eval_fraction=0")
    n_eval = min(max(int(round(len(tasks) * fraction)), 1), len(tasks) - 1)
    held = set(tasks[len(tasks) - n_eval:])
    return [c for c in comps if c.task_id not in held], [c for c in comps if c.task_id in held]


def train_preference_model(data: str | Path, out: str | Path, cfg: PreferenceModelConfig, *,
                           resume: bool = False, eval_data: str | Path | None = None) -> TrainResult:
    """Build (or load) the pairwise model, encode the comparisons and run the trainer core.
    Writes ``OUT/eval.json`` (held-out agreement before and after) when there is held-out data."""
    if cfg.lora is not None:
        raise TurnRLError("train preference-model does not support lora; train the small model fully")
    if eval_data is not None and cfg.eval_fraction > 0:  # one held-out set or the other: the fraction went unread
        raise TurnRLError(f"eval_fraction={cfg.eval_fraction} holds out tasks of --data, and --eval-data gives the "
                          "held-out comparisons: use one of them")
    comps = read_comparisons(data)
    held: list[Comparison] = []
    if eval_data is not None:
        held = read_comparisons(eval_data)
    elif cfg.eval_fraction > 0:
        comps, held = _split_by_task(comps, cfg.eval_fraction)
    model, tok = build_pairwise_model(cfg.model, seed=cfg.seed)
    encoder = PairEncoder(tok, cfg.model)
    train_set = encode_comparisons(comps, encoder)
    held_set = encode_comparisons(held, encoder)
    pad_id = tok.pad_token_id or 0

    eval_fn = None
    if held_set:
        def eval_fn(m: Any, step: int) -> dict[str, float]:
            r = agreement(_unwrap(m), held_set, pad_id)
            return {"loss": r["loss"], "accuracy": r["accuracy"]}

    out = Path(out)
    run_config = {"algo": "preference_model", "data": file_hash(data),
                  "eval_data": file_hash(eval_data) if eval_data else None}
    trainer = Trainer(model, cfg, out, train_set, PreferenceModelObjective(pad_id), tokenizer=tok,
                      eval_fn=eval_fn, run_config=run_config)
    start = agreement(_unwrap(trainer.unwrapped_model), held_set, pad_id) if held_set else None
    result = trainer.train(resume=resume)
    if held_set and trainer.is_main:
        final = agreement(_unwrap(trainer.unwrapped_model), held_set, pad_id)
        atomic_write_json(out / "eval.json", {"held_out_comparisons": len(held_set), "start": start,
                                              "final": final, "train_comparisons": len(train_set)})
    if trainer.is_main:
        (out / "data_stats.json").write_text(json.dumps({"train": len(train_set), "held_out": len(held_set)}) + "\n")
    return result
