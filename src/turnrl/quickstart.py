"""``turnrl quickstart``: the main job on the embedded tiny model, minutes on a CPU.

Stages (each skipped when its output is complete, so a killed quickstart resumes):

1. build the tiny model (tokenizer trained on tic-tac-toe text, random weights) -> ``OUT/tiny``;
2. collect expert (minimax) demonstrations on tic-tac-toe's train split against the
   random opponent -> ``OUT/demos.jsonl``;
3. SFT the tiny model on them -> ``OUT/sft`` (checkpoints, ``metrics.jsonl``, ``model``);
4. one ETO iteration with the DMPO loss (:mod:`turnrl.pipelines.eto`): the SFT agent
   explores the demos' tasks greedily, its failures are paired with the expert's successes,
   DMPO trains from the SFT agent (also the reference) -> ``OUT/iter-1``;
5. evaluate the untrained model, the SFT agent, the DMPO agent, the expert and the random
   policy on the ``seen`` and ``unseen`` splits (greedy decoding) -> ``OUT/eval/*.jsonl``;
6. write ``OUT/summary.json`` (records as ``turnrl eval`` writes them), ``OUT/report.md``
   and the plots ``OUT/training_loss.png`` and ``OUT/rewards.png``; print the table.

The expert breaks ties between equally good moves in a fixed order (``expert_ties=ordered``),
so its move is a function of the board: the tiny model, trained from scratch, learns that
reliably in a few hundred steps (with random tie-breaking it often learns one cell only).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnrl.agent.prompting import PromptConfig
from turnrl.collect import _read_episodes, run_policy
from turnrl.errors import TurnRLError
from turnrl.evaluation import results_table, summarize
from turnrl.pipelines.iterative import check_settings
from turnrl.progress import progress_bar
from turnrl.report import markdown_table, plot_rewards, plot_training_loss
from turnrl.rollout import SamplingConfig, load_policy
from turnrl.rollout.policies import ExpertPolicy, Policy, RandomPolicy
from turnrl.stats import overlap
from turnrl.train.core import atomic_write_json, atomic_write_text

ENV = "tictactoe"
ENV_OPTS: dict[str, Any] = {"opponent": "random", "expert_ties": "ordered"}
#: The tiny model learns from scratch in minutes on a CPU: a short instruction and no
#: history (a tic-tac-toe observation holds the whole state) keep sequences short.
PROMPT = PromptConfig(
    instruction="Play tic-tac-toe. Cells are numbered 0-8; an empty cell shows its number. Answer as:\n"
    "Thought: <reason>\nAction: <cell>",
    history=0,
)


@dataclass(frozen=True)
class QuickstartPlan:
    demos: int
    epochs: float
    batch_size: int
    lr: float
    eval_episodes: int
    #: the DMPO step of the ETO iteration: the tiny model needs a larger lr than the paper's 1e-6;
    #: at 3e-5 (2 epochs) one of 5 seeds collapsed, at 1e-5 (4 epochs) none (docs/methods/compare.md)
    dmpo_lr: float = 1e-5
    dmpo_epochs: float = 4.0
    gamma: float = 0.9


FULL = QuickstartPlan(demos=600, epochs=3.0, batch_size=16, lr=2e-3, eval_episodes=200)
FAST = QuickstartPlan(demos=400, epochs=3.0, batch_size=16, lr=2e-3, eval_episodes=100)


def eto_config(plan: QuickstartPlan) -> Any:
    """The ETO pipeline's settings for the quickstart's one DMPO iteration."""
    from turnrl.pipelines.eto import EtoConfig
    from turnrl.train.preference import PreferenceConfig

    train = PreferenceConfig(loss="dmpo", lr=plan.dmpo_lr, beta=0.1, gamma=plan.gamma, epochs=plan.dmpo_epochs,
                             batch_size=8, lr_schedule="constant", warmup_ratio=0.05, row_tokens=1024,
                             max_length=1024, save_every=20)
    return EtoConfig(env=ENV, env_opts=ENV_OPTS, instruction=PROMPT.instruction, history=PROMPT.history,
                     expert_episodes=plan.demos, loss="dmpo", iterations=1, explore_temperature=0.0,
                     pairs="trajectory", losers="noisy", train=train, eval_splits=["seen", "unseen"],
                     eval_episodes=plan.eval_episodes, eval_seed=1, num_envs=64, max_new_tokens=48)


def _say(console: Any, text: str) -> None:
    if console is not None:
        console.print(text)


def run_quickstart(out: str | Path, *, fast: bool = False, resume: bool = True, console: Any = None,
                   plan: QuickstartPlan | None = None) -> dict[str, Any]:
    from turnrl.models.loading import model_ref
    from turnrl.models.tiny import build_tiny
    from turnrl.train.sft import SFTConfig, train_sft

    plan = plan or (FAST if fast else FULL)
    out = Path(out)
    if not resume and out.is_dir() and any(out.iterdir()):  # every stage below would reuse what is there
        raise TurnRLError(f"{out}: holds an earlier run, and resume is off (--no-resume): choose another --out or "
                          "remove it, or resume it")
    # --fast in a full run's out; turnrl eto's out (its finished stages were made with other settings)
    check_settings(out, {"env": ENV, "env_opts": ENV_OPTS, "plan": plan.__dict__}, command="quickstart", what="--out")
    t0 = time.time()

    tiny = out / "tiny"
    reused = (tiny / "config.json").is_file()  # a resumed run: its seconds count this invocation only
    if not reused:
        _say(console, "[bold]1/5[/bold] building the tiny model")
        build_tiny(tiny, env_names=(ENV,))  # a tic-tac-toe specialist: the whole vocabulary on its text

    demos = out / "demos.jsonl"
    have = len(_read_episodes(demos)) if demos.is_file() else 0  # as the resumed collection counts them
    _say(console, f"[bold]2/5[/bold] collecting {plan.demos} expert games ({ENV}, random opponent)"
         + (" (done)" if have >= plan.demos else f" ({have} done)" if have else ""))
    with progress_bar("expert demos", plan.demos) as advance:
        run_policy(ExpertPolicy(), ENV, split="train", episodes=plan.demos, env_opts=ENV_OPTS, out=demos,
                   num_envs=64, prompt=PROMPT, progress=advance)

    sft_dir = out / "sft"
    trained = (sft_dir / "summary.json").is_file()
    _say(console, f"[bold]3/5[/bold] SFT on the demos ({plan.epochs:g} epochs)" + (" (done)" if trained else ""))
    if not trained:
        cfg = SFTConfig(epochs=plan.epochs, batch_size=plan.batch_size, lr=plan.lr, row_tokens=1024,
                        history=PROMPT.history, warmup_ratio=0.03, save_every=50, seed=0)
        train_sft(model_ref(tiny), demos, sft_dir, cfg, resume=resume)

    _say(console, "[bold]4/5[/bold] one ETO iteration with DMPO (explore, pair with the expert, train)")
    from turnrl.pipelines.eto import run_iteration

    dmpo_model, dmpo_results, pair_stats = run_iteration(
        eto_config(plan), out, 1, str(sft_dir / "model"), demos, label="dmpo",
        log=lambda line: _say(console, f"      {line}"))

    _say(console, f"[bold]5/5[/bold] evaluating on seen and unseen ({plan.eval_episodes} games each)")
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=48)
    policies: list[tuple[str, Policy]] = [
        ("untrained", load_policy(model_ref(tiny), sampling=greedy, history=PROMPT.history)),
        ("sft", load_policy(str(sft_dir / "model"), sampling=greedy, history=PROMPT.history)),
        ("expert", ExpertPolicy()),
        ("random", RandomPolicy()),
    ]
    results = []
    for name, pol in policies:
        for split in ("seen", "unseen"):
            with progress_bar(f"eval {name}/{split}", plan.eval_episodes) as advance:
                trajs = run_policy(pol, ENV, split=split, episodes=plan.eval_episodes, env_opts=ENV_OPTS,
                                   num_envs=64, seed=1, prompt=PROMPT, out=out / "eval" / f"{name}-{split}.jsonl",
                                   progress=advance)
            results.append(summarize(trajs, policy=name, env=ENV, split=split))
        if name == "sft":  # the DMPO agent was evaluated on the same episodes by its ETO iteration
            results += [{k: v for k, v in r.items() if k != "game_returns"} for r in dmpo_results]  # as the others

    plot_training_loss(sft_dir / "metrics.jsonl", out / "training_loss.png", title="SFT loss (tiny model)")
    plot_rewards(results, out / "rewards.png", title=f"{ENV} vs random opponent: avg reward (95% CI)")
    summary = {"results": results, "env": ENV, "env_opts": ENV_OPTS, "plan": plan.__dict__,
               "pairs": pair_stats, "seconds": round(time.time() - t0, 1), "reused_earlier_stages": reused}
    atomic_write_text(out / "report.md", _report(results, plan))
    atomic_write_json(out / "summary.json", summary)
    if console is not None:
        console.print(results_table(results, title=f"quickstart: {ENV} vs random opponent"))
        console.print(f"summary: {out / 'summary.json'}   report: {out / 'report.md'}   "
                      f"plots: {out / 'training_loss.png'}, {out / 'rewards.png'}   ({summary['seconds']:.0f} s"
                      + ("; finished stages of an earlier run reused" if reused else "") + ")")
    return summary


def _report(results: list[dict[str, Any]], plan: QuickstartPlan) -> str:
    by = {(r["policy"], r["split"]): r for r in results}
    verdict = []
    for split in ("seen", "unseen"):
        s, r = by[("sft", split)], by[("random", split)]
        sep = "do not overlap" if not overlap(tuple(s["ci95"]), tuple(r["ci95"])) else "overlap"
        verdict.append(f"- {split}: SFT {s['avg_reward']:.3f} vs random {r['avg_reward']:.3f} (95% CIs {sep})")
        d = by.get(("dmpo", split))
        if d is not None:
            sep = "do not overlap" if not overlap(tuple(d["ci95"]), tuple(s["ci95"])) else "overlap"
            verdict.append(f"- {split}: DMPO (one ETO iteration) {d['avg_reward']:.3f} vs SFT {s['avg_reward']:.3f} "
                           f"(95% CIs {sep})")
    return (
        "# turnrl quickstart\n\n"
        f"Tiny model, SFT on {plan.demos} minimax games against the random opponent ({plan.epochs:g} epochs), "
        f"then one ETO iteration with the DMPO loss (gamma {plan.gamma:g}); "
        f"greedy evaluation on {plan.eval_episodes} games per split.\n\n"
        + markdown_table(results)
        + "\n"
        + "\n".join(verdict)
        + "\n\n![training loss](training_loss.png)\n\n![rewards](rewards.png)\n"
        + "\n" + json.dumps({"plan": plan.__dict__}) + "\n"
    )
