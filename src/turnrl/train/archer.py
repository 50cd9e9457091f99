"""ArCHer: hierarchical multi-turn actor-critic (Zhou et al., ICML 2024; seed 003), and the
CHAI and online filtered-BC baselines, on one online loop.

Every iteration:

1. **collect** ``episodes_per_iteration`` episodes with the current policy (lock-step
   :class:`~turnrl.rollout.sampler.Sampler`) and add them to the replay buffer -- as
   utterance-level transitions ``(s, a, r, s', done)`` for ArCHer and CHAI, as whole
   episodes for filtered BC;
2. **critic** (ArCHer, CHAI): ``critic.steps`` steps on replay minibatches,
   ``Q_i(s,a) -> r + gamma (1 - done) Vbar_i(s')`` and ``V_i(s) -> Qbar_i(s, a_hat)``
   with ``a_hat ~ pi(.|s)`` (:func:`~turnrl.losses.archer_q_loss`,
   :func:`~turnrl.losses.archer_v_loss`; each twin against its own target twin, as in
   DESIGN 3 and the authors' code; ``v_target=min`` regresses both on the min), each step
   followed by the Polyak update ``target <- (1 - tau) target + tau online``;
3. **actor** (ArCHer, after ``warmup_iterations``): ``actor_steps`` steps on replay states
   with fresh samples ``a_hat ~ pi(.|s)``:
   ``L = -(min_i Q_i(s, a_hat) - min_i V_i(s)) * sum_h log pi(a_hat^h | s, a_hat^<h)``
   (:func:`~turnrl.losses.archer_actor_loss`; the online critic, the min over twins for
   both Q and V, as the paper);
   **CHAI** never updates the actor: it acts with the best of ``chai_k`` samples by
   ``min_i Qbar_i(s, a)`` (target critic);
   **filtered BC** takes ``bc_steps`` SFT steps (the SFT objective) on the top ``bc_top``
   fraction of the episodes in its buffer by return (ties: newest first).

The actor's and the critic's optimizer steps are the trainer core's
(:class:`~turnrl.train.core.Trainer`, driven one step at a time by :class:`OnlineTrainer`:
exact accumulation, clipping, schedule, non-finite checks, LoRA, mixed precision); both
share one ``Accelerator``, so one ``save_state`` holds actor, critic, target critic,
optimizers, schedulers and RNG states. Checkpoints (``checkpoints/iter-NNNNNN``) add the
replay buffer (``replay.jsonl``) and the loop state, written into a temporary directory and
renamed into place; a killed run resumes from the newest one and reaches the same result.

Departures from the paper (and why):

* Scale. Defaults are sized for the embedded tiny model on a CPU: 10 critic steps per
  iteration (paper 50), warm-up 5 iterations (paper 20), critic lr 1e-4 (paper 2e-5 with a
  pre-trained RoBERTa; the default critic encoder here is a small randomly initialised
  transformer, ``critic.encoder=tiny``), actor lr 1e-4 (paper 1e-6..1e-5 for GPT-2 and
  larger), 16 episodes an iteration. gamma 0.95, tau 0.1, 3 actor steps an iteration,
  capacity 1e5 and k=5 (CHAI) are the paper's.
* The ``a_hat`` of all critic minibatches of an iteration are sampled in one batched
  generate call before the critic steps (the actor does not change during them, so the
  distribution is the same as sampling per step). CHAI's ``a_hat`` is its acting policy's
  reply, the best of ``chai_k`` samples, ranked by the target critic as it is at the start of
  the iteration's critic steps (the authors rerank with the target of each step).
* The token-level baseline (the paper's optional ``b(s, a^<h)``) is supported by the loss
  function (a ``[B, H]`` baseline) but not trained here; the actor uses the utterance
  baseline ``min V(s)``.
* ``advantage_norm`` (default ``none``, the paper) can centre or whiten the actor's
  advantages within each actor batch (:func:`normalize_advantages`): with a critic that is
  still learning, the raw advantages of a batch share one sign (V regresses on the lagging
  target Q), and ``-A log pi`` with a negative mean pushes every sampled reply down.
* A reply cut by ``max_new_tokens`` is trained on the tokens it sampled only: the template's
  end-of-turn marker that closes it in every later context is context (as in PPO), so neither the
  actor's sum nor the KL term holds a token the model did not sample.
* ``actor_kl`` (default 0, the paper) adds ``actor_kl * sum_h k3`` over the sampled tokens,
  a KL penalty from the actor to the frozen starting policy (as PPO's ``beta_kl``): with a
  critic that ranks replies little better than chance the actor otherwise drifts into a
  confident malformed reply that every later batch only reinforces (docs/archer.md).
* One process: the online loop does not shard rollouts across processes (GPU users get
  bf16/LoRA through the trainer core, not multi-GPU collection).
* A truncated episode's last transition bootstraps (``done = terminated``); the paper's
  environments only terminate.
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from turnrl.agent.prompting import PromptConfig, agent_view
from turnrl.config import Config, Range
from turnrl.data.schema import Message, Trajectory
from turnrl.devices import forked_rng
from turnrl.errors import TurnRLError
from turnrl.losses import (
    archer_actor_loss,
    archer_advantage,
    archer_q_loss,
    archer_v_loss,
    kl_penalty,
    normalize_advantages,
)
from turnrl.rollout.engine import SamplingConfig
from turnrl.rollout.policies import ModelPolicy, Policy, Reply, Request
from turnrl.tokenization import ChatFormat, Encoded
from turnrl.train.core import (
    TrainConfig,
    Trainer,
    _make_accelerator,
    atomic_write_json,
    atomic_write_text,
    config_changes,
    config_facts,
    config_hash,
    has_dropout,
    quiet_tied_weight_warning,
    set_seed,
)
from turnrl.train.critic import CriticConfig, DoubleCritic, build_critic, make_target, polyak_update
from turnrl.train.forward import PackedBatch, pack, pack_runs, token_logps

Algo = Literal["archer", "chai", "filtered_bc"]
CHECKPOINTS = "checkpoints"
#: tokens of a filtered-BC example (a top episode, or one turn's view with a history window)
BC_MAX_LENGTH = 4096
ONLINE_SUMMARY = "turnrl.online_summary/v1"


class ActorConfig(TrainConfig):
    """The actor's optimisation (trainer core settings); see the module docstring for defaults."""

    lr: float = 1e-4
    batch_size: int = 16
    lr_schedule: Literal["cosine", "linear", "constant"] = "constant"
    warmup_ratio: float = 0.0
    dropout: bool = False  # the KL tether's start policy runs without it (TrainConfig.dropout)
    #: tokens per packed row in the actor's forward pass
    row_tokens: int = 4096
    #: replay states begin with the same system message and instruction: pack the actor's samples
    #: sorted by their tokens, each run's common prefix computed once (``forward.pack_runs``; needs
    #: an attention implementation taking 4-D masks: set false under ``flash_attention_2``)
    shared_prefix: bool = True


