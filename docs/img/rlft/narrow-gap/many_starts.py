"""The narrow-gap design across new starts (issue 8; MANY-STARTS.txt beside this script): the test and its report.

    python docs/img/rlft/narrow-gap/many_starts.py STUDY_ROOT DOCS_DIR [ppo_seed=S] [row=bonus|plain] [against=ROOT]

Reads every ``STUDY_ROOT/start-S/`` that ``run.py all ... start=S`` wrote: ``start.json`` (the gate) and, for a
start that passed it and finished, ``narrow-gap.json`` (the start and its RLFT + bonus model on the 500
instances). Prints and writes ``DOCS_DIR/many-starts.md`` (a row a start and the two pre-registered tests, S1
and S2), ``DOCS_DIR/many-starts.json`` and ``DOCS_DIR/many-starts.png``, and copies each start's ``start.json``
and evaluations to ``DOCS_DIR/start-S/``. ``ppo_seed=S`` reads each start's RLFT + bonus run of PPO seed S instead
of 0 (MANY-STARTS-SEED1.txt) into ``many-starts-seedS.*``; ``row=plain`` reads each start's RLFT run (without
the bonus; ``run.py rl ... rows=plain`` wrote it to ``narrow-gap-plain.json``, MANY-STARTS-PLAIN.txt) into
``many-starts-plain.*``. A start without the run read counts as not finished. ``against=ROOT`` adds, per start,
the run minus the same run under ``ROOT/start-S/`` (instance by instance, 95% CI over the 500 instances) and
their mean across starts: the group-baseline runs (GROUP-BASELINE.txt) against the batch-baseline ones.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from turnrl.errors import TurnRLError, run_script
from turnrl.stats import mean_ci95

# a row: its run's name for the PPO seed in braces (the test: 0), the summary that run.py wrote, its label
ROWS = {"bonus": ("rlft-bonus-s{}", "narrow-gap.json", "RLFT + bonus"),
        "plain": ("rlft-s{}", "narrow-gap-plain.json", "RLFT")}
MIN_STARTS = 4  # fewer starts reaching the test: it is not run (MANY-STARTS.txt)


def read_start(folder: Path, model: str, summary_name: str = "narrow-gap.json") -> dict[str, Any]:
    """One start: its gate and, when it reached the test, the start's and ``model``'s readings on the 500
    instances (from ``summary_name``)."""
    gate = json.loads((folder / "start.json").read_text())
    row: dict[str, Any] = {"start_seed": gate.get("start_seed", 0), "gate": gate["gate"],
                           "gate_coverage": gate["coverage"], "gate_low_acted_on": gate["moves_on_low"]}
    summary = folder / summary_name
    s = json.loads(summary.read_text()) if summary.is_file() else {}
    if model not in s:
        row["status"] = "failed the gate" if not gate["gate"] else "not finished by the cut-off"
        return row
    start = json.loads((folder / "eval-500" / "sft-greedy.json").read_text())
    d, lo, hi = s[model]["minus_start"]
    rollouts = [json.loads(line) for line in (folder / model / "metrics.jsonl").read_text().splitlines()]
    rollouts = [m for m in rollouts if "rollout/coverage" in m]
    row["rollout_coverage"] = [float(np.mean([m["rollout/coverage"] for m in part]))
                               for part in (rollouts[:5], rollouts[-5:])]
    row["rollout_invalid_max"] = max(m["rollout/invalid"] for m in rollouts)
    row.update(status="tested", start_regret=s["sft-greedy"]["regret"], start_coverage=s["sft-greedy"]["coverage"],
               start_low_acted_on=start.get("moves_on_low") or 0.0, regret=s[model]["regret"],
               coverage=s[model]["coverage"], low_acted_on=s[model]["moves_on_low"] or 0.0, minus_start=[d, lo, hi])
    return row


def against(rows: list[dict[str, Any]], root: Path, other: Path, model: str) -> list[float] | None:
    """Each tested start's ``model`` minus the same model under ``other`` (regret@50 by instance; the
    difference and its 95% CI over instances go into the row as ``minus_other``), and the mean difference
    across the starts with a run in both, with its 95% CI (None when there is none)."""
    diffs = []
    for r in rows:
        theirs = other / f"start-{r['start_seed']}" / "eval-500" / f"{model}.json"
        if r["status"] != "tested" or not theirs.is_file():
            continue
        mine = root / f"start-{r['start_seed']}" / "eval-500" / f"{model}.json"
        d = (np.asarray(json.loads(mine.read_text())["final_regret"])
             - np.asarray(json.loads(theirs.read_text())["final_regret"]))
        mean, (lo, hi) = mean_ci95([float(x) for x in d])
        r["minus_other"] = [mean, lo, hi]
        diffs.append(mean)
    return ci(diffs) if diffs else None


def ci(values: list[float]) -> list[float]:
    mean, (lo, hi) = mean_ci95(values)
    return [mean, lo, hi]


def assess(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """S1: the per-start differences' CI entirely below 0; S2: the RLFT rows' regret CI entirely below the
    starts' (both Student t across the starts that reached the test)."""
    tested = [r for r in rows if r["status"] == "tested"]
    out: dict[str, Any] = {"starts_tested": len(tested), "starts_drawn": len(rows),
                           "gate_passed": sum(r["gate"] for r in rows)}
    if len(tested) < MIN_STARTS:
        out["verdict"] = f"not run: {len(tested)} starts reached the test, {MIN_STARTS} are needed"
        return out
    out["difference"] = ci([r["minus_start"][0] for r in tested])
    out["start_regret"] = ci([r["start_regret"] for r in tested])
    out["bonus_regret"] = ci([r["regret"] for r in tested])
    out["start_coverage"] = ci([r["start_coverage"] for r in tested])
    out["bonus_coverage"] = ci([r["coverage"] for r in tested])
    out["S1"] = out["difference"][2] < 0
    out["S2"] = out["bonus_regret"][2] < out["start_regret"][1]
    out["below_start"] = sum(r["minus_start"][2] < 0 for r in tested)
    out["verdict"] = "shown for the design" if out["S1"] and out["S2"] else "not shown"
    return out


