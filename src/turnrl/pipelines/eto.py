"""``turnrl eto`` / ``turnrl dmpo``: the iterative explore -> pair -> train pipeline (seeds 000, 001).

One pipeline, three losses (``loss=dpo|dmpo|ipo``)::

    base agent = SFT(base model, expert demos on the train tasks)            OUT/sft
    for i in 1..iterations:                                                  OUT/iter-i/
        explore every train task with the current agent                      explore.jsonl
        pair explored trajectories with the expert ones (or own samples)     pairs.jsonl
        train from the current agent, which is also the reference           train/ (checkpoints, model)
        evaluate on seen and unseen                                          eval.json (+ eval-*.jsonl)

Every stage is resumable (:mod:`turnrl.pipelines.iterative`): a killed run skips the finished
stages, continues a half-written exploration episode by episode and a half-finished training
from its last checkpoint.

Variants: pair strategies ``trajectory`` (ETO), ``step`` (replay the expert's first ``t``
turns, the agent plays on from turn ``t``; one random ``t`` a task), ``mixed`` (both) and
``takeover`` (the expert takes over each lost explored game after its first ``t`` turns, for
every ``t``, in ``OUT/iter-i/takeover.jsonl``; the latest takeover that returns more than the
agent's game is its winner, trained from turn ``t``: :func:`turnrl.data.pairs.takeover_pairs`);
losers ``noisy`` (all) or ``clean`` (degenerate losers dropped, DMPO's setting); ``self_play``
(no expert in exploration or pairs: ``samples_per_task`` samples a task at ``sample_temperature``;
iteration 1 is RFT on the successful samples, later iterations pair each task's best and worst
sample). Baselines: :func:`best_of_n` and :func:`rft`.

Departures from the papers:

* ETO and DMPO start from a 7B SFT agent and train with lr 1e-6, batch 32, 3 epochs; the
  tiny model is trained with lr 1e-5 (the quickstart's; default), beta 0.1, 4 epochs, batch 16.
  Larger steps collapse the tiny agent (lr 3e-5 for 2 epochs did in one of 5 seeds) and
  smaller ones leave it where it was (docs/methods/compare.md has the sweep).
* ETO's Best-of-N and RFT sample with temperature; so does this one (Best-of-N: temperature
  1, the best of N episodes by the environment's reward -- an oracle selection, as in the
  paper). RFT continues training the current agent on the expert demos plus the successful
  explored trajectories (``rft_init: current``), or retrains the base model (``base``, the
  paper's choice) on them.
* Step-wise exploration plays one random step ``t`` a task by default; ``step_turns=all`` plays
  every step (DESIGN 3 does not say which).
* ``takeover`` pairs are not ETO's: its expert games start from the task's start. A takeover
  starts from the agent's own state, as DAgger's expert labels do, so the first trained turn of
  both sides has the same context. It needs an expert that acts from the state it is given:
  tic-tac-toe's minimax, the bandits', twenty questions', the shops' and ALFWorld's handcoded
  one do; the household games' and ScienceWorld's replay a walkthrough by turn number, so
  their takeovers of a game that left the walkthrough rarely do better and give few pairs.
* Self-play starts from ``model`` (or the SFT agent): the tiny model from scratch writes no
  valid action, so self-play from the raw base model would learn from random play only.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import model_validator

from turnrl.agent.prompting import PromptConfig
from turnrl.config import Config, Range
from turnrl.data.io import read_pairs, read_trajectories, write_jsonl
from turnrl.data.schema import Pair, Trajectory
from turnrl.errors import TurnRLError
from turnrl.evaluation import summarize
from turnrl.pipelines.iterative import check_settings, iter_dir, run_stage, start_model_fingerprints
from turnrl.quickstart import ENV, ENV_OPTS, PROMPT
from turnrl.rollout.sampler import EpisodeSpec
from turnrl.train.preference import PreferenceConfig
from turnrl.train.sft import SFTConfig

Log = Callable[[str], None]

__all__ = [
    "EtoConfig",
    "best_of_n",
    "build_pairs",
    "evaluate_model",
    "explore",
    "prepare_base",
    "prepare_base_model",
    "rft",
    "rollout_stats",
    "run_iteration",
    "run_pipeline",
    "step_plan",
    "takeover",
    "train_iteration",
]


def _default_sft() -> SFTConfig:
    return SFTConfig(epochs=3.0, batch_size=16, lr=2e-3, row_tokens=1024, warmup_ratio=0.03, history=PROMPT.history)


def _default_train() -> PreferenceConfig:
    return PreferenceConfig(lr=1e-5, beta=0.1, epochs=4.0, batch_size=16, row_tokens=1024, warmup_ratio=0.05,
                            lr_schedule="constant", max_length=1024)


class AgentPipelineConfig(Config):
    """What every iterative agent pipeline (ETO/DMPO, SPPO) shares: the env, the prompt, the
    starting agent (SFT on expert demos, or ``model``) and the evaluation."""

    out: str = "runs/eto"
    env: str = ENV
    env_opts: dict[str, Any] = dict(ENV_OPTS)
    instruction: str | None = PROMPT.instruction
    """Replaces the env's instruction (default: the quickstart's short tic-tac-toe prompt)."""
    history: int | None = PROMPT.history
    """Earlier exchanges the agent sees each turn: in every rollout and in every training (SFT,
    RFT and preference), which take it over ``sft.history`` and ``train.history``."""
    invalid_action: Literal["random", "error", "end"] = "random"
    """What a reply without a valid action does, in exploration, sampling and evaluation alike:
    ``random`` plays a random valid action for it, ``error`` shows an error observation, ``end``
    ends the episode (:class:`~turnrl.agent.prompting.PromptConfig`)."""
    invalid_penalty: float = 0.0
    """Added to the reward of a turn without a valid action (``end`` with -1: an invalid move
    loses a tic-tac-toe game)."""
    model: str | None = None
    """The starting agent; None = SFT ``base`` on ``expert_episodes`` expert demos (OUT/sft)."""
    base: str = "tiny"
    """Model SFT starts from; ``tiny`` builds the embedded tiny model for ``env`` in OUT/tiny."""
    expert_episodes: int = 200
    """Expert demos (one per train task, the first ones of the split): the SFT data, and for
    ETO the tasks exploration revisits and the pairs' winners."""
    sft: SFTConfig = _default_sft()
    eval_splits: list[str] = ["seen", "unseen"]
    eval_episodes: int = 100
    eval_seed: int = 1
    eval_temperature: float = 0.0
    """Temperature of the evaluation games: 0 plays greedily (ETO and DMPO evaluate at 0); above 0
    every row samples its replies, with torch seeded by ``seed`` and the row (Best-of-N samples
    at 1 whatever this is)."""
    seed: int = 0
    """Seeds training (SFT and preference trainers' order and init), sampling and, unless
    ``data_seed`` is set, the train-task plan."""
    data_seed: int | None = None
    """Seed of the train-task plan: which games the expert demos, exploration and SPPO's samples
    play (None: ``seed``). Fixing it across the seeds of a comparison keeps one demo set, as the
    papers' fixed expert datasets do, so that the seeds vary only the training."""
    num_envs: int = 64
    max_new_tokens: int = 48

    value_ranges = {"history": Range(0), "eval_temperature": Range(0),
                    **dict.fromkeys(("expert_episodes", "eval_episodes", "num_envs", "max_new_tokens"), Range(1))}

    @model_validator(mode="before")
    @classmethod
    def _env_defaults(cls, data: Any) -> Any:
        """The prompt and env options above are the quickstart's tic-tac-toe ones: another ``env``
        takes its own instruction, its default options and the full history unless they are given."""
        if isinstance(data, dict) and data.get("env", ENV) != ENV:
            data = {"instruction": None, "env_opts": {}, "history": PromptConfig().history, **data}
        return data

    def plan_seed(self) -> int:
        """The seed of the train-task plan (``data_seed``, else ``seed``)."""
        return self.seed if self.data_seed is None else self.data_seed

    def prompt(self) -> PromptConfig:
        return PromptConfig(instruction=self.instruction, history=self.history, invalid_action=self.invalid_action,
                            invalid_penalty=self.invalid_penalty)

    def check_trainer_sections(self, prefix: str = "", in_compare: bool = False) -> None:
        """One line for an ``sft.seed``, ``sft.history``, ``train.seed`` or ``train.history`` other
        than its default: every training of the pipeline takes its own ``seed`` and ``history``
        (``in_compare``: a comparison's rows, the seed of ``seeds`` and ``pipeline.history``).
        ``prefix`` goes before the key named (``pipeline.``)."""
        for section in ("sft", "train"):
            if section not in type(self).model_fields:
                continue
            given, default = getattr(self, section), type(self).model_fields[section].default
            for key in ("seed", "history"):  # the pipeline's default, or the section's own (a partial dict)
                if getattr(given, key) not in (getattr(default, key), type(given).model_fields[key].default):
                    if in_compare:
                        why = ("each row trains with its seed of `seeds`; remove it" if key == "seed" else
                               "every training takes pipeline.history; set pipeline.history instead")
                    else:
                        why = f"the pipeline trains with its own {key} ({getattr(self, key)}); set {key} instead"
                    raise TurnRLError(f"{prefix}{section}.{key}={getattr(given, key)} is not used: {why}")

    def check_budgets(self, prefix: str = "", *, reads_train: bool | None = None) -> None:
        """One line, before the demos and the model, for a section that would train nothing (``epochs=0``
        with ``max_steps=0``) where the run reads it: ``sft`` when no ``model`` is given, ``train`` when
        there are iterations (``reads_train``: a comparison's rows decide). ``prefix`` goes before the
        keys (``pipeline.``); the first call that raises names them."""
        if "sft" in type(self).model_fields and self.model is None:
            self.sft.check_budget(f"{prefix}sft.")
        if reads_train is None:
            reads_train = getattr(self, "iterations", 1) > 0
        train = getattr(self, "train", None)
        if train is not None and reads_train:
            train.check_budget(f"{prefix}train.")

    def check_common(self, reads_train: bool | None = None) -> None:
        """Before any work, one line for: an unknown env, a bad env option (the env is built once),
        a starting model path that is no model folder, an unknown split in ``eval_splits``, a
        ``train.ref_model``, ``*.seed`` or ``*.history`` (which the pipeline would ignore)."""
        from turnrl import envs
        from turnrl.models.loading import check_model_name

        envs.make(self.env, **self.env_opts).close()
        if not str(getattr(self, "out", "x")).strip():
            raise TurnRLError("out is empty: give the run a folder (it would write into the current one)")
        if not self.eval_splits:
            raise TurnRLError("eval_splits is empty: nothing would be evaluated; choose from: train, seen, unseen")
        for key in ("model", "base"):
            # base=tiny builds the embedded model into OUT/tiny (a ./tiny of its own when out is .)
            if getattr(self, key) is not None and not (key == "base" and self.base == "tiny"):
                check_model_name(getattr(self, key), key)
        for s in self.eval_splits:
            if s not in ("train", "seen", "unseen"):
                raise TurnRLError(f"eval_splits: unknown split '{s}'; choose from: train, seen, unseen")
        self.check_trainer_sections()
        self.check_budgets(reads_train=reads_train)
        train = getattr(self, "train", None)
        if train is not None and train.ref_model is not None:  # train_iteration sets it: it would do nothing
            raise TurnRLError(f"train.ref_model={train.ref_model}: each iteration's reference is the agent it "
                              "starts from; remove train.ref_model")


