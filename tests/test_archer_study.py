"""scripts/archer_study.py: the per-env commands and the report's reading of the run logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def study(load_script):
    return load_script("archer_study")


def _write(run: Path, rows: list[dict], summary: dict) -> None:
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps(summary))


def test_ppo_curve_is_put_on_the_study_scale(study, tmp_path):
    """A PPO run logs the env's return without the invalid penalty; the curve subtracts one per
    invalid turn (invalid rate x turns) and counts environment steps as episodes x turns."""
    run = tmp_path / "ppo-s0"
    _write(run, [
        {"step": 1, "rollout/return": 0.5, "rollout/invalid": 0.25, "rollout/turns": 4.0},
        {"step": 2, "loss": 0.1},  # a later minibatch of the same iteration
        {"step": 3, "rollout/return": 1.0, "rollout/invalid": 0.0, "rollout/turns": 3.0},
    ], {"run_config": {"ppo": {"episodes_per_iter": 8}}})
    curve = study.training_curve(run, ppo=True)
    assert [c["env_steps"] for c in curve] == [32.0, 56.0]
    assert [c["train/return"] for c in curve] == [-0.5, 1.0]
    assert [c["train/invalid"] for c in curve] == [0.25, 0.0]


def test_online_curve_skips_the_evaluation_only_row(study, tmp_path):
    run = tmp_path / "archer-s0"
    _write(run, [
        {"iteration": 0, "env_steps": 0, "eval/return": -2.0},
        {"iteration": 1, "env_steps": 60, "train/return": -1.5, "train/invalid": 0.5},
        {"iteration": 2, "env_steps": 130, "train/return": -1.0, "train/invalid": 0.4, "eval/return": -1.2},
    ], {})
    assert [c["env_steps"] for c in study.training_curve(run, ppo=False)] == [60, 130]
    assert study.start_final(run, ppo=False) == (-2.0, -1.2)


def test_env_setups_give_each_trainer_its_prompt(study):
    ttt, q20 = study.ENVS["tictactoe"], study.ENVS["twenty_questions"]
    assert "prompt.history=0" in ttt.common() and "env_opts.opponent=random" in ttt.common()
    assert "history=0" in ttt.ppo()
    # twenty questions keeps the whole game in the prompt (YAML null) and has no env options
    assert "prompt.history=null" in q20.common() and not any(x.startswith("env_opts.") for x in q20.common())
    assert "history=null" in q20.ppo() and "max_new_tokens=48" in q20.ppo()
    assert q20.prompt().history is None and q20.prompt().invalid_penalty == -1


def test_a_study_folder_refuses_other_settings(study, tmp_path):
    """Finished runs are reused as they are: a study folder made with --iterations 8 is refused for 40
    (its runs would be tabulated as the new budget); seeds and methods are free."""
    made = {"env": "tictactoe", "iterations": 8, "eval_episodes": 100, "demos": 100, "sft_epochs": 3.0}
    study.check_study(tmp_path, made)
    study.check_study(tmp_path, dict(made))  # the same settings: go on
    with pytest.raises(SystemExit, match=r"was made with other settings \(--iterations 8, now 40\)"):
        study.check_study(tmp_path, {**made, "iterations": 40})
    assert json.loads((tmp_path / "study.json").read_text())["iterations"] == 8
    older = tmp_path / "older"  # finished runs, no study.json: nothing to check them against
    _write(older / "archer-s0", [{"iteration": 0, "env_steps": 0, "eval/return": -2.0}], {"eval": [{}]})
    with pytest.raises(SystemExit, match=r"holds finished runs but no study.json"):
        study.check_study(older, made)


def test_the_report_of_a_short_study_and_a_failed_run(study, tmp_path):
    """Two iterations gave fewer points than the 3-iteration smoothing window: numpy swapped the arrays
    and the report crashed after every run had finished. A failed child run was a 30-line traceback of
    this script; it is one line with the command's own error."""
    run = tmp_path / "archer-s0"
    _write(run, [{"iteration": 0, "env_steps": 0, "eval/return": -2.0},
                 {"iteration": 1, "env_steps": 10, "train/return": -1.5, "train/invalid": 0.2},
                 {"iteration": 2, "env_steps": 20, "train/return": -1.0, "train/invalid": 0.1, "eval/return": -1.2}],
           {"eval": [{}]})
    res = study.report(study.ENVS["tictactoe"], tmp_path, ["archer"], [0], None)
    assert res["methods"]["archer"]["final"] == -1.2 and (tmp_path / "results.md").is_file()
    import sys

    with pytest.raises(SystemExit, match=r"^error: turnrl train archer failed \(exit 2\): error: bad \(log: "):
        study.run_child([sys.executable, "-c", "import sys; print('error: bad'); sys.exit(2)", "train", "archer"],
                        tmp_path / "child.log")
