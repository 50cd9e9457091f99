"""Generation engines: token ids in, sampled token ids and their log-probs out.

An engine takes a batch of prompts (token id lists, built by
:class:`~turnrl.tokenization.ChatFormat`) and returns, for each, the sampled tokens up to
and including the first stop token, with the log-probability of each sampled token under
the model's own distribution (temperature 1, no top-p), which is what training computes.
The HF engine runs every prompt of a step in one ``generate`` call (left padding); a vLLM
engine with the same interface serves GPUs.

Several samples of one prompt (Best-of-N, CHAI's ``k`` candidates, SPPO's ``K`` samples, the
first turns of games that start alike) arrive as copies of the same prompt, next to each other
or not. The HF engine then prefills each distinct prompt once and repeats its KV cache for the
copies, instead of running the same prompt through the model once per copy; the sampling itself
is unchanged (the same rows in the same order, so the same random draws).

**Turns reuse the last step's KV cache.** A multi-turn prompt is the previous turn's prompt, its
sampled reply and the new observation: re-running it from the start every turn costs a prefill
that grows with the square of the number of turns. Inside :meth:`HFEngine.keep_turns` (the sampler
enters it for each rollout) the engine keeps the KV cache of every row of its last call, and a
prompt that starts with one of those rows' tokens (its prompt and sampled reply) takes that
prefix from it and runs only the rest. Rows are matched by their tokens, so episodes that end,
start, are windowed (``history``) or repeated need no bookkeeping; the kept cache is dropped when
the weights or their adapters change (:func:`_weights_state`), and when the rollout ends. The logits
then differ from a full prefill's as another batch's padding makes them differ: in the last bits in
float32 (about 1e-6 in a log-prob), by up to about 1e-2 in bfloat16, where a sampled token can change
(as it can with another batch's padding). Models whose
cache is not keys and values by column (a sliding window, a recurrent state) or whose rotary frequencies
depend on the sequence's length (``dynamic`` and ``longrope`` scaling) keep nothing.

**Caches are preallocated.** transformers' dynamic cache grows by concatenation, a copy of the whole
cache at every sampled token; the engine's caches write each step into a buffer with room for the
reply instead (:func:`_growing_layer`), for the layers that attend to the whole sequence.

**A random stream per row.** With temperature > 0, ``generate`` takes one seed per prompt
(``seeds``), and row ``i``'s tokens are drawn from uniforms of its own generator, seeded with
``seeds[i]`` (:class:`RowDraws`, :func:`draw_tokens`: inverse-CDF sampling of the temperature / top-p distribution).
A sample then depends on its prompt, its seed and the weights only, not on which other
prompts share the batch: the sampler keys each episode's seeds by the episode and turn
(:class:`~turnrl.rollout.policies.ModelPolicy`), so a collection gives the same episodes with
any number of environments, and a killed one resumes with exactly the episodes an
uninterrupted run would have drawn. Without ``seeds``, each row's seed is drawn from torch's
global generator (reproducible under ``torch.manual_seed``). Up to floating-point: the logits
of a row can differ in the last bits with the batch's padding, which moves a draw only when its
uniform lies that close to a boundary of the distribution.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from turnrl.config import Config, Range


class SamplingConfig(Config):
    """Sampling settings; ``temperature`` 0 is greedy decoding."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64

    value_ranges = {"temperature": Range(0), "top_p": Range(0, 1, lo_open=True), "max_new_tokens": Range(1)}


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    #: False when ``max_new_tokens`` ran out before a stop token
    finished: bool


def cut_at_stop(token_ids: Sequence[int], logprobs: Sequence[float], stop_token_ids: Iterable[int]) -> Generation:
    """A sample up to and including its first stop token (``finished``), or whole when it has none."""
    stops = set(stop_token_ids)
    for j, t in enumerate(token_ids):
        if t in stops:
            return Generation(list(token_ids[: j + 1]), list(logprobs[: j + 1]), True)
    return Generation(list(token_ids), list(logprobs), False)


class Engine(Protocol):
    stop_token_ids: list[int]

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig,
                 seeds: Sequence[int] | None = None) -> list[Generation]:
        """One sample per prompt; with temperature > 0, ``seeds`` (one per prompt) key each row's
        random stream (None: drawn from torch's global generator)."""
        ...


