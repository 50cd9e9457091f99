"""shop: catalogue, splits, pages and actions, WebShop's reward, the scripted expert."""

from __future__ import annotations

import random

import pytest

from turnrl import envs
from turnrl.agent.parsing import parse_action
from turnrl.collect import run_policy
from turnrl.envs.checker import check_env
from turnrl.envs.shop import (
    HELD_OUT_CATEGORIES,
    Shop,
    best_options,
    catalogue,
    parse_task,
    token_set_ratio,
    webshop_reward,
)
from turnrl.errors import TurnRLError
from turnrl.rollout import ExpertPolicy


def test_catalogue_is_fixed_and_splits_follow_categories() -> None:
    cat = catalogue()
    assert len(cat.products) == 216 and len(cat.goals) == 432
    assert len({p.asin for p in cat.products}) == 216
    env = Shop()
    ids = {s: env.task_ids(s) for s in ("train", "seen", "unseen")}
    assert (len(ids["train"]), len(ids["seen"]), len(ids["unseen"])) == (230, 58, 144)
    assert not set(ids["train"]) & (set(ids["seen"]) | set(ids["unseen"]))
    # no request (text, attributes, options, price) is in two splits: goals 54 and 66 ask the same
    split_of: dict[tuple, str] = {}
    for s, tids in ids.items():
        for t in tids:
            g = parse_task(t)
            key = (g.instruction_text, g.attributes, tuple(sorted(g.goal_options.items())), g.price_upper)
            assert split_of.setdefault(key, s) == s, (t, s, split_of[key])
    assert {"shop-54", "shop-66"} <= set(ids["seen"])
    cats = {s: {parse_task(t).category for t in ids[s]} for s in ids}
    assert cats["unseen"] == set(HELD_OUT_CATEGORIES)
    assert cats["train"] == cats["seen"] == {"beauty", "fashion", "grocery", "home"}
    g = parse_task("shop-0")
    assert g.instruction_text.endswith(f"and price lower than {g.price_upper:.2f} dollars")


def test_reward_is_webshops_formula() -> None:
    cat = catalogue()
    goal = next(g for g in cat.goals if len(g.goal_options) == 2 and len(g.attributes) == 2)
    target = cat.by_asin[goal.asin]
    right = best_options(target, goal)
    assert webshop_reward(target, goal, right)[0] == 1.0
    # no options chosen: (2 attributes + 0 options + price) / (2 + 2 + 1)
    assert webshop_reward(target, goal, {})[0] == pytest.approx(3 / 5)
    # one wrong size (sizes match exactly only)
    key = "size" if "size" in target.options else next(iter(target.options))
    wrong = {**right, key: next(v for v in target.options[key] if v != right[key])}
    assert webshop_reward(target, goal, wrong)[0] == pytest.approx(4 / 5)
    # another product type of the same category: no title noun in common -> r_type 0
    other = next(p for p in cat.products if p.category == target.category and p.query != target.query)
    reward, parts = webshop_reward(other, goal, {})
    assert (reward, parts["r_type"], parts["category_match"]) == (0.0, 0.0, True)
    # same type, other brand: the title score is the shared type words over the goal's nouns
    same = next(p for p in cat.products if p.query == target.query and p.asin != target.asin)
    assert webshop_reward(same, goal, {})[1]["r_type"] == 1.0


def test_token_set_ratio_matches_thefuzz_on_subsets() -> None:
    assert token_set_ratio("sulfate free", "free sulfate shampoo") == 100.0
    assert token_set_ratio("non slip", "non slip") == 100.0
    assert token_set_ratio("noise cancelling", "water resistant") < 50


@pytest.mark.parametrize("split", ["train", "seen", "unseen"])
def test_expert_scores_one_on_every_task(split: str) -> None:
    env = Shop()
    for tid in env.task_ids(split):
        _, info = env.reset(options={"task_id": tid})
        rng = random.Random(0)
        for _ in range(env.max_turns):
            step = env.expert(rng)
            acts = info.get("valid_actions")
            assert acts is None or step.action in acts
            _, reward, term, trunc, info = env.step(step.action)
            if term or trunc:
                break
        assert term and reward == 1.0 and info["success"], tid


