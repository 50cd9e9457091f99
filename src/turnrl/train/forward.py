"""Packed forward passes: log-probs of the agent's tokens, no compute on padding.

Sequences are packed first-fit-decreasing into rows of at most ``row_tokens`` tokens;
inside a row, ``position_ids`` restart at 0 for each sequence and no attention mask is
passed, so ``transformers`` builds a block-diagonal causal mask (packed-sequence
detection) and no sequence attends to another. Rows are padded only at their tail, to the
longest row. The LM head runs only where the next token is an agent token
(``logits_to_keep`` with explicit positions), so neither observation nor padding
positions pay for the vocabulary projection.

Shared prefixes (:func:`pack_shared`): a *unit* is a group of sequences that begin with the
same tokens -- the chosen and rejected trajectories of a preference pair share at least the
instruction and first observation, step-wise pairs also the replayed history, and SPPO's K
samples of a task share their task prompt. A unit is laid out once as
``[common prefix | suffix 1 | suffix 2 | ...]``: every suffix's ``position_ids`` continue from
the prefix, and a 4-D attention mask lets each suffix token see the prefix and its own
suffix only. The prefix is computed once per unit instead of once per sequence; the
log-prob of a token is the same as in a separate forward pass of its sequence (a test
checks it). This needs an attention implementation that takes a custom 4-D mask (``sdpa``,
``eager``; not ``flash_attention_2``, for which ``shared_prefix=false`` falls back to
:func:`pack`).
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
    #: [R, 1, W, W] bool, True where a query (dim 2) may attend to a key (dim 3); None for
    #: plain packing (block-diagonal from ``position_ids``)
    attention_mask: torch.Tensor | None = None


def _first_fit_decreasing(lengths: Sequence[int], row_tokens: int) -> tuple[list[list[int]], list[int]]:
    """Bin items into rows of at most ``row_tokens`` (an item longer than that gets its own row)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    rows: list[list[int]] = []
    fill: list[int] = []
    for i in order:
        n = lengths[i]
        for r, used in enumerate(fill):
            if used + n <= row_tokens:
                rows[r].append(i)
                fill[r] += n
                break
        else:
            rows.append([i])
            fill.append(n)
    return [sorted(r) for r in rows], fill


def pack(seqs: Sequence[Tokenized], *, row_tokens: int = 2048, pad_id: int = 0) -> PackedBatch:
    """Pack sequences into rows; see the module docstring."""
    return _layout([[s] for s in seqs], row_tokens=row_tokens, pad_id=pad_id, shared=False)


def common_prefix_length(seqs: Sequence[Sequence[int]]) -> int:
    """Length of the longest token prefix shared by all of ``seqs``."""
    if not seqs:
        return 0
    n = min(len(s) for s in seqs)
    first = seqs[0]
    for j in range(n):
        t = first[j]
        if any(s[j] != t for s in seqs[1:]):
            return j
    return n


def pack_shared(units: Sequence[Sequence[Tokenized]], *, row_tokens: int = 2048, pad_id: int = 0) -> PackedBatch:
    """Pack units of sequences with a common prefix, the prefix once per unit.

    Sequences are numbered unit by unit (unit 0's sequences first) in ``seq_index``.
    See the module docstring for the layout.
    """
    return _layout(units, row_tokens=row_tokens, pad_id=pad_id, shared=True)


