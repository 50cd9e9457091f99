"""Bad input found before any work: output paths, value ranges, typos of built-in names,
another run's file under --out. Each is one line on stderr, exit code 2, nothing written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_cli import one_line_error, run  # tests/ is on sys.path (pytest's rootdir-less import)

from turnrl.config import load_config
from turnrl.errors import TurnRLError


def test_usage_errors_are_one_line(tmp_path: Path, capsys) -> None:
    out = tmp_path / "e.json"
    base = ["eval", "--env", "tictactoe", "--policy", "random", "--out", str(out)]
    for extra, flag in ((["--episodes", "0"], "--episodes"), (["--temperature", "-1"], "--temperature"),
                        (["--history", "-1"], "--history"), (["--num-envs", "0"], "--num-envs"),
                        (["--max-new-tokens", "0"], "--max-new-tokens"), (["--episodes", "x"], "--episodes")):
        code, _, err = run(base + extra, capsys)
        line = one_line_error(code, err)
        assert code == 2 and flag in line and "turnrl eval --help" in line, line
    code, _, err = run(["collect", "--env", "bandit", "--out", str(tmp_path / "x.jsonl")], capsys)
    assert "--policy" in one_line_error(code, err)
    code, _, err = run(["diagnose", "bandit", "--policy", "ucb", "--out", str(tmp_path / "dg"), "--num-envs", "0"],
                       capsys)  # was accepted (and clamped to 1)
    assert "--num-envs" in one_line_error(code, err) and not (tmp_path / "dg").exists()
    code, _, err = run(base + ["--temperature", "inf"], capsys)  # in range for click, not a finite number
    # the flag, not "option: bad value for 'temperature'" (the catch-all's label)
    assert one_line_error(code, err) == "error: --temperature inf: must be a finite number >= 0"
    code, out_text, err = run(["train"], capsys)  # a group without a command: its help, no error line
    assert code == 2 and "sft" in out_text + err and "error" not in err
    assert not out.exists() and not (tmp_path / "x.jsonl").exists()


def test_output_paths_are_checked_first(tmp_path: Path, capsys) -> None:
    regfile = tmp_path / "regfile"
    regfile.write_text("mine\n")
    cases = [
        (["eval", "--env", "tictactoe", "--policy", "random", "--out", str(regfile / "e.json")], "is a file"),
        (["eval", "--env", "tictactoe", "--policy", "random", "--out", str(tmp_path)], "is a folder"),
        (["eval", "--env", "tictactoe", "--policy", "random", "--out", str(tmp_path / "e.json"),
          "--trajectories", str(tmp_path)], "--trajectories"),
        (["collect", "--env", "tictactoe", "--policy", "expert", "--out", str(tmp_path)], "is a folder"),
        (["train", "sft", "--model", "tiny", "--data", "x.jsonl", "--out", str(regfile)], "is a file"),
        (["train", "dpo", "--model", "tiny", "--pairs", "x.jsonl", "--out", str(regfile)], "is a file"),
        (["quickstart", "--out", str(regfile)], "is a file"),
        (["model", "init-tiny", "--out", str(regfile)], "is a file"),
    ]
    for args, what in cases:
        code, _, err = run(args, capsys)
        line = one_line_error(code, err)
        assert code == 2 and what in line, (args, line)
    assert regfile.read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["regfile"]  # nothing written, no temp folder


def test_init_tiny_keeps_a_users_folder(tmp_path: Path, capsys) -> None:
    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    (mine / "notes.txt").write_text("precious\n")
    code, _, err = run(["model", "init-tiny", "--out", str(mine)], capsys)
    assert "not empty and not a tiny model" in one_line_error(code, err)
    assert (mine / "notes.txt").read_text() == "precious\n" and (mine / "sub").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # refused before a model was built aside


def test_init_tiny_replaces_an_earlier_tiny_model(tmp_path: Path) -> None:
    from turnrl.models.tiny import build_tiny

    out = tmp_path / "tiny"
    build_tiny(out, episodes_per_split=2, env_names=("tictactoe",))
    (out / "stale.bin").write_text("old")
    build_tiny(out, episodes_per_split=2, env_names=("tictactoe",))
    assert (out / "config.json").is_file() and not (out / "stale.bin").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]


def test_init_tiny_killed_while_removing_the_earlier_model_leaves_a_whole_one(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The earlier model was deleted in place: a kill midway left a folder with no marker or weights,
    which the rerun refused as a user's. It is renamed aside first, so ``out`` is always a whole model."""
    import shutil

    import turnrl.models.tiny as tiny

    out = tmp_path / "tiny"
    tiny.build_tiny(out, episodes_per_split=2, env_names=("tictactoe",))
    rmtree = shutil.rmtree

    def killed(path: object, *_: object, **__: object) -> None:
        if ".old-" in str(path) and Path(str(path)).exists():  # deleting the earlier model, the new one in place
            (Path(str(path)) / "TURNRL_TINY").unlink()  # half deleted
            raise KeyboardInterrupt
        rmtree(str(path), ignore_errors=True)

    monkeypatch.setattr(tiny.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        tiny.build_tiny(out, episodes_per_split=2, env_names=("tictactoe",), seed=1)
    monkeypatch.undo()
    assert "seed=1" in (out / "TURNRL_TINY").read_text() and (out / "model.safetensors").is_file()
    tiny.build_tiny(out, episodes_per_split=2, env_names=("tictactoe",), seed=2)  # a rerun replaces it
    assert "seed=2" in (out / "TURNRL_TINY").read_text()


def test_collect_refuses_to_resume_another_runs_file(tmp_path: Path, capsys) -> None:
    demos = tmp_path / "demos.jsonl"
    collect = ["collect", "--env", "tictactoe", "--out", str(demos)]
    code, _, _ = run(collect + ["--policy", "expert", "--episodes", "6"], capsys)
    assert code == 0
    before = demos.read_text()
    for extra, what in ((["--policy", "random", "--episodes", "8"], "policy 'expert'"),
                        (["--policy", "expert", "--episodes", "8", "--seed", "3"], "other settings"),
                        (["--policy", "expert", "--episodes", "8", "--env-opt", "opponent=minimax"],
                         'other env options ({}; this run: {"opponent": "minimax"})'),
                        (["--policy", "random", "--episodes", "2", "--env", "bandit"], "env 'tictactoe'")):
        code, _, err = run(collect + extra, capsys)
        line = one_line_error(code, err)
        assert str(demos) in line and what in line, line
    assert demos.read_text() == before
    code, out, _ = run(collect + ["--policy", "expert", "--episodes", "8"], capsys)  # the same run resumes
    assert code == 0 and "8 episodes" in out
    assert set(before.splitlines()) < set(demos.read_text().splitlines()) and len(demos.read_text().splitlines()) == 8
    fresh = tmp_path / "fresh.jsonl"  # and the file is the one an uninterrupted collection of 8 writes
    assert run(["collect", "--env", "tictactoe", "--out", str(fresh), "--policy", "expert", "--episodes", "8"],
               capsys)[0] == 0
    assert demos.read_bytes() == fresh.read_bytes()


def test_resume_compares_env_options_as_the_file_reads_them(tmp_path: Path) -> None:
    from turnrl.collect import _check_resumable, run_policy
    from turnrl.rollout.policies import ExpertPolicy

    out = tmp_path / "b.jsonl"
    first = run_policy(ExpertPolicy(), "bandit", episodes=2, env_opts={"arms": 3}, out=out)
    assert first[0].meta["env_opts"] == {"arms": 3}
    assert len(run_policy(ExpertPolicy(), "bandit", episodes=3, env_opts={"arms": 3}, out=out)) == 3
    with pytest.raises(TurnRLError, match=r'other env options \({"arms": 3}; this run: {"arms": 4}\)'):
        run_policy(ExpertPolicy(), "bandit", episodes=3, env_opts={"arms": 4}, out=out)
    t = first[0]
    t.meta["env_opts"] = {"means": [0.1, 0.9]}
    _check_resumable(out, {t.id: t}, [], "bandit", ExpertPolicy(), {"means": (0.1, 0.9)})  # a tuple reads back as a list
    t.meta["env_opts"] = {}
    _check_resumable(out, {t.id: t}, [], "bandit", ExpertPolicy(), {"arms": 10, "noise": "medium"})  # the defaults
    with pytest.raises(TurnRLError, match=r'other env options \({}; this run: {"arms": 4}\)'):
        _check_resumable(out, {t.id: t}, [], "bandit", ExpertPolicy(), {"arms": 4})
    del t.meta["env_opts"]  # written before env options were recorded
    _check_resumable(out, {t.id: t}, [], "bandit", ExpertPolicy(), {"arms": 4})


def test_a_model_folder_resumes_under_another_spelling(tmp_path: Path, tiny_dir: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from turnrl.collect import run_policy
    from turnrl.rollout import SamplingConfig, load_policy

    monkeypatch.chdir(tiny_dir.parent)
    out = tmp_path / "s.jsonl"
    sampling = SamplingConfig(temperature=0, max_new_tokens=8)
    first = run_policy(load_policy(f"{tiny_dir.name}/", sampling=sampling), "tictactoe", episodes=2, out=out)
    again = run_policy(load_policy(f"./{tiny_dir.name}", sampling=sampling), "tictactoe", episodes=3, out=out)
    assert [t.id for t in again[:2]] == [t.id for t in first] and len(out.read_text().splitlines()) == 3


def test_policy_name_typos_fail_at_once() -> None:
    from turnrl.rollout.policies import _check_not_a_typo, load_policy

    for typo, meant in (("exper", "expert"), ("ucbb", "ucb"), ("randm", "random"), ("tinny", "tiny")):
        with pytest.raises(TurnRLError, match=f"unknown policy '{typo}' \\(did you mean '{meant}'\\?\\)"):
            load_policy(typo)
    for hub_id in ("gpt2", "distilgpt2", "Qwen/Qwen2.5-0.5B-Instruct"):  # plain hub ids stay hub ids
        _check_not_a_typo(hub_id)


def test_config_values_are_checked_where_they_were_set(tmp_path: Path) -> None:
    from turnrl.train.ppo import PPOConfig
    from turnrl.train.preference import PreferenceConfig
    from turnrl.train.sft import SFTConfig

    for overrides, what in ((["lr=-1"], "override 'lr=-1': bad value for 'lr': must be a finite number >= 0"),
                            (["lr=.nan"], "'lr': must be a finite number"),
                            (["warmup_ratio=2"], "'warmup_ratio': must be in [0, 1]"),
                            (["max_length=0"], "'max_length': must be >= 1"),
                            (["history=-1"], "'history': must be >= 0"),
                            (["lora.r=-3"], "'lora.r': must be >= 1"),
                            (["train.lr=1e-4"], "unknown key 'train' (this config is flat: write 'lr' without 'train.')")):
        with pytest.raises(TurnRLError) as e:
            load_config(SFTConfig, overrides=overrides)
        assert what in str(e.value), str(e.value)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("loss: dmpo\nbeta: 0.1\ngamma: 1.5\n")
    with pytest.raises(TurnRLError, match=r"c\.yaml:3: bad value for 'gamma': must be in \(0, 1\]"):
        load_config(PreferenceConfig, cfg)
    with pytest.raises(TurnRLError, match="'beta': must be a finite number > 0"):
        load_config(PreferenceConfig, overrides=["beta=0"])
    with pytest.raises(TurnRLError, match="override 'ppo.gamma=2': unknown key 'ppo'.*'gamma' without 'ppo.'"):
        load_config(PPOConfig, overrides=["ppo.gamma=2"])
    from turnrl.train.archer import OnlineConfig
    from turnrl.train.preference_model import PreferenceModelConfig

    for config, override, what in ((PPOConfig, "gamma=2", "'gamma': must be in [0, 1]"),
                                   (PPOConfig, "clip_eps=0", "'clip_eps': must be a finite number > 0"),
                                   (OnlineConfig, "tau=1.5", "'tau': must be in [0, 1]"),
                                   (OnlineConfig, "bc_top=0", "'bc_top': must be in (0, 1]"),
                                   (OnlineConfig, "chai_k=0", "'chai_k': must be >= 1"),
                                   (PreferenceModelConfig, "eval_fraction=1", "'eval_fraction': must be in [0, 1)")):
        with pytest.raises(TurnRLError) as e:
            load_config(config, overrides=[override])
        assert f"override '{override}': bad value for {what}" in str(e.value), str(e.value)
    assert load_config(SFTConfig, overrides=["lr=0"]).lr == 0  # lr 0 is a valid no-op run
    cfg.write_text("lr: 0.1\nepochs: 2\nlr: 0.2\n")
    with pytest.raises(TurnRLError, match=r"c\.yaml:3: key 'lr' is set twice"):
        load_config(SFTConfig, cfg)
    with pytest.raises(TurnRLError, match="is a folder, not a config file"):
        load_config(SFTConfig, tmp_path)
    cfg.write_text("lora: {r: 0}\n")  # the file's bad value, not an override elsewhere in its section
    with pytest.raises(TurnRLError, match=r"c\.yaml:1: bad value for 'lora.r'"):
        load_config(SFTConfig, cfg, ["lora.dropout=0.1"])


def test_pipeline_configs_are_checked_before_any_stage(tmp_path: Path) -> None:
    from turnrl.pipelines.eto import EtoConfig
    from turnrl.pipelines.sppo import SPPOConfig

    a_file = tmp_path / "model.bin"
    a_file.write_text("x")
    for kwargs, what in ((dict(env="chess"), "unknown env 'chess'"),
                         (dict(env_opts={"opponnent": "minimax"}), "did you mean 'opponent'"),
                         (dict(env_opts={"opponent": "minimx"}), "minimx"),
                         (dict(model=str(tmp_path / "nomodel")), "model: model path not found"),
                         (dict(model=str(a_file)), "model: " + str(a_file) + ": is a file, not a model folder")):
        with pytest.raises(TurnRLError) as e:
            EtoConfig(out=str(tmp_path / "run"), **kwargs).check()  # type: ignore[arg-type]
        assert what in str(e.value), str(e.value)
    with pytest.raises(TurnRLError, match="unknown env 'chess'"):
        SPPOConfig(env="chess").check()
    with pytest.raises(TurnRLError, match="'samples_per_task': must be >= 2"):
        load_config(SPPOConfig, overrides=["samples_per_task=1"])
    for overrides, what in ((["history=-1"], "'history': must be >= 0"),
                            (["max_new_tokens=0"], "'max_new_tokens': must be >= 1"),
                            (["explore_temperature=-1"], "'explore_temperature': must be a finite number >= 0"),
                            (["sample_temperature=nan"], "'sample_temperature': must be a finite number >= 0"),
                            (["iterations=-1"], "'iterations': must be >= 0")):
        with pytest.raises(TurnRLError, match=what):
            load_config(EtoConfig, overrides=overrides)
    assert not (tmp_path / "run").exists()


def test_sft_data_without_agent_turns_says_so(tmp_path: Path, tiny_dir: Path) -> None:
    from turnrl.data.io import write_jsonl
    from turnrl.data.schema import Message, Trajectory
    from turnrl.train.sft import SFTConfig, train_sft

    data = tmp_path / "noagent.jsonl"
    write_jsonl(data, [Trajectory(id="t0", env="tictactoe", task_id="ttt-s0",
                                  messages=[Message("system", "Play."), Message("user", "board")])])
    with pytest.raises(TurnRLError, match="no trajectory has an agent"):
        train_sft(str(tiny_dir), data, tmp_path / "out", SFTConfig(max_steps=1))


def test_ensure_tiny_builds_once_when_processes_start_together(tmp_path: Path, monkeypatch) -> None:
    """Two callers that find no cached tiny model at once: one builds, the other waits and uses it
    (without the lock both built, and one deleted the folder the other was loading)."""
    import threading
    import time

    from turnrl.models import tiny

    built: list[Path] = []

    def slow_build(out: Path) -> Path:
        built.append(out)
        time.sleep(0.3)
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        return out

    monkeypatch.setenv("TURNRL_HOME", str(tmp_path))
    monkeypatch.setattr(tiny, "build_tiny", slow_build)
    got: list[Path] = []
    threads = [threading.Thread(target=lambda: got.append(tiny.ensure_tiny())) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(built) == 1 and got == [built[0], built[0]]


def test_tiny_corpus_is_pinned_to_the_cache_version() -> None:
    """``tiny`` is cached per machine under TINY_VERSION: a change to the text its tokenizer is trained
    on (an env's instruction or observations) must come with a new version, or machines that built
    the model before keep another model under the same name."""
    from turnrl.models import tiny

    got = tiny.corpus_sha256()
    assert got == tiny.TINY_CORPUS_SHA256, (
        f"the tiny model's corpus changed: bump TINY_VERSION (now {tiny.TINY_VERSION}) and set "
        f"TINY_CORPUS_SHA256 = {got!r}")


def test_scripts_report_bad_arguments_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """``run_script`` (the docs/ and scripts/ entry points): a bad argument is one line with the
    usage, a TurnRLError one line without it; both exit 1; a good run returns."""
    from turnrl.errors import run_script

    monkeypatch.setattr("sys.argv", ["/x/probe.py"])
    seen: list[list[str]] = []

    def main(args: list[str]) -> None:
        seen.append(args)
        if not args:
            raise ValueError("missing arguments")
        if args[0] == "gone":
            raise TurnRLError("model path not found: gone")
        int(args[0])

    for argv, expected in (([], "probe.py: missing arguments (usage: probe.py N)"),
                           (["x"], "probe.py: invalid literal for int() with base 10: 'x' (usage: probe.py N)"),
                           (["gone"], "probe.py: model path not found: gone")):
        with pytest.raises(SystemExit) as e:
            run_script(main, "probe.py N", argv)
        assert e.value.code == expected
    run_script(main, "probe.py N", ["3"])
    assert seen[-1] == ["3"]


def test_numbers_in_exponent_notation_are_floats(tmp_path: Path) -> None:
    """YAML 1.1 reads ``1e-5`` as a string; a ``dict`` setting (``env_opts``) kept it one, and the env
    refused ``noise: 1e-1``. Overrides and config files read it as the number it is."""
    from turnrl.config import parse_overrides, parse_value
    from turnrl.pipelines.eto import EtoConfig

    assert [parse_value(v) for v in ("1e-5", "2E4", "1.0e5", "-3e-1", "1e", "e5")] == [1e-5, 2e4, 1e5, -0.3, "1e", "e5"]
    assert parse_overrides(["env_opts.noise=1e-1"]) == {"env_opts": {"noise": 0.1}}
    cfg = tmp_path / "c.yaml"
    cfg.write_text("env_opts: {opponent: noisy, noise: 1e-1}\n")
    assert load_config(EtoConfig, cfg).env_opts == {"opponent": "noisy", "noise": 0.1}


def test_integers_are_read_as_yaml_1_2_reads_them(tmp_path: Path) -> None:
    """YAML 1.1 read ``seed=010`` as octal 8 and ``1:30`` as 90 (base 60), silently."""
    from turnrl.config import parse_value
    from turnrl.pipelines.eto import EtoConfig

    got = [parse_value(v) for v in ("010", "007", "-12", "1_000", "0x1f", "0o17", "1:30", "0b11", "-0x10", "+0o7")]
    assert got == [10, 7, -12, 1000, 31, 15, "1:30", 3, -16, 7]
    cfg = tmp_path / "c.yaml"
    cfg.write_text("seed: 010\n")
    assert load_config(EtoConfig, cfg, ["eval_episodes=020"]).seed == 10
    assert load_config(EtoConfig, cfg, ["eval_episodes=020"]).eval_episodes == 20


@pytest.mark.parametrize(("items", "message"), [
    (["lora.r=4", "lora=null"], "bad override 'lora=null': 'lora' is a section that 'lora.r=4' sets"),
    (["lora=null", "lora.r=4"], "bad override 'lora.r=4': 'lora' is set to a value by 'lora=null'"),
    (["a={b: 1}", "a.b.c=1"], "bad override 'a.b.c=1': 'a.b' is set to a value by 'a={b: 1}'"),
])
def test_an_override_that_sets_a_section_and_its_value_is_refused(items: list[str], message: str) -> None:
    """``lora.r=4 lora=null`` dropped ``r`` in silence (the later value replaced the section), and the other
    order said only that ``lora`` is not a section. Either is now one error naming both overrides."""
    from turnrl.config import parse_overrides
    from turnrl.train.core import TrainConfig

    with pytest.raises(TurnRLError, match=re.escape(message)):
        parse_overrides(items)
    with pytest.raises(TurnRLError, match=re.escape(message)):
        load_config(TrainConfig, None, items)
    # a later value of the same key, and sections that add keys, still merge
    assert parse_overrides(["lr=1", "lr=2", "a={b: 1}", "a.c=2", "a.d.e=3"]) == {"lr": 2, "a": {"b": 1, "c": 2, "d": {"e": 3}}}


def test_a_nested_override_keeps_the_rest_of_its_sections_defaults(tmp_path: Path) -> None:
    """``train.beta=0.2`` changes beta only: the pipeline's own default ``train`` settings (constant
    schedule, batch 16, ...) stay instead of falling back to the trainer's class defaults."""
    from turnrl.pipelines.compare import CompareConfig
    from turnrl.pipelines.eto import EtoConfig

    default = EtoConfig()
    cfg = load_config(EtoConfig, None, ["train.beta=0.2", "sft.lr=1e-3"])
    assert cfg.train == default.train.model_copy(update={"beta": 0.2})
    assert cfg.sft == default.sft.model_copy(update={"lr": 1e-3})
    file = tmp_path / "c.yaml"
    file.write_text("pipeline:\n  train:\n    beta: 0.3\n")
    nested = load_config(CompareConfig, file).pipeline.train
    assert nested == CompareConfig().pipeline.train.model_copy(update={"beta": 0.3})


def test_config_files_that_are_no_yaml_mapping_text_are_one_line(tmp_path: Path) -> None:
    from turnrl.train.sft import SFTConfig

    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(b"\xff\xfe\x00lr: 1\n")
    with pytest.raises(TurnRLError, match=r"c\.yaml: not a UTF-8 text file"):
        load_config(SFTConfig, cfg)
    cfg.write_text("? [a, b]\n: 1\n")  # a list as a key
    with pytest.raises(TurnRLError, match=r"c\.yaml:1: invalid YAML: found unhashable key"):
        load_config(SFTConfig, cfg)


def test_a_section_given_in_part_keeps_its_free_form_dicts_whole(tmp_path: Path) -> None:
    """Filling a partly given section from its default completes nested model sections only: a
    free-form dict given (env_opts) replaces the default's whole, so another env does not inherit
    tic-tac-toe's options."""
    from turnrl.pipelines.compare import CompareConfig

    file = tmp_path / "c.yaml"
    file.write_text("pipeline:\n  env: bandit\n  env_opts: {arms: 5}\n  train: {beta: 0.3}\n")
    cfg = load_config(CompareConfig, file)
    assert cfg.pipeline.env_opts == {"arms": 5}
    assert cfg.pipeline.train == CompareConfig().pipeline.train.model_copy(update={"beta": 0.3})
    assert cfg.pipeline.sft == CompareConfig().pipeline.sft


def test_yaml_merge_keys_load_and_a_key_set_twice_still_fails(tmp_path: Path) -> None:
    from turnrl.train.sft import SFTConfig

    cfg = tmp_path / "c.yaml"
    # a merge key: the anchored mapping's keys, a key set next to it overriding its value
    cfg.write_text("lr: &lr 0.001\nepochs: 2\n<<: {seed: 3, batch_size: 2}\nbatch_size: 4\n")
    c = load_config(SFTConfig, cfg)
    assert (c.lr, c.epochs, c.seed, c.batch_size) == (0.001, 2, 3, 4)
    from turnrl.pipelines.eto import EtoConfig

    # a merge into a nested section (a free-form env_opts dict)
    cfg.write_text("env: bandit\nenv_opts:\n  <<: &arms {arms: 5}\n  horizon: 7\n")
    assert load_config(EtoConfig, cfg).env_opts == {"arms": 5, "horizon": 7}
    cfg.write_text("<<: {seed: 3}\nlr: 0.1\nlr: 0.2\n")
    with pytest.raises(TurnRLError, match=r"c\.yaml:3: key 'lr' is set twice"):
        load_config(SFTConfig, cfg)
    cfg.write_text("<<: 3\n")
    with pytest.raises(TurnRLError, match=r"c\.yaml:1: invalid YAML"):
        load_config(SFTConfig, cfg)


def test_a_boolean_is_no_number(tmp_path: Path) -> None:
    """pydantic reads true as 1 for an int or float: batch_size=true trained with 1, lr=on with 1.0."""
    from turnrl.pipelines.compare import CompareConfig
    from turnrl.pipelines.eto import EtoConfig
    from turnrl.train.sft import SFTConfig

    for item, key in (("batch_size=true", "batch_size"), ("lr=on", "lr"), ("history=false", "history")):
        with pytest.raises(TurnRLError, match=rf"override '{item}': bad value for '{key}': must be a number, "
                                              r"not a boolean \(got (True|False)\)"):
            load_config(SFTConfig, None, [item])
    with pytest.raises(TurnRLError, match=r"'train\.beta': must be a number, not a boolean"):
        load_config(EtoConfig, None, ["train.beta=yes"])
    with pytest.raises(TurnRLError, match=r"'seeds': must be a number, not a boolean"):
        load_config(CompareConfig, None, ["seeds=[1, true]"])
    cfg = tmp_path / "c.yaml"
    cfg.write_text("epochs: 2\nlr: on\n")
    with pytest.raises(TurnRLError, match=r"c\.yaml:2: bad value for 'lr'"):
        load_config(SFTConfig, cfg)
    c = load_config(SFTConfig, None, ["only_success=true", "batch_size=4", "lr=1e-3", "history=null"])
    assert c.only_success is True and c.batch_size == 4 and c.lr == 1e-3 and c.history is None
    assert load_config(EtoConfig, None, ["self_play=true", "env_opts={flag: true}"]).env_opts == {"flag": True}


def test_a_missing_model_path_under_an_existing_folder_fails_at_once(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``models/nope`` with a ./models folder is a mistyped path, not a hub id (48 s of hub retries)."""
    from turnrl.models.loading import check_model_name, resolve_model_path
    from turnrl.pipelines.eto import EtoConfig

    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    with pytest.raises(TurnRLError, match=r"^model path not found: models/nope \(read as a local path because \./models exists; for the hub id, download it first"):
        resolve_model_path("models/nope")
    with pytest.raises(TurnRLError, match=r"^model: model path not found: models/nope \(read as a local path"):
        check_model_name("models/nope")
    with pytest.raises(TurnRLError, match=r"model: model path not found: models/nope"):
        EtoConfig(model="models/nope").check()  # before any pipeline work
    check_model_name("someorg/some-model")  # no ./someorg: a hub id, resolved when loaded
    assert resolve_model_path("someorg/some-model") == "someorg/some-model"


def test_offline_a_hub_id_not_in_the_cache_fails_before_any_work(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline, a hub id not downloaded failed only when the pipeline first loaded it (after the expert
    stage); one in the hub cache passes."""
    from huggingface_hub import constants

    from turnrl.models.loading import check_model_name
    from turnrl.pipelines.eto import EtoConfig

    cache = tmp_path / "hub"
    snapshot = cache / "models--someorg--cached" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (cache / "models--someorg--cached" / "refs").mkdir()
    (cache / "models--someorg--cached" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    check_model_name("someorg/absent", "base")  # online: the load fetches it (or fails) later
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    check_model_name("someorg/cached", "base")
    with pytest.raises(TurnRLError, match=rf"^base: cannot load 'someorg/absent' \(offline: hub id 'someorg/absent' "
                                          rf"is not in the hub cache {re.escape(str(cache))}\); download it first"):
        check_model_name("someorg/absent", "base")
    with pytest.raises(TurnRLError, match=r"^base: cannot load 'someorg/absent'"):
        EtoConfig(base="someorg/absent").check()


def test_sft_data_that_is_a_folder_says_so(tmp_path: Path) -> None:
    from turnrl.train.sft import load_trajectories

    (tmp_path / "data").mkdir()
    with pytest.raises(TurnRLError, match=r"data: is a directory, not a trajectory file$"):
        load_trajectories(tmp_path / "data")
    with pytest.raises(TurnRLError, match=r"x\.jsonl: no such file$"):
        load_trajectories(tmp_path / "x.jsonl")
    from turnrl.train.preference import PreferenceConfig, load_units

    with pytest.raises(TurnRLError, match=r"data: is a directory, not a pairs file$"):
        load_units(tmp_path / "data", None, PreferenceConfig())  # type: ignore[arg-type]


@pytest.mark.parametrize(("override", "message"), [
    ("heads=3", "must divide hidden (128) into equal attention heads (got 3)"),
    ("hidden=0", "must be >= 1 (got 0)"), ("head_hidden=-4", "must be >= 0 (got -4)"),
    ("max_action_tokens=0", "must be >= 1 (got 0)"), ("max_state_tokens=0", "must be >= 1 (got 0)"),
])
def test_critic_sizes_are_checked_up_front(override: str, message: str) -> None:
    """ArCHer's critic sizes: a traceback deep in the encoder, or (max_state_tokens=0, read as ids[-0:])
    a critic that silently kept the whole state, before; a one-line error naming the key now."""
    from turnrl.train.critic import CriticConfig

    key = override.split("=")[0]
    with pytest.raises(TurnRLError, match=rf"^override '{override}': bad value for '{key}': {re.escape(message)}$"):
        load_config(CriticConfig, overrides=[override])


def test_a_key_in_an_optional_section_gets_a_suggestion_and_a_union_names_no_type_tag() -> None:
    """``lora`` is ``LoraSettings | None``: its unknown keys got no "did you mean", and a bad value
    of a union field was named with the member pydantic tried (``lora.target_modules.list[str]``)."""
    from pydantic import ValidationError

    from turnrl.config import format_validation_error
    from turnrl.train.sft import SFTConfig

    def message(value: dict) -> str:
        with pytest.raises(ValidationError) as e:
            SFTConfig.model_validate(value)
        return format_validation_error(SFTConfig, e.value, "override")

    assert message({"lora": {"alpah": 3}}) == "override: unknown key 'lora.alpah' (did you mean 'alpha'?)"
    assert message({"lora": {"target_modules": 5}}).startswith("override: bad value for 'lora.target_modules': ")
    assert message({"lora": {"r": "x"}}).startswith("override: bad value for 'lora.r': ")
    assert message({"lr": "x"}).startswith("override: bad value for 'lr': ")


@pytest.mark.parametrize(("cls", "overrides", "message"), [
    ("eto", ["loss=dmpo", "train.label_smoothing=0.1"], r"^train\.label_smoothing applies to dpo \(cDPO\), not to dmpo$"),
    ("eto", ["loss=ipo", "train.label_smoothing=0.1"], r"^train\.label_smoothing applies to dpo \(cDPO\), not to ipo$"),
    ("sppo", ["train.label_smoothing=0.1"], r"^train\.label_smoothing applies to dpo \(cDPO\), not to sppo$"),
    ("sppo", ["train.sft_weight=0.5"], r"^train\.sft_weight applies to dpo, ipo and dmpo \(pairs\), not to sppo$"),
    ("eto", ["train.seed=5"], r"^train\.seed=5 is not used: the pipeline trains with its own seed \(0\); set seed"),
    ("eto", ["sft.seed=7"], r"^sft\.seed=7 is not used"),
    ("eto", ["history=1", "sft.history=2"], r"^sft\.history=2 is not used: the pipeline trains with its own history \(1\)"),
    ("sppo", ["train.history=3"], r"^train\.history=3 is not used"),
])
def test_pipeline_trainer_settings_no_training_reads_fail_before_any_stage(cls: str, overrides: list[str],
                                                                           message: str) -> None:
    """They used to be accepted: label_smoothing failed at the first preference training (after expert
    games, SFT, exploration and pairs), and a section's seed or history was replaced by the pipeline's."""
    from turnrl.pipelines.eto import EtoConfig
    from turnrl.pipelines.sppo import SPPOConfig

    config = {"eto": EtoConfig, "sppo": SPPOConfig}[cls]
    with pytest.raises(TurnRLError, match=message):
        load_config(config, None, overrides).check()
    ok = ["loss=dpo", "train.label_smoothing=0.1", "sft.seed=0", "sft.history=0", "train.history=null"]
    load_config(EtoConfig, None, ok).check()  # the defaults, and what dpo reads, pass


def test_compare_sppo_section_settings_no_training_reads_fail_before_any_stage() -> None:
    from turnrl.pipelines.compare import CompareConfig, _check

    config = str(Path(__file__).resolve().parents[1] / "configs" / "compare" / "tictactoe_sppo600.yaml")
    with pytest.raises(TurnRLError, match=r"^compare config, section sppo: train\.label_smoothing applies to dpo"):
        _check(load_config(CompareConfig, config, ["sppo.train.label_smoothing=0.1"]))
    with pytest.raises(TurnRLError, match=r"^compare config, section sppo: train\.seed=4 is not used: each row "
                                          r"trains with its seed of `seeds`; remove it$"):
        _check(load_config(CompareConfig, config, ["sppo.train.seed=4"]))
    with pytest.raises(TurnRLError, match=r"^pipeline\.sft\.history=2 is not used: every training takes "
                                          r"pipeline\.history; set pipeline\.history instead$"):
        _check(load_config(CompareConfig, config, ["pipeline.sft.history=2"]))
    with pytest.raises(TurnRLError, match=r"^pipeline\.train\.label_smoothing applies to dpo \(cDPO\), not to dmpo$"):
        _check(load_config(CompareConfig, config, ["methods=[sft,eto,dmpo]", "pipeline.train.label_smoothing=0.1"]))
    _check(load_config(CompareConfig, config, ["methods=[sft,sppo_dpo]", "sppo.train.label_smoothing=0.1"]))
    _check(load_config(CompareConfig, config, ["methods=[sft,eto]", "pipeline.train.label_smoothing=0.1"]))


def test_an_empty_instruction_is_refused_not_read_as_unset(tmp_path: Path, capsys) -> None:
    """``instruction=`` (or ``--instruction ""``) was read as no instruction given: the env's own was
    used, silently."""
    out = tmp_path / "e.json"
    code, _, err = run(["eval", "--env", "tictactoe", "--policy", "random", "--out", str(out), "--instruction", " "],
                       capsys)
    assert "'instruction': empty; leave it out to use the env's instruction" in one_line_error(code, err)
    code, _, err = run(["train", "ppo", "--model", "tiny", "--env", "bandit", "--out", str(tmp_path / "p"),
                        "instruction="], capsys)
    assert "override 'instruction='" in one_line_error(code, err)
    assert not out.exists() and not (tmp_path / "p").exists()


def test_validate_refuses_an_empty_file_and_a_symlink_loop(tmp_path: Path, capsys) -> None:
    """An empty file passed `turnrl data validate` (0 records, exit 0), and a symlink loop gave a
    traceback."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    code, _, err = run(["data", "validate", str(empty)], capsys)
    assert one_line_error(code, err).endswith("empty.jsonl: holds no records")
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    code, _, err = run(["data", "validate", str(tmp_path / "a")], capsys)
    assert "Too many levels of symbolic links" in one_line_error(code, err)