class EtoConfig(AgentPipelineConfig):
    """Settings of ``turnrl eto`` / ``turnrl dmpo`` (``train.*`` are the preference trainer's)."""

    out: str = "runs/eto"
    explore_tasks: int | None = None
    """Explore only the first this many train tasks (None: all ``expert_episodes``)."""
    sft: SFTConfig = _default_sft()
    loss: Literal["dpo", "dmpo", "ipo"] = "dpo"
    iterations: int = 2
    explore_temperature: float = 0.0
    """0 = greedy (ETO explores greedily)."""
    pairs: Literal["trajectory", "step", "mixed", "takeover"] = "trajectory"
    step_turns: Literal["random", "all"] = "random"
    """Step-wise exploration: one random turn ``t`` a task (``random``), or every turn ``t`` from 1 to
    the expert's last (``all``: a task's expert game of T turns gives T - 1 episodes)."""
    losers: Literal["clean", "noisy"] = "noisy"
    truncate_k: int | None = None
    """Cut losers to the winner's number of turns plus this (None: keep whole)."""
    self_play: bool = False
    samples_per_task: int = 4
    """Self-play and RFT: samples a train task (temperature ``sample_temperature``)."""
    sample_temperature: float = 1.0
    train: PreferenceConfig = _default_train()
    rft_init: Literal["current", "base"] = "current"
    rft_epochs: float = 1.0

    value_ranges = {**AgentPipelineConfig.value_ranges, "iterations": Range(0), "samples_per_task": Range(1),
                    "explore_temperature": Range(0), "sample_temperature": Range(0), "truncate_k": Range(0),
                    "explore_tasks": Range(1), "rft_epochs": Range(0, lo_open=True)}

    def check(self, reads_train: bool | None = None) -> EtoConfig:
        """Cross-field checks, one line each (``reads_train``: whether ``train`` is read, where a
        comparison's rows decide; None: when there are iterations)."""
        self.check_common(reads_train)
        if self.self_play and self.pairs != "trajectory":
            raise TurnRLError(f"self_play pairs a task's own samples; pairs={self.pairs} needs expert data")
        if self.train.loss not in ("dpo", self.loss):  # train_iteration trains with ``loss``: it would be ignored
            raise TurnRLError(f"train.loss={self.train.loss} is not used: this pipeline trains with loss={self.loss}; "
                              f"set loss={self.train.loss} instead")
        self.train.check_loss(self.loss, "train.")  # before the stages, not at the first training
        if self.truncate_k is not None and self.pairs in ("step", "takeover"):
            raise TurnRLError(f"truncate_k={self.truncate_k} cuts trajectory pairs' losers; pairs={self.pairs} trains "
                              "from the turn its sides part: remove truncate_k")
        if self.self_play and self.truncate_k is not None:
            raise TurnRLError(f"truncate_k={self.truncate_k} cuts the losers of expert pairs; self_play pairs a task's "
                              "own samples: remove truncate_k")
        if self.self_play and self.samples_per_task < 2:
            raise TurnRLError(f"self_play pairs a task's own samples: samples_per_task must be >= 2 (got "
                              f"{self.samples_per_task})")
        # settings that nothing of this run would read: one line each, as truncate_k's above
        if self.step_turns != "random" and self.pairs not in ("step", "mixed"):
            raise TurnRLError(f"step_turns={self.step_turns} chooses the turns of step-wise exploration; "
                              f"pairs={self.pairs} explores none: remove step_turns")
        if self.self_play and self.explore_temperature != type(self).model_fields["explore_temperature"].default:
            raise TurnRLError(f"explore_temperature={self.explore_temperature:g}: self_play samples the tasks at "
                              "sample_temperature; set that instead")
        self.train.check_unread([self.loss], "train.", _default_train(), "this pipeline trains")
        return self

    def check_start_settings(self) -> None:
        """``turnrl eto`` and ``turnrl dmpo``: settings of the start that nothing of this run would read,
        when not the default, one line each. With ``model`` no SFT runs, so ``sft.*`` is read only by
        self-play's RFT (which sets its own ``epochs`` and ``warmup_ratio`` with ``rft_init: current``);
        ``rft_*`` only by self-play. (``turnrl compare`` gives its rows a start through ``model`` and
        keeps the settings it trained that start with, so it does not call this.)"""
        if not self.self_play:
            for key in ("rft_init", "rft_epochs"):
                if getattr(self, key) != type(self).model_fields[key].default:
                    raise TurnRLError(f"{key}={getattr(self, key)} sets self-play's RFT; this run is not self_play: "
                                      f"remove {key}")
        if self.model is None:
            return
        default = _default_sft()
        read: set[str] = set()
        if self.self_play:
            read = set(SFTConfig.model_fields) - ({"epochs", "warmup_ratio"} if self.rft_init == "current" else set())
        for key in SFTConfig.model_fields:
            if key not in read and getattr(self.sft, key) != getattr(default, key):
                why = ("self-play's RFT from the agent trains rft_epochs with no warm-up" if self.self_play
                       else "no SFT runs")
                raise TurnRLError(f"sft.{key}={getattr(self.sft, key)} is not used: model={self.model} is the start and "
                                  f"{why}; remove sft.{key}")


