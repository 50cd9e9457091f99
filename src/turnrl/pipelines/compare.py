"""``turnrl compare``: several methods over several seeds, one table with 95% CIs and plots.

Per seed ``S`` (``OUT/seed-S/``): the expert demos and the SFT agent (:func:`prepare_base`;
with ``sft_seed``, one SFT agent in ``OUT/start-S/`` for every seed),
one greedy exploration of every train task by the SFT agent (``explore-sft.jsonl``, shared by
the ETO and DMPO runs so they differ only in their loss and pair filter; run on first use, so a
seed with neither skips it), then each method
as a resumable stage ``OUT/seed-S/<method>.json`` (its records) with its work under
``OUT/seed-S/<method>/``. Built-in methods:

* ``base`` -- the untrained base model (independent of the seed: evaluated once);
* ``sft`` -- the SFT agent;
* ``best_of_n`` -- N samples of the SFT agent a test task at temperature 1, the best by reward;
* ``rft`` -- the SFT agent fine-tuned on the demos plus its successful explored samples;
* ``eto`` -- the ETO loop with DPO on ``pipeline.pairs`` (trajectory pairs by default) for
  ``pipeline.iterations`` iterations (one record per iteration: the reward-by-iteration plot);
* ``dmpo`` -- ``dmpo_iterations`` (default 1) DMPO iterations for every ``dmpo_gammas`` x
  ``loser_settings``, plus DPO for as many iterations in the loser settings the ETO run does not
  cover (the gamma plot; ETO's iteration ``dmpo_iterations`` is the DPO row in the one it does);
* ``loser_length`` -- DPO and DMPO (the smallest gamma) with noisy losers cut to the winner's
  length plus each of ``truncate_ks``, as many iterations (the loser-length plot, with the uncut runs).

More methods plug in with :func:`register_method` (``sppo``: a function of a :class:`SeedRun`
returning result records). Outputs: ``compare.json`` (``{"results": [...]}``, records as
``turnrl eval`` writes them plus ``method``, ``seed`` and the variant's settings), ``compare.md``
(avg reward and success per method and split: mean over seeds with a 95% CI across seeds)
and the PNG plots ``reward_by_method.png``, ``reward_by_iteration.png``, ``dmpo_gamma.png`` and
``loser_length.png``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from turnrl.config import Config
from turnrl.data.io import read_trajectories
from turnrl.errors import TurnRLError, did_you_mean
from turnrl.pipelines.eto import (
    EtoConfig,
    best_of_n,
    evaluate_model,
    explore,
    prepare_base,
    prepare_base_model,
    rft,
    run_pipeline,
)
from turnrl.pipelines.iterative import check_settings, run_stage, start_model_fingerprints
from turnrl.stats import mean_ci95, overlap, paired_by_unit
from turnrl.train.core import atomic_write_json, atomic_write_text

Log = Callable[[str], None]
Record = dict[str, Any]


class CompareConfig(Config):
    """Settings of ``turnrl compare`` (``pipeline.*``: the shared ETO/DMPO pipeline settings)."""

    out: str = "runs/compare"
    seeds: list[int] = [0, 1, 2]
    methods: list[str] = ["base", "sft", "best_of_n", "rft", "eto", "dmpo", "loser_length"]
    pipeline: EtoConfig = EtoConfig()
    best_of_n: int = 10
    dmpo_gammas: list[float] = [0.1, 0.5, 0.9]
    dmpo_iterations: int = 1
    """Iterations of the ``dmpo`` and ``loser_length`` runs (explore, pair, train, as ETO iterates);
    their DPO row in ETO's loser setting is ETO's iteration of this number."""
    loser_settings: list[Literal["clean", "noisy"]] = ["clean", "noisy"]
    truncate_ks: list[int] = [0]
    """Loser-length study: losers cut to the winner's turns plus k (empty: no study)."""
    sppo: dict[str, Any] = {}
    """Methods ``sppo`` / ``sppo_dpo``: :class:`~turnrl.pipelines.sppo.SPPOConfig` keys over
    the shared ``pipeline`` settings (e.g. ``train``, ``oracle``, ``select``, ``train_tasks``)."""
    sft_seed: int | None = None
    """One SFT agent for every seed, trained with this seed (``OUT/start-S/``), so that the seeds
    vary only what follows SFT, as the papers start every run from one model; needs
    ``pipeline.data_seed`` (one demo set). None: each seed trains its own SFT agent."""
    dpo_from_eto: bool = True
    """The DPO baseline in ``pipeline.losers`` is ETO's iteration ``dmpo_iterations`` (the same
    agent, exploration and pairs) rather than a separate run; needs ``eto`` in ``methods``."""


@dataclass
class SeedRun:
    """What a method needs for one seed: settings, the SFT agent, its demos and exploration."""

    cfg: CompareConfig
    seed: int
    dir: Path
    pipe: EtoConfig
    base_model: str
    sft: str
    expert: Path
    log: Log | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def explored(self) -> Path:
        """The SFT agent's exploration of every train task, shared by the ETO and DMPO runs of
        the seed; a resumable stage run on first use, so a seed without them never explores."""
        path = self.dir / "explore-sft.jsonl"
        run_stage(path, lambda p: explore(self.pipe, self.sft, p, 1, read_trajectories(self.expert)), log=self.log)
        return path

    def evaluate(self, model: str, out: Path, label: str, **kw: Any) -> list[Record]:
        return run_stage(out, lambda p: evaluate_model(self.pipe, model, p, label, **kw), log=self.log)


