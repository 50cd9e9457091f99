"""The command line: bad input is one line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from turnrl.cli import main
from turnrl.data.io import read_trajectories


def run(args: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
        raise SystemExit(0)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def one_line_error(code: int, err: str) -> str:
    assert code != 0
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_envs_check_and_list(capsys) -> None:
    code, out, _ = run(["envs", "check", "tictactoe"], capsys)
    assert code == 0 and "contract holds" in out
    code, out, _ = run(["envs", "list"], capsys)
    assert code == 0 and "tictactoe" in out


def test_unknown_env(capsys) -> None:
    code, _, err = run(["envs", "check", "tictacto"], capsys)
    line = one_line_error(code, err)
    assert "unknown env 'tictacto'" in line and "did you mean 'tictactoe'" in line


def test_unknown_env_opt(tmp_path: Path, capsys) -> None:
    code, _, err = run(["collect", "--env", "tictactoe", "--policy", "expert", "--episodes", "2",
                        "--out", str(tmp_path / "x.jsonl"), "--env-opt", "oponent=minimax"], capsys)
    line = one_line_error(code, err)
    assert "'oponent'" in line and "did you mean 'opponent'" in line
    assert not (tmp_path / "x.jsonl").exists()
    code, _, err = run(["collect", "--env", "tictactoe", "--policy", "expert", "--out", str(tmp_path / "y.jsonl"),
                        "--env-opt", "opponent=minmax"], capsys)
    assert "minmax" in one_line_error(code, err)


def test_usage_errors_exit_2_without_a_traceback(tmp_path: Path, capsys) -> None:
    # click's usage errors (a missing option, an unknown command or option), whichever click
    # typer parses with (recent typer carries its own copy)
    for args, what in ((["collect", "--env", "bandit", "--out", str(tmp_path / "x.jsonl")], "--policy"),
                       (["colect"], "colect"), (["envs", "list", "--bogus"], "--bogus")):
        code, _, err = run(args, capsys)
        assert code == 2, (args, err)
        assert what in err and "Traceback" not in err
    assert not (tmp_path / "x.jsonl").exists()


def test_collect_validate_and_malformed_line(tmp_path: Path, capsys) -> None:
    out = tmp_path / "demos.jsonl"
    code, _, _ = run(["collect", "--env", "tictactoe", "--policy", "expert", "--episodes", "30",
                      "--env-opt", "opponent=minimax", "--out", str(out)], capsys)
    assert code == 0
    code, stdout, _ = run(["data", "validate", str(out)], capsys)
    assert code == 0 and json.loads(stdout)["trajectories"] == 30
    lines = out.read_text().splitlines()
    lines[6] = lines[6].replace('"role": "user"', '"role": "bot"', 1)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    code, _, err = run(["data", "validate", str(bad)], capsys)
    line = one_line_error(code, err)
    assert f"{bad}:7:" in line and "role" in line


def test_missing_model_path(tmp_path: Path, capsys) -> None:
    code, _, err = run(["eval", "--env", "tictactoe", "--policy", str(tmp_path / "nope"), "--out",
                        str(tmp_path / "r.json")], capsys)
    assert "model path not found" in one_line_error(code, err)


def test_train_sft_errors(tmp_path: Path, tiny_dir: Path, capsys) -> None:
    data = tmp_path / "d.jsonl"
    run(["collect", "--env", "tictactoe", "--policy", "expert", "--episodes", "4", "--out", str(data)], capsys)
    code, _, err = run(["train", "sft", "--model", str(tiny_dir), "--data", str(data), "--out",
                        str(tmp_path / "o"), "lerning_rate=1"], capsys)
    line = one_line_error(code, err)
    assert "unknown key 'lerning_rate'" in line
    code, _, err = run(["train", "sft", "--model", str(tiny_dir), "--data", str(data), "--out",
                        str(tmp_path / "o"), "lr=fast"], capsys)
    assert "'lr'" in one_line_error(code, err)
    code, _, err = run(["train", "sft", "--model", str(tmp_path / "missing"), "--data", str(data), "--out",
                        str(tmp_path / "o")], capsys)
    assert "model path not found" in one_line_error(code, err)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"schema": "turnrl.trajectory/v1", "id": 1\n')
    code, _, err = run(["train", "sft", "--model", str(tiny_dir), "--data", str(bad), "--out",
                        str(tmp_path / "o")], capsys)
    assert f"{bad}:1:" in one_line_error(code, err)
    code, _, err = run(["train", "sft", "--model", str(tiny_dir), "--data", str(tmp_path / "none.jsonl"),
                        "--out", str(tmp_path / "o")], capsys)
    assert "none.jsonl" in one_line_error(code, err)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("lr: 0.1\nbatch_sise: 3\n")
    code, _, err = run(["train", "sft", "--model", str(tiny_dir), "--data", str(data), "--out",
                        str(tmp_path / "o"), "--config", str(cfg)], capsys)
    line = one_line_error(code, err)
    assert str(cfg) in line and "batch_sise" in line and "did you mean 'batch_size'" in line
    # nothing to train: the keys this command takes (not the pipelines' "train."), before anything loads
    code, _, err = run(["train", "sft", "--model", str(tmp_path / "missing"), "--data", str(data), "--out",
                        str(tmp_path / "o"), "epochs=0"], capsys)
    assert one_line_error(code, err).endswith("epochs=0 and max_steps=0: nothing would be trained; set epochs > 0 "
                                              "or max_steps > 0")
    # turns past max_length are left out: said on the console, not only in data_stats.json
    code, out, _ = run(["train", "sft", "--model", str(tiny_dir), "--data", str(data), "--out", str(tmp_path / "cut"),
                        "max_steps=1", "max_length=300"], capsys)
    stats = json.loads((tmp_path / "cut" / "data_stats.json").read_text())
    assert code == 0 and stats["dropped_turns"] > 0
    assert f"note: max_length=300 left out {stats['dropped_turns']} agent turn(s)" in " ".join(out.split())


def test_import_eto(tmp_path: Path, capsys) -> None:
    src = tmp_path / "eto.json"
    src.write_text(json.dumps([{"id": "t1", "reward": 1.0, "conversations": [
        {"from": "human", "value": "Instruction"}, {"from": "gpt", "value": "OK"},
        {"from": "human", "value": "Obs"}, {"from": "gpt", "value": "Thought: x\nAction: go"}]}]))
    code, out, _ = run(["data", "import-eto", str(src), "--out", str(tmp_path / "t.jsonl"), "--env", "x"], capsys)
    assert code == 0 and "1 trajectories" in out
    code, stdout, _ = run(["data", "validate", str(tmp_path / "t.jsonl")], capsys)
    assert json.loads(stdout)["trajectories"] == 1


def test_eval_seed_makes_sampled_evaluation_reproducible(tiny_dir: Path, tmp_path: Path, capsys) -> None:
    """``--seed`` seeds a model's sampling as well as the episode plan: the same seed plays the same
    sampled games, another seed others."""
    def games(seed: int, name: str) -> list[str]:
        out, trajs = tmp_path / f"{name}.json", tmp_path / f"{name}.jsonl"
        code, _, err = run(["eval", "--env", "tictactoe", "--policy", str(tiny_dir), "--out", str(out),
                            "--episodes", "3", "--temperature", "1", "--max-new-tokens", "8", "--seed", str(seed),
                            "--trajectories", str(trajs)], capsys)
        assert code == 0, err
        return [m.content for t in read_trajectories(trajs) for m in t.messages if m.role == "assistant"]

    assert games(5, "a") == games(5, "b") != games(6, "c")


def test_collect_and_eval_play_with_a_pipelines_prompt_rules(tmp_path: Path, capsys) -> None:
    """``--instruction``, ``--invalid-action`` and ``--invalid-penalty`` reach every episode, so a
    pipeline's agent is evaluated under its pipeline's rules; a bad value is one line."""
    out = tmp_path / "c.jsonl"
    code, _, err = run(["collect", "--env", "tictactoe", "--policy", "random", "--out", str(out), "--episodes", "2",
                        "--instruction", "Play X.", "--invalid-action", "end", "--invalid-penalty", "-1"], capsys)
    assert code == 0, err
    assert all(t.messages[0].content == "Play X." for t in read_trajectories(out))
    code, _, err = run(["eval", "--env", "tictactoe", "--policy", "random", "--out", str(tmp_path / "e.json"),
                        "--invalid-action", "stop"], capsys)
    assert "unknown --invalid-action 'stop'" in one_line_error(code, err)


def test_eval_takes_model_as_the_spelling_of_policy_that_design_gives(tmp_path: Path, capsys) -> None:
    """DESIGN's command line is ``turnrl eval --model M``: the same option as ``--policy``."""
    import json

    out = tmp_path / "e.json"
    code, _, err = run(["eval", "--env", "tictactoe", "--model", "expert", "--episodes", "2", "--split", "seen",
                        "--out", str(out)], capsys)
    assert code == 0, err
    assert json.loads(out.read_text())["results"][0]["policy"] == "expert"