def row_seeds(seeds: Sequence[int] | None, n: int) -> list[int]:
    """``seeds`` checked against ``n`` prompts, or ``n`` seeds drawn from torch's global generator."""
    if seeds is None:
        return [int(s) for s in torch.randint(0, 2**62, (n,)).tolist()]
    if len(seeds) != n:
        raise ValueError(f"{len(seeds)} seeds for {n} prompts")
    return [int(s) for s in seeds]


def draw_tokens(scores: torch.Tensor, uniforms: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """One token per row of ``scores`` [B, V], by inverse-CDF sampling with the row's uniform in
    [0, 1) (``uniforms`` [B]): with ``p = softmax(scores / temperature)``, restricted to the
    nucleus when ``top_p`` < 1 (the most probable tokens, in order, until their mass reaches
    ``top_p``; at least one) and renormalized, the token is the first ``k`` with
    ``sum(p[:k+1]) > u``. Returns [B] token ids. A row's token depends on its own scores and
    uniform only."""
    # float64 (MPS has none: float32 there), so that a long vocabulary's small tail keeps its mass
    probs = torch.softmax(scores.to(torch.float32 if scores.device.type == "mps" else torch.float64) / temperature,
                          dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        before = sorted_p.cumsum(dim=-1) - sorted_p  # the mass of the tokens ranked above
        sorted_p = sorted_p.masked_fill(before >= top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    cdf = probs.cumsum(dim=-1)
    if not bool(torch.isfinite(cdf[:, -1]).all()):  # NaN logits, or a row with no finite logit
        raise ValueError("cannot sample from logits without a finite value or with NaN")
    target = (uniforms.to(cdf.dtype).to(cdf.device) * cdf[:, -1]).unsqueeze(-1)
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=scores.shape[-1] - 1)


class RowDraws:
    """A ``generate`` logits processor that samples each row from its own uniforms (row ``i``
    at step ``t`` uses ``uniforms[i, t]``) and leaves only the drawn token finite, so that
    greedy decoding picks it. ``width``: the prompts' padded length (step 0's input length)."""

    def __init__(self, uniforms: torch.Tensor, width: int, sampling: SamplingConfig):
        self.uniforms, self.width, self.sampling = uniforms, width, sampling

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = input_ids.shape[1] - self.width
        tok = draw_tokens(scores, self.uniforms[:, step], self.sampling.temperature, self.sampling.top_p)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(-1, tok.unsqueeze(-1), 0.0)


def row_uniforms(seeds: Sequence[int], steps: int) -> torch.Tensor:
    """[len(seeds), steps] float64: row i is the first ``steps`` draws of a generator seeded with seeds[i]."""
    return torch.stack([torch.rand(steps, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
                        for s in seeds])


#: ``generate`` settings a hub model's ``generation_config`` may carry and that would change what is
#: sampled (or make "greedy" not greedy): set to their neutral values, so that an engine samples exactly
#: its :class:`SamplingConfig`, as the vLLM engine does
_NEUTRAL: dict[str, Any] = {"num_beams": 1, "repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "min_p": None,
                            "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "min_new_tokens": None,
                            "bad_words_ids": None, "suppress_tokens": None, "begin_suppress_tokens": None,
                            # a forced stop at max_new_tokens would end a cut reply as if the model chose to
                            "forced_eos_token_id": None, "forced_bos_token_id": None, "min_length": 0,
                            "sequence_bias": None, "exponential_decay_length_penalty": None, "max_time": None,
                            # a model's static / sliding-window cache setting: the shared-prefix path passes
                            # its own cache, which generate refuses together with one
                            "cache_implementation": None,
                            # a checkpoint saved with use_cache=false (after gradient checkpointing elsewhere)
                            # would rerun the whole sequence on top of the shared prefix's cache every step
                            "use_cache": True,
                            # classifier-free guidance reweighs the logits
                            "guidance_scale": None}


class HFEngine:
    """Batched sampling with ``transformers``' ``generate``. ``share_prefix``: prefill copies of a prompt
    once; ``reuse_turns``: inside :meth:`keep_turns`, take each prompt's prefix from the last call's KV
    cache; ``preallocate``: the KV cache's full-attention layers write into buffers with room for the
    reply (:meth:`_new_cache`). All on by default; see the module docstring."""

    def __init__(self, model: Any, tokenizer: Any, stop_token_ids: Sequence[int], share_prefix: bool = True,
                 autocast: Callable[[], AbstractContextManager[Any]] | None = None, reuse_turns: bool = True,
                 preallocate: bool = True):
        self.model = model
        #: entered around each ``generate`` (a trainer's ``accelerator.autocast``: a model kept in
        #: float32 for mixed-precision training samples in half precision too)
        self.autocast = autocast
        #: prefill runs of identical consecutive prompts once (see the module docstring)
        self.share_prefix = share_prefix
        self.tokenizer = tokenizer
        self.stop_token_ids = list(stop_token_ids)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.stop_token_ids[0])
        #: number of ``generate`` calls made (benchmarks and tests read it)
        self.calls = 0
        #: prompt rows whose prefill was shared with an identical prompt before them
        self.shared_rows = 0
        #: the keyword under which the model takes a KV cache (see :func:`_cache_kwarg`)
        self.cache_kwarg = _cache_kwarg(model)
        #: inside :meth:`keep_turns`, keep each call's KV cache for the next call's prompts that extend it
        self.reuse_turns = reuse_turns
        #: KV caches write into preallocated buffers (:meth:`_new_cache`) instead of growing by concatenation
        self.preallocate = preallocate
        #: prompt tokens whose KV cache came from an earlier call, counted once per distinct prompt of a
        #: call (benchmarks and tests read it)
        self.reused_tokens = 0
        self._keeping = 0
        self._kept: _KeptTurns | None = None

    @contextmanager
    def keep_turns(self) -> Iterator[None]:
        """Within it, every call keeps its rows' KV cache, and the next call takes from it the prefix
        each of its prompts shares with one of those rows (see the module docstring); on leaving, the
        kept cache is freed. The sampler enters it for each rollout."""
        self._keeping += 1
        try:
            yield
        finally:
            self._keeping -= 1
            if not self._keeping:
                self._kept = None

    @functools.cached_property
    def _columns_only(self) -> bool:
        """Whether the engine may build the model's KV cache itself: ``generate`` would give it a
        ``DynamicCache`` (transformers 4.56 gives Mamba, Jamba and other stateful models their own cache
        class), and every layer of it holds keys and values by column, whose rows the shared prefill can
        select and a later call can copy (not a recurrent state: Jamba's and Qwen3-Next's in 5.x)."""
        import transformers.cache_utils as cache_utils
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        default = getattr(type(base), "_supports_default_dynamic_cache", None)
        if default is not None and not default():
            return False
        kinds = {DynamicLayer, getattr(cache_utils, "DynamicSlidingWindowLayer", DynamicLayer)}
        return all(type(layer) in kinds for layer in getattr(DynamicCache(config=self.model.config), "layers", []))

    @functools.cached_property
    def _keeps_turns(self) -> bool:
        """Whether a later call can take the model's keys and values from this one's: a cache by column
        (:attr:`_columns_only`) and rotary frequencies that do not depend on the sequence's length."""
        return self._columns_only and not _rope_by_length(self.model.config)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig,
                 seeds: Sequence[int] | None = None) -> list[Generation]:
        if not prompts:
            return []
        with torch.inference_mode(), self.autocast() if self.autocast is not None else nullcontext():
            return self._generate(prompts, sampling, seeds)

    def _generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig,
                  seeds: Sequence[int] | None) -> list[Generation]:
        self.calls += 1
        share = self.share_prefix and self._columns_only
        firsts, row_of = _distinct(prompts) if share else (list(range(len(prompts))), list(range(len(prompts))))
        width = max(len(p) for p in prompts)
        ids, attn = _left_pad([prompts[i] for i in firsts], width, self.pad_id)
        greedy = sampling.temperature <= 0
        was_training = self.model.training
        self.model.eval()
        # row i of the batch is distinct prompt rows[i]
        rows = torch.tensor(row_of, dtype=torch.long)
        kwargs: dict[str, Any] = {}
        state = _weights_state(self.model) if self._keeping and self.reuse_turns and self._keeps_turns else None
        reserve = sampling.max_new_tokens  # the columns a cache's buffers leave for the reply
        kept, self._kept = self._kept, None
        cache, start = (self._reuse(kept, [prompts[i] for i in firsts], width, reserve)
                        if kept is not None and kept.state == state else (None, 0))
        del kept  # its tensors were released as they were read
        if len(firsts) < len(prompts) and width > 1:
            kwargs[self.cache_kwarg] = self._prefill(ids, attn, rows, cache, start, reserve)
            self.shared_rows += len(prompts) - len(firsts)
        elif cache is not None or (self.preallocate and self._columns_only):  # generate runs the rest (or all)
            kwargs[self.cache_kwarg] = cache if cache is not None else self._new_cache(reserve)
        ids, attn = ids[rows], attn[rows]
        if not greedy:  # each row draws from its own stream; generate then picks the drawn token
            from transformers import LogitsProcessorList

            uniforms = row_uniforms(row_seeds(seeds, len(prompts)), sampling.max_new_tokens)  # on the CPU
            kwargs["logits_processor"] = LogitsProcessorList([RowDraws(uniforms, width, sampling)])
        _check_positions(self.model, width + sampling.max_new_tokens)
        out = self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=attn.to(self.device),
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            **_NEUTRAL,  # the model's generation_config may set these (repetition_penalty=1.05, ...): not ours
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=self.stop_token_ids,
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            output_logits=True,
            **kwargs,
        )
        if was_training:
            self.model.train()
        new = out.sequences[:, width:]
        # raw logits (temperature 1), one step at a time: a [B, new, V] float32 stack and its log-softmax
        # would hold two more copies of every step's logits (tens of GB at a 150k vocabulary)
        steps = [torch.log_softmax(step.float(), dim=-1).gather(-1, new[:, t : t + 1].to(step.device)).squeeze(-1)
                 for t, step in enumerate(out.logits)]
        logps = torch.stack(steps, dim=1).cpu() if steps else torch.zeros(len(prompts), 0)
        new = new.cpu()
        gens = [cut_at_stop(new[i].tolist(), logps[i].tolist(), self.stop_token_ids) for i in range(len(prompts))]
        if state is not None:
            self._kept = _keep(getattr(out, self.cache_kwarg, None), out.sequences.shape[1] - width, prompts, gens,
                               width, state)
        return gens

    def _new_cache(self, reserve: int) -> Any:
        """An empty KV cache for the model whose full-attention layers write each step into a buffer with
        room for ``reserve`` more columns (:func:`_growing_layer`) instead of concatenating: transformers'
        dynamic layer copies the whole cache at every sampled token (a third of a tic-tac-toe rollout's time
        on the tiny model). Other layers (sliding windows) stay the model's own."""
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        cache = DynamicCache(config=self.model.config)
        grow = _growing_layer()
        layers = getattr(cache, "layers", None)
        if self.preallocate and layers:
            cache.layers = [grow(reserve) if type(layer) is DynamicLayer else layer for layer in layers]
        return cache

    def _prefill(self, ids: torch.Tensor, attn: torch.Tensor, rows: torch.Tensor, cache: Any = None,
                 start: int = 0, reserve: int = 0) -> Any:
        """The KV cache of every distinct prompt but its last token (which ``generate`` runs
        to get the first logits), expanded to the batch: its row i is prompt ``rows[i]``. With a
        ``cache`` of the first ``start`` columns (:meth:`_reuse`), only the columns after them run."""
        head, mask = ids[:, :-1].to(self.device), attn[:, :-1].to(self.device)
        # the positions ``generate`` gives a left-padded prompt
        pos = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
        if cache is None:
            cache = self._new_cache(reserve)
        if start < head.shape[1]:
            self.model(input_ids=head[:, start:], attention_mask=mask, position_ids=pos[:, start:], use_cache=True,
                       **{self.cache_kwarg: cache})
        cache.batch_select_indices(rows.to(self.device))
        return cache

    def _reuse(self, kept: _KeptTurns, prompts: Sequence[Sequence[int]], width: int,
               reserve: int) -> tuple[Any, int]:
        """``(cache, C)``: the KV cache of the first ``C`` columns of ``prompts`` left-padded to ``width``,
        copied from the kept rows, or ``(None, 0)`` when there is nothing to copy. Each prompt takes the
        kept row that shares its longest prefix; ``C`` is the least column up to which every prompt's is
        cached (a prompt's last token always runs: its logits give the first sample), so rows whose
        prefix reaches further recompute a few columns. ``kept``'s tensors are released as they are read."""
        pads = [width - len(p) for p in prompts]
        matches = [_longest_prefix(kept.tokens, p) for p in prompts]
        reach = min(pad + min(n, len(p) - 1) for pad, (_, n), p in zip(pads, matches, prompts, strict=True))
        if reach <= 0:
            return None, 0
        cols = torch.arange(reach)
        pad = torch.tensor(pads).unsqueeze(1)
        src_row = torch.tensor([r for r, _ in matches]).unsqueeze(1)
        start = torch.tensor([kept.starts[r] for r, _ in matches]).unsqueeze(1)
        # row j's column c holds its token c - pad_j: the kept row's column start + c - pad_j
        src_col = (start + cols - pad).clamp(min=0)
        blank = (cols < pad)[:, None, :, None]  # left padding: masked, zeros
        # the prompts' other columns and the reply still to come
        cache = self._new_cache(width - reach + reserve)
        layer = 0
        while kept.layers:
            keys, values = kept.layers.pop(0)
            at = keys.device  # each layer's own (a model split across devices)
            # [rows, heads, T, dim] indexed in dims 0 and 2 -> [B, C, heads, dim]
            k, v = (t[src_row.to(at), :, src_col.to(at)].permute(0, 2, 1, 3).masked_fill(blank.to(at), 0).contiguous()
                    for t in (keys, values))
            del keys, values
            cache.update(k, v, layer)
            layer += 1
        self.reused_tokens += sum(max(0, reach - p) for p in pads)
        return cache, reach


