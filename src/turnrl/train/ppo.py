"""RLFT: token-level PPO on chain-of-thought + action (Schmied et al., "LLMs are Greedy
Agents", 2025; seed 004; DESIGN 3 "RLFT").

One iteration:

1. **Rollout.** ``episodes_per_iter`` episodes of the current policy on the env's
   ``split`` through the lock-step :class:`~turnrl.rollout.sampler.Sampler` (one batched
   ``generate`` per env step; temperature 1.0; at most ``max_new_tokens`` = the thinking
   budget G tokens a reply). The prompt is the instruction + output instruction + the last
   ``C`` steps: the bandit envs render their last ``context`` = C steps as
   ``Step=i Action=a Reward=r`` lines in every observation, so ``history=0`` (the default)
   gives exactly the paper's prompt; for other envs ``history=C`` keeps the last C
   (observation, action) exchanges. The action is the last valid ``ACTION=X`` (or
   ``Action: X``) in the reply; with none, a random valid action is executed and
   ``invalid_penalty`` (-5) is added to that step's reward. With ``epsilon`` > 0 a step
   takes a uniformly random action instead of asking the model (epsilon-greedy; those
   turns have no sampled tokens and are not trained on, their rewards count for earlier
   turns' returns).
2. **Rewards.** ``r_t = env_r_t / std(env_r of the batch)`` (``reward_norm``) +
   ``invalid_penalty`` on invalid turns + ``exploration_bonus`` when the executed action
   had not been executed before in the episode. ``reward_source=expected`` takes ``env_r_t``
   as its expected value given the executed action (the bandits: the pulled arm's mean,
   ``Trajectory.meta["expected_rewards"]``) instead of the sampled reward.
3. **Advantages.** ``advantage=mc`` (default for the bandit envs, whose episodes all have
   the same length): Monte-Carlo rewards-to-go minus the batch mean of the same step's
   return (:func:`~turnrl.losses.rewards_to_go`,
   :func:`~turnrl.losses.batch_baseline_advantages`; with ``group_size`` G > 1 each task is
   played G times and the baseline is the mean of the other G - 1 episodes of the task,
   :func:`~turnrl.losses.group_baseline_advantages`); ``advantage=gae`` (default
   elsewhere, e.g. tic-tac-toe): a value head (a linear layer on the last hidden state at
   the last prompt token of each turn, ``model.value_head``) and
   :func:`~turnrl.losses.gae`; the value head trains with
   :func:`~turnrl.losses.value_loss` (``vf_coef``, optional ``value_clip``). The final
   model folder keeps the head apart, in ``model/parts/value_head.safetensors`` (the model loads
   without unexpected keys, in vLLM too), and PPO continued from such a folder starts from that head.
   Advantages are standardised over the batch's trained turns (``adv_norm``).
4. **Updates.** ``ppo_epochs`` passes over the episodes in ``minibatches`` minibatches;
   every minibatch is one optimizer step of the trainer core
   (:class:`~turnrl.train.core.Trainer`: exact accumulation over ``batch_size``-episode
   micro-batches, AdamW, warm-up + cosine, gradient clipping 1.0, LoRA, checkpoints,
   ``metrics.jsonl``). The loss is :func:`~turnrl.losses.ppo_loss` per action token
   (clip 0.2, ``beta_kl`` 0.05 x KL(pi_theta || pi_ref) with the ``k3`` per-token
   estimator by default, ``k1``, or ``kl_estimator=full`` for the exact full-vocabulary
   KL), averaged over the action tokens of the minibatch. The per-token estimators' gradient
   (``kl_gradient``): ``pathwise`` (default; GRPO's) differentiates the estimate through the
   sampled token's log-prob, which for k3 is in expectation the gradient of KL(pi_ref ||
   pi_theta), and for k1 is 0 (so k1 needs ``full``); ``full`` adds the score-function term,
   which gives the gradient of KL(pi_theta || pi_ref) that the objective names. ``pi_old`` log-probs (and old
   values) are recomputed with one no-grad pass at the start of the iteration, so the
   ratio is 1 on the first minibatch (up to float rounding between packings);
   ``pi_ref`` is the starting model (under
   LoRA: the model with the adapter disabled, no second copy).

Rollouts happen in the trainer core's ``before_step`` hook, at the first step of every
iteration, from the model and RNG state of that moment; checkpoints are only written at
iteration boundaries (``save_every`` must be a multiple of the steps per iteration), so
a killed run resumes at the iteration after its last checkpoint -- iteration =
``global_step / (ppo_epochs x minibatches)`` of the checkpoint; model (value head
included), optimizer, scheduler and RNG states are in it -- and reaches the same result
as an uninterrupted run.

Departures from the paper (and why):

* Scale: defaults are sized for the embedded tiny model on a CPU (16 episodes and 2x2
  updates an iteration); the paper trains Gemma2 2B for 30k updates with lr 1e-4.
* ``turns_per_episode`` (default 0 = all) trains on a random subset of each episode's
  turns (advantages still use every step's reward): an unbiased, cheaper gradient for
  long bandit episodes. The paper trains on all turns.
* Rewards are normalised by the batch standard deviation (scale only, no shift: a shift
  would reward or punish episode length where lengths vary); the paper does not say how.
* The batch baseline is per step (the mean return-to-go of step ``t`` over the batch),
  which fixed-length episodes allow. ``group_size`` > 1 replaces it with a leave-one-out
  baseline over episodes of the same task (RLOO; not in the paper): on the bandits a task
  fixes the whole reward table, so what differs within a group is what the policy did.
* ``reward_source=expected`` (not in the paper; off by default) trains on the pulled arm's
  mean instead of its noisy reward. The noise of step k's reward has mean 0 given everything
  up to step k's action, and every term of the policy gradient that step k's reward enters
  (turns t <= k) is fixed by then, so the expected policy gradient is the same and only its
  variance falls (a Rao-Blackwellised reward; exact for the plain policy gradient, close for
  PPO, whose clipping and standardised advantages are not linear in the rewards). It reads
  means the agent never sees, which only a simulator has. ``reward_norm`` divides both sources
  by the standard deviation of the *sampled* rewards, so that the penalty and the bonus weigh
  the same against them (before 29 Nov 2026 the means' own, smaller, deviation was used: the
  means weighed about 3.5x more against the penalty and bonus than the samples did).
* epsilon-greedy turns are executed but not trained on (the model did not write them); with
  GAE their states still get the value head's estimate (before 28 Nov 2026 they entered GAE
  with V = 0). A turn too long for ``max_length`` is neither trained nor valued (V = 0); such
  turns are counted in ``rollout/dropped_turns``, and an iteration where no turn fits is an error.
* A reply cut by the thinking budget ends with the template's end-of-turn marker as context,
  untrained (the model did not sample it); the tokens it did sample are trained as any reply's.
* The value head is a plain linear layer on the policy's last hidden state (shared
  trunk, no separate critic network); a truncated episode bootstraps with 0. By default
  its loss trains the trunk too; ``value_trunk=false`` stops it at the head.
* The KL term's default gradient (``kl_gradient=pathwise`` through the k3 estimate of the
  sampled tokens) is, in expectation, the gradient of KL(pi_ref || pi_theta), the reverse of
  DESIGN 3's KL(pi_theta || pi_ref); ``kl_gradient=full`` takes the gradient of the
  full-vocabulary KL(pi_theta || pi_ref) at each sampled position.
* The thinking budget G (``max_new_tokens``) defaults to 64 tokens, not 256: the tiny model's
  rationales are short, and a CPU pays for every budget token of a rollout.
* The action is the reply's last *valid* one (``agent.parsing``, the same for every method),
  where DESIGN's RLFT reads the last match: a reply whose last ``ACTION=`` is invalid after an
  earlier valid one acts on that one, without the invalid-action penalty.
* epsilon-greedy draws from the env's ``valid_actions``: on a turn where the env lists none
  (ScienceWorld, the shop's search page) the model's own reply is played.
* Several processes (accelerate / torchrun): each process plays the whole rollout (the same
  episodes, the same keyed sampling) and trains on its share of each minibatch, so a
  minibatch is ``episodes_per_iter / minibatches`` episodes across all processes
  (``batch_size x processes`` must divide it). The rollout is not sharded across processes.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from turnrl import envs
from turnrl.agent.prompting import PromptConfig, agent_view
from turnrl.config import Range
from turnrl.data.schema import Trajectory
from turnrl.errors import TurnRLError
from turnrl.losses import (
    batch_baseline_advantages,
    gae,
    group_baseline_advantages,
    normalize_advantages,
    ppo_loss,
    rewards_to_go,
    value_loss,
)
from turnrl.rollout.engine import HFEngine, SamplingConfig
from turnrl.rollout.policies import ModelPolicy, Policy, Reply, Request, _gen_eos
from turnrl.rollout.sampler import EpisodeSpec, Sampler, invalid_rate
from turnrl.tokenization import ChatFormat, Encoded
from turnrl.train.core import _HASH_EXEMPT, LoraSettings, TrainConfig, Trainer, TrainResult, _is_peft
from turnrl.train.forward import PackedBatch, kept_logits, pack_runs

__all__ = ["PPOConfig", "PPOObjective", "PPORunner", "TurnSample", "train_ppo"]

BANDIT_ENVS = ("bandit", "contextual_bandit")
#: settings only the value head reads (``advantage=gae``); refused with ``advantage=mc``
VALUE_HEAD_SETTINGS = ("vf_coef", "value_clip", "gae_lambda", "value_trunk")


class PPOConfig(TrainConfig):
    """PPO settings: the trainer core's (``lr``, ``batch_size`` = episodes per micro-batch,
    ``warmup_ratio``, ``lr_schedule``, ``max_grad_norm``, ``lora.*``, ...) plus these.
    ``grad_accum``, ``epochs`` and ``max_steps`` are derived and must stay at their defaults."""

    lr: float = 1e-4
    batch_size: int = 4
    dropout: bool = False  # the rollout's and the reference's log-probs are taken without it
    iterations: int = 10
    episodes_per_iter: int = 16
    #: episodes a task in a rollout: ``episodes_per_iter / group_size`` tasks, each played
    #: ``group_size`` times, and the Monte-Carlo baseline of a step is the mean return-to-go of the
    #: other episodes of its task (leave-one-out); 1: every episode its own task, the batch baseline
    group_size: int = 1
    ppo_epochs: int = 2
    minibatches: int = 2
    clip_eps: float = 0.2
    beta_kl: float = 0.05
    kl_estimator: Literal["k1", "k3", "full"] = "k3"
    #: the gradient the per-token KL term (``k1``/``k3``) gives (:func:`~turnrl.losses.kl_penalty`):
    #: ``pathwise`` (GRPO's k3 in the loss) is, in expectation, the gradient of KL(pi_ref || pi_theta);
    #: ``full`` adds the score-function term, giving that of KL(pi_theta || pi_ref)
    kl_gradient: Literal["pathwise", "full"] = "pathwise"
    advantage: Literal["auto", "mc", "gae"] = "auto"
    gamma: float = 1.0
    gae_lambda: float = 0.95
    vf_coef: float = 0.5
    value_clip: float | None = None
    #: the value loss trains the shared trunk too; False: the head reads a detached hidden
    #: state, so only the head learns from it (the policy's weights see the policy loss alone)
    value_trunk: bool = True
    adv_norm: bool = True
    invalid_penalty: float = -5.0
    reward_norm: bool = True
    #: ``env``: the sampled env rewards; ``expected``: their expected values given the executed
    #: action (envs reporting ``info["expected_reward"]``: the bandits), the same objective with
    #: less variance
    reward_source: Literal["env", "expected"] = "env"
    #: + this reward for an action not yet executed in the episode (a bandit's untried arm; where a
    #: valid action cannot repeat, as in tic-tac-toe, it pays every valid move)
    exploration_bonus: float = 0.0
    epsilon: float = 0.0
    temperature: float = 1.0
    #: the thinking budget G: most tokens of a reply (rationale + action)
    max_new_tokens: int = 64
    #: earlier (observation, reply) exchanges in the prompt (0: the observation only -- the
    #: bandit envs put the last C steps into it)
    history: int | None = 0
    #: replaces the env's instruction in the prompt
    instruction: str | None = None
    env_opts: dict[str, Any] = {}
    split: str = "train"
    num_envs: int = 32
    #: train on this many random turns of each episode (0: all)
    turns_per_episode: int = 0
    max_length: int = 2048
    row_tokens: int = 2048
    #: the turns of an episode, each its own sequence, share at least the instruction: compute
    #: that prefix once per episode (``forward.pack_runs``; needs an attention implementation
    #: taking 4-D masks: set false under ``flash_attention_2``)
    shared_prefix: bool = True
    #: evaluation every ``eval_every`` steps (trainer core) plays this many greedy episodes
    eval_episodes: int = 0
    eval_split: str = "seen"

    value_ranges = {**TrainConfig.value_ranges,
                    **dict.fromkeys(("iterations", "episodes_per_iter", "group_size", "ppo_epochs", "minibatches",
                                     "max_new_tokens", "num_envs"), Range(1)),
                    **dict.fromkeys(("beta_kl", "vf_coef", "turns_per_episode", "eval_episodes"), Range(0)),
                    **dict.fromkeys(("epsilon", "gamma", "gae_lambda"), Range(0, 1)),
                    **dict.fromkeys(("clip_eps", "value_clip"), Range(0, lo_open=True)),
                    "temperature": Range(0, lo_open=True)}  # training rollouts sample


@dataclass
class TurnSample:
    """One agent turn of a rollout, tokenized as its own sequence (its context + reply)."""

    enc: Encoded
    episode: int
    turn: int
    advantage: float = 0.0
    ret: float = 0.0
    old_value: float = 0.0
    old_logps: torch.Tensor | None = None
    ref_logps: torch.Tensor | None = None
    #: False for a turn the model did not write (epsilon-greedy): tokenized only for its state's value
    trained: bool = True

    @property
    def tokens(self) -> int:
        return int(sum(self.enc.action_mask[1:]))


class EpisodeBuffer(Sequence[list[TurnSample]]):
    """The trainer's dataset: a fixed number of episode slots, refilled every iteration."""

    def __init__(self, size: int):
        self.items: list[list[TurnSample]] = [[] for _ in range(size)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: Any) -> Any:
        return self.items[i]