def test_an_unknown_engine_is_refused_for_any_policy(tmp_path: Path, capsys) -> None:
    out = tmp_path / "e.json"
    code, _, err = run(["eval", "--env", "tictactoe", "--policy", "expert", "--episodes", "1", "--out", str(out),
                        "--engine", "vlm"], capsys)
    assert "unknown engine 'vlm'" in one_line_error(code, err)
    assert not out.exists()


def test_eval_refuses_one_file_for_report_and_trajectories(tmp_path: Path, capsys) -> None:
    out = tmp_path / "e.json"
    code, _, err = run(["eval", "--env", "tictactoe", "--policy", "expert", "--episodes", "1", "--out", str(out),
                        "--trajectories", str(tmp_path / "." / "e.json")], capsys)  # one file for both
    assert "--trajectories" in one_line_error(code, err) and not out.exists()


def test_train_dpo_refuses_a_config_that_sets_another_loss(tmp_path: Path, capsys) -> None:
    """The command names the loss; ``loss=ipo`` under ``turnrl train dpo`` was dropped silently."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("loss: dmpo\n")
    for extra in (["loss=ipo"], ["--config", str(cfg)]):
        code, _, err = run(["train", "dpo", "--model", "tiny", "--pairs", str(tmp_path / "p.jsonl"),
                            "--out", str(tmp_path / "o"), *extra], capsys)
        line = one_line_error(code, err)
        assert code == 2 and "this command trains dpo" in line and "turnrl train" in line, line
    assert not (tmp_path / "o").exists()


def test_study_checks_its_docs_folder_first(tmp_path: Path, capsys) -> None:
    docs = tmp_path / "docs"
    docs.write_text("mine\n")
    code, _, err = run(["study", "greedy", "--out", str(tmp_path / "g"), "--fast", "--report-only",
                        "--docs", str(docs)], capsys)
    assert "--docs" in one_line_error(code, err) and "is a file" in err
    assert not (tmp_path / "g").exists() and docs.read_text() == "mine\n"


def test_collect_leaves_a_file_that_is_not_its_own_whole(tmp_path: Path, capsys) -> None:
    """Resuming drops a last line a kill cut short, but only once the file is known to be a collection:
    another file's last line (no newline at its end) is not cut off."""
    base = ["collect", "--env", "tictactoe", "--policy", "expert", "--episodes", "3"]
    for name, content in (("notes.jsonl", b"hello\nworld"), ("pretty.json", b'{\n "a": 1\n}'),
                          ("bin.jsonl", b"\xff\xfe\x00bad")):
        path = tmp_path / name
        path.write_bytes(content)
        code, _, err = run([*base, "--out", str(path)], capsys)
        assert "not a trajectory file" in one_line_error(code, err)
        assert path.read_bytes() == content
    out = tmp_path / "r.jsonl"  # a collection killed while writing its third episode resumes
    assert run([*base, "--out", str(out)], capsys)[0] == 0
    data = out.read_bytes()
    out.write_bytes(data[: data.rindex(b"\n", 0, len(data) - 1) + 40])
    code, stdout, _ = run([*base, "--out", str(out)], capsys)
    assert code == 0 and out.read_bytes() == data


