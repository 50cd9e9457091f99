"""Packed forward passes: log-probs of the agent's tokens, no compute on padding.

Sequences are packed first-fit-decreasing into rows of at most ``row_tokens`` tokens;
inside a row, ``position_ids`` restart at 0 for each sequence and no attention mask is
passed, so ``transformers`` builds a block-diagonal causal mask (packed-sequence
detection) and no sequence attends to another. Under ``sdpa`` that mask is not what
attention runs on (see below): each sequence is one causal attention call, so a row of many
short sequences does not pay for a dense row-by-row attention. Rows are padded only at their
tail, to the longest row. The LM head runs only where the next token is an agent token
(:func:`kept_logits`), so neither observation nor padding positions pay for the
vocabulary projection.

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
blocks), so a pair would pay for its chosen suffix attending to its rejected suffix, a packed
sequence for every other sequence of its row, and both for the padding.
:func:`forward_packed` instead runs attention segment by segment (:func:`segment_attention`,
registered with ``transformers.AttentionInterface`` for the duration of the forward pass):
each prefix is one causal attention call (the kernel skips the upper triangle), each suffix
one call of its queries against ``[prefix | suffix]`` keys; padding is never attended. The result is the same up to float rounding (a test checks
it against the 4-D mask and against separate sequences).

Sliding attention windows (Mistral, Gemma-2/3's local layers, Qwen2 with ``use_sliding_window``):
a token attends to the ``w`` latest positions of its own sequence, itself included. Both paths
keep that band: :func:`segment_attention` reads the window each layer passes, and the 4-D mask
is banded by ``position_ids`` (one mask per layer type where full and windowed layers mix), so a
sequence longer than the window gets the log-probs of its separate forward pass there too.
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
    #: plain packing (block-diagonal from ``position_ids``), and for a shared-prefix layout until
    #: :meth:`dense_mask` builds it (only attention that is not :func:`segment_attention` reads it)
    attention_mask: torch.Tensor | None = None
    #: the layout of every row (see :func:`segment_attention`): its units, each a prefix and its
    #: suffixes; in plain packing every sequence is a unit that is all prefix
    segments: list[RowSegments] | None = None
    #: a shared-prefix layout's ``(group, branch)`` per position ([R, W] each), which the dense mask is made of
    mask_parts: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def shared_layout(self) -> bool:
        """Sequences share prefixes in a row: attention needs the layout (a 4-D mask or its segments)."""
        return self.attention_mask is not None or self.mask_parts is not None

    def dense_mask(self) -> torch.Tensor:
        """The 4-D mask (built on first use: [R, 1, W, W] is large, and the segments make it unneeded)."""
        if self.attention_mask is None:
            assert self.mask_parts is not None, "plain packing has no 4-D mask"
            group, branch = self.mask_parts
            width = group.shape[1]
            q = torch.arange(width)
            causal = q.unsqueeze(1) >= q.unsqueeze(0)  # [W(query), W(key)]
            same_group = (group.unsqueeze(2) == group.unsqueeze(1)) & (group.unsqueeze(2) >= 0)
            visible_branch = (branch.unsqueeze(1) == 0) | (branch.unsqueeze(2) == branch.unsqueeze(1))
            allowed = same_group & visible_branch & causal
            allowed |= torch.eye(width, dtype=torch.bool)  # padding attends to itself (no empty softmax rows)
            self.attention_mask = allowed.unsqueeze(1)
        return self.attention_mask


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


def pack_runs(seqs: Sequence[Tokenized], keys: Sequence[Any], *, row_tokens: int = 2048, pad_id: int = 0,
              shared: bool = True) -> PackedBatch:
    """Pack sequences whose runs of equal ``keys`` share a prefix, e.g. the turns of one episode,
    each tokenized as its own sequence, which share at least the instruction.

    A run of consecutive sequences with the same key is a unit of :func:`pack_shared` (its
    common prefix computed once); a unit is closed before its layout (prefix + suffixes) would
    pass ``row_tokens``, so units never force a row wider than the widest sequence. Sequences
    keep their order in ``seq_index``. ``shared=False``: plain :func:`pack`.
    """
    if len(keys) != len(seqs):
        raise ValueError(f"pack_runs: {len(seqs)} sequences but {len(keys)} keys")
    if not shared:
        return pack(seqs, row_tokens=row_tokens, pad_id=pad_id)
    units: list[list[Tokenized]] = []
    prefix = size = 0
    for i, s in enumerate(seqs):
        if units and keys[i] == keys[i - 1]:
            p = min(prefix, common_prefix_length([units[-1][0].input_ids, s.input_ids]))
            grown = size + (prefix - p) * (len(units[-1]) - 1) + len(s.input_ids) - p
            if grown <= row_tokens:
                units[-1].append(s)
                prefix, size = p, grown
                continue
        units.append([s])
        prefix = size = len(s.input_ids)
    return pack_shared(units, row_tokens=row_tokens, pad_id=pad_id)


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
        segments=segments,
        mask_parts=(group, branch) if shared else None,
    )


def _band(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """``[..., Q, K]`` bool: causal by position, and within ``window`` positions (``None``: no window),
    as transformers' sliding window: a query at ``i`` sees keys at ``i - window < j <= i``."""
    diff = q_pos.unsqueeze(-1) - k_pos.unsqueeze(-2)
    allowed = diff >= 0
    return allowed & (diff < window) if window is not None else allowed


