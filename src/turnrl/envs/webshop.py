"""An adapter for a real WebShop server (princeton-nlp/WebShop's Flask site) over HTTP.

It plays the site as WebShop's own text environment does, but through HTTP instead of an
in-process simulator: it fetches pages, turns their HTML into WebShop's simple text
observation (visible texts joined by ``[SEP]``), and maps actions to requests:

- ``search[<keywords>]`` on a page with the search box posts the query to the search form;
- ``click[<text>]`` follows the clickable with that text (case-insensitive): a button posts
  its form, a product link (``click[B0...]``) or an option (``click[large]``, an
  ``input[type=radio]`` whose ``data-url`` the site sets) is fetched with GET;
- ``click[Buy Now]`` reaches the done page, whose score (``#reward pre``) is the reward; the
  episode then ends, ``success`` when the score is 1.0.

Anything else changes nothing and returns the page again with ``info["invalid"] = True``.

Tasks are WebShop's fixed sessions: task id ``fixed_<i>`` plays goal ``i``. The splits
follow WebShop's (and ETO's) convention: ``seen`` = goals 0-499 (the test goals), ``train`` =
goals 1500 on; WebShop has no out-of-distribution split, so ``unseen`` holds the dev goals
500-1499. The ranges are options (``seen_goals="0:500"`` and so on).

There is no gold path to read over HTTP, so the ``expert`` is a heuristic: search the
instruction (without its price clause), open the first result not yet opened, click every
option value the instruction names, buy. It is there so ``check_env`` and scripted
collection work; use WebShop's human demonstrations (``turnrl`` imports ETO's format) for
expert data.

The env registers as ``webshop`` only when ``TURNRL_WEBSHOP_URL`` is set (its default
``url``), so the env checker and the tiny model's corpus do not need a server; otherwise
build it directly: ``WebShopHTTP(url="http://127.0.0.1:3000")``. Connection failures and
timeouts are one-line :class:`~turnrl.errors.TurnRLError` s naming the URL.
"""

from __future__ import annotations

import os
import random
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

from turnrl.envs import register
from turnrl.envs.base import ExpertStep, TextEnv
from turnrl.envs.shop import INSTRUCTION, SEP
from turnrl.errors import TurnRLError

URL_ENV = "TURNRL_WEBSHOP_URL"
_HIDDEN = {"style", "script", "head", "title", "meta", "template"}


@dataclass
class Clickable:
    text: str
    method: str  # GET or POST
    url: str


@dataclass
class ParsedPage:
    """What the adapter reads from one WebShop page."""

    texts: list[str] = field(default_factory=list)
    clickables: dict[str, Clickable] = field(default_factory=dict)
    search_action: str | None = None
    instruction: str | None = None
    reward: float | None = None

    def observation(self) -> str:
        return SEP.join(self.texts)


class _Parser(HTMLParser):
    """WebShop's page structure: buttons in forms, ``a.product-link``, radio options with
    ``data-url``, ``#search_input``, ``#instruction-text h4`` and ``#reward pre``."""

    def __init__(self, base: str):
        super().__init__(convert_charrefs=True)
        self.base = base
        self.page = ParsedPage()
        self.stack: list[tuple[str, dict[str, str]]] = []
        self.form: tuple[str, str] | None = None
        self.capture: str | None = None  # "button" | "link" | "instruction" | "reward"
        self.buf: list[str] = []
        self.link = ""
        self.in_instruction = self.in_reward = False
        self.instruction_done = False

    def _url(self, href: str) -> str:
        return urllib.parse.urljoin(self.base, href)

    def handle_starttag(self, tag: str, attrs_list: list[tuple[str, str | None]]) -> None:
        attrs = {k: v or "" for k, v in attrs_list}
        if tag not in ("input", "br", "img", "link", "meta", "hr"):
            self.stack.append((tag, attrs))
        classes = attrs.get("class", "").split()
        if tag == "form":
            self.form = (attrs.get("method", "get").upper(), self._url(attrs.get("action", "")))
        elif tag == "input" and attrs.get("id") == "search_input" and self.form:
            self.page.search_action = self.form[1]
        elif tag == "input" and attrs.get("type") == "radio" and attrs.get("data-url"):
            value = attrs.get("value", "")
            self.page.clickables.setdefault(value.lower(), Clickable(value, "GET", self._url(attrs["data-url"])))
        elif tag == "button" and "btn" in classes and self.form:
            self.capture, self.buf = "button", []
        elif tag == "a" and "product-link" in classes:
            self.capture, self.buf, self.link = "link", [], self._url(attrs.get("href", ""))
        if attrs.get("id") == "instruction-text":
            self.in_instruction = True
        if attrs.get("id") == "reward":
            self.in_reward = True
        if tag == "h4" and self.in_instruction and not self.instruction_done and self.capture is None:
            self.capture, self.buf = "instruction", []
        if tag == "pre" and self.in_reward and self.capture is None:
            self.capture, self.buf = "reward", []

    def handle_endtag(self, tag: str) -> None:
        text = " ".join("".join(self.buf).split())
        if tag == "button" and self.capture == "button":
            if self.form and text and text.lower() != "search":
                self.page.clickables.setdefault(text.lower(), Clickable(text, self.form[0], self.form[1]))
            self.capture = None
        elif tag == "a" and self.capture == "link":
            if text:
                self.page.clickables.setdefault(text.lower(), Clickable(text, "GET", self.link))
            self.capture = None
        elif tag == "h4" and self.capture == "instruction":
            self.page.instruction = re.sub(r"^Instruction:\s*", "", text)
            self.instruction_done = True
            self.capture = None
        elif tag == "pre" and self.capture == "reward":
            try:
                self.page.reward = float(text)
            except ValueError:
                self.page.reward = None
            self.capture = None
        if tag == "form":
            self.form = None
        # a stray end tag (WebShop's done page closes a <h4> with </p>) closes nothing: popping the
        # whole stack for it would end a display:none block early and show its hidden text
        while self.stack and any(t == tag for t, _ in self.stack):
            t, attrs = self.stack.pop()
            if attrs.get("id") == "instruction-text":
                self.in_instruction = False
            if attrs.get("id") == "reward":
                self.in_reward = False
            if t == tag:
                break

    def handle_data(self, data: str) -> None:
        if self.capture is not None:
            self.buf.append(data)
        if any(t in _HIDDEN for t, _ in self.stack):
            return
        if any(a.get("style", "").replace(" ", "").startswith("display:none") or "hidden" in a
               for _, a in self.stack):
            return
        text = " ".join(data.split())
        if text:
            self.page.texts.append(text)


