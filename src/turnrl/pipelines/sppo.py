"""``turnrl sppo``: iterative Self-Play Preference Optimization for multi-turn agents (seed 002).

::

    start agent = SFT(base model, expert demos) or ``model``                   OUT/sft
    evaluate the start agent                                                    OUT/eval_start.json
    for t in 1..iterations:                                                     OUT/iter-t/
        sample K trajectories of every train task from pi_t (temperature)       samples.jsonl
        oracle: P(y_i > y_j) for all K x K pairs of a task (batched)            scored.jsonl
        win rate P(y_i > pi_t) = (1/K) sum_k P(y_i > y_k); keep all K or        data.jsonl
            the best and worst a task (``select``)
        train with SPPO's loss, pi_t (the agent at the start) as reference      train/
            L = (log pi(y)/pi_t(y) - eta (P - 1/2))^2     (soft; hard: +-eta/2)
        evaluate on seen / unseen                                               eval.json

Each stage is skipped when finished and resumes when half done (the skeleton in
:mod:`turnrl.pipelines.iterative`; sampling appends finished episodes, training resumes from
its last checkpoint). ``loss: dpo`` swaps the training step for trajectory DPO on each task's
best-vs-worst pair by the same oracle's win rates (self-play pairs): the controlled baseline
of the comparison in ``docs/methods/sppo.md``, same samples, same oracle, another loss.

Departures from the paper (Wu et al., 2024):

* The paper samples single responses to prompts; here a sample is a whole multi-turn episode
  and log pi(y) sums over its agent turns (DESIGN 3). The environment answers in between, so
  "the K samples of a task" share the task (start state and opponent seed), not the replies.
  With more ``train_tasks`` than the split has tasks, a task's later visits join its group (2K
  samples), as another K samples of the same prompt.
* The paper's oracle is PairRM on UltraFeedback prompts, a fresh third of the prompts each
  iteration; the default oracle here is the env reward (``oracle.kind: env_reward``), and
  every iteration revisits the same ``train_tasks`` train tasks (as ETO's loop does); the
  learned ``pairwise_model`` and an LLM ``judge`` are the other oracles.
* Log-probs are taken in the context the agent acted in (``history``: the quickstart agent
  sees only the current board), each turn its own sequence (``PreferenceConfig.history``).
* The tiny model is trained with lr 1e-4, 2 epochs an iteration; the paper uses lr 5e-7 on
  7B models with eta = 1e3 (beta = 1e-3 in the authors' code). eta here is 5: log-ratios of
  a few-million-parameter model move in nats, not thousandths.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from turnrl.config import Range, format_validation_error, merge
from turnrl.data.io import read_trajectories, write_jsonl
from turnrl.data.pairs import self_play_pairs
from turnrl.data.schema import Pair, Trajectory
from turnrl.errors import TurnRLError
from turnrl.oracles import OracleConfig, make_oracle, score_samples, select_samples
from turnrl.pipelines.eto import AgentPipelineConfig
from turnrl.pipelines.iterative import check_settings, iter_dir, run_stage, start_model_fingerprints
from turnrl.train.core import atomic_write_json, atomic_write_text
from turnrl.train.preference import PreferenceConfig

Log = Callable[[str], None]

__all__ = ["SPPOConfig", "build_data", "compare_method", "run_iteration", "run_sppo", "sample"]


def _default_train() -> PreferenceConfig:
    return PreferenceConfig(loss="sppo", eta=5.0, sppo_variant="soft", lr=1e-4, epochs=2.0, batch_size=16,
                            row_tokens=1024, warmup_ratio=0.05, lr_schedule="constant", max_length=1024)


class SPPOConfig(AgentPipelineConfig):
    """Settings of ``turnrl sppo`` (``train.*`` are the preference trainer's, ``oracle.*`` the oracle's)."""

    out: str = "runs/sppo"
    train_tasks: int = 200
    """Train tasks sampled every iteration (the first ones of the split)."""
    iterations: int = 3
    samples_per_task: int = 5
    """K: samples a task, compared pairwise by the oracle."""
    temperature: float = 1.0
    oracle: OracleConfig = OracleConfig()
    select: Literal["all", "best_worst"] = "all"
    """Train on all K samples or on each task's best and worst (the authors' code)."""
    loss: Literal["sppo", "dpo"] = "sppo"
    """sppo; or dpo on each task's best-vs-worst pair by win rate (the self-play DPO baseline)."""
    train: PreferenceConfig = _default_train()

    value_ranges = {**AgentPipelineConfig.value_ranges, "iterations": Range(0), "samples_per_task": Range(2),
                    "train_tasks": Range(1), "temperature": Range(0, lo_open=True)}

    def check(self) -> SPPOConfig:
        self.check_common()
        if self.train.loss not in ("sppo", self.loss):  # train_iteration trains with ``loss``: it would be ignored
            raise TurnRLError(f"train.loss={self.train.loss} is not used: this pipeline trains with loss={self.loss}"
                              " (sppo, or dpo for the self-play DPO baseline); remove train.loss")
        self.train.check_loss(self.loss, "train.")  # before the stages, not at the first training
        # one config serves both of this pipeline's runs (configs/sppo/study.py: ``loss=dpo`` on the SPPO
        # run's file, as train.loss=sppo is accepted with loss=dpo): refused is what neither reads
        self.check_unread(("sppo", "dpo"))
        self.check_oracle()
        return self

    def check_unread(self, losses: Sequence[str], prefix: str = "", what: str = "this pipeline trains") -> None:
        """One line for a setting that none of ``losses`` reads: ``select`` picks SPPO's samples (DPO
        trains each task's best-vs-worst pair); ``train.gamma`` is DMPO's, ``train.eta`` and
        ``train.sppo_variant`` SPPO's, ``train.beta`` DPO's (:meth:`PreferenceConfig.check_unread`)."""
        if "sppo" not in losses and self.select != type(self).model_fields["select"].default:
            raise TurnRLError(f"{prefix}select={self.select} chooses the samples SPPO trains on; loss=dpo trains each "
                              f"task's best-vs-worst pair by win rate: remove select")
        self.train.check_unread(losses, f"{prefix}train.", _default_train(), what)

    def check_oracle(self) -> None:
        """Before any work (the oracle is built after SFT and sampling): one line for a model
        oracle without ``oracle.model`` or with a path that is no such model, and for an
        ``oracle.*`` setting the chosen kind would ignore (``model`` and ``batch_size`` with the
        env-reward oracle, ``tau`` with a model oracle, ...)."""
        from turnrl.models.loading import check_model_name
        from turnrl.oracles.pairwise import check_pairwise_folder

        kind, model = self.oracle.kind, self.oracle.model
        readers = {"tau": ("env_reward",), "max_tokens": ("judge",), "batch_size": ("pairwise_model", "judge"),
                   "device": ("pairwise_model", "judge")}
        for key, kinds in readers.items():
            value = getattr(self.oracle, key)
            if kind not in kinds and value != type(self.oracle).model_fields[key].default:
                raise TurnRLError(f"oracle.{key}={value} is not used by oracle.kind={kind} (only by "
                                  f"{' and '.join(kinds)}): remove it")
        if kind == "env_reward":
            if model is not None:
                raise TurnRLError(f"oracle.model={model} is not used by oracle.kind=env_reward; set oracle.kind "
                                  "(pairwise_model or judge) or remove oracle.model")
            return
        if model is None:
            raise TurnRLError(f"oracle.kind={kind} needs oracle.model (a model directory)")
        if kind == "judge":
            check_model_name(model, "oracle.model")
            from turnrl.models.loading import model_files
            from turnrl.oracles.judge import check_max_tokens

            if model_files(model) is not None:  # here (a hub id not downloaded yet is checked when built)
                check_max_tokens(model, self.oracle.max_tokens)
        else:
            try:
                check_pairwise_folder(model)
            except TurnRLError as e:
                raise TurnRLError(f"oracle.model: {e}") from None

    def eto_view(self) -> Any:
        """The same settings as an ETO config, to reuse its SFT, rollout and eval stages."""
        from turnrl.pipelines.eto import EtoConfig

        shared = {k: getattr(self, k) for k in AgentPipelineConfig.model_fields}
        return EtoConfig(**shared, samples_per_task=self.samples_per_task, sample_temperature=self.temperature)


