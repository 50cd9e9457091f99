"""A small PairRM-like pairwise preference model, and the oracle that runs it.

The model reads ``[task] [A: y_i] [B: y_j]`` as one token sequence (a cross-encoder: the two
trajectories attend to each other), pools it to a vector and scores it with a linear head:
``f(i, j)``. The preference is

.. math::  P(y_i \\succ y_j) = \\sigma\\big(f(i, j) - f(j, i)\\big)

so ``P(i, j) + P(j, i) = 1`` holds by construction (both orders are computed in the same
forward pass; :func:`~turnrl.oracles.complement` makes the sum exactly 1 in floating point).

Backbone: by default a transformer built like the embedded tiny model (Llama architecture,
``PRESETS`` sizes) over the tokenizer of ``backbone`` (``tiny`` or any model directory),
randomly initialised; ``pretrained=true`` loads ``backbone``'s own weights instead (any hub
encoder such as ``microsoft/deberta-v3-base`` on a GPU, or an SFT'd tiny model). The saved
directory holds ``pairwise_config.json``, ``model.safetensors`` (backbone and head) and the
tokenizer; :meth:`PairwiseModel.from_pretrained` loads it.

Departures from PairRM (Jiang et al., 2023): PairRM scores A-vs-B with a DeBERTa encoder and
a bidirectional training objective over several pairs a prompt; here one head scores the
ordered pair and antisymmetry comes from the difference of the two orders. Trajectories are
rendered as text (:func:`~turnrl.oracles.render_trajectory`: agent turns, env replies and by
default the final observation); a side longer than ``max_side_tokens`` keeps its end.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from turnrl.config import Config, Range
from turnrl.data.schema import Trajectory
from turnrl.devices import default_device
from turnrl.errors import TurnRLError
from turnrl.oracles import Oracle, Query, complement, render_task, render_trajectory, sigmoid

PAIRWISE_CONFIG = "pairwise_config.json"
WEIGHTS = "model.safetensors"


def check_pairwise_folder(path: str | Path) -> Path:
    """``path`` if it holds a model of ``turnrl train preference-model`` (its ``pairwise_config.json``),
    else a one-line error saying what is missing."""
    p = Path(path)
    if not (p / PAIRWISE_CONFIG).is_file():
        what = "no such folder" if not p.is_dir() else f"no {PAIRWISE_CONFIG} in it"
        raise TurnRLError(f"{p}: not a pairwise preference model ({what}); train one with "
                          "`turnrl train preference-model` and give its model folder")
    # what loading reads, checked before any stage runs: a broken folder failed after sampling
    try:
        meta = json.loads((p / PAIRWISE_CONFIG).read_text())
        if not isinstance(meta, dict) or not isinstance(meta.get("settings"), dict) or \
                not isinstance(meta.get("backbone_config"), dict) or "model_type" not in meta["backbone_config"]:
            raise ValueError("no settings or backbone_config with a model_type")
    except (OSError, ValueError) as e:
        raise TurnRLError(f"{p / PAIRWISE_CONFIG}: unreadable ({e}); is the folder complete?") from None
    if not (p / WEIGHTS).is_file():
        raise TurnRLError(f"{p}: no {WEIGHTS} (the pairwise model's weights); is the folder complete?")
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(p / WEIGHTS), framework="pt") as f:
            f.keys()
    except (OSError, SafetensorError) as e:
        raise TurnRLError(f"{p / WEIGHTS}: unreadable ({e}); is the folder complete?") from None
    return p


class PairwiseSettings(Config):
    """How the pairwise model is built and how it reads a comparison."""

    backbone: str = "tiny"
    """Tokenizer source (and weights with ``pretrained``): ``tiny``, a model directory or a hub id."""
    pretrained: bool = False
    """Load ``backbone``'s weights (``AutoModel``); false builds a fresh tiny-like transformer."""
    preset: str = "tiny"
    """Size of the fresh transformer (``turnrl.models.tiny.PRESETS``)."""
    layers: int | None = None
    """Override the preset's number of layers."""
    pooling: Literal["last", "mean", "first"] = "last"
    """``last`` token (causal backbones), ``mean`` of the tokens, or ``first`` (CLS encoders)."""
    max_task_tokens: int = 128
    max_side_tokens: int = 192
    final_observation: bool = True
    """Show the env's final observation (the outcome) at the end of each trajectory."""

    value_ranges = {"layers": Range(1), "max_task_tokens": Range(1), "max_side_tokens": Range(1)}


