"""turnrl's DPO against TRL's ``DPOTrainer``, end to end, on single-turn pairs.

Both trainers get the same policy (the tiny model with perturbed weights, so that it differs
from the reference), the same reference (the tiny model), the same beta and the same pairs,
and run one optimizer step over the whole data set as one batch with learning rate 0; the
DPO loss and the gradient norm each logs for that step must agree to 1e-4.

How the data is made the same computation:

* turnrl reads pairs of one-turn trajectories (system, user, assistant) and tokenizes them
  with :class:`~turnrl.tokenization.ChatFormat`: the trained tokens are the assistant content
  and the end-of-turn token ``<|im_end|>``.
* TRL gets the *non-conversational* form of the same text: ``prompt`` is the chat template's
  rendering of system + user with the generation prompt, ``chosen``/``rejected`` are the
  assistant contents followed by the end-of-turn text. (TRL's conversational form would also
  train on the newline the ChatML template writes after ``<|im_end|>``, which is not an
  agent token.) TRL appends EOS only when a completion does not already end with it; it ends
  with it here. The test checks that TRL's tokenized ``prompt_ids + chosen_ids`` equal
  turnrl's tokens and that TRL's completion mask equals turnrl's action mask.
* No truncation (sequences are far below both ``max_length`` defaults), no dropout (the tiny
  model has none; TRL also disables it), fp32 on both sides (TRL's ``bf16`` default is turned
  off), both losses the mean over pairs, both grad norms the norm before clipping.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from turnrl.data.io import write_jsonl
from turnrl.data.schema import Message, Pair, Trajectory
from turnrl.tokenization import ChatFormat

BETA = 0.3

SYSTEM = "You play tic-tac-toe as X. Answer with a thought and an action."
CASES = [  # (board observation, chosen action, rejected action)
    ("Board:\n. . .\n. . .\n. . .\nYour move.", "Thought: take the centre.\nAction: 5",
     "Thought: corner.\nAction: 1"),
    ("Board:\nX . .\n. O .\n. . .\nYour move.", "Thought: opposite corner.\nAction: 9",
     "Thought: I will play an edge square now.\nAction: 2"),
    ("Board:\nX O .\n. X .\n. . O\nYour move.", "Thought: block and fork.\nAction: 4", "Action: 3"),
    ("Board:\nO . X\n. X .\n. . O\nYour move.", "Thought: win on the diagonal.\nAction: 7",
     "Thought: no idea, random move.\nAction: 8"),
    ("Board:\n. . .\n. X .\nO . .\nYour move.", "Thought: corner opposite O.\nAction: 3",
     "Thought: edge.\nAction: 6"),
]


def _traj(i: int, obs: str, answer: str, source: str) -> Trajectory:
    msgs = [Message("system", SYSTEM), Message("user", obs), Message("assistant", answer, action=answer[-1])]
    return Trajectory(id=f"t{i}-{source}", env="tictactoe", task_id=f"t{i}", messages=msgs, rewards=[0.0],
                      source=source)


def _perturbed_policy(tiny_dir: Path, out: Path) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_dir).save_pretrained(out)
    return out


def _trl_step(policy_dir: Path, ref_dir: Path, rows: list[dict[str, str]], out: Path,
              precompute: bool) -> tuple[dict[str, Any], Any]:
    datasets = pytest.importorskip("datasets")
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    logged: dict[str, Any] = {}

    class Capture(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
                   **kw: Any) -> None:
            if logs and "loss" in logs:
                logged.update(logs)

    args = DPOConfig(
        output_dir=str(out), beta=BETA, learning_rate=0.0, per_device_train_batch_size=len(rows), max_steps=1,
        logging_steps=1, save_strategy="no", report_to="none", bf16=False, fp16=False,
        precompute_ref_log_probs=precompute, seed=0, disable_tqdm=True, dataloader_num_workers=0,
    )
    trainer = DPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32),
        ref_model=AutoModelForCausalLM.from_pretrained(ref_dir, dtype=torch.float32),
        args=args,
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(policy_dir),
        callbacks=[Capture()],
    )
    tokenized = trainer.train_dataset
    trainer.train()
    return logged, tokenized


@pytest.mark.parametrize("precompute", [False, True], ids=["ref-model", "precompute-ref"])
def test_dpo_loss_and_first_step_grad_norm_match_trl(tiny_dir: Path, tmp_path: Path, monkeypatch,
                                                     precompute: bool) -> None:
    pytest.importorskip("trl", reason="trl is a benchmark/test extra")
    from transformers import AutoTokenizer

    from turnrl.train import preference

    monkeypatch.setenv("TURNRL_HOME", str(tmp_path / "home"))
    torch.manual_seed(0)
    policy_dir = _perturbed_policy(tiny_dir, tmp_path / "policy")
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    chat = ChatFormat(tok)
    assert chat.eot_text == tok.eos_token == "<|im_end|>"

    pairs = [Pair(f"t{i}", _traj(i, obs, c, "expert"), _traj(i, obs, r, "policy"))
             for i, (obs, c, r) in enumerate(CASES)]
    write_jsonl(tmp_path / "pairs.jsonl", pairs)
    rows = []
    for obs, c, r in CASES:
        prompt = tok.apply_chat_template([{"role": "system", "content": SYSTEM}, {"role": "user", "content": obs}],
                                         tokenize=False, add_generation_prompt=True)
        rows.append({"prompt": prompt, "chosen": c + chat.eot_text, "rejected": r + chat.eot_text})

    theirs, tokenized = _trl_step(policy_dir, tiny_dir, rows, tmp_path / "trl", precompute)

    # the same tokens, and the same trained tokens, on both sides
    for pair, ex in zip(pairs, tokenized, strict=True):
        for side, traj in (("chosen", pair.chosen), ("rejected", pair.rejected)):
            enc = chat.encode(traj.messages)
            assert enc is not None
            end = max(j for j, m in enumerate(enc.action_mask) if m) + 1  # turnrl's tail after it is context
            assert ex["prompt_ids"] + ex[f"{side}_ids"] == enc.input_ids[:end]
            assert [0] * len(ex["prompt_ids"]) + [1] * len(ex[f"{side}_ids"]) == enc.action_mask[:end]

    cfg = preference.PreferenceConfig(loss="dpo", beta=BETA, lr=0.0, max_steps=1, batch_size=len(pairs),
                                      ref_model=str(tiny_dir), seed=0)
    preference.train_preference(str(policy_dir), tmp_path / "pairs.jsonl", tmp_path / "ours", cfg)
    ours = json.loads((tmp_path / "ours" / "metrics.jsonl").read_text().splitlines()[0])

    assert abs(ours["loss"] - 0.6931) > 1e-3  # policy != reference: not the trivial log 2
    assert ours["loss"] == pytest.approx(theirs["loss"], abs=1e-4)
    assert ours["grad_norm"] > 1e-3
    assert ours["grad_norm"] == pytest.approx(theirs["grad_norm"], abs=1e-4)
    assert ours["accuracy"] == pytest.approx(theirs["rewards/accuracies"], abs=1e-6)
    assert ours["reward_margin"] == pytest.approx(theirs["rewards/margins"], abs=1e-4)