# ----------------------------------------------------------------------------- helpers


def _policy(model: str, cfg: EtoConfig, temperature: float) -> Any:
    from turnrl.rollout import SamplingConfig, load_policy

    sampling = SamplingConfig(temperature=temperature, max_new_tokens=cfg.max_new_tokens)
    return load_policy(model, sampling=sampling, history=cfg.history)


def _seed_torch(*parts: Any) -> None:
    import torch

    torch.manual_seed(random.Random("/".join(map(str, parts))).randrange(2**31))


def _train_specs(cfg: EtoConfig) -> list[EpisodeSpec]:
    """The train tasks' planned episodes (the expert's, and every exploration's)."""
    from turnrl import envs
    from turnrl.rollout.sampler import plan_episodes

    env = envs.make(cfg.env, **cfg.env_opts)
    try:
        return plan_episodes(env, "train", cfg.expert_episodes, cfg.plan_seed())
    finally:
        env.close()


def _repeat(specs: list[EpisodeSpec], k: int, offset: int = 0) -> list[EpisodeSpec]:
    """``k`` episodes of each spec (same task and env seed; distinct indices)."""
    n = len(specs)
    return [EpisodeSpec(offset + r * n + j, s.split, s.task_id, s.seed) for r in range(k) for j, s in enumerate(specs)]