@dataclass
class _KeptTurns:
    """The KV cache of an engine call's rows, kept for the next call (:meth:`HFEngine.keep_turns`)."""

    #: the weights' state it was computed under (:func:`_weights_state`)
    state: tuple[Any, ...]
    #: [rows, longest] each row's cached tokens (its prompt and sampled reply), -1 after its end
    tokens: np.ndarray
    #: per row, the cache column of its first token
    starts: list[int]
    #: per layer, the keys and values [rows, heads, columns, head dim]
    layers: list[tuple[torch.Tensor, torch.Tensor]]


def _keep(cache: Any, steps: int, prompts: Sequence[Sequence[int]], gens: Sequence[Generation], width: int,
          state: tuple[Any, ...]) -> _KeptTurns | None:
    """The kept form of ``generate``'s final ``cache`` after ``steps`` sampled tokens: row i's columns
    from ``width - len(prompts[i])`` on hold its prompt and its reply but the last sampled token (never
    run), and no padding ``generate`` ran after its stop token. None for a cache that is not one
    full-attention tensor per layer (a sliding window drops the start of long rows; a recurrent state
    has no columns)."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    full = (DynamicLayer, _growing_layer())
    if not layers or any(type(layer) not in full or getattr(layer, "keys", None) is None or not layer.keys.numel()
                         for layer in layers):
        return None
    if steps < 1 or layers[0].keys.shape[-2] != width + steps - 1:
        return None
    rows = [list(p) + g.token_ids[: min(len(g.token_ids), steps - 1)] for p, g in zip(prompts, gens, strict=True)]
    tokens = np.full((len(rows), max(len(r) for r in rows)), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = r
    return _KeptTurns(state, tokens, [width - len(p) for p in prompts],
                      [(layer.keys, layer.values) for layer in layers])


@functools.cache
def _growing_layer() -> type:
    """A transformers ``DynamicLayer`` (full attention) whose ``update`` writes the new keys and values
    into a preallocated buffer with room for ``reserve`` more columns, and returns views of its filled
    part, instead of concatenating a new tensor at every step. A cache operation that replaces the
    tensors (``batch_select_indices``, ``reorder_cache``, offloading) leaves views of no buffer: the next
    update copies them into a new one. ``crop`` leaves a shorter view of the same buffer, which the next
    update overwrites past its end, as it should."""
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        def __init__(self, reserve: int = 0) -> None:
            super().__init__()
            self.reserve = reserve
            self.buffers: tuple[torch.Tensor, torch.Tensor] | None = None

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            n, k = self.get_seq_length(), key_states.shape[-2]
            old = (self.keys, self.values) if n else None
            bufs = self.buffers
            if old is None or bufs is None or n + k > bufs[0].shape[-2] or not all(
                    t is not None and t.data_ptr() == b.data_ptr() and t.stride() == b.stride()
                    and t.shape[:-2] == b.shape[:-2] for t, b in zip(old, bufs, strict=True)):
                if bufs is None:
                    cols = n + k + self.reserve
                elif n + k <= bufs[0].shape[-2]:  # the tensors were replaced (a batch selection): the same room
                    cols = bufs[0].shape[-2]
                else:  # past the reserve: twice the room, as a list grows
                    cols = n + k + max(self.reserve, n + k)
                self.buffers = bufs = None  # the old buffer goes before the new one comes
                kb, vb = (new.new_empty((*new.shape[:-2], cols, new.shape[-1])) for new in (key_states, value_states))
                for buf, t in zip((kb, vb), old or (), strict=False):
                    assert t is not None  # n > 0
                    buf[..., :n, :] = t
                self.buffers = bufs = (kb, vb)
                # what the parent's lazy initialisation sets (4.56: dtype and device; 5.x: is_initialized)
                self.dtype, self.device, self.is_initialized = key_states.dtype, key_states.device, True
            bufs[0][..., n : n + k, :], bufs[1][..., n : n + k, :] = key_states, value_states
            keys, values = bufs[0][..., : n + k, :], bufs[1][..., : n + k, :]
            self.keys, self.values = keys, values
            return keys, values

    return GrowingLayer


def _longest_prefix(tokens: np.ndarray, prompt: Sequence[int]) -> tuple[int, int]:
    """``(row, n)``: the row of ``tokens`` (-1 padded) that shares the longest prefix with ``prompt``, and
    that prefix's length (the first such row; ``(0, 0)`` when none shares a token)."""
    n = min(tokens.shape[1], len(prompt))
    if not n or not len(tokens):
        return 0, 0
    same = tokens[:, :n] == np.asarray(prompt[:n], dtype=np.int64)[None, :]
    shared = np.where(same.all(axis=1), n, same.argmin(axis=1))
    row = int(shared.argmax())
    return row, int(shared[row])


