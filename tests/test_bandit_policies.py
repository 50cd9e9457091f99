"""Scripted bandit algorithms and policies, the load_policy hook, collection, exploration aids."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from turnrl import envs
from turnrl.agent.prompting import PromptConfig
from turnrl.bandits.aids import (
    EpsilonGreedyAid,
    SelfConsistencyAid,
    TryAllAid,
    aid_env_options,
    parse_aid,
    with_aids,
)
from turnrl.bandits.algorithms import (
    EpsilonGreedy,
    Greedy,
    LinUCB,
    LoseShift,
    Setting,
    Thompson,
    argmax_sets,
    make_algorithm,
    random_argmax,
    ucb_values,
)
from turnrl.bandits.policies import ScriptedBanditPolicy
from turnrl.bandits.rationale import format_values, parse_values
from turnrl.bandits.simulate import cumulative_regret, simulate
from turnrl.collect import run_policy
from turnrl.errors import TurnRLError
from turnrl.rollout import RandomPolicy, Reply, Request, load_policy

PAPER = PromptConfig(history=0)

# --------------------------------------------------------------------------- algorithms


def test_ucb_values_by_hand() -> None:
    vals = ucb_values(np.array([[2.0, 1.0, 0.0]]), np.array([[1.0, 0.5, 0.0]]), c=2.0)[0]
    assert vals[0] == pytest.approx(0.5 + 2 * math.sqrt(math.log(3) / 2))
    assert vals[1] == pytest.approx(0.5 + 2 * math.sqrt(math.log(3)))
    assert math.isinf(vals[2])
    assert argmax_sets(np.array([[1.0, math.inf, math.inf]])).tolist() == [[False, True, True]]
    assert argmax_sets(np.array([[1.0, 1.005, 0.2]]), tol=0.01).tolist() == [[True, True, False]]


def test_thompson_posterior_by_hand() -> None:
    algo = Thompson()  # prior N(0.5, 1), known sigma
    state = algo.init(1, Setting(arms=2, sigma=2.0))
    algo.update(state, np.array([0]), np.array([3.0]))
    mean, std = algo.posterior(state)
    prec = 1.0 + 1.0 / 4.0
    assert mean[0, 0] == pytest.approx((0.5 + 3.0 / 4.0) / prec) and std[0, 0] == pytest.approx(prec**-0.5)
    assert mean[0, 1] == pytest.approx(0.5) and std[0, 1] == pytest.approx(1.0)
    bern = algo.init(1, Setting(arms=1, dist="bernoulli"))
    for r in (1.0, 1.0, 0.0):
        algo.update(bern, np.array([0]), np.array([r]))
    assert algo.posterior(bern)[0][0, 0] == pytest.approx(3 / 5)  # Beta(3, 2)
    p = algo.probs(state)
    assert p.sum() == pytest.approx(1.0) and p[0, 0] > 0.5


def test_linucb_is_ridge_regression_with_a_bonus() -> None:
    rng = np.random.default_rng(0)
    algo = LinUCB(alpha=0.7, lam=2.0)
    state = algo.init(1, Setting(arms=2, dim=3))
    xs, rs = rng.normal(size=(15, 3)), rng.normal(size=15)
    for x, r in zip(xs, rs, strict=True):
        algo.update(state, np.array([1]), np.array([r]), x[None])
    x = rng.normal(size=3)
    a = 2.0 * np.eye(3) + xs.T @ xs
    theta = np.linalg.solve(a, xs.T @ rs)
    want = theta @ x + 0.7 * math.sqrt(x @ np.linalg.solve(a, x))
    assert algo.scores(state, x[None])[0, 1] == pytest.approx(want, rel=1e-9)
    assert algo.scores(state, x[None])[0, 0] == pytest.approx(0.7 * math.sqrt(x @ x / 2.0))


def test_epsilon_greedy_distribution() -> None:
    algo = EpsilonGreedy(eps=0.2)
    state = algo.init(1, Setting(arms=4))
    algo.update(state, np.array([2]), np.array([1.0]))
    assert algo.probs(state)[0].tolist() == pytest.approx([0.05, 0.05, 0.85, 0.05])
    g = Greedy()
    assert g.probs(state)[0].tolist() == [0.0, 0.0, 1.0, 0.0]  # untried arms are never explored
    assert Greedy(init=2.0).probs(state)[0].tolist() == pytest.approx([1 / 3, 1 / 3, 0.0, 1 / 3])


def test_epsilon_greedy_untried_explores_only_untried_arms() -> None:
    """``untried=1``: eps spread over the untried arms; with none left the exploring step is greedy."""
    algo = make_algorithm("epsilon-greedy:eps=0.2,untried=1")
    assert algo.spec == "epsilon-greedy:eps=0.2,untried=1"
    state = algo.init(2, Setting(arms=4))
    algo.update(state, np.array([2, 0]), np.array([1.0, 0.5]))
    algo.update(state, np.array([0, 1]), np.array([0.0, 0.9]))
    algo.update(state, np.array([-1, 2]), np.array([0.0, 0.1]))
    algo.update(state, np.array([-1, 3]), np.array([0.0, 0.2]))
    p = algo.probs(state)
    assert p[0].tolist() == pytest.approx([0.0, 0.1, 0.8, 0.1])  # greedy arm 2; arms 1 and 3 untried
    assert p[1].tolist() == pytest.approx([0.0, 1.0, 0.0, 0.0])  # all tried: explore = greedy
    arms, explored = algo.choose(state, None, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    draws = np.array([algo.choose(state, None, rng)[0] for _ in range(400)])
    assert set(draws[:, 0].tolist()) == {1, 2, 3} and set(draws[:, 1].tolist()) == {1}
    assert 0.12 < float(np.mean(draws[:, 0] != 2)) < 0.28  # eps 0.2 of 400 draws
    assert explored.dtype == bool and arms.shape == (2,)
    flags = np.array([algo.choose(state, None, rng)[1] for _ in range(200)])
    assert flags[:, 0].any() and not flags[:, 1].any()  # all tried: an exploring step is greedy, no exploration


def test_lose_shift_by_hand() -> None:
    """Stay after a reward at or above the threshold, else the next arm (cyclic); first pull uniform."""
    algo = LoseShift(threshold=0.0)
    state = algo.init(3, Setting(arms=4))
    assert algo.probs(state)[0].tolist() == [0.25] * 4
    algo.update(state, np.array([1, 3, 2]), np.array([0.0, -0.1, 0.7]))
    assert algo.probs(state).tolist() == [[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0]]
    algo.update(state, np.array([-1, 0, 2]), np.array([9.0, 2.0, -3.0]))  # an invalid pull keeps the last
    assert algo.select(state, None, np.random.default_rng(0)).tolist() == [1, 0, 3]
    assert algo.choose(state, None, np.random.default_rng(0))[1].tolist() == [False, False, True]  # row 2 shifts
    assert make_algorithm("wsls").spec == "lose-shift" and make_algorithm("lose-shift:threshold=-1").spec == \
        "lose-shift:threshold=-1"


def test_lose_shift_follow_by_hand() -> None:
    """``follow`` is the chance that a low reward does shift: probs put it on the next arm and the
    rest on the last; the most likely arm (``scores``) is the last one below 1/2; sampling matches."""
    algo = make_algorithm("lose-shift:threshold=0,follow=0.3")
    state = algo.init(4000, Setting(arms=4))
    algo.update(state, np.array([1, 3] * 2000), np.array([-1.0, 1.0] * 2000))  # even rows low, odd rows high
    assert np.allclose(algo.probs(state)[:2], [[0, 0.7, 0.3, 0], [0, 0, 0, 1]])
    assert algo.scores(state)[0].tolist() == [0, 1, 0, 0]
    arms, low = algo.choose(state, None, np.random.default_rng(0))
    assert set(arms[1::2].tolist()) == {3} and not low[1::2].any()  # high: always stays
    assert low[::2].all() and set(arms[::2].tolist()) == {1, 2}  # low (what the rationale says): moves or stays
    assert abs((arms[::2] == 2).mean() - 0.3) < 0.04
    half = make_algorithm("lose-shift:threshold=0,follow=0.5")
    s2 = half.init(1, Setting(arms=4))
    half.update(s2, np.array([0]), np.array([-1.0]))
    assert half.scores(s2)[0].tolist() == [1, 1, 0, 0]  # a tie between staying and moving on
    with pytest.raises(TurnRLError, match="follow must be in"):
        make_algorithm("lose-shift:follow=1.5")


def test_lose_shift_follow_one_draws_as_before() -> None:
    """With ``follow`` 1 (the default) the draws are those of the rule as it was written before
    ``follow`` existed (a one-hot score on the planned arm, ties broken by ``random_argmax``), the
    seed included, so documented lose-shift numbers and datasets reproduce."""

    class PlainRule(LoseShift):
        def scores(self, state: Any, ctx: Any = None) -> np.ndarray:
            last, k = state.extra["last_arm"], state.setting.arms
            nxt = np.where(self.shifts(state), (last + 1) % k, last)
            out = np.zeros((state.n, k))
            tried = last >= 0
            out[np.flatnonzero(tried), nxt[tried]] = 1.0
            return out

        def choose(self, state: Any, ctx: Any, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
            return random_argmax(self.scores(state), rng), self.shifts(state)

        def select(self, state: Any, ctx: Any, rng: np.random.Generator) -> np.ndarray:
            return self.choose(state, ctx, rng)[0]

    env = envs.make("bandit", arms=10, noise="medium", horizon=20)
    inst = env.instances(env.task_ids("seen")[:30])
    want = simulate(PlainRule(), inst, seed=3)
    for spec in ("lose-shift", "lose-shift:follow=1"):
        assert np.array_equal(simulate(make_algorithm(spec), inst, seed=3).arms, want.arms), spec
    assert not np.array_equal(simulate(make_algorithm("lose-shift:follow=0.5"), inst, seed=3).arms, want.arms)
    assert make_algorithm("lose-shift:follow=1").spec == "lose-shift"


def test_lose_shift_rationale_says_when_it_does_not_act_on_a_low_reward() -> None:
    """The full-format rationale of ``follow`` < 1: a low reward it does not act on reads
    "low, but I stay", never "not low"."""
    from turnrl.bandits.scripted import ScriptedAgent

    agent = ScriptedAgent(make_algorithm("lose-shift:threshold=0.5,follow=0.5"))
    env: Any = envs.make("bandit", arms=4, horizon=40)
    env.reset(options={"task_id": "bandit-3"})
    seen: set[str] = set()
    rng = np.random.default_rng(0)
    for _ in range(39):
        last = env.history[-1] if env.history else None
        d = agent.decide(env, rng)
        if last is None:
            case = "Nothing is tried yet"
        elif last[1] >= 0.5:
            case = "not low, so I stay with"
            assert d.arm == last[0]
        elif d.arm == last[0]:
            case = "was low, but I stay with"
        else:
            case = "was low, so I move on to"
            assert d.arm == (last[0] + 1) % 4
        assert case in d.thought, (case, d.thought)
        seen.add(case)
        env.step(d.label)
    assert len(seen) == 4, seen


def test_lose_shift_beats_committing_on_ten_noisy_arms() -> None:
    """Its regret@50 on 10 Gaussian arms (sigma 1) is well below greedy's (which commits)."""
    env = envs.make("bandit", arms=10, noise="medium", horizon=50)
    inst = env.instances(env.task_ids("seen")[:400])
    final = {spec: float(cumulative_regret(simulate(make_algorithm(spec), inst, seed=0))[:, -1].mean())
             for spec in ("lose-shift", "greedy")}
    assert final["lose-shift"] < final["greedy"] - 3, final


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("ucbb", "unknown bandit policy 'ucbb' (did you mean 'ucb'?)"),
        ("ucb:d=2", "unknown parameter 'd'; choose from: c"),
        ("ucb:c=abc", "c must be a number (got 'abc')"),
        ("ucb:c=-1", "c must be >= 0 (got -1.0)"),
        ("epsilon-greedy:eps=1.5", "eps must be in [0, 1] (got 1.5)"),
        ("epsilon-greedy:untried=0.5", "untried must be 0 or 1 (got 0.5)"),
        ("linucb:lam=0", "lam must be > 0"),
        ("thompson:prior_std=1e-200", "prior_std must be >= 1e-6"),  # its square underflowed: ZeroDivisionError
        ("ucb:c", "expected key=value"),
    ],
)
def test_bad_specs_are_one_line_errors(spec: str, needle: str) -> None:
    with pytest.raises(TurnRLError) as e:
        make_algorithm(spec)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_specs_round_trip() -> None:
    assert make_algorithm("ucb:c=2").c == 2.0 and make_algorithm("ucb:c=2").spec == "ucb:c=2"
    assert make_algorithm("eps-greedy:eps=0.3").spec == "epsilon-greedy:eps=0.3"
    assert make_algorithm("greedy").spec == "greedy" and make_algorithm("greedy:init=0").spec == "greedy:init=0"
    assert make_algorithm("ts").name == "thompson"


