"""Inference-time exploration aids for model policies on bandits (seed 004).

Each aid wraps a policy (usually a :class:`~turnrl.rollout.policies.ModelPolicy`) and
changes how it acts, without training:

- ``epsilon-greedy`` (``eps``, default 0.1): with probability ``eps`` the episode takes a
  uniformly random arm instead of asking the model (the model is not called for it);
- ``try-all``: while some arm is untried, take one of them (uniformly) instead of asking
  the model -- the model only decides once every arm has been tried;
- ``self-consistency`` (``k``, default 5): sample ``k`` replies per episode (all in one
  batched call of the wrapped policy) and act on the majority action; the reply kept is
  the first one that chose it (ties: the action seen first). Sample with temperature > 0,
  or the ``k`` replies are identical;
- ``self-correction``: ask, then show the model its reply under the same observation with
  :data:`REVIEW` (check the answer, correct it if wrong, end with ``ACTION=X``) and act on the
  checked reply when it names a valid action, else on the first. Both calls are batched over
  the episodes. The checked reply was sampled under another context than the transcript's, so
  it carries no token ids (``meta["first_reply"]`` keeps the first);
- ``summary`` and ``randomize`` change what the agent sees, so they are env options:
  ``summary=true`` (per-arm counts and mean rewards appended to each observation) and
  ``randomize_labels=true`` (arm labels shuffled per step). :func:`aid_env_options` maps
  them for ``turnrl diagnose bandit --aid summary``.

Aided replies that did not come from the model carry no token ids (``meta["aid"]`` says
which aid wrote them), so training never mistakes them for sampled tokens.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from turnrl.agent.parsing import parse_action
from turnrl.bandits.policies import bandit_env
from turnrl.errors import TurnRLError, did_you_mean
from turnrl.rollout.policies import Policy, Reply, Request

AIDS = ("epsilon-greedy", "try-all", "self-consistency", "self-correction", "summary", "randomize")

#: what self-correction appends to the observation, after the model's first reply
REVIEW = ("Your answer to the above was:\n{reply}\n\nCheck that answer against the history above. If it is "
          "wrong, correct it. Give a short rationale, then your final answer on its own line as ACTION=X.")
_ENV_AIDS = {"summary": "summary", "randomize": "randomize_labels"}


def _reply(label: str, why: str, aid: str) -> Reply:
    return Reply(f"{why}\nACTION={label}", meta={"aid": aid})


class EpsilonGreedyAid:
    """With probability ``eps`` a uniformly random arm, else the wrapped policy."""

    #: reads the env object itself (its arms and history), so it cannot act on envs in workers
    reads_env = True

    def __init__(self, inner: Policy, eps: float = 0.1):
        if not 0.0 <= eps <= 1.0:
            raise TurnRLError(f"aid 'epsilon-greedy': eps must be in [0, 1] (got {eps!r})")
        self.inner, self.eps = inner, eps
        self.name = f"{inner.name}+epsilon-greedy"

    def act(self, requests: Sequence[Request]) -> list[Reply]:
        out: list[Reply | None] = [None] * len(requests)
        for i, r in enumerate(requests):
            if r.rng.random() < self.eps:
                env = bandit_env(r.env, "aid 'epsilon-greedy'")
                label = r.rng.choice(env.labels_now())
                out[i] = _reply(label, f"I explore and pick {label} at random.", "epsilon-greedy")
        return _fill(out, self.inner, requests)


class TryAllAid:
    """An untried arm (uniformly) while there is one, else the wrapped policy."""

    #: reads the env object itself (its arms and history), so it cannot act on envs in workers
    reads_env = True

    def __init__(self, inner: Policy):
        self.inner = inner
        self.name = f"{inner.name}+try-all"

    def act(self, requests: Sequence[Request]) -> list[Reply]:
        out: list[Reply | None] = [None] * len(requests)
        for i, r in enumerate(requests):
            env = bandit_env(r.env, "aid 'try-all'")
            tried = {a for a, _ in env.history if a is not None}
            untried = [a for a in range(env.setting.arms) if a not in tried]
            if untried:
                label = env.labels_now()[r.rng.choice(untried)]
                out[i] = _reply(label, f"{label} is untried, so I try it.", "try-all")
        return _fill(out, self.inner, requests)


class SelfConsistencyAid:
    """The majority action of ``k`` sampled replies (one batched call of the wrapped policy)."""

    def __init__(self, inner: Policy, k: int = 5):
        if k < 1:
            raise TurnRLError(f"aid 'self-consistency': k must be >= 1 (got {k!r})")
        self.inner, self.k = inner, k
        self.name = f"{inner.name}+self-consistency"

    def act(self, requests: Sequence[Request]) -> list[Reply]:
        many = [r for r in requests for _ in range(self.k)]
        replies = self.inner.act(many)
        out = []
        for i, r in enumerate(requests):
            group = replies[i * self.k : (i + 1) * self.k]
            parsed = [parse_action(g.content, r.valid_actions) for g in group]
            votes = Counter(p.action for p in parsed if p.valid)
            if not votes:
                out.append(group[0])
                continue
            best = max(votes.values())
            winner = next(p.action for p in parsed if p.valid and votes[p.action] == best)
            keep = next(g for g, p in zip(group, parsed, strict=True) if p.valid and p.action == winner)
            keep.meta = {**keep.meta, "votes": dict(votes)}
            out.append(keep)
        return out


class SelfCorrectionAid:
    """Ask; then ask again with the first reply and :data:`REVIEW` appended to the observation, and
    act on the checked reply if it names a valid action (else on the first). Two batched calls of
    the wrapped policy per step."""

    def __init__(self, inner: Policy):
        self.inner = inner
        self.name = f"{inner.name}+self-correction"

    def act(self, requests: Sequence[Request]) -> list[Reply]:
        from dataclasses import replace

        from turnrl.data.schema import Message

        first = self.inner.act(requests)
        reviews = []
        for r, f in zip(requests, first, strict=True):
            review = REVIEW.format(reply=f.content.strip())
            last = r.messages[-1] if r.messages else None
            if last is not None and last.role == "user":  # the observation, with the review after it
                messages = [*r.messages[:-1], replace(last, content=f"{last.content}\n\n{review}")]
            else:
                messages = [*r.messages, Message("user", review)]
            # its own random stream: a model policy keys a turn's by the episode's key
            reviews.append(replace(r, messages=messages, key=None if r.key is None else f"{r.key}/self-correction"))
        second = self.inner.act(reviews)
        out = []
        for r, f, c in zip(requests, first, second, strict=True):
            before, after = parse_action(f.content, r.valid_actions), parse_action(c.content, r.valid_actions)
            if not after.valid:
                out.append(replace(f, meta={**f.meta, "self_correction": "kept: the check named no valid action"}))
                continue
            out.append(Reply(c.content, meta={**c.meta, "aid": "self-correction", "first_reply": f.content,
                                              "changed": not before.valid or before.action != after.action}))
        return out


def _fill(out: list[Reply | None], inner: Policy, requests: Sequence[Request]) -> list[Reply]:
    """Ask ``inner`` (in one call) for the requests no aid answered."""
    rest = [i for i, o in enumerate(out) if o is None]
    if rest:
        for i, rep in zip(rest, inner.act([requests[i] for i in rest]), strict=True):
            out[i] = rep
    return [o for o in out if o is not None]


def parse_aid(spec: str) -> tuple[str, dict[str, float]]:
    """``name`` or ``name:key=value,...`` -> (name, params); unknown names are one-line errors."""
    head, _, rest = spec.partition(":")
    name = head.strip().lower()
    if name not in AIDS:
        raise TurnRLError(f"unknown aid '{head}'{did_you_mean(name, AIDS)}; choose from: {', '.join(AIDS)}")
    allowed = {"epsilon-greedy": ("eps",), "self-consistency": ("k",)}.get(name, ())
    params: dict[str, float] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq:
            raise TurnRLError(f"aid '{name}': expected key=value, got {item!r}")
        if key not in allowed:
            raise TurnRLError(
                f"aid '{name}': unknown parameter '{key}'; choose from: {', '.join(allowed) or '(none)'}"
            )
        try:
            params[key] = float(value)
        except ValueError:
            raise TurnRLError(f"aid '{name}': {key} must be a number (got {value.strip()!r})") from None
    # the values too, so that a command checks them before any policy plays
    eps, k = params.get("eps", 0.1), params.get("k", 5)
    if not 0.0 <= eps <= 1.0:
        raise TurnRLError(f"aid 'epsilon-greedy': eps must be in [0, 1] (got {eps!r})")
    if not math.isfinite(k) or k != int(k) or k < 1:
        raise TurnRLError(f"aid 'self-consistency': k must be an integer >= 1 (got {k!r})")
    return name, params


def aid_env_options(aids: Sequence[str]) -> dict[str, Any]:
    """The env options the ``summary`` / ``randomize`` aids stand for."""
    return {_ENV_AIDS[name]: True for name, _ in map(parse_aid, aids) if name in _ENV_AIDS}


def with_aids(policy: Policy, aids: Sequence[str]) -> Policy:
    """Wrap ``policy`` in the policy aids of ``aids`` (self-correction innermost, then
    self-consistency, which votes over checked replies, then epsilon-greedy, then try-all);
    env aids are ignored here (see :func:`aid_env_options`)."""
    parsed = dict(map(parse_aid, aids))
    if "self-correction" in parsed:
        policy = SelfCorrectionAid(policy)
    if "self-consistency" in parsed:
        policy = SelfConsistencyAid(policy, int(parsed["self-consistency"].get("k", 5)))
    if "epsilon-greedy" in parsed:
        policy = EpsilonGreedyAid(policy, parsed["epsilon-greedy"].get("eps", 0.1))
    if "try-all" in parsed:
        policy = TryAllAid(policy)
    return policy


__all__ = ["AIDS", "REVIEW", "EpsilonGreedyAid", "SelfConsistencyAid", "SelfCorrectionAid", "TryAllAid",
           "aid_env_options", "parse_aid", "with_aids"]