# ----------------------------------------------------------------------------- stages


def sample(cfg: SPPOConfig, model: str, out: Path, i: int) -> dict[str, Any]:
    """K samples of each of the first ``train_tasks`` train tasks from ``model`` -> ``out``."""
    from turnrl import envs
    from turnrl.pipelines.eto import _play, _policy, _repeat, _seed_torch, rollout_stats
    from turnrl.rollout.sampler import plan_episodes

    eto = cfg.eto_view()
    _seed_torch(cfg.seed, "sppo-sample", i)
    env = envs.make(cfg.env, **cfg.env_opts)
    try:
        tasks = plan_episodes(env, "train", cfg.train_tasks, cfg.plan_seed())
    finally:
        env.close()
    return rollout_stats(_play(_policy(model, eto, cfg.temperature), eto, _repeat(tasks, cfg.samples_per_task), out))


def build_data(cfg: SPPOConfig, samples: list[Trajectory], scored_out: Path, data_out: Path) -> dict[str, Any]:
    """Oracle win rates of every sample (``scored_out``) and the training data (``data_out``):
    scored samples for SPPO, best-vs-worst pairs for DPO. One batched oracle call."""
    oracle = make_oracle(cfg.oracle)
    scored = score_samples(samples, oracle)
    write_jsonl(scored_out, scored)
    rates = [float(t.meta["win_rate"]) for t in scored]
    stats: dict[str, Any] = {"samples": len(scored), "oracle": oracle.name,
                             "tasks": len({t.task_id for t in scored}),
                             "min_win_rate": min(rates), "max_win_rate": max(rates)}
    if cfg.loss == "sppo":
        data = select_samples(scored, cfg.select)
        if not data:
            raise TurnRLError(f"{data_out}: no training samples (every task's samples tie under the oracle)")
        decided = len(select_samples(scored, "best_worst")) // 2
        if not decided:  # select=all: every target is eta * 0, so from the reference the step changes nothing
            logging.getLogger(__name__).warning("%s: every task's samples tie under the oracle: this iteration's "
                                                "targets are all 0 and it trains nothing (decided_tasks 0)", data_out)
        write_jsonl(data_out, data)
        stats["train_samples"] = len(data)
        stats["decided_tasks"] = decided
        return stats
    # DPO on self-play pairs: best vs worst by win rate (self_play_pairs ranks by return_)
    ranked = [_with_return(t, float(t.meta["win_rate"])) for t in scored]
    pairs: list[Pair] = []
    for p in self_play_pairs(ranked, stats={}):
        chosen, rejected = _restore(p.chosen), _restore(p.rejected)
        # self_play_pairs recorded the ranking key (the win rate) as the returns: record both as they are
        pairs.append(Pair(p.task_id, chosen, rejected,
                          {**p.meta, "kind": "self_play_oracle", "oracle": oracle.name,
                           "chosen_return": chosen.return_, "rejected_return": rejected.return_,
                           "chosen_win_rate": float(chosen.meta["win_rate"]),
                           "rejected_win_rate": float(rejected.meta["win_rate"])}))
    if not pairs:
        raise TurnRLError(f"{data_out}: no pairs (every task's samples tie under the oracle)")
    write_jsonl(data_out, pairs)
    stats["train_pairs"] = len(pairs)
    return stats