def sliding_window(config: Any) -> tuple[int | None, bool]:
    """The attention window of a model's windowed layers and whether full-attention layers are
    mixed with them: ``(None, False)`` without windowed layers. Every layer is windowed when
    ``sliding_window`` is set and there are no ``layer_types`` (Mistral); Qwen2 clears it
    without ``use_sliding_window``."""
    window = getattr(config, "sliding_window", None)
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return None, False
    types = getattr(config, "layer_types", None)
    if types is None:
        return window, False
    if "sliding_attention" not in types:
        return None, False
    return window, any(t != "sliding_attention" for t in types)


def _model_mask(model: Any, batch: PackedBatch, device: Any) -> torch.Tensor | dict[str, torch.Tensor]:
    """The batch's 4-D mask in the form the model's attention implementation takes: banded by
    position for windowed layers, a ``{layer type: mask}`` dict where full and windowed layers mix."""
    config = _config(model)
    impl = getattr(config, "_attn_implementation", "sdpa") or "sdpa"  # DDP/PEFT wrappers looked through
    if "flash" in impl:
        from turnrl.errors import TurnRLError

        raise TurnRLError(
            f"attention implementation {impl!r} takes no 4-D mask; set shared_prefix=false to pack without "
            "shared prefixes"
        )
    dtype = next(model.parameters()).dtype

    def form(mask: torch.Tensor) -> torch.Tensor:
        mask = mask.to(device)
        if impl == "eager":
            return torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(~mask, torch.finfo(dtype).min)
        return mask

    window, mixed = sliding_window(config)
    if _segment_mode(model, batch):
        # segment_attention reads the layout, not the mask: a placeholder of the mask's shape, which
        # transformers passes through as it passes any 4-D mask (no [R, 1, W, W] built or copied)
        rows, width = batch.input_ids.shape
        placeholder = torch.ones((1, 1, 1, 1), dtype=torch.bool, device=device).expand(rows, 1, width, width)
        return {"full_attention": placeholder, "sliding_attention": placeholder} if mixed else placeholder
    dense = batch.dense_mask()
    pos = batch.position_ids
    if window is None or pos.numel() == 0 or int(pos.max()) < window:  # no sequence is longer than the window
        return form(dense)
    banded = dense & _band(pos, pos, window).unsqueeze(1)  # the diagonal stays: padding sees itself
    if mixed:
        return {"full_attention": form(dense), "sliding_attention": form(banded)}
    return form(banded)


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
    :func:`forward_packed` (no layout set) this is plain ``sdpa`` attention with ``attention_mask``.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    active = _active_segments.get()
    if active is None or query.shape[0] != len(active[0]):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    layout, masks = active
    width = query.shape[2]
    window = kwargs.get("sliding_window")  # this layer's window (None: full attention)
    if not isinstance(window, int) or window <= 0:
        window = None
    rows = []
    # Pieces are taken with one unbind and one split per row, not by slicing: the backward of a
    # slice writes into a zero gradient the size of the whole tensor, once per slice.
    for r, (q_row, k_row, v_row) in enumerate(zip(query.unbind(0), key.unbind(0), value.unbind(0), strict=True)):
        units = layout[r]
        sizes: list[int] = []
        used = 0
        for start, p, suffixes in units:
            for s0, n in [(start, p), *suffixes]:
                if s0 != used:
                    raise ValueError(f"segment layout of row {r} is not contiguous: {units}")
                sizes.append(n)
                used += n
        q_parts, k_parts, v_parts = (t.split([*sizes, width - used], dim=1) for t in (q_row, k_row, v_row))
        pieces = []
        at = 0
        for _, p, suffixes in units:
            pk, pv = k_parts[at][None], v_parts[at][None]
            if p and (window is None or p <= window):  # the window does not bind: the kernel's own causal mask
                out, _ = sdpa_attention_forward(module, q_parts[at][None], pk, pv, None, dropout=dropout,
                                                scaling=scaling, is_causal=True)
                pieces.append(out)
            elif p:
                out, _ = sdpa_attention_forward(module, q_parts[at][None], pk, pv,
                                                _segment_mask(masks, 0, p, 0, window, query.device),
                                                dropout=dropout, scaling=scaling)
                pieces.append(out)
            for _, n in suffixes:
                at += 1
                k = torch.cat([pk, k_parts[at][None]], dim=2)
                v = torch.cat([pv, v_parts[at][None]], dim=2)
                mask = _segment_mask(masks, p, n, p, window, query.device)
                out, _ = sdpa_attention_forward(module, q_parts[at][None], k, v, mask, dropout=dropout,
                                                scaling=scaling)
                pieces.append(out)
            at += 1
        if used < width:
            pieces.append(query.new_zeros(1, width - used, query.shape[1], value.shape[-1]))
        rows.append(torch.cat(pieces, dim=1))
    return torch.cat(rows, dim=0), None


