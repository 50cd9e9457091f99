"""ArCHer (with and without a KL tether to the start) vs filtered BC vs CHAI vs PPO, on
tic-tac-toe (random opponent) or twenty questions.

    python scripts/archer_study.py --out runs/archer_study --seeds 0 1 2 --jobs 1 --img docs/img/archer
    python scripts/archer_study.py --env twenty_questions --out runs/archer_20q --iterations 6 \
        --demos 300 --sft-epochs 12 --eval-episodes 24 --methods archer_kl filtered_bc chai ppo --jobs 2 \
        --img docs/img/archer_20q

1. the starting policy: the tiny model (its tokenizer trained on the env's text) SFT'd on
   few expert demos (``--demos`` train-split episodes; ``--sft-epochs`` epochs), so that
   there is room to improve; ArCHer's and CHAI's critic encoder starts from it;
2. each method and seed: ``turnrl train <method>`` from that policy with the same budget of
   iterations (16 episodes each, so about the same number of environment steps), evaluated
   before training and at the end on ``eval_episodes`` seen-split episodes (seed-dependent
   episodes and sampling, temperature 1 -- the policy being trained);
3. ``results.json``, ``results.md`` (the table) and the plots ``return_vs_steps.png`` and
   ``final_return.png`` (also copied to ``--img`` when given).

Every stage is skipped when its output is complete, so a killed study resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class EnvSetup:
    """One env's settings for every method: prompt, opponent, reply budget, the start's SFT."""

    name: str
    instruction: str
    env_opts: dict = field(default_factory=dict)
    #: earlier exchanges in the prompt (None: all of them)
    history: int | None = 0
    max_new_tokens: int = 32
    #: SFT rows of the start policy
    row_tokens: int = 1024
    #: the plot's title and y label
    title: str = ""
    ylabel: str = "return"
    #: the critic's overrides for this env (ArCHer and CHAI); they come after the method's own
    #: settings on the command line, so a key set in both (critic_steps) takes this value
    critic: tuple[str, ...] = ()

    def common(self) -> list[str]:
        """The online trainers' overrides (ArCHer, CHAI, filtered BC)."""
        return [f"prompt.history={_yaml(self.history)}", *(f"env_opts.{k}={v}" for k, v in self.env_opts.items()),
                "prompt.invalid_penalty=-1", f"prompt.instruction={json.dumps(self.instruction)}",
                "episodes_per_iteration=16", "num_envs=16", f"sampling.max_new_tokens={self.max_new_tokens}",
                "state_system=false"]

    def ppo(self) -> list[str]:
        """``turnrl train ppo`` (issue 8's RLFT trainer) with the same prompt, budget and penalty; its
        other settings are its defaults."""
        return [f"history={_yaml(self.history)}", "invalid_penalty=-1", f"instruction={json.dumps(self.instruction)}",
                "episodes_per_iter=16", "num_envs=16", f"max_new_tokens={self.max_new_tokens}"]

    def prompt(self):  # -> PromptConfig
        from turnrl.agent.prompting import PromptConfig

        return PromptConfig(instruction=self.instruction, history=self.history, invalid_penalty=-1)


def _yaml(value: object) -> str:
    return "null" if value is None else str(value)