class OnlineConfig(Config):
    """Settings of ``turnrl train archer|chai|filtered-bc`` (unknown keys are errors)."""

    seed: int = 0
    env_opts: dict[str, Any] = {}
    split: str = "train"
    iterations: int = 40
    episodes_per_iteration: int = 16
    num_envs: int = 16
    capacity: int = 100_000
    gamma: float = 0.95
    tau: float = 0.1
    critic_steps: int = 10
    actor_steps: int = 3
    warmup_iterations: int = 5
    v_target: Literal["twin", "min"] = "twin"
    #: the actor's advantages within each actor batch: ``none`` (the paper), ``center``
    #: (minus the batch mean) or ``whiten`` (centred and divided by the batch std); see
    #: :func:`normalize_advantages`
    advantage_norm: Literal["none", "center", "whiten"] = "none"
    #: coefficient of a KL penalty from the actor to the starting policy on the sampled
    #: tokens (the ``k3`` estimator, :func:`~turnrl.losses.kl_penalty`); 0 = the paper
    actor_kl: float = 0.0
    chai_k: int = 5
    #: the critic reads the system message (the task instruction) as part of the state; turn
    #: off where it is the same for every task (it only costs critic compute then)
    state_system: bool = True
    bc_top: float = 0.1
    bc_steps: int = 3
    sampling: SamplingConfig = SamplingConfig(temperature=1.0, max_new_tokens=48)
    prompt: PromptConfig = PromptConfig()
    actor: ActorConfig = ActorConfig()
    critic: CriticConfig = CriticConfig()
    #: evaluate every N iterations (and before the first); 0 = never
    eval_every: int = 0
    eval_episodes: int = 100
    eval_split: str = "seen"
    eval_temperature: float = 1.0
    eval_seed: int = 12345
    #: iterations between checkpoints (the last iteration is always saved)
    save_every: int = 1
    keep_checkpoints: int = 2

    value_ranges = {**dict.fromkeys(("iterations", "episodes_per_iteration", "num_envs", "capacity", "chai_k",
                                     "eval_episodes", "save_every", "keep_checkpoints"), Range(1)),
                    **dict.fromkeys(("critic_steps", "actor_steps", "warmup_iterations", "bc_steps", "eval_every",
                                     "actor_kl", "eval_temperature"), Range(0)),
                    **dict.fromkeys(("gamma", "tau"), Range(0, 1)), "bc_top": Range(0, 1, lo_open=True)}


#: trainer-core settings of ``actor.``/``critic.`` that the online loop sets itself, each with the
#: setting that rules it instead (set there they would be ignored)
LOOP_OWNED = {"seed": "seed", "epochs": "iterations", "max_steps": "iterations", "save_every": "save_every",
              "keep_checkpoints": "keep_checkpoints", "eval_every": "eval_every",
              "log_every": "iterations (one metrics line each)"}


#: the top-level settings only some of the algorithms read, with those algorithms (the rest -- env,
#: sampling, prompt, replay, iterations, evaluation and checkpoint cadence -- every algorithm reads)
READ_BY: dict[str, tuple[str, ...]] = {
    "gamma": ("archer", "chai"), "tau": ("archer", "chai"), "critic_steps": ("archer", "chai"),
    "v_target": ("archer", "chai"), "state_system": ("archer", "chai"),
    "actor_steps": ("archer",), "warmup_iterations": ("archer",), "advantage_norm": ("archer",),
    "actor_kl": ("archer",), "chai_k": ("chai",), "bc_top": ("filtered_bc",), "bc_steps": ("filtered_bc",),
}
#: the actor's settings each algorithm reads: CHAI never trains its actor (it only runs it, at
#: ``actor.mixed_precision``, the accelerator's precision, loaded in half precision under ``actor.lora``
#: as every actor is); filtered BC's SFT objective packs without ``shared_prefix``; the critic's settings
#: only ArCHer and CHAI read
ACTOR_KEYS_UNREAD = {"chai": frozenset(ActorConfig.model_fields) - {"mixed_precision", "lora"},
                     "filtered_bc": frozenset({"shared_prefix"}), "archer": frozenset()}
#: the sizes of the phases an algorithm does not have (how many steps, how large a batch or the critic, when
#: the actor starts, the BC fraction, CHAI's k) and whether the critic reads the system message: accepted
#: unread, so that one configuration can drive the three algorithms (as tests/test_archer.py's and
#: scripts/archer_study.py's do); the other settings an algorithm does not read are refused
SHARED_SIZES = frozenset({"critic_steps", "actor_steps", "warmup_iterations", "bc_top", "bc_steps", "chai_k",
                          "state_system", "actor.batch_size", "critic.batch_size", "critic.hidden",
                          "critic.intermediate", "critic.layers", "critic.heads"})
#: the evaluation's settings, read only with ``eval_every`` > 0
EVAL_KEYS = ("eval_episodes", "eval_split", "eval_temperature", "eval_seed")


def unread_settings(cfg: OnlineConfig, algo: str) -> list[str]:
    """``key=value`` of each setting set away from its default that ``algo`` does not read (apart from
    :data:`SHARED_SIZES`), each with the algorithms that read it."""
    default = OnlineConfig()
    out = []
    for key, readers in READ_BY.items():
        if algo not in readers and key not in SHARED_SIZES and getattr(cfg, key) != getattr(default, key):
            out.append(f"{key}={getattr(cfg, key)} (read by {'/'.join(readers)} only)")
    sections = {"actor": ACTOR_KEYS_UNREAD[algo],
                "critic": frozenset(CriticConfig.model_fields) if algo == "filtered_bc" else frozenset()}
    for part, keys in sections.items():
        sub, sub_default = getattr(cfg, part), getattr(default, part)
        for key in sorted(keys - set(LOOP_OWNED)):  # the loop-owned ones are refused for every algorithm
            name = f"{part}.{key}"
            if name not in SHARED_SIZES and getattr(sub, key) != getattr(sub_default, key):
                readers = ("archer", "chai") if part == "critic" else tuple(
                    a for a in ("archer", "filtered_bc") if key not in ACTOR_KEYS_UNREAD[a])
                value = getattr(sub, key)
                shown = name if isinstance(value, Config) else f"{name}={value}"  # actor.lora: its name
                out.append(f"{shown} (read by {'/'.join(readers)} only)")
    return out


