"""Helpers shared by the benchmark scripts beside this file (run as ``python benchmarks/X.py``)."""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch


def clock(cuda: bool) -> float:
    """Wall time on a GPU (after synchronizing); the process's CPU time on a CPU, where wall time on a
    shared machine mostly measures the other jobs."""
    if cuda:
        torch.cuda.synchronize()
        return time.perf_counter()
    return time.process_time()


def positive(text: str) -> int:
    """An ``argparse`` type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_list(text: str) -> list[int]:
    """An ``argparse`` type: comma-separated integers >= 1 (``1,8,32``); empty for none."""
    try:
        return [positive(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers >= 1 separated by commas, got {text!r}") from None


def run_main(main: Callable[[], None]) -> None:
    """Run a benchmark's ``main``; turnrl's one-line errors (a bad model path, env or setting) are
    printed as ``error: ...`` with exit code 2, as turnrl's commands print them, not as a traceback."""
    import sys

    from turnrl.errors import TurnRLError

    try:
        main()
    except TurnRLError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def model_or_tiny(model_dir: str | None) -> str:
    """``model_dir``, or a fresh tiny model built in a temporary folder."""
    if model_dir is not None:
        return model_dir
    from turnrl.models.tiny import build_tiny

    return str(build_tiny(tempfile.mkdtemp() + "/tiny", episodes_per_split=10))


def training_model(model_dir: str | None) -> tuple[Any, Any, int, bool]:
    """The model at ``model_dir`` (or a fresh tiny one) in float32, on the GPU when there is one,
    its ``ChatFormat``, its pad id, and whether it is on CUDA."""
    from turnrl.models.loading import load_model, load_tokenizer
    from turnrl.tokenization import ChatFormat

    path = model_or_tiny(model_dir)
    cuda = torch.cuda.is_available()
    tok = load_tokenizer(path)
    chat = ChatFormat(tok)
    pad_id = int(tok.pad_token_id if tok.pad_token_id is not None else chat.stop_token_ids[0])
    return load_model(path, device="cuda" if cuda else "cpu", dtype="float32"), chat, pad_id, cuda


def padded_logps(model: Any, encs: Sequence[Any], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The peer's forward pass, as TRL's trainers compute per-token log-probs: one batch, prompts
    left-padded and replies right-padded to the longest, an attention mask, the LM head on the reply
    span only (``logits_to_keep``). ``encs`` are ``tokenization.Encoded`` with one trainable reply
    at the end. Returns the reply span's log-probs ``[B, C]`` and which of them are agent tokens."""
    device = next(model.parameters()).device
    splits = []
    for e in encs:
        first = e.action_mask.index(1)
        splits.append((e.input_ids[:first], e.input_ids[first:], e.action_mask[first:]))
    p_w = max(len(p) for p, _, _ in splits)
    c_w = max(len(c) for _, c, _ in splits)
    ids = torch.full((len(encs), p_w + c_w), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    keep = torch.zeros((len(encs), c_w), dtype=torch.bool)
    for i, (p, c, m) in enumerate(splits):
        ids[i, p_w - len(p) : p_w + len(c)] = torch.tensor(p + c)
        attn[i, p_w - len(p) : p_w + len(c)] = 1
        keep[i, : len(c)] = torch.tensor(m, dtype=torch.bool)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids.to(device), attention_mask=attn.to(device), position_ids=pos.to(device),
                use_cache=False, logits_to_keep=c_w + 1)
    logits = out.logits[:, :-1]  # position j predicts token j + 1: the reply span's tokens
    logps = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, p_w:].to(device).unsqueeze(-1)).squeeze(-1)
    return logps, keep.to(device)


#: the configurations each training benchmark times: turnrl's default packing (shared prefixes),
#: its plain packing, and the padded peer
NAMES = ("turnrl", "turnrl-plain", "padded")


def time_rounds(run: Callable[[str, Any], list[float]], start: Any, cuda: bool, repeats: int, *,
                rtol: float = 1e-5, atol: float = 1e-4) -> tuple[dict[str, Any], bool]:
    """``run(name, model)`` for every name of :data:`NAMES` on a fresh copy of ``start``, ``repeats``
    timed rounds after an untimed warm-up; each name's best time is printed a line each. Returns the
    result line's timing fields (device, clock, best times, ``ratio`` = padded / turnrl and
    ``ratio_plain`` = plain / turnrl) and whether every name's last output (numbers ``run``
    returns, e.g. losses) agrees with turnrl's to ``rtol`` / ``atol``."""
    times: dict[str, list[float]] = {n: [] for n in NAMES}
    outputs: dict[str, list[float]] = {}
    for rep in range(repeats + 1):
        for name in NAMES:
            model = copy.deepcopy(start).train()
            t0 = clock(cuda)
            outputs[name] = run(name, model)
            dt = clock(cuda) - t0
            if rep:
                times[name].append(dt)
    best = {n: min(ts) for n, ts in times.items()}
    for n in NAMES:
        print(f"{n:13s} {best[n]:8.2f} s")
    same = all(np.allclose(outputs[n], outputs["turnrl"], rtol=rtol, atol=atol) for n in NAMES)
    fields = {"device": "cuda" if cuda else "cpu", "clock": "wall" if cuda else "cpu",
              **{f"{n.replace('-', '_')}_s": round(best[n], 3) for n in NAMES},
              "ratio": round(best["padded"] / best["turnrl"], 3),
              "ratio_plain": round(best["turnrl-plain"] / best["turnrl"], 3)}
    return fields, bool(same)