def _segment_mask(masks: dict[Any, torch.Tensor], q0: int, nq: int, prefix_len: int, window: int | None,
                  device: Any) -> torch.Tensor:
    """``[1, 1, nq, prefix_len + nq]``: the ``nq`` queries of a segment at positions ``q0 ..`` against
    the keys of a prefix of ``prefix_len`` tokens and of their own segment (a suffix continues the
    prefix's positions; a prefix has ``prefix_len`` 0), causal and within ``window``; cached per shape
    for the forward pass."""
    key = (q0, nq, prefix_len, window)
    mask = masks.get(key)
    if mask is None:
        q_pos = torch.arange(q0, q0 + nq, device=device)
        k_pos = torch.arange(prefix_len + nq, device=device) if prefix_len else q_pos
        mask = masks.setdefault(key, _band(q_pos, k_pos, window)[None, None])
    return mask


def _config(model: Any) -> Any:
    return getattr(model, "config", None) or getattr(getattr(model, "module", None), "config", None)


def _checkpointing(model: Any) -> bool:
    """Whether the model recomputes activations in the backward pass (DDP and PEFT wrappers looked
    through; transformers >= 5 calls it activation checkpointing and warns on the old name)."""
    inner = getattr(model, "module", model)
    if hasattr(inner, "get_base_model"):
        inner = inner.get_base_model()
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(inner), name):
            return bool(getattr(inner, name))
    return False


