"""Building preference data from trajectories (ETO, step-wise, self-play) and SPPO records.

All builders are pure functions of trajectories; ``turnrl pairs`` reads and writes the files.

* :func:`trajectory_pairs` -- ETO's rule: for each explored trajectory, the expert trajectory
  of the same task (of the same env seed when the task has several: :func:`expert_games`); when
  their returns differ the higher one is chosen. Optionally the loser
  is cut to the winner's number of turns plus ``truncate_k``.
* :func:`step_pairs` -- ETO's step-wise variant: an explored trajectory whose first ``t``
  turns replayed the expert (``meta["expert_turns"] = t``, see ``EpisodeSpec.expert_turns``)
  is compared with the expert trajectory of the same task by final return; the pair is the
  expert's action at turn ``t`` against the agent's, after the shared prefix. Both sides are
  cut after turn ``t`` and only turn ``t`` is trained (``meta["train_from_turn"] = t``).
* :func:`takeover_pairs` -- the expert takes over the agent's own game (a departure from ETO,
  whose expert games start from the task's start): an explored game is replayed for its first
  ``t`` turns and the expert plays on (``meta["replayed_turns"] = t``, see
  ``EpisodeSpec.replay``). The latest ``t`` whose takeover returns more than the agent's game is
  where the agent went wrong: the pair is that takeover against the agent's game, both whole,
  trained from turn ``t`` (``meta["train_from_turn"] = t``), so the first trained turn of both
  sides has the same context. With no such ``t`` >= 1 the expert's own game (``t`` = 0) is
  the winner when it returns more, as in a trajectory pair.
* :func:`self_play_pairs` -- no expert: the best against the worst of a task's own samples
  when their returns differ ("clean": the worst of those that are not degenerate).
* :func:`scored_samples` -- SPPO: every sample with its win rate against the K samples of its
  task under the environment-reward oracle ``P(i > j) = sigmoid((r_i - r_j) / tau)``, ties 1/2
  (``meta["win_rate"]``). The oracle interface itself is :class:`RewardOracle`.

Trajectory and self-play pairs record ``meta["diverge_turn"]`` (:func:`diverge_turn`): the
first agent turn at which the two sides differ. Against a seeded opponent a greedy agent that
copies the expert shares the expert's game up to its first departure, so on tic-tac-toe most
pairs part at turn 1 or 2, not 0; DMPO's phi(t, T) counts turns from the start, so it weighs
the turn where a pair differs by phi(d, T), which is small for a small gamma
(docs/methods/dmpo.md).

Losers can be filtered ("clean", DMPO's setting) with :func:`degenerate_reason`: an explored
loser with an invalid action, a turn without a parseable action (but an imported trajectory's leading
"OK", ETO's acknowledgement of the instruction, whatever its ``source``), an action repeated
``max_repeats`` times in a row (not on the bandits, where pulling the best arm again is the point),
or gibberish text is dropped; "noisy" keeps them. An expert game that lost to the agent's is never
dropped: the settings are about degenerate explorations. What counts is the file a game comes from
(explored or expert), not its ``source``: imported explorations are filtered as the agent's own are.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, Literal

from turnrl.agent.prompting import opens_with_acknowledgement
from turnrl.data.schema import Message, Pair, Trajectory, by_game
from turnrl.errors import TurnRLError
from turnrl.oracles import EnvRewardOracle, score_samples

LoserSetting = Literal["clean", "noisy"]

__all__ = [
    "RewardOracle",
    "degenerate_reason",
    "diverge_turn",
    "scored_samples",
    "self_play_pairs",
    "step_pairs",
    "takeover_pairs",
    "trajectory_pairs",
    "truncate_turns",
]


def truncate_turns(traj: Trajectory, turns: int) -> Trajectory:
    """The trajectory cut right after its ``turns``-th agent turn (rewards and return cut too)."""
    if turns >= traj.num_turns:
        return traj
    out: list[Message] = []
    seen = 0
    for m in traj.messages:
        if m.role == "assistant":
            if seen == turns:
                break
            seen += 1
        out.append(m)
    rewards = list(traj.rewards[:turns])
    return replace(traj, messages=out, rewards=rewards, return_=float(sum(rewards)), success=False,
                   terminated=False, truncated=True, meta={**traj.meta, "truncated_to_turns": turns})


def diverge_turn(a: Trajectory, b: Trajectory) -> int:
    """The first agent turn whose context or reply differs between ``a`` and ``b``: the number
    of agent turns in their common message prefix (that of the shorter one when one holds the
    other's messages whole)."""
    turns = 0
    for x, y in zip(a.messages, b.messages, strict=False):
        if x.role != y.role or x.content != y.content:
            break
        turns += x.role == "assistant"
    return turns


def degenerate_reason(traj: Trajectory, *, max_repeats: int = 3) -> str | None:
    """Why a trajectory is degenerate (invalid / missing / repeated actions, gibberish), or None.

    A first reply without an action that turnrl did not sample, before an observation, is ETO's "OK"
    acknowledgement of the instruction (:mod:`turnrl.data.eto`), not a missing action. On the bandits
    (:data:`REPEATING_ENVS`) a repeated action is play, not a loop: UCB's games repeat the best arm."""
    repeats_count = traj.env not in REPEATING_ENVS
    run, last = 0, None
    replies = [i for i, m in enumerate(traj.messages) if m.role == "assistant"]
    for i in replies:
        m = traj.messages[i]
        if m.valid is False:
            return "invalid action"
        if m.action is None:
            if i == replies[0] and opens_with_acknowledgement(traj.messages):
                continue
            return "no action"
        if _gibberish(m.content):
            return "gibberish"
        run = run + 1 if m.action == last else 1
        last = m.action
        if repeats_count and run >= max_repeats:
            return "repeated action"
    return None


#: Envs whose good play repeats an action (a bandit's best arm), so that a run of one action is no sign
#: of a degenerate trajectory
REPEATING_ENVS = frozenset({"bandit", "contextual_bandit"})


def _gibberish(text: str) -> bool:
    """Mostly non-word characters, or one short chunk repeated over and over."""
    stripped = text.strip()
    if not stripped:
        return True
    wordy = sum(c.isalnum() or c.isspace() for c in stripped) / len(stripped)
    if wordy < 0.6:
        return True
    words = stripped.split()
    return len(words) >= 12 and len(set(words)) / len(words) < 0.2


def _by_task(trajs: Iterable[Trajectory]) -> dict[str, list[Trajectory]]:
    out: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        out[t.task_id].append(t)
    return out


def expert_games(experts: Sequence[Trajectory]) -> Callable[[tuple[str, Any]], Trajectory | None]:
    """``find(game)``: the expert game a game ``(task_id, env seed)`` is compared with (the pairs)
    or replays (ETO's step-wise plan): the task's expert game of the same env seed
    (:attr:`Trajectory.game`: the same random moves of the sampler, e.g. for an invalid reply, and
    the same expert tie-breaks), else the task's last expert game (ETO's one expert trajectory a
    task; demos collected apart from the exploration, with other seeds)."""
    of_game = {e.game: e for e in experts}
    of_task = {e.task_id: e for e in experts}

    def find(game: tuple[str, Any]) -> Trajectory | None:
        return of_game.get(game) or of_task.get(game[0])

    return find


def _one_env(*groups: Iterable[Trajectory], games: str = "the expert and explored games") -> None:
    """Refuse trajectories of more than one env (``unknown``, an import's default, matches any): task
    ids repeat across envs (``train-0``), so an expert file of one env paired with another's would pair
    games of different envs by their shared ids. Likewise games of one env played under other env
    options (another opponent): their returns would be compared as if one agent had done better.
    Options are compared with the env's defaults filled in (``1`` and ``1.0`` are one value); a game
    that records none (an import, an older file) matches any. ``games`` names the files in the error."""
    groups = tuple(list(g) for g in groups)
    names = sorted({t.env for g in groups for t in g} - {"unknown"})
    if len(names) > 1:
        raise TurnRLError(f"the trajectories are of {len(names)} envs ({', '.join(names)}); pairs are of one env's "
                          f"games: give {games} of one env")
    from turnrl import envs

    settings: list[tuple[Any, dict[str, Any]]] = []  # (options with the defaults filled in, as recorded)
    for t in (t for g in groups for t in g):
        opts = t.meta.get("env_opts")
        if isinstance(opts, dict):
            full = envs.resolved_options(names[0] if names else t.env, opts)
            if all(full != f for f, _ in settings):
                settings.append((full, opts))
    if len(settings) > 1:
        shown = "; ".join(json.dumps(o, sort_keys=True) for _, o in settings[:2])
        raise TurnRLError(f"the trajectories were played under {len(settings)} settings of the env's options "
                          f"({shown}): their returns are not comparable; collect {games} with the same --env-opt")


def _keep_loser(loser: Trajectory, losers: LoserSetting, stats: dict[str, int], *, explored: bool = True) -> bool:
    """Whether a pair keeps ``loser``: "clean" drops a degenerate one of the ``explored`` games (the
    agent's, or an import of ETO's explorations), never an expert game, whatever its ``source``."""
    if losers == "noisy" or not explored:
        return True
    why = degenerate_reason(loser)
    if why is not None:
        stats[f"dropped_{why.replace(' ', '_')}"] = stats.get(f"dropped_{why.replace(' ', '_')}", 0) + 1
        return False
    return True


def trajectory_pairs(
    experts: Sequence[Trajectory],
    explored: Sequence[Trajectory],
    *,
    losers: LoserSetting = "noisy",
    truncate_k: int | None = None,
    stats: dict[str, int] | None = None,
) -> list[Pair]:
    """ETO's trajectory-level pairs (see the module docstring)."""
    _one_env(experts, explored)
    stats = stats if stats is not None else {}
    expert_of = expert_games(experts)
    pairs: list[Pair] = []
    for x in explored:
        if x.meta.get("expert_turns"):
            continue  # a step-wise exploration: see step_pairs
        e = expert_of(x.game)
        if e is None:
            stats["no_expert"] = stats.get("no_expert", 0) + 1
            continue
        if e.return_ == x.return_:
            stats["same_return"] = stats.get("same_return", 0) + 1
            continue
        win, lose = (e, x) if e.return_ > x.return_ else (x, e)
        if not _keep_loser(lose, losers, stats, explored=lose is x):
            continue
        lost = lose.return_  # what the loser scored (a cut loser's own return counts its kept turns only)
        if truncate_k is not None:
            lose = truncate_turns(lose, win.num_turns + truncate_k)
        pairs.append(Pair(x.task_id, win, lose, {
            "kind": "trajectory", "diverge_turn": diverge_turn(win, lose),
            "chosen_return": win.return_, "rejected_return": lost,
            "chosen_source": win.source, "rejected_source": lose.source, "losers": losers}))
    stats["pairs"] = stats.get("pairs", 0) + len(pairs)
    return pairs


def _prefix_matches(a: Trajectory, b: Trajectory, turns: int) -> bool:
    """Do ``a`` and ``b`` hold the same messages up to (not including) agent turn ``turns``?"""
    ma, mb = truncate_turns(a, turns).messages, truncate_turns(b, turns).messages
    return len(ma) == len(mb) and all(x.role == y.role and x.content == y.content for x, y in zip(ma, mb, strict=True))


def step_pairs(
    experts: Sequence[Trajectory],
    explored: Sequence[Trajectory],
    *,
    losers: LoserSetting = "noisy",
    stats: dict[str, int] | None = None,
) -> list[Pair]:
    """ETO's step-wise pairs (see the module docstring)."""
    _one_env(experts, explored)
    stats = stats if stats is not None else {}
    expert_of = expert_games(experts)
    pairs: list[Pair] = []
    for x in explored:
        t = int(x.meta.get("expert_turns", 0) or 0)
        if t <= 0:
            continue
        e = expert_of(x.game)
        if e is None or e.num_turns <= t or x.num_turns <= t:
            stats["no_step"] = stats.get("no_step", 0) + 1
            continue
        if not _prefix_matches(e, x, t):
            stats["prefix_mismatch"] = stats.get("prefix_mismatch", 0) + 1
            continue
        if e.return_ == x.return_ or e.actions[t] == x.actions[t]:
            key = "same_return" if e.return_ == x.return_ else "same_action"
            stats[key] = stats.get(key, 0) + 1
            continue
        win, lose = (e, x) if e.return_ > x.return_ else (x, e)
        if not _keep_loser(truncate_turns(lose, t + 1), losers, stats, explored=lose is x):
            continue
        pairs.append(Pair(x.task_id, truncate_turns(win, t + 1), truncate_turns(lose, t + 1), {
            "kind": "step", "train_from_turn": t, "chosen_return": win.return_,
            "rejected_return": lose.return_, "losers": losers}))
    stats["pairs"] = stats.get("pairs", 0) + len(pairs)
    return pairs


def takeover_pairs(
    experts: Sequence[Trajectory],
    explored: Sequence[Trajectory],
    takeovers: Sequence[Trajectory],
    *,
    losers: LoserSetting = "noisy",
    stats: dict[str, int] | None = None,
) -> list[Pair]:
    """Takeover pairs (see the module docstring). A takeover belongs to the explored game of the
    same task and env seed whose first ``replayed_turns`` turns it holds."""
    _one_env(experts, explored, takeovers)
    stats = stats if stats is not None else {}
    expert_of = expert_games(experts)
    takeovers_of = by_game(takeovers)
    pairs: list[Pair] = []
    for x in explored:
        if x.meta.get("expert_turns") or x.meta.get("replayed_turns"):
            continue
        e = expert_of(x.game)
        if e is None:
            stats["no_expert"] = stats.get("no_expert", 0) + 1
        candidates = [] if e is None else [(0, e)]
        for y in takeovers_of.get(x.game, []):
            t = int(y.meta.get("replayed_turns", 0) or 0)
            if 0 < t < x.num_turns and y.num_turns > t and _prefix_matches(x, y, t):
                candidates.append((t, y))
            else:  # not a takeover of this game (another game of the task and seed, or a forged prefix)
                stats["prefix_mismatch"] = stats.get("prefix_mismatch", 0) + 1
        better = [(t, y) for t, y in candidates if y.return_ > x.return_]
        if not better:  # a game the agent won has nothing to take over; a lost one no better takeover
            key = "agent_won" if x.success else "no_better_takeover"
            stats[key] = stats.get(key, 0) + 1
            continue
        t, win = max(better, key=lambda c: c[0])
        if not _keep_loser(x, losers, stats):
            continue
        pairs.append(Pair(x.task_id, win, x, {
            "kind": "takeover", "train_from_turn": t, "diverge_turn": diverge_turn(win, x),
            "chosen_return": win.return_, "rejected_return": x.return_,
            "chosen_source": win.source, "rejected_source": x.source, "losers": losers}))
    stats["pairs"] = stats.get("pairs", 0) + len(pairs)
    return pairs


def self_play_pairs(
    samples: Sequence[Trajectory],
    *,
    losers: LoserSetting = "noisy",
    stats: dict[str, int] | None = None,
) -> list[Pair]:
    """Best against worst of each task's own samples when their returns differ."""
    _one_env(samples, games="the samples")
    stats = stats if stats is not None else {}
    pairs: list[Pair] = []
    for task, group in _by_task(samples).items():
        ranked = sorted(group, key=lambda t: t.return_)
        best = ranked[-1]
        if best.return_ == ranked[0].return_:
            stats["same_return"] = stats.get("same_return", 0) + 1
            continue
        # "clean" removes degenerate losers: the worst of the samples that remain, if one is below the best
        kept = (t for t in ranked if t.return_ < best.return_ and _keep_loser(t, losers, stats))
        worst = next(kept, None)
        if worst is None:
            continue
        pairs.append(Pair(task, best, worst, {"kind": "self_play", "diverge_turn": diverge_turn(best, worst),
                                              "chosen_return": best.return_,
                                              "rejected_return": worst.return_, "losers": losers}))
    stats["pairs"] = stats.get("pairs", 0) + len(pairs)
    return pairs


# The environment-reward oracle lives with the other preference oracles (turnrl.oracles);
# the name RewardOracle is kept for existing callers.
RewardOracle = EnvRewardOracle


def check_several_samples(samples: Sequence[Trajectory], where: str) -> None:
    """One line where every scored sample is its task's only one (``meta.group_size`` 1): each win rate
    is then 1/2 and every SPPO target 0, so training would not move (``turnrl pairs --scored`` and
    ``turnrl train sppo``; ``where`` names the files)."""
    if samples and all(t.meta.get("group_size") == 1 for t in samples):
        raise TurnRLError(f"{where}: every sample is its task's only one (each task has one sample: its win rate "
                          "would be 1/2 and SPPO's target 0, nothing to train); give several samples a task, e.g. "
                          "several --explored files of the same tasks collected with other --seed values")


def scored_samples(samples: Sequence[Trajectory], *, tau: float = 1.0) -> list[Trajectory]:
    """Each sample with ``meta["win_rate"] = (1/K) sum_k P(y_i > y_k)`` over its task's K samples
    (the sample itself included, as in SPPO, contributing 1/2) under the env-reward oracle;
    :func:`turnrl.oracles.score_samples` with any other oracle."""
    _one_env(samples, games="the samples")
    return score_samples(samples, EnvRewardOracle(tau))