def _play(policy: Any, cfg: EtoConfig, specs: list[EpisodeSpec], out: Path) -> list[Trajectory]:
    from turnrl.collect import run_policy

    split = specs[0].split if specs else "train"
    return run_policy(policy, cfg.env, split=split, env_opts=cfg.env_opts, num_envs=cfg.num_envs,
                      prompt=cfg.prompt(), out=out, specs=specs)


# ----------------------------------------------------------------------------- stages


def prepare_base_model(cfg: EtoConfig, out: str | Path, log: Log | None = None) -> str:
    """The model SFT starts from: ``cfg.base``, or for ``tiny`` the embedded model built in OUT/tiny."""
    if cfg.base != "tiny":
        return cfg.base
    from turnrl.models.tiny import build_tiny

    def tiny(p: Path) -> str:
        build_tiny(p, env_names=(cfg.env,))
        return str(p)

    from turnrl.models.loading import model_ref

    return model_ref(run_stage(Path(out) / "tiny", tiny, log=log))


def prepare_base(cfg: EtoConfig, out: str | Path, log: Log | None = None) -> tuple[str, Path]:
    """The starting agent and the expert demos: OUT/tiny, OUT/expert.jsonl, OUT/sft."""
    from turnrl.rollout.policies import ExpertPolicy

    out = Path(out)
    expert = out / "expert.jsonl"
    specs = _train_specs(cfg)
    run_stage(expert, lambda p: rollout_stats(_play(ExpertPolicy(), cfg, specs, p)), log=log)
    if cfg.model is not None:  # a given start: no base model to build
        return cfg.model, expert
    base = prepare_base_model(cfg, out, log)

    def sft(p: Path) -> str:
        from turnrl.train.sft import train_sft

        # the agent's view when it acts (history window) is what it is trained on, as in train_iteration
        sft_cfg = cfg.sft.model_copy(update={"seed": cfg.seed, "history": cfg.history})
        return str(train_sft(base, expert, p, sft_cfg, resume=True).model_dir)

    return run_stage(out / "sft", sft, log=log), expert