# ---------------------------------------------------------------------- load_policy hook


@pytest.mark.parametrize(
    ("spec", "cls", "param"),
    [("ucb", "UCB", None), ("ucb:c=2", "UCB", ("c", 2.0)), ("linucb", "LinUCB", None),
     ("thompson", "Thompson", None), ("epsilon-greedy:eps=0.1", "EpsilonGreedy", ("eps", 0.1)),
     ("greedy", "Greedy", None), ("uniform", "RandomAlgo", None)],
)
def test_load_policy_resolves_scripted_specs(spec: str, cls: str, param) -> None:
    pol = load_policy(spec)
    assert isinstance(pol, ScriptedBanditPolicy) and type(pol.algo).__name__ == cls
    if param:
        assert pol.algo.params[param[0]] == param[1]
    assert isinstance(load_policy("random"), RandomPolicy)


def replay_ucb_check(trajs, c: float, arms: int) -> int:
    """Every action of a UCB trajectory maximises the UCB values of its history, and the
    rationale states those values. Returns the number of checked steps."""
    checked = 0
    env = envs.make("bandit", arms=arms, horizon=len(trajs[0].rewards))
    for t in trajs:
        env.reset(options={"task_id": t.task_id})
        counts, sums = np.zeros(arms), np.zeros(arms)
        for msg in (m for m in t.messages if m.role == "assistant"):
            want = ucb_values(counts[None], sums[None], c)[0]
            stated = parse_values(msg.content, env.labels)
            assert np.allclose(np.where(np.isinf(want), 1e9, want), np.where(np.isinf(stated), 1e9, stated),
                               atol=0.006)
            assert msg.content.splitlines()[-1] == f"ACTION={msg.action}"
            arm = env.labels.index(msg.action)
            assert argmax_sets(want[None])[0, arm]
            _, r, *_ = env.step(msg.action)
            counts[arm] += 1
            sums[arm] += r
            checked += 1
    return checked