def check_online_config(cfg: OnlineConfig, algo: str | None = None) -> None:
    """Refuse, in one line naming the key, what the online loop would ignore or cannot do: a loop-owned
    trainer setting under ``actor.``/``critic.`` (:data:`LOOP_OWNED`), a critic precision other than the
    actor's (one accelerator), LoRA or gradient checkpointing on the critic (a plain module); with
    ``algo``, a setting that algorithm does not read (:func:`unread_settings`), and an evaluation
    setting without ``eval_every``."""
    for part in ("actor", "critic"):
        sub = getattr(cfg, part)
        default = type(sub)()
        for key, instead in LOOP_OWNED.items():
            if getattr(sub, key) != getattr(default, key):
                raise TurnRLError(f"{part}.{key}={getattr(sub, key)!r} is not used by the online loop; "
                                  f"set {instead} instead")
    mp = cfg.critic.mixed_precision
    if mp != type(cfg.critic)().mixed_precision and mp != cfg.actor.mixed_precision:
        raise TurnRLError(f"critic.mixed_precision={mp!r}: actor and critic share one accelerator; "
                          "set actor.mixed_precision instead")
    if cfg.critic.lora is not None:
        raise TurnRLError("critic.lora: the critic trains in full; LoRA is for the actor (actor.lora.*)")
    if cfg.critic.gradient_checkpointing:
        raise TurnRLError("critic.gradient_checkpointing: not supported by the critic (actor.gradient_checkpointing "
                          "is)")
    if algo is None:
        return
    if algo == "archer":  # the actor's -A log pi and its KL are taken at temperature 1 on replies sampled from pi
        for key, value in (("temperature", cfg.sampling.temperature), ("top_p", cfg.sampling.top_p)):
            if value != 1.0:
                raise TurnRLError(f"archer: sampling.{key}={value:g}: the actor's update takes log pi at temperature "
                                  "1 of replies sampled with these settings, so any other would bias it; leave it at 1 "
                                  "(eval_temperature sets the evaluation's)")
        if cfg.actor_steps == 0 or cfg.warmup_iterations >= cfg.iterations:
            why = ("actor_steps=0" if cfg.actor_steps == 0 else
                   f"warmup_iterations={cfg.warmup_iterations} >= iterations={cfg.iterations}")
            raise TurnRLError(f"archer: {why}: the actor would never be updated and the run would write its start; "
                              "lower warmup_iterations or raise iterations (or train the critic alone with chai)")
    unread = unread_settings(cfg, algo)
    if unread:
        raise TurnRLError(f"{algo} does not read {', '.join(unread)}; leave {'it' if len(unread) == 1 else 'them'} "
                          "out")
    if not cfg.eval_every:
        default = OnlineConfig()
        off = [f"{k}={getattr(cfg, k)}" for k in EVAL_KEYS if getattr(cfg, k) != getattr(default, k)]
        if off:
            raise TurnRLError(f"{', '.join(off)}: evaluation is off (eval_every=0); set eval_every or leave "
                              f"{'it' if len(off) == 1 else 'them'} out")


# --------------------------------------------------------------------------- data


def state_text(view: Sequence[Message | dict[str, Any]], system: bool = True) -> str:
    """What the critic reads of a state: its messages, one ``role: content`` block each
    (without the system message when ``system`` is false)."""
    out = []
    for m in view:
        role, content = (m.role, m.content) if isinstance(m, Message) else (m["role"], m["content"])
        if system or role != "system":
            out.append(f"{role}: {content}")
    return "\n".join(out)


def _plain(view: Sequence[Message]) -> list[dict[str, Any]]:
    return [{"role": m.role, "content": m.content} for m in view]


def transitions(traj: Trajectory, history: int | None, system: bool = True) -> list[dict[str, Any]]:
    """Utterance-level transitions of an episode: the agent's view before each turn (``view``,
    and as text ``s``), the turn's text ``a``, its reward ``r``, the next view's text ``s2``
    and ``done`` (1 only after the last turn of a terminated episode)."""
    n = traj.num_turns
    views = []
    for t in range(n):
        view, _ = agent_view(traj.messages, t, history)
        views.append(view[:-1])  # without turn t itself
    asst = [m for m in traj.messages if m.role == "assistant"]
    out = []
    for t in range(n):
        if t + 1 < n:
            nxt = state_text(views[t + 1], system)
            done = 0.0
        else:  # the view a turn after the last would have, as every other state is rendered
            final = Message("user", str(traj.meta.get("final_observation", "")))
            nxt = state_text(agent_view([*traj.messages, final], n, history)[0], system)
            done = 1.0 if traj.terminated else 0.0
        out.append({"view": _plain(views[t]), "s": state_text(views[t], system), "a": asst[t].content,
                    "r": float(traj.rewards[t]), "s2": nxt, "done": done, "episode": traj.id, "turn": t})
    return out


