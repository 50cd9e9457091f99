"""Preference oracles: ``P(task, y_i, y_j)`` = the probability that trajectory ``y_i`` beats ``y_j``.

SPPO (DESIGN 3, seed 002) needs, for each task, the K x K matrix of preferences between
the K trajectories the current policy sampled, and each sample's win rate against the K:

.. math::  \\hat P(y_i \\succ \\pi_t) = \\frac1K \\sum_{k=1}^K P(y_i \\succ y_k)

(the sample itself included, contributing 1/2, as in the authors' code). Every oracle here
answers a *batch* of queries ``(task_id, y_i, y_j)`` in one call
(:meth:`Oracle.probs`); :func:`preference_matrices` puts the K(K-1)/2 (symmetric oracles)
or K(K-1) (others) queries of *all* tasks into that one call.

Oracles:

* :class:`EnvRewardOracle` (``env_reward``): ``sigmoid((r_i - r_j) / tau)``, exactly 1/2 on
  ties; works on every env with rewards.
* :class:`~turnrl.oracles.pairwise.PairwiseModelOracle` (``pairwise_model``): a learned
  PairRM-like cross-encoder reading the task and both trajectories; symmetric by
  construction. Train it with ``turnrl train preference-model`` on comparisons built by
  :func:`comparisons_from_trajectories` (``turnrl comparisons``).
* :class:`~turnrl.oracles.judge.JudgeOracle` (``judge``): an LLM judge prompt through any
  causal LM directory; the probability comes from the log-probs of the answer tokens
  ``A`` and ``B``. One query (``oracle(task, y_i, y_j)``, :meth:`Oracle.probs`) asks in that
  order only and returns the raw ``p_AB``; :func:`preference_matrices` asks both orders and
  averages them, ``(p_AB + 1 - p_BA) / 2`` (which cancels position bias and makes the
  matrix symmetric).

Every matrix is returned *exactly* complementary: ``M[i, j] + M[j, i] == 1`` in floating
point and ``M[i, i] == 1/2``.
"""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import numpy as np

from turnrl.config import Config, Range
from turnrl.data.schema import Trajectory
from turnrl.errors import TurnRLError, did_you_mean

__all__ = [
    "COMPARISON_SCHEMA",
    "Comparison",
    "EnvRewardOracle",
    "Oracle",
    "OracleConfig",
    "PreferenceOracle",
    "Query",
    "comparisons_from_trajectories",
    "complement",
    "make_oracle",
    "preference_matrices",
    "read_comparisons",
    "render_task",
    "render_trajectory",
    "score_samples",
    "select_samples",
    "win_rates",
    "write_comparisons",
]

Query = tuple[str, Trajectory, Trajectory]
"""``(task_id, y_i, y_j)``: is ``y_i`` better than ``y_j`` on ``task_id``?"""

COMPARISON_SCHEMA = "turnrl.comparison/v1"


class PreferenceOracle(Protocol):
    """What SPPO needs of an oracle."""

    name: str
    symmetric: bool
    """True when ``P(i, j) + P(j, i) == 1`` holds by construction (one query per pair suffices)."""

    def probs(self, queries: Sequence[Query]) -> list[float]:
        """``P(y_i > y_j)`` for every query, in one batched evaluation."""
        ...


class Oracle:
    """Base class: ``oracle(task, a, b)`` for one query, :meth:`probs` for a batch."""

    name = "oracle"
    symmetric = False

    def probs(self, queries: Sequence[Query]) -> list[float]:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, task_id: str, a: Trajectory, b: Trajectory) -> float:
        return self.probs([(task_id, a, b)])[0]

    def matrix(self, task_id: str, samples: Sequence[Trajectory]) -> np.ndarray:
        """The K x K preference matrix of one task's samples."""
        return preference_matrices(self, {task_id: samples})[task_id]


def complement(p: float) -> tuple[float, float]:
    """``(p, 1 - p)`` such that the two add up to exactly 1 in floating point.

    ``1 - x`` is exact for ``x`` in [1/2, 1] (Sterbenz), so the larger side is kept and the
    smaller derived from it; for ``x < 1/2`` the rounding of ``1 - x`` is below half an ulp
    of 1, so ``x + fl(1 - x)`` still rounds to 1.
    """
    p = float(p)
    if p >= 0.5:
        return p, 1.0 - p
    q = 1.0 - p
    return 1.0 - q, q


