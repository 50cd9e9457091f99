"""Reports: Markdown tables and PNG plots of result records and training curves."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def atomic_savefig(fig: Any, path: str | Path, **kwargs: Any) -> None:
    """``fig.savefig(path, **kwargs)`` atomically: the image is written under a temporary name
    with ``path``'s suffix (matplotlib reads the format from it), then renamed into place, so a
    reader never sees half a PNG."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}{path.suffix}")
    fig.savefig(tmp, **kwargs)
    os.replace(tmp, path)


def markdown_table(results: Sequence[dict[str, Any]], *, label: str = "policy") -> str:
    """A Markdown table of result records (avg reward with its 95% CI, success, turns, invalid)."""
    lines = [
        f"| {label} | split | episodes | avg reward | 95% CI | success | avg turns | invalid actions |",
        "|---|---|---:|---:|---|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.get(label, r.get('policy'))} | {r['split']} | {r['episodes']} | {r['avg_reward']:.3f} | "
            f"[{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}] | {r['success_rate']:.2f} | {r['avg_turns']:.2f} | "
            f"{r['invalid_action_rate']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def plot_training_loss(metrics_path: str | Path, out_png: str | Path, title: str = "training loss") -> Path:
    """Loss against optimizer step from a ``metrics.jsonl``."""
    plt = _plt()
    steps, losses = [], []
    with open(metrics_path) as f:
        for line in f:
            rec = json.loads(line)
            if "loss" in rec:
                steps.append(rec["step"])
                losses.append(rec["loss"])
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, losses, lw=1.2)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    atomic_savefig(fig, out_png, dpi=120)
    plt.close(fig)
    return Path(out_png)


def plot_rewards(results: Sequence[dict[str, Any]], out_png: str | Path, *, label: str = "policy",
                 title: str = "average reward (95% CI)") -> Path:
    """Grouped bars of avg reward per label and split, with 95% CI error bars."""
    plt = _plt()
    labels = list(dict.fromkeys(str(r.get(label, r.get("policy"))) for r in results))
    splits = list(dict.fromkeys(r["split"] for r in results))
    width = 0.8 / max(1, len(splits))
    fig, ax = plt.subplots(figsize=(1.4 + 1.3 * len(labels), 3.8))
    for k, split in enumerate(splits):
        xs: list[float] = []
        ys: list[float] = []
        errs: list[list[float]] = [[], []]
        for i, name in enumerate(labels):
            for r in results:
                if str(r.get(label, r.get("policy"))) == name and r["split"] == split:
                    xs.append(i + (k - (len(splits) - 1) / 2) * width)
                    ys.append(r["avg_reward"])
                    errs[0].append(r["avg_reward"] - r["ci95"][0])
                    errs[1].append(r["ci95"][1] - r["avg_reward"])
        ax.bar(xs, ys, width=width, yerr=errs, capsize=3, label=split)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=15)
    ax.axhline(0, color="black", lw=0.6)
    ax.set_ylabel("avg reward")
    ax.set_title(title)
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    atomic_savefig(fig, out_png, dpi=120)
    plt.close(fig)
    return Path(out_png)