MethodFn = Callable[[SeedRun], list[Record]]
METHODS: dict[str, MethodFn] = {}


def register_method(name: str, fn: MethodFn) -> None:
    """Add a method to ``turnrl compare`` (e.g. ``sppo``): ``fn(run)`` returns result records
    (``evaluation.summarize`` dicts; ``method`` and ``seed`` are filled in if missing)."""
    METHODS[name] = fn


def _tag(records: list[Record], method: str, **extra: Any) -> list[Record]:
    return [{**r, "method": r.get("method", method), **extra} for r in records]


def _base(run: SeedRun) -> list[Record]:
    # the untrained model (``pipeline.base``), also where ``pipeline.model`` gives the start agent
    # (whose row is sft). Its greedy play does not depend on the seed, so every seed shares one
    # evaluation; sampled play does (the seed salts the sampling), so each seed plays its own
    sampled = run.pipe.eval_temperature > 0
    # before 29 Nov 2026 the base row of a run with pipeline.model was that start agent's, in base-eval.json
    name = "base-eval.json" if run.pipe.model is None else "base-eval-untrained.json"
    out = (run.dir if sampled else Path(run.cfg.out)) / name
    return _tag(run.evaluate(run.pipe.base, out, "base"), "base")


def _sft(run: SeedRun) -> list[Record]:
    return _tag(run.evaluate(run.sft, run.dir / "sft-eval.json", "sft"), "sft")


def _best_of_n(run: SeedRun) -> list[Record]:
    n = run.cfg.best_of_n
    out = run.dir / "best_of_n" / "eval.json"
    return _tag(run_stage(out, lambda p: best_of_n(run.pipe, run.sft, p, n), log=run.log), "best_of_n", n=n)


def _rft(run: SeedRun) -> list[Record]:
    d = run.dir / "rft"
    samples = d / "explore.jsonl"
    p = run.pipe.model_copy(update={"self_play": True})  # K samples a task at sample_temperature
    run_stage(samples, lambda o: explore(p, run.sft, o, 1, []), log=run.log)
    trajs = read_trajectories(samples)
    model = run_stage(d / "train", lambda o: rft(run.pipe, run.base_model, run.sft, run.expert, trajs, o, 1),
                      log=run.log)
    return _tag(run.evaluate(model, d / "eval.json", "rft"), "rft")


def _pipeline(run: SeedRun, name: str, iterations: int, **update: Any) -> list[Record]:
    pipe = run.pipe.model_copy(update={"iterations": iterations, **update})
    summary = run_pipeline(pipe, run.dir / name, model=run.sft, expert=run.expert, first_explore=run.explored,
                           label=name, log=run.log, eval_start=False, base=run.base_model)
    out: list[Record] = []
    for it in summary["iterations"]:
        pairs = it["pairs"]
        out += _tag(it["results"], name, iteration=it["iteration"], loss=pipe.loss, losers=pipe.losers,
                    gamma=pipe.train.gamma if pipe.loss == "dmpo" else None, truncate_k=pipe.truncate_k,
                    pairs=pairs.get("pairs"), loser_turns=pairs.get("avg_rejected_turns"))
    return out


def _eto(run: SeedRun) -> list[Record]:
    return _pipeline(run, "eto", run.pipe.iterations, loss="dpo")


def _dmpo(run: SeedRun) -> list[Record]:
    cfg = run.cfg
    out: list[Record] = []
    for losers in cfg.loser_settings:
        if not (cfg.dpo_from_eto and losers == run.pipe.losers):
            out += _pipeline(run, f"dpo-{losers}", cfg.dmpo_iterations, loss="dpo", losers=losers)
        for g in cfg.dmpo_gammas:
            train = run.pipe.train.model_copy(update={"gamma": g})
            out += _pipeline(run, f"dmpo-g{g:g}-{losers}", cfg.dmpo_iterations, loss="dmpo", losers=losers,
                             train=train)
    return out


def _loser_length_gamma(cfg: CompareConfig) -> float:
    """The DMPO gamma of the loser-length study: the smallest of ``dmpo_gammas``, else the trainer's."""
    return min(cfg.dmpo_gammas) if cfg.dmpo_gammas else cfg.pipeline.train.gamma


def _loser_length(run: SeedRun) -> list[Record]:
    """DPO and DMPO (smallest gamma) with losers cut to the winner's turns plus k, noisy losers."""
    cfg = run.cfg
    out: list[Record] = []
    g = _loser_length_gamma(cfg)
    train = run.pipe.train.model_copy(update={"gamma": g})
    for k in cfg.truncate_ks:
        n = cfg.dmpo_iterations
        out += _pipeline(run, f"dpo-noisy-k{k}", n, loss="dpo", losers="noisy", truncate_k=k)
        out += _pipeline(run, f"dmpo-g{g:g}-noisy-k{k}", n, loss="dmpo", losers="noisy", truncate_k=k, train=train)
    return out