ENVS = {
    #: the opponent plays random legal moves; the expert (demos only) breaks ties centre > corners > edges
    "tictactoe": EnvSetup(
        "tictactoe", "Play tic-tac-toe. Cells are numbered 0-8; an empty cell shows its number. Answer as:\n"
        "Thought: <reason>\nAction: <cell>", {"opponent": "random", "expert_ties": "ordered"},
        title="tic-tac-toe vs random", ylabel="return (win 1, loss -1, invalid move -1)"),
    #: the whole game so far in the prompt (the answers are the state); a short instruction
    #: in place of the env's (which lists the 72 candidates and the questions); 10 critic steps an
    #: iteration, not 20, for CPU time (sampling the V targets' actions is the largest part of an iteration here)
    "twenty_questions": EnvSetup(
        "twenty_questions", "Play twenty questions: find the object by asking yes/no questions, then guess it "
        "(Is it a <object>?). Answer as:\nThought: <reason>\nAction: <question>", history=None,
        max_new_tokens=48, row_tokens=2048, title="twenty questions", critic=("critic.max_state_tokens=512", "critic_steps=10"),
        ylabel="return (-1 a turn, -1 more if invalid; 20 turns)"),
}
#: the critic (ArCHer and CHAI): its encoder is the starting policy's transformer (``critic.encoder``
#: is set to the starting model per run), read at the last token of ``state + action``
CRITIC = ["critic.joint=true", "critic.pooling=last", "critic_steps=20", "critic.batch_size=16", "warmup_iterations=2"]
METHODS = {
    "archer": [*CRITIC, "advantage_norm=whiten", "actor.lr=2e-4", "actor_steps=3", "actor.batch_size=32"],
    "filtered_bc": ["bc_steps=3", "actor.batch_size=32", "actor.lr=2e-4"],
    "chai": [*CRITIC],
}
#: ArCHer with a KL penalty to the starting policy on the actor's sampled tokens (``actor_kl``)
METHODS["archer_kl"] = [*METHODS["archer"], "actor_kl=0.2"]
#: the ``turnrl train`` command of each method
COMMAND = {"archer": "archer", "archer_kl": "archer", "filtered_bc": "filtered-bc", "chai": "chai"}
#: every trainer runs single-threaded (``--jobs`` of them side by side)
CHILD_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TURNRL_PROGRESS": "0"}


def eval_model(setup: EnvSetup, model: Path, seed: int, episodes: int) -> dict:
    """The online runs' evaluation (OnlineRun.evaluate) of a saved model: the same planned
    seen-split episodes, sampling seed and settings."""
    import numpy as np
    import torch

    from turnrl.collect import run_policy
    from turnrl.devices import forked_rng
    from turnrl.rollout import SamplingConfig, load_policy

    torch.set_num_threads(1)
    eval_seed = 1000 + seed
    pol = load_policy(str(model), sampling=SamplingConfig(temperature=1.0, max_new_tokens=setup.max_new_tokens),
                      history=setup.history)
    with forked_rng(eval_seed):
        trajs = run_policy(pol, setup.name, split="seen", episodes=episodes, env_opts=setup.env_opts,
                           num_envs=32, seed=eval_seed, prompt=setup.prompt())
    return {"return": float(np.mean([t.return_ for t in trajs])),
            "env_steps_per_episode": float(np.mean([t.num_turns for t in trajs]))}


def run_ppo(setup: EnvSetup, seed: int, model: Path, out: Path, iterations: int, eval_episodes: int) -> Path:
    run = out / f"ppo-s{seed}"
    if not (run / "summary.json").is_file():
        cmd = [sys.executable, "-m", "turnrl", "train", "ppo", "--model", str(model), "--env", setup.name,
               "--out", str(run), *(f"--env-opt={k}={v}" for k, v in setup.env_opts.items()), *setup.ppo(),
               f"seed={seed}", f"iterations={iterations}"]
        if (run / "checkpoints").is_dir():
            cmd.append("--resume")
        run_child(cmd, out / f"ppo-s{seed}.log")
    if not (run / "study_eval.json").is_file():
        res = {"start": eval_model(setup, model, seed, eval_episodes),
               "final": eval_model(setup, run / "model", seed, eval_episodes)}
        (run / "study_eval.json").write_text(json.dumps(res, indent=2) + "\n")
    return run


def start_policy(setup: EnvSetup, out: Path, demos: int, epochs: float) -> Path:
    import torch

    from turnrl.collect import run_policy
    from turnrl.models.loading import model_ref
    from turnrl.models.tiny import build_tiny
    from turnrl.rollout.policies import ExpertPolicy
    from turnrl.train.sft import SFTConfig, train_sft

    torch.set_num_threads(1)
    model = out / "start" / "model"
    if (out / "start" / "summary.json").is_file():
        return model
    tiny = out / "tiny"
    if not (tiny / "config.json").is_file():
        build_tiny(tiny, env_names=(setup.name,))
    data = out / "demos.jsonl"
    run_policy(ExpertPolicy(), setup.name, split="train", episodes=demos, env_opts=setup.env_opts, out=data,
               num_envs=64, prompt=setup.prompt())
    cfg = SFTConfig(epochs=epochs, batch_size=16, lr=2e-3, row_tokens=setup.row_tokens, history=setup.history,
                    warmup_ratio=0.03, seed=0)
    train_sft(model_ref(tiny), data, out / "start", cfg, resume=True)
    return model