def rollout_stats(trajs: list[Trajectory]) -> dict[str, Any]:
    """Episodes, mean return and success rate of a stage's rollouts (its ``.done.json`` stats)."""
    n = max(1, len(trajs))
    return {"episodes": len(trajs), "avg_return": sum(t.return_ for t in trajs) / n,
            "success": sum(t.success for t in trajs) / n}


def explore(cfg: EtoConfig, model: str, out: Path, i: int, experts: list[Trajectory]) -> dict[str, Any]:
    """Explore every train task with ``model`` (``out`` = explore.jsonl, resumable)."""
    _seed_torch(cfg.seed, "explore", i)
    policy = _policy(model, cfg, cfg.sample_temperature if cfg.self_play else cfg.explore_temperature)
    specs = _train_specs(cfg)[: cfg.explore_tasks]
    plan: list[EpisodeSpec] = []
    if cfg.self_play:
        plan = _repeat(specs, cfg.samples_per_task)
    else:
        if cfg.pairs in ("trajectory", "mixed", "takeover"):
            plan += specs
        if cfg.pairs in ("step", "mixed"):
            plan += step_plan(cfg, specs, experts, i)
    return rollout_stats(_play(policy, cfg, plan, out))


def step_plan(cfg: EtoConfig, specs: list[EpisodeSpec], experts: list[Trajectory], i: int) -> list[EpisodeSpec]:
    """Iteration ``i``'s step-wise episodes: each task replays its expert game's first ``t`` turns
    and the agent plays on (``EpisodeSpec.expert_turns = t``), for one random ``t`` in 1..T-1 or,
    with ``step_turns=all``, for every one. Indices follow the trajectory episodes' (0..len(specs)-1):
    task j's one random episode is len(specs) + j (as in runs made before ``step_turns``)."""
    rng = random.Random(f"{cfg.plan_seed()}/step/{i}")  # part of the plan, as data_seed fixes it
    from turnrl.data.pairs import expert_games

    # the expert game each episode replays: the one of its env seed (a task the plan visits twice has
    # two, of other lengths), else the task's last, as the pairs match them
    expert_of = expert_games(experts)
    plan: list[EpisodeSpec] = []
    for j, s in enumerate(specs):
        e = expert_of((s.task_id, s.seed))
        if e is None or e.num_turns <= 1:
            continue
        if cfg.step_turns == "random":
            plan.append(EpisodeSpec(len(specs) + j, s.split, s.task_id, s.seed, rng.randrange(1, e.num_turns)))
        else:
            for t in range(1, e.num_turns):
                plan.append(EpisodeSpec(len(specs) + len(plan), s.split, s.task_id, s.seed, t))
    return plan


