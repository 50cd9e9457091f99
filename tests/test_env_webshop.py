"""The WebShop HTTP adapter against a small WebShop-compatible server on loopback."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator

import pytest
from fixtures.webshop_server import WebShopTestServer

import turnrl.envs
from turnrl.envs.checker import check_env
from turnrl.envs.shop import Shop
from turnrl.envs.webshop import WebShopHTTP, maybe_register, parse_page
from turnrl.errors import TurnRLError

SPLITS = {"seen_goals": "0:20", "unseen_goals": "20:40", "train_goals": "40:432"}


@pytest.fixture(scope="module")
def server() -> Iterator[WebShopTestServer]:
    with WebShopTestServer() as srv:
        yield srv


@pytest.fixture
def env(server: WebShopTestServer) -> WebShopHTTP:
    return WebShopHTTP(url=server.url, timeout=10, **SPLITS)


@pytest.mark.parametrize("goal", [0, 3, 21, 150, 431])
def test_shop_expert_path_over_http_gets_the_same_reward(env: WebShopHTTP, goal: int) -> None:
    """The in-process shop and the server share catalogue and reward, so the shop expert's
    actions played over HTTP must reach the done page with reward 1.0."""
    shop = Shop()
    shop.reset(options={"task_id": f"shop-{goal}"})
    obs, info = env.reset(options={"task_id": f"fixed_{goal}"})
    assert obs.startswith("WebShop [SEP] Instruction: [SEP] ") and env.valid_actions() is None
    assert env.instruction.endswith(shop.instruction.splitlines()[-1])
    rng = random.Random(0)
    for _ in range(shop.max_turns):
        action = shop.expert(rng).action
        _, r_shop, t_shop, _, _ = shop.step(action)
        obs, reward, term, trunc, info = env.step(action)
        assert not info.get("invalid"), (action, obs)
        if action.startswith("click[B0"):
            assert "click[Buy Now]" in info["valid_actions"]
        assert term == t_shop and not trunc
        if term:
            break
    assert reward == r_shop == 1.0 and info["success"] and "Your score" in obs


def test_checker_passes_on_the_adapter(env: WebShopHTTP) -> None:
    assert check_env(env, episodes=3) == []
    with pytest.raises(TurnRLError, match="unknown task id"):
        env.reset(options={"task_id": "goal-3"})


def test_invalid_actions_and_wrong_purchase(env: WebShopHTTP) -> None:
    env.reset(options={"task_id": "fixed_5"})
    obs, r, term, _, info = env.step("click[Buy Now]")
    assert info["invalid"] and obs.startswith("Invalid action") and not term
    env.step("search[running shoes]")
    _, _, _, _, info = env.step("search[again]")
    assert info["invalid"]
    asin = next(a for a in info["valid_actions"] if a.startswith("click[B0"))
    env.step(asin)
    obs, reward, term, _, info = env.step("click[buy now]")
    assert term and 0.0 <= reward < 1.0 and info["success"] is False


def test_heuristic_expert_reaches_a_purchase(env: WebShopHTTP) -> None:
    rewards = []
    for goal in range(10):
        _, info = env.reset(options={"task_id": f"fixed_{goal}"})
        rng = random.Random(goal)
        for _ in range(env.max_turns):
            _, reward, term, trunc, info = env.step(env.expert(rng).action)
            if term or trunc:
                break
        assert term
        rewards.append(reward)
    assert sum(rewards) / len(rewards) > 0.5


def test_page_parser_reads_webshop_structure() -> None:
    html = """<html><head><title>WebShop</title><script>x()</script></head><body>
      <div id="instruction-text"><h4>Instruction: i need a red hat</h4></div>
      <form method="post" action="/abc"><button class="btn btn-success">Back to Search</button></form>
      <a class="product-link" href="/item_page/abc/B012345678/x/1/%7B%7D">B012345678</a>
      <input type="radio" name="color" value="red" data-url="/item_page/abc/B012345678/x/1/red">
      <label>red</label>
      <div style="display:none"><pre>secret</pre></div>
      <h3 id="reward">Your score<pre>0.75</pre></h3></body></html>"""
    page = parse_page(html, "http://h:1/abc")
    assert page.instruction == "i need a red hat" and page.reward == 0.75 and page.search_action is None
    assert {k: (c.method, c.url) for k, c in page.clickables.items()} == {
        "back to search": ("POST", "http://h:1/abc"),
        "b012345678": ("GET", "http://h:1/item_page/abc/B012345678/x/1/%7B%7D"),
        "red": ("GET", "http://h:1/item_page/abc/B012345678/x/1/red"),
    }
    assert "secret" not in page.observation() and "x()" not in page.observation()
    assert page.observation().startswith("Instruction: i need a red hat [SEP] Back to Search")


def test_a_stray_end_tag_does_not_end_a_hidden_block() -> None:
    """WebShop's done page hides the goal in a display:none div whose <h4> is closed by </p>."""
    html = """<html><body><div style="display:none"><h4 id="asin">asin<pre>B0GOAL</pre></p>
      <h4>attrs<pre>['red']</pre></h4></div><h3 id="reward">Your score<pre>0.5</pre></h3></body></html>"""
    page = parse_page(html, "http://h:1/abc")
    assert "B0GOAL" not in page.observation() and "attrs" not in page.observation()
    assert page.reward == 0.5 and "Your score" in page.observation()


def test_unreachable_server_is_a_one_line_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = WebShopHTTP(url=f"http://127.0.0.1:{port}", timeout=2)
    with pytest.raises(TurnRLError, match=f"cannot reach the WebShop server at http://127.0.0.1:{port}") as e:
        env.reset(options={"task_id": "fixed_0"})
    assert "\n" not in str(e.value)
    with pytest.raises(TurnRLError, match="url must start with http"):
        WebShopHTTP(url="localhost:3000")
    with pytest.raises(TurnRLError, match="train_goals and seen_goals overlap"):
        WebShopHTTP(seen_goals="0:600", train_goals="500:1000", unseen_goals="2000:2001")
    with pytest.raises(TurnRLError, match="seen_goals and unseen_goals overlap"):
        WebShopHTTP(seen_goals="0:600", unseen_goals="500:1500")  # a goal in both evaluation sets


def test_registered_only_with_a_server_url(monkeypatch: pytest.MonkeyPatch, server: WebShopTestServer) -> None:
    monkeypatch.delenv("TURNRL_WEBSHOP_URL", raising=False)
    assert "webshop" not in turnrl.envs.names() and maybe_register() is False
    monkeypatch.setenv("TURNRL_WEBSHOP_URL", server.url)
    try:
        assert maybe_register() is True
        env = turnrl.envs.make("webshop", **SPLITS)
        assert isinstance(env, WebShopHTTP) and env.url == server.url
        assert env.reset(options={"task_id": "fixed_1"})[1]["task_id"] == "fixed_1"
    finally:
        turnrl.envs._REGISTRY.pop("webshop", None)