def parse_page(html: str, base_url: str) -> ParsedPage:
    """Parse one WebShop HTML page (exposed for tests)."""
    parser = _Parser(base_url)
    parser.feed(html)
    parser.close()
    return parser.page


def _range(key: str, value: str) -> range:
    m = re.fullmatch(r"\s*([0-9]+)\s*:\s*([0-9]+)\s*", value) if isinstance(value, str) else None
    if m is None or int(m.group(1)) >= int(m.group(2)):
        raise TurnRLError(f"webshop: {key} must be 'START:END' with START < END (got {value!r})")
    return range(int(m.group(1)), int(m.group(2)))


class WebShopHTTP(TextEnv):
    """A real WebShop server played over HTTP (see module doc)."""

    name = "webshop"
    max_turns = 15

    def __init__(self, *, url: str | None = None, timeout: float = 30.0, max_turns: int = 15,
                 seen_goals: str = "0:500", unseen_goals: str = "500:1500", train_goals: str = "1500:12087") -> None:
        url = url or os.environ.get(URL_ENV) or "http://127.0.0.1:3000"
        if not isinstance(url, str) or not re.match(r"https?://", url):
            raise TurnRLError(f"webshop: url must start with http:// or https:// (got {url!r})")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise TurnRLError(f"webshop: timeout must be a positive number of seconds (got {timeout!r})")
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise TurnRLError(f"webshop: max_turns must be a positive integer (got {max_turns!r})")
        self.url = url.rstrip("/")
        self.timeout = float(timeout)
        self.max_turns = max_turns
        self._splits = {"train": _range("train_goals", train_goals), "seen": _range("seen_goals", seen_goals),
                        "unseen": _range("unseen_goals", unseen_goals)}
        for first, split in (("train", "seen"), ("train", "unseen"), ("seen", "unseen")):
            a, b = self._splits[first], self._splits[split]
            if a.start < b.stop and b.start < a.stop:
                raise TurnRLError(f"webshop: {first}_goals and {split}_goals overlap")
        self._task_id = ""
        self._page = ParsedPage()
        self._page_url = ""
        self._instruction = ""
        self._turns = 0
        self._done = True
        self._started = False
        self._opened: list[str] = []
        self._clicked: set[str] = set()

    # -- contract ------------------------------------------------------------------------

    @property
    def instruction(self) -> str:
        return INSTRUCTION + (f"\nInstruction: {self._instruction}" if self._instruction else "")

    def task_ids(self, split: str) -> list[str]:
        if split not in self._splits:
            raise TurnRLError(f"webshop: unknown split {split!r}; choose from: train, seen, unseen")
        return [f"fixed_{i}" for i in self._splits[split]]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        task_id = self.choose_task(seed, options)
        if not isinstance(task_id, str) or not re.fullmatch(r"fixed_[0-9]+", task_id):
            raise TurnRLError(f"webshop: unknown task id {task_id!r}; expected 'fixed_<goal index>', e.g. 'fixed_0'")
        self._task_id = task_id
        self._load("GET", f"{self.url}/{task_id}")
        self._instruction = self._page.instruction or ""
        self._turns = 0
        self._done = False
        self._started = True
        self._opened = []
        self._clicked = set()
        return self._page.observation(), self._info()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.running(self._task_id if self._started else None, over=self._done)
        self._turns += 1
        text = action.strip() if isinstance(action, str) else ""
        m = re.fullmatch(r"(search|click)\[(.*)\]", text, re.DOTALL | re.IGNORECASE)
        kind, arg = (m.group(1).lower(), m.group(2).strip()) if m else ("", "")
        error = None
        if kind == "search" and arg and self._page.search_action:
            self._load("POST", self._page.search_action, {"search_query": arg})
        elif kind == "click" and arg.lower() in self._page.clickables:
            target = self._page.clickables[arg.lower()]
            if re.fullmatch(r"B0[A-Z0-9]{8}", target.text.upper()):
                self._opened.append(target.text.upper())
            if target.method == "GET" and "/item_page/" in target.url and target.text.lower() not in ("< prev",):
                self._clicked.add(target.text.lower())
            self._load(target.method, target.url)
        else:
            error = "no such button on this page" if kind == "click" else (
                "search[...] only works on a page with a search box" if kind == "search" and arg
                else "write search[<keywords>] or click[<button>]")
        if self._page.reward is not None:
            reward = float(self._page.reward)
            self._done = True
            info = self._info()
            info.update(valid_actions=[], won=reward >= 1.0, success=reward >= 1.0, score=reward)
            return self._page.observation(), reward, True, False, info
        obs = self._page.observation()
        if error:
            obs = f"Invalid action {text!r}: {error}.{SEP}{obs}"
        truncated = self._turns >= self.max_turns
        info = self._info(invalid=error is not None)
        if truncated:
            self._done = True
            info.update(won=False, success=False, valid_actions=[])
        return obs, 0.0, False, truncated, info

    def valid_actions(self) -> list[str] | None:
        if not self._started or self._done:
            return []
        if self._page.search_action:
            return None
        return [f"click[{c.text}]" for c in self._page.clickables.values()]

    def expert(self, rng: random.Random) -> ExpertStep:
        if not self._started or self._done:
            raise TurnRLError("webshop: no expert move: the episode is not running (call reset())")
        page = self._page
        want = self._instruction.lower()
        if page.search_action:
            query = re.split(r",? and price lower than", self._instruction)[0]
            return ExpertStep(f"search[{query}]", "I will search for what the instruction describes.")
        clicks = page.clickables
        if "buy now" in clicks:
            for key, c in clicks.items():
                named = re.search(rf"(?<![\w.]){re.escape(key)}(?![\w.])", want) is not None
                if c.method == "GET" and "/item_page/" in c.url and key not in self._clicked and named:
                    return ExpertStep(f"click[{c.text}]", f"The instruction asks for {c.text}.")
            return ExpertStep("click[Buy Now]", "This item looks right; I will buy it.")
        for key, c in clicks.items():
            if re.fullmatch(r"b0[a-z0-9]{8}", key) and c.text.upper() not in self._opened:
                return ExpertStep(f"click[{c.text}]", f"{c.text} may fit; I will open it.")
        for key in ("< prev", "< back to item page", "< back to results", "next >", "back to search"):
            if key in clicks:
                return ExpertStep(f"click[{clicks[key].text}]", "Nothing to do here; I will go on.")
        any_click = next(iter(clicks.values()))
        return ExpertStep(f"click[{any_click.text}]", "I will try this button.")

    # -- internals -----------------------------------------------------------------------

    def _load(self, method: str, url: str, form: dict[str, str] | None = None) -> None:
        data = urllib.parse.urlencode(form or {}).encode() if method == "POST" else None
        req = urllib.request.Request(url, data=data, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                html = resp.read().decode("utf-8", errors="replace")
                final = resp.geturl()
        except urllib.error.HTTPError as e:
            raise TurnRLError(f"webshop: {method} {url} failed: HTTP {e.code}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise TurnRLError(f"webshop: cannot reach the WebShop server at {self.url} ({reason})") from None
        self._page = parse_page(html, final)
        self._page_url = final

    def _info(self, *, invalid: bool = False) -> dict[str, Any]:
        info: dict[str, Any] = {"task_id": self._task_id, "turn": self._turns, "invalid": invalid,
                                "url": self._page_url}
        acts = self.valid_actions()
        if acts is not None:
            info["valid_actions"] = acts
        return info


def maybe_register() -> bool:
    """Register ``webshop`` when ``TURNRL_WEBSHOP_URL`` names a server; returns whether it did."""
    if os.environ.get(URL_ENV):
        register("webshop", WebShopHTTP)
        return True
    return False


maybe_register()
