"""scripts/paired_by_game.py: rows of a compare run minus SFT, paired game by game."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from turnrl.data.io import write_jsonl
from turnrl.data.schema import Message, Trajectory


@pytest.fixture(scope="module")
def script(load_script):
    return load_script("paired_by_game")


def _games(path: Path, returns: list[float]) -> None:
    msgs = [Message("user", "Board"), Message("assistant", "Action: 1", action="1", valid=True)]
    write_jsonl(path, [Trajectory(id=f"g{i}", env="tictactoe", task_id=f"t{i}", messages=msgs, return_=r, split="seen",
                                  meta={"seed": 100 + i}) for i, r in enumerate(returns)])


def test_paired_by_game_table(tmp_path: Path, script, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cmp"
    for seed, (sft, row) in {0: ([1, 0, -1], [1, 1, -1]), 1: ([1, 0, -1], [1, 1, 0]), 2: ([0, 0, 0], [0, 0, 0])}.items():
        d = out / f"seed-{seed}"
        d.mkdir(parents=True)
        _games(d / "sft-eval-seen.jsonl", sft)
        if seed < 2:  # seed 2 has no row file: left out
            _games(d / "row.jsonl", row)
    assert script.main([str(out), "--row", "eto γ = 1=row.jsonl"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    # per game, the mean over seeds 0 and 1 of row - sft: t0 0, t1 (1 + 1)/2 = 1, t2 (0 + 1)/2 = 0.5
    half = 4.303 * math.sqrt(0.25) / math.sqrt(3)
    assert line == (f"| eto γ = 1 (left out: seed-2) | 2 | 3 | +0.500 [{0.5 - half:+.3f}, {0.5 + half:+.3f}] | 2 / 1 / 0 |")
    # Best-of-N's file holds N samples of each game: the game counts with its best, as compare's row does
    for seed in (0, 1):
        d = out / f"seed-{seed}"
        _games(d / "bon.jsonl", [1, 1, 1])
        (d / "bon.jsonl").write_text((d / "bon.jsonl").read_text() + (d / "row.jsonl").read_text())
    assert script.main([str(out), "--row", "bon=bon.jsonl"]) == 0
    # per game, best 1 minus sft: t0 (0 + 0)/2 = 0, t1 (1 + 1)/2 = 1, t2 (2 + 2)/2 = 2; mean 1, sd 1
    half = 4.303 * 1.0 / math.sqrt(3)
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"| bon (left out: seed-2) | 2 | 3 | +1.000 [{1 - half:+.3f}")
    assert script.main([str(out), "--row", "eto=nope.jsonl"]) == 2
    assert "no seed has both nope.jsonl and sft-eval-seen.jsonl" in capsys.readouterr().err


def test_dmpo_divergence_bad_pairs_file_is_a_one_line_error(tmp_path: Path, load_script,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """scripts/dmpo_divergence.py on a run whose pairs file is malformed: ``file:line: what``, exit 2,
    no traceback."""
    dmpo = load_script("dmpo_divergence")
    run = tmp_path / "run"
    (run / "sft" / "model").mkdir(parents=True)
    (run / "iter-1").mkdir()
    (run / "iter-1" / "pairs.jsonl").write_text("not json\n")
    assert dmpo.main(["--run", str(run), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {run / 'iter-1' / 'pairs.jsonl'}:1: invalid JSON") and len(err.splitlines()) == 1


def test_dmpo_divergence_refuses_an_out_made_with_other_settings(tmp_path: Path, load_script,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Every stage is reused when done: a rerun with another --lr reported the first run's numbers under
    the new settings. It is refused in one line; --episodes 0 (nan rows, exit 0) is a usage error."""
    dmpo = load_script("dmpo_divergence")
    run = tmp_path / "run"
    (run / "sft" / "model").mkdir(parents=True)
    (run / "iter-1").mkdir()
    (run / "iter-1" / "pairs.jsonl").write_text("not json\n")
    out = tmp_path / "out"
    assert dmpo.main(["--run", str(run), "--out", str(out), "--lr", "3e-5"]) == 2  # records its settings first
    capsys.readouterr()
    assert dmpo.main(["--run", str(run), "--out", str(out), "--lr", "1e-2"]) == 2
    err = capsys.readouterr().err
    assert "made with other settings (lr: 3e-05, now 0.01)" in err and len(err.splitlines()) == 1
    with pytest.raises(SystemExit):
        dmpo.main(["--run", str(run), "--out", str(tmp_path / "o2"), "--episodes", "0"])