for _name, _fn in (("base", _base), ("sft", _sft), ("best_of_n", _best_of_n), ("rft", _rft), ("eto", _eto),
                   ("dmpo", _dmpo), ("loser_length", _loser_length)):
    register_method(_name, _fn)

from turnrl.pipelines.sppo import check_compare_section  # noqa: E402
from turnrl.pipelines.sppo import compare_method as _sppo  # noqa: E402  (SPPO iterations from the SFT agent)

register_method("sppo", _sppo)
register_method("sppo_dpo", lambda run: _sppo(run, "dpo"))


# ----------------------------------------------------------------------------- the run


def _check(cfg: CompareConfig) -> None:
    if not cfg.methods:
        raise TurnRLError(f"methods is empty: nothing to compare; choose from: {', '.join(METHODS)}")
    if not str(cfg.out).strip():
        raise TurnRLError("out is empty: give the comparison a folder (it would write into the current one)")
    for key in ("loss", "seed", "out"):  # each row sets these itself: a value given here would do nothing
        if key in cfg.pipeline.model_fields_set and getattr(cfg.pipeline, key) != type(cfg.pipeline).model_fields[key].default:
            what = {"loss": "each method sets its loss", "seed": "the seeds are `seeds`",
                    "out": "the folders are under `out`"}[key]
            raise TurnRLError(f"pipeline.{key}={getattr(cfg.pipeline, key)}: {what}; remove pipeline.{key}")
    for m in cfg.methods:
        if m not in METHODS:
            raise TurnRLError(f"methods: unknown method '{m}'{did_you_mean(m, list(METHODS))}; "
                              f"choose from: {', '.join(METHODS)}")
    if cfg.pipeline.train.gamma != EtoConfig().train.gamma:  # ETO trains DPO, DMPO takes dmpo_gammas, SPPO its own
        raise TurnRLError(f"pipeline.train.gamma={cfg.pipeline.train.gamma}: no method reads it (DMPO's gammas are "
                          "dmpo_gammas); remove pipeline.train.gamma")
    if "eto" in cfg.methods and cfg.pipeline.iterations < 1:
        raise TurnRLError(f"pipeline.iterations={cfg.pipeline.iterations}: method eto needs at least one iteration")
    if {"sppo", "sppo_dpo"} & set(cfg.methods):  # their defaults come from pipeline unless the section sets them
        for key, least in (("iterations", 1), ("samples_per_task", 2)):
            if key not in cfg.sppo and getattr(cfg.pipeline, key) < least:
                raise TurnRLError(f"pipeline.{key}={getattr(cfg.pipeline, key)}: SPPO takes it and needs >= {least}; "
                                  f"raise it or set sppo.{key}")
    if len(cfg.seeds) < 1 or len(set(cfg.seeds)) != len(cfg.seeds):
        raise TurnRLError(f"seeds must be distinct and non-empty (got {cfg.seeds})")
    if cfg.best_of_n < 1:
        raise TurnRLError(f"best_of_n must be >= 1 (got {cfg.best_of_n})")
    if cfg.dmpo_iterations < 1:
        raise TurnRLError(f"dmpo_iterations must be >= 1 (got {cfg.dmpo_iterations})")
    if "loser_length" in cfg.methods and cfg.truncate_ks and cfg.pipeline.self_play:
        raise TurnRLError("methods: loser_length cuts expert pairs' losers; pipeline.self_play pairs a task's own "
                          "samples: drop loser_length or set truncate_ks: []")
    if cfg.pipeline.self_play:  # self-play's first iteration is RFT: a row of one iteration would be RFT's
        for m, n, key in (("eto", cfg.pipeline.iterations, "pipeline.iterations"),
                          ("dmpo", cfg.dmpo_iterations, "dmpo_iterations"),
                          ("loser_length", cfg.dmpo_iterations, "dmpo_iterations")):
            if m in cfg.methods and n < 2:
                raise TurnRLError(f"methods: {m} with pipeline.self_play reads iteration {n}, which is self-play's "
                                  f"RFT, not preference training: set {key} >= 2")
    from_eto = (("dmpo" in cfg.methods and cfg.pipeline.losers in cfg.loser_settings)
                or ("loser_length" in cfg.methods and cfg.pipeline.losers == "noisy"))
    # whether or not this run lists eto: another process on this out may run it, and the settings it pins
    # (pipeline.iterations, dpo_from_eto) could not be changed afterwards to give the DPO row
    if cfg.dpo_from_eto and from_eto and cfg.dmpo_iterations > cfg.pipeline.iterations:
        raise TurnRLError(f"dmpo_iterations={cfg.dmpo_iterations}: the DPO row is ETO's iteration of that number, "
                          f"and ETO runs pipeline.iterations={cfg.pipeline.iterations}; raise pipeline.iterations "
                          "or set dpo_from_eto=false")
    for g in cfg.dmpo_gammas:
        if not 0 < g <= 1:
            raise TurnRLError(f"dmpo_gammas: gamma must be in (0, 1] (got {g})")
    for k in cfg.truncate_ks:
        if k < 0:
            raise TurnRLError(f"truncate_ks: losers are cut to the winner's turns plus k, k >= 0 (got {k})")
    if "loser_length" in cfg.methods and cfg.truncate_ks and cfg.pipeline.pairs in ("step", "takeover"):
        raise TurnRLError(f"methods: loser_length cuts trajectory pairs' losers; pipeline.pairs={cfg.pipeline.pairs} "
                          "has none to cut: drop loser_length or set truncate_ks: []")
    if cfg.sft_seed is not None and cfg.pipeline.data_seed is None:
        raise TurnRLError("sft_seed trains one SFT agent for every seed on one demo set: set pipeline.data_seed too")
    if cfg.sft_seed is not None and cfg.pipeline.model is not None:
        raise TurnRLError("sft_seed trains the start and pipeline.model gives one: set one of them")
    cfg.pipeline.check_trainer_sections("pipeline.", in_compare=True)
    if {"dmpo", "loser_length"} & set(cfg.methods):  # their rows train pipeline.train with dmpo
        cfg.pipeline.train.check_loss("dmpo", "pipeline.train.")
    # named with their prefix, before pipeline.check() names them without it; train only where a row trains it
    reads_train = bool({"eto", "dmpo", "loser_length"} & set(cfg.methods))
    cfg.pipeline.check_budgets("pipeline.", reads_train=reads_train)
    cfg.pipeline.check(reads_train)
    if {"sppo", "sppo_dpo"} & set(cfg.methods):
        check_compare_section(cfg.sppo, [{"sppo": "sppo", "sppo_dpo": "dpo"}[m] for m in cfg.methods
                                         if m in ("sppo", "sppo_dpo")])