def run_one(setup: EnvSetup, method: str, seed: int, model: Path, out: Path, iterations: int,
            eval_episodes: int) -> Path:
    if method == "ppo":
        return run_ppo(setup, seed, model, out, iterations, eval_episodes)
    run = out / f"{method}-s{seed}"
    if (run / "summary.json").is_file() and json.loads((run / "summary.json").read_text()).get("eval"):
        return run
    cmd = [sys.executable, "-m", "turnrl", "train", COMMAND[method], "--model", str(model),
           "--env", setup.name, "--out", str(run), *setup.common(), *METHODS[method], f"seed={seed}",
           f"iterations={iterations}", f"eval_every={iterations}", f"eval_episodes={eval_episodes}",
           f"eval_seed={1000 + seed}"]
    if method in ("archer", "archer_kl", "chai"):
        cmd += [f"critic.encoder={model}", *setup.critic]
    if (run / "checkpoints").is_dir():
        cmd.append("--resume")
    run_child(cmd, out / f"{method}-s{seed}.log")
    return run


def run_child(cmd: list[str], log_path: Path) -> None:
    """Run a ``turnrl train`` command with its output in ``log_path``; a failure is one line with the
    command's own last line (its one-line error), not a traceback of this script."""
    with open(log_path, "w") as log:
        code = subprocess.run(cmd, env=CHILD_ENV, stdout=log, stderr=subprocess.STDOUT).returncode
    if code != 0:
        lines = [x for x in log_path.read_text(errors="replace").splitlines() if x.strip()]
        raise SystemExit(f"error: turnrl {' '.join(cmd[3:5])} failed (exit {code}): "
                         f"{lines[-1] if lines else 'no output'} (log: {log_path})")


def rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def training_curve(run: Path, ppo: bool) -> list[dict]:
    """Per iteration: ``env_steps`` so far, ``train/return`` and ``train/invalid`` of its episodes.

    The online trainers log these; a PPO run logs ``rollout/return`` (the env's return, without
    the invalid-reply penalty it trains with), ``rollout/turns`` and ``rollout/invalid`` (per
    turn), so its return is put on the study's scale (-1 an invalid reply) here."""
    if not ppo:
        return [r for r in rows(run) if "train/return" in r]
    rc = json.loads((run / "summary.json").read_text()).get("run_config") or {}
    episodes = int((rc.get("ppo") or {}).get("episodes_per_iter", 16))
    out, steps = [], 0.0
    for r in rows(run):
        if "rollout/return" in r:
            steps += episodes * r["rollout/turns"]
            out.append({"env_steps": steps, "train/invalid": r["rollout/invalid"],
                        "train/return": r["rollout/return"] - r["rollout/invalid"] * r["rollout/turns"]})
    return out


def start_final(run: Path, ppo: bool) -> tuple[float, float]:
    """Evaluation return before and after training (a PPO run: the study's own evaluation)."""
    if ppo:
        ev = json.loads((run / "study_eval.json").read_text())
        return ev["start"]["return"], ev["final"]["return"]
    d = rows(run)
    return d[0]["eval/return"], d[-1]["eval/return"]