class PairwiseModel(nn.Module):
    """``f(task, y_a, y_b)``: a transformer backbone, pooling and a linear head."""

    def __init__(self, backbone: nn.Module, settings: PairwiseSettings, hidden: int):
        super().__init__()
        self.backbone = backbone
        self.settings = settings
        self.head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.head.bias)
        nn.init.normal_(self.head.weight, std=0.02)

    @property
    def config(self) -> Any:  # the trainer core reads model.config for use_cache
        return getattr(self.backbone, "config", None)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Scores ``[B]`` of right-padded sequences."""
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.to(hidden.dtype)
        if self.settings.pooling == "last":
            last = attention_mask.long().sum(dim=1) - 1
            pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
        elif self.settings.pooling == "first":
            pooled = hidden[:, 0]
        else:
            pooled = (hidden * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clamp_min(1.0)
        return self.head(pooled.float()).squeeze(-1)

    def gradient_checkpointing_enable(self, **kwargs: Any) -> None:
        """The trainer core's ``gradient_checkpointing``: the backbone's layers recompute their
        activations in the backward pass (the head is one linear layer)."""
        backbone: Any = self.backbone
        enable = getattr(backbone, "activation_checkpointing_enable", None)  # transformers >= 5.24's name
        if enable is not None:
            enable(activation_checkpointing_kwargs=kwargs.get("gradient_checkpointing_kwargs"))
        else:
            backbone.gradient_checkpointing_enable(**kwargs)

    def margins(self, ab: Sequence[Sequence[int]], ba: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
        """``d = f(a, b) - f(b, a)`` for each pair (see :func:`pair_margins`)."""
        return pair_margins(self, ab, ba, pad_id)

    # ------------------------------------------------------------------ save / load

    def save_pretrained(self, path: str | Path, state_dict: dict[str, torch.Tensor] | None = None,
                        **_: Any) -> None:
        from safetensors.torch import save_file

        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        sd = state_dict if state_dict is not None else self.state_dict()
        save_file({k: v.detach().cpu().contiguous() for k, v in sd.items()}, str(out / WEIGHTS))
        config: Any = getattr(self.backbone, "config", None)
        backbone_cfg = config.to_dict() if config is not None else {}
        (out / PAIRWISE_CONFIG).write_text(json.dumps(
            {"schema": "turnrl.pairwise_model/v1", "settings": self.settings.model_dump(mode="json"),
             "backbone_config": backbone_cfg}, indent=2, default=str) + "\n")

    @classmethod
    def from_pretrained(cls, path: str | Path) -> PairwiseModel:
        from safetensors.torch import load_file
        from transformers import AutoConfig, AutoModel

        p = check_pairwise_folder(path)
        meta = json.loads((p / PAIRWISE_CONFIG).read_text())
        settings = PairwiseSettings.model_validate(meta["settings"])
        bcfg = dict(meta["backbone_config"])
        try:
            config = AutoConfig.for_model(bcfg.pop("model_type"), **bcfg)
        except (ValueError, TypeError) as e:
            raise TurnRLError(f"{p / PAIRWISE_CONFIG}: not a backbone transformers can build ({e})") from None
        backbone = AutoModel.from_config(config)
        model = cls(backbone, settings, _hidden_size(config))
        missing, unexpected = model.load_state_dict(load_file(str(p / WEIGHTS)), strict=False)
        if [k for k in missing if not k.endswith("rotary_emb.inv_freq")] or unexpected:
            raise TurnRLError(f"{p}: weights do not match the model (missing {missing[:3]}, unexpected {unexpected[:3]})")
        model.eval()
        return model


def pair_margins(model: Any, ab: Sequence[Sequence[int]], ba: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    """``d = f(a, b) - f(b, a)`` for each pair: both orders right-padded into one forward pass
    of ``model`` (a :class:`PairwiseModel`, or its DDP wrapper during training)."""
    seqs = list(ab) + list(ba)
    width = max(len(s) for s in seqs)
    dev = next(model.parameters()).device
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[r, : len(s)] = 1
    scores = model(ids.to(dev), mask.to(dev))
    n = len(ab)
    return scores[:n] - scores[n:]


def _hidden_size(config: Any) -> int:
    for key in ("hidden_size", "d_model", "dim"):
        if getattr(config, key, None):
            return int(getattr(config, key))
    raise TurnRLError("cannot tell the backbone's hidden size")


def build_pairwise_model(settings: PairwiseSettings, seed: int = 0) -> tuple[PairwiseModel, Any]:
    """A fresh model (or ``backbone``'s weights under ``pretrained``) and its tokenizer."""
    from transformers import AutoModel, LlamaConfig, LlamaModel

    from turnrl.models.loading import first_position_is_blind, load_tokenizer, resolve_model_path
    from turnrl.models.tiny import PRESETS

    tok = load_tokenizer(settings.backbone)
    torch.manual_seed(seed)
    if settings.pretrained:
        try:
            backbone = AutoModel.from_pretrained(resolve_model_path(settings.backbone))
        except (OSError, ValueError) as e:
            raise TurnRLError(f"cannot load backbone '{settings.backbone}': {str(e).splitlines()[0]}") from None
        hidden = _hidden_size(backbone.config)
    else:
        if settings.preset not in PRESETS:
            raise TurnRLError(f"unknown preset '{settings.preset}'; choose from: {', '.join(PRESETS)}")
        hidden, inter, layers, heads, _ = PRESETS[settings.preset]
        if settings.layers is not None:
            layers = settings.layers
        config = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=inter,
                             num_hidden_layers=layers, num_attention_heads=heads,
                             num_key_value_heads=heads, max_position_embeddings=2048,
                             pad_token_id=tok.pad_token_id, bos_token_id=None, eos_token_id=tok.eos_token_id,
                             initializer_range=0.02)
        backbone = LlamaModel(config)
    if settings.pooling == "first" and first_position_is_blind(backbone, tok):
        # both orders of a comparison begin with the same task tokens: f(a, b) = f(b, a), every margin 0
        raise TurnRLError(f"model.pooling=first: the backbone '{settings.backbone}' is causal (its first position "
                          "does not read the rest of a text), so both orders of a pair would score alike and "
                          "nothing would be learned; use pooling=last or mean")
    return PairwiseModel(backbone, settings, hidden), tok