def script_args(argv: list[str]) -> tuple[CompareConfig, str, list[int]]:
    """``CONFIG OUT SEED [SEED ...] [key=value ...]``, the arguments of a script that reads a
    ``turnrl compare`` run (CONFIG and the overrides as given to that command): its config, OUT and
    the seeds. A bad argument is a ``ValueError``, which :func:`turnrl.errors.run_script` shows in one
    line with the script's usage."""
    from turnrl.config import load_config

    overrides = [a for a in argv if "=" in a]
    rest = [a for a in argv if "=" not in a]
    if len(rest) < 3:
        raise ValueError("give CONFIG, OUT and at least one SEED")
    config, out, seeds = rest[0], rest[1], rest[2:]
    if not all(s.lstrip("-").isdigit() for s in seeds):
        raise ValueError(f"SEED: not an integer in {seeds}")
    return load_config(CompareConfig, config, [*overrides, f"out={out}"]), out, [int(s) for s in seeds]


def seed_run(cfg: CompareConfig, seed: int, log: Log | None = None) -> SeedRun:
    """Prepare (or find) seed ``seed``'s SFT agent and demos."""
    root = Path(cfg.out)
    base_model = prepare_base_model(cfg.pipeline, root, log)  # one tiny model for every seed
    pipe = cfg.pipeline.model_copy(update={"seed": seed, "base": base_model})
    first = base_model if pipe.model is None else pipe.model  # what RFT retrains
    if cfg.sft_seed is not None:  # one start for every seed
        start, _ = prepare_base(pipe.model_copy(update={"seed": cfg.sft_seed}), root / f"start-{cfg.sft_seed}", log=log)
        pipe = pipe.model_copy(update={"model": start})
    d = root / f"seed-{seed}"
    sft, expert = prepare_base(pipe, d, log=log)
    return SeedRun(cfg, seed, d, pipe, first, sft, expert, log)


def _method_stage(fn: MethodFn, run: SeedRun) -> Callable[[Path], list[Record]]:
    return lambda _out: fn(run)


def _check_iterations(stage: Path, recs: list[Record], n: int) -> None:
    """A finished ``dmpo``/``loser_length`` stage must hold ``n`` iterations: one made before
    ``dmpo_iterations`` (whose settings do not name it) holds 1, and would be read as ``n``."""
    last = max((int(r.get("iteration", 1)) for r in recs), default=n)
    if last != n:
        raise TurnRLError(f"{stage}: holds {last} DMPO iteration(s), this run asks for dmpo_iterations={n}; "
                          "choose another out or remove it")


def compare_settings(cfg: CompareConfig) -> dict[str, Any]:
    """What ``OUT/settings.json`` pins: every setting but those runs on one out may vary (``out``,
    ``seeds``, ``methods``: one process a seed or method group), and the weights of a given start
    (``pipeline.model``, ``pipeline.base``), so that a model replaced in place is not read through
    stages its old weights made."""
    return {**cfg.model_dump(mode="json", exclude={"out", "seeds", "methods"}),
            **start_model_fingerprints(model=cfg.pipeline.model, base=cfg.pipeline.base)}