def test_ucb_through_the_sampler_follows_its_rule() -> None:
    trajs = run_policy(load_policy("ucb:c=2"), "bandit", split="train", episodes=6, num_envs=4,
                       env_opts={"arms": 5, "horizon": 25}, prompt=PAPER)
    assert replay_ucb_check(trajs, 2.0, 5) == 150
    assert all(m.valid for t in trajs for m in t.messages if m.role == "assistant")


def test_the_simulation_follows_the_same_rule_and_table() -> None:
    env = envs.make("bandit", arms=5, horizon=30)
    inst = env.instances(env.task_ids("seen")[:16])
    run = simulate(make_algorithm("ucb"), inst, seed=3)
    for i in range(16):
        counts, sums = np.zeros(5), np.zeros(5)
        for t in range(30):
            a = run.arms[i, t]
            assert argmax_sets(ucb_values(counts[None], sums[None], 1.0))[0, a]
            assert run.rewards[i, t] == inst.rewards[i, t, a]
            counts[a] += 1
            sums[a] += run.rewards[i, t]


@pytest.mark.parametrize("spec", ["thompson", "epsilon-greedy:eps=0.5", "greedy", "linucb", "lose-shift"])
def test_other_scripted_policies_play_valid_actions(spec: str) -> None:
    trajs = run_policy(load_policy(spec), "bandit", split="seen", episodes=4, num_envs=2,
                       env_opts={"arms": 4, "horizon": 16}, prompt=PAPER)
    turns = [m for t in trajs for m in t.messages if m.role == "assistant"]
    head = "LinUCB values: " if spec == "linucb" else "UCB values: "
    assert len(turns) == 64 and all(m.valid and m.content.startswith(head) for m in turns)
    if spec == "linucb":  # it acts on the values it states (it stated UCB1's and acted on its own)
        for m in turns:
            block = m.content.split(": ", 1)[1].split(". ")[0]  # "blue=0.52, green=1.00, ..."
            values = {k: float(v) for k, v in (pair.split("=") for pair in block.split(", "))}
            assert values[m.action] == max(values.values()), m.content
    if spec.startswith("epsilon"):
        explored = sum("I explore" in m.content for m in turns)
        assert 16 <= explored <= 48  # eps = 0.5 of 64 steps
    if spec == "greedy":  # commits to its first arm
        assert all(len(set(t.actions)) == 1 for t in trajs)
    if spec == "lose-shift":  # the reason names the last reward's side of the threshold
        assert all(any(w in m.content for w in ("was low, so I move on", "not low, so I stay", "Nothing is tried"))
                   for m in turns)


