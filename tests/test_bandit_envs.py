"""The bandit and contextual-bandit envs: contract, options, prompts, instances, splits."""

from __future__ import annotations

import random
import re
import warnings

import numpy as np
import pytest

from turnrl import envs
from turnrl.envs.bandit import BERNOULLI_GAP, COLOURS, GAUSSIAN_SIGMA
from turnrl.envs.checker import check_env
from turnrl.envs.contextual_bandit import NEW_OCCUPATIONS
from turnrl.errors import TurnRLError


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("bandit", {"arms": 5, "variant": "continuous", "horizon": 12}),
        ("bandit", {"arms": 20, "dist": "bernoulli", "noise": "high", "horizon": 8}),
        ("bandit", {"noise": "low", "randomize_labels": True, "summary": True, "rationale": "ucb", "context": 3}),
        ("contextual_bandit", {"items": 10, "horizon": 9, "randomize_labels": True, "summary": True}),
        ("contextual_bandit", {"noise": "high", "rationale": "ucb", "context": 0}),
        ("bandit", {"summary": "best", "context": 0, "randomize_labels": True}),
        ("bandit", {"summary": "best-kv", "context": 0}),
    ],
)
def test_variants_keep_the_contract(name: str, kwargs: dict) -> None:
    assert check_env(name, episodes=2, seed=5, **kwargs) == []


@pytest.mark.parametrize(
    ("name", "kwargs", "needle"),
    [
        ("bandit", {"arms": 0}, "arms must be an integer from 2 to 20 (got 0)"),
        ("bandit", {"arms": 21}, "arms must be an integer from 2 to 20 (got 21)"),
        ("bandit", {"arms": True}, "arms must be an integer"),
        ("bandit", {"noise": "extreme"}, "noise must be one of low, medium, high (got 'extreme')"),
        ("bandit", {"dist": "poisson"}, "dist must be one of gaussian, bernoulli (got 'poisson')"),
        ("bandit", {"variant": "slider"}, "variant must be one of button, continuous (got 'slider')"),
        ("bandit", {"horizon": 0}, "horizon must be an integer from 1 to 1000 (got 0)"),
        ("bandit", {"context": -1}, "context must be an integer"),
        ("bandit", {"summary": "yes"}, "summary must be true, false, best or best-kv (got 'yes')"),
        ("bandit", {"summary": 1.0}, "summary must be true, false, best or best-kv (got 1.0)"),
        ("bandit", {"rationale": "long"}, "rationale must be one of short, ucb (got 'long')"),
        ("bandit", {"ucb_c": -1}, "ucb_c must be a number in [0, 100] (got -1)"),
        ("contextual_bandit", {"items": 1}, "items must be an integer from 2 to 20 (got 1)"),
        ("contextual_bandit", {"noise": "loud"}, "noise must be one of low, medium, high (got 'loud')"),
        ("bandit", {"arm": 5}, "unknown option 'arm' for env 'bandit' (did you mean 'arms'?)"),
    ],
)
def test_bad_options_are_one_line_errors(name: str, kwargs: dict, needle: str) -> None:
    with pytest.raises(TurnRLError) as e:
        envs.make(name, **kwargs)
    assert needle in str(e.value) and "\n" not in str(e.value)


def play(env, actions):
    out = []
    for a in actions:
        out.append(env.step(a))
    return out