@pytest.mark.parametrize("command", ["collect", "eval"])
def test_help_shows_the_ray_extra_in_brackets(command: str, capsys, monkeypatch) -> None:
    """rich reads ``[ray]`` in a help text as a style tag and drops it unless escaped."""
    monkeypatch.setenv("COLUMNS", "300")
    code, out, _ = run([command, "--help"], capsys)
    assert code == 0 and "pip install 'turnrl[ray]'" in out


def test_ctrl_c_exits_130_with_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    """typer (standalone_mode=False) turns Ctrl-C into Exit(130) and returns its code: main exits with it."""
    import turnrl.data.io

    def interrupted(path: Path) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(turnrl.data.io, "summarize", interrupted)
    code, _, err = run(["data", "validate", str(tmp_path / "x.jsonl")], capsys)
    assert code == 130 and one_line_error(code, err) == "interrupted"


def test_a_folder_that_cannot_be_written_is_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    """An OSError (a read-only folder, a full disk) is the user's environment: one line naming the path,
    exit 2, not a traceback."""
    import turnrl.data.io

    def read_only(path: Path) -> None:
        raise OSError(30, "Read-only file system", "rob/x.jsonl")

    monkeypatch.setattr(turnrl.data.io, "summarize", read_only)
    code, _, err = run(["data", "validate", str(tmp_path / "x.jsonl")], capsys)
    assert code == 2 and one_line_error(code, err) == "error: rob/x.jsonl: Read-only file system"

    def a_bug(path: Path) -> None:  # another OSError is no user error: its traceback stays
        raise OSError(2, "No such file or directory", "/internal/cache.bin")

    monkeypatch.setattr(turnrl.data.io, "summarize", a_bug)
    with pytest.raises(FileNotFoundError):
        main(["data", "validate", str(tmp_path / "x.jsonl")])


