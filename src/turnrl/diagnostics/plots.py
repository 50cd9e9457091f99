"""PNG plots of the bandit diagnostics (matplotlib, Agg backend, small files)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from turnrl.report import _plt, atomic_savefig

DPI = 100
#: line styles cycled over policies (curves that coincide stay visible)
STYLES = ("-", "--", "-.", ":")


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=DPI)
    _plt().close(fig)
    return path


def _curves(records: Sequence[dict[str, Any]], key: str, path: Path, ylabel: str, title: str) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for i, rec in enumerate(records):
        c = rec[key]
        steps = list(range(1, len(c["mean"]) + 1))
        (line,) = ax.plot(steps, c["mean"], lw=1.5, ls=STYLES[i % len(STYLES)], label=rec["policy"])
        ax.fill_between(steps, c["lo"], c["hi"], color=line.get_color(), alpha=0.2, lw=0)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_regret(records: Sequence[dict[str, Any]], path: str | Path, *, title: str = "") -> Path:
    """Cumulative regret per step with 95% CI bands, one line per policy."""
    return _curves(records, "regret", Path(path), "cumulative regret (mean, 95% CI)",
                   f"cumulative regret: {title}" if title else "cumulative regret")


def plot_coverage(records: Sequence[dict[str, Any]], path: str | Path, *, title: str = "") -> Path:
    """Share of arms tried by step t, one line per policy."""
    return _curves(records, "coverage", Path(path), "share of arms tried",
                   f"action coverage: {title}" if title else "action coverage")


def plot_frequency_bias(fb: Mapping[str, dict[str, Any]], path: str | Path) -> Path:
    """Left: action entropy against repetitions of the last action. Right: frequent /
    greedy / other shares per repetition bucket, one group of bars per policy."""
    plt = _plt()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [1, 1.2]})
    uniform = None
    for i, (label, f) in enumerate(fb.items()):
        (line,) = ax.plot(f["repetitions"], f["entropy"], lw=1.5, ls=STYLES[i % len(STYLES)], marker=".",
                          label=label)
        ax.fill_between(f["repetitions"], f["entropy_lo"], f["entropy_hi"], color=line.get_color(), alpha=0.2, lw=0)
        uniform = f["uniform_entropy"]
    if uniform is not None:
        ax.axhline(uniform, color="gray", ls="--", lw=0.8, label="uniform")
    ax.set_xlabel("repetitions of the last action")
    ax.set_ylabel("action entropy (nats)")
    ax.set_title("frequency bias: entropy", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    colors = {"frequent": "#d62728", "greedy": "#1f77b4", "other": "#7f7f7f"}
    ticks: list[float] = []
    names: list[str] = []
    x = 0.0
    for label, f in fb.items():
        for bucket, sh in f["buckets"].items():
            bottom = 0.0
            for part in ("frequent", "greedy", "other"):
                bx.bar(x, sh[part], bottom=bottom, color=colors[part], width=0.8,
                       label=part if not ticks else None)
                bottom += sh[part]
            ticks.append(x)
            names.append(f"{label}\n{bucket}")
            x += 1
        x += 0.6
    bx.set_xticks(ticks)
    bx.set_xticklabels(names, fontsize=6, rotation=90)
    bx.set_ylabel("share of predictions")
    bx.set_ylim(0, 1)
    bx.set_title("frequent / greedy / other by repetitions", fontsize=10)
    bx.legend(fontsize=7, loc="upper right")
    return _save(fig, Path(path))


def plot_knowing_doing(kd: Mapping[str, dict[str, Any]], path: str | Path) -> Path:
    """One 2x3 table per policy (rationale correct / incorrect x optimal / greedy / other,
    % of all steps) as an annotated heat map."""
    plt = _plt()
    n = len(kd)
    cols = min(n, 3)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.4 * rows), squeeze=False)
    acts = ("optimal", "greedy", "other")
    for i, (label, rec) in enumerate(kd.items()):
        ax = axes[i // cols][i % cols]
        table = [[rec["table_pct"][r][a] for a in acts] for r in ("correct", "incorrect")]
        ax.imshow(table, cmap="Blues", vmin=0, vmax=100)
        for r in range(2):
            for c in range(3):
                ax.text(c, r, f"{table[r][c]:.1f}%", ha="center", va="center", fontsize=9,
                        color="white" if table[r][c] > 60 else "black")
        ax.set_xticks(range(3))
        ax.set_xticklabels(acts, fontsize=8)
        ax.set_yticks(range(2))
        ax.set_yticklabels(["rationale\ncorrect", "rationale\nincorrect"], fontsize=8)
        ax.set_title(label, fontsize=9)
    for j in range(n, rows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.suptitle("knowing-doing gap (% of all steps)", fontsize=10)
    return _save(fig, Path(path))


__all__ = ["plot_coverage", "plot_frequency_bias", "plot_knowing_doing", "plot_regret"]
