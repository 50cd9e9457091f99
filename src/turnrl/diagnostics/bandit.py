"""Decision-making diagnostics on bandits (DESIGN 5, seed 004).

For each policy -- a scripted algorithm (``ucb``, ``thompson``, ``greedy``...) or any model
(a directory, a hub id, ``tiny``) -- on ``N`` instances (the first ``N`` tasks of a split):

- **regret**: cumulative regret Σ_{s<=t} (μ*_s − μ_{a_s}) per step, mean and 95% CI over
  instances. A policy plays each instance ``runs`` times and an instance's regret is the
  mean over its runs (its expected regret), so the CI is over instances, not over the
  policy's own coin flips. Scripted policies default to 8 runs, models to 1;
- **coverage**: the share of arms tried by step t, same averaging;
- **frequency bias** (plain bandit): prefixes of 2-10 random actions, the last action then
  repeated 0..``max_repeats`` times (rewards from the instance's table); for each such
  context the policy's action distribution -- a model's from the log-probability of
  ``ACTION=<label>`` for every label, all labels scored in one batched forward pass; a
  scripted policy's from its internal scores -- its entropy, and the probability mass on
  the *frequent* action (the most frequent in the context, ties to the repeated one), on
  the *greedy* actions (every arm of the best mean reward in the context but the frequent
  one) and on the *other* actions, per repetition bucket (0-10%, 45-55% and 90-100% of
  ``max_repeats``: the paper's 0-10, 45-55, 90-100);
- **knowing-doing** (plain bandit): at every step the policy's stated UCB values (a model
  writes them in the block of :mod:`turnrl.bandits.rationale`; a scripted policy reports the
  UCB values of its own statistics, whatever rule it acts by, so a scripted ``greedy`` "knows"
  by construction and its row measures only the doing) against the true UCB values (mean + c·sqrt(ln t / n), inf untried, with
  the env's ``ucb_c``): the rationale is *correct* when the arms it rates highest are
  among the truly highest (within 0.01, the block's rounding); the action is *optimal*
  when it has the highest true UCB value (within the same 0.01: a policy that acts on its
  two-decimal block cannot tell such arms apart), else *greedy* when it has the highest true
  UCB value among the arms tried so far (within 0.01), else *other* (as is a step whose reply was invalid: the
  random arm the sampler played in its stead is not the policy's action). The 2x3 table gives
  % of all steps.

Model policies run through the normal lock-step :class:`~turnrl.rollout.sampler.Sampler`
(one batched generate per step) with ``history=0`` (the observation holds the recent
history, as in the paper); their episodes are then replayed in a fresh env to recover the
arm of every action and the instance's means. Scripted policies run in the vectorised
simulation of :mod:`turnrl.bandits.simulate` on the same instances (same rewards for the
same choices).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from turnrl.bandits.algorithms import Algorithm, argmax_sets, make_algorithm, ucb_values, with_env_c
from turnrl.bandits.rationale import parse_values
from turnrl.bandits.simulate import Instances, Run, coverage, cumulative_regret, simulate
from turnrl.envs.bandit import MAX_HORIZON
from turnrl.errors import TurnRLError
from turnrl.stats import mean_ci95

SCHEMA = "turnrl.diagnostics/v1"
#: tolerance when comparing UCB values (the rationale block rounds to two decimals)
UCB_TOL = 0.01


# ---------------------------------------------------------------------------------------
# Runs


@dataclass
class PolicyRun:
    """A policy's episodes as arrays: ``run`` rows are run-major (row ``r * N + i`` is run
    ``r`` on instance ``i``)."""

    label: str
    kind: str  # "scripted" | "model"
    run: Run
    runs: int
    extra: dict[str, Any] = field(default_factory=dict)
    #: [R*N, H] bool: steps whose arm the policy chose itself (False where its reply was
    #: invalid and the sampler pulled a random arm in its stead); None: every step
    own: np.ndarray | None = None

    @property
    def n_instances(self) -> int:
        return self.run.arms.shape[0] // self.runs

    def per_instance(self, values: np.ndarray) -> np.ndarray:
        """Average rows [R*N, ...] over runs -> [N, ...]."""
        return values.reshape(self.runs, self.n_instances, *values.shape[1:]).mean(axis=0)


def repeat_instances(inst: Instances, runs: int) -> Instances:
    """``inst`` stacked ``runs`` times (run-major)."""
    ctx = None if inst.contexts is None else np.concatenate([inst.contexts] * runs)
    return Instances(inst.task_ids * runs, np.concatenate([inst.mu] * runs),
                     np.concatenate([inst.rewards] * runs), ctx, inst.setting)


def scripted_run(spec: str | Algorithm, env: Any, task_ids: Sequence[str], *, runs: int = 8,
                 seed: int = 0) -> PolicyRun:
    """Simulate a scripted algorithm on the tasks, ``runs`` times each."""
    algo = make_algorithm(spec) if isinstance(spec, str) else spec
    inst = repeat_instances(env.instances(task_ids), runs)
    return PolicyRun(algo.spec, "scripted", simulate(algo, inst, seed=seed), runs)


def model_run(policy: Any, env_name: str, env_opts: dict[str, Any], task_ids: Sequence[str], *, runs: int = 1,
              split: str = "seen", seed: int = 0, num_envs: int = 32, label: str | None = None) -> PolicyRun:
    """Play a (model) policy through the sampler, ``runs`` episodes per task, and replay
    the episodes to arrays."""
    import random

    from turnrl import envs
    from turnrl.agent.prompting import PromptConfig
    from turnrl.envs.bandit import as_bandit
    from turnrl.rollout.sampler import EpisodeSpec, Sampler, invalid_rate

    specs = [
        EpisodeSpec(r * len(task_ids) + i, split, tid, random.Random(f"{seed}/{r}/{tid}").randrange(2**31))
        for r in range(runs) for i, tid in enumerate(task_ids)
    ]
    sampler = Sampler(lambda: envs.make(env_name, **env_opts), policy, env_name=env_name,
                      num_envs=min(num_envs, len(specs)), prompt=PromptConfig(history=0, invalid_action="random"))
    try:
        trajs = sampler.run(specs)
    finally:
        sampler.close()
    env = as_bandit(envs.make(env_name, **env_opts), "diagnose")
    inst = env.instances(list(task_ids) * runs)
    n, h, k = inst.mu.shape
    arms = np.full((n, h), -1, dtype=np.int64)
    rewards = np.zeros((n, h))
    reported = np.full((n, h, k), np.nan)
    own = np.zeros((n, h), dtype=bool)
    for row, traj in enumerate(trajs):
        env.reset(options={"task_id": traj.task_id})
        t = 0
        for msg in traj.messages:
            if msg.role != "assistant" or msg.action is None or t >= h:
                continue
            reported[row, t] = parse_values(msg.content, env.labels_now())
            _, reward, _, _, info = env.step(msg.action)
            arms[row, t] = -1 if info["arm"] is None else int(info["arm"])
            rewards[row, t] = reward
            own[row, t] = msg.valid is not False  # an invalid reply's random stand-in is not its action
            t += 1
    parsed = float(np.mean(~np.all(np.isnan(reported), axis=-1)))
    extra = {"invalid_action_rate": round(invalid_rate(trajs), 4), "ucb_block_rate": round(parsed, 4)}
    return PolicyRun(label or policy.name, "model", Run(inst, arms, rewards, reported), runs, extra, own)


# ---------------------------------------------------------------------------------------
# Regret and coverage


def _curve(values: np.ndarray) -> dict[str, Any]:
    """Per-step mean and 95% CI over rows of [N, H]."""
    stats = [mean_ci95(values[:, t].tolist()) for t in range(values.shape[1])]
    return {
        "mean": [round(m, 4) for m, _ in stats],
        "lo": [round(ci[0], 4) for _, ci in stats],
        "hi": [round(ci[1], 4) for _, ci in stats],
    }


def regret_summary(pr: PolicyRun) -> dict[str, Any]:
    """Cumulative regret per step (mean, 95% CI over instances) and its final value."""
    per = pr.per_instance(cumulative_regret(pr.run))
    out = _curve(per)
    out["final"] = out["mean"][-1]
    out["final_ci95"] = [out["lo"][-1], out["hi"][-1]]
    return out


def coverage_summary(pr: PolicyRun) -> dict[str, Any]:
    """Share of arms tried by step t (mean, 95% CI over instances)."""
    per = pr.per_instance(coverage(pr.run))
    out = _curve(per)
    out["final"] = out["mean"][-1]
    return out


# ---------------------------------------------------------------------------------------
# Knowing-doing


def true_ucb(run: Run, c: float) -> np.ndarray:
    """The true UCB values before every step, [N, H, K], from each row's own history."""
    n, h = run.arms.shape
    k = run.instances.setting.arms
    onehot = np.zeros((n, h, k))
    rows, steps = np.nonzero(run.arms >= 0)
    onehot[rows, steps, run.arms[rows, steps]] = 1.0
    counts = np.cumsum(onehot, axis=1) - onehot  # before the step
    sums = np.cumsum(onehot * run.rewards[..., None], axis=1) - onehot * run.rewards[..., None]
    return ucb_values(counts, sums, c)