class ReplayBuffer:
    """A FIFO buffer of JSON records (transitions or episodes) with ``capacity`` entries."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise TurnRLError(f"capacity must be >= 1 (got {capacity})")
        self.capacity = capacity
        self.items: list[dict[str, Any]] = []

    def __len__(self) -> int:
        return len(self.items)

    def add(self, records: Sequence[dict[str, Any]]) -> None:
        self.items.extend(records)
        if len(self.items) > self.capacity:
            del self.items[: len(self.items) - self.capacity]

    def sample(self, rng: np.random.Generator, n: int) -> list[dict[str, Any]]:
        """``n`` records drawn uniformly with replacement."""
        idx = rng.integers(0, len(self.items), size=n)
        return [self.items[int(i)] for i in idx]

    def save(self, path: Path) -> None:
        with open(path, "w") as f:
            for r in self.items:
                f.write(json.dumps(r) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def load(self, path: Path) -> None:
        self.items = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --------------------------------------------------------------------------- trainer core, online


class OnlineTrainer(Trainer):
    """The trainer core driven one optimizer step at a time on data that changes every step.

    :meth:`step_on` makes ``examples`` the dataset and runs the core's optimizer step on
    them as one global batch (``batch_size x grad_accum`` examples), so clipping, exact
    accumulation, the schedule and the non-finite checks are the core's. ``total_steps``
    sizes the learning-rate schedule.
    """

    def __init__(self, model: Any, cfg: TrainConfig, out_dir: Path, objective: Any, *, total_steps: int,
                 accelerator: Any, tokenizer: Any = None, run_config: dict[str, Any] | None = None,
                 phase: str = "actor", checkpoints: Callable[[], list[Path]] | None = None):
        global_batch = cfg.batch_size * cfg.grad_accum * accelerator.num_processes
        cfg = cfg.model_copy(update={"max_steps": max(1, total_steps)})
        super().__init__(model, cfg, out_dir, [None] * global_batch, objective, tokenizer=tokenizer,
                         accelerator=accelerator, run_config=run_config)
        self.steps_done = 0
        self.phase = phase
        self._loop_checkpoints = checkpoints

    @property
    def examples_per_step(self) -> int:
        return self.global_batch

    def step_on(self, examples: Sequence[Any]) -> dict[str, Any]:
        if len(examples) != self.global_batch:
            raise ValueError(f"step_on needs {self.global_batch} examples, got {len(examples)}")
        self.dataset = list(examples)
        self.batches_per_epoch = 1
        # training mode on every step, as Trainer.train sets it: a model loaded by from_pretrained
        # starts in eval mode, and phases between steps (sampling, the critic's eval pass) may leave it
        # there, which would switch dropout off for some steps and not others (and differ on a resume)
        self.model.train()
        record = self._optimizer_step(self.steps_done)
        self.steps_done += 1
        return record

    def _non_finite(self, what: str, step: int) -> TurnRLError:
        ckpts = self._loop_checkpoints() if self._loop_checkpoints is not None else []
        return TurnRLError(f"non-finite {what} in the {self.phase} update (its step {step + 1}); the last "
                           f"checkpoint ({ckpts[-1].name if ckpts else 'none'}) is intact")


@dataclass
class CriticExample:
    s: str
    a: str
    r: float
    done: float
    target_v1_next: float
    target_v2_next: float
    target_q1_hat: float
    target_q2_hat: float


class CriticObjective:
    """ArCHer's critic loss (Q and V terms summed); units = transitions."""

    def __init__(self, gamma: float, v_use_min: bool):
        self.gamma = gamma
        self.v_use_min = v_use_min

    def units(self, examples: Sequence[CriticExample]) -> float:
        return float(len(examples))

    def __call__(self, model: Any, examples: Sequence[CriticExample]) -> tuple[torch.Tensor, dict[str, float]]:
        out = model([e.s for e in examples], [e.a for e in examples])
        dev = out["q1"].device

        def col(name: str) -> torch.Tensor:
            return torch.tensor([getattr(e, name) for e in examples], dtype=torch.float32, device=dev)

        q_loss, qm = archer_q_loss(out["q1"], out["q2"], col("r"), col("done"), col("target_v1_next"),
                                   col("target_v2_next"), self.gamma)
        v_loss, vm = archer_v_loss(out["v1"], out["v2"], col("target_q1_hat"), col("target_q2_hat"),
                                   use_min=self.v_use_min)
        metrics = {"q_loss": float(q_loss.detach().sum()), "v_loss": float(v_loss.detach().sum()),
                   "q1": float(qm["q1"].sum()), "v1": float(vm["v1"].sum())}
        return (q_loss + v_loss).sum(), metrics


@dataclass
class ActorExample:
    enc: Encoded
    value: float
    baseline: float


class ActorObjective:
    """ArCHer's actor loss ``-(q - b) * sum_h log pi``, plus ``kl_coef * sum_h k3(pi, pi_ref)``
    over the sampled tokens when ``kl_coef`` > 0; units = sampled utterances.

    ``pi_ref`` is ``ref`` (a frozen copy of the starting policy) or, with ``ref=None``, the
    trained model with its LoRA adapter disabled (under LoRA the base weights are the start).
    With ``shared_prefix`` the samples are packed as :meth:`pack` says (the same log-probs)."""

    def __init__(self, row_tokens: int, pad_id: int, ref: Any = None, kl_coef: float = 0.0,
                 shared_prefix: bool = True):
        self.row_tokens = row_tokens
        self.pad_id = pad_id
        self.ref = ref
        self.kl_coef = kl_coef
        self.shared_prefix = shared_prefix

    def units(self, examples: Sequence[ActorExample]) -> float:
        return float(len(examples))

    def pack(self, examples: Sequence[ActorExample]) -> tuple[list[ActorExample], PackedBatch]:
        """The examples in packing order, and their packed batch. With ``shared_prefix`` they are
        sorted by their tokens, so that neighbours share the most (replay states of one environment
        share at least the system message and the instruction), and packed as one run of
        :func:`~turnrl.train.forward.pack_runs`: each unit, as many neighbours as fit a row, has its
        common prefix computed once. The loss is a sum over examples, so the order is free."""
        if not self.shared_prefix:
            return list(examples), pack([e.enc for e in examples], row_tokens=self.row_tokens, pad_id=self.pad_id)
        ordered = sorted(examples, key=lambda e: e.enc.input_ids)
        return ordered, pack_runs([e.enc for e in ordered], [0] * len(ordered), row_tokens=self.row_tokens,
                                  pad_id=self.pad_id)

    def __call__(self, model: Any, examples: Sequence[ActorExample]) -> tuple[torch.Tensor, dict[str, float]]:
        examples, batch = self.pack(examples)
        lp = token_logps(model, batch)
        b = len(examples)
        seq = batch.seq_index.to(lp.device)
        k = lp.shape[0]
        ar = torch.arange(k, device=lp.device)
        # a sequence's kept tokens are contiguous and in order (forward's layout), so a token's
        # position in its utterance is its index minus its sequence's first index
        first = torch.full((b,), k, dtype=torch.long, device=lp.device).scatter_reduce(0, seq, ar, reduce="amin")
        pos = ar - first[seq]
        width = int(pos.max().item()) + 1 if k else 1
        padded = lp.new_zeros(b, width).index_put((seq, pos), lp)
        mask = torch.zeros(b, width, device=lp.device).index_put((seq, pos), torch.ones_like(lp))
        value = torch.tensor([e.value for e in examples], dtype=torch.float32, device=lp.device)
        base = torch.tensor([e.baseline for e in examples], dtype=torch.float32, device=lp.device)
        losses, m = archer_actor_loss(padded, mask, value, base)
        total = losses.sum()
        metrics = {"advantage": float(m["advantage"].sum()), "logp": float(m["logp"].sum())}
        if self.kl_coef > 0:
            kl = kl_penalty(lp, self.ref_logps(model, batch), "k3").sum()
            total = total + self.kl_coef * kl
            metrics["kl"] = float(kl.detach())  # summed over tokens: per utterance once divided by units
        return total, metrics

    @torch.no_grad()
    def ref_logps(self, model: Any, batch: Any) -> torch.Tensor:
        if self.ref is not None:
            return token_logps(self.ref, batch)
        was = model.training
        model.eval()
        try:
            with model.disable_adapter():
                return token_logps(model, batch)
        finally:
            model.train(was)