def _with_return(t: Trajectory, r: float) -> Trajectory:
    from dataclasses import replace

    return replace(t, return_=r, meta={**t.meta, "env_return": t.return_})


def _restore(t: Trajectory) -> Trajectory:
    from dataclasses import replace

    meta = dict(t.meta)
    return replace(t, return_=float(meta.pop("env_return")), meta=meta)


def train(cfg: SPPOConfig, model: str, data: Path, out: Path, i: int) -> str:
    """SPPO (or DPO) from ``model``, which is also the reference (pi_t) -> ``out``."""
    from turnrl.pipelines.eto import train_iteration

    return train_iteration(cfg, "sppo" if cfg.loss == "sppo" else "dpo", model, data, out, i)


def evaluate(cfg: SPPOConfig, model: str, out: Path, label: str) -> list[dict[str, Any]]:
    from turnrl.pipelines.eto import evaluate_model

    return evaluate_model(cfg.eto_view(), model, out, label)


# ----------------------------------------------------------------------------- the loop


def run_iteration(cfg: SPPOConfig, out: str | Path, i: int, model: str, *,
                  log: Log | None = None) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    """Iteration ``i`` in ``OUT/iter-i``; returns (new model, eval records, data stats)."""
    it = iter_dir(out, i)
    sampled = run_stage(it / "samples.jsonl", lambda p: sample(cfg, model, p, i), log=log, name=f"iter-{i}/sample")
    data = it / ("data.jsonl" if cfg.loss == "sppo" else "pairs.jsonl")
    stats = run_stage(data, lambda p: build_data(cfg, read_trajectories(it / "samples.jsonl"), it / "scored.jsonl", p),
                      log=log, name=f"iter-{i}/oracle")
    new = run_stage(it / "train", lambda p: train(cfg, model, data, p, i), log=log, name=f"iter-{i}/train")
    results = run_stage(it / "eval.json", lambda p: evaluate(cfg, new, p, f"{_method_name(cfg.loss)}-iter{i}"), log=log,
                        name=f"iter-{i}/eval")
    return new, results, {**stats, "sampled": sampled}


