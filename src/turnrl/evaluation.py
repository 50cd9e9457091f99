"""Evaluation: play episodes of a policy on a split and summarize them.

A result record (one per policy × env × split) is::

    {"policy", "env", "split", "episodes", "avg_reward", "success_rate", "avg_turns",
     "invalid_action_rate", "ci95": [lo, hi]}

with ``ci95`` the 95% confidence interval of ``avg_reward`` over episodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from turnrl.data.schema import Trajectory
from turnrl.rollout.sampler import cut_rate, invalid_rate
from turnrl.stats import mean_ci95


def summarize(trajectories: Sequence[Trajectory], *, policy: str, env: str, split: str) -> dict[str, Any]:
    """The result record of a set of episodes."""
    returns = [t.return_ for t in trajectories]
    avg, (lo, hi) = mean_ci95(returns)
    n = max(1, len(trajectories))
    return {
        "policy": policy,
        "env": env,
        "split": split,
        "episodes": len(trajectories),
        "avg_reward": round(avg, 4),
        "success_rate": round(sum(t.success for t in trajectories) / n, 4),
        "avg_turns": round(sum(t.num_turns for t in trajectories) / n, 3),
        "invalid_action_rate": round(invalid_rate(trajectories), 4),
        "cut_reply_rate": round(cut_rate(trajectories), 4),
        "ci95": [round(lo, 4), round(hi, 4)],
    }


def results_table(results: Sequence[dict[str, Any]], title: str = "Evaluation") -> Any:
    """A rich table of result records. The CI is across a record's ``seeds`` (a comparison's rows)
    or else its ``episodes``; across fewer than two it reads "no CI", not a zero-width interval."""
    from rich.table import Table

    table = Table(title=title)
    for col in ("policy", "env", "split", "episodes", "avg_reward", "ci95", "success", "turns", "invalid"):
        table.add_column(col, justify="left" if col in ("policy", "env", "split") else "right")
    for r in results:
        table.add_row(
            str(r.get("method", r["policy"])), r["env"], r["split"], str(r["episodes"]),
            f"{r['avg_reward']:.3f}",
            "no CI" if r.get("seeds", r["episodes"]) < 2 else f"[{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]",
            f"{r['success_rate']:.2f}", f"{r['avg_turns']:.1f}", f"{r['invalid_action_rate']:.2f}",
        )
    return table