def knowing_doing(pr: PolicyRun, c: float) -> dict[str, Any]:
    """The 2x3 table (% of all steps): rationale correct / incorrect x action optimal /
    greedy / other. See the module doc."""
    run = pr.run
    truth = true_ucb(run, c)  # [N, H, K]
    valid_step = run.arms >= 0  # steps with a pull (padding after a short episode is not one)
    best_true = argmax_sets(truth, tol=UCB_TOL)
    stated = np.where(np.isnan(run.reported), -np.inf, run.reported)
    has_values = ~np.all(np.isnan(run.reported), axis=-1)
    best_stated = argmax_sets(stated, tol=1e-9) & has_values[..., None]
    correct = has_values & ~np.any(best_stated & ~best_true, axis=-1)
    arm = np.maximum(run.arms, 0)
    took = np.zeros_like(best_true)
    np.put_along_axis(took, arm[..., None], True, axis=-1)
    took &= (run.arms >= 0)[..., None]
    if pr.own is not None:  # a random arm played for an invalid reply is neither optimal nor greedy
        took &= pr.own[..., None]
    optimal = np.any(took & best_true, axis=-1)
    tried = np.isfinite(truth)
    tried_vals = np.where(tried, truth, -np.inf)
    best_tried = argmax_sets(tried_vals, tol=UCB_TOL) & tried & np.any(tried, axis=-1, keepdims=True)
    greedy = ~optimal & np.any(took & best_tried, axis=-1)
    other = ~optimal & ~greedy
    total = max(1, int(valid_step.sum()))

    def pct(mask: np.ndarray) -> float:
        return round(100.0 * float((mask & valid_step).sum()) / total, 2)

    table = {
        row: {"optimal": pct(rmask & optimal), "greedy": pct(rmask & greedy), "other": pct(rmask & other)}
        for row, rmask in (("correct", correct), ("incorrect", ~correct))
    }
    return {
        "c": c,
        "steps": total,
        "table_pct": table,
        "rationale_correct_pct": pct(correct),
        "values_stated_pct": pct(has_values),
        "actions_pct": {"optimal": pct(optimal), "greedy": pct(greedy), "other": pct(other)},
    }


