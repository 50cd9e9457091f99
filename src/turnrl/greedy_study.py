"""The greedy-agents study on the tiny model (seed 004; ``turnrl study greedy``).

Rows, on a 10-arm Gaussian bandit (medium noise, sigma 1; horizon 50, regret and coverage
at step 50) and on tic-tac-toe:

* **untrained** tiny model;
* **greedy-like SFT**: SFT on a scripted policy's episodes (``greedy_policy``) with one-word
  rationales. The paper starts RLFT from pretrained LLMs that are greedy; this is the stand-in:
  with greedy decoding it commits to its first arm (coverage 0.1), while sampling at
  temperature 1 still explores, so RLFT has something to reinforce. Five designs
  (:data:`DESIGNS`, ``--design``): ``commit`` (:data:`FULL`, measured 23-24 Nov) SFTs on
  epsilon-greedy (eps 0.3) with 3 history lines at lr 3e-3; ``knowing-doing``
  (:data:`KNOWING_DOING`) SFTs on a lose-shift policy that acts on its own ``Low.`` rationale
  only 30% of the time, with one history line at lr 1e-3, so the start knows when to move on
  and does not (the knowing-doing gap of seed 004); ``best-summary`` (:data:`BEST_SUMMARY`)
  shows no history line but the best and the untried arms (``summary=best``), so that both
  exploiting and exploring are a label to copy; ``untried-copy`` (:data:`UNTRIED_COPY`) is that
  prompt with a start SFT'd on data whose exploring replies copy a listed untried label;
  ``narrow-gap`` (:data:`NARROW_GAP`) is the knowing-doing design with a start that acts on 45% of
  its ``Low.`` rationales, so RLFT has less to move before greedy decoding moves on. On
  tic-tac-toe the random-move SFT (an aimless player) is a reference row;
* **UCB SFT / minimax SFT**: SFT on the expert's thought-cloning data (reference rows; the
  knowing-doing design adds the lose-shift SFT that always acts on its rationale; on
  tic-tac-toe the minimax SFT, 3 epochs on 100 games, has the answer format but still writes
  many invalid moves, and is RLFT's start);
* **RLFT**: PPO (:mod:`turnrl.train.ppo`) from the greedy-like SFT, ``seeds`` seeds (on
  tic-tac-toe from the minimax SFT, against the random opponent, with ``turnrl train ppo``'s
  defaults for 40 iterations of 16 games: value head and GAE, lr 1e-4, -1 per invalid reply);
* **RLFT + bonus**: the same with the exploration bonus (+1 for an untried action).

Each stage writes its output under ``--out`` and is skipped when that output exists, so a
killed study resumes; the stages of the issue's claims run first, the reference rows after
them. Bandit evaluation: greedy decoding (temperature 0) on the same ``instances`` seen tasks
for every row: a one-model row (untrained, SFT) has one evaluation, a trained row one per
seed; the 95% CI is Student-t over the seeds (none for a one-model row or one seed: "one value:
no CI"), the CI by instance (each instance's mean over the seeds, across instances) is reported
too, and so is the paired per-instance difference of each RLFT row and its starting policy. Rows
that did not run are listed as not run. Tic-tac-toe: greedy games against the random and the
minimax opponent. Every row plays the same ``ttt_games`` seen games (the task id fixes the
opponent's moves); the seed 1000 + s only draws the random cell played for an invalid reply, so
RLFT seed s and its start meet the same games and the same stand-ins (the paired difference per
seed), and a one-model row's spread over seeds comes from those stand-ins alone.

Compute choices for the tiny model on a shared 2-core CPU (all in :data:`FULL`): a short
instruction (``instruction``) instead of the env's 170-token one, C = 3 history steps,
one-word rationales ("Stay." / "Untried.", a reply of 10-11 tokens with this tokenizer)
and thinking budget G = 16 tokens; PPO rollouts of ``ppo_horizon`` = 20 steps (the policy
sees only the last 3 steps, and evaluation is at 50) of which 4 random turns train. The
measured runs and their outcomes are in docs/rlft.md.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from turnrl.errors import TurnRLError
from turnrl.stats import mean_ci95

ARMS = 10
LABELS = ("blue", "green", "red", "yellow", "purple", "orange", "pink", "brown", "black", "white")
BANDIT_INSTRUCTION = (
    f"You press one of {ARMS} buttons: {', '.join(LABELS)}. Each has a fixed unknown mean reward. "
    "Maximize the total reward. Give a one-word rationale, then ACTION=X."
)
TTT_INSTRUCTION = (
    "Tic-tac-toe: you play X against O on cells 0-8. Three in a row wins. "
    "Respond as: Thought: <short>\nAction: <cell number>"
)

FULL: dict[str, Any] = {
    "bandit_env": {"arms": ARMS, "noise": "medium", "horizon": 50, "context": 3},
    "greedy_policy": "epsilon-greedy:eps=0.3", "ppo_horizon": 20,
    "sft_episodes": 80, "sft_steps": 60, "sft_lr": 3e-3, "sft_batch": 16,
    "ppo": {"iterations": 4, "episodes_per_iter": 8, "turns_per_episode": 4, "ppo_epochs": 2, "minibatches": 1,
            "batch_size": 8, "lr": 2e-3, "max_new_tokens": 16, "gamma": 0.95, "beta_kl": 0.02, "warmup_ratio": 0.1},
    "instances": 50,
    # tic-tac-toe: both SFTs 3 epochs on 100 games (batch 16, lr 2e-3); RLFT from the minimax SFT with
    # ``turnrl train ppo``'s defaults (lr 1e-4, value head + GAE) for 40 iterations of 16 games
    "ttt_sft_episodes": 100, "ttt_sft_steps": 0, "ttt_sft_epochs": 3.0, "ttt_sft_lr": 2e-3,
    "ttt_ppo": {"iterations": 40, "episodes_per_iter": 16, "num_envs": 16, "max_new_tokens": 32,
                "invalid_penalty": -1.0},
    "ttt_games": 100,
}
#: the second bandit design (26 Nov 2026): a start with a knowing-doing gap. Its SFT data is the
#: scripted ``lose-shift`` policy that shifts after only 30% of its low rewards (``follow`` 0.3)
#: while its rationale always says ``Low.``; the prompt shows one history line (``context`` 1), the
#: one thing the tiny model was shown to read (docs/rlft.md), and SFT runs at lr 1e-3, at which it
#: learns to copy a label (lr 3e-3 does not). Greedy decoding of that start stays on its first arm;
#: RLFT has to make "move on after Low." the most likely reply. References: UCB SFT (what the issue
#: names; with one history line the model cannot see what UCB uses) and the lose-shift SFT that
#: follows its rationale every time (``follow`` 1).
KNOWING_DOING: dict[str, Any] = {
    **FULL,
    "bandit_env": {"arms": ARMS, "noise": "medium", "horizon": 50, "context": 1},
    "greedy_policy": "lose-shift:threshold=-0.5,follow=0.3", "ppo_horizon": 20,
    "sft_episodes": 200, "sft_steps": 800, "sft_lr": 1e-3, "sft_batch": 16,
    "ref_policies": [("UCB SFT", "ucb", "ucb", 800), ("lose-shift SFT", "lose-shift:threshold=-0.5", "lose-shift", 1500)],
    # the first attempt (lr 1e-3, beta_KL 0.02, 16 iterations) diverged: docs/rlft.md
    "ppo": {"iterations": 20, "episodes_per_iter": 16, "num_envs": 16, "turns_per_episode": 0, "ppo_epochs": 2,
            "minibatches": 2, "batch_size": 4, "lr": 5e-4, "max_new_tokens": 16, "gamma": 0.95, "beta_kl": 0.1,
            "warmup_ratio": 0.1},
}
#: the third bandit design (27 Nov 2026): both choices are a label to copy. The prompt carries no
#: history line but ``summary=best`` (``Best so far: red 0.83 (3x). Untried: green, yellow.``), and
#: the start is SFT'd at lr 1e-3 for 1500 steps (at 800 the tiny model had not learned to copy the
#: named arm, docs/rlft.md) on epsilon-greedy (0.3) episodes whose rationales are ``Best.`` /
#: ``Other.`` / ``Untried.``; greedy decoding of it says ``Best.`` and stays on its first arm. What
#: RLFT + bonus has to learn is to say ``Untried.`` while the prompt names untried arms ("try every
#: arm once, then greedy": regret 12.1 against committing's 20.0 in simulation, docs/rlft.md).
#: References: UCB SFT, and the SFT on that explore-first policy (greedy with optimistic initial
#: values). PPO: the knowing-doing settings.
BEST_SUMMARY: dict[str, Any] = {
    **KNOWING_DOING,
    "bandit_env": {"arms": ARMS, "noise": "medium", "horizon": 50, "context": 0, "summary": "best"},
    "greedy_policy": "epsilon-greedy:eps=0.3", "sft_steps": 1500,
    "ref_policies": [("UCB SFT", "ucb", "ucb", 1500), ("explore-first SFT", "greedy:init=100", "explore-first", 1500)],
}
#: the fourth bandit design (27 Nov 2026, evening): the best-summary prompt, but a start SFT'd on data in
#: which ``Untried.`` always copies a listed untried label. In the best-summary run the start's epsilon-greedy data
#: explored with a random arm, often a tried one, so ``Untried.`` never became a copy, and the bonus seed that
#: learned to say it still played one label. Here the exploring step of the SFT data takes a random *untried*
#: arm (``untried=1``), so both rationales are copies; with eps 0.3 greedy decoding still says ``Best.`` and
#: stays on its first arm. SFT 3000 steps (after 1500, sampled ``Untried.`` replies played a listed label
#: only 72% of the time, below the pre-registered 80%: docs/rlft.md). PPO: the knowing-doing settings with
#: gamma 0.5 instead of 0.95, because there the +1 bonus was small against Monte-Carlo returns of 20 noisy steps.
UNTRIED_COPY: dict[str, Any] = {
    **BEST_SUMMARY,
    "greedy_policy": "epsilon-greedy:eps=0.3,untried=1", "sft_steps": 3000,
    "ppo": {**KNOWING_DOING["ppo"], "gamma": 0.5},
}
#: the fifth bandit design (27 Nov 2026, night): the knowing-doing design with a narrower gap. Its start moves on
#: after 45% of its low rewards (``follow`` 0.45) instead of 30%: greedy decoding still repeats the last arm (55%
#: against 45%), so the start commits, but RLFT only has to move that one choice past one half. In the knowing-doing
#: runs the sampled policy did learn to move on more often and its greedy reply stayed in 7 of 10 seeds
#: (docs/rlft.md). PPO: the knowing-doing settings with the lr kept constant after the warm-up, as in that
#: design's last reading.
NARROW_GAP: dict[str, Any] = {
    **KNOWING_DOING,
    "greedy_policy": "lose-shift:threshold=-0.5,follow=0.45",
    "ppo": {**KNOWING_DOING["ppo"], "lr_schedule": "constant"},
}
#: ``turnrl study greedy --design``: the bandit design (tic-tac-toe is the same in all)
DESIGNS = {"commit": FULL, "knowing-doing": KNOWING_DOING, "best-summary": BEST_SUMMARY,
           "untried-copy": UNTRIED_COPY, "narrow-gap": NARROW_GAP}
FAST: dict[str, Any] = {
    "bandit_env": {"arms": ARMS, "noise": "medium", "horizon": 6, "context": 3},
    "greedy_policy": "epsilon-greedy:eps=0.3", "ppo_horizon": 4,
    "sft_episodes": 16, "sft_steps": 4, "sft_lr": 3e-3, "sft_batch": 8,
    "ppo": {"iterations": 1, "episodes_per_iter": 4, "turns_per_episode": 2, "ppo_epochs": 1, "minibatches": 1,
            "batch_size": 2, "lr": 5e-4, "max_new_tokens": 16, "gamma": 0.8, "beta_kl": 0.05},
    "instances": 4,
    "ttt_sft_episodes": 16, "ttt_sft_steps": 3, "ttt_sft_epochs": 1.0, "ttt_sft_lr": 2e-3,
    "ttt_ppo": {"iterations": 1, "episodes_per_iter": 4, "ppo_epochs": 1, "minibatches": 1, "batch_size": 2,
                "lr": 5e-4, "max_new_tokens": 32, "gamma": 1.0, "beta_kl": 0.05, "invalid_penalty": -1.0},
    "ttt_games": 4,
}


# --------------------------------------------------------------------------- data


class CompactBanditPolicy:
    """A scripted bandit algorithm whose replies are a one-word rationale and ``ACTION=X``:
    ``Start.`` (nothing tried yet), ``Untried.`` (an arm never pulled), ``Stay.`` (the arm
    pulled last), ``Switch.`` (another tried arm); with the env's ``summary=best``,
    ``Best.`` (a tried arm of the highest mean) and ``Other.`` (another tried arm) replace
    ``Stay.`` and ``Switch.``; for ``lose-shift``, ``Low.`` / ``High.`` (the last reward against
    its threshold: what one history line shows)."""

    def __init__(self, spec: str):
        from turnrl.bandits.algorithms import make_algorithm
        from turnrl.bandits.scripted import ScriptedAgent

        self.agent = ScriptedAgent(make_algorithm(spec))
        self.name = spec
        algo = self.agent.algo
        self.threshold = float(algo.params["threshold"]) if algo.name == "lose-shift" else None

    def act(self, requests: Sequence[Any]) -> list[Any]:
        from turnrl.bandits.policies import bandit_env
        from turnrl.envs.bandit import BEST_SUMMARIES
        from turnrl.rollout.policies import Reply

        out = []
        for r in requests:
            env = bandit_env(r.env, self.name)
            d = self.agent.decide(env, np.random.default_rng(r.rng.getrandbits(64)))
            thought = compact_thought(env.history, d.arm, best=env.summary in BEST_SUMMARIES, arms=len(env.labels),
                                      threshold=self.threshold)
            out.append(Reply(f"{thought}\nACTION={d.label}"))
        return out


def compact_thought(history: Sequence[tuple[int | None, float]], arm: int, best: bool = False,
                    arms: int = ARMS, threshold: float | None = None) -> str:
    tried = [a for a, _ in history if a is not None]
    if not tried:
        return "Start."
    if threshold is not None:  # lose-shift: was the last valid pull's reward low?
        return "Low." if [r for a, r in history if a is not None][-1] < threshold else "High."
    if arm not in tried:
        return "Untried."
    if best:  # the arm that summary=best names (a tie for the best mean counts as best too)
        from turnrl.envs.bandit import arm_stats, best_tried

        counts, sums = arm_stats(history, arms)
        b = best_tried(counts, sums)
        return "Best." if sums[arm] / counts[arm] >= sums[b] / counts[b] else "Other."
    return "Stay." if tried[-1] == arm else "Switch."


def _collect(policy: Any, env: str, env_opts: dict[str, Any], instruction: str, path: Path, episodes: int,
             seed: int = 0) -> None:
    from turnrl.agent.prompting import PromptConfig
    from turnrl.collect import run_policy

    if path.exists():
        return
    tmp = path.with_suffix(".partial.jsonl")
    run_policy(policy, env, split="train", episodes=episodes, env_opts=env_opts, num_envs=32, seed=seed,
               prompt=PromptConfig(history=0, instruction=instruction), out=tmp)
    tmp.rename(path)


def check_budget(data: Path, budget: int, model: str = "tiny") -> int:
    """The longest agent reply of ``data`` in tokens (with the end-of-turn token); a one-line
    error when it exceeds the thinking budget G, because the SFT'd model would then be cut
    before its ``ACTION=`` and every sampled reply would count as invalid."""
    from turnrl.data.io import iter_trajectories
    from turnrl.models.loading import load_tokenizer
    from turnrl.tokenization import ChatFormat

    chat = ChatFormat(load_tokenizer(model))
    eot = len(chat.stop_token_ids[:1])
    longest = max(len(chat.tokenize_text(chat.reply_lead + m.content)) + eot for t in iter_trajectories(data)
                  for m in t.messages if m.role == "assistant")
    if longest > budget:
        raise TurnRLError(f"{data}: replies of up to {longest} tokens exceed the thinking budget "
                          f"max_new_tokens={budget}; raise it")
    return longest


def _sft(data: Path, out: Path, steps: int, lr: float, batch: int, seed: int = 0, epochs: float = 1.0) -> Path:
    """SFT of the tiny model on ``data``: ``steps`` optimizer steps, or ``epochs`` when ``steps`` is 0."""
    from turnrl.pipelines.iterative import stage_lock
    from turnrl.train.sft import SFTConfig, train_sft

    with stage_lock(out):  # a worker of a killed study may still train here: wait for it, then skip
        if not (out / "summary.json").exists():
            cfg = SFTConfig(history=0, max_steps=steps, epochs=epochs, lr=lr, batch_size=batch, row_tokens=2048,
                            warmup_ratio=0.05, seed=seed, save_every=50)
            train_sft("tiny", data, out, cfg, resume=True)
    return out / "model"


def _ppo(model: Path, env: str, out: Path, settings: dict[str, Any]) -> Path:
    from turnrl.pipelines.iterative import stage_lock
    from turnrl.train.ppo import PPOConfig, train_ppo

    with stage_lock(out):  # a worker of a killed study may still train here: wait for it, then skip
        if not (out / "summary.json").exists():
            cfg = PPOConfig(**settings)  # a checkpoint at every iteration's end
            train_ppo(str(model), env, out, cfg.model_copy(update={"save_every": cfg.ppo_epochs * cfg.minibatches}),
                      resume=True)
    return out / "model"


# --------------------------------------------------------------------------- evaluation


def _model_policy(model: str | Path, max_new_tokens: int, temperature: float = 0.0) -> Any:
    from turnrl.rollout import SamplingConfig, load_policy

    return load_policy(str(model), sampling=SamplingConfig(temperature=temperature, max_new_tokens=max_new_tokens),
                       history=0)


def bandit_eval(model: str | Path, env_opts: dict[str, Any], task_ids: Sequence[str], max_new_tokens: int,
                instruction: str, temperature: float = 0.0, seed: int = 0) -> dict[str, Any]:
    """Episodes of ``model`` on ``task_ids`` (greedy unless ``temperature`` > 0, then sampled with
    torch seeded by ``seed``): regret, coverage, knowing-doing."""
    import random as _random

    from turnrl import envs
    from turnrl.agent.prompting import PromptConfig
    from turnrl.bandits.simulate import Run
    from turnrl.devices import forked_rng
    from turnrl.diagnostics.bandit import PolicyRun, coverage_summary, knowing_doing, regret_summary
    from turnrl.envs.bandit import BEST_SUMMARIES, best_tried
    from turnrl.rollout.sampler import EpisodeSpec, Sampler, invalid_rate

    policy = _model_policy(model, max_new_tokens, temperature)
    specs = [EpisodeSpec(i, "seen", tid, _random.Random(f"eval/{tid}").randrange(2**31))
             for i, tid in enumerate(task_ids)]
    sampler = Sampler(lambda: envs.make("bandit", **env_opts), policy, env_name="bandit",
                      num_envs=len(specs), prompt=PromptConfig(history=0, instruction=instruction))
    try:
        with forked_rng(seed):
            trajs = sampler.run(specs)
    finally:
        sampler.close()
    env: Any = envs.make("bandit", **env_opts)
    inst = env.instances(list(task_ids))
    n, h, k = inst.mu.shape
    arms = np.full((n, h), -1, dtype=np.int64)
    rewards = np.zeros((n, h))
    own = np.zeros((n, h), dtype=bool)  # steps whose arm the model chose (not an invalid reply's stand-in)
    low = moved = 0  # replies whose rationale is ``Low.``, and those of them that left the last arm
    # summary=best: per rationale word (``Best.`` / ``Untried.``), replies and those whose arm is the
    # one the word names (the best tried arm, ties included / an arm never pulled)
    said = {"Best.": [0, 0], "Untried.": [0, 0]}
    for row, traj in enumerate(trajs):  # replay to recover the arms (as diagnostics.model_run)
        env.reset(options={"task_id": traj.task_id})
        t, last = 0, None
        counts, sums = np.zeros(k), np.zeros(k)
        for msg in traj.messages:
            if msg.role != "assistant" or msg.action is None or t >= h:
                continue
            _, reward, _, _, info = env.step(msg.action)
            arms[row, t] = -1 if info["arm"] is None else int(info["arm"])
            rewards[row, t] = reward
            own[row, t] = msg.valid is not False
            if info["arm"] is not None:
                arm = int(info["arm"])
                # an invalid reply's executed random fallback is not the model's choice: not counted
                text = msg.content.lstrip() if msg.valid is not False else ""
                if text.startswith("Low.") and last is not None:
                    low += 1
                    moved += arm != last
                word = next((w for w in said if text.startswith(w)), None)
                if word is not None and counts.any():
                    b = best_tried(counts, sums)
                    right = (counts[arm] == 0 if word == "Untried."
                             else counts[arm] > 0 and sums[arm] / counts[arm] >= sums[b] / counts[b])
                    said[word][0] += 1
                    said[word][1] += int(right)
                last = arm  # the last pull the prompt shows
                counts[arm] += 1
                sums[arm] += reward
            t += 1
    pr = PolicyRun(str(model), "model", Run(inst, arms, rewards, np.full((n, h, k), np.nan)), 1, own=own)
    reg = regret_summary(pr)
    cov = coverage_summary(pr)
    kd = knowing_doing(pr, env.ucb_c)
    per_regret = pr.per_instance(np.cumsum(inst.mu.max(axis=-1) - np.take_along_axis(
        inst.mu, np.maximum(arms, 0)[..., None], axis=-1)[..., 0], axis=1))[:, -1]
    per_cov = (np.array([len(set(r[r >= 0].tolist())) for r in arms]) / k)
    return {"regret": reg, "coverage": cov, "actions_pct": kd["actions_pct"], "invalid": invalid_rate(trajs),
            "final_regret": per_regret.tolist(), "final_coverage": per_cov.tolist(),
            "low_replies": low, "moves_on_low": moved / low if low else None,
            **({"said": {w: {"replies": n, "right": r} for w, (n, r) in said.items()}}
               if env.summary in BEST_SUMMARIES else {})}


def ttt_eval(model: str | Path, opponent: str, games: int, max_new_tokens: int, instruction: str,
             seed: int, temperature: float = 0.0) -> dict[str, Any]:
    """``games`` tic-tac-toe games of ``model`` (greedy unless ``temperature`` > 0, then sampled
    with torch seeded by ``seed``) against ``opponent``: returns, mean, invalid rate, win rate."""
    from turnrl.agent.prompting import PromptConfig
    from turnrl.collect import run_policy
    from turnrl.devices import forked_rng
    from turnrl.rollout.sampler import invalid_rate

    with forked_rng(seed):
        trajs = run_policy(_model_policy(model, max_new_tokens, temperature), "tictactoe", split="seen",
                           episodes=games, env_opts={"opponent": opponent}, num_envs=games, seed=seed,
                           prompt=PromptConfig(history=0, instruction=instruction))
    returns = [t.return_ for t in trajs]
    return {"returns": returns, "mean": float(np.mean(returns)), "invalid": invalid_rate(trajs),
            "win": float(np.mean([t.success for t in trajs]))}


def _cached(path: Path, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    if path.exists():
        return dict(json.loads(path.read_text()))
    res = fn()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(res) + "\n")
    tmp.rename(path)
    return res


# --------------------------------------------------------------------------- the study


def _ci(values: Sequence[float]) -> dict[str, Any]:
    m, (lo, hi) = mean_ci95(list(values))
    return {"mean": round(m, 3), "ci95": [round(lo, 3), round(hi, 3)], "n": len(values)}


def _by_unit(per_seed: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Each instance's (or game's) mean over the seeds, then the 95% CI across instances: every seed
    plays the same instances, so pooling seeds x instances would count each instance once per seed."""
    rows = [list(map(float, r)) for r in per_seed]
    if len({len(r) for r in rows}) != 1:  # not the same instances: nothing to average by instance
        return _ci([x for r in rows for x in r])
    return _ci(np.mean(np.array(rows), axis=0).tolist())


