"""Preference-training throughput: turnrl's DPO vs TRL's ``DPOTrainer`` on multi-turn pairs.

Data: the tiny model's tokenizer, tic-tac-toe against the minimax opponent, ETO pairs
(:func:`turnrl.data.pairs.trajectory_pairs`) of the minimax expert's game (chosen, a draw)
against a random player's game of the same task (rejected, usually a loss). Each game is a
multi-turn conversation: the system prompt (the task instruction, plus ``--shots`` expert
example games as in ETO's one-shot prompts), the first board, then agent turns and boards.

How TRL gets the pairs: TRL's DPO takes prompt / chosen / rejected. The prompt is the
longest run of messages the two games share (system prompt and first board, conversational
form, with the generation prompt); chosen and rejected are the rest of each game as a list of
messages. TRL's completion mask then covers the observations (boards) after the first turn
too, so TRL trains on observation tokens that turnrl (which trains on agent turns only)
leaves out of the loss: the same tokens are computed, the losses differ. TRL still computes
its prompt twice per pair (once with chosen, once with rejected) and pads every sequence of a
batch to the longest; turnrl computes the shared prefix once per pair and packs without
padding (``turnrl.train.forward.pack_shared``).

"Trained tokens" are counted the same way for every configuration: the tokens of the pairs'
chosen and rejected sequences taken separately (prompt + completion each), times the epochs,
whatever a trainer actually computes. Tokens/s is that count over the time of the whole job:
loading the model, tokenizing, reference log-probs, training and saving the model. The time
is the job's *CPU time* (user + system, all threads of its process) on a CPU, where every
process runs with one thread: on a shared machine, wall time mostly measures the other
jobs, while CPU time measures the work done; on an idle machine the two agree. Wall times are
printed too. On a GPU the time is wall time (``--clock wall``).

Configurations (the same model, pairs, batch size 8, learning rate, one epoch, fp32):

* ``turnrl``: ``turnrl train dpo`` defaults (shared-prefix packing, reference log-probs
  precomputed once, LM head only on agent tokens);
* ``trl-default``: ``DPOConfig`` defaults (a reference model copy run every step, gradient
  checkpointing on); TRL's ``bf16=True`` default is switched off to compare the same precision;
* ``trl-best``: the fastest TRL settings for this job: ``precompute_ref_log_probs=True`` and
  ``gradient_checkpointing=False`` (turnrl does not checkpoint either). TRL 1.16's
  ``padding_free`` is disabled in DPO ("temporarily unavailable": it warns and pads), so it
  cannot be part of it.

Each configuration runs in its own process (one process tree, ``OMP_NUM_THREADS=1`` for
all), so that its peak memory can be measured: the peak resident set size minus the resident
set size before the job starts (on a GPU: ``torch.cuda.max_memory_allocated``). With
``--repeats N`` the configurations run N times in alternating order and the fastest run of
each counts.

    python benchmarks/preference_throughput.py [--pairs 64] [--shots 1] [--repeats 1] [--quick]

The last line of output is one JSON object with ``ratio``: turnrl's tokens/s over those of
the faster of the two TRL configurations *as measured* (``trl-best`` is TRL's best setting on
paper; on a CPU it is not always the faster one), and ``ratio_vs_trl_best`` /
``ratio_vs_trl_default``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import positive, run_main  # beside this script

CONFIGS = ("turnrl", "trl-default", "trl-best")
OPPONENT = {"opponent": "minimax"}


# ------------------------------------------------------------------------------ data


def _shots_text(k: int) -> str:
    """``k`` expert games written out as an in-context example (ETO-style one-shot prompt)."""
    from turnrl.collect import run_policy
    from turnrl.rollout import ExpertPolicy

    games = run_policy(ExpertPolicy(), "tictactoe", split="seen", episodes=k, env_opts=OPPONENT, seed=1)
    parts = []
    for i, g in enumerate(games):
        lines = [f"Example game {i + 1}:"]
        for m in g.messages[1:]:
            lines.append(("Observation: " if m.role == "user" else "") + m.content)
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def build_data(work: Path, num_pairs: int, shots: int) -> dict[str, Any]:
    """Write ``pairs.jsonl`` (turnrl) and ``trl.jsonl`` (prompt/chosen/rejected) to ``work``."""
    from dataclasses import replace

    from turnrl.collect import run_policy
    from turnrl.data.io import write_jsonl
    from turnrl.data.pairs import trajectory_pairs
    from turnrl.data.schema import Message
    from turnrl.models.loading import load_tokenizer
    from turnrl.rollout import ExpertPolicy, RandomPolicy
    from turnrl.tokenization import ChatFormat

    pairs: list[Any] = []
    episodes = max(16, int(num_pairs * 1.3))
    seed = 0
    while len(pairs) < num_pairs:
        experts = run_policy(ExpertPolicy(), "tictactoe", episodes=episodes, env_opts=OPPONENT, seed=seed)
        explored = run_policy(RandomPolicy(), "tictactoe", episodes=episodes, env_opts=OPPONENT, seed=seed)
        pairs += trajectory_pairs(experts, explored)
        seed += 1
    pairs = pairs[:num_pairs]
    if shots:
        extra = "\n\n" + _shots_text(shots)

        def with_shots(t: Any) -> Any:
            sys_msg = t.messages[0]
            return replace(t, messages=[Message("system", sys_msg.content + extra), *t.messages[1:]])

        pairs = [replace(p, chosen=with_shots(p.chosen), rejected=with_shots(p.rejected)) for p in pairs]
    write_jsonl(work / "pairs.jsonl", pairs)

    chat = ChatFormat(load_tokenizer(str(work / "model")))
    rows, seq_tokens, prefix_tokens, agent_tokens = [], 0, 0, 0
    for p in pairs:
        a = [{"role": m.role, "content": m.content} for m in p.chosen.messages]
        b = [{"role": m.role, "content": m.content} for m in p.rejected.messages]
        k = 0
        while k < min(len(a), len(b)) and a[k] == b[k]:
            k += 1
        while k > 0 and not (k < len(a) and k < len(b) and a[k]["role"] == b[k]["role"] == "assistant"):
            k -= 1  # the prompt ends right before an assistant turn of both games
        rows.append({"prompt": a[:k], "chosen": a[k:], "rejected": b[k:]})
        ea, eb = chat.encode(p.chosen.messages), chat.encode(p.rejected.messages)
        assert ea is not None and eb is not None
        seq_tokens += len(ea.input_ids) + len(eb.input_ids)
        agent_tokens += sum(ea.action_mask) + sum(eb.action_mask)
        prefix_tokens += len(chat.prompt_ids(a[:k]))
    with open(work / "trl.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return {"pairs": len(pairs), "sequence_tokens": seq_tokens, "shared_prefix_tokens": prefix_tokens,
            "agent_tokens": agent_tokens, "mean_pair_tokens": round(seq_tokens / len(pairs), 1),
            "mean_turns": round(sum(p.chosen.num_turns + p.rejected.num_turns for p in pairs) / (2 * len(pairs)), 2)}


# ---------------------------------------------------------------------------- workers


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _run_turnrl(work: Path, out: Path, args: argparse.Namespace) -> None:
    from turnrl.train.preference import PreferenceConfig, train_preference

    os.environ["TURNRL_HOME"] = str(out / "home")  # a cold reference cache
    cfg = PreferenceConfig(loss="dpo", lr=args.lr, epochs=args.epochs, batch_size=args.batch_size, beta=0.1,
                           seed=0)
    train_preference(str(work / "model"), work / "pairs.jsonl", out / "run", cfg)


def _run_trl(work: Path, out: Path, args: argparse.Namespace, best: bool) -> None:
    import datasets
    from trl import DPOConfig, DPOTrainer

    rows = [json.loads(x) for x in (work / "trl.jsonl").read_text().splitlines()]
    cfg = DPOConfig(
        output_dir=str(out / "run"), beta=0.1, learning_rate=args.lr, num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch_size, bf16=False, max_length=None, report_to="none",
        save_strategy="no", logging_steps=10, seed=0, disable_tqdm=True,
        precompute_ref_log_probs=best, gradient_checkpointing=not best,
    )
    datasets.disable_caching()
    datasets.disable_progress_bars()
    trainer = DPOTrainer(model=str(work / "model"), args=cfg, train_dataset=datasets.Dataset.from_list(rows))
    trainer.train()
    trainer.save_model(str(out / "run" / "model"))


def worker(name: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import transformers

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    # Import everything both sides load lazily before the clock starts: import time is not
    # training throughput (and it varies most on a shared machine).
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM  # noqa: F401

    import turnrl.train.preference  # noqa: F401

    AutoConfig.from_pretrained(work / "model")
    AutoTokenizer.from_pretrained(work / "model")

    if name != "turnrl":
        import datasets  # noqa: F401
        import trl  # noqa: F401

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    out = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=work))
    base = _rss_kb()
    u0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    if name == "turnrl":
        _run_turnrl(work, out, args)
    else:
        _run_trl(work, out, args, best=name == "trl-best")
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    u1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (u1.ru_utime - u0.ru_utime) + (u1.ru_stime - u0.ru_stime)
    res = {"config": name, "wall_s": round(seconds, 3), "cpu_s": round(cpu, 3),
           "peak_rss_delta_mb": round((u1.ru_maxrss - base) / 1024, 1)}
    if cuda:
        res["peak_cuda_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return res


# ------------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=positive, default=64)
    ap.add_argument("--shots", type=int, default=1, help="expert example games in the system prompt")
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--repeats", type=positive, default=1)
    ap.add_argument("--quick", action="store_true", help="32 pairs, one repeat")
    ap.add_argument("--model", default=None, help="model directory (default: a freshly built tiny model)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--clock", choices=("cpu", "wall"), default=None,
                    help="time measure (default: cpu without a GPU, wall with one)")
    ap.add_argument("--worker", choices=CONFIGS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.pairs, args.repeats = 32, 1

    if args.worker:
        print(json.dumps(worker(args.worker, Path(args.workdir), args)))
        return
    import importlib.util

    missing = [m for m in ("trl", "datasets") if importlib.util.find_spec(m) is None]
    if missing:  # the peer is not installed: say so, as rollout_engines does without a GPU
        reason = f"needs {' and '.join(missing)}: pip install -e '.[bench]'"
        print(f"preference_throughput: skipped ({reason})")
        print(json.dumps({"benchmark": "preference_throughput", "skipped": reason}))
        return

    import shutil

    work = Path(args.workdir or tempfile.mkdtemp(prefix="pref-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.model:
        shutil.copytree(args.model, work / "model", dirs_exist_ok=True)
    elif not (work / "model" / "config.json").is_file():
        from turnrl.models.tiny import build_tiny

        build_tiny(work / "model", episodes_per_split=10)
    data = build_data(work, args.pairs, args.shots)
    print(f"data: {json.dumps(data)}", flush=True)

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "TQDM_DISABLE": "1", "HF_DATASETS_CACHE": str(work / "hf-datasets")}
    passthrough = ["--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--lr", str(args.lr)]
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGS}
    for rep in range(args.repeats):
        order = CONFIGS if rep % 2 == 0 else CONFIGS[::-1]
        for name in order:
            cmd = [sys.executable, __file__, "--worker", name, "--workdir", str(work), *passthrough]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.stderr.write(proc.stderr[-4000:])
                raise SystemExit(f"{name} failed (exit {proc.returncode})")
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            runs[name].append(r)
            print(f"  run {rep + 1} {name:<12} cpu {r['cpu_s']:8.2f} s  wall {r['wall_s']:8.2f} s", flush=True)

    import torch

    clock = args.clock or ("wall" if torch.cuda.is_available() else "cpu")
    key = f"{clock}_s"
    tokens = data["sequence_tokens"] * args.epochs
    best = {}
    print(f"trained tokens: {tokens:.0f}; time: {clock} (fastest of {args.repeats})")
    for name in CONFIGS:
        r = min(runs[name], key=lambda x: x[key])
        r = {**r, "tokens_per_s": round(tokens / r[key], 1),
             "peak_rss_delta_mb": max(x["peak_rss_delta_mb"] for x in runs[name])}
        best[name] = r
        mem = f"{r['peak_rss_delta_mb']:8.1f} MB peak RSS increase"
        if "peak_cuda_mb" in r:
            mem += f", {r['peak_cuda_mb']:.1f} MB peak CUDA"
        print(f"{name:<12} {r['tokens_per_s']:10.1f} trained tokens/s  cpu {r['cpu_s']:8.2f} s  "
              f"wall {r['wall_s']:8.2f} s  {mem}")
    ours = best["turnrl"]["tokens_per_s"]
    fastest_trl = max(best["trl-default"]["tokens_per_s"], best["trl-best"]["tokens_per_s"])
    print(json.dumps({"benchmark": "preference_throughput", "ratio": round(ours / fastest_trl, 2), "clock": clock,
                      "ratio_vs_trl_best": round(ours / best["trl-best"]["tokens_per_s"], 2),
                      "ratio_vs_trl_default": round(ours / best["trl-default"]["tokens_per_s"], 2),
                      "data": data, "epochs": args.epochs, "batch_size": args.batch_size, "repeats": args.repeats,
                      "results": best}))


if __name__ == "__main__":
    run_main(main)
