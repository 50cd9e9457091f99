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

Under ``sdpa`` the 4-D mask is not what attention runs on: a dense masked attention over a
row computes every query against every key of the row (the kernel cannot skip masked
blocks), so a pair would pay for its chosen suffix attending to its rejected suffix, and for
the padding. :func:`token_logps` instead runs attention segment by segment
(:func:`segment_attention`, registered with ``transformers.AttentionInterface`` for the
duration of the forward pass): each prefix is one causal attention call (the kernel skips
the upper triangle), each suffix one call of its queries against ``[prefix | suffix]``
keys; padding is never attended. The result is the same up to float rounding (a test checks
it against the 4-D mask and against separate sequences).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

#: one row's layout: ``(prefix start, prefix length, [(suffix start, suffix length), ...])`` per unit
RowSegments = list[tuple[int, int, list[tuple[int, int]]]]


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
    #: the shared-prefix layout of every row (see :func:`segment_attention`); None for plain packing
    segments: list[RowSegments] | None = None


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
    segments: list[RowSegments] = []
    for r, members in enumerate(rows):
        col = 0
        row_segments: RowSegments = []
        for g, u_i in enumerate(members):
            unit, p = units[u_i], prefix[u_i]
            ids[r, col : col + p] = torch.tensor(unit[0].input_ids[:p], dtype=torch.long)
            pos[r, col : col + p] = torch.arange(p)
            group[r, col : col + p] = g
            base, col = col, col + p
            row_segments.append((base, p, []))
            for b, s in enumerate(unit):
                n = len(s.input_ids)
                ids[r, col : col + n - p] = torch.tensor(s.input_ids[p:], dtype=torch.long)
                pos[r, col : col + n - p] = torch.arange(p, n)
                group[r, col : col + n - p] = g
                branch[r, col : col + n - p] = b + 1
                if n > p:
                    row_segments[-1][2].append((col, n - p))
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
        segments.append(row_segments)
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
        segments=segments if shared else None,
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


_SEGMENT_ATTENTION = "turnrl_segments"
_active_segments: contextvars.ContextVar[tuple[list[RowSegments], dict[Any, torch.Tensor]] | None] = (
    contextvars.ContextVar("turnrl_segments", default=None)
)


def segment_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention over a shared-prefix layout, one ``sdpa`` call per prefix and per suffix.

    ``query`` is ``[R, heads, W, dim]`` (``key``/``value`` may have fewer heads: GQA is left
    to transformers' ``sdpa_attention_forward``). Returns ``[R, W, heads, dim]`` like it; padding
    positions get zeros (no token attends to them and nothing reads them). Outside
    :func:`token_logps` (no layout set) this is plain ``sdpa`` attention with ``attention_mask``.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    active = _active_segments.get()
    if active is None or query.shape[0] != len(active[0]):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    layout, masks = active
    width = query.shape[2]
    rows = []
    for r, units in enumerate(layout):
        pieces = []
        used = 0
        for start, p, suffixes in units:
            pk, pv = key[r : r + 1, :, start : start + p], value[r : r + 1, :, start : start + p]
            if p:
                out, _ = sdpa_attention_forward(module, query[r : r + 1, :, start : start + p], pk, pv, None,
                                                dropout=dropout, scaling=scaling, is_causal=True)
                pieces.append(out)
            for s0, n in suffixes:
                q = query[r : r + 1, :, s0 : s0 + n]
                k = torch.cat([pk, key[r : r + 1, :, s0 : s0 + n]], dim=2)
                v = torch.cat([pv, value[r : r + 1, :, s0 : s0 + n]], dim=2)
                mask = masks.get((p, n))
                if mask is None:
                    mask = torch.ones(n, p + n, dtype=torch.bool, device=query.device)
                    mask[:, p:] = torch.tril(mask[:, p:])
                    mask = masks.setdefault((p, n), mask[None, None])
                out, _ = sdpa_attention_forward(module, q, k, v, mask, dropout=dropout, scaling=scaling)
                pieces.append(out)
            used = max(used, start + p + sum(n for _, n in suffixes))
        if used < width:
            shape = pieces[0].shape if pieces else (1, 0, query.shape[1], value.shape[-1])
            pieces.append(query.new_zeros(1, width - used, shape[2], shape[3]))
        rows.append(torch.cat(pieces, dim=1))
    return torch.cat(rows, dim=0), None


def _config(model: Any) -> Any:
    return getattr(model, "config", None) or getattr(getattr(model, "module", None), "config", None)


@contextlib.contextmanager
def _segments_active(model: Any, batch: PackedBatch) -> Iterator[None]:
    """Run the model's attention as :func:`segment_attention` over ``batch``'s layout, when the
    model uses ``sdpa`` (other implementations keep the 4-D mask). Under gradient
    checkpointing the backward pass recomputes attention outside this context, on the 4-D
    mask: the same values up to rounding, at the dense cost."""
    config = _config(model)
    impl = getattr(config, "_attn_implementation", None)
    if batch.segments is None or impl != "sdpa":
        yield
        return
    from transformers import AttentionInterface

    AttentionInterface.register(_SEGMENT_ATTENTION, segment_attention)
    token = _active_segments.set((batch.segments, {}))
    config._attn_implementation = _SEGMENT_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = impl
        _active_segments.reset(token)


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
    with _segments_active(model, batch):
        try:
            out = model(input_ids=ids, position_ids=pos, use_cache=False, logits_to_keep=union.to(device), **extra)
            logits = out.logits[rows.to(device), col_in_union.to(device)]  # [K, V]
        except TypeError:  # a model without logits_to_keep: full logits
            out = model(input_ids=ids, position_ids=pos, use_cache=False, **extra)
            logits = out.logits[rows.to(device), cols.to(device)]
    logps = torch.log_softmax(logits.float(), dim=-1)
    return logps.gather(-1, batch.labels.to(device).unsqueeze(-1)).squeeze(-1)