def test_a_failed_env_check_exits_1(capsys, monkeypatch) -> None:
    import turnrl.envs.checker

    monkeypatch.setattr(turnrl.envs.checker, "check_env", lambda env, episodes: ["reset returned no observation"])
    code, out, err = run(["envs", "check", "tictactoe"], capsys)
    assert code == 1 and "reset returned no observation" in one_line_error(code, err)
    assert "contract holds" not in out


ETO_ITEM = [{"id": "a1", "conversations": [
    {"from": "human", "value": "You are in a shop. Instruction: buy a hat"}, {"from": "gpt", "value": "OK"},
    {"from": "human", "value": "Observation: page"}, {"from": "gpt", "value": "Thought: x\nAction: search[hat]"}]}]


def test_import_eto_refuses_a_non_finite_reward_and_its_own_input_as_out(tmp_path: Path, capsys,
                                                                         monkeypatch) -> None:
    src = tmp_path / "eto.json"
    src.write_text(json.dumps(ETO_ITEM))
    data = src.read_bytes()
    out = tmp_path / "t.jsonl"
    for value in ("nan", "inf", "-inf"):
        code, _, err = run(["data", "import-eto", str(src), "--out", str(out), "--default-reward", value], capsys)
        assert "--default-reward" in one_line_error(code, err) and code == 2
    monkeypatch.chdir(tmp_path)
    code, _, err = run(["data", "import-eto", "eto.json", "--out", str(src)], capsys)  # another spelling of it
    assert "is the input file" in one_line_error(code, err)
    assert src.read_bytes() == data and not out.exists()
    (tmp_path / "hard.json").hardlink_to(src)  # the same file under another name
    code, _, err = run(["data", "import-eto", "eto.json", "--out", str(tmp_path / "hard.json")], capsys)
    assert "is the input file" in one_line_error(code, err)
    assert src.read_bytes() == data
    code, stdout, _ = run(["data", "import-eto", "eto.json", "--out", str(out), "--default-reward", "1"], capsys)
    assert code == 0 and "wrote 1 trajectories" in stdout