def table(rows: list[dict[str, Any]], result: dict[str, Any], label: str = "RLFT + bonus") -> str:
    f = "{:.2f}".format
    lines = ["| start seed | gate: coverage@50, `Low.` acted on (50 instances) | start: regret@50, coverage@50 | "
             f"{label}: regret@50, coverage@50, `Low.` acted on | minus the start [95% CI over instances] | "
             "rollout coverage (T = 1), first → last 5 iterations |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        gate = f"{f(r['gate_coverage'])}, {r['gate_low_acted_on']:.0%} ({'passed' if r['gate'] else 'failed'})"
        if r["status"] != "tested":
            lines.append(f"| {r['start_seed']} | {gate} | {r['status']} | | | |")
            continue
        d, lo, hi = r["minus_start"]
        lines.append(f"| {r['start_seed']} | {gate} | {f(r['start_regret'])}, {f(r['start_coverage'])} | "
                     f"{f(r['regret'])}, {f(r['coverage'])}, {r['low_acted_on']:.0%} | "
                     f"{d:+.2f} [{lo:+.2f}, {hi:+.2f}] | {f(r['rollout_coverage'][0])} → "
                     f"{f(r['rollout_coverage'][1])} |")
    lines.append("")
    lines.append(f"Starts drawn {result['starts_drawn']}, passed the gate {result['gate_passed']}, "
                 f"reached the test {result['starts_tested']}.")
    if "difference" in result:
        def span(key: str) -> str:
            m, lo, hi = result[key]
            return f"{m:.2f} [{lo:.2f}, {hi:.2f}]"
        d, lo, hi = result["difference"]
        lines += ["",
                  f"- (S1) {label} minus its start, across starts: {d:+.2f} [{lo:+.2f}, {hi:+.2f}]: "
                  f"{'holds' if result['S1'] else 'fails'}.",
                  f"- (S2) regret@50 across starts: {label} {span('bonus_regret')} against the starts' "
                  f"{span('start_regret')}: {'holds' if result['S2'] else 'fails'}.",
                  f"- Coverage@50 across starts: {label} {span('bonus_coverage')} against the starts' "
                  f"{span('start_coverage')}.",
                  *([f"- Minus the same run under `{result['other']}`, across starts: "
                     f"{result['minus_other'][0]:+.2f} [{result['minus_other'][1]:+.2f}, "
                     f"{result['minus_other'][2]:+.2f}]; per start (95% CI over instances): "
                     + ", ".join(f"{r['start_seed']}: {r['minus_other'][0]:+.2f} [{r['minus_other'][1]:+.2f}, "
                                 f"{r['minus_other'][2]:+.2f}]" for r in rows if "minus_other" in r) + "."]
                    if result.get("minus_other") else []),
                  f"- Starts whose {label} model is below them with a per-instance CI below 0: "
                  f"{result['below_start']} of {result['starts_tested']}."]
    lines += ["", f"Verdict: {result['verdict']}."]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path, ppo_seed: int, label: str = "RLFT + bonus") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tested = [r for r in rows if r["status"] == "tested"]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    x = [r["start_seed"] for r in tested]
    ax.scatter(x, [r["start_regret"] for r in tested], marker="s", color="grey", label="the start (greedy-like SFT)")
    ax.errorbar(x, [r["regret"] for r in tested],
                yerr=[[-r["minus_start"][1] + r["minus_start"][0] for r in tested],
                      [r["minus_start"][2] - r["minus_start"][0] for r in tested]],
                fmt="o", color="tab:blue", capsize=3, label=f"{label} (95% CI of the difference)")
    ax.set_xticks(x)
    ax.set_xlabel("start seed")
    ax.set_ylabel("regret@50 (500 instances)")
    ax.set_title(f"Narrow-gap design: one {label} run per start (PPO seed {ppo_seed})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(args: list[str]) -> None:
    if len(args) < 2 or any("=" in a for a in args[:2]) or len(args) > 5:
        raise ValueError("missing, extra or unknown arguments")
    root, docs = Path(args[0]), Path(args[1])
    options = dict(a.partition("=")[::2] for a in args[2:])
    if len(options) < len(args) - 2 or set(options) - {"ppo_seed", "row", "against"}:
        raise ValueError(f"unknown or repeated option in {' '.join(args[2:])}")
    if not options.get("ppo_seed", "0").isdigit() or options.get("row", "bonus") not in ROWS:
        raise ValueError(f"ppo_seed is a number and row is one of {', '.join(ROWS)}, not {' '.join(args[2:])}")
    ppo_seed, row = int(options.get("ppo_seed", "0")), options.get("row", "bonus")
    pattern, summary_name, label = ROWS[row]
    model = pattern.format(ppo_seed)
    name = "many-starts" + ("-plain" if row == "plain" else "") + (f"-seed{ppo_seed}" if ppo_seed else "")
    folders = sorted((p for p in root.glob("start-*") if (p / "start.json").is_file()),
                     key=lambda p: int(p.name.split("-", 1)[1]))
    if not folders:
        raise TurnRLError(f"{root}: no start-S/start.json (run run.py all ... start=S first)")
    rows = [read_start(p, model, summary_name) for p in folders]
    result = assess(rows)
    if "against" in options and "difference" in result:
        result["other"] = options["against"]
        result["minus_other"] = against(rows, root, Path(options["against"]), model)
    docs.mkdir(parents=True, exist_ok=True)
    text = table(rows, result, label)
    (docs / f"{name}.md").write_text(text)
    (docs / f"{name}.json").write_text(json.dumps({"row": label, "ppo_seed": ppo_seed, "starts": rows,
                                                   "test": result}, indent=1) + "\n")
    if result["starts_tested"]:
        plot(rows, docs / f"{name}.png", ppo_seed, label)
    for p, r in zip(folders, rows, strict=True):
        target = docs / p.name
        target.mkdir(exist_ok=True)
        shutil.copyfile(p / "start.json", target / "start.json")
        if r["status"] == "tested":
            for m in ("sft-greedy", model):
                shutil.copyfile(p / "eval-500" / f"{m}.json", target / f"eval-500-{m}.json")
            shutil.copyfile(p / model / "metrics.jsonl", target / f"{model}-metrics.jsonl")
    print(text, end="")


if __name__ == "__main__":
    run_script(main, "many_starts.py STUDY_ROOT DOCS_DIR [ppo_seed=S] [row=bonus|plain] [against=ROOT]")
