"""SFT on the trainer core: exact accumulation and kill-and-resume on the tiny model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from turnrl.collect import run_policy
from turnrl.data.io import write_jsonl
from turnrl.rollout import ExpertPolicy
from turnrl.train.sft import SFTConfig, train_sft


@pytest.fixture(scope="module")
def demos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("demos") / "demos.jsonl"
    write_jsonl(path, run_policy(ExpertPolicy(), "tictactoe", episodes=48, env_opts={"opponent": "noisy"}))
    return path


def losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_batch_8x1_equals_batch_2x4(tiny_dir: Path, demos: Path, tmp_path: Path) -> None:
    common = {"max_steps": 4, "lr": 1e-3, "row_tokens": 1024, "warmup_ratio": 0.0}
    a = train_sft(str(tiny_dir), demos, tmp_path / "a", SFTConfig(batch_size=8, grad_accum=1, **common))
    b = train_sft(str(tiny_dir), demos, tmp_path / "b", SFTConfig(batch_size=2, grad_accum=4, **common))
    la, lb = losses(tmp_path / "a"), losses(tmp_path / "b")
    assert len(la) == 4 and la == pytest.approx(lb, abs=2e-5)
    assert la[-1] < la[0]
    from transformers import AutoModelForCausalLM

    wa = AutoModelForCausalLM.from_pretrained(a.model_dir).state_dict()
    wb = AutoModelForCausalLM.from_pretrained(b.model_dir).state_dict()
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-5


def _cmd(tiny_dir: Path, demos: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "turnrl", "train", "sft", "--model", str(tiny_dir), "--data", str(demos),
            "--out", str(out), "max_steps=14", "batch_size=4", "save_every=3", "lr=1e-3", "row_tokens=1024", *extra]


@pytest.mark.slow
def test_sigkill_mid_training_then_resume_matches_uninterrupted(tiny_dir: Path, demos: Path, tmp_path: Path) -> None:
    env = {**os.environ, "TURNRL_PROGRESS": "0"}
    ref = tmp_path / "ref"
    subprocess.run(_cmd(tiny_dir, demos, ref), check=True, env=env, capture_output=True)

    out = tmp_path / "killed"
    proc = subprocess.Popen(_cmd(tiny_dir, demos, out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 7:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "summary.json").exists(), "the run finished before it could be killed"
    # without --resume the directory is refused; with it, the run continues
    again = subprocess.run(_cmd(tiny_dir, demos, out), env=env, capture_output=True, text=True)
    assert again.returncode != 0 and "--resume" in again.stderr
    subprocess.run([*_cmd(tiny_dir, demos, out), "--resume"], check=True, env=env, capture_output=True)

    assert losses(out) == pytest.approx(losses(ref), abs=1e-5)
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == list(range(1, 15))
    from transformers import AutoModelForCausalLM

    wa = AutoModelForCausalLM.from_pretrained(ref / "model").state_dict()
    wb = AutoModelForCausalLM.from_pretrained(out / "model").state_dict()
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-5
    assert all(torch.isfinite(v).all() for v in wb.values())


def test_resume_accepts_another_save_cadence_and_a_finished_out_is_left_untouched(tiny_dir: Path, demos: Path,
                                                                                   tmp_path: Path) -> None:
    """``save_every`` / ``log_every`` do not change what SFT computes, so a resume may change them; a run
    into a folder that holds a finished run is refused before anything there is rewritten."""
    from turnrl.errors import TurnRLError

    common = {"max_steps": 2, "lr": 1e-3, "row_tokens": 1024, "batch_size": 8}
    first = train_sft(str(tiny_dir), demos, tmp_path / "a", SFTConfig(save_every=1, **common))
    stats = tmp_path / "a" / "data_stats.json"
    stats.write_text("{}")  # a marker: a refused run must not rewrite it
    again = train_sft(str(tiny_dir), demos, tmp_path / "a", SFTConfig(save_every=5, log_every=2, **common),
                      resume=True)
    assert again.final_loss == pytest.approx(first.final_loss)
    stats.write_text("{}")
    with pytest.raises(TurnRLError, match="already holds a run"):
        train_sft(str(tiny_dir), demos, tmp_path / "a", SFTConfig(**common))
    assert stats.read_text() == "{}"
    # a resume under another config is refused before data_stats.json is rewritten (it was rewritten
    # first, so the finished run described data it never trained on)
    with pytest.raises(TurnRLError, match="the config changed since this checkpoint"):
        train_sft(str(tiny_dir), demos, tmp_path / "a", SFTConfig(**{**common, "lr": 2e-3}), resume=True)
    assert stats.read_text() == "{}"


def test_a_model_or_adapter_folder_of_no_run_in_out_is_refused_not_replaced(tiny_dir: Path, demos: Path,
                                                                            tmp_path: Path) -> None:
    """The final save replaces OUT/model and OUT/adapter: in a folder that holds no run they may be the
    user's (``--model proj/model --out proj`` used to replace the input model itself)."""
    import shutil

    from turnrl.errors import TurnRLError

    proj = tmp_path / "proj"
    shutil.copytree(tiny_dir, proj / "model")
    (proj / "model" / "NOTES.txt").write_text("mine")
    common = {"max_steps": 1, "lr": 1e-3, "row_tokens": 1024, "batch_size": 8}
    for resume in (False, True):  # --resume with no checkpoint starts over: it replaced the input model
        with pytest.raises(TurnRLError, match=r"proj/model: exists and is no run's output"):
            train_sft(str(proj / "model"), demos, proj, SFTConfig(**common), resume=resume)
    assert (proj / "model" / "NOTES.txt").read_text() == "mine" and not (proj / "data_stats.json").exists()
    (tmp_path / "q" / "adapter").mkdir(parents=True)
    with pytest.raises(TurnRLError, match=r"q/adapter: exists and is no run's output"):
        train_sft(str(tiny_dir), demos, tmp_path / "q", SFTConfig(**common))
    train_sft(str(tiny_dir), demos, tmp_path / "fresh", SFTConfig(**common))  # an empty or new folder trains
    # a run killed in its final save (model/ written, no summary, no checkpoint) resumes over its own model/
    (tmp_path / "fresh" / "summary.json").unlink()
    shutil.rmtree(tmp_path / "fresh" / "checkpoints", ignore_errors=True)
    assert (tmp_path / "fresh" / "model").is_dir()
    train_sft(str(tiny_dir), demos, tmp_path / "fresh", SFTConfig(**common), resume=True)
    assert (tmp_path / "fresh" / "summary.json").is_file()