def test_pairs_scored_refuses_the_pair_options_it_would_ignore(tmp_path: Path, capsys) -> None:
    agent = tmp_path / "agent.jsonl"
    assert run(["collect", "--env", "tictactoe", "--policy", "random", "--episodes", "4", "--out", str(agent)],
               capsys)[0] == 0
    out = tmp_path / "s.jsonl"
    base = ["pairs", "--scored", "--explored", str(agent), "--out", str(out)]
    for extra, named in ((["--mode", "step"], "--mode step"), (["--truncate-k", "2"], "--truncate-k 2"),
                         (["--expert", str(agent)], "--expert"), (["--losers", "clean"], "--losers clean")):
        code, _, err = run(base + extra, capsys)
        line = one_line_error(code, err)
        assert code == 2 and named in line and "--scored" in line, line
    assert not out.exists()
    # one sample a task: every win rate 1/2, every SPPO target 0 (training would not move)
    code, _, err = run(base, capsys)
    assert "has one sample: its win rate would be 1/2" in one_line_error(code, err) and not out.exists()
    again = tmp_path / "agent-seed1.jsonl"
    assert run(["collect", "--env", "tictactoe", "--policy", "random", "--episodes", "4", "--seed", "1",
                "--out", str(again)], capsys)[0] == 0
    code, stdout, _ = run([*base, "--explored", str(again)], capsys)
    assert code == 0 and "8 scored samples" in stdout


def test_diagnose_checks_every_policy_before_any_work(tmp_path: Path, capsys, monkeypatch) -> None:
    import turnrl.diagnostics.bandit

    def no_work(*a: object, **k: object) -> None:
        raise AssertionError("diagnose started before every --policy was checked")

    monkeypatch.setattr(turnrl.diagnostics.bandit, "diagnose", no_work)
    out = tmp_path / "diag"
    code, _, err = run(["diagnose", "bandit", "--policy", "ucb", "--policy", "thompsn", "--out", str(out)], capsys)
    assert "did you mean 'thompson'" in one_line_error(code, err)
    code, _, err = run(["diagnose", "bandit", "--policy", "ucb", "--policy", "ucb:c=x", "--out", str(out)], capsys)
    assert "c must be a number" in one_line_error(code, err)
    code, _, err = run(["diagnose", "bandit", "--policy", "random", "--policy", str(tmp_path / "nope"),
                        "--out", str(out)], capsys)
    assert "--policy: model path not found" in one_line_error(code, err)
    # a model-only option with scripted policies alone was ignored; a bad sampling value was found only when
    # the first model loaded, after the scripted policies before it had run
    code, _, err = run(["diagnose", "bandit", "--policy", "ucb", "--temperature", "0.7", "--fb-rationale",
                        "--out", str(out)], capsys)
    assert one_line_error(code, err).endswith("--temperature, --fb-rationale: they change model policies only, and "
                                              "every --policy is scripted (it would be ignored); leave them out")
    code, _, err = run(["diagnose", "bandit", "--policy", "ucb", "--policy", "tiny", "--temperature", "inf",
                        "--out", str(out)], capsys)
    assert "--temperature inf: must be a finite number >= 0" in one_line_error(code, err)
    code, _, err = run(["diagnose", "bandit", "--policy", "ucb", "--policy", "tiny", "--device", "foo",
                        "--out", str(out)], capsys)
    assert "device 'foo': not a device torch knows" in one_line_error(code, err)
    assert not out.exists()