def test_linucb_on_the_contextual_bandit_and_collections_are_reproducible() -> None:
    kw = {"split": "train", "episodes": 6, "env_opts": {"items": 3, "horizon": 8}, "prompt": PAPER}
    a = run_policy(load_policy("linucb"), "contextual_bandit", num_envs=1, **kw)
    b = run_policy(load_policy("linucb"), "contextual_bandit", num_envs=5, **kw)
    assert [t.to_dict() for t in a] == [t.to_dict() for t in b]
    assert all(m.content.startswith("LinUCB values: ") for t in a for m in t.messages if m.role == "assistant")
    # a context-free algorithm writes the UCB1 values it computes, not under LinUCB's name
    u = run_policy(load_policy("ucb"), "contextual_bandit", num_envs=1, **kw)
    assert all(m.content.startswith("UCB values: ") for t in u for m in t.messages if m.role == "assistant")


def test_scripted_policy_refuses_other_envs() -> None:
    with pytest.raises(TurnRLError, match="needs a bandit env"):
        run_policy(load_policy("ucb"), "tictactoe", episodes=1)


def test_collect_writes_thought_cloning_data(tmp_path: Path, capsys) -> None:
    from turnrl.cli import main

    out = tmp_path / "ucb.jsonl"
    with pytest.raises(SystemExit) as e:
        main(["collect", "--env", "bandit", "--policy", "ucb:c=2", "--out", str(out), "--episodes", "3",
              "--env-opt", "arms=3", "--env-opt", "horizon=5"])
        raise SystemExit(0)
    assert e.value.code in (0, None), capsys.readouterr().err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and rows[0]["meta"]["policy"] == "ucb:c=2"
    first = rows[0]["messages"][2]["content"]
    assert first.startswith("UCB values: blue=inf, green=inf, red=inf.") and "\nACTION=" in first