def _fmt_ci(d: dict[str, Any], digits: int = 2, sign: str = "") -> str:
    """``[lo, hi]``, or a word where one value gives no interval (a one-model row, one seed)."""
    if d.get("n", 2) < 2:
        return "(one value: no CI)"
    return f"[{d['ci95'][0]:{sign}.{digits}f}, {d['ci95'][1]:{sign}.{digits}f}]"


def _key(label: str) -> str:
    return label.replace(" ", "_").replace("+", "plus")


def _eval_bandit_job(path: str, model: str, env_opts: dict[str, Any], ids: list[str], g: int) -> str:
    _cached(Path(path), lambda: bandit_eval(model, env_opts, ids, g, BANDIT_INSTRUCTION))
    return path


def _eval_ttt_job(path: str, model: str, opp: str, games: int, g: int, seed: int) -> str:
    _cached(Path(path), lambda: ttt_eval(model, opp, games, g, TTT_INSTRUCTION, seed=seed))
    return path


def _worker_init() -> None:
    import os

    import torch

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TURNRL_PROGRESS", "0")
    torch.set_num_threads(1)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


class _Pool:
    """Runs stage functions in ``jobs`` worker processes (in-process when ``jobs`` is 1)."""

    def __init__(self, jobs: int, log: Callable[[str], None]):
        self.jobs, self.log = jobs, log
        self.ex: Any = None
        if jobs > 1:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            self.ex = ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn"), initializer=_worker_init)

    def run(self, tasks: Sequence[tuple[str, Callable[..., Any], tuple[Any, ...]]]) -> list[Any]:
        if self.ex is None:
            out = []
            for name, fn, args in tasks:
                self.log(name)
                out.append(fn(*args))
            return out
        futs = []
        for name, fn, args in tasks:
            self.log(f"{name} (queued)")
            futs.append((name, self.ex.submit(fn, *args)))
        results = []
        for name, f in futs:
            results.append(f.result())
            self.log(f"{name}: done")
        return results

    def close(self) -> None:
        if self.ex is not None:
            self.ex.shutdown()