# ---------------------------------------------------------------------------------------
# Frequency bias


@dataclass(frozen=True)
class FBContext:
    """One frequency-bias context: a random prefix, then its last arm repeated."""

    prefix: int
    repeats: int
    history: tuple[tuple[int, float], ...]


def fb_contexts(env: Any, task_ids: Sequence[str], *, prefixes: int = 16, max_repeats: int = 100, step: int = 5,
                seed: int = 0) -> list[FBContext]:
    """Contexts for ``prefixes`` random prefixes (2-10 random arms each, on task
    ``task_ids[j % len]``) x repetitions 0, step, 2·step, ..., max_repeats."""
    if prefixes < 1 or max_repeats < 0 or step < 1:
        raise TurnRLError("frequency bias: prefixes and step must be >= 1 and max_repeats >= 0")
    rng = np.random.default_rng(seed)
    reps = list(range(0, max_repeats + 1, step))
    if reps[-1] != max_repeats:
        reps.append(max_repeats)
    k = env.setting.arms
    out = []
    for j in range(prefixes):
        inst = env.instance(task_ids[j % len(task_ids)], horizon=10 + max_repeats)
        length = int(rng.integers(2, 11))
        arms = rng.integers(0, k, size=length)
        base = [(int(a), float(inst.rewards[t, a])) for t, a in enumerate(arms)]
        last = int(arms[-1])
        for r in reps:
            extra = [(last, float(inst.rewards[length + i, last])) for i in range(r)]
            out.append(FBContext(j, r, tuple(base + extra)))
    return out


