"""ArCHer's utterance-level critic: a text encoder, twin Q heads and twin V heads (seed 003).

    enc(x)  = pooled hidden states of a transformer over the tokens of x
    Q_i(s,a) = MLP_i([enc(s); enc(a)])      i = 1, 2   (joint=true: [enc(s); enc(s + a)])
    V_i(s)   = MLP'_i(enc(s))               i = 1, 2

One encoder serves states and actions (as in the authors' code, where one RoBERTa encodes
both). The default encoder (``encoder: tiny``) is a small Llama-architecture transformer
built like the embedded tiny model, randomly initialised, over the *actor's* tokenizer,
mean-pooled over real tokens; any Hugging Face encoder id or directory (a RoBERTa, a BERT,
a small causal LM) is loaded with ``AutoModel`` + its own ``AutoTokenizer`` instead.
States are truncated from the left (the newest observation survives), actions from the
right.

Target networks are plain deep copies updated by Polyak averaging
(:func:`polyak_update`, ``target <- (1 - tau) target + tau online``).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, Literal

import torch
from pydantic import ValidationInfo, field_validator
from torch import nn

from turnrl.config import Range
from turnrl.train.core import TrainConfig


class CriticConfig(TrainConfig):
    """The critic's network and optimisation (the trainer core's settings plus the encoder).

    Optimisation departs from the paper for the tiny model: lr 1e-4 (paper 2e-5 for a
    pre-trained RoBERTa; a randomly initialised encoder needs more), constant schedule."""

    lr: float = 1e-4
    batch_size: int = 32
    lr_schedule: Literal["cosine", "linear", "constant"] = "constant"
    warmup_ratio: float = 0.0
    #: ``tiny`` (a small transformer over the actor's tokenizer) or an HF encoder id / directory
    encoder: str = "tiny"
    #: sizes of the ``tiny`` encoder
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    intermediate: int = 256
    #: ``mean`` over real tokens, the ``last`` real token, or the ``first`` (a [CLS] token; refused on a causal
    #: encoder -- the ``tiny`` one, any causal LM -- whose first position reads no later token)
    pooling: Literal["mean", "last", "first"] = "mean"
    #: width of the MLP heads (0: the encoder's hidden size)
    head_hidden: int = 0
    max_state_tokens: int = 256
    max_action_tokens: int = 64
    #: don't backpropagate into the encoder (heads only)
    detach_encoder: bool = False
    #: Q heads read ``[enc(s); enc(s + a)]`` (state and action encoded together, so attention
    #: can relate them) instead of the paper's ``[enc(s); enc(a)]``
    joint: bool = False

    value_ranges = {**TrainConfig.value_ranges,
                    **dict.fromkeys(("hidden", "layers", "heads", "intermediate", "max_state_tokens",
                                     "max_action_tokens"), Range(1)),
                    "head_hidden": Range(0)}

    @field_validator("heads")
    @classmethod
    def _heads_divide_hidden(cls, v: int, info: ValidationInfo) -> int:
        hidden = info.data.get("hidden")
        if isinstance(hidden, int) and v >= 1 and hidden % v:
            raise ValueError(f"must divide hidden ({hidden}) into equal attention heads")
        return v


class TextEncoder(nn.Module):
    """Token ids -> one vector per text (see the module docstring)."""

    def __init__(self, backbone: nn.Module, tokenizer: Any, hidden_size: int, pooling: str):
        super().__init__()
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.hidden_size = hidden_size
        self.pooling = pooling
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = int(pad if pad is not None else 0)
        self._cache: dict[str, list[int]] = {}

    def ids(self, text: str) -> list[int]:
        got = self._cache.get(text)
        if got is None:
            got = list(self.tokenizer(text, add_special_tokens=True)["input_ids"])
            if len(self._cache) < 200_000:
                self._cache[text] = got
        return got

    def forward(self, texts: Sequence[str], max_tokens: int, keep: Literal["left", "right"] = "right") -> torch.Tensor:
        """One vector per text; a text that occurs several times (CHAI's ``k`` candidates of one
        state) is encoded once."""
        first: dict[str, int] = {}
        where = [first.setdefault(t, len(first)) for t in texts]
        if len(first) < len(texts):
            return self(list(first), max_tokens, keep)[torch.tensor(where, device=self._device())]
        rows = []
        for t in texts:
            ids = self.ids(t) or [self.pad_id]
            if keep == "left" or len(ids) <= max_tokens:
                rows.append(ids[:max_tokens])
            elif self.pooling == "first" and max_tokens > 1:  # first-token pooling reads [CLS]/<s>: keep it
                rows.append(ids[:1] + ids[len(ids) - max_tokens + 1 :])
            else:
                rows.append(ids[-max_tokens:])
        width = max(len(r) for r in rows)
        device = self._device()
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
            attn[i, : len(r)] = 1
        input_ids, attn = input_ids.to(device), attn.to(device)
        hidden = self.backbone(input_ids=input_ids, attention_mask=attn).last_hidden_state  # [B, W, H]
        if self.pooling == "first":
            return hidden[:, 0]
        if self.pooling == "last":
            last = attn.sum(dim=1) - 1
            return hidden[torch.arange(hidden.shape[0], device=device), last]
        m = attn.unsqueeze(-1).to(hidden.dtype)
        return (hidden * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)

    def _device(self) -> torch.device:
        return next(self.backbone.parameters()).device


def _mlp(inp: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inp, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))


class DoubleCritic(nn.Module):
    """Twin Q heads on ``[enc(s); enc(a)]`` and twin V heads on ``enc(s)``."""

    def __init__(self, encoder: TextEncoder, cfg: CriticConfig):
        super().__init__()
        self.encoder = encoder
        self.cfg = cfg
        h = encoder.hidden_size
        w = cfg.head_hidden or h
        self.q1, self.q2 = _mlp(2 * h, w), _mlp(2 * h, w)
        self.v1, self.v2 = _mlp(h, w), _mlp(h, w)

    def encode_states(self, states: Sequence[str]) -> torch.Tensor:
        return self._enc(states, self.cfg.max_state_tokens, "right")

    def encode_actions(self, actions: Sequence[str]) -> torch.Tensor:
        return self._enc(actions, self.cfg.max_action_tokens, "left")

    def _enc(self, texts: Sequence[str], n: int, keep: Literal["left", "right"]) -> torch.Tensor:
        if self.cfg.detach_encoder:
            with torch.no_grad():
                return self.encoder(texts, n, keep)
        return self.encoder(texts, n, keep)

    def q_from(self, s: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([s, a], dim=-1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)

    def v_from(self, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.v1(s).squeeze(-1), self.v2(s).squeeze(-1)

    def encode_pairs(self, states: Sequence[str], actions: Sequence[str]) -> torch.Tensor:
        """The action side of the Q input: ``enc(a)``, or ``enc(s + a)`` with ``joint``."""
        if self.cfg.joint:
            texts = [f"{s}\nassistant: {a}" for s, a in zip(states, actions, strict=True)]
            return self._enc(texts, self.cfg.max_state_tokens + self.cfg.max_action_tokens, "right")
        return self.encode_actions(actions)

    def q(self, states: Sequence[str], actions: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q_from(self.encode_states(states), self.encode_pairs(states, actions))

    def v(self, states: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.v_from(self.encode_states(states))

    def forward(self, states: Sequence[str], actions: Sequence[str]) -> dict[str, torch.Tensor]:
        s = self.encode_states(states)
        q1, q2 = self.q_from(s, self.encode_pairs(states, actions))
        v1, v2 = self.v_from(s)
        return {"q1": q1, "q2": q2, "v1": v1, "v2": v2}


def build_critic(cfg: CriticConfig, actor_tokenizer: Any, *, seed: int = 0) -> DoubleCritic:
    """The critic of ``cfg`` (``encoder: tiny`` uses ``actor_tokenizer``), initialised from ``seed``."""
    torch.manual_seed(seed)
    if cfg.encoder == "tiny":
        from transformers import LlamaConfig, LlamaModel

        conf = LlamaConfig(
            vocab_size=len(actor_tokenizer), hidden_size=cfg.hidden, intermediate_size=cfg.intermediate,
            num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.heads,
            max_position_embeddings=max(2048, cfg.max_state_tokens), pad_token_id=actor_tokenizer.pad_token_id,
            initializer_range=0.02,
        )
        backbone: nn.Module = LlamaModel(conf)
        encoder = TextEncoder(backbone, actor_tokenizer, cfg.hidden, cfg.pooling)
    else:
        from transformers import AutoModel, AutoTokenizer

        from turnrl.errors import TurnRLError
        from turnrl.models.loading import resolve_model_path

        sizes = [f"critic.{k}={getattr(cfg, k)}" for k in ("hidden", "layers", "heads", "intermediate")
                 if getattr(cfg, k) != CriticConfig.model_fields[k].default]
        if sizes:  # they size the tiny encoder; a loaded one has its own
            raise TurnRLError(f"{', '.join(sizes)}: sizes of the tiny encoder, but critic.encoder={cfg.encoder} "
                              "brings its own; leave them out")
        try:
            path = resolve_model_path(cfg.encoder)
        except TurnRLError as e:
            raise TurnRLError(f"critic.encoder: {e}") from None
        try:
            tok = AutoTokenizer.from_pretrained(path)
            backbone = AutoModel.from_pretrained(path)
        except (OSError, ValueError) as e:
            raise TurnRLError(f"critic.encoder: cannot load '{cfg.encoder}': {str(e).splitlines()[0]}") from None
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token if tok.eos_token is not None else tok.unk_token
        hidden = int(getattr(backbone.config, "hidden_size", 0) or getattr(backbone.config, "d_model", 0))
        encoder = TextEncoder(backbone, tok, hidden, cfg.pooling)
        _check_reach(encoder, cfg)
    if cfg.pooling == "first":
        _check_first_pooling(encoder, cfg)
    return DoubleCritic(encoder, cfg)


def _check_first_pooling(encoder: TextEncoder, cfg: CriticConfig) -> None:
    """Refuse ``pooling=first`` on an encoder whose first position does not read the rest of the text
    (:func:`~turnrl.models.loading.first_position_is_blind`): every state would encode alike and V
    could not tell states apart."""
    from turnrl.errors import TurnRLError
    from turnrl.models.loading import first_position_is_blind

    if first_position_is_blind(encoder.backbone, encoder.tokenizer):
        raise TurnRLError(f"critic.pooling=first: critic.encoder '{cfg.encoder}' is causal (its first position does "
                          "not read the rest of a text), so every state would encode alike; use pooling=mean or last")


def _check_reach(encoder: TextEncoder, cfg: CriticConfig) -> None:
    """Refuse a ``max_state_tokens`` (``+ max_action_tokens`` with ``joint``) longer than the encoder
    reads: a learned position table (RoBERTa: 512) would otherwise fail with an index error at the
    first long state, deep in training. Tried with one row of that length, not read from the config,
    since models count their positions differently (RoBERTa's start after the pad id)."""
    from turnrl.errors import TurnRLError

    need = max(cfg.max_state_tokens + (cfg.max_action_tokens if cfg.joint else 0), cfg.max_action_tokens)
    key = "critic.max_state_tokens" + (" + critic.max_action_tokens" if cfg.joint else "")
    token = 1 if encoder.pad_id == 0 else 0  # not the pad id, whose positions some models do not count
    ids = torch.full((1, need), token, dtype=torch.long, device=encoder._device())
    try:
        with torch.no_grad():
            encoder.backbone(input_ids=ids, attention_mask=torch.ones_like(ids))
    except (IndexError, RuntimeError) as e:
        raise TurnRLError(f"{key}: {need} tokens are more than critic.encoder '{cfg.encoder}' reads "
                          f"({str(e).splitlines()[0] if str(e) else type(e).__name__}); lower it") from None


def make_target(critic: nn.Module) -> nn.Module:
    """A frozen deep copy of ``critic`` (the target network)."""
    # the tokenizer (and its id cache) is shared, not copied
    enc = getattr(critic, "encoder", None)
    memo = {id(enc.tokenizer): enc.tokenizer} if enc is not None and hasattr(enc, "tokenizer") else {}
    target = copy.deepcopy(critic, memo)
    for p in target.parameters():
        p.requires_grad_(False)
    return target


@torch.no_grad()
def polyak_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    r"""``target <- (1 - tau) * target + tau * online`` for every parameter; buffers are copied.

    ``tau = 1`` copies the online network, ``tau = 0`` leaves the target unchanged."""
    if not 0.0 <= tau <= 1.0:
        raise ValueError(f"tau must be in [0, 1], got {tau}")
    for t, o in zip(target.parameters(), online.parameters(), strict=True):
        t.mul_(1.0 - tau).add_(o.detach().to(device=t.device, dtype=t.dtype), alpha=tau)
    for tb, ob in zip(target.buffers(), online.buffers(), strict=True):
        tb.copy_(ob)