#: rotary scalings whose frequencies depend on the longest position of the forward pass: keys kept from
#: a shorter one are rotated otherwise than a full prefill's
_ROPE_BY_LENGTH = {"dynamic", "longrope"}


def _rope_by_length(config: Any) -> bool:
    """Whether the model's rotary embedding is one of :data:`_ROPE_BY_LENGTH` (for any of its layer types)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    params = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None)
    if not isinstance(params, dict):
        return False
    found = [params, *(v for v in params.values() if isinstance(v, dict))]
    return any(str(p.get("rope_type", p.get("type", ""))) in _ROPE_BY_LENGTH for p in found)


def _weights_state(model: Any) -> tuple[Any, ...]:
    """What a KV cache depends on besides its tokens: every parameter's identity, storage and version
    (an in-place update through autograd's view of it bumps it: a foreach or for-loop optimizer step, a
    ``load_state_dict``, a LoRA merge), each adapter layer's active adapters and whether they are disabled
    (PEFT's ``disable_adapter``), and the autocast in effect. A fused optimizer step (``fused=True``) and
    writes through ``p.data`` bump no version: a :meth:`HFEngine.keep_turns` scope must not span one (the
    sampler's spans one rollout)."""
    params = tuple((id(p), p.data_ptr(), p._version) for p in model.parameters())
    adapters = tuple((m.disable_adapters, tuple(m.active_adapters)) for m in model.modules()
                     if isinstance(getattr(type(m), "disable_adapters", None), property))
    kind = next(model.parameters()).device.type
    cast = (torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None)
    return params, adapters, cast


def _check_positions(model: Any, length: int) -> None:
    """A model with learned position embeddings (GPT-2's ``n_positions``) has none past its table: a
    prompt and reply longer than it failed deep in torch (an IndexError). One line instead; rotary
    models (Llama, Qwen...) run past their trained length, as transformers lets them."""
    config = getattr(model, "config", None)
    limit = getattr(config, "n_positions", None)
    if isinstance(limit, int) and length > limit:
        from turnrl.errors import TurnRLError

        raise TurnRLError(f"a prompt and its reply need {length} positions, and the model has {limit} "
                          f"(n_positions): shorten the context (history=N) or max_new_tokens")


def _cache_kwarg(model: Any) -> str:
    """The name under which this transformers version takes a KV cache: ``cache`` since 5.24
    (``past_key_values`` is deprecated there and removed from ``forward`` in 5.40), else
    ``past_key_values``. A PEFT wrapper forwards keyword arguments: ask the model it wraps."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def _distinct(prompts: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
    """``(firsts, rows)``: where each distinct prompt first occurs, and for every prompt the
    position of its distinct prompt in ``firsts``: ``[a, b, a, c]`` -> ``([0, 1, 3], [0, 1, 0, 2])``
    (copies need not be neighbours: SPPO and ETO repeat a task after the other tasks)."""
    index: dict[tuple[int, ...], int] = {}
    firsts: list[int] = []
    rows: list[int] = []
    for i, p in enumerate(prompts):
        key = tuple(p)
        if key not in index:
            index[key] = len(firsts)
            firsts.append(i)
        rows.append(index[key])
    return firsts, rows


def _left_pad(prompts: Sequence[Sequence[int]], width: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
        attn[i, width - len(p) :] = 1
    return ids, attn