# --------------------------------------------------------------------------- policies


class CriticRerankPolicy:
    """CHAI: sample ``k`` replies per state from the base policy, act with the best by
    ``min_i Qbar_i(s, a)`` of the target critic."""

    name = "chai"

    def __init__(self, base: ModelPolicy, score: Callable[[list[str], list[str]], torch.Tensor], k: int,
                 system: bool = True):
        self.base = base
        self.system = system
        self.score = score
        self.k = k

    def act(self, requests: Sequence[Request]) -> list[Reply]:
        expanded = [r for r in requests for _ in range(self.k)]
        replies = self.base.act(expanded)
        states = [state_text(agent_view(r.messages, r.turn, self.base.history)[0], self.system) for r in expanded]
        scores = self.score(states, [r.content for r in replies]).view(len(requests), self.k)
        best = scores.argmax(dim=1).tolist()
        return [replies[i * self.k + j] for i, j in enumerate(best)]


# --------------------------------------------------------------------------- the online loop


class OnlineRun:
    """The online loop shared by ArCHer, CHAI and filtered BC (see the module docstring)."""

    def __init__(self, algo: Algo, model_name: str, env_name: str, out: str | Path, cfg: OnlineConfig):
        from turnrl.collect import make_env_factory
        from turnrl.models.loading import load_model, load_tokenizer, training_dtype
        from turnrl.rollout.engine import HFEngine
        from turnrl.rollout.policies import _gen_eos

        if algo not in ("archer", "chai", "filtered_bc"):
            raise TurnRLError(f"unknown online algorithm {algo!r}")
        check_online_config(cfg, algo)
        self.algo: Algo = algo
        self.cfg = cfg
        self.out = Path(out)
        self.env_name = env_name
        self.model_name = str(model_name)
        self.make_env = make_env_factory(env_name, cfg.env_opts)
        probe = self.make_env()
        try:
            for split in (cfg.split, cfg.eval_split):
                if split not in ("train", "seen", "unseen"):
                    raise TurnRLError(f"unknown split '{split}'; choose from: train, seen, unseen")
                if not probe.task_ids(split):
                    raise TurnRLError(f"{env_name}: split '{split}' has no tasks")
        finally:
            probe.close()
        set_seed(cfg.seed)
        self.tok = load_tokenizer(model_name)
        mp = cfg.actor.mixed_precision
        model = load_model(model_name, dtype=training_dtype(mp, cfg.actor.lora is not None))
        self.chat = ChatFormat(self.tok, extra_stop_ids=_gen_eos(model))
        self.accelerator = _make_accelerator(mp)
        if self.accelerator.num_processes > 1:
            raise TurnRLError("the online loop runs in one process; launch it without accelerate's multi-process")
        online = cfg.model_dump(mode="json")
        # ``dropout`` (added 29 Nov 2026) is hashed only where it changes what trains, as in the trainer
        # core: turned off in an actor that has dropout, or in the critic; so earlier runs still resume
        actor_same = cfg.actor.dropout or not has_dropout(model, cfg.actor)
        if actor_same:
            online["actor"].pop("dropout", None)
        if cfg.critic.dropout:
            online["critic"].pop("dropout", None)
        self.run_config = {"algo": algo, "model": self.model_name, "env": env_name, "online": online}
        # a resume may change when it checkpoints (as the trainer core's, docs/training.md)
        cadence = ("save_every", "keep_checkpoints")
        exempt = frozenset({"dropout"}) if actor_same else frozenset()
        hashed = {**self.run_config, "online": {k: v for k, v in online.items() if k not in cadence}}
        self.config_hash = config_hash(cfg.actor, hashed, exempt=exempt)
        self.config_facts = config_facts(cfg.actor, hashed, exempt=exempt)
        # before 28 Nov 2026 the cadence was hashed too
        self.legacy_hash = config_hash(cfg.actor, self.run_config, exempt=exempt)
        self.rng = np.random.default_rng([cfg.seed, 7])
        uses_critic = algo in ("archer", "chai")
        uses_actor_trainer = algo in ("archer", "filtered_bc")
        self.actor_trainer: OnlineTrainer | None = None
        self.critic_trainer: OnlineTrainer | None = None
        self.critic: DoubleCritic | None = None
        self.target: Any = None
        if uses_actor_trainer:
            actor_cfg = cfg.actor.model_copy(update={"seed": cfg.seed})
            if algo == "archer":
                steps = max(1, (cfg.iterations - cfg.warmup_iterations) * cfg.actor_steps)
                ref = None
                if cfg.actor_kl > 0 and actor_cfg.lora is None:
                    # the starting policy, frozen: copied before a resumed state is loaded into the actor
                    ref = copy.deepcopy(model).eval().requires_grad_(False).to(self.accelerator.device)
                objective: Any = ActorObjective(actor_cfg.row_tokens, self.tok.pad_token_id or 0, ref, cfg.actor_kl,
                                                actor_cfg.shared_prefix)
            else:
                from turnrl.train.sft import SFTObjective

                steps = cfg.iterations * cfg.bc_steps
                objective = SFTObjective(actor_cfg.row_tokens, self.tok.pad_token_id or 0)
            self.actor_trainer = OnlineTrainer(model, actor_cfg, self.out, objective, total_steps=steps,
                                               accelerator=self.accelerator, tokenizer=self.tok,
                                               run_config=self.run_config, phase="actor",
                                               checkpoints=self.checkpoints)
            model = self.actor_trainer.unwrapped_model
        else:  # CHAI's actor is frozen: no trainer places it
            model.to(self.accelerator.device)
        self.actor = model
        if uses_critic:
            critic_cfg = cfg.critic.model_copy(update={"seed": cfg.seed, "mixed_precision": mp})
            critic = build_critic(critic_cfg, self.tok, seed=cfg.seed)
            self.target = make_target(critic)
            self.critic_trainer = OnlineTrainer(critic, critic_cfg, self.out / "critic",
                                                CriticObjective(cfg.gamma, cfg.v_target == "min"),
                                                total_steps=cfg.iterations * cfg.critic_steps,
                                                accelerator=self.accelerator, phase="critic",
                                                checkpoints=self.checkpoints)
            self.critic = self.critic_trainer.unwrapped_model
            self.target.to(self.accelerator.device)
            self.accelerator.register_for_checkpointing(self.target)
        self.engine = HFEngine(self.actor, self.tok, self.chat.stop_token_ids, autocast=self.accelerator.autocast)
        self.replay = ReplayBuffer(cfg.capacity)
        self.iteration = 0
        self.env_steps = 0
        self.episodes = 0
        self.history: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ policies

    def model_policy(self, temperature: float | None = None) -> ModelPolicy:
        sampling = self.cfg.sampling if temperature is None else self.cfg.sampling.model_copy(
            update={"temperature": temperature})
        return ModelPolicy(self.engine, self.chat, sampling, history=self.cfg.prompt.history, name=self.algo)

    def policy(self, temperature: float | None = None) -> Policy:
        """The acting policy: the actor, or for CHAI the actor reranked by the target critic."""
        base = self.model_policy(temperature)
        if self.algo == "chai":
            return CriticRerankPolicy(base, self.target_min_q, self.cfg.chai_k, self.cfg.state_system)
        return base

    @torch.no_grad()
    def target_min_q(self, states: list[str], actions: list[str]) -> torch.Tensor:
        assert self.target is not None
        self.target.eval()
        q1, q2 = self.target.q(states, actions)
        return torch.minimum(q1, q2).float().cpu()

    def sample_actions(self, views: Sequence[list[dict[str, Any]]]) -> list[Message]:
        """``a_hat ~ pi(.|s)`` for each view, as assistant messages carrying the sampled ids."""
        gens = self.engine.generate([self.chat.prompt_ids(v) for v in views], self.cfg.sampling)
        return [Message("assistant", self.chat.reply_text(g.token_ids, g.finished), token_ids=list(g.token_ids),
                        logprobs=list(g.logprobs), cut=None if g.finished else True)  # as the sampler marks a cut
                for g in gens]

    def critic_actions(self, batch: Sequence[dict[str, Any]]) -> list[str]:
        """``a_hat`` of the V target for each transition: a reply of the acting policy -- the actor's
        sample (ArCHer), the best of ``chai_k`` actor samples by the target critic's min Q (CHAI, as
        the authors' ``CHAIAgent.get_action`` in their critic loss)."""
        views = [t["view"] for t in batch]
        if self.algo != "chai":
            return [m.content for m in self.sample_actions(views)]
        k = self.cfg.chai_k
        cands = [m.content for m in self.sample_actions([v for v in views for _ in range(k)])]
        scores = self.target_min_q([t["s"] for t in batch for _ in range(k)], cands).view(len(batch), k)
        return [cands[i * k + j] for i, j in enumerate(scores.argmax(dim=1).tolist())]

    # ------------------------------------------------------------------ phases

    def collect(self) -> list[Trajectory]:
        from turnrl.rollout.sampler import Sampler, plan_episodes

        cfg = self.cfg
        probe = self.make_env()
        try:
            specs = plan_episodes(probe, cfg.split, cfg.episodes_per_iteration, cfg.seed,
                                  start=self.iteration * cfg.episodes_per_iteration)
        finally:
            probe.close()
        sampler = Sampler(self.make_env, self.policy(), env_name=self.env_name, num_envs=cfg.num_envs,
                          prompt=cfg.prompt, source="policy")
        try:
            return sampler.run(specs)
        finally:
            sampler.close()

    def critic_phase(self) -> dict[str, float]:
        assert self.critic_trainer is not None and self.critic is not None
        cfg, ct = self.cfg, self.critic_trainer
        n = ct.examples_per_step
        batches = [self.replay.sample(self.rng, n) for _ in range(cfg.critic_steps)]
        flat = [t for b in batches for t in b]
        a_hat = self.critic_actions(flat) if flat else []
        sums: dict[str, float] = {}
        for j, batch in enumerate(batches):
            hats = a_hat[j * n : (j + 1) * n]
            with torch.no_grad():
                self.target.eval()
                tq1, tq2 = self.target.q([t["s"] for t in batch], hats)
                tv1, tv2 = self.target.v([t["s2"] for t in batch])
            examples = [
                CriticExample(t["s"], t["a"], t["r"], t["done"], float(tv1[i]), float(tv2[i]), float(tq1[i]),
                              float(tq2[i]))
                for i, t in enumerate(batch)
            ]
            rec = ct.step_on(examples)
            polyak_update(self.target, self.critic, cfg.tau)
            for k in ("loss", "q_loss", "v_loss", "q1", "v1", "grad_norm"):
                sums[k] = sums.get(k, 0.0) + float(rec.get(k, 0.0))
        return {f"critic/{k}": v / max(1, len(batches)) for k, v in sums.items()}

    def actor_phase(self) -> dict[str, float]:
        assert self.actor_trainer is not None and self.critic is not None
        at = self.actor_trainer
        sums: dict[str, float] = {}
        for _ in range(self.cfg.actor_steps):
            batch = self.replay.sample(self.rng, at.examples_per_step)
            views = [t["view"] for t in batch]
            hats = self.sample_actions(views)
            with torch.no_grad():
                self.critic.eval()
                out = self.critic([t["s"] for t in batch], [m.content for m in hats])
                self.critic.train()
            raw = archer_advantage(out["q1"], out["q2"], out["v1"], out["v2"])
            adv = normalize_advantages(raw, self.cfg.advantage_norm)
            value = torch.minimum(out["q1"], out["q2"])
            examples = []
            for i, (view, hat) in enumerate(zip(views, hats, strict=True)):
                n_asst = sum(1 for m in view if m["role"] == "assistant")
                enc = self.chat.encode([*view, hat], trainable_turns=[n_asst])
                if enc is None or enc.num_turns == 0:
                    raise TurnRLError("an actor sample has no trainable tokens")
                examples.append(ActorExample(enc, float(value[i]), float(value[i] - adv[i])))
            rec = at.step_on(examples)
            rec["raw_advantage"] = float(raw.mean())
            rec["raw_advantage_std"] = float(raw.std()) if raw.numel() > 1 else 0.0
            rec["q"] = float(value.mean())
            for k in ("loss", "advantage", "logp", "kl", "grad_norm", "raw_advantage", "raw_advantage_std", "q"):
                if k in rec:  # kl only where actor_kl > 0 computes it (a logged 0 would read as no drift)
                    sums[k] = sums.get(k, 0.0) + float(rec[k])
        return {f"actor/{k}": v / self.cfg.actor_steps for k, v in sums.items()}

    def bc_phase(self) -> dict[str, float]:
        assert self.actor_trainer is not None
        from turnrl.data.io import trajectory_from_dict
        from turnrl.train.sft import encode_trajectories

        at = self.actor_trainer
        ranked = sorted(range(len(self.replay)), key=lambda i: (-self.replay.items[i]["return"], -i))
        top = [self.replay.items[i] for i in ranked[: max(1, math.ceil(self.cfg.bc_top * len(ranked)))]]
        trajs = [trajectory_from_dict(d) for d in top]
        # turns past 4096 tokens are dropped and an episode longer at its first turn is skipped:
        # counted in the metrics (bc/dropped_turns, bc/skipped_too_long), not silent
        examples, stats = encode_trajectories(trajs, self.chat, max_length=BC_MAX_LENGTH,
                                              history=self.cfg.prompt.history)
        cut = {f"bc/{k}": float(stats[k]) for k in ("dropped_turns", "skipped_too_long")}
        if not examples:
            return cut
        sums: dict[str, float] = {}
        for _ in range(self.cfg.bc_steps):
            idx = self.rng.integers(0, len(examples), size=at.examples_per_step)
            rec = at.step_on([examples[int(i)] for i in idx])
            for k in ("loss", "grad_norm"):
                sums[k] = sums.get(k, 0.0) + float(rec.get(k, 0.0))
        out = {f"bc/{k}": v / self.cfg.bc_steps for k, v in sums.items()}
        out["bc/top_return"] = float(np.mean([d["return"] for d in top]))
        return {**out, **cut}

    def evaluate(self) -> dict[str, float]:
        """Mean return of the acting policy on ``eval_episodes`` fixed episodes of ``eval_split``
        (RNG forked: evaluation never changes the training randomness)."""
        from turnrl.rollout.sampler import Sampler, plan_episodes

        cfg = self.cfg
        probe = self.make_env()
        try:
            specs = plan_episodes(probe, cfg.eval_split, cfg.eval_episodes, cfg.eval_seed)
        finally:
            probe.close()
        with forked_rng(cfg.eval_seed):
            sampler = Sampler(self.make_env, self.policy(cfg.eval_temperature), env_name=self.env_name,
                              num_envs=max(cfg.num_envs, 32), prompt=cfg.prompt)
            try:
                trajs = sampler.run(specs)
            finally:
                sampler.close()
        rets = [t.return_ for t in trajs]
        return {"eval/return": float(np.mean(rets)), "eval/success": float(np.mean([t.success for t in trajs])),
                "eval/episodes": float(len(trajs))}

    def iterate(self) -> dict[str, Any]:
        cfg = self.cfg
        t0 = time.time()
        trajs = self.collect()
        steps = sum(t.num_turns for t in trajs)
        self.env_steps += steps
        self.episodes += len(trajs)
        if self.algo == "filtered_bc":
            self.replay.add([t.to_dict() for t in trajs])
        else:
            self.replay.add([tr for t in trajs for tr in transitions(t, cfg.prompt.history, cfg.state_system)])
        record: dict[str, Any] = {
            "iteration": self.iteration + 1, "env_steps": self.env_steps, "episodes": self.episodes,
            "train/return": float(np.mean([t.return_ for t in trajs])),
            "train/success": float(np.mean([t.success for t in trajs])),
            "train/invalid": _invalid(trajs), "replay": len(self.replay),
        }
        if self.critic_trainer is not None:
            record.update(self.critic_phase())
        if self.algo == "archer" and self.iteration + 1 > cfg.warmup_iterations:
            record.update(self.actor_phase())
        if self.algo == "filtered_bc":
            record.update(self.bc_phase())
        self.iteration += 1
        if cfg.eval_every and (self.iteration % cfg.eval_every == 0 or self.iteration == cfg.iterations):
            record.update(self.evaluate())
        record["time"] = round(time.time() - t0, 3)
        return record

    # ------------------------------------------------------------------ checkpoints

    def _ckpt_root(self) -> Path:
        return self.out / CHECKPOINTS

    def checkpoints(self) -> list[Path]:
        root = self._ckpt_root()
        if not root.is_dir():
            return []
        found = [(int(d.name.split("-")[1]), d) for d in root.iterdir()
                 if d.name.startswith("iter-") and ".tmp" not in d.name and (d / "loop_state.json").is_file()]
        return [d for _, d in sorted(found)]

    def save_checkpoint(self) -> None:
        root = self._ckpt_root()
        root.mkdir(parents=True, exist_ok=True)
        name = f"iter-{self.iteration:06d}"
        tmp = root / f"{name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        if self.accelerator._models:
            with quiet_tied_weight_warning(*self.accelerator._models):  # the tied LM head is stored once, as in SFT
                self.accelerator.save_state(str(tmp / "state"))
        self.replay.save(tmp / "replay.jsonl")
        torch.save({"torch_rng": torch.get_rng_state()}, tmp / "rng.pt")
        atomic_write_json(tmp / "loop_state.json", {
            "iteration": self.iteration, "env_steps": self.env_steps, "episodes": self.episodes,
            "config_hash": self.config_hash, "config": self.config_facts, "np_rng": self.rng.bit_generator.state,
            "actor_steps": self.actor_trainer.steps_done if self.actor_trainer else 0,
            "critic_steps": self.critic_trainer.steps_done if self.critic_trainer else 0,
        })
        final = root / name
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in self.checkpoints()[: -max(1, self.cfg.keep_checkpoints)]:
            shutil.rmtree(old, ignore_errors=True)

    def load_checkpoint(self, ckpt: Path) -> None:
        state = json.loads((ckpt / "loop_state.json").read_text())
        if state.get("config_hash") not in (self.config_hash, self.legacy_hash):
            raise TurnRLError(f"{ckpt}: the config changed since this checkpoint was written"
                              f"{config_changes(state.get('config'), self.config_facts)}; resume with the same "
                              "config or choose another --out")
        if (ckpt / "state").is_dir():
            self.accelerator.load_state(str(ckpt / "state"))
        self.replay.load(ckpt / "replay.jsonl")
        torch.set_rng_state(torch.load(ckpt / "rng.pt")["torch_rng"])
        self.rng.bit_generator.state = state["np_rng"]
        self.iteration = int(state["iteration"])
        self.env_steps = int(state["env_steps"])
        self.episodes = int(state["episodes"])
        if self.actor_trainer is not None:
            self.actor_trainer.steps_done = int(state["actor_steps"])
        if self.critic_trainer is not None:
            self.critic_trainer.steps_done = int(state["critic_steps"])

    # ------------------------------------------------------------------ run

    def check_out(self, ckpts: Sequence[Path]) -> None:
        """Refuse an ``--out`` holding what this run would replace and is not one of the online loop's runs:
        another command's ``summary.json`` or checkpoints, or (with no checkpoint of this loop beside them) a
        ``model/``, ``adapter/`` or ``critic.pt`` -- the user's, perhaps the input model -- as the trainer
        core refuses them. With a checkpoint they are this run's, written by a final save it did not finish."""
        from turnrl.train.core import list_checkpoints

        summary_path = self.out / "summary.json"
        if summary_path.exists():
            try:
                schema = json.loads(summary_path.read_text()).get("schema")
            except (json.JSONDecodeError, AttributeError, UnicodeDecodeError):
                schema = None
            if schema == ONLINE_SUMMARY:
                return  # a finished online run: run() answers it
            raise TurnRLError(f"{summary_path}: the summary of another command's run ({schema or 'no schema'}), not "
                              "of an online run; choose another --out")
        if list_checkpoints(self.out):
            raise TurnRLError(f"{self._ckpt_root()}: holds another command's checkpoints (step-N), not an online "
                              "run's; choose another --out")
        if not ckpts:
            for name in ("model", "adapter", "critic.pt"):
                if (self.out / name).exists():
                    raise TurnRLError(f"{self.out / name}: exists and is no run's output (no checkpoint of an "
                                      "online run beside it); the final save would replace it: choose another --out")

    def run(self, resume: bool = False) -> dict[str, Any]:
        cfg = self.cfg
        summary_path = self.out / "summary.json"
        ckpts = self.checkpoints()
        self.check_out(ckpts)
        if summary_path.exists():
            done = json.loads(summary_path.read_text())
            if done.get("schema") == ONLINE_SUMMARY:
                if not resume:
                    raise TurnRLError(f"{self.out}: already holds a finished run; choose another --out")
                if done.get("config_hash") not in (self.config_hash, self.legacy_hash):  # as a checkpoint would
                    raise TurnRLError(f"{self.out}: the config changed since this run finished; resume with the "
                                      "same config or choose another --out")
                return dict(done)
        if ckpts and not resume:
            raise TurnRLError(f"{self.out}: already holds a run; pass --resume to continue it or choose another --out")
        self.out.mkdir(parents=True, exist_ok=True)
        root = self._ckpt_root()
        if root.is_dir():
            for d in root.iterdir():
                if ".tmp" in d.name:
                    shutil.rmtree(d, ignore_errors=True)
        if ckpts:
            self.load_checkpoint(ckpts[-1])
        metrics_path = self.out / "metrics.jsonl"
        self.history = [r for r in _read_jsonl(metrics_path) if int(r.get("iteration", 0)) <= self.iteration]
        # the lines past the checkpoint go; atomically, so a kill now cannot lose the ones before it
        atomic_write_text(metrics_path, "".join(json.dumps(r) + "\n" for r in self.history))
        if self.iteration == 0 and cfg.eval_every and not self.history:
            start = {"iteration": 0, "env_steps": 0, "episodes": 0, **self.evaluate()}
            self.history.append(start)
            with open(metrics_path, "a") as f:
                f.write(json.dumps(start) + "\n")
        t0 = time.time()
        with open(metrics_path, "a") as f:
            while self.iteration < cfg.iterations:
                record = self.iterate()
                self.history.append(record)
                f.write(json.dumps(record) + "\n")
                f.flush()
                if self.iteration % cfg.save_every == 0 or self.iteration == cfg.iterations:
                    self.save_checkpoint()
        return self._finish(time.time() - t0)

    def _finish(self, elapsed: float) -> dict[str, Any]:
        out = self.out
        if self.actor_trainer is not None:
            # the core's summary.json is not written: this run's summary (below) comes after critic.pt
            self.actor_trainer._save_final(float(self.history[-1].get("actor/loss", math.nan)) if self.history
                                           else math.nan, elapsed, summary=False)
        else:
            model_dir = out / "model"
            shutil.rmtree(model_dir, ignore_errors=True)
            self.actor.save_pretrained(str(model_dir))
            self.tok.save_pretrained(str(model_dir))
        if self.critic is not None:
            torch.save({"critic": _cpu(self.critic.state_dict()), "target": _cpu(self.target.state_dict()),
                        "config": self.cfg.critic.model_dump(mode="json")}, out / "critic.pt")
        evals = [r for r in self.history if "eval/return" in r]
        summary = {
            "schema": ONLINE_SUMMARY, "algo": self.algo, "iterations": self.iteration, "env_steps": self.env_steps,
            "episodes": self.episodes, "model_dir": str(out / "model"), "config_hash": self.config_hash,
            "run_config": self.run_config, "elapsed_s": round(elapsed, 3),
            "final_train_return": self.history[-1].get("train/return") if self.history else None,
            "eval": [{"iteration": r["iteration"], "env_steps": r["env_steps"], "return": r["eval/return"],
                      "success": r["eval/success"]} for r in evals],
        }
        atomic_write_json(out / "summary.json", summary)
        return summary


def _cpu(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict on the CPU: a saved ``critic.pt`` loads on a machine without a GPU."""
    return {k: v.detach().cpu() for k, v in state.items()}


def _invalid(trajs: Sequence[Trajectory]) -> float:
    turns = [m for t in trajs for m in t.messages if m.role == "assistant"]
    return sum(1 for m in turns if m.valid is False) / max(1, len(turns))


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line torn by a kill
            if isinstance(row, dict):
                rows.append(row)
    return rows


def train_online(algo: Algo, model: str, env: str, out: str | Path, cfg: OnlineConfig, *,
                 resume: bool = False) -> dict[str, Any]:
    """Run ArCHer, CHAI or filtered BC (``algo``) online on ``env``; returns ``summary.json``'s content."""
    return OnlineRun(algo, model, env, out, cfg).run(resume=resume)