def ref_policies(cfg: dict[str, Any]) -> list[tuple[str, str, str, int]]:
    """The reference SFT rows: (row label, scripted policy, file key, SFT steps); UCB by default."""
    return [tuple(r) for r in cfg.get("ref_policies", [("UCB SFT", "ucb", "ucb", cfg["sft_steps"])])]


def plan_bandit(out: Path, seeds: int, cfg: dict[str, Any]) -> dict[str, Any]:
    from turnrl import envs

    env_opts = dict(cfg["bandit_env"])
    env: Any = envs.make("bandit", **env_opts)
    ids = env.task_ids("seen")
    n = cfg["instances"]
    refs = ref_policies(cfg)
    models = {"untrained": ["tiny"] * seeds, "greedy-like SFT": [str(out / "sft-greedy" / "model")] * seeds,
              **{label: [str(out / f"sft-{key}" / "model")] * seeds for label, _, key, _ in refs},
              "RLFT": [str(out / f"rlft-s{s}" / "model") for s in range(seeds)],
              "RLFT + bonus": [str(out / f"rlft-bonus-s{s}" / "model") for s in range(seeds)]}
    seed = cfg.get("start_seed", 0)
    sft = [("bandit SFT greedy", _sft, (out / "data" / "greedy.jsonl", out / "sft-greedy", cfg["sft_steps"],
                                        cfg["sft_lr"], cfg["sft_batch"], seed))]
    sft += [(f"bandit {label}", _sft, (out / "data" / f"{key}.jsonl", out / f"sft-{key}", steps, cfg["sft_lr"],
                                       cfg["sft_batch"], seed)) for label, _, key, steps in refs]
    rl = []
    for s in range(seeds):
        for label, bonus, tag in (("RLFT", 0.0, "rlft"), ("RLFT + bonus", 1.0, "rlft-bonus")):
            settings = {**cfg["ppo"], "seed": s, "exploration_bonus": bonus, "instruction": BANDIT_INSTRUCTION,
                        "env_opts": {**env_opts, "horizon": cfg.get("ppo_horizon", env_opts["horizon"])}}
            rl.append((f"bandit {label} seed {s}", _ppo, (out / "sft-greedy" / "model", "bandit",
                                                          out / f"{tag}-s{s}", settings)))
    # every row is evaluated on the same ``instances`` seen tasks; a row of one model (the
    # untrained and SFT rows) has one evaluation, a trained row one per seed
    evals = {label: [(f"bandit eval {label} seed {s}", _eval_bandit_job,
                      (str(out / "eval" / f"bandit-{_key(label)}-s{s}.json"), m, env_opts, list(ids[:n]),
                       cfg["ppo"]["max_new_tokens"]))
                     for s, m in enumerate(ms[:1] if len(set(ms)) == 1 else ms)] for label, ms in models.items()}
    return {"sft": sft[:1], "rl": rl, "evals": evals, "ref_sft": sft[1:],
            "main": ("greedy-like SFT", "RLFT", "RLFT + bonus"), "order": 0}