def test_prompt_is_the_papers() -> None:
    env = envs.make("bandit", arms=5, horizon=6, context=3)
    obs, info = env.reset(options={"task_id": "bandit-3"})
    assert "5 buttons labeled blue, green, red, yellow, purple" in env.instruction
    assert "ACTION=X" in env.instruction and "6 time steps" in env.instruction
    assert obs == "No buttons chosen yet.\nStep 1 of 6. Which button do you press?"
    assert info["valid_actions"] == ["blue", "green", "red", "yellow", "purple"]
    inst = env.instance("bandit-3")
    steps = play(env, ["blue", "red", "red", "purple", "green"])
    obs = steps[-1][0]
    lines = obs.splitlines()
    assert lines[0] == "(Showing the last 3 of 5 steps.)"
    assert lines[1] == f"Step=3 Action=red Reward={inst.rewards[2, 2]:.2f}"
    assert lines[3] == f"Step=5 Action=green Reward={inst.rewards[4, 1]:.2f}"
    assert lines[-1] == "Step 6 of 6. Which button do you press?"
    assert all(re.fullmatch(r"Step=\d+ Action=\w+ Reward=-?\d+\.\d\d", ln) for ln in lines[1:4])
    obs, _, terminated, truncated, info = env.step("yellow")
    assert terminated and not truncated and "All 6 steps are done" in obs and "success" in info
    with pytest.raises(TurnRLError, match="episode is over"):
        env.step("blue")


def test_no_context_says_earlier_steps_are_hidden() -> None:
    env = envs.make("bandit", arms=5, horizon=6, context=0)
    env.reset(options={"task_id": "bandit-3"})
    obs = play(env, ["blue", "red"])[-1][0]
    assert obs.splitlines() == ["(Earlier steps are not shown.)", "Step 3 of 6. Which button do you press?"]


def test_continuous_variant_and_ucb_rationale_prompt() -> None:
    env = envs.make("bandit", arms=4, variant="continuous", rationale="ucb", ucb_c=2)
    env.reset(seed=0)
    assert "4 arms labeled 0, 1, 2, 3" in env.instruction
    assert "UCB values: 0=..., 1=..., 2=..., ..." in env.instruction and "mean reward + 2 * sqrt" in env.instruction
    assert env.valid_actions() == ["0", "1", "2", "3"]
    step = env.expert(random.Random(0))
    assert step.thought.startswith("UCB values: 0=inf, 1=inf, 2=inf, 3=inf.")


def test_rewards_come_from_the_instance_table() -> None:
    env = envs.make("bandit", arms=3, horizon=20)
    inst = env.instance("bandit-11")
    env.reset(options={"task_id": "bandit-11"})
    rng = random.Random(1)
    regret = 0.0
    for t in range(20):
        arm = rng.randrange(3)
        _, reward, _, _, info = env.step(env.labels[arm])
        assert reward == inst.rewards[t, arm] and info["arm"] == arm
        assert info["expected_reward"] == inst.mu[t, arm] != reward
        regret += inst.mu[t].max() - inst.mu[t, arm]
        assert info["regret"] == pytest.approx(regret, abs=1e-5)
        assert info["means"] == pytest.approx(list(inst.mu[0])) and info["best_arm"] == int(np.argmax(inst.mu[0]))
    # a longer horizon extends the same table
    long = envs.make("bandit", arms=3, horizon=200).instance("bandit-11")
    assert np.array_equal(long.rewards[:20], inst.rewards) and np.array_equal(long.mu[0], inst.mu[0])


@pytest.mark.parametrize("noise", ["low", "medium", "high"])
def test_gaussian_and_bernoulli_levels(noise: str) -> None:
    g = envs.make("bandit", noise=noise, horizon=400)
    inst = g.instance("bandit-2")
    assert np.all((inst.mu >= 0) & (inst.mu <= 1))
    resid = inst.rewards - inst.mu
    assert np.std(resid) == pytest.approx(GAUSSIAN_SIGMA[noise], rel=0.1)
    hard = g.instance("bandit-hard-2")
    assert np.all((hard.mu >= 0.25) & (hard.mu <= 0.75))
    b = envs.make("bandit", dist="bernoulli", noise=noise, arms=5)
    means = b.instance("bandit-2").mu[0]
    assert means.max() - means.min() == pytest.approx(BERNOULLI_GAP[noise])
    assert sorted(set(np.round(means, 6))) == pytest.approx([0.5 - BERNOULLI_GAP[noise] / 2,
                                                             0.5 + BERNOULLI_GAP[noise] / 2])
    hard_means = b.instance("bandit-hard-2").mu[0]
    assert hard_means.max() - hard_means.min() == pytest.approx(BERNOULLI_GAP[noise] / 2)
    assert set(np.unique(b.instance("bandit-2").rewards)) <= {0.0, 1.0}