def takeover(cfg: EtoConfig, explored: list[Trajectory], out: Path) -> dict[str, Any]:
    """The expert takes over every explored game that it can beat (not won: ``success`` false) after
    each of its first turns: the game's first ``t`` replies are replayed, sampled ids included, for
    ``t`` in 1..T-1, and the expert plays on (``out`` = takeover.jsonl, resumable)."""
    from turnrl.rollout.policies import ExpertPolicy, Reply

    plan: list[EpisodeSpec] = []
    for x in explored:
        if x.success or x.meta.get("expert_turns"):
            continue
        replies = tuple(Reply(m.content, m.token_ids, m.logprobs, {"finished": False} if m.cut else {})
                        for m in x.messages if m.role == "assistant")
        for t in range(1, len(replies)):
            plan.append(EpisodeSpec(len(plan), x.split, x.task_id, int(x.meta["seed"]), replay=replies[:t]))
    return rollout_stats(_play(ExpertPolicy(), cfg, plan, out))  # an empty plan writes an empty file


def build_pairs(cfg: EtoConfig, experts: list[Trajectory], explored: list[Trajectory], out: Path,
                takeovers: list[Trajectory] | None = None) -> dict[str, Any]:
    """ETO's pairs (trajectory / step / mixed), takeover pairs or self-play pairs -> ``out`` (pairs.jsonl)."""
    from turnrl.data.pairs import self_play_pairs, step_pairs, takeover_pairs, trajectory_pairs

    stats: dict[str, int] = {}
    pairs: list[Pair] = []
    if cfg.self_play:
        pairs = self_play_pairs(explored, losers=cfg.losers, stats=stats)
    else:
        if cfg.pairs in ("trajectory", "mixed"):
            pairs += trajectory_pairs(experts, explored, losers=cfg.losers, truncate_k=cfg.truncate_k, stats=stats)
        if cfg.pairs in ("step", "mixed"):
            pairs += step_pairs(experts, explored, losers=cfg.losers, stats=stats)
        if cfg.pairs == "takeover":
            pairs += takeover_pairs(experts, explored, takeovers or [], losers=cfg.losers, stats=stats)
    write_jsonl(out, pairs)
    n = max(1, len(pairs))
    return {**stats, "pairs": len(pairs), "avg_rejected_turns": sum(p.rejected.num_turns for p in pairs) / n,
            "avg_chosen_turns": sum(p.chosen.num_turns for p in pairs) / n,
            "avg_diverge_turn": sum(p.meta.get("diverge_turn", p.meta.get("train_from_turn", 0)) for p in pairs) / n}


def train_pairs(cfg: EtoConfig, model: str, pairs: Path, out: Path, i: int) -> str:
    """Preference training from ``model`` (also the reference) -> ``out``; returns the model dir."""
    return train_iteration(cfg, cfg.loss, model, pairs, out, i)