# --------------------------------------------------------------------------- forward


@dataclass
class Forward:
    logps: torch.Tensor  # [K]
    logprobs: torch.Tensor | None  # [K, V] (full-vocabulary KL)
    values: torch.Tensor | None  # [S] value of each sequence's state
    seq_order: list[int]  # sequences in the order their tokens appear in ``logps``


def find_value_head(model: Any) -> Any:
    """The ``value_head`` module of a (possibly peft-wrapped) model, or None."""
    best = None
    for name, mod in model.named_modules():
        if name.split(".")[-1] == "value_head":
            if best is None or len(name) < len(best[0]):
                best = (name, mod)
    return None if best is None else best[1]


def new_value_head(model: Any, model_name: str | Path) -> torch.nn.Linear:
    """The value head for ``model``: a float32 linear layer on the last hidden state, zero at the
    start, or the one a PPO run saved with the model in ``model_name/parts/value_head.safetensors``
    (``model_name/value_head.safetensors`` before 30 Nov 2026), so that PPO continued from a PPO
    model keeps its critic."""
    from turnrl.train.core import PARTS

    head = torch.nn.Linear(int(model.config.hidden_size), 1)
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.zeros_(head.bias)
    saved = Path(model_name) / PARTS / "value_head.safetensors"
    if not saved.is_file():
        saved = Path(model_name) / "value_head.safetensors"
    if saved.is_file():
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            head.load_state_dict(load_file(str(saved)))
        except (RuntimeError, OSError, SafetensorError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise TurnRLError(f"{saved}: not a value head for this model ({first})") from None
    return head


def policy_forward(model: Any, batch: PackedBatch, *, full: bool = False, value_head: Any = None,
                   detach_value: bool = False) -> Forward:
    """Log-probs of the agent tokens of a packed batch (as :func:`turnrl.train.forward.token_logps`),
    with optional full log-distributions and the value of each sequence's state (read at the
    position before its first agent token: the last prompt token; ``detach_value``: from a
    detached hidden state, so the value's gradient stops at the head)."""
    device = next(model.parameters()).device
    if batch.keep.numel() == 0:
        raise TurnRLError("PPO batch without agent tokens")
    logits, out = kept_logits(model, batch, output_hidden_states=value_head is not None)
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    logps = logprobs.gather(-1, batch.labels.to(device).unsqueeze(-1)).squeeze(-1)
    seq = batch.seq_index
    first = torch.ones_like(seq, dtype=torch.bool)
    first[1:] = seq[1:] != seq[:-1]
    seq_order = seq[first].tolist()
    values = None
    if value_head is not None:
        hidden = out.hidden_states[-1]
        h = hidden.flatten(0, 1)[batch.keep[first].to(device)]  # keep is row * width + col
        if detach_value:
            h = h.detach()
        v_in_order = value_head(h.to(next(value_head.parameters()).dtype)).squeeze(-1).float()
        values = torch.zeros(batch.num_seqs, device=device, dtype=v_in_order.dtype)
        values = values.index_put((torch.tensor(seq_order, device=device),), v_in_order)
    return Forward(logps, logprobs if full else None, values, seq_order)


def _split_by_seq(flat: torch.Tensor, seq_order: list[int], counts: Sequence[int]) -> dict[int, torch.Tensor]:
    out: dict[int, torch.Tensor] = {}
    at = 0
    for s in seq_order:
        out[s] = flat[at : at + counts[s]]
        at += counts[s]
    return out


# --------------------------------------------------------------------------- objective


class PPOObjective:
    """Token-level PPO loss (+ value loss) on the trained turns of a list of episodes;
    units = action tokens."""

    #: reduced by max over the step's micro-batches and processes (the trainer core)
    max_metrics = frozenset({"ratio_max_dev"})

    def __init__(self, cfg: PPOConfig, pad_id: int, ref: Any = None):
        self.cfg = cfg
        self.pad_id = pad_id
        #: a callable running the reference forward (full-vocabulary KL), or None
        self.ref = ref
        self.value_head: Any = None

    def units(self, examples: Sequence[list[TurnSample]]) -> float:
        return float(sum(s.tokens for ep in examples for s in ep))

    def pack(self, samples: Sequence[TurnSample]) -> PackedBatch:
        """The samples packed in order, each episode's run of turns sharing its common prefix
        (``shared_prefix``)."""
        return pack_runs([s.enc for s in samples], [s.episode for s in samples], row_tokens=self.cfg.row_tokens,
                         pad_id=self.pad_id, shared=self.cfg.shared_prefix)

    def __call__(self, model: Any, examples: Sequence[list[TurnSample]]) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.cfg
        samples = [s for ep in examples for s in ep]
        if not samples:
            p = next(model.parameters())
            return p.sum() * 0.0, {}
        batch = self.pack(samples)
        full = cfg.kl_estimator == "full" and cfg.beta_kl > 0
        fw = policy_forward(model, batch, full=full, value_head=self.value_head, detach_value=not cfg.value_trunk)
        device = fw.logps.device
        order = fw.seq_order
        old = torch.cat([_need(samples[s].old_logps, "old_logps") for s in order]).to(device)
        counts = torch.tensor([samples[s].tokens for s in order], device=device)
        adv = torch.repeat_interleave(torch.tensor([samples[s].advantage for s in order], device=device), counts)
        kwargs: dict[str, Any] = {}
        if cfg.beta_kl > 0:
            if full:
                assert self.ref is not None
                with torch.no_grad():
                    kwargs["ref_logprobs"] = self.ref(batch)
                kwargs["logprobs"] = fw.logprobs
            else:
                kwargs["ref_logps"] = torch.cat([_need(samples[s].ref_logps, "ref_logps") for s in order]).to(device)
                kwargs["kl_estimator"] = cfg.kl_estimator
                kwargs["kl_gradient"] = cfg.kl_gradient
        losses, m = ppo_loss(fw.logps, old, adv, clip_eps=cfg.clip_eps, beta_kl=cfg.beta_kl, **kwargs)
        total = losses.sum()
        metrics = {k: float(m[k].sum()) for k in ("ratio", "clipped", "approx_kl", "kl", "pg_loss")}
        metrics["ratio_max_dev"] = float((m["ratio"] - 1).abs().max())  # a max: reduced by max (max_metrics)
        if fw.values is not None:
            vals = fw.values[torch.tensor(order, device=device)]
            rets = torch.tensor([samples[s].ret for s in order], device=device)
            olds = torch.tensor([samples[s].old_value for s in order], device=device)
            vl, vm = value_loss(vals, rets, old_values=olds, clip=cfg.value_clip)
            total = total + cfg.vf_coef * (vl * counts).sum()  # each token carries its turn's value loss
            metrics["value_loss"] = float((vl.detach() * counts).sum())
        return total, metrics


def _need(x: torch.Tensor | None, name: str) -> torch.Tensor:
    if x is None:
        raise RuntimeError(f"PPO sample without {name}; the iteration's preparation did not run")
    return x


# --------------------------------------------------------------------------- exploration


class EpsilonRandom:
    """Epsilon-greedy for any env that lists its valid actions: with probability ``eps`` a
    uniformly random valid action (no sampled tokens: not trained on)."""

    def __init__(self, inner: Policy, eps: float):
        self.inner, self.eps = inner, eps
        self.name = f"{inner.name}+epsilon-greedy"

    def act(self, requests: Sequence[Request]) -> list[Reply]:
        out: list[Reply | None] = [None] * len(requests)
        for i, r in enumerate(requests):
            if r.valid_actions and r.rng.random() < self.eps:
                a = r.rng.choice(r.valid_actions)
                out[i] = Reply(f"I explore and pick {a} at random.\nACTION={a}", meta={"aid": "epsilon-greedy"})
        rest = [i for i, o in enumerate(out) if o is None]
        if rest:
            for i, rep in zip(rest, self.inner.act([requests[i] for i in rest]), strict=True):
                out[i] = rep
        return [o for o in out if o is not None]


def with_epsilon(policy: Policy, env_name: str, eps: float) -> Policy:
    if eps <= 0:
        return policy
    if env_name in BANDIT_ENVS:
        from turnrl.bandits.aids import with_aids

        return with_aids(policy, [f"epsilon-greedy:eps={eps:g}"])
    return EpsilonRandom(policy, eps)


# --------------------------------------------------------------------------- rewards


def shaped_rewards(trajs: Sequence[Trajectory], cfg: PPOConfig) -> tuple[list[list[float]], dict[str, float]]:
    """Per-step training rewards of each episode (normalised env reward + penalty + bonus)."""
    base = [_base_rewards(t, cfg.reward_source) for t in trajs]
    env_r = [r for rs in base for r in rs]
    # the scale is the sampled rewards' whatever the source: the expected rewards spread less, and
    # their own scale would weigh the unscaled penalty and bonus less against them (another objective)
    sampled = env_r if cfg.reward_source == "env" else [r for t in trajs for r in _base_rewards(t, "env")]
    scale = 1.0
    if cfg.reward_norm and len(sampled) > 1:
        std = float(np.std(sampled))
        scale = 1.0 / std if std > 1e-8 else 1.0
    out: list[list[float]] = []
    bonus_n = invalid_n = 0
    for t, t_rewards in zip(trajs, base, strict=True):
        turns = [m for m in t.messages if m.role == "assistant"]
        seen: set[Any] = set()
        rs = []
        for r, m, what in zip(t_rewards, turns, _executed(t, turns), strict=False):
            x = r * scale
            if m.valid is False:
                x += cfg.invalid_penalty
                invalid_n += 1
            elif cfg.exploration_bonus and what is not None and what not in seen:
                x += cfg.exploration_bonus
                bonus_n += 1
            if what is not None:
                seen.add(what)
            rs.append(x)
        out.append(rs)
    n = max(1, len(env_r))
    return out, {"reward_scale": scale, "bonus_rate": bonus_n / n, "invalid_rate": invalid_n / n}


def _executed(t: Trajectory, turns: Sequence[Any]) -> list[Any]:
    """What each turn executed, as the exploration bonus and coverage count it: the arm the env pulled
    where it reports one (``meta["arms"]``: under the bandits' ``randomize_labels`` one label names another
    arm at every step), else the action played; None for an invalid turn's (an action the env rejected, on
    an env that lists no actions, was not executed: it is not tried, and its first valid play earns the bonus)."""
    arms = t.meta.get("arms")
    if isinstance(arms, list) and len(arms) == len(turns):
        return list(arms)
    return [None if m.valid is False else m.action for m in turns]


def _base_rewards(t: Trajectory, source: str) -> list[float]:
    if source == "env":
        return list(t.rewards)
    expected = t.meta.get("expected_rewards")
    if expected is None or len(expected) != len(t.rewards):
        raise TurnRLError(f"reward_source=expected: env {t.env!r} does not report the expected reward of its steps "
                          "(info['expected_reward']; the bandit envs do); use reward_source=env")
    return [float(x) for x in expected]


def _padded(rows: Sequence[Sequence[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max((len(r) for r in rows), default=0)
    x = torch.zeros(len(rows), max(1, width), dtype=torch.float64)
    m = torch.zeros_like(x)
    for i, r in enumerate(rows):
        x[i, : len(r)] = torch.tensor(list(r), dtype=torch.float64)
        m[i, : len(r)] = 1
    return x, m


# --------------------------------------------------------------------------- the runner


@dataclass
class PPORunner:
    """Holds what the rollout hook needs; :meth:`before_step` is the trainer core's hook."""

    cfg: PPOConfig
    env_name: str
    chat: ChatFormat
    tokenizer: Any
    buffer: EpisodeBuffer
    objective: PPOObjective
    advantage: str
    ref_model: Any = None
    trainer: Trainer | None = None
    steps_per_iter: int = 1
    last_rollout: list[Trajectory] = field(default_factory=list)
    #: the ``rollout/*`` statistics of this iteration, until a logged step has carried them
    pending: dict[str, float] = field(default_factory=dict)

    # -- helpers -------------------------------------------------------------------------
    @property
    def model(self) -> Any:
        assert self.trainer is not None
        return self.trainer.unwrapped_model

    @property
    def autocast(self) -> Any:
        """The trainer's ``accelerator.autocast``: rollouts and the old/reference passes run at
        the update's precision, so the first minibatch has ratio 1."""
        assert self.trainer is not None
        return self.trainer.accelerator.autocast

    def prompt(self) -> PromptConfig:
        return PromptConfig(history=self.cfg.history, instruction=self.cfg.instruction, invalid_action="random",
                            invalid_penalty=0.0)

    def policy(self, temperature: float) -> ModelPolicy:
        engine = HFEngine(self.model, self.tokenizer, self.chat.stop_token_ids, autocast=self.autocast)
        sampling = SamplingConfig(temperature=temperature, max_new_tokens=self.cfg.max_new_tokens)
        return ModelPolicy(engine, self.chat, sampling, history=self.cfg.history, name="ppo")

    def plan(self, iteration: int, split: str, episodes: int, salt: int = 0, group: int = 1) -> list[EpisodeSpec]:
        """``episodes`` episodes of ``episodes / group`` tasks drawn at random, each task ``group``
        times in a row (episode ``j`` is in group ``j // group``), each episode with its own seed."""
        env = envs.make(self.env_name, **self.cfg.env_opts)
        try:
            ids = env.task_ids(split)
        finally:
            env.close()
        rng = np.random.default_rng([self.cfg.seed, salt, iteration])
        tasks = episodes // group
        picks = np.repeat(rng.choice(len(ids), size=tasks, replace=tasks > len(ids)), group)
        return [EpisodeSpec(iteration * episodes + j, split, ids[int(k)], int(rng.integers(2**31)))
                for j, k in enumerate(picks)]

    def play(self, specs: Sequence[EpisodeSpec], policy: Policy) -> list[Trajectory]:
        opts = dict(self.cfg.env_opts)
        sampler = Sampler(lambda: envs.make(self.env_name, **opts), policy, env_name=self.env_name,
                          num_envs=min(self.cfg.num_envs, len(specs)), prompt=self.prompt())
        try:
            return sampler.run(specs)
        finally:
            sampler.close()

    # -- the hook ------------------------------------------------------------------------
    def before_step(self, step: int) -> dict[str, float]:
        """Roll out at the first step of an iteration. Its ``rollout/*`` statistics ride on the
        iteration's steps until one of them reaches the log (the first, with ``log_every`` 1), so that
        every iteration logs them once whatever ``log_every`` (at most the steps per iteration)."""
        iteration, within = divmod(step, self.steps_per_iter)
        if not within:
            stats = self.collect(iteration)
            self.pending = {f"rollout/{k}": v for k, v in stats.items()}
        elif self.pending and self._logged(step):
            self.pending = {}
        return {**self.pending, "iteration": float(iteration)}

    def _logged(self, done: int) -> bool:
        """Whether the trainer logged the record of step ``done`` (1-based, as logged)."""
        history = getattr(self.trainer, "history", None) or []
        return bool(history) and history[-1].get("step") == done

    def collect(self, iteration: int) -> dict[str, float]:
        """Roll out, compute rewards and advantages, tokenize, recompute old/ref log-probs."""
        cfg = self.cfg
        policy = with_epsilon(self.policy(cfg.temperature), self.env_name, cfg.epsilon)
        trajs = self.play(self.plan(iteration, cfg.split, cfg.episodes_per_iter, group=cfg.group_size), policy)
        self.last_rollout = trajs
        rewards, rstats = shaped_rewards(trajs, cfg)
        needs_values = self.advantage == "gae"
        # GAE needs V(s_t) at every turn, epsilon-greedy ones too: those are tokenized for it, not trained
        samples = [self._samples(i, t, with_aids=needs_values) for i, t in enumerate(trajs)]
        # which turns train (a random subset per episode with turns_per_episode)
        rng = np.random.default_rng([cfg.seed, 7, iteration])
        chosen: list[list[TurnSample]] = []
        for eps in ([s for s in e if s.trained] for e in samples):
            if cfg.turns_per_episode and len(eps) > cfg.turns_per_episode:
                keep = sorted(rng.choice(len(eps), size=cfg.turns_per_episode, replace=False).tolist())
                chosen.append([eps[k] for k in keep])
            else:
                chosen.append(list(eps))
        with self.autocast():
            self._old_pass(samples if needs_values else chosen, values=needs_values)
        r, mask = _padded(rewards)
        if self.advantage == "gae":
            v = torch.zeros_like(r)
            for i, eps in enumerate(samples):
                for s in eps:
                    v[i, s.turn] = s.old_value
            adv, ret = gae(r, v, mask, gamma=cfg.gamma, lam=cfg.gae_lambda)
        else:
            ret = rewards_to_go(r, mask, cfg.gamma)
            if cfg.group_size > 1:
                adv = group_baseline_advantages(ret, mask, torch.arange(len(trajs)) // cfg.group_size)
            else:
                adv = batch_baseline_advantages(ret, mask)
        flat = [s for eps in chosen for s in eps]
        written = sum(1 for t in trajs for m in t.messages if m.role == "assistant" and m.token_ids)
        dropped = written - sum(1 for eps in samples for s in eps if s.trained)
        if not flat:
            raise TurnRLError(f"iteration {iteration}: none of the {written} turns the model wrote fits in "
                              f"max_length={cfg.max_length} tokens; raise max_length or shorten the context (history)")
        vals = torch.tensor([float(adv[s.episode, s.turn]) for s in flat], dtype=torch.float64)
        if cfg.adv_norm and len(flat) > 1:
            vals = normalize_advantages(vals, "whiten")
        for s, a in zip(flat, vals.tolist(), strict=True):
            s.advantage = a
            s.ret = float(ret[s.episode, s.turn])
        if cfg.beta_kl > 0 and cfg.kl_estimator != "full":
            with self.autocast():
                self._ref_pass(flat)
        for i, eps in enumerate(chosen):
            self.buffer.items[i] = eps
        returns = [t.return_ for t in trajs]
        out = {"return": float(np.mean(returns)), "invalid": invalid_rate(trajs),
               "turns": float(np.mean([t.num_turns for t in trajs])), "trained_turns": float(len(flat)),
               "dropped_turns": float(dropped),
               "success": float(np.mean([t.success for t in trajs])), **rstats}
        if self.env_name in BANDIT_ENVS:
            out["coverage"] = float(np.mean([_coverage(t, self.cfg.env_opts, self.env_name) for t in trajs]))
        return out

    def _samples(self, episode: int, traj: Trajectory, *, with_aids: bool = False) -> list[TurnSample]:
        """Each turn the model wrote as a sample to train; with ``with_aids``, also each aid-written
        (epsilon-greedy) turn, untrained (``trained=False``), whose state's value GAE needs."""
        out = []
        turns = [m for m in traj.messages if m.role == "assistant"]
        for t, m in enumerate(turns):
            own = bool(m.token_ids)  # aid-written (epsilon-greedy) replies are not the model's tokens
            if not own and not with_aids:
                continue
            view, local = agent_view(traj.messages, t, self.cfg.history)
            enc = self.chat.encode(view, trainable_turns=[local], max_length=self.cfg.max_length)
            if enc is None or enc.num_turns == 0:
                continue
            out.append(TurnSample(enc, episode, t, trained=own))
        return out

    def _chunks(self, samples: Sequence[TurnSample]) -> list[list[TurnSample]]:
        out: list[list[TurnSample]] = []
        cur: list[TurnSample] = []
        n = 0
        for s in samples:
            if cur and n + len(s.enc) > self.cfg.row_tokens * 4:
                out.append(cur)
                cur, n = [], 0
            cur.append(s)
            n += len(s.enc)
        if cur:
            out.append(cur)
        return out

    @torch.no_grad()
    def _old_pass(self, episodes: Sequence[Sequence[TurnSample]], *, values: bool) -> None:
        model = self.model
        was = model.training
        model.eval()
        try:
            for chunk in self._chunks([s for eps in episodes for s in eps]):
                batch = self.objective.pack(chunk)
                fw = policy_forward(model, batch, value_head=self.objective.value_head if values else None)
                parts = _split_by_seq(fw.logps.cpu(), fw.seq_order, [s.tokens for s in chunk])
                for k, s in enumerate(chunk):
                    s.old_logps = parts[k]
                    if fw.values is not None:
                        s.old_value = float(fw.values[k])
        finally:
            model.train(was)

    @torch.no_grad()
    def _ref_pass(self, samples: Sequence[TurnSample]) -> None:
        for chunk in self._chunks(samples):
            batch = self.objective.pack(chunk)
            lp = self.ref_logprobs(batch)
            labels = batch.labels.to(lp.device)
            logps = lp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
            seq = batch.seq_index
            first = torch.ones_like(seq, dtype=torch.bool)
            first[1:] = seq[1:] != seq[:-1]
            parts = _split_by_seq(logps.cpu(), seq[first].tolist(), [s.tokens for s in chunk])
            for k, s in enumerate(chunk):
                s.ref_logps = parts[k]

    @torch.no_grad()
    def ref_logprobs(self, batch: PackedBatch) -> torch.Tensor:
        """``[K, V]`` log-distributions of the reference at the batch's agent positions."""
        model = self.model
        if self.ref_model is not None:
            return policy_forward(self.ref_model, batch, full=True).logprobs  # type: ignore[return-value]
        was = model.training
        model.eval()
        try:
            with model.disable_adapter():
                lp = policy_forward(model, batch, full=True).logprobs
        finally:
            model.train(was)
        assert lp is not None
        return lp

    # -- evaluation ----------------------------------------------------------------------
    def evaluate(self, episodes: int, split: str | None = None) -> list[Trajectory]:
        """Greedy (temperature 0) episodes of the current model on ``split``."""
        specs = self.plan(0, split or self.cfg.eval_split, episodes, salt=1)
        return self.play(specs, self.policy(0.0))

    def eval_fn(self, model: Any, step: int) -> dict[str, float]:
        trajs = self.evaluate(self.cfg.eval_episodes)
        out = {"return": float(np.mean([t.return_ for t in trajs])), "invalid": invalid_rate(trajs)}
        if self.env_name in BANDIT_ENVS:
            out["coverage"] = float(np.mean([_coverage(t, self.cfg.env_opts, self.env_name) for t in trajs]))
        return out


def _coverage(traj: Trajectory, env_opts: dict[str, Any], env_name: str) -> float:
    arms = int(env_opts.get("arms", env_opts.get("items", 10 if env_name == "bandit" else 5)))
    turns = [m for m in traj.messages if m.role == "assistant"]
    return len({a for a in _executed(traj, turns) if a is not None}) / arms


# --------------------------------------------------------------------------- entry point


def _check(cfg: PPOConfig, env_name: str) -> None:
    if cfg.grad_accum != 1 or cfg.max_steps != 0 or cfg.epochs != 1.0:
        raise TurnRLError("ppo: grad_accum, epochs and max_steps are derived from episodes_per_iter, minibatches, "
                          "ppo_epochs and iterations; leave them unset")
    per_mb = cfg.episodes_per_iter / cfg.minibatches
    procs = _num_processes()
    if per_mb != int(per_mb) or int(per_mb) % (cfg.batch_size * procs):
        raise TurnRLError(
            f"ppo: episodes_per_iter ({cfg.episodes_per_iter}) must split into minibatches ({cfg.minibatches}) "
            f"of a multiple of batch_size ({cfg.batch_size}) episodes"
            + (f" times the {procs} processes" if procs > 1 else ""))
    if cfg.episodes_per_iter % cfg.group_size:
        raise TurnRLError(f"ppo: episodes_per_iter ({cfg.episodes_per_iter}) must be a multiple of group_size "
                          f"({cfg.group_size}), the episodes a task")
    if cfg.group_size > 1 and advantage_kind(cfg, env_name) != "mc":
        raise TurnRLError(f"ppo: group_size {cfg.group_size} needs advantage=mc (the group baseline is a Monte-Carlo "
                          f"baseline; {env_name} defaults to gae)")
    if advantage_kind(cfg, env_name) == "mc":  # no value head: its settings would be accepted and change nothing
        unused = [f"{k}={getattr(cfg, k)}" for k in VALUE_HEAD_SETTINGS
                  if getattr(cfg, k) != PPOConfig.model_fields[k].default]
        if unused:
            why = "advantage=mc" if cfg.advantage == "mc" else f"advantage=mc, {env_name}'s default"
            raise TurnRLError(f"ppo: {', '.join(unused)}: value-head settings (advantage=gae), but this run has no "
                              f"value head ({why}); leave them out")
    if cfg.kl_estimator == "full" and cfg.kl_gradient != PPOConfig.model_fields["kl_gradient"].default:
        raise TurnRLError(f"ppo: kl_gradient={cfg.kl_gradient} chooses the gradient of a per-token KL estimate (k1, k3); "
                          "kl_estimator=full takes the exact KL, which has none to choose: leave kl_gradient out")
    steps_per_iter = cfg.ppo_epochs * cfg.minibatches
    if cfg.save_every % steps_per_iter:
        raise TurnRLError(f"ppo: save_every ({cfg.save_every}) must be a multiple of the steps per iteration "
                          f"(ppo_epochs x minibatches = {steps_per_iter}); checkpoints fall between iterations")
    if cfg.log_every > steps_per_iter:
        raise TurnRLError(f"ppo: log_every ({cfg.log_every}) is more than the steps per iteration (ppo_epochs x "
                          f"minibatches = {steps_per_iter}): some iterations would log no line, and their rollout "
                          "statistics would be lost; lower it")
    if bool(cfg.eval_every) != bool(cfg.eval_episodes):  # the evaluation needs both: one alone did nothing
        raise TurnRLError(f"ppo: eval_every ({cfg.eval_every}) and eval_episodes ({cfg.eval_episodes}) go together "
                          "(eval_episodes greedy episodes every eval_every steps); set both or neither")
    if cfg.beta_kl > 0 and cfg.kl_estimator == "k1" and cfg.kl_gradient == "pathwise":
        raise TurnRLError("ppo: kl_estimator=k1 with kl_gradient=pathwise pulls nothing toward the reference (k1's "
                          "gradient through the sampled token is 0 in expectation); set kl_gradient=full or use k3")
    if cfg.temperature != 1.0:
        raise TurnRLError(f"ppo: temperature {cfg.temperature:g}: the PPO ratio and the KL term are taken at "
                          "temperature 1, so rollouts sampled at another would be off-policy; leave it at 1")
    for key, split in (("split", cfg.split), ("eval_split", cfg.eval_split)):
        if split not in ("train", "seen", "unseen"):
            raise TurnRLError(f"ppo: {key}={split}: unknown split; choose from: train, seen, unseen")
    for key in ("kl_estimator", "kl_gradient"):  # read only by the KL term
        if cfg.beta_kl == 0 and getattr(cfg, key) != PPOConfig.model_fields[key].default:
            raise TurnRLError(f"ppo: {key}={getattr(cfg, key)}: the KL term is off (beta_kl=0); set beta_kl or "
                              f"leave {key} out")
    if not cfg.eval_every and cfg.eval_split != PPOConfig.model_fields["eval_split"].default:
        raise TurnRLError(f"ppo: eval_split={cfg.eval_split}: evaluation is off (eval_every=0); set eval_every and "
                          "eval_episodes or leave it out")
    if cfg.reward_source == "expected" and env_name not in BANDIT_ENVS:  # else found after a whole first rollout
        raise TurnRLError(f"ppo: reward_source=expected: env {env_name!r} does not report the expected reward of its "
                          f"steps (the bandit envs do: {', '.join(BANDIT_ENVS)}); use reward_source=env")
    if cfg.epsilon == 1.0:
        raise TurnRLError("ppo: epsilon=1: every turn would be a random action, and those are not trained on; "
                          "give an epsilon below 1")
    envs.make(env_name, **cfg.env_opts).close()  # unknown env / bad option: one line


def _num_processes() -> int:
    """Processes of this launch (accelerate / torchrun set ``WORLD_SIZE``); 1 without a launcher.
    Read from the environment: building accelerate's ``PartialState`` here, before the trainer's
    ``Accelerator(cpu=...)``, would fix the process state too early (a CPU launch would then
    train every process alone)."""
    import os

    return max(1, int(os.environ.get("WORLD_SIZE", "1") or 1))


def advantage_kind(cfg: PPOConfig, env_name: str) -> str:
    if cfg.advantage != "auto":
        return cfg.advantage
    return "mc" if env_name in BANDIT_ENVS else "gae"


def train_ppo(model_name: str, env_name: str, out: str | Path, cfg: PPOConfig, *, resume: bool = False) -> TrainResult:
    """Load the model, build the online loop and run it on the trainer core."""
    from turnrl.models.loading import load_model, load_tokenizer, training_dtype

    _check(cfg, env_name)
    kind = advantage_kind(cfg, env_name)
    steps_per_iter = cfg.ppo_epochs * cfg.minibatches
    per_mb = cfg.episodes_per_iter // cfg.minibatches
    train_cfg = cfg.model_copy(update={
        # a minibatch is per_mb episodes over all processes: the core's global batch is
        # batch_size x grad_accum x processes
        "grad_accum": per_mb // (cfg.batch_size * _num_processes()),
        "max_steps": cfg.iterations * steps_per_iter,
    })
    if kind == "gae" and cfg.lora is not None:
        mods = list(cfg.lora.modules_to_save or [])
        train_cfg.lora = LoraSettings(**{**cfg.lora.model_dump(), "modules_to_save": [*mods, "value_head"]})
    tok = load_tokenizer(model_name)
    model = load_model(model_name, dtype=training_dtype(cfg.mixed_precision, cfg.lora is not None))
    chat = ChatFormat(tok, extra_stop_ids=_gen_eos(model))  # rollouts stop where evaluation's do
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    if kind == "gae" and find_value_head(model) is None:
        model.value_head = new_value_head(model, model_name).to(next(model.parameters()).device)
    ref_model = None
    if cfg.beta_kl > 0 and cfg.lora is None:
        ref_model = copy.deepcopy(model).eval()
        for p in ref_model.parameters():
            p.requires_grad_(False)
    buffer = EpisodeBuffer(cfg.episodes_per_iter)
    objective = PPOObjective(cfg, tok.pad_token_id or 0)
    runner = PPORunner(cfg, env_name, chat, tok, buffer, objective, kind, ref_model=ref_model,
                       steps_per_iter=steps_per_iter)
    if cfg.kl_estimator == "full" and cfg.beta_kl > 0:
        objective.ref = runner.ref_logprobs
    # settings added on 29 Nov 2026 stay out of the hash where they change nothing, so that earlier runs resume:
    # dropout (the trainer core hashes it where it matters) and kl_gradient at its default, the earlier behaviour
    added = {"dropout"} | ({"kl_gradient"} if cfg.kl_gradient == "pathwise" else set())
    dump = {k: v for k, v in cfg.model_dump(mode="json").items() if k not in added}
    run_config = {"algo": "ppo", "model": str(model_name), "env": env_name, "advantage": kind,  # hashed: without
                  "ppo": {k: v for k, v in dump.items() if k not in _HASH_EXEMPT}}  # cadence
    legacy = {**run_config, "ppo": dump}  # before 28 Nov 2026 the cadence was hashed too
    trainer = Trainer(model, train_cfg, out, buffer, objective, tokenizer=tok, run_config=run_config,
                      legacy_run_configs=[legacy], hash_exempt=sorted(added - {"dropout"}),
                      before_step=runner.before_step, save_apart=("value_head",) if kind == "gae" else (),
                      eval_fn=runner.eval_fn if cfg.eval_every and cfg.eval_episodes else None)
    runner.trainer = trainer
    if ref_model is not None:  # the trainer placed the policy; the frozen reference goes beside it
        ref_model.to(trainer.accelerator.device)
    if kind == "gae":
        objective.value_head = find_value_head(trainer.unwrapped_model)
    if ref_model is None and cfg.beta_kl > 0 and not _is_peft(trainer.unwrapped_model):
        raise TurnRLError("ppo: internal error: no reference model")
    result = trainer.train(resume=resume)
    if trainer.is_main:
        (Path(out) / "ppo.json").write_text(json.dumps(
            {"env": env_name, "advantage": kind, "steps_per_iteration": steps_per_iter,
             "iterations": cfg.iterations}, indent=2) + "\n")
    return result


def iteration_of(step: int, cfg: PPOConfig) -> int:
    """The PPO iteration an optimizer step (1-based, as logged) belongs to."""
    return (step - 1) // (cfg.ppo_epochs * cfg.minibatches)