# ----------------------------------------------------------------------------- encoding


class PairEncoder:
    """Token ids of ``[task] A: [y_a] B: [y_b] <eos>`` in both orders, with per-text caching
    (the K samples of a task appear in K-1 pairs each)."""

    def __init__(self, tokenizer: Any, settings: PairwiseSettings):
        self.tok = tokenizer
        self.s = settings
        self._cache: dict[str, list[int]] = {}
        self.sep_a = self._ids("\n[A]\n")
        self.sep_b = self._ids("\n[B]\n")
        eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.pad_token_id
        self.end = [int(eos)] if eos is not None else []

    def _ids(self, text: str) -> list[int]:
        ids = self._cache.get(text)
        if ids is None:
            ids = list(self.tok(text, add_special_tokens=False)["input_ids"])
            self._cache[text] = ids
        return ids

    def task_ids(self, traj: Trajectory) -> list[int]:
        """The task's last ``max_task_tokens`` tokens: the first observation (a shop's goal, a game's
        opening), and as much of the instruction before it as fits, as the judge clips it. The head of
        the instruction alone (every env's is longer than the default 128) held nothing of the task."""
        ids = self._ids(render_task(traj))
        return ids[-self.s.max_task_tokens:] if len(ids) > self.s.max_task_tokens else ids

    def side_ids(self, traj: Trajectory) -> list[int]:
        ids = self._ids(render_trajectory(traj, final_observation=self.s.final_observation))
        return ids[-self.s.max_side_tokens:] if len(ids) > self.s.max_side_tokens else ids

    def encode(self, a: Trajectory, b: Trajectory) -> tuple[list[int], list[int]]:
        task, ya, yb = self.task_ids(a), self.side_ids(a), self.side_ids(b)
        return (task + self.sep_a + ya + self.sep_b + yb + self.end,
                task + self.sep_a + yb + self.sep_b + ya + self.end)


# ------------------------------------------------------------------------------- oracle


def _load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as e:
        raise TurnRLError(f"cannot load the tokenizer of {path}: {str(e).splitlines()[0]}") from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token if tok.eos_token is not None else tok.unk_token
    return tok


class PairwiseModelOracle(Oracle):
    """The ``pairwise_model`` oracle: a trained :class:`PairwiseModel` directory."""

    name = "pairwise_model"
    symmetric = True

    def __init__(self, path: str | Path | PairwiseModel, *, tokenizer: Any = None, batch_size: int = 32,
                 device: str | None = None):
        if isinstance(path, PairwiseModel):
            if tokenizer is None:
                raise TurnRLError("PairwiseModelOracle(model) needs its tokenizer")
            self.model, tok = path, tokenizer
        else:
            p = check_pairwise_folder(path)
            self.model = PairwiseModel.from_pretrained(p)
            tok = tokenizer or _load_tokenizer(p)
            device = default_device(device)  # a model given as an object stays where it is
        if device is not None:
            self.model.to(device)
        self.model.eval()
        self.encoder = PairEncoder(tok, self.model.settings)
        self.pad_id = tok.pad_token_id or 0
        self.batch_size = max(1, batch_size)

    @torch.no_grad()
    def margins(self, queries: Sequence[Query]) -> list[float]:
        """``f(i, j) - f(j, i)`` per query, batched by length."""
        encoded = [self.encoder.encode(a, b) for _, a, b in queries]
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][0]))
        out = [0.0] * len(encoded)
        step = max(1, self.batch_size // 2)  # each query is two sequences
        for s in range(0, len(order), step):
            idx = order[s : s + step]
            d = self.model.margins([encoded[i][0] for i in idx], [encoded[i][1] for i in idx], self.pad_id)
            for i, v in zip(idx, d.double().cpu().tolist(), strict=True):
                out[i] = float(v)
        return out

    def probs(self, queries: Sequence[Query]) -> list[float]:
        return [complement(sigmoid(abs(d)))[0 if d >= 0 else 1] for d in self.margins(queries)]