def run_sppo(cfg: SPPOConfig, out: str | Path | None = None, *, log: Log | None = None,
             console: Any = None) -> dict[str, Any]:
    """The start agent, its evaluation, then ``iterations`` iterations; OUT/summary.json + report.md."""
    from turnrl.pipelines.eto import prepare_base

    cfg.check()
    out = Path(out if out is not None else cfg.out)
    check_settings(out, {**cfg.model_dump(mode="json", exclude={"out"}),
                         **start_model_fingerprints(model=cfg.model, base=cfg.base, oracle_model=cfg.oracle.model)},
                   free=("iterations",))
    if log is None and console is not None:
        def log(msg: str) -> None:
            console.print(f"[dim]sppo[/dim] {msg}")
    start_model, _ = prepare_base(cfg.eto_view(), out, log=log)
    start = run_stage(out / "eval_start.json", lambda p: evaluate(cfg, str(start_model), p, "start"), log=log)
    current = str(start_model)
    iterations: list[dict[str, Any]] = []
    for i in range(1, cfg.iterations + 1):
        current, results, stats = run_iteration(cfg, out, i, current, log=log)
        iterations.append({"iteration": i, "model": current, "results": results, "data": stats})
    summary = {"out": str(out), "method": cfg.loss, "start": {"model": str(start_model), "results": start},
               "iterations": iterations, "final_model": current, "config": cfg.model_dump(mode="json")}
    atomic_write_text(out / "report.md", report(summary))
    atomic_write_json(out / "summary.json", summary)
    if console is not None:
        console.print(report(summary))
    return summary


def compare_config(run: Any, loss: str = "sppo") -> SPPOConfig:
    """The SPPO settings of one ``turnrl compare`` seed: every pipeline setting (env, prompt, eval,
    seeds); the SFT agent as start; ``iterations``, ``expert_episodes`` (train tasks),
    ``samples_per_task`` and ``sample_temperature`` from ``pipeline``; then the compare
    config's ``sppo`` section (any :class:`SPPOConfig` key, e.g. ``train``, ``oracle``,
    ``select``, ``train_tasks``) on top. An unknown key there is a one-line error."""
    pipe = run.pipe
    shared = pipe.model_dump(include=set(AgentPipelineConfig.model_fields))  # env, prompt, eval, seeds, ...
    shared.update(model=run.sft, train_tasks=pipe.expert_episodes, iterations=pipe.iterations,
                  samples_per_task=pipe.samples_per_task, temperature=pipe.sample_temperature)
    data = merge(merge(SPPOConfig().model_dump(), shared), check_compare_section(getattr(run.cfg, "sppo", {})))
    data["env_opts"] = dict(pipe.env_opts)  # the pipeline's whole: merged, tic-tac-toe's defaults would stay in
    return _validate({**data, "out": str(run.dir / _method_name(loss)), "loss": loss}).check()


def _method_name(loss: str) -> str:
    """The compare method (and run directory) of SPPO's ``loss``: ``sppo`` or ``sppo_dpo``."""
    return "sppo" if loss == "sppo" else f"sppo_{loss}"


_SET_BY_COMPARE = ("out", "model", "env", "seed", "data_seed", "loss")
#: pipeline settings every method of a comparison shares: the games, the prompt and the evaluation, so
#: that every row plays the same games (the by-game pairing needs it)
_SHARED_IN_COMPARE = ("env_opts", "instruction", "history", "invalid_action", "invalid_penalty", "eval_splits",
                      "eval_episodes", "eval_seed", "eval_temperature")