def _layout(units: Sequence[Sequence[Tokenized]], *, row_tokens: int, pad_id: int, shared: bool) -> PackedBatch:
    """Lay units out as ``[prefix | suffix 1 | ...]`` in rows. A one-sequence unit is all
    prefix, so plain packing is this with units of one and no 4-D mask (``shared=False``)."""
    prefix = [common_prefix_length([s.input_ids for s in u]) for u in units]
    lengths = [p + sum(len(s.input_ids) - p for s in u) for p, u in zip(prefix, units, strict=True)]
    rows, fill = _first_fit_decreasing(lengths, row_tokens)
    first_seq = [0]
    for u in units:
        first_seq.append(first_seq[-1] + len(u))
    width = max(fill) if fill else 0
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    pos = torch.zeros((len(rows), width), dtype=torch.long)
    group = torch.full((len(rows), width), -1, dtype=torch.long)
    branch = torch.zeros((len(rows), width), dtype=torch.long)
    keep: list[int] = []
    labels: list[int] = []
    seq_idx: list[int] = []
    turn_idx: list[int] = []
    for r, members in enumerate(rows):
        col = 0
        for g, u_i in enumerate(members):
            unit, p = units[u_i], prefix[u_i]
            ids[r, col : col + p] = torch.tensor(unit[0].input_ids[:p], dtype=torch.long)
            pos[r, col : col + p] = torch.arange(p)
            group[r, col : col + p] = g
            base, col = col, col + p
            for b, s in enumerate(unit):
                n = len(s.input_ids)
                ids[r, col : col + n - p] = torch.tensor(s.input_ids[p:], dtype=torch.long)
                pos[r, col : col + n - p] = torch.arange(p, n)
                group[r, col : col + n - p] = g
                branch[r, col : col + n - p] = b + 1
                start = col
                for j in range(1, n):
                    if s.action_mask[j]:
                        prev = j - 1
                        c = base + prev if prev < p else start + prev - p
                        keep.append(r * width + c)
                        labels.append(s.input_ids[j])
                        seq_idx.append(first_seq[u_i] + b)
                        turn_idx.append(s.turn_index[j])
                col += n - p
    mask = None
    if shared:
        q = torch.arange(width)
        causal = q.unsqueeze(1) >= q.unsqueeze(0)  # [W(query), W(key)]
        same_group = (group.unsqueeze(2) == group.unsqueeze(1)) & (group.unsqueeze(2) >= 0)
        visible_branch = (branch.unsqueeze(1) == 0) | (branch.unsqueeze(2) == branch.unsqueeze(1))
        allowed = same_group & visible_branch & causal
        allowed |= torch.eye(width, dtype=torch.bool)  # padding attends to itself (no empty softmax rows)
        mask = allowed.unsqueeze(1)
    return PackedBatch(
        input_ids=ids,
        position_ids=pos,
        keep=torch.tensor(keep, dtype=torch.long),
        labels=torch.tensor(labels, dtype=torch.long),
        seq_index=torch.tensor(seq_idx, dtype=torch.long),
        turn_index=torch.tensor(turn_idx, dtype=torch.long),
        num_seqs=first_seq[-1],
        computed_tokens=len(rows) * width,
        real_tokens=sum(fill),
        attention_mask=mask,
    )


def _model_mask(model: Any, mask: torch.Tensor, device: Any) -> torch.Tensor:
    """The 4-D mask in the form the model's attention implementation takes."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", "sdpa") or "sdpa"
    if "flash" in impl:
        from turnrl.errors import TurnRLError

        raise TurnRLError(
            f"attention implementation {impl!r} takes no 4-D mask; set shared_prefix=false to pack without "
            "shared prefixes"
        )
    mask = mask.to(device)
    if impl == "eager":
        dtype = next(model.parameters()).dtype
        return torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(~mask, torch.finfo(dtype).min)
    return mask


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
    extra: dict[str, Any] = {}
    if batch.attention_mask is not None:
        extra["attention_mask"] = _model_mask(model, batch.attention_mask, device)
    try:
        out = model(input_ids=ids, position_ids=pos, use_cache=False, logits_to_keep=union.to(device), **extra)
        logits = out.logits[rows.to(device), col_in_union.to(device)]  # [K, V]
    except TypeError:  # a model without logits_to_keep: full logits
        out = model(input_ids=ids, position_ids=pos, use_cache=False, **extra)
        logits = out.logits[rows.to(device), cols.to(device)]
    logps = torch.log_softmax(logits.float(), dim=-1)
    return logps.gather(-1, batch.labels.to(device).unsqueeze(-1)).squeeze(-1)
