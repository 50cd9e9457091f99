"""Mixed precision on a GPU, measured: the numbers of docs/scaling.md's "One GPU" table.

    python scripts/gpu_precision_check.py WORKDIR [--old-src DIR]

On the tiny model (built in WORKDIR) with ``mixed_precision=bf16``: the dtype of the weights
an SFT run saves, its loss over 3 steps of lr 1e-5 next to a float32 CPU run's and the share
of the weights that run moves which it moves too; DPO's first loss minus log 2 (0 when the
reference pass runs at the policy's precision); PPO's ``ratio_max_dev`` on the first
minibatch of each of 2 iterations. ``--old-src`` (the ``src`` folder of another checkout,
e.g. ``git archive <commit> src | tar -x -C /tmp/old``) runs the same commands with that
code too. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

from safetensors.torch import load_file

from turnrl.models.tiny import build_tiny


def _rows(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workdir", type=Path)
    ap.add_argument("--old-src", type=Path, default=None, help="another checkout's src folder, run too")
    args = ap.parse_args()
    work: Path = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    from turnrl.models.loading import model_ref  # ./tiny for work=. (the name tiny is the embedded model)

    tiny = build_tiny(work / "tiny", episodes_per_split=10)

    def run(code: str, argv: list[str], cpu: bool = False) -> None:
        env = {**os.environ, "TURNRL_PROGRESS": "0", "TURNRL_HOME": str(work / f"home-{code}")}
        if code == "old":
            env["PYTHONPATH"] = os.pathsep.join([str(args.old_src), os.environ.get("PYTHONPATH", "")])
        if cpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
        subprocess.run([sys.executable, "-m", "turnrl", *argv], env=env, check=True, capture_output=True)

    for policy, opponent in (("expert", "noisy"), ("expert", "random"), ("random", "random")):
        run("new", ["collect", "--env", "tictactoe", "--policy", policy, "--episodes", "16" if opponent == "noisy" else "40",
                    "--env-opt", f"opponent={opponent}", "--out", str(work / f"{policy}-{opponent}.jsonl")])
    run("new", ["pairs", "--expert", str(work / "expert-random.jsonl"), "--explored", str(work / "random-random.jsonl"),
                "--out", str(work / "pairs.jsonl")])
    sft = ["train", "sft", "--model", model_ref(tiny), "--data", str(work / "expert-noisy.jsonl"), "max_steps=3",
           "batch_size=4", "row_tokens=1024", "warmup_ratio=0", "lr=1e-5"]
    run("new", [*sft, "--out", str(work / "sft-cpu")], cpu=True)
    start = load_file(str(tiny / "model.safetensors"))
    ref = load_file(str(work / "sft-cpu" / "model" / "model.safetensors"))
    should = {k: ref[k] != start[k].float() for k in ref}
    moved_by_fp32 = sum(int(m.sum()) for m in should.values())
    res: dict = {"cpu_fp32_sft_loss": [r["loss"] for r in _rows(work / "sft-cpu")]}
    for code in ("old", "new") if args.old_src else ("new",):
        out = work / f"sft-{code}"
        run(code, [*sft, "--out", str(out), "mixed_precision=bf16"])
        w = load_file(str(out / "model" / "model.safetensors"))
        res[f"{code}_sft_dtype"] = sorted({str(v.dtype) for v in w.values()})
        res[f"{code}_sft_loss"] = [r["loss"] for r in _rows(out)]
        res[f"{code}_sft_moved_share"] = sum(
            int((should[k] & (w[k].float() != start[k].float())).sum()) for k in should) / moved_by_fp32
        out = work / f"dpo-{code}"
        run(code, ["train", "dpo", "--model", model_ref(tiny), "--pairs", str(work / "pairs.jsonl"), "--out", str(out),
                   "max_steps=2", "batch_size=4", "lr=1e-4", "warmup_ratio=0", "mixed_precision=bf16"])
        res[f"{code}_dpo_step1_loss_minus_log2"] = _rows(out)[0]["loss"] - math.log(2)
        out = work / f"ppo-{code}"
        run(code, ["train", "ppo", "--model", model_ref(tiny), "--env", "tictactoe", "--out", str(out),
                   "env_opts.opponent=random", "instruction=Tic-tac-toe, you are X. Reply ACTION=<cell>.",
                   "iterations=2", "episodes_per_iter=8", "num_envs=8", "minibatches=2", "ppo_epochs=1",
                   "max_new_tokens=4", "save_every=2", "lr=1e-4", "row_tokens=1024", "mixed_precision=bf16"])
        res[f"{code}_ppo_first_minibatch_ratio_max_dev"] = [r.get("ratio_max_dev") for r in _rows(out)][::2]
    print(json.dumps(res))


if __name__ == "__main__":
    main()