def _segment_mode(model: Any, batch: PackedBatch) -> bool:
    """Whether :func:`_segments_active` runs ``batch``'s attention as :func:`segment_attention`."""
    impl = getattr(_config(model), "_attn_implementation", None)
    return batch.segments is not None and impl == "sdpa" and not _checkpointing(model)


@contextlib.contextmanager
def _segments_active(model: Any, batch: PackedBatch) -> Iterator[None]:
    """Run the model's attention as :func:`segment_attention` over ``batch``'s layout, when the
    model uses ``sdpa`` (other implementations keep the 4-D mask). Not under gradient
    checkpointing: the backward pass recomputes attention outside this context, and a
    recomputation must save the tensors the forward saved, so there attention runs on the 4-D
    mask (shared prefixes) or the block-diagonal one (plain packing), at the dense cost."""
    if not _segment_mode(model, batch):
        yield
        return
    assert batch.segments is not None
    config = _config(model)
    impl = config._attn_implementation
    from transformers import AttentionInterface

    AttentionInterface.register(_SEGMENT_ATTENTION, segment_attention)
    token = _active_segments.set((batch.segments, {}))
    config._attn_implementation = _SEGMENT_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = impl
        _active_segments.reset(token)


def forward_packed(model: Any, batch: PackedBatch, **kwargs: Any) -> Any:
    """``model(...)`` on a packed batch (``kwargs`` go to the model): plain packing relies on
    ``position_ids``; a shared-prefix layout passes its 4-D mask in the form the model's
    attention takes and, under ``sdpa``, runs :func:`segment_attention`."""
    device = next(model.parameters()).device
    if batch.shared_layout:
        kwargs["attention_mask"] = _model_mask(model, batch, device)
    with _segments_active(model, batch):
        return model(input_ids=batch.input_ids.to(device), position_ids=batch.position_ids.to(device),
                     use_cache=False, **kwargs)


def kept_logits(model: Any, batch: PackedBatch, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """``[K, V]`` logits at the batch's kept positions (those whose next token is an agent
    token) and the model's output (``kwargs`` go to the model, e.g. ``output_hidden_states``).

    The LM head runs at exactly those positions: a forward pre-hook on the model's output
    embeddings gathers them from the ``[R, W, H]`` hidden states, so whatever the model does
    to the head's output (e.g. soft-capping) still applies. A model whose head is not reached
    that way gets ``logits_to_keep`` on the union of the kept columns (every row pays for the
    columns any row needs), or the full logits where ``logits_to_keep`` is not taken.
    """
    device = next(model.parameters()).device
    width = batch.input_ids.shape[1]
    rows, cols = (batch.keep // width).to(device), (batch.keep % width).to(device)
    inner = getattr(model, "module", model)  # under DDP the wrapped model has the head
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    if head is not None:
        fired = []

        def gather(_module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
            fired.append(True)
            return (args[0][rows, cols].unsqueeze(0), *args[1:])

        handle = head.register_forward_pre_hook(gather)
        try:
            out = forward_packed(model, batch, **kwargs)
        finally:
            handle.remove()
        if fired and out.logits.shape[:2] == (1, rows.numel()):
            return out.logits[0], out
    union, col_in_union = torch.unique(cols, return_inverse=True)
    try:
        out = forward_packed(model, batch, logits_to_keep=union, **kwargs)
        return out.logits[rows, col_in_union], out
    except TypeError:  # a model without logits_to_keep: full logits
        out = forward_packed(model, batch, **kwargs)
        return out.logits[rows, cols], out


def token_logps(model: Any, batch: PackedBatch) -> torch.Tensor:
    """``log p(label | prefix)`` at every kept position, ``[K]`` float32, with grad."""
    device = next(model.parameters()).device
    if batch.keep.numel() == 0:
        return torch.zeros(0, device=device)
    logits, _ = kept_logits(model, batch)
    logps = torch.log_softmax(logits.float(), dim=-1)
    return logps.gather(-1, batch.labels.to(device).unsqueeze(-1)).squeeze(-1)