def test_format_and_parse_values() -> None:
    text = format_values(["blue", "green", "red"], [1.234, math.inf, -0.3])
    assert text == "UCB values: blue=1.23, green=inf, red=-0.30"
    assert parse_values(f"Thought: {text}. Pick green.\nACTION=green", ["blue", "green", "red"]).tolist() == \
        [1.23, math.inf, -0.3]
    two = "ucb values: blue=9\nlater: UCB values: Blue=0.5, purple=3, red = 2"
    got = parse_values(two, ["blue", "green", "red"])
    assert got[0] == 0.5 and math.isnan(got[1]) and got[2] == 2.0
    assert np.isnan(parse_values("no block here ACTION=blue", ["blue"])).all()


# ----------------------------------------------------------------------------- aids


class Stub:
    """A policy that answers ``ACTION=<fixed>`` (or cycles answers) and counts calls."""

    name = "stub"

    def __init__(self, answers: Sequence[str]):
        self.answers = list(answers)
        self.calls = 0
        self.seen = 0

    def act(self, requests: Sequence[Request]) -> list[Reply]:
        self.calls += 1
        out = []
        for _ in requests:
            out.append(Reply(f"because\nACTION={self.answers[self.seen % len(self.answers)]}"))
            self.seen += 1
        return out


def test_try_all_tries_every_arm_first() -> None:
    stub = Stub(["blue"])
    trajs = run_policy(TryAllAid(stub), "bandit", split="train", episodes=4, num_envs=4,
                       env_opts={"arms": 5, "horizon": 9}, prompt=PAPER)
    for t in trajs:
        assert sorted(t.actions[:5]) == sorted(envs.make("bandit", arms=5).labels)  # type: ignore[type-var]
        assert t.actions[5:] == ["blue"] * 4
    assert stub.calls == 4  # the model is asked only once every arm was tried, one call per step


