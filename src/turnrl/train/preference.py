"""Preference optimisation on multi-turn trajectories: DPO, IPO, DMPO and SPPO on the trainer core.

One objective serves all four losses (:mod:`turnrl.losses` holds the formulas):

* a training *unit* is a preference pair (``dpo``, ``ipo``, ``dmpo``) or one scored sample
  (``sppo``; its ``meta["win_rate"]``, written by ``turnrl pairs --scored``);
* the trajectories of a unit are tokenized whole (every agent turn from
  ``meta["train_from_turn"]`` on is trainable; step-wise pairs train only their last turn) and
  packed with :func:`~turnrl.train.forward.pack_shared`, so the prefix a pair's two sides
  share (instruction, first observation, a replayed expert history) is computed once, and
  no compute goes to padding beyond a row's tail;
* per-turn log-prob sums come from one forward pass (``turn_index``) and feed the loss;
  DMPO weighs each turn with phi(t, T) of its own trajectory;
* reference log-probs are computed once, before training, and cached on disk under
  ``$TURNRL_HOME/ref_logps/`` keyed by the reference model's fingerprint, the data file's
  hash and the tokenization settings: re-runs, resumes and other output directories reuse
  them. The reference defaults to the starting model, whose log-probs are taken before the
  first step -- under LoRA that *is* the adapter-disabled base (a fresh adapter is zero), so
  no second copy of the model is ever held in memory. ``ref_model=PATH`` loads another
  model for the precomputation and frees it before training.

Departures from the papers: ETO trains with batch 32 and lr 1e-6 on 7B models; the defaults
here (lr 1e-5) are for LoRA/full fine-tuning of small models and are meant to be overridden.
SPPO's authors sample prompts, not multi-turn episodes; here the sequence log-prob is the sum
over agent turns (DESIGN 3).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from array import array
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch

from turnrl.config import Range
from turnrl.data.io import read_pairs, read_trajectories
from turnrl.data.pairs import check_several_samples
from turnrl.data.schema import Pair, Trajectory
from turnrl.errors import TurnRLError
from turnrl.losses import chosen_nll, dmpo_loss, dpo_loss, ipo_loss, sppo_loss, turn_logps
from turnrl.tokenization import ChatFormat, Encoded
from turnrl.train.core import (
    TrainConfig,
    Trainer,
    TrainResult,
    _make_accelerator,
    _zero_stage,
    atomic_write_json,
    check_lora_sharding,
    check_out_dir,
)
from turnrl.train.forward import pack, pack_shared, token_logps
from turnrl.train.sft import file_hash

log = logging.getLogger(__name__)

Loss = Literal["dpo", "ipo", "dmpo", "sppo"]


class PreferenceConfig(TrainConfig):
    """Settings of ``turnrl train dpo|ipo|dmpo|sppo`` (the trainer core's plus these)."""

    loss: Loss = "dpo"
    lr: float = 1e-5
    epochs: float = 3.0
    dropout: bool = False  # the reference log-probs are taken without it (TrainConfig.dropout)
    beta: float = 0.1
    """DPO / IPO / DMPO temperature."""
    label_smoothing: float = 0.0
    """Conservative DPO: the share of labels assumed flipped (DPO only)."""
    sft_weight: float = 0.0
    """alpha of an added per-token NLL of the chosen side (RPO; DPO, IPO, DMPO). 0 = the papers."""
    gamma: float = 0.7
    """DMPO's discount (the authors' code default)."""
    eta: float = 1.0
    """SPPO's target scale: the log-ratio is regressed on eta * (P - 1/2)."""
    sppo_variant: Literal["soft", "hard"] = "soft"
    """soft: targets eta (P - 1/2); hard: +eta/2 for samples with P > 1/2, -eta/2 below 1/2, 0 for a tie."""
    ref_model: str | None = None
    """Reference model; None = the starting model (adapter-disabled base under LoRA)."""
    max_length: int = 4096
    row_tokens: int = 1024
    """Tokens per packed row; a unit longer than this gets a row of its own. Under ``sdpa``
    attention runs segment by segment, so this bounds the row padding and memory; under
    ``eager`` attention is dense over a row (a 4-D mask), so shorter rows are cheaper."""
    shared_prefix: bool = True
    """Compute a unit's common prefix once (needs an attention implementation taking 4-D masks)."""
    ref_batch_tokens: int = 16384
    """Tokens per forward pass while precomputing reference log-probs."""
    history: int | None = None
    """Earlier exchanges in each turn's context, as the agent saw them when acting (``None``: the
    whole trajectory is one sequence). With a window, each turn is its own sequence (its
    :func:`~turnrl.agent.prompting.agent_view`) and a side's log-prob sums them."""

    value_ranges = {**TrainConfig.value_ranges, "beta": Range(0, lo_open=True), "sft_weight": Range(0),
                    "label_smoothing": Range(0, 0.5, hi_open=True), "gamma": Range(0, 1, lo_open=True),
                    "eta": Range(0, lo_open=True)}

    #: The losses that read each setting; the others ignore it (:meth:`check_unread`).
    read_by: ClassVar[dict[str, tuple[str, ...]]] = {
        "beta": ("dpo", "ipo", "dmpo"), "gamma": ("dmpo",), "eta": ("sppo",), "sppo_variant": ("sppo",)}

    def check_unread(self, losses: Sequence[str], key: str = "", defaults: PreferenceConfig | None = None,
                     what: str = "this run trains", given: Collection[str] | None = None) -> None:
        """One line for a setting that none of ``losses`` reads (:attr:`read_by`): it would do nothing.
        With ``given`` (the keys the user set: ``turnrl train``'s), any of them is refused, its default
        value too; without it (a pipeline's section, filled in from its defaults), one whose value differs
        from its default (the field's, or ``defaults``', the pipeline's own). Pipelines train with these
        settings under several losses (DMPO's gamma in a DPO row of ``turnrl compare``), so the trainer
        itself does not check this; the commands a user gives them to do."""
        for name, readers in self.read_by.items():
            value = getattr(self, name)
            if set(readers) & set(losses):
                continue
            if given is not None:
                if name not in given:
                    continue
            elif value == type(self).model_fields[name].default or \
                    (defaults is not None and value == getattr(defaults, name)):
                continue
            raise TurnRLError(f"{key}{name}={value}: read by loss={'/'.join(readers)} only, and {what} with "
                              f"loss={'/'.join(losses)}: remove it")

    def check_loss(self, loss: str | None = None, key: str = "") -> None:
        """One line for a setting that ``loss`` (default ``self.loss``) does not read; ``key`` is
        the section's prefix in the error (a pipeline's ``train.``)."""
        loss = loss or self.loss
        if self.sft_weight > 0 and loss == "sppo":
            raise TurnRLError(f"{key}sft_weight applies to dpo, ipo and dmpo (pairs), not to sppo")
        if self.label_smoothing > 0 and loss != "dpo":
            raise TurnRLError(f"{key}label_smoothing applies to dpo (cDPO), not to {loss}")


#: How far from 1/2 a win rate must be for ``sppo_variant=hard`` to count it a win or a loss: rounding
#: only (a win rate over K samples of an oracle's probabilities moves in far larger steps)
HARD_TIE = 1e-9


@dataclass
class Unit:
    """One training unit: its sequences (chosen then rejected, or one sample) and targets."""

    seqs: list[Encoded]
    num_turns: list[int]
    win_rate: float = 0.5
    ref: torch.Tensor | None = None  # [len(num_turns), max(num_turns)] per-turn reference log-probs
    sides: list[int] | None = None
    """Which side (chosen 0 / rejected 1) each sequence is, when a side is several per-turn views."""

    @cached_property
    def chosen_tokens(self) -> int:
        """Agent-turn tokens of the chosen side (over its per-turn views, if any); at least 1."""
        sides = self.sides if self.sides is not None else list(range(len(self.seqs)))
        return max(1, sum(sum(e.action_mask) for e, s in zip(self.seqs, sides, strict=True) if s == 0))


# ----------------------------------------------------------------------------- data


def _train_from(meta: dict[str, Any], where: str, *sides: Trajectory) -> int:
    """``meta.train_from_turn``: the first agent turn that trains (0 when absent); an integer >= 0 and
    below every side's number of agent turns (from there a side has nothing to train)."""
    v = meta.get("train_from_turn", 0)
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise TurnRLError(f"{where}: meta.train_from_turn must be an integer >= 0 (got {v!r})")
    short = [t.num_turns for t in sides if v >= t.num_turns]
    if v and short:
        raise TurnRLError(f"{where}: meta.train_from_turn={v} is past the last agent turn of a side with "
                          f"{short[0]} turn(s): nothing of it would train")
    return v


def _win_rate(meta: dict[str, Any], where: str) -> float:
    """``meta.win_rate`` of a scored SPPO sample: a number in [0, 1]."""
    if "win_rate" not in meta:
        raise TurnRLError(f"{where}: meta.win_rate missing; write SPPO data with `turnrl pairs --scored`")
    v = meta["win_rate"]
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 1:
        raise TurnRLError(f"{where}: meta.win_rate must be a number in [0, 1] (got {v!r})")
    return float(v)


def _encode(chat: ChatFormat, traj: Trajectory, start: int, max_length: int) -> Encoded | None:
    turns = list(range(start, traj.num_turns))
    if not turns:
        return None
    return chat.encode(traj.messages, trainable_turns=turns, turn_offset=-start, max_length=max_length)


def _encode_views(chat: ChatFormat, traj: Trajectory, start: int, cfg: PreferenceConfig,
                  stats: dict[str, int]) -> list[Encoded]:
    """One sequence per agent turn from ``start`` on, each the context the agent had
    (``history`` window); turn indices count from ``start``. A view longer than ``max_length``
    is left out and counted in ``stats["dropped_turns"]``."""
    from turnrl.agent.prompting import agent_view

    out = []
    for turn in range(start, traj.num_turns):
        view, local = agent_view(traj.messages, turn, cfg.history)
        enc = chat.encode(view, trainable_turns=[local], turn_offset=turn - local - start, max_length=cfg.max_length)
        if enc is not None and enc.num_turns:
            out.append(enc)
        else:
            stats["dropped_turns"] += 1
    return out


def _view_unit(chat: ChatFormat, trajs: Sequence[Trajectory], start: int, cfg: PreferenceConfig,
               stats: dict[str, int], win_rate: float = 0.5) -> Unit | None:
    """The unit of ``trajs``' per-turn views, or None when a side has none that fits (the caller
    counts it as skipped); views left out of a kept unit count in ``stats["dropped_turns"]``."""
    seqs: list[Encoded] = []
    sides: list[int] = []
    turns: list[int] = []
    dropped = {"dropped_turns": 0}
    for side, t in enumerate(trajs):
        views = _encode_views(chat, t, start, cfg, dropped)
        if not views:
            return None
        seqs += views
        sides += [side] * len(views)
        turns.append(t.num_turns - start)  # the trajectory's own T (DMPO), views cut for length or not
    stats["dropped_turns"] += dropped["dropped_turns"]
    return Unit(seqs, turns, win_rate=win_rate, sides=sides)


def load_units(path: str | Path, chat: ChatFormat, cfg: PreferenceConfig) -> tuple[list[Unit], dict[str, int]]:
    """Read pairs (or SPPO scored samples) and tokenize them into units."""
    p = Path(path)
    if not p.is_file():
        raise TurnRLError(f"{p}: {'is a directory, not a pairs file' if p.is_dir() else 'no such file'}")
    stats = {"records": 0, "skipped_too_long": 0, "skipped_identical": 0, "dropped_turns": 0}
    units: list[Unit] = []
    if cfg.loss == "sppo":
        try:
            samples = read_trajectories(p)
        except TurnRLError as e:
            if "got a 'turnrl.pair/v1' one" in str(e):  # the file of the other preference losses
                raise TurnRLError(f"{e}: sppo trains on scored samples (turnrl pairs --scored), not pairs") from None
            raise
        stats["records"] = len(samples)
        check_several_samples(samples, str(p))
        for i, t in enumerate(samples):
            where = f"{p}:{i + 1}"
            win_rate, start = _win_rate(t.meta, where), _train_from(t.meta, where, t)
            if cfg.history is not None:
                u = _view_unit(chat, [t], start, cfg, stats, win_rate)
                if u is None:
                    stats["skipped_too_long"] += 1
                else:
                    units.append(u)
                continue
            enc = _encode(chat, t, start, cfg.max_length)
            if enc is None or enc.num_turns == 0:
                stats["skipped_too_long"] += 1
                continue
            stats["dropped_turns"] += enc.dropped_turns
            units.append(Unit([enc], [enc.num_turns], win_rate=win_rate))
    else:
        pairs: list[Pair] = read_pairs(p)
        stats["records"] = len(pairs)
        for i, pair in enumerate(pairs):
            start = _train_from(pair.meta, f"{p}:{i + 1}", pair.chosen, pair.rejected)
            if cfg.history is not None:
                u = _view_unit(chat, [pair.chosen, pair.rejected], start, cfg, stats)
                if u is None:
                    stats["skipped_too_long"] += 1
                elif [s.input_ids for s, side in zip(u.seqs, u.sides or [], strict=True) if side == 0] == \
                        [s.input_ids for s, side in zip(u.seqs, u.sides or [], strict=True) if side == 1]:
                    stats["skipped_identical"] += 1  # the same views on both sides: no preference to learn
                else:
                    units.append(u)
                continue
            c = _encode(chat, pair.chosen, start, cfg.max_length)
            r = _encode(chat, pair.rejected, start, cfg.max_length)
            if c is None or r is None or c.num_turns == 0 or r.num_turns == 0:
                stats["skipped_too_long"] += 1
                continue
            if c.input_ids == r.input_ids:  # cut before the turn where they part: no preference left
                stats["skipped_identical"] += 1
                continue
            stats["dropped_turns"] += c.dropped_turns + r.dropped_turns
            # each side's T is its trajectory's (DMPO's phi(t, T)), also when max_length cut turns off:
            # the cut turns have no tokens and add nothing, the kept ones keep their weights
            units.append(Unit([c, r], [c.num_turns + c.dropped_turns, r.num_turns + r.dropped_turns]))
    if not stats["records"]:
        raise TurnRLError(f"{p}: holds no {'samples' if cfg.loss == 'sppo' else 'pairs'}")
    if not units:
        what = "samples" if cfg.loss == "sppo" else "pairs"
        parts = [f"{n} {why}" for n, why in ((stats["skipped_too_long"], f"longer than max_length={cfg.max_length} "
                                               "at their first turn, or empty"),
                                              (stats["skipped_identical"], "with the same tokens on both sides "
                                               "(as written, or once cut by max_length)")) if n]
        raise TurnRLError(f"{p}: no usable {what} ({'; '.join(parts) or 'none'})")
    return units, stats


# -------------------------------------------------------------------------- forward


def _pack(units: Sequence[Unit], cfg: PreferenceConfig, pad_id: int) -> Any:
    if cfg.shared_prefix:
        return pack_shared([u.seqs for u in units], row_tokens=cfg.row_tokens, pad_id=pad_id)
    return pack([s for u in units for s in u.seqs], row_tokens=cfg.row_tokens, pad_id=pad_id)


def unit_turn_logps(model: Any, units: Sequence[Unit], cfg: PreferenceConfig, pad_id: int) -> list[torch.Tensor]:
    """Per-turn log-prob sums of every sequence of ``units`` from one packed forward pass:
    one ``[len(unit.seqs), max(unit.num_turns)]`` tensor per unit (with grad when enabled)."""
    batch = _pack(units, cfg, pad_id)
    width = max(max(u.num_turns) for u in units)
    per_turn = turn_logps(token_logps(model, batch), batch.turn_index.to(_device(model)),
                          batch.seq_index.to(_device(model)), batch.num_seqs, width)
    out, at = [], 0
    for u in units:
        n = len(u.seqs)
        rows = per_turn[at : at + n, : max(u.num_turns)]
        if u.sides is not None:  # per-turn views: a side's turns are spread over its views' rows
            index = torch.tensor(u.sides, device=rows.device)
            rows = rows.new_zeros(len(u.num_turns), rows.shape[1]).index_add(0, index, rows)
        out.append(rows)
        at += n
    return out


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device


def _pad_turns(rows: Sequence[torch.Tensor], width: int) -> torch.Tensor:
    return torch.stack([torch.nn.functional.pad(r, (0, width - r.shape[-1])) for r in rows])


class PreferenceObjective:
    """The trainer-core objective: the chosen loss summed over units, metric sums per unit."""

    def __init__(self, cfg: PreferenceConfig, pad_id: int = 0):
        self.cfg = cfg
        self.pad_id = pad_id

    def units(self, examples: Sequence[Unit]) -> float:
        return float(len(examples))

    def __call__(self, model: Any, examples: Sequence[Unit]) -> tuple[torch.Tensor, dict[str, float]]:
        losses, metrics = self.losses(model, examples)
        return losses.sum(), {k: float(v.sum()) for k, v in metrics.items()}

    def losses(self, model: Any, examples: Sequence[Unit]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Per-unit losses and detached per-unit metrics."""
        cfg = self.cfg
        pol = unit_turn_logps(model, examples, cfg, self.pad_id)
        dev = pol[0].device
        refs = [u.ref for u in examples]
        if any(r is None for r in refs):
            raise TurnRLError("reference log-probs are missing; they are computed before training")
        ref_rows = [r.to(dev) for r in refs if r is not None]
        width = max(max(u.num_turns) for u in examples)
        if cfg.loss == "sppo":
            policy = torch.stack([p[0].sum() for p in pol])
            ref = torch.stack([r[0].sum() for r in ref_rows])
            rates = torch.tensor([u.win_rate for u in examples], dtype=torch.float64)
            if cfg.sppo_variant == "hard":
                # P-hat 1 above 1/2 and 0 below (the hard targets +-eta/2); a tie with the group is held
                # where it is (target 0), as the soft variant holds it: not pushed down as a loser. A row mean
                # of a balanced group lands a rounding step off 1/2 (0.4999999999999999 for 10 samples):
                # within HARD_TIE of 1/2 is a tie
                rates = torch.where(rates > 0.5 + HARD_TIE, 1.0, torch.where(rates < 0.5 - HARD_TIE, 0.0, 0.5))
            return sppo_loss(policy, ref, rates.to(policy.dtype).to(dev), eta=cfg.eta, variant="soft")
        pc = _pad_turns([p[0] for p in pol], width)
        pr = _pad_turns([p[1] for p in pol], width)
        rc = _pad_turns([r[0] for r in ref_rows], width)
        rr = _pad_turns([r[1] for r in ref_rows], width)
        if cfg.loss == "dmpo":
            nc = torch.tensor([u.num_turns[0] for u in examples], device=dev)
            nr = torch.tensor([u.num_turns[1] for u in examples], device=dev)
            out = dmpo_loss(pc, pr, rc, rr, nc, nr, beta=cfg.beta, gamma=cfg.gamma)
        elif cfg.loss == "ipo":
            out = ipo_loss(pc.sum(-1), pr.sum(-1), rc.sum(-1), rr.sum(-1), beta=cfg.beta)
        else:
            out = dpo_loss(pc.sum(-1), pr.sum(-1), rc.sum(-1), rr.sum(-1), beta=cfg.beta,
                           label_smoothing=cfg.label_smoothing)
        if cfg.sft_weight == 0:
            return out
        nll = chosen_nll(pc.sum(-1), torch.tensor([u.chosen_tokens for u in examples], device=dev))
        return out[0] + cfg.sft_weight * nll, {**out[1], "chosen_nll": nll.detach()}


# ------------------------------------------------------------------ reference cache


def _batches(units: Sequence[Unit], tokens: int) -> list[list[int]]:
    out: list[list[int]] = [[]]
    used = 0
    for i, u in enumerate(units):
        n = sum(len(s.input_ids) for s in u.seqs)
        if out[-1] and used + n > tokens:
            out.append([])
            used = 0
        out[-1].append(i)
        used += n
    return out


@torch.no_grad()
def compute_reference(model: Any, units: Sequence[Unit], cfg: PreferenceConfig, pad_id: int) -> list[torch.Tensor]:
    """Per-turn reference log-probs of every unit (no grad, eval mode), on the CPU."""
    was_training = model.training
    model.eval()
    out: list[torch.Tensor] = [torch.empty(0)] * len(units)
    try:
        for idx in _batches(units, max(cfg.ref_batch_tokens, cfg.row_tokens)):
            chunk = [units[i] for i in idx]
            for i, t in zip(idx, unit_turn_logps(model, chunk, cfg, pad_id), strict=True):
                out[i] = t.detach().float().cpu()
    finally:
        model.train(was_training)
    return out


def units_hash(units: Sequence[Unit]) -> str:
    """A hash of exactly what the reference reads of ``units``: each sequence's token ids, action mask
    and turn index, and how the sequences make up each unit's sides and turns. Whatever decides the
    tokens (the tokenizer's files, the chat template, the stop ids, ``history``, ``max_length``, the
    code that renders and windows a trajectory) is in it, so a reference cache is never read for other
    tokens."""
    h = hashlib.sha256()
    for u in units:
        h.update(json.dumps([len(u.seqs), u.num_turns, u.sides]).encode())
        for e in u.seqs:
            for row in (e.input_ids, e.action_mask, e.turn_index):
                h.update(len(row).to_bytes(8, "little"))
                h.update(array("q", row).tobytes())
    return h.hexdigest()[:24]


def ref_cache_path(ref_fingerprint: str, data_hash: str, cfg: PreferenceConfig, tokens_hash: str) -> Path:
    """``$TURNRL_HOME/ref_logps/<key>.pt``, the key hashing the reference's fingerprint, the data
    file's hash, the units' tokens (:func:`units_hash`: every setting that shapes them, ``history``,
    ``max_length`` and the loss's kind of unit among them) and the precision the reference runs in."""
    from turnrl.models.loading import training_dtype, turnrl_home

    key_settings: dict[str, Any] = {"mp": cfg.mixed_precision, "tokens": tokens_hash}
    if cfg.mixed_precision != "no":  # the dtype the reference loads in, run under autocast
        key_settings["weights"] = training_dtype(cfg.mixed_precision, cfg.lora is not None)
    settings = json.dumps(key_settings, sort_keys=True)
    key = hashlib.sha256(f"{ref_fingerprint}/{data_hash}/{settings}".encode()).hexdigest()[:24]
    return turnrl_home() / "ref_logps" / f"{key}.pt"


def attach_reference(units: Sequence[Unit], refs: Sequence[torch.Tensor], cache: Path | None = None) -> None:
    where = f"{cache}: " if cache is not None else ""
    if len(refs) != len(units):
        raise TurnRLError(f"{where}reference cache holds {len(refs)} entries for {len(units)} units; delete it "
                          "and rerun")
    for u, r in zip(units, refs, strict=True):
        if tuple(r.shape) != (len(u.num_turns), max(u.num_turns)):
            raise TurnRLError(f"{where}reference cache does not match the data; delete it and rerun")
        u.ref = r


def _load_cache(cache: Path) -> Any:
    """The reference log-probs cached in ``cache``; one line naming it when it cannot be read (cut)."""
    try:
        return torch.load(cache, weights_only=True)
    except Exception as e:  # noqa: BLE001  a cut file: RuntimeError, EOFError, UnpicklingError; a foreign one: KeyError
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TurnRLError(f"{cache}: the cached reference log-probs cannot be read ({first}); delete it and "
                          "rerun") from None


def _save_atomic(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:  # a file of ours: a failed open or write is an OSError, not torch's RuntimeError
            torch.save(obj, f)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


# ---------------------------------------------------------------------------- entry


def pair_metrics(model: Any, units: Sequence[Unit], cfg: PreferenceConfig, pad_id: int,
                 batch_units: int = 32) -> dict[str, float]:
    """Mean loss and metrics of ``units`` under ``model`` (no grad): held-out evaluation."""
    obj = PreferenceObjective(cfg, pad_id)
    sums: dict[str, float] = {}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for i in range(0, len(units), batch_units):
                losses, metrics = obj.losses(model, units[i : i + batch_units])
                sums["loss"] = sums.get("loss", 0.0) + float(losses.sum())
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + float(v.sum())
    finally:
        model.train(was_training)
    return {k: v / len(units) for k, v in sums.items()}


def train_preference(
    model_name: str,
    data: str | Path,
    out: str | Path,
    cfg: PreferenceConfig,
    *,
    resume: bool = False,
    eval_data: str | Path | None = None,
) -> TrainResult:
    """Tokenize, precompute (or load) reference log-probs, and run the trainer core."""
    from turnrl.models.loading import (
        load_model,
        load_tokenizer,
        model_fingerprints,
        name_fingerprint,
        resolve_model_path,
        training_dtype,
    )
    from turnrl.rollout.policies import training_chat

    cfg.check_loss()
    check_out_dir(Path(out), resume)  # a wrong --out before the reference pass, which may take minutes
    tok = load_tokenizer(model_name)
    chat = training_chat(model_name, tok)  # the sampler's stop ids
    pad_id = tok.pad_token_id or 0
    units, stats = load_units(data, chat, cfg)
    held_out = load_units(eval_data, chat, cfg)[0] if eval_data is not None else []
    dtype = training_dtype(cfg.mixed_precision, cfg.lora is not None)
    model = load_model(model_name, dtype=dtype)
    acc = _make_accelerator(cfg.mixed_precision)
    # as the trainer would, but before the reference pass, which may take minutes
    check_lora_sharding(str(acc.distributed_type), _zero_stage(acc), cfg.lora is not None)

    ref_name = cfg.ref_model or model_name
    ref_path = resolve_model_path(ref_name)
    # the units are the policy's tokens: with another reference model its tokenizer is part of the key
    tok_key = "" if cfg.ref_model is None else "/" + _tokenizer_fingerprint(tok)
    new_fp, old_fp = model_fingerprints(ref_path)
    ref_fp = new_fp + tok_key
    # runs checkpointed with an earlier fingerprint still resume: before 29 Nov 2026 another form of it,
    # before 28 Nov a hub id's name
    legacy_fps = {old_fp + tok_key} | (set() if Path(ref_path).is_dir() else {name_fingerprint(ref_path) + tok_key})
    ref: Any = None
    for group, path in ((units, Path(data)), (held_out, Path(eval_data) if eval_data else None)):
        if not group or path is None:
            continue
        cache = ref_cache_path(ref_fp, file_hash(path), cfg, units_hash(group))
        if acc.is_main_process and not cache.is_file():
            if ref is None:  # loaded once, for the training and the held-out data alike
                ref = model if cfg.ref_model is None else load_model(cfg.ref_model, dtype=dtype)
                ref.to(acc.device)
            with acc.autocast():  # the precision the policy's first step runs in: its loss starts at log 2
                refs = compute_reference(ref, group, cfg, pad_id)
            try:
                _save_atomic(refs, cache)
            except OSError as e:  # the cache is optional: one process goes on with the log-probs it holds
                if acc.num_processes > 1:
                    raise TurnRLError(f"{cache}: cannot write the reference log-probs the other processes read "
                                      f"({e.strerror}); make TURNRL_HOME writable") from None
                log.warning("%s: reference log-probs not cached (%s)", cache, e.strerror)
                attach_reference(group, refs)
                continue
        acc.wait_for_everyone()
        attach_reference(group, _load_cache(cache), cache)
    del ref

    eval_fn = None
    if held_out:
        def eval_fn(m: Any, step: int) -> dict[str, float]:
            return {f"eval_{k}": v for k, v in pair_metrics(m, held_out, cfg, pad_id).items()}

    run_config = {"algo": cfg.loss, "model": str(model_name), "data": file_hash(data), "ref": ref_fp,
                  "eval_data": file_hash(eval_data) if eval_data else None}
    out = Path(out)
    legacy = [{**run_config, "ref": fp} for fp in sorted(legacy_fps - {ref_fp})]
    trainer = Trainer(model, cfg, out, units, PreferenceObjective(cfg, pad_id), tokenizer=tok, eval_fn=eval_fn,
                      accelerator=acc, run_config=run_config, legacy_run_configs=legacy)
    trainer.check_out(resume)  # before anything is written there
    # the start's held-out metrics (kept on resume). Where the parameters are sharded (FSDP, ZeRO-3) a
    # forward gathers them from every process, so every process runs it; the main one writes it
    sharded = str(acc.distributed_type).endswith("FSDP") or _zero_stage(acc) == 3
    if held_out and not (resume and (out / "eval_start.json").is_file()) and (trainer.is_main or sharded):
        with acc.autocast():  # as training's forwards and the reference run
            start = pair_metrics(trainer.unwrapped_model, held_out, cfg, pad_id)
        if trainer.is_main:
            out.mkdir(parents=True, exist_ok=True)
            atomic_write_json(out / "eval_start.json", {f"eval_{k}": v for k, v in start.items()})
    if trainer.is_main:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / "data_stats.json", {**stats, "units": len(units)})
    return trainer.train(resume=resume)


def _tokenizer_fingerprint(tok: Any) -> str:
    """The vocabulary and chat template of ``tok``."""
    blob = json.dumps([sorted(tok.get_vocab().items()), getattr(tok, "chat_template", None)], default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
