"""Generation engines: token ids in, sampled token ids and their log-probs out.

An engine takes a batch of prompts (token id lists, built by
:class:`~turnrl.tokenization.ChatFormat`) and returns, for each, the sampled tokens up to
and including the first stop token, with the log-probability of each sampled token under
the model's own distribution (temperature 1, no top-p), which is what training computes.
The HF engine runs every prompt of a step in one ``generate`` call (left padding); a vLLM
engine with the same interface serves GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from turnrl.config import Config


class SamplingConfig(Config):
    """Sampling settings; ``temperature`` 0 is greedy decoding."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    #: False when ``max_new_tokens`` ran out before a stop token
    finished: bool


class Engine(Protocol):
    stop_token_ids: list[int]

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig) -> list[Generation]: ...


class HFEngine:
    """Batched sampling with ``transformers``' ``generate``."""

    def __init__(self, model: Any, tokenizer: Any, stop_token_ids: Sequence[int]):
        self.model = model
        self.tokenizer = tokenizer
        self.stop_token_ids = list(stop_token_ids)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.stop_token_ids[0])
        #: number of ``generate`` calls made (benchmarks and tests read it)
        self.calls = 0

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.inference_mode()
    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig) -> list[Generation]:
        if not prompts:
            return []
        self.calls += 1
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
            attn[i, width - len(p) :] = 1
        greedy = sampling.temperature <= 0
        was_training = self.model.training
        self.model.eval()
        out = self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=attn.to(self.device),
            do_sample=not greedy,
            temperature=None if greedy else sampling.temperature,
            top_p=None if greedy or sampling.top_p >= 1.0 else sampling.top_p,
            top_k=None,
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=self.stop_token_ids,
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            output_logits=True,
        )
        if was_training:
            self.model.train()
        new = out.sequences[:, width:].cpu()
        logits = torch.stack(out.logits, dim=1).float()  # [B, new, V], raw (temperature 1)
        logps = torch.log_softmax(logits, dim=-1).gather(-1, new.to(logits.device).unsqueeze(-1)).squeeze(-1).cpu()
        stops = set(self.stop_token_ids)
        results = []
        for i in range(len(prompts)):
            row = new[i].tolist()
            n, finished = len(row), False
            for j, t in enumerate(row):
                if t in stops:
                    n, finished = j + 1, True
                    break
            results.append(Generation(row[:n], logps[i, :n].tolist(), finished))
        return results