def classify_context(history: Sequence[tuple[int, float]], k: int) -> tuple[int, tuple[int, ...]]:
    """(frequent arm, greedy arms) of a context: the most frequent arm (ties: the last action
    if among them, else the lowest index) and every other arm of the best mean reward (empty
    when the frequent arm alone has it; ties are common with 0/1 rewards)."""
    counts = np.zeros(k)
    sums = np.zeros(k)
    for a, r in history:
        counts[a] += 1
        sums[a] += r
    top = np.flatnonzero(counts == counts.max())
    last = history[-1][0] if history else int(top[0])
    frequent = last if last in top else int(top[0])
    means = np.where(counts > 0, sums / np.maximum(counts, 1), -np.inf)
    best = np.flatnonzero(means >= means.max() - 1e-12)
    return int(frequent), tuple(int(a) for a in best if a != frequent)


def entropy(p: np.ndarray) -> float:
    p = np.asarray(p, dtype=float)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def scripted_scorer(algo: Algorithm, env: Any) -> Callable[[Sequence[FBContext]], np.ndarray]:
    """A scripted policy's action distribution in each context (its internal scores)."""

    def score(contexts: Sequence[FBContext]) -> np.ndarray:
        out = []
        for c in contexts:
            state = algo.init(1, env.setting)
            for a, r in c.history:
                algo.update(state, np.array([a]), np.array([r]))
            out.append(algo.probs(state)[0])
        return np.array(out)

    return score


def frequency_bias(contexts: Sequence[FBContext], probs: np.ndarray, k: int, max_repeats: int) -> dict[str, Any]:
    """Entropy per repetition count and frequent / greedy / other shares per bucket."""
    reps = sorted({c.repeats for c in contexts})
    ent: dict[int, list[float]] = {r: [] for r in reps}
    shares: dict[int, list[tuple[float, float, float]]] = {r: [] for r in reps}
    for c, p in zip(contexts, probs, strict=True):
        frequent, greedy = classify_context(c.history, k)
        f = float(p[frequent])
        g = float(sum(p[a] for a in greedy))
        ent[c.repeats].append(entropy(p))
        shares[c.repeats].append((f, g, max(0.0, 1.0 - f - g)))
    stats = [mean_ci95(ent[r]) for r in reps]
    buckets = {}
    for lo_f, hi_f in ((0.0, 0.1), (0.45, 0.55), (0.9, 1.0)):
        # inward: the counts within [lo_f, hi_f] of max_repeats, so a small max_repeats gives narrower
        # buckets, not wider ones that share counts (max_repeats 4: 0, 2, 4, not 0-1, 1-3, 3-4)
        lo, hi = math.ceil(lo_f * max_repeats - 1e-9), math.floor(hi_f * max_repeats + 1e-9)
        rows = [s for r in reps if lo <= r <= hi for s in shares[r]]
        if rows:
            m = np.mean(np.array(rows), axis=0)
            buckets[f"{lo}-{hi}"] = {"frequent": round(float(m[0]), 4), "greedy": round(float(m[1]), 4),
                                     "other": round(float(m[2]), 4), "contexts": len(rows)}
    return {
        "repetitions": reps,
        "entropy": [round(m, 4) for m, _ in stats],
        "entropy_lo": [round(ci[0], 4) for _, ci in stats],
        "entropy_hi": [round(ci[1], 4) for _, ci in stats],
        "uniform_entropy": round(math.log(k), 4),
        "shares": {str(r): [round(float(x), 4) for x in np.mean(np.array(shares[r]), axis=0)] for r in reps},
        "buckets": buckets,
        "prefixes": len({c.prefix for c in contexts}),
        "contexts": len(contexts),
    }