#: what makes the start agent (the demos, the base model, SFT): in a comparison every method starts
#: from the seed's SFT agent, made by ``pipeline.*``
_START_IN_COMPARE = ("base", "sft", "expert_episodes")


def _validate(data: dict[str, Any]) -> SPPOConfig:
    try:
        return SPPOConfig.model_validate(data)
    except ValidationError as e:
        raise TurnRLError(format_validation_error(SPPOConfig, e, "compare config, section sppo")) from None


def check_compare_section(section: dict[str, Any], losses: Sequence[str] = ()) -> dict[str, Any]:
    """The ``sppo`` section of a compare config: any :class:`SPPOConfig` key but those the
    comparison sets (``out``, ``model``, ``env``, ``seed``, ``data_seed``, ``loss``), shares with
    every method (the env's options, the prompt, the evaluation: ``pipeline.*``) or that make the
    start agent (``base``, ``sft``, ``expert_episodes``: the seed's SFT agent is the start); one line
    for a bad one, a model oracle without its model, a ``train.seed`` or ``train.history`` (the
    pipeline's are used) and a ``train.*`` setting that one of ``losses`` does not read included."""
    for key in _SET_BY_COMPARE:
        if key in section:
            raise TurnRLError(f"compare config, section sppo: '{key}' is set by the comparison")
    for key in _SHARED_IN_COMPARE:
        if key in section:
            raise TurnRLError(f"compare config, section sppo: '{key}' is shared by every method; set pipeline.{key}")
    for key in _START_IN_COMPARE:
        if key in section:
            raise TurnRLError(f"compare config, section sppo: '{key}' would have no effect: SPPO starts from the "
                              f"seed's SFT agent; set pipeline.{key}")
    cfg = _validate(merge(SPPOConfig().model_dump(), section))
    if cfg.train.loss not in ("sppo", "dpo"):  # what the rows' losses take (the pipeline's check, at a row's start)
        raise TurnRLError(f"compare config, section sppo: train.loss={cfg.train.loss} is not used: the sppo rows "
                          "train with sppo and the sppo_dpo rows with dpo; remove train.loss")
    if cfg.iterations < 1:
        raise TurnRLError(f"compare config, section sppo: iterations={cfg.iterations}: the sppo rows need at least 1")
    try:
        cfg.check_oracle()
        cfg.check_trainer_sections(in_compare=True)
        cfg.train.check_budget("train.")  # the rows train it (their start is the seed's SFT agent: no sft)
        for loss in losses:
            cfg.train.check_loss(loss, "train.")
        if losses:
            cfg.check_unread(losses, what="the sppo rows train")
    except TurnRLError as e:
        raise TurnRLError(f"compare config, section sppo: {e}") from None
    return dict(section)


def compare_method(run: Any, loss: str = "sppo") -> list[dict[str, Any]]:
    """``sppo`` (and ``sppo_dpo``: the same samples budget and oracle, DPO on each task's
    best-vs-worst sample) in ``turnrl compare``: iterations from the seed's SFT agent with
    :func:`compare_config`'s settings; one record per iteration."""
    cfg = compare_config(run, loss)
    method = _method_name(loss)
    out: list[dict[str, Any]] = []
    current = run.sft
    for i in range(1, cfg.iterations + 1):
        current, results, stats = run_iteration(cfg, cfg.out, i, current, log=run.log)
        out += [{**r, "method": method, "iteration": i, "loss": loss,
                 "eta": cfg.train.eta if loss == "sppo" else None,
                 "samples": stats.get("train_samples", stats.get("train_pairs"))}
                for r in results]
    return out


def report(summary: dict[str, Any]) -> str:
    lines = [f"# {summary['method'].upper()} run ({summary['out']})", "",
             "| iteration | split | avg reward | 95% CI | success | invalid |", "|---:|---|---:|---|---:|---:|"]
    rows = [(0, summary["start"]["results"])] + [(it["iteration"], it["results"]) for it in summary["iterations"]]
    for i, results in rows:
        for r in results:
            lines.append(f"| {i} | {r['split']} | {r['avg_reward']:.3f} | [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}] "
                         f"| {r['success_rate']:.2f} | {r['invalid_action_rate']:.2f} |")
    lines += ["", "```json", json.dumps([it["data"] for it in summary["iterations"]], indent=1), "```", ""]
    return "\n".join(lines)
