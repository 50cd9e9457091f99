"""Packed forward passes: log-probs of the agent's tokens, no compute on padding.

Sequences are packed first-fit-decreasing into rows of at most ``row_tokens`` tokens;
inside a row, ``position_ids`` restart at 0 for each sequence and no attention mask is
passed, so ``transformers`` builds a block-diagonal causal mask (packed-sequence
detection) and no sequence attends to another. Rows are padded only at their tail, to the
longest row. The LM head runs only where the next token is an agent token
(``logits_to_keep`` with explicit positions), so neither observation nor padding
positions pay for the vocabulary projection.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch


class Tokenized(Protocol):
    input_ids: list[int]
    action_mask: list[int]
    turn_index: list[int]


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # [R, W]
    position_ids: torch.Tensor  # [R, W]
    #: flat positions (row * W + col) whose next token is an agent token
    keep: torch.Tensor  # [K]
    labels: torch.Tensor  # [K] the agent tokens predicted there
    seq_index: torch.Tensor  # [K] which input sequence
    turn_index: torch.Tensor  # [K] which agent turn (as given by the sequence's turn_index)
    num_seqs: int
    #: tokens computed (rows × width) and tokens that are real (not tail padding)
    computed_tokens: int
    real_tokens: int


def pack(seqs: Sequence[Tokenized], *, row_tokens: int = 2048, pad_id: int = 0) -> PackedBatch:
    """Pack sequences into rows; see the module docstring."""
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i].input_ids))
    rows: list[list[int]] = []
    fill: list[int] = []
    for i in order:
        n = len(seqs[i].input_ids)
        for r, used in enumerate(fill):
            if used + n <= row_tokens:
                rows[r].append(i)
                fill[r] += n
                break
        else:
            rows.append([i])
            fill.append(n)
    width = max(fill) if fill else 0
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    pos = torch.zeros((len(rows), width), dtype=torch.long)
    keep: list[int] = []
    labels: list[int] = []
    seq_idx: list[int] = []
    turn_idx: list[int] = []
    for r, members in enumerate(rows):
        col = 0
        for i in sorted(members):
            s = seqs[i]
            n = len(s.input_ids)
            ids[r, col : col + n] = torch.tensor(s.input_ids, dtype=torch.long)
            pos[r, col : col + n] = torch.arange(n)
            for j in range(1, n):
                if s.action_mask[j]:
                    keep.append(r * width + col + j - 1)
                    labels.append(s.input_ids[j])
                    seq_idx.append(i)
                    turn_idx.append(s.turn_index[j])
            col += n
    return PackedBatch(
        input_ids=ids,
        position_ids=pos,
        keep=torch.tensor(keep, dtype=torch.long),
        labels=torch.tensor(labels, dtype=torch.long),
        seq_index=torch.tensor(seq_idx, dtype=torch.long),
        turn_index=torch.tensor(turn_idx, dtype=torch.long),
        num_seqs=len(seqs),
        computed_tokens=len(rows) * width,
        real_tokens=sum(fill),
    )


def token_logps(model: Any, batch: PackedBatch) -> torch.Tensor:
    """``log p(label | prefix)`` at every kept position, ``[K]`` float32, with grad."""
    device = next(model.parameters()).device
    ids = batch.input_ids.to(device)
    pos = batch.position_ids.to(device)
    width = ids.shape[1]
    if batch.keep.numel() == 0:
        return torch.zeros(0, device=device)
    rows = batch.keep // width
    cols = batch.keep % width
    # Only the columns some row needs go through the LM head (exactly the kept ones for one row).
    union, col_in_union = torch.unique(cols, return_inverse=True)
    try:
        out = model(input_ids=ids, position_ids=pos, use_cache=False, logits_to_keep=union.to(device))
        logits = out.logits[rows.to(device), col_in_union.to(device)]  # [K, V]
    except TypeError:  # a model without logits_to_keep: full logits
        out = model(input_ids=ids, position_ids=pos, use_cache=False)
        logits = out.logits[rows.to(device), cols.to(device)]
    logps = torch.log_softmax(logits.float(), dim=-1)
    return logps.gather(-1, batch.labels.to(device).unsqueeze(-1)).squeeze(-1)