def train_iteration(cfg: Any, loss: str, model: str, data: Path, out: Path, i: int) -> str:
    """Iteration ``i``'s preference training of a pipeline (``cfg`` has ``train``, ``seed`` and
    ``history``) with ``loss``, from ``model``, which is also the reference -> ``out``; returns the
    model dir. ETO, DMPO and SPPO all train through this one function."""
    from turnrl.train.preference import train_preference

    # the agent's view when it acted (history window) is what the log-probs are taken over
    tcfg = cfg.train.model_copy(update={"loss": loss, "seed": cfg.seed * 1000 + i, "ref_model": None,
                                        "history": cfg.history})
    return str(train_preference(model, data, out, tcfg, resume=True).model_dir)


def evaluate_model(cfg: EtoConfig, model: str, out: Path, label: str, *, n: int = 1,
                   temperature: float | None = None) -> list[dict[str, Any]]:
    """Result records on ``eval_splits`` (``out`` = eval.json; episodes in eval-<split>.jsonl).

    ``n`` > 1 plays each task ``n`` times and the best game by env reward counts (Best-of-N, which
    passes ``temperature`` 1); ``temperature`` None is ``cfg.eval_temperature``."""
    from turnrl import envs
    from turnrl.rollout.policies import RandomPolicy
    from turnrl.rollout.sampler import plan_episodes
    from turnrl.train.core import atomic_write_json

    temp = cfg.eval_temperature if temperature is None else temperature
    _seed_torch(cfg.seed, "eval", label)
    policy = RandomPolicy() if model == "random" else _policy(model, cfg, temp)
    env = envs.make(cfg.env, **cfg.env_opts)
    results = []
    try:
        for split in cfg.eval_splits:
            specs = plan_episodes(env, split, cfg.eval_episodes, cfg.eval_seed)
            trajs = _play(policy, cfg, _repeat(specs, n), out.with_name(f"{out.stem}-{split}.jsonl"))
            if n > 1:
                best: dict[int, Trajectory] = {}
                for k, t in enumerate(trajs):
                    j = k % len(specs)
                    if j not in best or t.return_ > best[j].return_:
                        best[j] = t
                trajs = [best[j] for j in range(len(specs))]
            # each game's return, in plan order (the same games for every agent): paired by game in compare
            results.append({**summarize(trajs, policy=label, env=cfg.env, split=split),
                            "game_returns": [t.return_ for t in trajs]})
    finally:
        env.close()
    atomic_write_json(out, {"results": results})
    return results


def rft(cfg: EtoConfig, base: str, model: str, experts: Path, explored: list[Trajectory], out: Path,
        i: int, *, include_experts: bool = True) -> str:
    """RFT: SFT on the expert demos plus the successful explored trajectories -> ``out``."""
    from turnrl.train.sft import train_sft

    good = [t for t in explored if t.success]
    data = (read_trajectories(experts) if include_experts else []) + good
    if not data:
        raise TurnRLError(f"RFT at iteration {i}: no successful trajectory to train on")
    data_path = out.with_name(out.name + "-data.jsonl")
    write_jsonl(data_path, data)
    init = model if cfg.rft_init == "current" else base
    update: dict[str, Any] = {"seed": cfg.seed * 1000 + i, "history": cfg.history}
    if cfg.rft_init == "current":
        update["epochs"] = cfg.rft_epochs
        update["warmup_ratio"] = 0.0
    return str(train_sft(init, data_path, out, cfg.sft.model_copy(update=update), resume=True).model_dir)


def best_of_n(cfg: EtoConfig, model: str, out: Path, n: int = 10) -> list[dict[str, Any]]:
    """Best-of-N evaluation of ``model`` (``out`` = eval.json): ``n`` samples a task at temperature 1
    (also for ``n`` = 1: one sample, not the greedy game)."""
    return evaluate_model(cfg, model, out, f"best-of-{n}", n=n, temperature=1.0)


# ----------------------------------------------------------------------------- the loop