def test_epsilon_greedy_aid_extremes() -> None:
    stub = Stub(["red"])
    trajs = run_policy(EpsilonGreedyAid(stub, eps=1.0), "bandit", episodes=2, env_opts={"arms": 3, "horizon": 5},
                       prompt=PAPER)
    assert stub.calls == 0 and all("I explore" in m.content for t in trajs for m in t.messages
                                   if m.role == "assistant")
    trajs = run_policy(EpsilonGreedyAid(stub, eps=0.0), "bandit", episodes=2, env_opts={"arms": 3, "horizon": 5},
                       prompt=PAPER)
    assert all(a == "red" for t in trajs for a in t.actions)
    with pytest.raises(TurnRLError, match="eps must be in"):
        EpsilonGreedyAid(stub, eps=2.0)


def test_self_consistency_takes_the_majority_in_one_call() -> None:
    stub = Stub(["red", "blue", "red", "nonsense", "green"])
    policy = SelfConsistencyAid(stub, k=5)
    trajs = run_policy(policy, "bandit", episodes=1, env_opts={"arms": 3, "horizon": 3}, prompt=PAPER)
    assert trajs[0].actions == ["red", "red", "red"]
    assert stub.calls == 3  # one batched call of k samples per step


class Checker:
    """Answers ``ACTION=<first>`` when asked, and ``<checked>`` when shown its answer for review;
    records the review requests."""

    name = "checker"

    def __init__(self, first: str, checked: str):
        self.first, self.checked = first, checked
        self.reviews: list[Request] = []

    def act(self, requests: Sequence[Request]) -> list[Reply]:
        out = []
        for r in requests:
            if "Your answer to the above was:" in r.messages[-1].content:
                self.reviews.append(r)
                out.append(Reply(f"I check it.\n{self.checked}", token_ids=[7, 8]))
            else:
                out.append(Reply(f"first thought\nACTION={self.first}", token_ids=[1, 2, 3]))
        return out