class ModelScorer:
    """A model's action distribution in a context from per-action log-probabilities.

    The prompt is what the agent would see (the env's instruction as system message, the
    rendered history as observation, the chat template's generation prompt); each
    candidate continuation is ``template.format(action=label)``. All candidates of one
    context go through the model in **one** batched forward pass (right-padded after a
    shared prompt, so no attention mask or position shift is needed; only the last
    positions get logits), and the distribution is the softmax of their summed log-probs.

    By default the candidates are scored at the start of the reply: the action
    distribution of a model that acts without a rationale. With ``engine`` (a generation
    engine of the same model) the model first writes its rationale (greedy decoding, all
    contexts batched in ``engine.generate`` calls); the reply is cut right after the
    template's text before ``{action}`` (``ACTION=``), or ends with it appended when the
    model never wrote it, and the labels are scored there -- the distribution of the
    decision a chain-of-thought model makes after its reasoning.
    """

    def __init__(self, model: Any, tokenizer: Any, env: Any, *, template: str = "ACTION={action}",
                 horizon: int | None = None, engine: Any = None, max_new_tokens: int = 192,
                 env_at: Callable[[int], Any] | None = None):
        from turnrl.tokenization import ChatFormat

        if template.count("{action}") != 1:
            raise TurnRLError(f"frequency-bias template must contain '{{action}}' once (got {template!r})")
        self.model = model
        self.chat = ChatFormat(tokenizer)
        self.env = env
        self.template = template
        self.horizon = horizon or env.horizon
        #: the env of a longer horizon, for a context of as many steps or more (None: ``env`` for every
        #: context, whose prompt then says that every step is done)
        self.env_at = env_at
        self._envs: dict[int, Any] = {}
        self.engine = engine
        self.max_new_tokens = max_new_tokens
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.chat.stop_token_ids[0])
        #: scoring forward passes made (one per context)
        self.calls = 0
        #: contexts whose rationale never reached the action marker (it was appended)
        self.forced = 0

    def prompt(self, history: Sequence[tuple[int, float]]) -> list[int]:
        from turnrl.data.schema import Message

        env, horizon = self.env, self.horizon
        if self.env_at is not None and len(history) >= horizon:  # the context's next step must be one to play
            horizon = len(history) + 1
            env = self._envs.get(horizon) or self._envs.setdefault(horizon, self.env_at(horizon))
        obs = env.render_history(list(history), env.labels, horizon=horizon, context=None)
        return self.chat.prompt_ids([Message("system", env.instruction), Message("user", obs)])

    def _rationales(self, prompts: list[list[int]], marker: str) -> list[list[int]]:
        """Greedy replies, cut just after ``marker`` (or with ``marker`` appended)."""
        from turnrl.rollout.engine import SamplingConfig

        sampling = SamplingConfig(temperature=0.0, max_new_tokens=self.max_new_tokens)
        stops = set(self.chat.stop_token_ids)
        tok = self.chat.tokenizer
        out = []
        for i in range(0, len(prompts), 16):
            for g in self.engine.generate(prompts[i : i + 16], sampling):
                ids = [t for t in g.token_ids if t not in stops]
                cut = None
                if marker:  # after the reply's last marker: the sampler acts on the last ACTION=
                    last = tok.decode(ids, skip_special_tokens=False).count(marker)
                    for j in range(1, len(ids) + 1):
                        text = tok.decode(ids[:j], skip_special_tokens=False)
                        if last and text.endswith(marker) and text.count(marker) == last:
                            cut = j
                            break
                if cut is None:
                    self.forced += 1
                    out.append(ids + self.chat.tokenize_text("\n" + marker) if marker else ids)
                else:
                    out.append(ids[:cut])
        return out

    def __call__(self, contexts: Sequence[FBContext]) -> np.ndarray:
        import torch

        labels = self.env.labels
        prompts = [self.prompt(c.history) for c in contexts]
        if self.engine is not None:
            marker, rest = self.template.split("{action}")
            prompts = [p + r for p, r in zip(prompts, self._rationales(prompts, marker), strict=True)]
            conts = [self.chat.tokenize_text(lab + rest) for lab in labels]
        else:
            # where the reply starts: after the space the template writes before a reply, which the prompt
            # leaves to the reply where the tokenizer reads it with the reply's first word (ChatFormat.reply_lead)
            conts = [self.chat.tokenize_text(self.chat.reply_lead + self.template.replace("{action}", lab))
                     for lab in labels]
        conts = _ended(conts, labels, self.chat)
        width = max(len(c) for c in conts)
        limit = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        device = next(self.model.parameters()).device
        out = []
        was_training = self.model.training
        self.model.eval()
        try:
            for prompt in prompts:
                if limit is not None and len(prompt) + width > limit:
                    raise TurnRLError(
                        f"frequency bias: a prompt of {len(prompt) + width} tokens exceeds the model's "
                        f"{limit} positions; lower --fb-max-repeats"
                    )
                ids = torch.full((len(conts), len(prompt) + width), self.pad_id, dtype=torch.long)
                for i, cont in enumerate(conts):
                    ids[i, : len(prompt) + len(cont)] = torch.tensor(prompt + cont, dtype=torch.long)
                with torch.inference_mode():
                    self.calls += 1
                    logits = self.model(input_ids=ids.to(device), logits_to_keep=width + 1).logits
                logp = torch.log_softmax(logits[:, :width].float(), dim=-1).cpu()  # predicts prompt end..
                scores = []
                for i, cont in enumerate(conts):
                    tok = torch.tensor(cont, dtype=torch.long)
                    scores.append(float(logp[i, torch.arange(len(cont)), tok].sum()))
                s = np.array(scores)
                p = np.exp(s - s.max())
                out.append(p / p.sum())
        finally:
            if was_training:
                self.model.train()
        return np.array(out)