def run_iteration(cfg: EtoConfig, out: str | Path, i: int, model: str, expert: Path, *,
                  base: str | None = None, explored: Path | None = None, label: str | None = None,
                  log: Log | None = None) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    """One iteration in ``OUT/iter-i``; returns (new model, eval records, pair stats).

    ``explored`` reuses another run's exploration of the same agent (same settings); ``base`` is
    what self-play's RFT retrains with ``rft_init: base`` (None: the agent ``model``)."""
    it = iter_dir(out, i)
    experts = [] if cfg.self_play else read_trajectories(expert)
    explore_path = explored if explored is not None else it / "explore.jsonl"
    if explored is None:
        run_stage(explore_path, lambda p: explore(cfg, model, p, i, experts), log=log, name=f"iter-{i}/explore")
    trajs = read_trajectories(explore_path)
    if cfg.self_play and i == 1:
        stats: dict[str, Any] = {"rft_successes": sum(t.success for t in trajs)}
        new = run_stage(it / "train", lambda p: rft(cfg, base or model, model, expert, trajs, p, i,
                                                    include_experts=False), log=log, name=f"iter-{i}/rft")
    else:
        takeovers: list[Trajectory] = []
        if cfg.pairs == "takeover":
            run_stage(it / "takeover.jsonl", lambda p: takeover(cfg, trajs, p), log=log, name=f"iter-{i}/takeover")
            takeovers = read_trajectories(it / "takeover.jsonl")
        stats = run_stage(it / "pairs.jsonl", lambda p: build_pairs(cfg, experts, trajs, p, takeovers), log=log,
                          name=f"iter-{i}/pairs")
        if not read_pairs(it / "pairs.jsonl"):
            counts = ", ".join(f"{k} {v}" for k, v in sorted(stats.items()) if k != "pairs" and isinstance(v, int) and v)
            raise TurnRLError(f"{it / 'pairs.jsonl'}: no pairs" + (f" ({counts})" if counts else ""))
        new = run_stage(it / "train", lambda p: train_pairs(cfg, model, it / "pairs.jsonl", p, i), log=log,
                        name=f"iter-{i}/train")
    name = label or f"{'self-play' if cfg.self_play else cfg.loss}-iter{i}"
    results = run_stage(it / "eval.json", lambda p: evaluate_model(cfg, new, p, name), log=log,
                        name=f"iter-{i}/eval")
    return new, results, stats


def run_pipeline(cfg: EtoConfig, out: str | Path | None = None, *, log: Log | None = None,
                 model: str | None = None, expert: Path | None = None, first_explore: Path | None = None,
                 label: str | None = None, eval_start: bool = True, base: str | None = None) -> dict[str, Any]:
    """SFT (or ``model``) then ``iterations`` iterations; writes OUT/summary.json and returns it.

    ``model`` and ``expert`` skip :func:`prepare_base` (an SFT agent and its demos made
    elsewhere); ``first_explore`` reuses an exploration of that agent for iteration 1;
    ``eval_start=False`` skips evaluating the starting agent (evaluated elsewhere); ``base`` is
    the model self-play's RFT retrains with ``rft_init: base`` (default: ``cfg.model`` when given,
    as ``turnrl compare`` does, else :func:`prepare_base_model`)."""
    from turnrl.train.core import atomic_write_json

    cfg.check()
    if (model is None) != (expert is None):  # before settings.json is written: a corrected call may follow
        raise TurnRLError("run_pipeline: model and expert are given together (an agent and its demos), or neither")
    out = Path(out if out is not None else cfg.out)
    given = {"given_model": model, "given_expert": expert, "given_exploration": first_explore}
    check_settings(out, {**cfg.model_dump(mode="json", exclude={"out"}), **given,
                         **start_model_fingerprints(model=cfg.model, base=cfg.base, given_model=model)},
                   free=("iterations",))
    if model is None or expert is None:
        model, expert = prepare_base(cfg, out, log=log)
    if base is None and cfg.self_play and cfg.rft_init == "base":  # a given start model is the base, as in compare
        base = cfg.model if cfg.model is not None else prepare_base_model(cfg, out, log)
    start_model = model
    start = run_stage(out / "eval_start.json", lambda p: evaluate_model(cfg, str(start_model), p, "start"),
                      log=log) if eval_start else []
    iterations: list[dict[str, Any]] = []
    current = model
    for i in range(1, cfg.iterations + 1):
        current, results, stats = run_iteration(
            cfg, out, i, current, expert, base=base, explored=first_explore if i == 1 else None,
            label=f"{label}-iter{i}" if label else None, log=log)
        iterations.append({"iteration": i, "model": current, "results": results, "pairs": stats})
    summary = {"out": str(out), "start": {"model": start_model, "results": start}, "iterations": iterations,
               "final_model": current, "config": cfg.model_dump(mode="json")}
    atomic_write_json(out / "summary.json", summary)
    return summary