def test_self_correction_acts_on_the_checked_reply_and_keeps_the_first_when_the_check_names_none() -> None:
    from turnrl.bandits.aids import REVIEW, SelfCorrectionAid

    fixer = Checker("red", "ACTION=green")
    trajs = run_policy(SelfCorrectionAid(fixer), "bandit", episodes=2, num_envs=2,
                       env_opts={"arms": 3, "horizon": 3}, prompt=PAPER)
    assert [t.actions for t in trajs] == [["green"] * 3] * 2
    turns = [m for t in trajs for m in t.messages if m.role == "assistant"]
    assert all(m.content == "I check it.\nACTION=green" and m.token_ids is None for m in turns)  # not sampled here
    assert len(fixer.reviews) == 6  # one review a step, asked in one batch per step
    review = fixer.reviews[0]
    assert review.messages[-1].content.endswith(REVIEW.format(reply="first thought\nACTION=red"))
    assert review.key is not None and review.key.endswith("/self-correction")
    # the transcript keeps the plain observation: the review was only in the second request
    assert not any("Your answer to the above" in m.content for t in trajs for m in t.messages)
    keeper = Checker("red", "I am not sure.")
    trajs = run_policy(SelfCorrectionAid(keeper), "bandit", episodes=1, env_opts={"arms": 3, "horizon": 2},
                       prompt=PAPER)
    assert trajs[0].actions == ["red", "red"]
    kept = [m for m in trajs[0].messages if m.role == "assistant"]
    assert all(m.token_ids == [1, 2, 3] for m in kept)  # the first reply, sampled in the transcript's context


def test_aid_specs() -> None:
    assert parse_aid("epsilon-greedy:eps=0.2") == ("epsilon-greedy", {"eps": 0.2})
    assert aid_env_options(["summary", "randomize", "try-all"]) == {"summary": True, "randomize_labels": True}
    wrapped = with_aids(Stub(["blue"]), ["try-all", "self-consistency:k=3", "epsilon-greedy"])
    assert isinstance(wrapped, TryAllAid) and isinstance(wrapped.inner, EpsilonGreedyAid)
    assert isinstance(wrapped.inner.inner, SelfConsistencyAid) and wrapped.inner.inner.k == 3
    from turnrl.bandits.aids import SelfCorrectionAid

    both = with_aids(Stub(["blue"]), ["self-consistency:k=2", "self-correction"])  # votes over checked replies
    assert isinstance(both, SelfConsistencyAid) and isinstance(both.inner, SelfCorrectionAid)
    for bad, needle in (("tryall", "did you mean 'try-all'"), ("try-all:k=2", "unknown parameter 'k'"),
                        ("self-consistency:k=x", "k must be a number"),
                        ("epsilon-greedy:eps", "expected key=value, got 'eps'")):
        with pytest.raises(TurnRLError, match=needle):
            parse_aid(bad)
    for k in ("nan", "inf", "2.5"):  # a one-line error, not a ValueError / OverflowError from int()
        with pytest.raises(TurnRLError, match="k must be an integer"):
            with_aids(Stub(["blue"]), [f"self-consistency:k={k}"])


def test_a_scripted_policy_takes_the_envs_ucb_constant_unless_its_spec_gives_one() -> None:
    """``turnrl collect --policy ucb --env-opt ucb_c=2``: the instruction asked for c = 2 values and the
    policy wrote (and acted on) c = 1 values. LinUCB on the contextual bandit takes it as ``alpha``, as
    the env's expert does."""
    def replies(spec: str, env: str = "bandit", **opts: Any) -> list[str]:
        trajs = run_policy(load_policy(spec), env, split="seen", episodes=3, num_envs=3,
                           env_opts={"horizon": 12, **opts}, prompt=PAPER)
        return [m.content for t in trajs for m in t.messages if m.role == "assistant"]

    env_c = replies("ucb", arms=4, ucb_c=2.0)
    assert env_c == replies("ucb:c=2", arms=4, ucb_c=2.0) != replies("ucb:c=1", arms=4, ucb_c=2.0)
    assert replies("ucb:c=1", arms=4, ucb_c=2.0) == replies("ucb", arms=4)  # a spec's own c wins
    lin = replies("linucb", "contextual_bandit", items=4, ucb_c=0.25)
    assert lin == replies("linucb:alpha=0.25,c=0.25", "contextual_bandit", items=4, ucb_c=0.25)
    assert lin != replies("linucb", "contextual_bandit", items=4)