def _ended(conts: list[list[int]], labels: Sequence[str], chat: Any) -> list[list[int]]:
    """The labels' continuations, each followed by the end of the agent's turn when one is a token
    prefix of another: with digits tokenized one by one, ``ACTION=1`` begins ``ACTION=13``, so its
    probability would be that of every reply beginning with it. Unchanged otherwise (a reply is then
    one label or another from its last token on)."""
    prefixed = [(a, b) for i, a in enumerate(conts) for j, b in enumerate(conts) if i != j and b[: len(a)] == a]
    if not prefixed:
        return conts
    end = chat.tokenize_text(chat.eot_text) if chat.eot_text.strip() else list(chat.stop_token_ids[:1])
    if not end:
        a, b = prefixed[0]
        raise TurnRLError(f"frequency bias: label {labels[conts.index(a)]!r} tokenizes as the start of "
                          f"{labels[conts.index(b)]!r}, and the chat template has no end-of-turn token to tell "
                          "them apart")
    return [c + end for c in conts]


# ---------------------------------------------------------------------------------------
# The whole diagnosis


@dataclass
class DiagnoseConfig:
    env: str = "bandit"
    env_opts: dict[str, Any] = field(default_factory=dict)
    instances: int = 64
    split: str = "seen"
    seed: int = 0
    #: runs per instance (None: 8 for scripted policies, 1 for models)
    runs: int | None = None
    num_envs: int = 32
    temperature: float = 0.0
    max_new_tokens: int = 192
    aids: list[str] = field(default_factory=list)
    fb_prefixes: int = 16
    fb_max_repeats: int = 100
    fb_step: int = 5
    fb_template: str = "ACTION={action}"
    #: score the action after the model's own (greedy) rationale instead of at the reply's start
    fb_rationale: bool = False
    skip: list[str] = field(default_factory=list)
    device: str | None = None


PARTS = ("regret", "coverage", "frequency-bias", "knowing-doing")


def _check_cfg(cfg: DiagnoseConfig) -> None:
    from turnrl.bandits.aids import parse_aid

    for s in cfg.skip:
        if s not in PARTS[2:]:
            raise TurnRLError(f"unknown --skip '{s}'; choose from: {', '.join(PARTS[2:])}")
    if cfg.instances < 1:
        raise TurnRLError(f"--instances must be >= 1 (got {cfg.instances})")
    if cfg.runs is not None and cfg.runs < 1:
        raise TurnRLError(f"--runs must be >= 1 (got {cfg.runs})")
    for key, value, least in (("--fb-prefixes", cfg.fb_prefixes, 1), ("--fb-step", cfg.fb_step, 1),
                              ("--fb-max-repeats", cfg.fb_max_repeats, 0)):
        if value < least:  # checked before any policy plays, not after
            raise TurnRLError(f"{key} must be >= {least} (got {value})")
    if cfg.fb_max_repeats > MAX_HORIZON - 11:  # the sweep's env plays a prefix of up to 10 and the repeats
        raise TurnRLError(f"--fb-max-repeats must be <= {MAX_HORIZON - 11} (got {cfg.fb_max_repeats})")
    if cfg.seed < 0:
        raise TurnRLError(f"--seed must be >= 0 (got {cfg.seed})")
    if cfg.fb_template.count("{action}") != 1:
        raise TurnRLError(f"--fb-template must contain '{{action}}' once (got {cfg.fb_template!r})")
    if cfg.split not in ("train", "seen", "unseen"):
        raise TurnRLError(f"unknown split '{cfg.split}'; choose from: train, seen, unseen")
    for a in cfg.aids:
        parse_aid(a)