def report(setup: EnvSetup, out: Path, methods: list[str], seeds: list[int], img: Path | None) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from turnrl.stats import mean_ci95

    res: dict = {"methods": {}}
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for method in methods:
        ppo = method == "ppo"
        runs = [out / f"{method}-s{s}" for s in seeds
                if (out / f"{method}-s{s}" / ("study_eval.json" if ppo else "summary.json")).is_file()]
        if not runs:
            continue
        start, final = (list(x) for x in zip(*(start_final(r, ppo) for r in runs), strict=True))
        curves = [training_curve(r, ppo) for r in runs]
        steps = [c[-1]["env_steps"] for c in curves]
        m0, ci0 = mean_ci95(start)
        m1, ci1 = mean_ci95(final)
        res["methods"][method] = {
            "seeds": len(runs), "env_steps": float(np.mean(steps)), "start": m0, "start_ci": ci0, "final": m1,
            "final_ci": ci1, "start_per_seed": start, "final_per_seed": final,
            # one seed gives no interval: no verdict (two points "apart" would read as a shown claim)
            "improved_nonoverlapping": bool(ci1[0] > ci0[1]) if len(runs) > 1 else None,
            "train_invalid_first": float(np.mean([c[0]["train/invalid"] for c in curves])),
            "train_invalid_last": float(np.mean([c[-1]["train/invalid"] for c in curves])),
        }
        # training return against environment steps (mean over seeds, iteration by iteration)
        n = min(len(c) for c in curves)
        xs = np.mean([[r["env_steps"] for r in c[:n]] for c in curves], axis=0)
        ys = np.array([[r["train/return"] for r in c[:n]] for c in curves])
        k = min(3, n)  # fewer points than the window: numpy would swap the arrays and return more points
        smooth = np.array([np.convolve(y, np.ones(k) / k, mode="valid") for y in ys])
        mu = smooth.mean(axis=0)
        line, = ax.plot(xs[k - 1:], mu, label=method)
        if len(runs) > 1:
            sd = smooth.std(axis=0, ddof=1) / np.sqrt(len(runs))
            ax.fill_between(xs[k - 1:], mu - sd, mu + sd, alpha=0.2, color=line.get_color())
        ax.errorbar([0, float(np.mean(steps))], [m0, m1], yerr=[[m0 - ci0[0], m1 - ci1[0]], [ci0[1] - m0, ci1[1] - m1]],
                    fmt="o", color=line.get_color(), capsize=3)
    # runs that have not finished (killed, or still running): their training return so far
    unfinished = []
    for method in methods:
        for sd in seeds:
            run = out / f"{method}-s{sd}"
            if method == "ppo" or (run / "summary.json").is_file() or not (run / "metrics.jsonl").is_file():
                continue
            every = rows(run)
            d = [r for r in every if "train/return" in r]
            if d:
                unfinished.append({"method": method, "seed": sd, "iterations": d[-1]["iteration"],
                                   "env_steps": d[-1]["env_steps"], "start": every[0].get("eval/return"),
                                   "train_return": [r["train/return"] for r in d],
                                   "train_invalid": [r["train/invalid"] for r in d]})
                ln, = ax.plot([r["env_steps"] for r in d], [r["train/return"] for r in d], "--", alpha=0.7,
                              label=f"{method} seed {sd} (unfinished, per iteration)")
                if unfinished[-1]["start"] is not None:
                    ax.plot([0], [unfinished[-1]["start"]], "x", color=ln.get_color(), label="its start eval return")
    res["unfinished"] = unfinished
    ax.set_xlabel("environment steps (agent turns)")
    ax.set_ylabel(setup.ylabel)
    ax.set_title(f"{setup.title}: training return (lines, 3-iter mean)\nand eval return ± 95% CI (points)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "return_vs_steps.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = list(res["methods"])
    for i, m in enumerate(names):
        r = res["methods"][m]
        for j, (key, label) in enumerate((("start", "start"), ("final", "final"))):
            mu, ci = r[key], r[f"{key}_ci"]
            ax.bar(i * 3 + j, mu, yerr=[[mu - ci[0]], [ci[1] - mu]], capsize=4, color="C0" if j == 0 else "C1",
                   label=label if i == 0 else None)
    ax.set_xticks([i * 3 + 0.5 for i in range(len(names))], names)
    ax.set_ylabel("eval return (95% CI over seeds)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "final_return.png", dpi=120)
    plt.close(fig)

    lines = ["| method | seeds | env steps | start return [95% CI] | final return [95% CI] | final > start, CIs apart |"
             " train invalid rate first → last iteration |", "|---|---|---|---|---|---|---|"]
    for m, r in res["methods"].items():
        one = r["seeds"] < 2
        cis = ["(one seed: no CI)" if one else f"[{c[0]:.3f}, {c[1]:.3f}]" for c in (r["start_ci"], r["final_ci"])]
        verdict = "n/a (one seed)" if r["improved_nonoverlapping"] is None else \
            "yes" if r["improved_nonoverlapping"] else "no"
        lines.append(f"| {m} | {r['seeds']} | {r['env_steps']:.0f} | {r['start']:.3f} {cis[0]} | {r['final']:.3f} "
                     f"{cis[1]} | {verdict} | {r['train_invalid_first']:.2f} → "
                     f"{r['train_invalid_last']:.2f} |")
    for u in unfinished:
        lines.append(f"\nunfinished: {u['method']} seed {u['seed']}, {u['iterations']} iterations "
                     f"({u['env_steps']} env steps), start eval return {u['start']}, training return per iteration "
                     f"{', '.join(f'{x:.2f}' for x in u['train_return'])}, invalid rate "
                     f"{', '.join(f'{x:.2f}' for x in u['train_invalid'])}")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    (out / "results.json").write_text(json.dumps(res, indent=2) + "\n")
    print("\n".join(lines))
    if img is not None:
        img.mkdir(parents=True, exist_ok=True)
        for f in ("return_vs_steps.png", "final_return.png"):
            shutil.copy(out / f, img / f)
    return res


STUDY_FILE = "study.json"


def check_study(out: Path, settings: dict) -> None:
    """Refuse, in one line, to go on in ``out`` with other settings than it was made with: a finished
    run is reused as it is, so a later ``--iterations 40`` would tabulate an 8-iteration run as 40.
    ``--seeds`` and ``--methods`` may change (more runs in one study). The first run records them."""
    path = out / STUDY_FILE
    if not path.is_file() and any(out.glob("*-s*/summary.json")):
        raise SystemExit(f"error: {out} holds finished runs but no {STUDY_FILE} (made before 30 Nov 2026), so its "
                         f"settings cannot be checked: write {path} with the settings it was made with, e.g. "
                         f"{json.dumps(settings)}, or use another --out")
    if path.is_file():
        made = json.loads(path.read_text())
        changed = [f"--{k.replace('_', '-')} {made[k]}, now {v}" for k, v in settings.items()
                   if k in made and made[k] != v]
        if changed:
            raise SystemExit(f"error: {out} was made with other settings ({'; '.join(changed)}): its finished runs "
                             "would be read as this study's; use another --out")
        return
    path.write_text(json.dumps(settings, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", choices=sorted(ENVS), default="tictactoe")
    ap.add_argument("--out", type=Path, default=Path("runs/archer_study"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--methods", nargs="+", choices=[*METHODS, "ppo"],
                    default=["archer", "archer_kl", "filtered_bc", "chai", "ppo"])
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument("--eval-episodes", type=int, default=100)
    ap.add_argument("--demos", type=int, default=100)
    ap.add_argument("--sft-epochs", type=float, default=3.0)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--img", type=Path, default=None, help="Also copy the plots here (docs/img/archer).")
    ap.add_argument("--report-only", action="store_true", help="Only tabulate and plot the finished runs.")
    args = ap.parse_args()
    warmup = int(next(x.split("=")[1] for x in CRITIC if x.startswith("warmup_iterations=")))
    if not args.report_only and args.iterations <= warmup and {"archer", "archer_kl"} & set(args.methods):
        raise SystemExit(f"error: --iterations {args.iterations}: ArCHer's actor trains after {warmup} warm-up "
                         f"iterations, so it would never be updated; give more than {warmup}")
    args.out.mkdir(parents=True, exist_ok=True)
    setup = ENVS[args.env]
    if args.report_only:
        report(setup, args.out, args.methods, args.seeds, args.img)
        return
    check_study(args.out, {"env": args.env, "iterations": args.iterations, "eval_episodes": args.eval_episodes,
                           "demos": args.demos, "sft_epochs": args.sft_epochs})
    model = start_policy(setup, args.out, args.demos, args.sft_epochs)
    jobs = [(m, s) for m in args.methods for s in args.seeds]
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(lambda ms: run_one(setup, ms[0], ms[1], model, args.out, args.iterations, args.eval_episodes),
                      jobs))
    report(setup, args.out, args.methods, args.seeds, args.img)


if __name__ == "__main__":
    main()