def test_splits_and_task_ids() -> None:
    for name in ("bandit", "contextual_bandit"):
        env = envs.make(name)
        ids = {s: env.task_ids(s) for s in ("train", "seen", "unseen")}
        assert len(ids["train"]) == 1000 and len(ids["seen"]) == len(ids["unseen"]) == 200
        assert not set(ids["train"]) & (set(ids["seen"]) | set(ids["unseen"]))
        with pytest.raises(TurnRLError, match="unknown task id 'nope'"):
            env.reset(options={"task_id": "nope"})
        with pytest.raises(TurnRLError, match="unknown split"):
            env.task_ids("test")


def test_randomized_labels_follow_the_current_step() -> None:
    env = envs.make("bandit", arms=5, horizon=30, randomize_labels=True)
    inst = env.instance("bandit-4")
    assert inst.perms is not None
    env.reset(options={"task_id": "bandit-4"})
    seen = set()
    for t in range(30):
        labels = env.labels_now()
        assert labels == [env.labels[j] for j in inst.perms[t]]
        seen.add(tuple(labels))
        obs, reward, _, _, info = env.step("green")
        arm = labels.index("green")
        assert info["arm"] == arm and reward == inst.rewards[t, arm]
        if t < 29:  # the shown history uses the next step's labels
            now = env.labels_now()
            first = obs.splitlines()[1 if t >= env.context else 0]
            if t < env.context:
                assert first.startswith(f"Step=1 Action={now[env.history[0][0]]} ")
    assert len(seen) > 20


def test_context_summary() -> None:
    env = envs.make("bandit", arms=3, horizon=5, summary=True)
    inst = env.instance("bandit-0")
    env.reset(options={"task_id": "bandit-0"})
    play(env, ["blue", "blue", "red"])
    obs = env.render()
    mean_blue = (inst.rewards[0, 0] + inst.rewards[1, 0]) / 2
    assert f"Summary: blue 2x mean {mean_blue:.2f}; green 0x; red 1x mean {inst.rewards[2, 2]:.2f}." in obs


def test_best_summary_names_the_greedy_arm_and_the_untried_ones() -> None:
    env = envs.make("bandit", arms=4, horizon=8, summary="best", context=0)
    inst = env.instance("bandit-0")
    env.reset(options={"task_id": "bandit-0"})
    assert "Best so far" not in env.render()  # nothing tried yet
    play(env, ["blue", "blue", "red", "zzz"])  # an invalid pull counts nowhere
    means = {"blue": (inst.rewards[0, 0] + inst.rewards[1, 0]) / 2, "red": inst.rewards[2, 2]}
    best = max(means, key=lambda k: means[k])
    n = {"blue": 2, "red": 1}[best]
    assert f"Best so far: {best} {means[best]:.2f} ({n}x). Untried: green, yellow." in env.render()
    play(env, ["green", "yellow"])
    assert env.render().splitlines()[-2].endswith("Untried: none.")


@pytest.mark.parametrize(("summary", "line"), [("best", "Best so far: none. Untried: blue, green, red."),
                                              ("best-kv", "Best=none. Untried=blue,green,red.")])