def diagnose(policies: Sequence[str], out: str | Path, cfg: DiagnoseConfig | None = None,
             log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every diagnostic for every policy; write ``diagnostics.json`` and PNGs to ``out``."""
    from turnrl import envs
    from turnrl.bandits.aids import aid_env_options
    from turnrl.bandits.algorithms import is_algorithm_spec
    from turnrl.diagnostics import plots
    from turnrl.envs.bandit import as_bandit

    cfg = cfg or DiagnoseConfig()
    _check_cfg(cfg)
    if not policies:
        raise TurnRLError("diagnose: give at least one --policy")
    if cfg.env not in ("bandit", "contextual_bandit"):
        raise TurnRLError(f"diagnose bandit: --env must be bandit or contextual_bandit (got '{cfg.env}')")
    for spec in policies:  # bad scripted specs fail before any work starts
        if is_algorithm_spec(spec):
            make_algorithm(spec)
    if cfg.aids and all(is_algorithm_spec(spec) for spec in policies):  # they would play without them
        raise TurnRLError(f"--aid wraps model policies; every --policy here is scripted ({', '.join(policies)}): "
                          "give a model or remove --aid")
    say = log or (lambda s: None)
    env = as_bandit(envs.make(cfg.env, **cfg.env_opts), "diagnose bandit")
    task_ids = env.task_ids(cfg.split)
    if cfg.instances > len(task_ids):
        raise TurnRLError(f"--instances {cfg.instances} exceeds the {len(task_ids)} tasks of split '{cfg.split}'")
    task_ids = task_ids[: cfg.instances]
    plain = cfg.env == "bandit"
    records: list[dict[str, Any]] = []
    runs_by_label: dict[str, PolicyRun] = {}
    fb_all: dict[str, dict[str, Any]] = {}
    for spec in policies:
        scripted = is_algorithm_spec(spec)
        say(f"{spec}: {'simulating' if scripted else 'playing'} {cfg.instances} instances")
        fb_scorer: Callable[[Sequence[FBContext]], np.ndarray] | None = None
        if scripted:
            spec = with_env_c(spec, env.ucb_c, contextual=env.setting.dim > 1)
            algo = make_algorithm(spec)
            pr = scripted_run(algo, env, task_ids, runs=cfg.runs or 8, seed=cfg.seed)
            fb_scorer = scripted_scorer(make_algorithm(spec), env)
            label = pr.label
        else:
            from turnrl.bandits.aids import with_aids
            from turnrl.rollout import SamplingConfig, load_policy

            opts = {**cfg.env_opts, **aid_env_options(cfg.aids)}
            if plain:
                opts.setdefault("rationale", "ucb")
            base = load_policy(spec, sampling=SamplingConfig(temperature=cfg.temperature,
                                                             max_new_tokens=cfg.max_new_tokens),
                               history=0, device=cfg.device)
            policy = with_aids(base, cfg.aids)
            label = spec + "".join(f"+{a}" for a in cfg.aids)
            pr = model_run(policy, cfg.env, opts, task_ids, runs=cfg.runs or 1, split=cfg.split, seed=cfg.seed,
                           num_envs=cfg.num_envs, label=label)
            engine = getattr(base, "engine", None)
            if engine is not None:
                # each context is shown as the model played: its instruction and "Step t of H" say the
                # played horizon, unless the context is that long (then one step more than the context)
                def env_at(h: int, opts: dict[str, Any] = opts) -> Any:
                    return envs.make(cfg.env, **{**opts, "horizon": h})

                fb_scorer = ModelScorer(engine.model, engine.tokenizer, envs.make(cfg.env, **opts),
                                        template=cfg.fb_template, engine=engine if cfg.fb_rationale else None,
                                        max_new_tokens=cfg.max_new_tokens, env_at=env_at)
        runs_by_label[label] = pr
        rec: dict[str, Any] = {"policy": label, "kind": pr.kind, "runs": pr.runs, **pr.extra,
                               "regret": regret_summary(pr), "coverage": coverage_summary(pr)}
        if plain and "knowing-doing" not in cfg.skip:
            rec["knowing_doing"] = knowing_doing(pr, env.ucb_c)
        if plain and "frequency-bias" not in cfg.skip and fb_scorer is not None:
            say(f"{label}: frequency-bias sweep")
            ctxs = fb_contexts(env, task_ids, prefixes=cfg.fb_prefixes, max_repeats=cfg.fb_max_repeats,
                               step=cfg.fb_step, seed=cfg.seed)
            fb = frequency_bias(ctxs, fb_scorer(ctxs), env.setting.arms, cfg.fb_max_repeats)
            if isinstance(fb_scorer, ModelScorer):
                fb["forward_calls"] = fb_scorer.calls
                fb["scored_after_rationale"] = cfg.fb_rationale
                if cfg.fb_rationale:
                    fb["marker_appended"] = fb_scorer.forced
            rec["frequency_bias"] = fb
            fb_all[label] = fb
        records.append(rec)
    result = {
        "schema": SCHEMA,
        "env": cfg.env,
        "env_opts": cfg.env_opts,
        "arms": env.setting.arms,
        "horizon": env.horizon,
        "split": cfg.split,
        "instances": cfg.instances,
        "seed": cfg.seed,
        "aids": cfg.aids,
        "policies": records,
        "comparisons": _comparisons(records, cfg.instances),
    }
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # diagnostics.json is what says a folder is complete: an earlier run's goes before this run's first
    # plot, so that a kill among the plots leaves no JSON beside a mix of two runs' PNGs; this run's is last
    (out / "diagnostics.json").unlink(missing_ok=True)
    pngs = [plots.plot_regret(records, out / "regret.png", title=_title(env, cfg)),
            plots.plot_coverage(records, out / "coverage.png", title=_title(env, cfg))]
    if fb_all:
        pngs.append(plots.plot_frequency_bias(fb_all, out / "frequency_bias.png"))
    kd = {r["policy"]: r["knowing_doing"] for r in records if "knowing_doing" in r}
    if kd:
        pngs.append(plots.plot_knowing_doing(kd, out / "knowing_doing.png"))
    drawn = [p.name for p in pngs]
    result["plots"] = drawn
    for name in PLOTS:  # an earlier run's plot this one did not draw would read as this run's
        if name not in drawn:
            (out / name).unlink(missing_ok=True)
    _write_json(out / "diagnostics.json", result)
    return result


#: every plot ``diagnose`` may write
PLOTS = ("regret.png", "coverage.png", "frequency_bias.png", "knowing_doing.png")


def _title(env: Any, cfg: DiagnoseConfig) -> str:
    if cfg.env == "bandit":
        what = f"{env.arms}-arm {env.dist} bandit, {env.noise} noise"
    else:
        what = f"contextual bandit, {env.items} movies, {env.noise} noise"
    return f"{what}, {cfg.instances} instances"


def _comparisons(records: Sequence[dict[str, Any]], instances: int) -> list[dict[str, Any]]:
    """Pairs of policies: final regret, whether their 95% CIs overlap (``None`` with one instance,
    where a CI is a point and says nothing)."""
    out = []
    for i, a in enumerate(records):
        for b in records[i + 1 :]:
            ra, rb = a["regret"], b["regret"]
            lo_a, hi_a = ra["final_ci95"]
            lo_b, hi_b = rb["final_ci95"]
            out.append({"a": a["policy"], "b": b["policy"], "a_final": ra["final"], "b_final": rb["final"],
                        "ci_overlap": not (hi_a < lo_b or hi_b < lo_a) if instances > 1 else None})
    return out


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, default=_jsonable) + "\n")
    os.replace(tmp, path)


def _jsonable(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


__all__ = [
    "DiagnoseConfig", "FBContext", "ModelScorer", "PolicyRun", "classify_context", "coverage_summary", "diagnose",
    "entropy", "fb_contexts", "frequency_bias", "knowing_doing", "model_run", "regret_summary", "scripted_run",
    "scripted_scorer", "true_ucb",
]