def sigmoid(x: float) -> float:
    """Numerically stable logistic function."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


class EnvRewardOracle(Oracle):
    """``P(y_i > y_j) = sigmoid((r_i - r_j) / tau)``, exactly 1/2 on ties (``r`` = the return)."""

    name = "env_reward"
    symmetric = True

    def __init__(self, tau: float = 1.0):
        if not (tau > 0 and math.isfinite(tau)):
            raise TurnRLError(f"oracle tau must be a positive number (got {tau})")
        self.tau = tau

    def prob(self, r_i: float, r_j: float) -> float:
        d = (r_i - r_j) / self.tau
        if d == 0:
            return 0.5
        return complement(sigmoid(abs(d)))[0 if d > 0 else 1]

    def probs(self, queries: Sequence[Query]) -> list[float]:
        return [self.prob(a.return_, b.return_) for _, a, b in queries]


# ------------------------------------------------------------------ matrices and win rates


def _by_task(trajs: Iterable[Trajectory]) -> dict[str, list[Trajectory]]:
    out: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        out[t.task_id].append(t)
    return dict(out)


G = TypeVar("G", bound=Hashable)


def preference_matrices(oracle: PreferenceOracle,
                        groups: Mapping[G, Sequence[Trajectory]]) -> dict[G, np.ndarray]:
    """One K x K matrix per group (a task's or a game's samples), from **one** batched
    ``oracle.probs`` call over all groups; each query names its samples' task.

    A symmetric oracle is asked K(K-1)/2 queries a task (``i < j``); any other is asked both
    orders and ``M[i, j] = (P(i, j) + 1 - P(j, i)) / 2`` (position bias cancels). The lower
    triangle is the exact complement of the upper one and the diagonal is 1/2.
    """
    index: list[tuple[G, int, int, bool]] = []
    queries: list[Query] = []
    for group, samples in groups.items():
        k = len(samples)
        for i in range(k):
            for j in range(i + 1, k):
                task = samples[i].task_id
                queries.append((task, samples[i], samples[j]))
                index.append((group, i, j, False))
                if not oracle.symmetric:
                    queries.append((task, samples[j], samples[i]))
                    index.append((group, i, j, True))
    answers = oracle.probs(queries) if queries else []
    if len(answers) != len(queries):
        raise TurnRLError(f"oracle {oracle.name} answered {len(answers)} of {len(queries)} queries")
    upper: dict[tuple[G, int, int], list[float]] = defaultdict(list)
    for (group, i, j, flipped), p, (task, _, _) in zip(index, answers, queries, strict=True):
        if not (0.0 <= p <= 1.0):
            raise TurnRLError(f"oracle {oracle.name} returned {p} for a query on {task}; probabilities lie in [0, 1]")
        upper[(group, i, j)].append(1.0 - p if flipped else p)
    out: dict[G, np.ndarray] = {}
    for group, samples in groups.items():
        k = len(samples)
        m = np.full((k, k), 0.5, dtype=np.float64)
        for i in range(k):
            for j in range(i + 1, k):
                vals = upper[(group, i, j)]
                m[i, j], m[j, i] = complement(sum(vals) / len(vals))
        out[group] = m
    return out


def win_rates(matrix: np.ndarray) -> np.ndarray:
    """``P(y_i > pi_t) = (1/K) sum_k M[i, k]`` (the diagonal 1/2 included, as in SPPO)."""
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] == 0:
        raise ValueError(f"a preference matrix is square and non-empty, got shape {m.shape}")
    return m.mean(axis=1)


Selection = Literal["all", "best_worst"]


def select_samples(scored: Sequence[Trajectory], select: Selection) -> list[Trajectory]:
    """``all`` keeps every scored sample; ``best_worst`` keeps each task's highest and lowest
    win rate (the SPPO authors' choice), dropping tasks whose samples all tie."""
    if select == "all":
        return list(scored)
    if select != "best_worst":
        raise TurnRLError(f"unknown sample selection {select!r}; choose from: all, best_worst")
    out: list[Trajectory] = []
    for group in _by_task(scored).values():
        ranked = sorted(group, key=lambda t: float(t.meta["win_rate"]))
        worst, best = ranked[0], ranked[-1]
        if best.meta["win_rate"] == worst.meta["win_rate"]:
            continue
        out += [best, worst]
    return out


def score_samples(samples: Sequence[Trajectory], oracle: PreferenceOracle, *,
                  select: Selection = "all") -> list[Trajectory]:
    """Each sample with ``meta["win_rate"]`` against every sample of its task (SPPO's K samples of
    a prompt: the env seed is not part of the group, as it only draws the sampler's random moves,
    so a plan that visits a task twice gives it 2K; one batched oracle call for all),
    ``meta["group_size"]`` and ``meta["oracle"]``; then :func:`select_samples`."""
    groups = _by_task(samples)
    mats = preference_matrices(oracle, groups)
    out: list[Trajectory] = []
    for task, group in groups.items():
        rates = win_rates(mats[task])
        for y, p in zip(group, rates, strict=True):
            extra = {"tau": oracle.tau} if isinstance(oracle, EnvRewardOracle) else {}
            out.append(replace(y, meta={**y.meta, "win_rate": float(p), "group_size": len(group),
                                        "oracle": oracle.name, **extra}))
    return select_samples(out, select)


# ------------------------------------------------------------------------------ rendering


def render_task(traj: Trajectory) -> str:
    """The task as an oracle reads it: the system instruction and the first observation."""
    parts = []
    for m in traj.messages:
        if m.role == "system":
            parts.append(m.content)
        elif m.role == "user":
            parts.append(m.content)
            break
    return "\n".join(parts)


def render_trajectory(traj: Trajectory, *, final_observation: bool = True) -> str:
    """What the agent did after the first observation: its turns and the env's replies, and
    (by default) the final observation the env returned, as an oracle reads them."""
    lines: list[str] = []
    seen_first = False
    for m in traj.messages:
        if m.role == "system":
            continue
        if m.role == "user" and not seen_first:
            seen_first = True
            continue
        lines.append(f"{'Agent' if m.role == 'assistant' else 'Env'}: {m.content}")
    final = traj.meta.get("final_observation") if final_observation else None
    if final:
        lines.append(f"Env: {final}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- comparisons


class Comparison:
    """A labelled comparison: ``label`` = P(a > b) (1, 0, 1/2 for a tie, or soft)."""

    __slots__ = ("a", "b", "label", "meta", "task_id")

    def __init__(self, task_id: str, a: Trajectory, b: Trajectory, label: float, meta: dict[str, Any] | None = None):
        self.task_id, self.a, self.b, self.label, self.meta = task_id, a, b, float(label), dict(meta or {})

    def to_dict(self) -> dict[str, Any]:
        return {"schema": COMPARISON_SCHEMA, "task_id": self.task_id, "a": self.a.to_dict(),
                "b": self.b.to_dict(), "label": self.label, "meta": self.meta}


def comparisons_from_trajectories(
    trajs: Sequence[Trajectory],
    *,
    oracle: PreferenceOracle | None = None,
    hard: bool = True,
    pairs_per_task: int | None = None,
    skip_ties: bool = False,
    seed: int = 0,
) -> list[Comparison]:
    """Labelled comparisons between trajectories of the same task.

    Labels come from ``oracle`` (default: the env-reward oracle); ``hard`` rounds them to
    1 / 0 (1/2 stays for ties). Every pair of a task's trajectories is used, or a random
    ``pairs_per_task`` of them; the A/B order is random (seeded).
    """
    oracle = oracle or EnvRewardOracle(1.0)
    rng = random.Random(seed)
    groups = _by_task(trajs)
    chosen: list[tuple[str, Trajectory, Trajectory]] = []
    for task in sorted(groups):
        group = groups[task]
        idx = [(i, j) for i in range(len(group)) for j in range(i + 1, len(group))]
        if skip_ties:
            idx = [(i, j) for i, j in idx if group[i].return_ != group[j].return_]
        rng.shuffle(idx)
        if pairs_per_task is not None:
            idx = idx[:pairs_per_task]
        for i, j in idx:
            a, b = (group[i], group[j]) if rng.random() < 0.5 else (group[j], group[i])
            chosen.append((task, a, b))
    labels = oracle.probs(chosen) if chosen else []
    out = []
    for (task, a, b), p in zip(chosen, labels, strict=True):
        if hard and p != 0.5:
            p = 1.0 if p > 0.5 else 0.0
        out.append(Comparison(task, a, b, p, {"oracle": oracle.name, "a_return": a.return_,
                                              "b_return": b.return_}))
    return out


def write_comparisons(path: str | Path, comparisons: Iterable[Comparison]) -> int:
    from turnrl.data.io import write_jsonl

    return write_jsonl(path, [c.to_dict() for c in comparisons])


_COMPARISON_KEYS = ("schema", "task_id", "a", "b", "label", "meta")


def read_comparisons(path: str | Path) -> list[Comparison]:
    """Read a comparisons file; a bad line is a ``FILE:LINE: what`` error."""
    from turnrl.data.io import check_finite, iter_jsonl, trajectory_from_dict

    p = Path(path)
    if not p.is_file():
        raise TurnRLError(f"{p}: {'is a directory' if p.is_dir() else 'no such file'}")
    out = []
    for line, d in iter_jsonl(p):
        where = f"{p}:{line}"
        if d.get("schema") != COMPARISON_SCHEMA:
            raise TurnRLError(f"{where}: schema is {d.get('schema')!r}, expected {COMPARISON_SCHEMA!r}")
        for key in d:  # a misspelt key is refused, as in trajectory and pair records
            if key not in _COMPARISON_KEYS:
                raise TurnRLError(f"{where}: unknown key '{key}'{did_you_mean(key, _COMPARISON_KEYS)}")
        for key in ("task_id", "a", "b", "label"):
            if key not in d:
                raise TurnRLError(f"{where}: missing key '{key}'")
        label = d["label"]
        if isinstance(label, bool) or not isinstance(label, (int, float)) or not 0 <= label <= 1:
            raise TurnRLError(f"{where}: label must be a number in [0, 1] (got {json.dumps(label)})")
        if not isinstance(d["task_id"], str):
            raise TurnRLError(f"{where}: task_id must be a string (got {json.dumps(d['task_id'])})")
        meta = d.get("meta")
        if meta is not None and not isinstance(meta, dict):
            raise TurnRLError(f"{where}: meta must be a JSON object (got {json.dumps(meta)})")
        check_finite(meta, where, "meta")  # 1e400 reads as infinity, which no writer takes back
        a = trajectory_from_dict(d["a"], f"{where}: a")
        b = trajectory_from_dict(d["b"], f"{where}: b")
        for side, t in (("a", a), ("b", b)):  # a preference between two tasks' replies is none
            if t.task_id != d["task_id"]:
                raise TurnRLError(f"{where}: {side}.task_id {json.dumps(t.task_id)} is not the comparison's task_id "
                                  f"{json.dumps(d['task_id'])}")
        out.append(Comparison(d["task_id"], a, b, float(label), meta or {}))
    if not out:
        raise TurnRLError(f"{p}: no comparisons")
    return out


# ------------------------------------------------------------------------------- factory


class OracleConfig(Config):
    """Which preference oracle SPPO asks, and its settings."""

    kind: Literal["env_reward", "pairwise_model", "judge"] = "env_reward"
    tau: float = 1.0
    """env_reward: temperature of sigmoid((r_i - r_j) / tau)."""
    model: str | None = None
    """pairwise_model: a directory written by ``turnrl train preference-model``;
    judge: any causal LM directory / hub id / ``tiny``."""
    batch_size: int = 32
    """Sequences per forward pass (pairwise_model, judge)."""
    max_tokens: int = 1024
    """judge: longest prompt; each attempt is cut from the left to fit."""
    device: str | None = None

    value_ranges = {"tau": Range(0, lo_open=True), "batch_size": Range(1), "max_tokens": Range(1)}


def make_oracle(cfg: OracleConfig) -> Oracle:
    """Build the oracle ``cfg`` names (models are loaded here)."""
    if cfg.kind == "env_reward":
        return EnvRewardOracle(cfg.tau)
    if cfg.model is None:
        raise TurnRLError(f"oracle.kind={cfg.kind} needs oracle.model (a model directory)")
    if cfg.kind == "pairwise_model":
        from turnrl.oracles.pairwise import PairwiseModelOracle

        return PairwiseModelOracle(cfg.model, batch_size=cfg.batch_size, device=cfg.device)
    from turnrl.oracles.judge import JudgeOracle

    return JudgeOracle(cfg.model, batch_size=cfg.batch_size, max_tokens=cfg.max_tokens, device=cfg.device)