def test_pages_and_actions() -> None:
    env = envs.make("shop")
    obs, info = env.reset(options={"task_id": "shop-3"})
    assert obs.startswith("WebShop [SEP] Instruction: [SEP] ") and obs.endswith("[SEP] Search")
    assert "valid_actions" not in info and env.valid_actions() is None
    obs, r, term, trunc, info = env.step("click[Buy Now]")
    assert info["invalid"] and obs.startswith("Invalid action") and (r, term, trunc) == (0.0, False, False)
    obs, *_, info = env.step("search[shampoo for dry hair]")
    assert "Page 1 (Total results: " in obs and info["page"] == "results"
    acts = info["valid_actions"]
    assert acts[:2] == ["click[Back to Search]", "click[Next >]"] and len(acts) == 12
    _, *_, info = env.step("search[more]")
    assert info["invalid"]
    obs, *_, info = env.step("CLICK[next >]")  # case-insensitive
    assert "Page 2" in obs and "click[< Prev]" in info["valid_actions"]
    asin = info["valid_actions"][-1][6:-1]
    obs, *_, info = env.step(f"click[{asin.lower()}]")
    assert info["page"] == "item" and "click[Buy Now]" in info["valid_actions"] and "Price: $" in obs
    obs, *_, info = env.step("click[Features]")
    assert info["page"] == "sub" and info["valid_actions"] == ["click[Back to Search]", "click[< Prev]"]
    env.step("click[< Prev]")
    obs, *_, info = env.step("click[< Prev]")
    assert info["page"] == "results" and "Page 2" in obs
    obs, *_, info = env.step("click[ back  TO search ]")  # case and spacing as a typed label may have them
    assert info["page"] == "search" and not info["invalid"]


def test_truncation_after_max_turns() -> None:
    env = envs.make("shop", max_turns=4)
    env.reset(options={"task_id": "shop-0"})
    outs = [env.step("click[nothing]") for _ in range(4)]
    assert [o[3] for o in outs] == [False, False, False, True]
    assert outs[-1][4]["success"] is False
    with pytest.raises(TurnRLError, match="episode is over"):
        env.step("click[nothing]")


def test_one_line_errors() -> None:
    env = Shop()
    for bad in ("shop-99999", "shop-x", "webshop-1", "shop-007"):  # a padded id would be a second name of shop-7
        with pytest.raises(TurnRLError, match="unknown task id") as e:
            env.reset(options={"task_id": bad})
        assert "\n" not in str(e.value)
    with pytest.raises(TurnRLError, match="max_turns must be an integer"):
        envs.make("shop", max_turns=1)
    with pytest.raises(TurnRLError, match="unknown split"):
        env.task_ids("dev")


def test_actions_parse_from_replies() -> None:
    assert parse_action("Thought: go\nAction: search[red shoes]").action == "search[red shoes]"
    acts = ["click[Back to Search]", "click[Buy Now]", "click[B0ABC12345]", "click[16 fl oz]"]
    assert parse_action("Thought: buy\nAction: click[buy now]", acts).action == "click[Buy Now]"
    assert parse_action("Action: click[b0abc12345]", acts).action == "click[B0ABC12345]"
    assert parse_action("Action: click[16 fl oz].", acts).action == "click[16 fl oz]"


def test_checker_and_sampler() -> None:
    assert check_env("shop", episodes=4) == []
    for split in ("seen", "unseen"):
        trajs = run_policy(ExpertPolicy(), "shop", split=split, episodes=10, num_envs=4)
        assert all(t.success and t.return_ == 1.0 for t in trajs)


def test_two_commands_in_one_action_are_invalid() -> None:
    """``search[a] click[b]`` read greedily as one search for ``a] click[b``."""
    env = envs.make("shop")
    env.reset(options={"task_id": env.task_ids("train")[0]})
    obs, _, _, _, info = env.step("search[mug] click[b1]")
    assert obs.startswith("Invalid action") and info["invalid"]
    assert not env.step("search[red mug [large]]")[4].get("invalid")  # brackets inside one search are its words