def test_best_summary_after_only_invalid_pulls_names_no_arm(summary: str, line: str) -> None:
    """An invalid first reply counts as a step but tries no arm: the summary must not name
    an arbitrary arm as the best one with a mean of nan."""
    env = envs.make("bandit", arms=3, horizon=4, summary=summary, context=0)
    env.reset(options={"task_id": "bandit-0"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no 0/0
        obs, *_ = env.step("zzz")
    assert obs.splitlines()[-2] == line and "nan" not in obs


def test_best_kv_summary_writes_each_label_as_a_reply_writes_its_action() -> None:
    """``summary=best-kv``: the same facts as ``best``, as ``key=value`` pairs, so the tiny
    tokenizer reads each label as the same token as in ``ACTION=<label>``."""
    from turnrl.models.loading import load_tokenizer

    kv, plain = (envs.make("bandit", arms=4, horizon=8, summary=s, context=0) for s in ("best-kv", "best"))
    for env in (kv, plain):
        env.reset(options={"task_id": "bandit-3"})
        play(env, ["red", "blue", "red"])
    line, plain_line = kv.render().splitlines()[-2], plain.render().splitlines()[-2]
    best = plain_line.split()[3]
    assert line == plain_line.replace("Best so far: ", "Best=").replace("Untried: ", "Untried=").replace(", ", ",")
    assert line.endswith("Untried=green,yellow.") and line.startswith(f"Best={best} ")
    tok = load_tokenizer("tiny")
    action = tok.tokenize(f"ACTION={best}")[-1]
    assert action in tok.tokenize(line) and action not in tok.tokenize(plain_line)
    play(kv, ["green", "yellow"])
    assert kv.render().splitlines()[-2].endswith("Untried=none.")


def test_invalid_action_pays_nothing_and_counts() -> None:
    env = envs.make("bandit", arms=3, horizon=2)
    env.reset(seed=0)
    obs, reward, terminated, _, info = env.step("chartreuse")
    assert reward == 0.0 and info["invalid"] and info["arm"] is None and not terminated
    assert obs.startswith("Invalid action 'chartreuse': choose one of blue, green, red.")
    assert "Step=1 Action=invalid Reward=0.00" in obs
    *_, terminated, _, info = env.step("blue")
    assert terminated and info["regret"] > 0


def test_an_invalid_step_costs_the_regret_of_the_worst_arm() -> None:
    """It pays 0 but is never charged less than the worst pull: on a contextual bandit whose means are
    all negative at a step, charging 0 would make an invalid action lower the regret. The simulation's
    ``step_regret`` charges a step with no pull (arm -1) the same."""
    from turnrl.bandits.simulate import step_regret

    env = envs.make("contextual_bandit")
    for tid in env.task_ids("seen")[:64]:
        mu = env.instance(tid).mu
        t = int(np.argmax(mu.max(axis=-1) < 0)) if (mu.max(axis=-1) < 0).any() else -1
        if t >= 0:
            break
    assert t >= 0, "no step of the first 64 seen tasks has every mean below 0"
    before = env.reset(options={"task_id": tid})[1]["regret"]
    for _ in range(t):
        before = env.step(env.labels_now()[0])[-1]["regret"]
    _, reward, *_, info = env.step("no such movie")
    assert reward == 0.0 and info["invalid"]
    assert info["regret"] - before == pytest.approx(mu[t].max() - mu[t].min())
    assert step_regret(mu[None, t : t + 1], np.array([[-1]]))[0, 0] == pytest.approx(mu[t].max() - mu[t].min())


def test_expert_is_ucb_and_usually_succeeds() -> None:
    env = envs.make("bandit", arms=5, noise="low", horizon=40)
    wins = 0
    for seed in range(10):
        env.reset(seed=seed)
        rng = random.Random(seed)
        info: dict = {}
        for _ in range(40):
            step = env.expert(rng)
            assert step.thought.startswith("UCB values: ") and step.action in env.labels
            *_, info = env.step(step.action)
        wins += info["success"]
    assert wins >= 9


def test_contextual_expert_usually_succeeds_and_random_play_seldom() -> None:
    """Success is regret at most 3/4 of random choice's expected regret: the expert LinUCB met the
    earlier share, 1/2, in about one task of ten at the default horizon."""
    env = envs.make("contextual_bandit")
    rng = random.Random(0)
    wins = {"expert": 0, "random": 0}
    for tid in env.task_ids("seen")[:30]:
        for policy in wins:
            env.reset(options={"task_id": tid})
            info: dict = {}
            for _ in range(env.horizon):
                action = env.expert(rng).action if policy == "expert" else rng.choice(env.valid_actions())
                *_, info = env.step(action)
            wins[policy] += info["success"]
    assert wins["expert"] >= 18 and wins["random"] <= 3, wins


def test_contextual_rewards_are_linear_in_user_features() -> None:
    env = envs.make("contextual_bandit", items=4, horizon=60)
    inst = env.instance("cb-7")
    assert inst.contexts is not None and inst.contexts.shape == (60, 7)
    for arm in range(4):  # mu[:, arm] = x · θ_arm exactly
        theta, *_ = np.linalg.lstsq(inst.contexts, inst.mu[:, arm], rcond=None)
        assert np.allclose(inst.contexts @ theta, inst.mu[:, arm], atol=1e-9)
    assert np.std(inst.rewards - inst.mu) == pytest.approx(0.5, rel=0.25)
    users = inst.meta["users"]
    assert not {u["occupation"] for u in users} & set(NEW_OCCUPATIONS)
    new = env.instance("cb-new-200003").meta["users"]
    assert {u["occupation"] for u in new} <= set(NEW_OCCUPATIONS)


def test_contextual_ucb_c_is_the_expert_linucb_exploration_constant() -> None:
    """``ucb_c`` is the expert's constant on the contextual bandit too (LinUCB's alpha), not
    an option accepted and then ignored."""
    from turnrl.bandits.algorithms import make_algorithm

    def expert_episode(**opts: float) -> list[str]:
        env = envs.make("contextual_bandit", horizon=30, **opts)
        env.reset(options={"task_id": "cb-3"})
        rng, thoughts = random.Random(0), []
        for _ in range(30):
            step = env.expert(rng)
            thoughts.append(step.thought)
            env.step(step.action)
        return thoughts

    assert expert_episode(ucb_c=0.1) != expert_episode() != expert_episode(ucb_c=5.0)
    assert expert_episode() == expert_episode(ucb_c=1.0)  # the default is LinUCB's default alpha
    env = envs.make("contextual_bandit", ucb_c=0.25)
    assert env._expert.algo.spec == make_algorithm("linucb:alpha=0.25,c=0.25").spec


def test_contextual_prompt_describes_users_and_movies() -> None:
    env = envs.make("contextual_bandit", items=3, horizon=4)
    obs, info = env.reset(options={"task_id": "cb-1"})
    assert "Moonfall: action" in env.instruction and "ACTION=X" in env.instruction
    u = info["user"]
    assert f"New user: {u['gender']}, {u['age']} years old, {u['occupation']} from {u['location']}" in obs
    step = env.expert(random.Random(0))
    assert step.thought.startswith("LinUCB values: Moonfall=")
    obs, *_ = env.step(step.action)
    assert re.match(r"Step=1 User=[a-z-]+/\d+/[a-z]+/[A-Za-z]+/\[[-+0-9.,]+\] Action=\w+ Reward=-?\d+\.\d\d", obs)


def test_contextual_randomized_labels_show_each_steps_genre_mix() -> None:
    """With ``randomize_labels`` a label names another movie at every step, so the instruction lists
    no genre mix and each step lists it under that step's labels: the mix shown under the label
    pulled is the pulled movie's."""
    env = envs.make("contextual_bandit", randomize_labels=True, horizon=6)
    obs, _ = env.reset(seed=3)
    assert "genre mix (0 = none, 1 = fully):\n" not in env.instruction
    genres = env._inst.meta["genres"]
    moved = False
    for t in range(6):
        rows = re.findall(r"^(\w+): action (\S+), comedy (\S+), drama (\S+), romance (\S+)$", obs, re.M)
        shown = {m[0]: [float(v) for v in m[1:]] for m in rows}
        assert sorted(shown) == sorted(env.labels)
        label = env.labels[t % len(env.labels)]
        obs, _, _, _, info = env.step(label)
        assert shown[label] == pytest.approx([round(v, 1) for v in genres[info["arm"]]], abs=1e-9)
        moved |= info["arm"] != env.labels.index(label)
    assert moved  # the labels did not name the movies in their listed order at every step


def test_button_labels_are_the_colours() -> None:
    env = envs.make("bandit", arms=20)
    assert env.labels == list(COLOURS)