def run_compare(cfg: CompareConfig, log: Log | None = None) -> dict[str, Any]:
    """Every method for every seed (each a resumable stage), then compare.json/.md and plots."""
    _check(cfg)
    # seeds and methods may differ between runs on one out (one process a seed or method group)
    check_settings(cfg.out, compare_settings(cfg))
    root = Path(cfg.out)
    root.mkdir(parents=True, exist_ok=True)
    records: list[Record] = []
    for seed in cfg.seeds:
        run = seed_run(cfg, seed, log)
        for m in cfg.methods:
            recs = run_stage(run.dir / f"{m}.json", _method_stage(METHODS[m], run), log=log, name=f"seed-{seed}/{m}")
            if m in ("dmpo", "loser_length"):
                _check_iterations(run.dir / f"{m}.json", recs, cfg.dmpo_iterations)
            records += [{**r, "method": r.get("method", m), "seed": seed} for r in recs]
    atomic_write_json(root / "compare.json", {"results": records, "config": cfg.model_dump(mode="json")})
    rows = aggregate(records)
    atomic_write_text(root / "compare.md", report(cfg, rows, records, plot_all(cfg, records, rows, root)))
    from turnrl.evaluation import results_table

    return {"out": str(root), "rows": rows, "table": results_table(
        [{**r, "policy": r["method"], "episodes": r["episodes_per_seed"]} for r in rows],
        title=f"compare (mean over {len(cfg.seeds)} seeds; episodes per seed)")}


# ----------------------------------------------------------------------------- aggregation


def final_records(records: list[Record]) -> list[Record]:
    """One record per (method, seed, split): a method's last iteration."""
    last: dict[tuple[str, int, str], Record] = {}
    for r in records:
        key = (r["method"], r["seed"], r["split"])
        if key not in last or r.get("iteration", 0) >= last[key].get("iteration", 0):
            last[key] = r
    return list(last.values())


def aggregate(records: list[Record]) -> list[Record]:
    """Per (method, split): mean avg reward and success over seeds with 95% CIs across seeds,
    and ``vs_sft``: the paired difference from the SFT agent of the same seed (mean and 95% CI
    over the seeds both have). Every method starts from its seed's SFT agent, so the paired
    difference removes the seed-to-seed spread of the start that widens both rows' CIs.

    Statistics are stored unrounded: a table rounds each once, so every table of the report
    prints the same digits for one statistic (rounded twice, 0.45549 printed 0.456 in one
    table and 0.455 in another)."""
    groups: dict[tuple[str, str], list[Record]] = {}
    finals = final_records(records)
    sft = {(r["seed"], r["split"]): r["avg_reward"] for r in finals if r["method"] == "sft"}
    sft_games = {(r["seed"], r["split"]): r["game_returns"] for r in finals
                 if r["method"] == "sft" and r.get("game_returns")}
    for r in finals:
        groups.setdefault((r["method"], r["split"]), []).append(r)
    rows: list[Record] = []
    for (method, split), rs in groups.items():
        rew, rci = mean_ci95([r["avg_reward"] for r in rs])
        suc, sci = mean_ci95([r["success_rate"] for r in rs])
        inv, _ = mean_ci95([r["invalid_action_rate"] for r in rs])
        turns, _ = mean_ci95([r["avg_turns"] for r in rs])
        rows.append({"method": method, "split": split, "seeds": len(rs), "env": rs[0]["env"],
                     "episodes_per_seed": rs[0]["episodes"], "avg_reward": rew, "ci95": list(rci),
                     "success_rate": suc, "success_ci95": list(sci), "invalid_action_rate": inv,
                     "avg_turns": turns, "per_seed": [r["avg_reward"] for r in rs],
                     **{k: rs[0].get(k) for k in ("loss", "gamma", "losers", "truncate_k") if k in rs[0]},
                     "loser_turns": _mean([r.get("loser_turns") for r in rs]),
                     "vs_sft": _paired(rs, sft) if method != "sft" else None,
                     "vs_sft_by_game": _paired_by_game(rs, sft_games) if method != "sft" else None})
    return rows


def _paired_by_game(rs: list[Record], sft: dict[tuple[int, str], list[float]]) -> Record | None:
    """The row minus the same seed's SFT agent game by game, averaged over seeds, with a 95% CI
    across the evaluation games (:func:`~turnrl.stats.paired_by_unit`): how the gain varies with
    which games were drawn (``vs_sft``'s CI is across seeds); ``up``/``down``: how many games
    the row raises and lowers (a gain can rest on a few games). Seeds whose records lack the games'
    returns (records written before they were kept) or played other games are left out."""
    both = [(r["game_returns"], sft[(r["seed"], r["split"])]) for r in rs
            if r.get("game_returns") and len(r["game_returns"]) == len(sft.get((r["seed"], r["split"]), []))]
    if not both:
        return None
    p = paired_by_unit([dict(enumerate(t)) for t, _ in both], [dict(enumerate(c)) for _, c in both])
    return {"mean": p.mean, "ci95": list(p.ci95), "games": p.units, "seeds": len(both), "up": p.up, "down": p.down}


def _paired(rs: list[Record], sft: dict[tuple[int, str], float]) -> Record | None:
    """The row minus the same seed's SFT agent: mean and 95% CI across seeds; ``up``/``down``:
    how many seeds' agents it raises and lowers."""
    diffs = [r["avg_reward"] - sft[(r["seed"], r["split"])] for r in rs if (r["seed"], r["split"]) in sft]
    if not diffs:
        return None
    m, (lo, hi) = mean_ci95(diffs)
    return {"mean": m, "ci95": [lo, hi], "seeds": len(diffs), "up": sum(d > 0 for d in diffs),
            "down": sum(d < 0 for d in diffs)}


