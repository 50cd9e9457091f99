"""Templated rationales of scripted bandit policies, and the UCB-value block in them.

Every scripted policy (and the bandit envs' expert) writes one line of rationale that
starts with its UCB values in a fixed block, then says why it picks its arm, then
``ACTION=X`` on its own line (thought cloning)::

    UCB values: blue=1.32, green=inf, red=0.41. green is untried, so its UCB value is highest.
    ACTION=green

A model trained on such data writes the block too, and the knowing-doing diagnostic reads
it back with :func:`parse_values`: ``label=number`` pairs after ``UCB values:`` (or
``LinUCB values:``) on one line, ``inf`` for an untried arm; the last block in a reply
counts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

_BLOCK_RE = re.compile(r"\b(?:Lin)?UCB values?\s*:\s*([^\n]*)", re.IGNORECASE)
_PAIR_RE = re.compile(r"([A-Za-z0-9_\-]+)\s*=\s*(inf(?:inity)?|[-+]?\d+(?:\.\d+)?)", re.IGNORECASE)


def fmt_value(v: float) -> str:
    return "inf" if math.isinf(v) else f"{v:.2f}"


def format_values(labels: Sequence[str], values: Sequence[float], name: str = "UCB") -> str:
    """``UCB values: blue=1.32, green=inf`` (labels in the order given)."""
    return f"{name} values: " + ", ".join(f"{lab}={fmt_value(float(v))}" for lab, v in zip(labels, values, strict=True))


def parse_values(text: str, labels: Sequence[str]) -> np.ndarray:
    """The values of the last block in ``text``, as an array over ``labels`` (NaN where a
    label has no value; all NaN when there is no block)."""
    out = np.full(len(labels), np.nan)
    blocks = _BLOCK_RE.findall(text)
    if not blocks:
        return out
    index = {lab.lower(): i for i, lab in enumerate(labels)}
    for name, value in _PAIR_RE.findall(blocks[-1]):
        i = index.get(name.lower())
        if i is not None:
            out[i] = math.inf if value.lower().startswith("inf") else float(value)
    return out


def thought(
    algo: str,
    labels: Sequence[str],
    ucb: Sequence[float],
    arm: int,
    *,
    counts: Sequence[float] | None = None,
    means: Sequence[float] | None = None,
    explored: bool = False,
    values_name: str = "UCB",
    last_arm: int | None = None,
) -> str:
    """One line: the value block, then the reason for picking ``labels[arm]``."""
    block = format_values(labels, ucb, values_name)
    lab = labels[arm]
    untried = counts is not None and counts[arm] == 0
    if algo in ("ucb", "linucb"):
        what = "LinUCB value" if algo == "linucb" else "UCB value"
        why = f"{lab} is untried, so its {what} is highest." if untried and algo == "ucb" else \
            f"{lab} has the highest {what}."
    elif algo == "epsilon-greedy" and explored:
        why = f"I explore and pick {lab} at random."
    elif algo in ("greedy", "epsilon-greedy"):
        if counts is not None and not any(counts):
            why = f"Nothing is tried yet, so I pick {lab}."
        elif untried or means is None:
            why = f"No tried option looks good enough, so I try {lab}."
        else:
            why = f"{lab} has the best mean reward so far ({means[arm]:.2f})."
    elif algo == "thompson":
        why = f"{lab} has the highest posterior sample."
    elif algo == "lose-shift":
        if counts is not None and not any(counts):
            why = f"Nothing is tried yet, so I pick {lab}."
        elif not explored:  # for lose-shift, ``explored`` says the last reward was low
            why = f"The last reward was not low, so I stay with {lab}."
        elif arm == last_arm:  # ``follow`` < 1: a low reward it does not act on
            why = f"The last reward was low, but I stay with {lab}."
        else:
            why = f"The last reward was low, so I move on to {lab}."
    else:
        why = f"I pick {lab} at random."
    return f"{block}. {why}"


__all__ = ["fmt_value", "format_values", "parse_values", "thought"]
