"""The lock-step sampler: N environments, one policy call per step.

Every step, each active environment's conversation goes to the policy in one call (for a
model, one batched ``generate``, which takes each episode's earlier turns from the KV cache of
the step before: :meth:`~turnrl.rollout.engine.HFEngine.keep_turns`); each reply is parsed into
an action, the invalid-action policy applied, and the environments stepped. When an episode
ends its trajectory is written (flushed, so a killed collection keeps every finished episode)
and the slot takes the next planned episode. Scripted policies (expert, random) run through the
same path.

Episodes are planned up front (:func:`plan_episodes`): episode ``i`` of a split plays
task ``task_ids[i % n]`` and draws its randomness (expert tie-breaks, random actions, the
env's reset seed) from ``(seed, i)`` alone, so scripted collections do not depend on the
number of environments and resumed collections skip exactly the episodes already written.
A model policy samples each turn from a random stream keyed by the episode (``Request.key``,
``"<seed>/<index>"``) and the turn (:meth:`~turnrl.rollout.policies.ModelPolicy.seeds`), so
sampled collections do not depend on it either, and a resumed one finishes with the episodes an
uninterrupted run would have sampled.

A trajectory's ``meta`` has the policy's name, the episode's seed and index, the final
observation and the env's outcome keys; where the env reports ``info["expected_reward"]`` on
every step (the bandits: the pulled arm's mean), ``meta["expected_rewards"]`` is the expected
value of each entry of ``rewards`` (same penalties, the reward noise taken out).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from turnrl.agent.parsing import parse_action
from turnrl.agent.prompting import PromptConfig, system_message
from turnrl.data.schema import Message, Trajectory
from turnrl.envs.base import TextEnv
from turnrl.errors import TurnRLError
from turnrl.rollout.policies import ExpertPolicy, Policy, Request, keeping_turns


@dataclass(frozen=True)
class EpisodeSpec:
    """One planned episode. The env's expert plays its first ``expert_turns`` turns
    (ETO's step-wise exploration replays an expert prefix, then the policy takes over), or the
    ``replay`` replies are played as the first turns (a takeover replays the agent's own game's
    first turns, sampled ids and log-probs included, then the policy -- the expert -- plays on)."""

    index: int
    split: str
    task_id: str
    seed: int
    expert_turns: int = 0
    replay: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if self.replay and self.expert_turns:
            raise ValueError("an episode replays either the expert's first turns or given replies, not both")

    def episode_id(self, env_name: str) -> str:
        return f"{env_name}-{self.split}-{self.index:06d}"


def plan_episodes(env: TextEnv, split: str, episodes: int, seed: int = 0, start: int = 0) -> list[EpisodeSpec]:
    """``episodes`` episodes cycling over the split's tasks in order."""
    ids = env.task_ids(split)
    return [
        EpisodeSpec(i, split, ids[i % len(ids)], random.Random(f"{seed}/{split}/{i}").randrange(2**31))
        for i in range(start, start + episodes)
    ]


def invalid_rules(prompt: PromptConfig) -> dict[str, Any]:
    """The prompt settings that change an episode's rewards: what an invalid reply does."""
    return {"invalid_action": prompt.invalid_action, "invalid_penalty": prompt.invalid_penalty}


def prompt_text(prompt: PromptConfig) -> dict[str, Any]:
    """The prompt settings that change the system message: the instruction that replaces the env's
    and the in-context example (None where unset)."""
    return {"instruction": prompt.instruction, "example": prompt.example}


@dataclass
class _Slot:
    env: TextEnv
    spec: EpisodeSpec | None = None
    messages: list[Message] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    #: per turn, the env's ``info["expected_reward"]`` (+ the same penalty as ``rewards``); None
    #: where the env did not report one
    expected: list[float | None] = field(default_factory=list)
    #: per turn, the arm the env reports it pulled (``info["arm"]``, the bandits: under
    #: ``randomize_labels`` a label names another arm at every step); None where nothing was executed
    arms: list[int | None] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    #: the env's last observation (of ``reset`` or ``step``): what an error observation repeats
    obs: str = ""
    rng: random.Random = field(default_factory=random.Random)
    turn: int = 0


def finish_order(indices: Sequence[Any], turns: Mapping[Any, int], num_envs: int) -> list[Any]:
    """The order in which :meth:`Sampler.run` finishes the episodes ``indices`` (given in plan order) on
    ``num_envs`` slots, from each one's number of turns: every active slot takes one turn a step, in slot
    order, and a freed slot takes the next planned episode at the next step. It is the order an
    uninterrupted collection writes them in, which a resumed one restores (:func:`turnrl.collect.run_policy`)."""
    pending, slots = deque(indices), [None] * min(num_envs, len(indices))
    left: dict[Any, int] = {}
    out: list[Any] = []
    while True:
        for k, held in enumerate(slots):
            if held is None and pending:
                slots[k] = pending.popleft()
                left[slots[k]] = max(1, turns[slots[k]])
        if all(held is None for held in slots):
            return out
        for k, held in enumerate(slots):
            if held is not None:
                left[held] -= 1
                if not left[held]:
                    out.append(held)
                    slots[k] = None


class Sampler:
    """Runs planned episodes of ``policy`` on ``num_envs`` environments in lock-step."""

    def __init__(
        self,
        make_env: Callable[[], TextEnv],
        policy: Policy,
        *,
        env_name: str,
        num_envs: int = 8,
        prompt: PromptConfig | None = None,
        source: str = "policy",
    ):
        self.make_env = make_env
        self.policy = policy
        self.env_name = env_name
        self.num_envs = max(1, num_envs)
        self.prompt = prompt or PromptConfig()
        #: what an invalid reply does, recorded with every episode (a resumed collection must keep it)
        self.invalid_rules = invalid_rules(self.prompt)
        self.prompt_text = prompt_text(self.prompt)
        self.source = source
        # the policy builds each turn's context (ModelPolicy.history); a prompt that asks for another
        # history than the policy's would be silently ignored, so it is refused
        seen = getattr(policy, "history", self.prompt.history)
        if self.prompt.history is not None and seen != self.prompt.history:
            raise TurnRLError(f"prompt.history={self.prompt.history} but the policy shows the agent history={seen}; "
                              f"build it with load_policy(..., history={self.prompt.history})")
        self._envs: list[TextEnv] = []

    def close(self) -> None:
        for env in self._envs:
            env.close()
        self._envs = []

    def run(
        self,
        specs: Iterable[EpisodeSpec],
        *,
        on_episode: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """Play every episode of ``specs``; returns trajectories in ``specs`` order."""
        pending = deque(specs)
        order = [s.index for s in pending]
        if len(set(order)) != len(order):  # episodes are kept by index: a repeated one would shadow another
            dup = next(i for i in order if order.count(i) > 1)
            raise ValueError(f"episode index {dup} appears twice in the specs; indices must be distinct")
        total = len(pending)
        while len(self._envs) < min(self.num_envs, total):
            self._envs.append(self.make_env())
        slots = [_Slot(env) for env in self._envs[: min(self.num_envs, total)]]
        done: dict[int, Trajectory] = {}
        with keeping_turns(self.policy):  # a model's next turn reuses this turn's KV cache
            self._play(slots, pending, done, on_episode)
        return [done[k] for k in order]

    def _play(self, slots: list[_Slot], pending: deque[EpisodeSpec], done: dict[int, Trajectory],
              on_episode: Callable[[Trajectory], None] | None) -> None:
        """Step the slots until every planned episode is in ``done``, each freed slot taking the next one."""
        while True:
            for slot in slots:
                if slot.spec is None and pending:
                    self._start(slot, pending.popleft())
            active = [s for s in slots if s.spec is not None]
            if not active:
                break
            requests = [
                Request(s.env, s.messages, s.turn, s.info.get("valid_actions"), s.rng,
                        f"{s.spec.seed}/{s.spec.index}" if s.spec is not None else None)
                for s in active
            ]
            replies = self._act(active, requests)
            for slot, reply in zip(active, replies, strict=True):
                traj = self._advance(slot, reply)
                if traj is not None:
                    assert slot.spec is not None
                    done[slot.spec.index] = traj
                    if on_episode is not None:
                        on_episode(traj)
                    slot.spec = None

    def _act(self, active: Sequence[_Slot], requests: Sequence[Request]) -> list[Any]:
        """The policy's replies; slots still in a replayed prefix get its reply, slots in their
        expert prefix the expert's."""
        replies: list[Any] = [None] * len(requests)
        for i, s in enumerate(active):
            if s.spec is not None and s.turn < len(s.spec.replay):
                replies[i] = s.spec.replay[s.turn]
        in_prefix = [i for i, s in enumerate(active) if s.spec is not None and s.turn < s.spec.expert_turns]
        for i, r in zip(in_prefix, ExpertPolicy().act([requests[i] for i in in_prefix]), strict=True):
            replies[i] = r
        rest = [i for i in range(len(requests)) if replies[i] is None]
        if rest:
            for i, r in zip(rest, self.policy.act([requests[i] for i in rest]), strict=True):
                replies[i] = r
        return replies

    # ----------------------------------------------------------------------------
    def _start(self, slot: _Slot, spec: EpisodeSpec) -> None:
        obs, info = slot.env.reset(seed=spec.seed, options={"task_id": spec.task_id, "split": spec.split})
        slot.spec = spec
        slot.rng = random.Random(spec.seed)
        slot.messages = [system_message(slot.env.instruction, self.prompt), Message("user", obs)]
        slot.rewards = []
        slot.expected = []
        slot.arms = []
        slot.info = dict(info)
        slot.obs = obs
        slot.turn = 0

    def _advance(self, slot: _Slot, reply: Any) -> Trajectory | None:
        """Apply one reply; returns the finished trajectory or None."""
        cfg = self.prompt
        valid_actions = slot.info.get("valid_actions")
        parsed = parse_action(reply.content, valid_actions)
        msg = Message("assistant", reply.content, action=parsed.action, valid=parsed.valid,
                      token_ids=reply.token_ids, logprobs=reply.logprobs,
                      cut=True if reply.meta.get("finished") is False else None)
        penalty = 0.0
        executed: str | None = parsed.action
        if not parsed.valid:
            penalty = cfg.invalid_penalty
            if cfg.invalid_action == "random" and valid_actions:
                executed = slot.rng.choice(valid_actions)
                msg.note = f"invalid action {parsed.action!r}; executed random valid action {executed!r}"
            elif cfg.invalid_action in ("error", "random"):  # random with no valid action to draw: an error too
                executed = None
                msg.note = f"invalid action {parsed.action!r}; returned an error observation"
            else:  # end
                executed = None
                msg.note = f"invalid action {parsed.action!r}; episode ended"
        msg.action = executed if executed is not None else parsed.action
        slot.messages.append(msg)
        slot.turn += 1
        assert slot.spec is not None
        env = slot.env
        terminated = truncated = False
        if executed is None and not parsed.valid and cfg.invalid_action == "end":
            slot.rewards.append(penalty)
            slot.expected.append(penalty)
            slot.arms.append(None)
            terminated = True
            obs = "Episode ended: invalid action."
        elif executed is None:
            slot.rewards.append(penalty)
            slot.expected.append(penalty)
            slot.arms.append(None)
            # an env may list less than it accepts (twenty questions without its candidates shown)
            listed = slot.info.get("shown_actions", valid_actions)
            shown = ", ".join(listed) if listed else "see the instruction"
            # the state is unchanged: repeat it, so that an agent that sees no history still sees it
            obs = f"Invalid action: {parsed.action!r}. Valid actions: {shown}. Nothing changed:\n{slot.obs}"
        else:
            obs, reward, terminated, truncated, info = env.step(executed)
            if info.get("invalid") and parsed.valid:  # an env that lists no actions rejected it: the same rule
                msg.valid = False
                penalty = cfg.invalid_penalty
                if cfg.invalid_action == "end":
                    terminated, obs = True, "Episode ended: invalid action."
                    msg.note = f"invalid action {parsed.action!r} (the env's); episode ended"
                else:  # nothing to play in its stead: the env's own error observation
                    msg.note = f"invalid action {parsed.action!r} (the env's); returned its observation"
            slot.rewards.append(float(reward) + penalty)
            expected = info.get("expected_reward")
            slot.expected.append(None if expected is None else float(expected) + penalty)
            arm = info.get("arm")
            slot.arms.append(None if arm is None or info.get("invalid") else int(arm))
            slot.info = dict(info)
            if not info.get("invalid"):  # a rejected action left the state as it was
                slot.obs = obs
        if not (terminated or truncated) and slot.turn >= env.max_turns:
            truncated = True
        if terminated or truncated:
            return self._finish(slot, obs, terminated, truncated)
        slot.messages.append(Message("user", obs))
        return None

    def _finish(self, slot: _Slot, final_obs: str, terminated: bool, truncated: bool) -> Trajectory:
        assert slot.spec is not None
        info = slot.info
        success = bool(info.get("success", info.get("won", False))) and terminated
        return Trajectory(
            id=slot.spec.episode_id(self.env_name),
            env=self.env_name,
            task_id=slot.spec.task_id,
            messages=list(slot.messages),
            rewards=list(slot.rewards),
            return_=float(sum(slot.rewards)),
            success=success,
            terminated=terminated,
            truncated=truncated,
            split=slot.spec.split,
            source=self.source,
            meta={"policy": self.policy.name, **policy_settings(self.policy), "invalid_rules": self.invalid_rules,
                  "prompt": self.prompt_text, "seed": slot.spec.seed,
                  "index": slot.spec.index,
                  "final_observation": final_obs, **_outcome(info),
                  **({"expert_turns": slot.spec.expert_turns} if slot.spec.expert_turns else {}),
                  **({"replayed_turns": len(slot.spec.replay)} if slot.spec.replay else {}),
                  **({"expected_rewards": list(slot.expected)}
                     if "expected_reward" in info and None not in slot.expected else {}),
                  **({"arms": list(slot.arms)} if any(a is not None for a in slot.arms) else {})},
        )


def policy_settings(policy: Any) -> dict[str, Any]:
    """What a model policy sampled with (``meta["sampling"]``: temperature, top_p, max_new_tokens,
    history) and, where known, its weights' fingerprint (``meta["model_fingerprint"]``), so that a
    resumed collection can tell another run's episodes; nothing for a scripted one."""
    sampling = getattr(policy, "sampling", None)
    if sampling is None or not hasattr(sampling, "model_dump"):
        return {}
    fingerprint = getattr(policy, "fingerprint", None)
    return {"sampling": {**sampling.model_dump(mode="json"), "history": getattr(policy, "history", None)},
            **({"model_fingerprint": fingerprint} if fingerprint else {})}


def _outcome(info: dict[str, Any]) -> dict[str, Any]:
    return {k: info[k] for k in ("outcome", "won", "score") if k in info}


def invalid_rate(trajectories: Sequence[Trajectory]) -> float:
    turns = [m for t in trajectories for m in t.messages if m.role == "assistant"]
    return sum(1 for m in turns if m.valid is False) / max(1, len(turns))


def cut_rate(trajectories: Sequence[Trajectory]) -> float:
    """The share of agent turns that ran into ``max_new_tokens`` (``Message.cut``)."""
    turns = [m for t in trajectories for m in t.messages if m.role == "assistant"]
    return sum(1 for m in turns if m.cut) / max(1, len(turns))
