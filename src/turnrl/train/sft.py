"""Behaviour cloning (SFT): maximize the likelihood of the agent's turns.

    L = − Σ_{agent tokens} log π(token | prefix) / (number of agent tokens in the global batch)

Only tokens under the action mask (the assistant contents and their end-of-turn marker)
carry loss; observations and template tokens never do. Sequences are packed (no compute on
padding) and the trainer core normalizes by the agent tokens of the whole global batch, so
gradient accumulation is exact.

Data: turnrl trajectories (``turnrl.trajectory/v1`` JSONL) or ETO's
``{"id", "conversations"}`` format, detected by content. ``only_success`` keeps successful
trajectories only (what an expert-data SFT usually wants when the file mixes outcomes).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from turnrl.agent.prompting import agent_view
from turnrl.data.eto import import_eto
from turnrl.data.io import read_trajectories
from turnrl.data.schema import Message, Trajectory
from turnrl.errors import TurnRLError
from turnrl.tokenization import ChatFormat, Encoded
from turnrl.train.core import TrainConfig, Trainer, TrainResult, atomic_write_json
from turnrl.train.forward import pack, token_logps


class SFTConfig(TrainConfig):
    """SFT settings: the trainer core's plus data handling."""

    lr: float = 1e-3
    epochs: float = 3.0
    #: longest sequence in tokens; longer trajectories lose whole trailing turns
    max_length: int = 2048
    #: tokens per packed row
    row_tokens: int = 4096
    #: earlier exchanges in each turn's context (None: the whole trajectory is one sequence)
    history: int | None = None
    only_success: bool = False


def load_trajectories(path: str | Path) -> list[Trajectory]:
    """turnrl JSONL, or ETO's format (a JSON list or JSONL of ``conversations``, or one pretty-printed
    object in a ``.json`` file, as ETO writes an exploration output)."""
    from turnrl.data.eto import first_line_is_json

    p = Path(path)
    if not p.is_file():
        what = ("is a directory, not a trajectory file" if p.is_dir() else
                "not a regular file" if p.exists() else "no such file")
        raise TurnRLError(f"{p}: {what}")
    with p.open(errors="replace") as f:  # a sniff: read_trajectories names a file that is not UTF-8
        head = f.read(4096).lstrip().lstrip("\ufeff")
    if head.startswith("[") or '"conversations"' in head.split("\n", 1)[0]:
        return import_eto(p)
    if (p.suffix.lower() == ".json" and head.startswith("{") and '"conversations"' in head
            and not first_line_is_json(p)):
        return import_eto(p)  # an ETO object over several lines (a cut turnrl line names no conversations)
    return read_trajectories(p)


def encode_trajectories(
    trajs: Sequence[Trajectory], chat: ChatFormat, *, max_length: int, history: int | None = None
) -> tuple[list[Encoded], dict[str, int]]:
    """Tokenize trajectories (one sequence each, or one per turn with a history window)."""
    out: list[Encoded] = []
    stats = {"trajectories": len(trajs), "skipped_too_long": 0, "dropped_turns": 0, "reencoded_turns": 0}
    for t in trajs:
        views: list[tuple[list[Message], list[int] | None, int]]
        if history is None:
            views = [(t.messages, None, 0)]
        else:
            views = []
            for turn in range(t.num_turns):
                view, local = agent_view(t.messages, turn, history)
                views.append((view, [local], turn - local))
        for messages, trainable, offset in views:
            enc = chat.encode(messages, trainable_turns=trainable, turn_offset=offset, max_length=max_length)
            if enc is None or enc.num_turns == 0:
                stats["skipped_too_long"] += 1
                continue
            stats["dropped_turns"] += enc.dropped_turns
            stats["reencoded_turns"] += enc.reencoded_turns
            out.append(enc)
    return out, stats


class SFTObjective:
    """Token-level NLL on agent tokens; units = agent tokens."""

    def __init__(self, row_tokens: int = 4096, pad_id: int = 0):
        self.row_tokens = row_tokens
        self.pad_id = pad_id

    def units(self, examples: Sequence[Encoded]) -> float:
        return float(sum(sum(e.action_mask[1:]) for e in examples))

    def __call__(self, model: Any, examples: Sequence[Encoded]) -> tuple[torch.Tensor, dict[str, float]]:
        batch = pack(examples, row_tokens=self.row_tokens, pad_id=self.pad_id)
        logps = token_logps(model, batch)
        return -logps.sum(), {}


def file_hash(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def train_sft(model_name: str, data: str | Path, out: str | Path, cfg: SFTConfig, *, resume: bool = False,
              eval_fn: Any = None) -> TrainResult:
    """Load the model and data, tokenize, and run the trainer core."""
    from turnrl.models.loading import load_model, load_tokenizer, training_dtype
    from turnrl.rollout.policies import training_chat

    trajs = load_trajectories(data)
    if not trajs:
        raise TurnRLError(f"{data}: no trajectories to train on")
    if cfg.only_success and not any(t.success for t in trajs):
        raise TurnRLError(f"{data}: none of its {len(trajs)} trajectories succeeded, and only_success=true trains "
                          "on successful ones only")
    if cfg.only_success:
        trajs = [t for t in trajs if t.success]
    tok = load_tokenizer(model_name)
    chat = training_chat(model_name, tok)  # the sampler's stop ids
    examples, stats = encode_trajectories(trajs, chat, max_length=cfg.max_length, history=cfg.history)
    if not examples:
        if not any(m.role == "assistant" for t in trajs for m in t.messages):
            raise TurnRLError(f"{data}: no trajectory has an agent (assistant) turn to train on")
        raise TurnRLError(f"{data}: every trajectory is longer than max_length={cfg.max_length} at its first turn")
    model = load_model(model_name, dtype=training_dtype(cfg.mixed_precision, cfg.lora is not None))
    run_config = {"algo": "sft", "model": str(model_name), "data": file_hash(data)}  # cfg itself is hashed too
    out = Path(out)
    trainer = Trainer(
        model, cfg, out, examples, SFTObjective(cfg.row_tokens, tok.pad_token_id or 0),
        tokenizer=tok, eval_fn=eval_fn, run_config=run_config,
    )
    trainer.check_out(resume)  # before anything is written there
    if trainer.is_main:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / "data_stats.json", stats)
    return trainer.train(resume=resume)