def collect_bandit(out: Path, cfg: dict[str, Any]) -> None:
    """The bandit part's SFT data. ``cfg["start_seed"]`` (0 when absent, so the documented study folders
    resume unchanged) seeds its train instances and the scripted policies' draws, and :func:`plan_bandit`'s
    SFTs: another ``start_seed`` is another greedy-like start of the same design."""
    env_opts = dict(cfg["bandit_env"])
    (out / "data").mkdir(parents=True, exist_ok=True)
    seed = cfg.get("start_seed", 0)
    _collect(CompactBanditPolicy(cfg["greedy_policy"]), "bandit", env_opts, BANDIT_INSTRUCTION,
             out / "data" / "greedy.jsonl", cfg["sft_episodes"], seed=seed)
    for _, spec, key, _ in ref_policies(cfg):
        _collect(CompactBanditPolicy(spec), "bandit", env_opts, BANDIT_INSTRUCTION, out / "data" / f"{key}.jsonl",
                 cfg["sft_episodes"], seed=seed)
    for key in ["greedy", *(r[2] for r in ref_policies(cfg))]:
        check_budget(out / "data" / f"{key}.jsonl", cfg["ppo"]["max_new_tokens"])


def aggregate_bandit(out: Path, seeds: int, cfg: dict[str, Any], evals: dict[str, list[Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {"rows": {}, "env": cfg["bandit_env"], "instances_per_seed": cfg["instances"],
                              "seeds": seeds}
    curves = []
    per_instance: dict[str, list[list[float]]] = {}
    for label, all_tasks in evals.items():
        tasks = [t for t in all_tasks if Path(t[2][0]).exists()]
        if len(tasks) < len(all_tasks):  # a row with some seeds' evaluations missing is not one to report
            result.setdefault("not_run", []).append(label)
            continue
        per_seed = [json.loads(Path(t[2][0]).read_text()) for t in tasks]
        regrets = [float(np.mean(p["final_regret"])) for p in per_seed]
        covs = [float(np.mean(p["final_coverage"])) for p in per_seed]
        pooled_r = _by_unit([p["final_regret"] for p in per_seed])
        pooled_c = _by_unit([p["final_coverage"] for p in per_seed])
        acts = {a: round(float(np.mean([p["actions_pct"][a] for p in per_seed])), 1)
                for a in ("optimal", "greedy", "other")}
        result["rows"][label] = {
            "regret_seeds": _ci(regrets), "coverage_seeds": _ci(covs), "regret_pooled": pooled_r,
            "coverage_pooled": pooled_c, "regret_per_seed": regrets, "coverage_per_seed": covs,
            "actions_pct": acts, "invalid": round(float(np.mean([p["invalid"] for p in per_seed])), 4),
        }
        low = sum(p.get("low_replies", 0) for p in per_seed)
        if low:  # the knowing-doing gap of a lose-shift rationale: how often ``Low.`` is acted on (pooled)
            moved = sum(p["moves_on_low"] * p["low_replies"] for p in per_seed if p.get("low_replies"))
            result["rows"][label].update(low_replies=low, moves_on_low=round(float(moved / low), 4))
        if any("said" in p for p in per_seed):  # summary=best: the words that name their arm (pooled)
            result["rows"][label]["said"] = {w: {k: sum(p["said"][w][k] for p in per_seed) for k in ("replies", "right")}
                                             for w in per_seed[0]["said"]}
        per_instance[label] = [p["final_regret"] for p in per_seed]
        curves.append({"policy": label, "regret": _mean_curve([p["regret"] for p in per_seed]),
                       "coverage": _mean_curve([p["coverage"] for p in per_seed])})
    result["curves"] = curves
    result["paired"] = paired_vs_start(per_instance)
    return result


def paired_vs_start(per_instance: dict[str, list[list[float]]], start: str = "greedy-like SFT") -> dict[str, Any]:
    """Regret@H of each trained row minus that of its starting policy on the same instances:
    per seed the mean difference (95% CI over seeds), and by instance (each instance's difference
    averaged over the seeds, 95% CI across instances; ``diff_pooled``)."""
    if start not in per_instance:
        return {}
    base = np.array(per_instance[start][0])
    out: dict[str, Any] = {}
    for label in ("RLFT", "RLFT + bonus"):
        if label not in per_instance:
            continue
        diffs = [np.array(r) - base for r in per_instance[label]]
        out[label] = {"diff_seeds": _ci([float(d.mean()) for d in diffs]),
                      "diff_pooled": _by_unit(diffs)}
    return out


def _mean_curve(curves: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The mean of per-seed curves with a 95% CI across seeds; one curve (a row of one model) keeps
    its own CI, across instances."""
    if len(curves) == 1:
        return {k: list(curves[0][k]) for k in ("mean", "lo", "hi")}
    means = np.array([c["mean"] for c in curves])
    m = means.mean(axis=0)
    from turnrl.stats import t975

    half = t975(len(curves) - 1) * means.std(axis=0, ddof=1) / math.sqrt(len(curves))
    return {"mean": m.round(4).tolist(), "lo": (m - half).round(4).tolist(), "hi": (m + half).round(4).tolist()}


TTT_OPTS = {"opponent": "random", "expert_ties": "ordered"}


def collect_ttt(out: Path, cfg: dict[str, Any]) -> None:
    from turnrl.rollout import ExpertPolicy, RandomPolicy

    (out / "data").mkdir(parents=True, exist_ok=True)
    _collect(RandomPolicy(), "tictactoe", TTT_OPTS, TTT_INSTRUCTION, out / "data" / "ttt-random.jsonl",
             cfg["ttt_sft_episodes"])
    _collect(ExpertPolicy(), "tictactoe", TTT_OPTS, TTT_INSTRUCTION, out / "data" / "ttt-minimax.jsonl",
             cfg["ttt_sft_episodes"])
    for name in ("ttt-random.jsonl", "ttt-minimax.jsonl"):
        check_budget(out / "data" / name, cfg["ttt_ppo"]["max_new_tokens"])


def plan_ttt(out: Path, seeds: int, cfg: dict[str, Any]) -> dict[str, Any]:
    g = cfg["ttt_ppo"]["max_new_tokens"]
    models = {"untrained": ["tiny"] * seeds, "random-move SFT": [str(out / "ttt-sft-random" / "model")] * seeds,
              "minimax SFT": [str(out / "ttt-sft-minimax" / "model")] * seeds,
              "RLFT": [str(out / f"ttt-rlft-s{s}" / "model") for s in range(seeds)]}
    sft = [(f"tictactoe SFT {kind}", _sft, (out / "data" / f"ttt-{kind}.jsonl", out / f"ttt-sft-{kind}",
                                            cfg["ttt_sft_steps"], cfg["ttt_sft_lr"], cfg["sft_batch"], 0,
                                            cfg["ttt_sft_epochs"]))
           for kind in ("minimax", "random")]
    rl = [(f"tictactoe RLFT seed {s}", _ppo, (out / "ttt-sft-minimax" / "model", "tictactoe", out / f"ttt-rlft-s{s}",
                                              {**cfg["ttt_ppo"], "seed": s, "instruction": TTT_INSTRUCTION,
                                               "env_opts": TTT_OPTS}))
          for s in range(seeds)]
    evals = {label: [(f"tictactoe eval {label} vs {opp} seed {s}", _eval_ttt_job,
                      (str(out / "eval" / f"ttt-{_key(label)}-{opp}-s{s}.json"), m, opp, cfg["ttt_games"], g, 1000 + s))
                     for opp in ("random", "minimax") for s, m in enumerate(ms)] for label, ms in models.items()}
    return {"sft": sft[:1], "rl": rl, "evals": evals, "ref_sft": sft[1:], "main": ("minimax SFT", "RLFT"),
            "order": 1}


def aggregate_ttt(seeds: int, cfg: dict[str, Any], evals: dict[str, list[Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {"rows": {}, "games_per_seed": cfg["ttt_games"], "seeds": seeds}
    for label, tasks in evals.items():
        rec: dict[str, Any] = {}
        if not all(Path(t[2][0]).exists() for t in tasks):
            result.setdefault("not_run", []).append(label)
            continue
        for opp in ("random", "minimax"):
            per = [json.loads(Path(t[2][0]).read_text()) for t in tasks if t[2][2] == opp]
            rec[opp] = {"return_seeds": _ci([p["mean"] for p in per]), "per_seed": [round(p["mean"], 4) for p in per],
                        "return_pooled": _by_unit([p["returns"] for p in per]),
                        "win": round(float(np.mean([p["win"] for p in per])), 3),
                        "invalid": round(float(np.mean([p["invalid"] for p in per])), 4)}
        result["rows"][label] = rec
    start, rlft = result["rows"].get("minimax SFT"), result["rows"].get("RLFT")
    if start and rlft:  # RLFT seed s and its start met opponent seed 1000 + s
        result["paired"] = {"RLFT": {
            opp: _ci([x - y for x, y in zip(rlft[opp]["per_seed"], start[opp]["per_seed"], strict=True)])
            for opp in ("random", "minimax")}}
    return result


def run_study(out: str | Path, *, seeds: int = 3, fast: bool = False, docs: str | Path | None = None,
              parts: Sequence[str] = ("bandit", "tictactoe"), jobs: int = 1, report_only: bool = False,
              design: str = "commit", log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run (or resume) the study; write ``results.json``, tables and PNGs to ``out``.

    Stages (data, SFT, RLFT, evaluations) skip their finished outputs; ``jobs`` > 1 runs
    independent stages in that many worker processes (one thread each). The stages of the
    issue's claims (the starting SFT, RLFT, their evaluations) run first, the reference rows
    (untrained, UCB / minimax SFT) after them. ``report_only`` runs nothing and reports the
    rows whose evaluations exist (the others are listed under ``not_run``). ``design`` picks the
    bandit configuration (:data:`DESIGNS`; ``fast`` overrides it)."""
    if design not in DESIGNS:
        raise TurnRLError(f"--design must be one of {', '.join(DESIGNS)} (got {design!r})")
    if seeds < 1:
        raise TurnRLError(f"--seeds must be >= 1 (got {seeds})")
    if jobs < 1:
        raise TurnRLError(f"--jobs must be >= 1 (got {jobs})")
    say = log or (lambda s: None)
    cfg = DESIGNS[design] if not fast else FAST
    out = Path(out)
    if report_only and not (out / "settings.json").is_file():  # else it began a new study and reported nothing
        raise TurnRLError(f"{out}: holds no study (no settings.json); --report-only reports an earlier run's rows")
    out.mkdir(parents=True, exist_ok=True)
    # stages skip outputs that exist, so a folder holds one study: its design and settings are
    # recorded in settings.json and another design or changed settings is a one-line error
    from turnrl.pipelines.iterative import check_settings

    check_settings(out, {"design": "fast" if fast else design, "config": cfg}, what="--out")
    t0 = time.time()
    plans: dict[str, dict[str, Any]] = {}
    if "bandit" in parts:
        if not report_only:  # it plays nothing: a part the study never ran reports its rows as not run
            say("bandit: collecting greedy and UCB episodes")
            collect_bandit(out, cfg)
        plans["bandit"] = plan_bandit(out, seeds, cfg)
    if "tictactoe" in parts:
        if not report_only:
            say("tictactoe: collecting random-move and minimax games")
            collect_ttt(out, cfg)
        plans["tictactoe"] = plan_ttt(out, seeds, cfg)
    pool = _Pool(1 if report_only else jobs, say)
    try:
        if not report_only:
            # per part (bandit first): the starting SFT; RLFT beside the start's evaluation; then the
            # RLFT rows' evaluations (a worker must not pick one up while its model is still training)
            for p in sorted(plans.values(), key=lambda p: p["order"]):
                start, *trained = p["main"]
                pool.run(p["sft"])
                pool.run(p["rl"] + p["evals"][start])
                pool.run([t for lab in trained for t in p["evals"][lab]])
            pool.run([t for p in plans.values() for t in p["ref_sft"]])
            pool.run([t for p in plans.values() for lab, ts in p["evals"].items() if lab not in p["main"] for t in ts])
    finally:
        pool.close()
    result: dict[str, Any] = {"schema": "turnrl.greedy_study/v1", "config": cfg, "fast": fast, "seeds": seeds,
                              "design": "fast" if fast else design}
    if "bandit" in plans:
        result["bandit"] = aggregate_bandit(out, seeds, cfg, plans["bandit"]["evals"])
    if "tictactoe" in plans:
        result["tictactoe"] = aggregate_ttt(seeds, cfg, plans["tictactoe"]["evals"])
    result["elapsed_s"] = round(time.time() - t0, 1)
    from turnrl.train.core import atomic_write_json

    atomic_write_json(out / "results.json", result)
    report(result, out)
    if docs is not None:
        report(result, Path(docs))
    return result


def report(result: dict[str, Any], where: Path) -> None:
    """Write ``rlft-*.png`` plots and ``rlft-tables.md`` into ``where``."""
    from turnrl.diagnostics import plots

    where.mkdir(parents=True, exist_ok=True)
    lines = []
    b = result.get("bandit")
    if b and not b["rows"]:
        lines += [f"Bandit: not run: {', '.join(b.get('not_run', []))}", ""]
    elif b:
        h = b["env"]["horizon"]
        title = f"10-arm Gaussian bandit, sigma 1, {b['instances_per_seed']} instances, {b['seeds']} RLFT seeds"
        plots.plot_regret(b["curves"], where / "rlft-bandit-regret.png", title=title)
        plots.plot_coverage(b["curves"], where / "rlft-bandit-coverage.png", title=title)
        lines += [f"| row | regret@{h} (seeds) | 95% CI | coverage@{h} | 95% CI | regret by instance CI | "
                  "optimal/greedy/other % | invalid |", "|---|---:|---|---:|---|---|---|---:|"]
        for label, r in b["rows"].items():
            rs, cs, rp = r["regret_seeds"], r["coverage_seeds"], r["regret_pooled"]
            a = r["actions_pct"]
            lines.append(f"| {label} | {rs['mean']:.2f} | {_fmt_ci(rs)} | {cs['mean']:.2f} | {_fmt_ci(cs)} | "
                         f"{_fmt_ci(rp)} | {a['optimal']}/{a['greedy']}/{a['other']} | {r['invalid']:.2f} |")
        lines += [f"Not run: {', '.join(b['not_run'])}", ""] if b.get("not_run") else [""]
        acted = {label: r["moves_on_low"] for label, r in b["rows"].items() if "moves_on_low" in r}
        if acted:
            lines += ["Replies whose rationale is `Low.` that move off the last arm (greedy decoding, pooled over "
                      "seeds): " + ", ".join(f"{label} {v:.0%} of {b['rows'][label]['low_replies']}"
                                              for label, v in acted.items()), ""]
        for label, d in b.get("paired", {}).items():
            ds, dp = d["diff_seeds"], d["diff_pooled"]
            lines.append(f"* {label} minus greedy-like SFT, regret@{h} on the same instances: {ds['mean']:.2f} "
                         f"(95% CI over seeds {_fmt_ci(ds)}; by instance, averaged over the seeds, {_fmt_ci(dp)})")
        lines.append("")
    t = result.get("tictactoe")
    if t and not t["rows"] and t.get("not_run"):
        lines += [f"Tic-tac-toe: not run: {', '.join(t['not_run'])}", ""]
    elif t and t["rows"]:
        lines += ["| row | return vs random (seeds) | 95% CI | win | return vs minimax | 95% CI | invalid |",
                  "|---|---:|---|---:|---:|---|---:|"]
        for label, r in t["rows"].items():
            a, m = r["random"], r["minimax"]
            lines.append(f"| {label} | {a['return_seeds']['mean']:.3f} | {_fmt_ci(a['return_seeds'], 3)} | "
                         f"{a['win']:.2f} | {m['return_seeds']['mean']:.3f} | {_fmt_ci(m['return_seeds'], 3)} | "
                         f"{(a['invalid'] + m['invalid']) / 2:.2f} |")
        lines += [f"Not run: {', '.join(t['not_run'])}", ""] if t.get("not_run") else [""]
        for label, d in t.get("paired", {}).items():
            lines.append(f"* {label} minus minimax SFT (its start), same opponent seeds: "
                         + "; ".join(f"vs {opp} {d[opp]['mean']:+.3f} {_fmt_ci(d[opp], 3, '+')}"
                                     for opp in ("random", "minimax")))
        _ttt_plot(t, where / "rlft-tictactoe.png")
    from turnrl.train.core import atomic_write_text

    atomic_write_text(where / "rlft-tables.md", "\n".join(lines) + "\n")


def _ttt_plot(t: dict[str, Any], path: Path) -> None:
    from turnrl.report import _plt, atomic_savefig

    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    labels = list(t["rows"])
    x = np.arange(len(labels))
    for j, opp in enumerate(("random", "minimax")):
        means = [t["rows"][lab][opp]["return_seeds"]["mean"] for lab in labels]
        lo = [t["rows"][lab][opp]["return_seeds"]["ci95"][0] for lab in labels]
        hi = [t["rows"][lab][opp]["return_seeds"]["ci95"][1] for lab in labels]
        err = [np.array(means) - np.array(lo), np.array(hi) - np.array(means)]
        ax.bar(x + (j - 0.5) * 0.38, means, 0.38, yerr=err, capsize=3, label=f"vs {opp}")
    ax.set_xticks(x, labels, fontsize=8)
    ax.axhline(0, color="gray", lw=0.8)
    ax.set_ylabel("mean return (95% CI over seeds)")
    ax.set_title("tic-tac-toe, tiny model", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=100)
    plt.close(fig)


__all__ = ["BANDIT_INSTRUCTION", "BEST_SUMMARY", "DESIGNS", "KNOWING_DOING", "NARROW_GAP", "UNTRIED_COPY", "CompactBanditPolicy", "FAST", "FULL", "TTT_INSTRUCTION", "bandit_eval",
           "compact_thought", "report", "run_study", "ttt_eval"]