def _mean(xs: list[Any]) -> float | None:
    vals = [float(x) for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None  # unrounded: the report rounds once


def _row(rows: list[Record], method: str, split: str) -> Record | None:
    return next((r for r in rows if r["method"] == method and r["split"] == split), None)


def _versus(r: Record, base: Record) -> str:
    """``r`` against ``base``: above or below with non-overlapping CIs, or not separated."""
    head = f"{r['avg_reward']:.3f} {_ci(r)} vs {base['avg_reward']:.3f} {_ci(base)} -> "
    if min(r["seeds"], base["seeds"]) < 2:
        return head + "one seed: no CI across seeds, no verdict"
    paired = ""
    d = r.get("vs_sft") if base["method"] == "sft" else None
    if d is not None and d["seeds"] >= 2:
        paired = (f"; paired difference {d['mean']:+.3f} {_ci(d)} over {d['seeds']} seeds "
                  f"({_side(d)}; {d['up']} up, {d['down']} down)")
    g = r.get("vs_sft_by_game") if base["method"] == "sft" else None
    if g is not None and g["games"] >= 2:
        paired += (f"; by game {g['mean']:+.3f} {_ci(g, n='games')} over {g['games']} games{_fewer(g, r)} "
                   f"({_side(g)}; {g['up']} up, {g['down']} down)")
    if not overlap(tuple(r["ci95"]), tuple(base["ci95"])):
        side = "above" if r["avg_reward"] > base["avg_reward"] else "below"
        return head + f"**{side} (CIs do not overlap)**" + paired
    return head + "not separated" + paired


def verdicts(cfg: CompareConfig, rows: list[Record]) -> list[str]:
    """The issues' claims, checked on the seen split: ETO, DMPO and SPPO (last iteration) vs
    SFT; DMPO with the smallest gamma vs DPO with noisy losers; SPPO vs self-play DPO."""
    out = []
    sft = _row(rows, "sft", "seen")
    if sft is not None:
        for r in rows:
            if r["split"] != "seen" or r["method"] in ("sft", "base"):
                continue
            if (r["method"] in ("eto", "sppo", "sppo_dpo")
                    or r["method"].startswith("dmpo-g") and "-k" not in r["method"]):
                out.append(f"- {r['method']} vs sft (seen): {_versus(r, sft)}")
    from_eto = cfg.dpo_from_eto and cfg.pipeline.losers == "noisy"
    dpo = _row(rows, "eto" if from_eto else "dpo-noisy", "seen")
    missing_iteration = dpo is not None and dpo["method"] == "eto" and _like_dmpo(dpo) is None
    if dpo is not None and dpo["method"] == "eto":  # the same iteration as the DMPO run's last
        dpo = _like_dmpo(dpo)
    if "noisy" in cfg.loser_settings and cfg.dmpo_gammas:
        g = min(cfg.dmpo_gammas)
        dm = _row(rows, f"dmpo-g{g:g}-noisy", "seen")
        if dm is not None and missing_iteration:
            out.append(f"- noisy losers, seen: DMPO gamma={g:g} has no DPO row to compare with (no row of ETO's "
                       f"iteration {cfg.dmpo_iterations} among these)")
        elif dm is not None and dpo is None:
            out.append(f"- noisy losers, seen: DMPO gamma={g:g} has no DPO row to compare with"
                       + (f" (the DPO baseline is ETO's iteration {cfg.dmpo_iterations}, dpo_from_eto: run eto too)"
                          if from_eto else ""))
        elif dm is not None and dpo is not None:
            head = (f"- noisy losers, seen: DMPO gamma={g:g} {dm['avg_reward']:.3f} {_ci(dm)} vs DPO "
                    f"{dpo['avg_reward']:.3f} {_ci(dpo)} -> ")
            if min(dm["seeds"], dpo["seeds"]) < 2:
                out.append(head + "one seed: no CI across seeds, no verdict")
            else:
                out.append(head + ("DMPO at least as good (mean)" if dm["avg_reward"] >= dpo["avg_reward"]
                                   else "DPO higher (mean)")
                           + ("; CIs overlap" if overlap(tuple(dm["ci95"]), tuple(dpo["ci95"])) else "; CIs do not overlap"))
    sppo, sp_dpo = _row(rows, "sppo", "seen"), _row(rows, "sppo_dpo", "seen")
    if sppo is not None and sp_dpo is not None:
        out.append(f"- sppo vs sppo_dpo (seen, same samples and oracle): {_versus(sppo, sp_dpo)}")
    return out


def _like_dmpo(eto_row: Record) -> Record | None:
    """ETO's row at the DMPO runs' iteration (attached by :func:`_with_dmpo_iteration`); None
    when ETO has no such iteration (its final row is another agent than a DPO run of as many)."""
    return eto_row.get("_like_dmpo")


def _side(d: Record) -> str:
    """Where a difference's 95% CI lies with respect to 0."""
    return "above 0" if d["ci95"][0] > 0 else "below 0" if d["ci95"][1] < 0 else "contains 0"


def _ci(r: Record, key: str = "ci95", n: str = "seeds") -> str:
    """``r[key]`` as ``[lo, hi]``; "no CI" where it is across fewer than two seeds (or games, ``n``):
    a zero-width interval would read as one that excludes everything."""
    if r.get(n, 2) < 2:
        return f"(one {n[:-1]}: no CI)"
    return f"[{r[key][0]:.3f}, {r[key][1]:.3f}]"


def _fewer(g: Record, row: Record) -> str:
    """``, 2 of 3 seeds`` where a by-game difference rests on fewer seeds than its row (a seed whose
    records lack the games' returns is left out of it), else nothing."""
    return f", {g['seeds']} of {row['seeds']} seeds" if g["seeds"] < row["seeds"] else ""


ITERATIVE = ("eto", "sppo", "sppo_dpo")


def iteration_rows(records: list[Record]) -> list[Record]:
    """Reward by iteration (0 = SFT) of each iterative method present (ETO, SPPO, self-play
    DPO) per split: mean and 95% CI over seeds."""
    present = [m for m in ITERATIVE if any(r["method"] == m for r in records)]
    groups: dict[tuple[str, int, str], list[float]] = {}
    for r in records:
        for m in present:
            if r["method"] == "sft":
                groups.setdefault((m, 0, r["split"]), []).append(r["avg_reward"])
            elif r["method"] == m:
                groups.setdefault((m, int(r["iteration"]), r["split"]), []).append(r["avg_reward"])
    out = []
    for (method, i, split), xs in sorted(groups.items(), key=lambda kv: (ITERATIVE.index(kv[0][0]), kv[0][1:])):
        mean, ci = mean_ci95(xs)
        out.append({"method": method, "iteration": i, "split": split, "avg_reward": mean, "ci95": list(ci),
                    "seeds": len(xs)})
    return out


#: what a reply without a valid action does, by ``pipeline.invalid_action`` (the report's header)
_INVALID_RULE = {"random": "gets a random valid action played for it", "error": "gets an error observation",
                 "end": "ends the episode"}


def report(cfg: CompareConfig, rows: list[Record], records: list[Record], plots: list[str] | None = None) -> str:
    """compare.md: the table, reward by iteration, the claims, and links to ``plots`` (PNG names)."""
    p = cfg.pipeline
    invalid = "a reply without a valid action " + _INVALID_RULE[p.invalid_action]
    if p.invalid_penalty:
        invalid += f", reward {p.invalid_penalty:+g}"
    bon = (f" (Best-of-{cfg.best_of_n}: the best of {cfg.best_of_n} samples a task)" if "best_of_n" in cfg.methods
           else "")
    demos = "" if p.data_seed is None else f" (one set of {p.expert_episodes} demos for every seed: data_seed {p.data_seed})"
    if cfg.sft_seed is not None:
        demos += f"; one SFT agent for every seed (trained with seed {cfg.sft_seed})"
    elif p.model is not None:
        demos += f"; every seed starts from `{p.model}`"
    decoding = "greedy" if p.eval_temperature == 0 else f"sampled (temperature {p.eval_temperature:g})"
    lines = [
        "# turnrl compare", "",
        f"Env `{p.env}` {json.dumps(p.env_opts)} ({invalid}), seeds {cfg.seeds}{demos}, {p.eval_episodes} {decoding} episodes per "
        f"split and seed{bon}. Avg reward and success: mean over "
        "seeds of each seed's mean, with a 95% CI across seeds (Student t). Minus SFT, paired: the mean over seeds of "
        "the row's avg reward minus that of the same seed's SFT agent (its start), with a 95% CI across seeds. By "
        "game: the same difference taken game by game (the same games for every row) and averaged over seeds, with a "
        "95% CI across games: how the gain varies with which games were drawn.", "",
        "| method | split | seeds | avg reward | 95% CI | minus SFT, paired [95% CI] | by game [95% CI] | success "
        "| 95% CI | invalid | loser turns |",
        "|---|---|---:|---:|---|---|---|---:|---|---:|---:|",
    ]
    for r in rows:
        lt = "" if r.get("loser_turns") is None else f"{r['loser_turns']:.2f}"
        d, g = r.get("vs_sft"), r.get("vs_sft_by_game")
        paired = "" if d is None else f"{d['mean']:+.3f} {_ci(d)}"
        paired += " | " + ("" if g is None else f"{g['mean']:+.3f} {_ci(g, n='games')}{_fewer(g, r)}")
        lines.append(f"| {r['method']} | {r['split']} | {r['seeds']} | {r['avg_reward']:.3f} | {_ci(r)} | {paired} | "
                     f"{r['success_rate']:.3f} | {_ci(r, 'success_ci95')} | "
                     f"{r['invalid_action_rate']:.3f} | {lt} |")
    it = iteration_rows(records)
    if it:
        lines += ["", "Reward by iteration (0 = SFT):", "", "| method | iteration | split | avg reward | 95% CI |",
                  "|---|---:|---|---:|---|"]
        lines += [f"| {r['method']} | {r['iteration']} | {r['split']} | {r['avg_reward']:.3f} | {_ci(r)} |" for r in it]
    v = verdicts(cfg, _with_dmpo_iteration(cfg, rows, records))
    if v:
        lines += ["", "Claims (seen split):", ""] + v
    for name in plots or []:
        lines += ["", f"![{Path(name).stem.replace('_', ' ')}]({name})"]
    return "\n".join([*lines, ""])


def _with_dmpo_iteration(cfg: CompareConfig, rows: list[Record], records: list[Record]) -> list[Record]:
    """Attach ETO's aggregate at iteration ``dmpo_iterations`` (for like-for-like comparisons with
    the DMPO runs)."""
    n = cfg.dmpo_iterations
    at_n = aggregate([{**r, "method": "eto"} for r in records if r["method"] == "eto" and r.get("iteration") == n])
    out = []
    for r in rows:
        if r["method"] == "eto":
            r = {**r, "_like_dmpo": next((f for f in at_n if f["split"] == r["split"]), None)}
        out.append(r)
    return out


# ----------------------------------------------------------------------------- plots


def plot_all(cfg: CompareConfig, records: list[Record], rows: list[Record], out: Path) -> list[str]:
    """The PNG plots in ``out``; a plot with nothing to show (e.g. the DMPO gamma plot of a run
    without DMPO) is not written, and a stale one from an earlier run of ``out`` is removed.
    Returns the names of the plots written."""
    from turnrl.report import _plt, atomic_savefig, plot_rewards

    main = [r for r in rows if not r["method"].startswith("dpo-") and "-k" not in r["method"]]
    plot_rewards(main, out / "reward_by_method.png", label="method",
                 title="avg reward by method (mean over seeds, 95% CI)")
    written = ["reward_by_method.png"]
    plt = _plt()

    def finish(fig: Any, ax: Any, path: Path, xlabel: str, title: str) -> None:
        if not ax.get_legend_handles_labels()[0]:  # nothing was drawn
            plt.close(fig)
            path.unlink(missing_ok=True)
            return
        ax.set_xlabel(xlabel)
        ax.set_ylabel("avg reward")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        atomic_savefig(fig, path, dpi=120)
        plt.close(fig)
        written.append(path.name)

    def bars(ax: Any, xs: list[float], pts: list[Record], **kw: Any) -> None:
        ax.errorbar(xs, [r["avg_reward"] for r in pts], capsize=3, marker="o", **kw,
                    yerr=[[r["avg_reward"] - r["ci95"][0] for r in pts], [r["ci95"][1] - r["avg_reward"] for r in pts]])

    it = iteration_rows(records)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for k, (method, split) in enumerate(dict.fromkeys((r["method"], r["split"]) for r in it)):
        pts = [r for r in it if (r["method"], r["split"]) == (method, split)]
        bars(ax, [r["iteration"] + 0.06 * k for r in pts], pts, label=f"{method} ({split})")
    ax.set_xticks(sorted({r["iteration"] for r in it}))  # whole iterations, no 0.5 ticks
    finish(fig, ax, out / "reward_by_iteration.png", "iteration (0 = SFT)", "reward by iteration")

    seen = {r["method"]: r for r in _with_dmpo_iteration(cfg, rows, records) if r["split"] == "seen"}

    def dpo_row(losers: str) -> Record | None:
        e = seen.get("eto")
        if e is not None and e.get("losers") == losers and cfg.dpo_from_eto:
            return _like_dmpo(e)  # ETO at the DMPO runs' iteration = the DPO run of as many
        return seen.get(f"dpo-{losers}")

    fig, ax = plt.subplots(figsize=(5, 3.5))
    gamma_pts = {losers: [seen[m] for g in sorted(cfg.dmpo_gammas) if (m := f"dmpo-g{g:g}-{losers}") in seen]
                 for losers in ("clean", "noisy")}
    if any(gamma_pts.values()):  # no DMPO row: no plot (not a lone DPO line)
        for k, (losers, pts) in enumerate(gamma_pts.items()):
            if not pts:  # a loser setting the DMPO study did not run: no DPO line for it either
                continue
            bars(ax, [float(r["gamma"]) for r in pts], pts, color=f"C{k}", label=f"DMPO, {losers}")
            dpo = dpo_row(losers)
            if dpo is not None:
                ax.axhline(dpo["avg_reward"], color=f"C{k}", ls="--", lw=1, label=f"DPO, {losers}")
    its = f"{cfg.dmpo_iterations} iteration{'s' if cfg.dmpo_iterations > 1 else ''}"
    finish(fig, ax, out / "dmpo_gamma.png", "gamma", f"DMPO reward vs gamma (seen, {its})")

    if "loser_length" not in cfg.methods:  # no study: ETO's and DMPO's rows alone would be lone points
        (out / "loser_length.png").unlink(missing_ok=True)  # nor a stale one of an earlier run
        return written
    fig, ax = plt.subplots(figsize=(5, 3.5))
    g = _loser_length_gamma(cfg)
    ks = [f"-k{k}" for k in cfg.truncate_ks]
    for k, (loss, full, prefix) in enumerate((("DPO", dpo_row("noisy"), "dpo-noisy"),
                                              (f"DMPO gamma={g:g}", seen.get(f"dmpo-g{g:g}-noisy"), f"dmpo-g{g:g}-noisy"))):
        pts = [r for r in [full, *(seen.get(prefix + s) for s in ks)] if r is not None and r.get("loser_turns")]
        pts.sort(key=lambda r: float(r["loser_turns"]))
        if pts:
            bars(ax, [float(r["loser_turns"]) for r in pts], pts, color=f"C{k}", label=loss)
    finish(fig, ax, out / "loser_length.png", "mean loser length in the pairs (agent turns)",
           "reward vs loser length (seen, noisy losers)")
    return written