def test_eval_checks_every_split_before_playing_any(tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    import turnrl.collect as collect

    played: list[str] = []
    monkeypatch.setattr(collect, "evaluate", lambda *a, **kw: played.append(kw["split"]) or ({}, []))
    code, _, err = run(["eval", "--env", "tictactoe", "--policy", "random", "--episodes", "4", "--split", "seen",
                        "--split", "bogus", "--out", str(tmp_path / "r.json")], capsys)
    assert "unknown split 'bogus'" in one_line_error(code, err) and played == []


def test_pairs_and_comparisons_refuse_an_input_as_out_and_tau_without_scored(tmp_path: Path, capsys) -> None:
    """--out equal to an input replaced it (the explored episodes were gone); --tau without --scored was
    accepted and ignored, a negative one too."""
    agent, expert = tmp_path / "agent.jsonl", tmp_path / "expert.jsonl"
    for policy, path in (("random", agent), ("expert", expert)):
        assert run(["collect", "--env", "tictactoe", "--policy", policy, "--episodes", "3", "--out", str(path)],
                   capsys)[0] == 0
    before = agent.read_bytes()
    for args in (["pairs", "--explored", str(agent), "--expert", str(expert), "--out", str(agent)],
                 ["comparisons", "--trajectories", str(agent), "--out", str(agent)]):
        line = one_line_error(*run(args, capsys)[:3:2])
        assert line.endswith(f"--out {agent}: is the input file {agent} (it would be replaced); choose another --out")
    assert agent.read_bytes() == before
    line = one_line_error(*run(["pairs", "--explored", str(agent), "--expert", str(expert), "--out",
                                str(tmp_path / "p.jsonl"), "--tau", "-5"], capsys)[:3:2])
    assert "--tau -5.0: the oracle temperature of --scored samples" in line
    assert not (tmp_path / "p.jsonl").exists()
    # --expert with self-play pairs was ignored; no pair at all wrote an empty file and exited 0
    line = one_line_error(*run(["pairs", "--explored", str(agent), "--expert", str(expert), "--mode", "self-play",
                                "--out", str(tmp_path / "p.jsonl")], capsys)[:3:2])
    assert "--expert: --mode self-play pairs the explored samples with each other" in line
    line = one_line_error(*run(["pairs", "--explored", str(expert), "--expert", str(expert), "--out",
                                str(tmp_path / "p.jsonl")], capsys)[:3:2])  # the expert never loses to itself
    assert line.startswith(f"error: no pairs from {expert}, {expert}") and line.endswith(f"nothing written to "
                                                                                      f"{tmp_path / 'p.jsonl'}")
    assert not (tmp_path / "p.jsonl").exists()
    # a shorter collection into a longer one's file says what the file holds
    code, out, _ = run(["collect", "--env", "tictactoe", "--policy", "random", "--episodes", "2", "--out", str(agent)],
                       capsys)
    assert code == 0 and f"2 episodes of the 3 in {agent}" in " ".join(out.split()), out


def test_model_only_options_with_a_scripted_policy_are_refused(tmp_path: Path, capsys) -> None:
    """collect/eval with expert, random, ucb... ignored --history, --temperature, --max-new-tokens, --engine."""
    out = tmp_path / "c.jsonl"
    for extra, named in ((["--history", "0"], "--history"), (["--temperature", "0.3", "--max-new-tokens", "1"],
                                                             "--temperature, --max-new-tokens")):
        line = one_line_error(*run(["collect", "--env", "bandit", "--policy", "ucb", "--episodes", "1",
                                    "--out", str(out), *extra], capsys)[:3:2])
        assert line.endswith(f"{named}: {'it changes' if ',' not in named else 'they change'} model policies only, "
                             f"and policy 'ucb' is scripted (it would be ignored); leave {'it' if ',' not in named else 'them'} out")
    assert not out.exists()
    line = one_line_error(*run(["eval", "--env", "tictactoe", "--policy", "expert", "--episodes", "1",
                                "--out", str(tmp_path / "r.json"), "--engine", "hf"], capsys)[:3:2])
    assert "--engine: it changes model policies only" in line


def test_eval_plays_a_split_given_twice_once(tmp_path: Path, capsys) -> None:
    report, episodes = tmp_path / "r.json", tmp_path / "e.jsonl"
    assert run(["eval", "--env", "tictactoe", "--policy", "random", "--episodes", "3", "--split", "seen",
                "--split", "seen", "--out", str(report), "--trajectories", str(episodes)], capsys)[0] == 0
    assert len(json.loads(report.read_text())["results"]) == 1
    ids = [t.id for t in read_trajectories(episodes)]
    assert len(ids) == 3 == len(set(ids))


def test_whole_file_outputs_write_through_a_symlink_and_into_a_device(tmp_path: Path) -> None:
    """A rename over the target replaced a symlink (its target kept the old report) and, as root, a device
    such as /dev/null with a regular file."""
    import os

    from turnrl.data.io import write_jsonl
    from turnrl.train.core import atomic_write_text

    real, link = tmp_path / "real.json", tmp_path / "link.json"
    real.write_text("old\n")
    link.symlink_to(real)
    atomic_write_text(link, "new\n")
    assert link.is_symlink() and real.read_text() == "new\n"
    assert write_jsonl(link, [{"a": 1}]) == 1 and link.is_symlink() and real.read_text() == '{"a": 1}\n'
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader keeps the FIFO open for writing
    try:
        atomic_write_text(fifo, "through\n")
        assert write_jsonl(fifo, [{"b": 2}, {"c": 3}]) == 2
        assert os.read(reader, 1000) == b'through\n{"b": 2}\n{"c": 3}\n'
    finally:
        os.close(reader)
    assert not fifo.is_file()  # still the FIFO, not a file put in its place


def test_an_error_line_keeps_bracketed_text(tmp_path: Path, capsys) -> None:
    """rich reads ``[bold]`` or ``[ray]`` as a style tag and drops it: ``pip install 'turnrl[ray]'`` printed
    as ``pip install 'turnrl'``. The message is escaped, so a path or a hint with brackets comes out whole."""
    missing = tmp_path / "runs[ray]" / "x[bold].jsonl"
    code, _, err = run(["data", "validate", str(missing)], capsys)
    assert one_line_error(code, err) == f"error: {missing}: no such file"


def test_results_table_prints_no_ci_across_fewer_than_two() -> None:
    """A comparison row over one seed, or an evaluation of one episode, has a zero-width CI, which
    would read as one that excludes everything: the console table prints "no CI" there."""
    import io

    from rich.console import Console

    from turnrl.evaluation import results_table

    base = {"policy": "sft", "env": "tictactoe", "split": "seen", "avg_reward": 0.5, "ci95": [0.5, 0.5],
            "success_rate": 0.5, "avg_turns": 3.0, "invalid_action_rate": 0.0}

    def text(*records: dict[str, Any]) -> str:
        buf = io.StringIO()
        Console(file=buf, width=200).print(results_table(list(records)))
        return buf.getvalue()

    assert "no CI" in text({**base, "episodes": 10, "seeds": 1}) and "[0.500, 0.500]" not in text(
        {**base, "episodes": 10, "seeds": 1})
    assert "no CI" in text({**base, "episodes": 1})
    wide = {**base, "ci95": [0.25, 0.75]}
    assert "[0.250, 0.750]" in text({**wide, "episodes": 10, "seeds": 3}) and "no CI" not in text({**wide, "episodes": 10})


def test_collect_refuses_a_policy_that_cannot_play_the_env_before_writing(tmp_path: Path, capsys) -> None:
    """A bandit algorithm on tic-tac-toe, or random on free-text twenty questions: one line and no
    output file (it was left empty, as if a collection had begun)."""
    for env, policy, opts, what in (("tictactoe", "ucb", [], "bandit policy 'ucb' needs a bandit env"),
                                    ("twenty_questions", "random", ["--env-opt", "free_text=true"],
                                     "lists no actions on two turns running")):
        out = tmp_path / f"{env}.jsonl"
        code, _, err = run(["collect", "--env", env, "--policy", policy, "--episodes", "2", *opts,
                            "--out", str(out)], capsys)
        assert what in one_line_error(code, err) and not out.exists()


def test_a_setting_given_as_a_flag_says_how_settings_are_written(tmp_path: Path, capsys) -> None:
    """`--lr 1e-3` on a command of key=value settings: click's "No such option" alone left the user
    guessing; a misspelled real flag keeps click's own suggestion and no hint."""
    code, _, err = run(["train", "sft", "--model", "tiny", "--data", "x", "--out", str(tmp_path / "o"),
                        "--lr", "1e-3"], capsys)
    assert "No such option: --lr" in one_line_error(code, err)
    assert "its flags are --model, --data, --out" in err and "if lr is a setting, write lr=VALUE" in " ".join(err.split())
    code, _, err = run(["eval", "--policy", "expert", "--env", "tictactoe", "--episods", "3",
                        "--out", str(tmp_path / "r.json")], capsys)
    assert "--episodes" in one_line_error(code, err) and "key=value" not in err