def test_load_trajectories_reads_an_eto_exploration_output_and_names_what_is_no_file(tmp_path: Path) -> None:
    """ETO writes each exploration output as one pretty-printed object (``<task id>.json``), which
    ``import-eto`` reads; ``train sft --data`` used to send it to the JSONL reader."""
    from turnrl.errors import TurnRLError
    from turnrl.train.sft import load_trajectories

    item = {"conversations": [{"from": "human", "value": "Board"}, {"from": "gpt", "value": "Thought: t\nAction: 4"}],
            "meta": {"reward": 1.0}}
    path = tmp_path / "12.json"
    path.write_text(json.dumps(item, indent=2))
    (t,) = load_trajectories(path)
    assert t.task_id == "12" and t.success and t.messages[-1].action == "4"
    with pytest.raises(TurnRLError, match=r"^/dev/null: not a regular file$"):
        load_trajectories("/dev/null")
    cut = tmp_path / "demos.json"  # turnrl lines in a .json file, the first cut short: named as turnrl's
    cut.write_text('{"schema": "turnrl.trajectory/v1", "id": "a", "messages": [\n{"schema": "x"}\n')
    with pytest.raises(TurnRLError, match=r"demos\.json:1: invalid JSON"):
        load_trajectories(cut)


def test_load_trajectories_names_a_file_that_is_not_utf8(tmp_path: Path) -> None:
    import gzip

    from turnrl.errors import TurnRLError
    from turnrl.train.sft import load_trajectories

    path = tmp_path / "demos.jsonl"
    path.write_bytes(gzip.compress(b'{"task_id": "t"}\n' * 50))
    with pytest.raises(TurnRLError, match=str(path)):
        load_trajectories(path)


def test_a_history_window_trains_each_turn_once_in_its_own_view(tiny_tokenizer) -> None:
    """With ``history`` each turn is its own sequence, the context as the agent had it, and only that turn
    carries the loss: an earlier turn shown in a later view is context (else it trained once per view)."""
    from turnrl.agent.prompting import agent_view
    from turnrl.tokenization import ChatFormat
    from turnrl.train.sft import encode_trajectories

    chat = ChatFormat(tiny_tokenizer)
    traj = run_policy(ExpertPolicy(), "tictactoe", episodes=1, env_opts={"opponent": "random"})[0]
    assert traj.num_turns >= 3
    for history in (0, 1):
        examples, stats = encode_trajectories([traj], chat, max_length=4096, history=history)
        assert len(examples) == traj.num_turns and stats["skipped_too_long"] == 0
        for turn, enc in enumerate(examples):
            trained = {t for t, m in zip(enc.turn_index, enc.action_mask, strict=True) if m}
            assert trained == {turn}  # the turn's own tokens only, numbered as in the whole episode
            view, _ = agent_view(traj.messages, turn, history)
            assert enc.input_ids[: len(chat.prompt_ids(view[:-1]))] == chat.prompt_ids(view[:-1])
    (whole,) = encode_trajectories([traj], chat, max_length=4096)[0]
    assert {t for t, m in zip(whole.turn_index, whole.action_mask, strict=True) if m} == set(range(traj.num_turns))
