"""The quickstart pipeline end to end on a small plan (the full plan's numbers are in docs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from turnrl.quickstart import QuickstartPlan, run_quickstart

SMALL = QuickstartPlan(demos=24, epochs=1.0, batch_size=16, lr=2e-3, eval_episodes=8)


@pytest.mark.integration
def test_quickstart_writes_summary_report_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "qs"
    summary = run_quickstart(out, plan=SMALL)
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["results"] == summary["results"]
    rows = {(r["policy"], r["split"]) for r in on_disk["results"]}
    assert rows == {(p, s) for p in ("untrained", "sft", "dmpo", "expert", "random") for s in ("seen", "unseen")}
    assert on_disk["pairs"]["pairs"] > 0  # the ETO iteration paired the SFT agent's failures with expert games
    for r in on_disk["results"]:
        assert r["episodes"] == 8 and r["ci95"][0] <= r["avg_reward"] <= r["ci95"][1]
    assert "| sft | seen |" in (out / "report.md").read_text()
    for png in ("training_loss.png", "rewards.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    # a second run reuses every finished stage
    mtimes = [(out / d / "summary.json").stat().st_mtime for d in ("sft", "iter-1/train")]
    again = run_quickstart(out, plan=SMALL)
    assert [(out / d / "summary.json").stat().st_mtime for d in ("sft", "iter-1/train")] == mtimes
    assert again["results"] == summary["results"]
    # its seconds are this invocation's: it says the earlier run's stages were reused
    assert summary["reused_earlier_stages"] is False and again["reused_earlier_stages"] is True


def test_quickstart_refuses_an_out_made_with_another_plan(tmp_path: Path) -> None:
    """``--fast`` in a full run's out would reuse an SFT agent trained on the full plan's demos."""
    from turnrl.errors import TurnRLError
    from turnrl.pipelines.iterative import check_settings
    from turnrl.quickstart import ENV, ENV_OPTS, FULL

    out = tmp_path / "qs"
    check_settings(out, {"env": ENV, "env_opts": ENV_OPTS, "plan": FULL.__dict__})
    with pytest.raises(TurnRLError, match=r"plan\.demos: 600, now 400; plan\.eval_episodes: 200, now 100"):
        run_quickstart(out, fast=True)
    assert sorted(p.name for p in out.iterdir()) == ["settings.json"]


def test_quickstart_without_resume_refuses_an_out_holding_a_run(tmp_path: Path) -> None:
    """``--no-resume`` must not reuse finished stages: an out holding a run is a one-line error,
    before any work."""
    from turnrl.errors import TurnRLError

    out = tmp_path / "qs"
    (out / "sft").mkdir(parents=True)
    (out / "sft" / "summary.json").write_text("{}")  # a finished SFT, which resume would skip
    with pytest.raises(TurnRLError, match=r"qs: holds an earlier run, and resume is off \(--no-resume\)"):
        run_quickstart(out, plan=SMALL, resume=False)
    assert sorted(p.name for p in out.iterdir()) == ["sft"]
