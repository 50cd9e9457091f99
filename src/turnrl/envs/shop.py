"""A WebShop-like store simulated in-process (DESIGN 4; WebShop as ETO and ArCHer use it).

Catalogue. 216 products generated from a fixed seed: 6 top-level categories (beauty,
fashion, grocery, home, electronics, pets) x 3 product types x 12 products. A product has
an ASIN-like id, a brand, a title, a breadcrumb ``product_category``, the ``query`` it is
filed under (its type), 3-4 attributes from its type's pool ("sulfate free", "non slip"),
options (``color``, ``size``, ``flavor``... each a subset of its type's values), a price,
feature bullets and a description.

Goals. Two per product, as WebShop's synthetic goals are made: 1-3 of the product's
attributes, one value of each of its option types, and ``price_upper`` drawn like WebShop
(the larger of two of the next four multiples of 10 above the price); the instruction is
templated from them, e.g. ``i need shampoo that is sulfate free and for dry hair, with
size: 16 fl oz, and scent: lavender, and price lower than 30.00 dollars``.

Splits by category: electronics and pets are held out (``unseen``); of the other four
categories' goals every fifth is ``seen`` and the rest are ``train``. Task ids are
``shop-<goal number>`` (``shop-17``).

Pages and actions (text as WebShop's text mode renders it, ``[SEP]``-separated):

- search page: ``search[<keywords>]`` (free text: ``valid_actions`` is None there);
- results page (10 per page of at most 50, ranked by BM25 over title, attributes, type and
  category): ``click[Back to Search]``, ``click[Next >]``, ``click[< Prev]``,
  ``click[<ASIN>]``;
- item page: ``click[<option value>]`` (selects it), ``click[Description]``,
  ``click[Features]``, ``click[Reviews]``, ``click[Buy Now]``, ``click[< Prev]`` (back to
  the results), ``click[Back to Search]``; sub-pages have ``click[< Prev]`` and
  ``click[Back to Search]``.

Clicks match case-insensitively. Anything else (an unknown button, a search away from the
search page) changes nothing and returns the page again with an ``Invalid action`` line and
``info["invalid"] = True``.

Reward, given only at ``click[Buy Now]`` (which ends the episode), is WebShop's
``get_reward``: ``r_type x (attribute matches + option matches + [price <= price_upper]) /
(goal attributes + goal options + 1)``, with WebShop's rules for attributes (fuzzy token-set
match against the product's attributes, or as text in its title, features or description)
and ``r_type`` (query, category and title-noun overlap). Departures:

- the title nouns are the product type's words plus the brand (WebShop tags them with spaCy),
  and fuzzy matching uses :mod:`difflib` ratios in place of Levenshtein ratios, both because
  the catalogue is generated;
- options: each chosen value counts when it is a requested ``size`` exactly, or (other options)
  fuzzily matches a requested value, or occurs in the title, features or description. WebShop
  counts each requested option that any chosen one fuzzily matches (token-set ratio > 85, after
  reducing colours to a base colour), with no exact rule for sizes and no text fallback for
  options. So here a wrong size earns nothing (WebShop credits ``12 fl oz`` for ``16 fl oz``,
  ratio 87.5): a stricter reward for the same choices, which never credits a wrong value.
``success`` means reward 1.0, as WebShop counts it. Episodes are truncated after
``max_turns`` (15) agent turns.

Expert: searches the type and the goal attributes, opens the first result that scores 1.0
with the requested options (paging on, or searching the target's title when the results
hold none), selects each requested option and buys.
"""

from __future__ import annotations

import difflib
import math
import random
import re
import string
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from turnrl.envs import register
from turnrl.envs.base import ExpertStep, TextEnv
from turnrl.errors import TurnRLError

# ---------------------------------------------------------------------------------------
# Catalogue definition

#: category -> (breadcrumb root, [(type, breadcrumb tail, attribute pool, {option: values}, price range)])
_TYPES: dict[str, tuple[str, list[tuple[str, str, list[str], dict[str, list[str]], tuple[float, float]]]]] = {
    "beauty": ("Beauty & Personal Care", [
        ("shampoo", "Hair Care › Shampoo",
         ["sulfate free", "paraben free", "natural ingredients", "for dry hair", "cruelty free", "color safe"],
         {"size": ["8 fl oz", "12 fl oz", "16 fl oz", "32 fl oz"], "scent": ["lavender", "coconut", "mint", "unscented"]},
         (6, 30)),
        ("hair extensions", "Hair Care › Hair Extensions",
         ["natural looking", "heat resistant", "easy to apply", "human hair", "long lasting", "tangle free"],
         {"color": ["black", "dark brown", "blonde", "auburn"], "size": ["14 inch", "18 inch", "22 inch"]},
         (15, 80)),
        ("face moisturizer", "Skin Care › Face › Moisturizers",
         ["oil free", "for sensitive skin", "fragrance free", "spf 30", "hyaluronic acid", "non greasy"],
         {"size": ["1.7 oz", "2.5 oz", "4 oz"]},
         (8, 45)),
    ]),
    "fashion": ("Clothing, Shoes & Jewelry", [
        ("running shoes", "Men › Shoes › Athletic",
         ["non slip", "breathable mesh", "lightweight", "rubber sole", "memory foam", "arch support"],
         {"color": ["black", "white", "grey", "navy"], "size": ["7", "8", "9", "10", "11", "12"]},
         (30, 120)),
        ("polo shirt", "Men › Clothing › Shirts",
         ["slim fit", "machine wash", "short sleeve", "soft cotton", "moisture wicking", "wrinkle free"],
         {"color": ["black", "white", "red", "blue", "green"], "size": ["small", "medium", "large", "x-large"]},
         (12, 50)),
        ("rain jacket", "Women › Clothing › Coats",
         ["waterproof", "hooded", "packable", "windproof", "zip pockets", "lightweight"],
         {"color": ["yellow", "black", "olive", "pink"], "size": ["small", "medium", "large"]},
         (25, 110)),
    ]),
    "grocery": ("Grocery & Gourmet Food", [
        ("green tea", "Beverages › Tea › Green",
         ["organic", "non gmo", "individually wrapped", "gluten free", "decaf", "loose leaf"],
         {"flavor": ["jasmine", "mint", "lemon", "original"], "size": ["20 count", "50 count", "100 count"]},
         (4, 25)),
        ("protein bars", "Snack Foods › Bars › Protein",
         ["gluten free", "low sugar", "high protein", "keto friendly", "non gmo", "plant based"],
         {"flavor": ["chocolate", "peanut butter", "vanilla", "cookie dough"], "size": ["12 pack", "24 pack"]},
         (10, 40)),
        ("coffee beans", "Beverages › Coffee › Whole Bean",
         ["dark roast", "medium roast", "organic", "fair trade", "low acid", "single origin"],
         {"size": ["12 oz", "2 lb", "5 lb"]},
         (9, 60)),
    ]),
    "home": ("Home & Kitchen", [
        ("office chair", "Furniture › Home Office › Chairs",
         ["ergonomic", "lumbar support", "adjustable height", "easy assembly", "mesh back", "padded armrests"],
         {"color": ["black", "grey", "white", "blue"]},
         (60, 300)),
        ("coffee table", "Furniture › Living Room › Tables",
         ["solid wood", "easy assembly", "storage shelf", "rustic", "mid century", "tempered glass"],
         {"color": ["walnut", "white", "black", "oak"]},
         (50, 250)),
        ("bed sheets", "Bedding › Sheets & Pillowcases",
         ["deep pocket", "wrinkle free", "machine washable", "breathable", "hypoallergenic", "soft microfiber"],
         {"color": ["white", "grey", "navy", "sage"], "size": ["twin", "full", "queen", "king"]},
         (20, 90)),
    ]),
    "electronics": ("Electronics", [
        ("wireless earbuds", "Headphones › Earbud Headphones",
         ["noise cancelling", "water resistant", "long battery life", "charging case", "touch control", "built in microphone"],
         {"color": ["black", "white", "blue"]},
         (20, 150)),
        ("phone charger", "Cell Phones & Accessories › Chargers",
         ["fast charging", "usb c", "foldable plug", "compact", "dual port", "overheat protection"],
         {"size": ["1 pack", "2 pack", "3 pack"], "color": ["black", "white"]},
         (8, 40)),
        ("hdmi cable", "Computers & Accessories › Cables › HDMI",
         ["4k", "high speed", "braided", "gold plated", "ethernet", "flexible"],
         {"size": ["3 ft", "6 ft", "10 ft", "15 ft"]},
         (5, 30)),
    ]),
    "pets": ("Pet Supplies", [
        ("dog bed", "Dogs › Beds & Furniture › Beds",
         ["orthopedic", "machine washable", "non slip bottom", "waterproof", "memory foam", "removable cover"],
         {"size": ["small", "medium", "large", "x-large"], "color": ["grey", "brown", "navy"]},
         (25, 120)),
        ("cat litter", "Cats › Litter & Housebreaking › Litter",
         ["clumping", "unscented", "low dust", "odor control", "lightweight", "natural ingredients"],
         {"size": ["10 lb", "20 lb", "40 lb"]},
         (8, 35)),
        ("dog treats", "Dogs › Treats",
         ["grain free", "natural ingredients", "made in usa", "high protein", "soft chews", "training treats"],
         {"flavor": ["chicken", "beef", "salmon", "peanut butter"], "size": ["6 oz", "12 oz", "24 oz"]},
         (6, 30)),
    ]),
}
HELD_OUT_CATEGORIES = ("electronics", "pets")
_BRANDS = (
    "Aurelia Benton Cascade Dovetail Elmwood Fernly Galeford Harlow Isidore Juniper Kestrel Lumen "
    "Marlowe Northvale Orchid Pemberly Quillon Rosewood Sable Tamsin Umbra Verity Wexley Yarrow Zephyr"
).split()
PRODUCTS_PER_TYPE = 12
GOALS_PER_PRODUCT = 2
PRICE_RANGE = [10.0 * i for i in range(1, 100)]
EXACT_MATCH_OPTS = ("size",)
MAX_RESULTS = 50
PAGE_SIZE = 10


@dataclass(frozen=True, eq=False)
class Product:
    asin: str
    title: str
    brand: str
    category: str
    product_category: str
    query: str
    attributes: tuple[str, ...]
    options: dict[str, list[str]]
    price: float
    features: tuple[str, ...]
    description: str

    @property
    def name(self) -> str:
        return self.title

    @property
    def nouns(self) -> frozenset[str]:
        """The title nouns WebShop's type reward compares (type words and brand)."""
        return frozenset(self.query.split()) | {self.brand.lower()}


@dataclass(frozen=True, eq=False)
class Goal:
    index: int
    asin: str
    category: str
    query: str
    product_category: str
    nouns: frozenset[str]
    instruction_text: str
    attributes: tuple[str, ...]
    goal_options: dict[str, str]
    price_upper: float


@dataclass
class Catalogue:
    products: list[Product]
    by_asin: dict[str, Product]
    goals: list[Goal]
    index: BM25 = field(repr=False)

    def search(self, keywords: str) -> list[Product]:
        """Top :data:`MAX_RESULTS` products for ``keywords`` (BM25; ties by catalogue order)."""
        return [self.products[i] for i in self.index.top(_tokens(keywords), MAX_RESULTS)]


def _tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+(?:\.[0-9]+)?", text.lower())


class BM25:
    """Okapi BM25 (k1 = 1.5, b = 0.75) over tokenized documents."""

    def __init__(self, docs: list[list[str]], k1: float = 1.5, b: float = 0.75):
        self.tf = [Counter(d) for d in docs]
        self.len = [len(d) for d in docs]
        self.avg = sum(self.len) / max(1, len(docs))
        df: Counter[str] = Counter()
        for d in docs:
            df.update(set(d))
        n = len(docs)
        self.idf = {t: math.log(1 + (n - c + 0.5) / (c + 0.5)) for t, c in df.items()}
        self.k1, self.b = k1, b

    def top(self, query: list[str], n: int) -> list[int]:
        scores = []
        for i, tf in enumerate(self.tf):
            s = 0.0
            for t in query:
                f = tf.get(t, 0)
                if f:
                    s += self.idf[t] * f * (self.k1 + 1) / (f + self.k1 * (1 - self.b + self.b * self.len[i] / self.avg))
            if s > 0:
                scores.append((-s, i))
        scores.sort()
        return [i for _, i in scores[:n]]


def _title_case(text: str) -> str:
    return " ".join(w if any(c.isdigit() for c in w) else w.capitalize() for w in text.split())


@cache
def catalogue() -> Catalogue:
    """The fixed catalogue and goals (built once per process, from seed 0)."""
    rng = random.Random(0)
    products: list[Product] = []
    used: set[str] = set()
    for category, (root, types) in _TYPES.items():
        for type_name, tail, pool, options, (lo, hi) in types:
            brands = rng.sample(_BRANDS, PRODUCTS_PER_TYPE)
            for k in range(PRODUCTS_PER_TYPE):
                asin = ""
                while not asin or asin in used:
                    asin = "B0" + "".join(rng.choices(string.ascii_uppercase + string.digits, k=8))
                used.add(asin)
                attrs = tuple(sorted(rng.sample(pool, rng.choice((3, 4))), key=pool.index))
                opts = {}
                for opt, values in options.items():
                    chosen = rng.sample(values, rng.randint(2, len(values)))
                    opts[opt] = sorted(chosen, key=values.index)
                price = round(rng.uniform(lo, hi)) - 0.01 if hi > 20 else round(rng.uniform(lo, hi), 2)
                price = max(price, 1.99)
                brand = brands[k]
                shown = list(attrs[:2])
                title = f"{brand} {_title_case(type_name)}, {_title_case(' '.join(shown))}"
                if len(attrs) > 2 and rng.random() < 0.5:
                    title += f", {_title_case(attrs[2])}"
                features = tuple(f"{_title_case(a)}: this {type_name} is {a}." for a in attrs) + (
                    f"Made by {brand}.",
                )
                description = f"The {brand} {type_name}, with a choice of {' and '.join(opts)}."
                products.append(Product(asin, title, brand, category, f"{root} › {tail}", type_name, attrs, opts,
                                        price, features, description))
    by_asin = {p.asin: p for p in products}
    goals: list[Goal] = []
    for p in products:
        for _ in range(GOALS_PER_PRODUCT):
            attrs = tuple(sorted(rng.sample(p.attributes, rng.randint(1, min(3, len(p.attributes)))),
                                 key=p.attributes.index))
            goal_options = {o: rng.choice(v) for o, v in p.options.items()}
            price_range = [x for x in PRICE_RANGE if x > p.price][:4]
            _, upper = sorted(rng.sample(price_range, 2))
            goals.append(Goal(len(goals), p.asin, p.category, p.query, p.product_category, p.nouns,
                              _instruction_text(rng, p, attrs, goal_options, upper), attrs, goal_options, upper))
    docs = [_tokens(" ".join((p.title, " ".join(p.attributes), p.query, p.product_category))) for p in products]
    return Catalogue(products, by_asin, goals, BM25(docs))


def _instruction_text(rng: random.Random, p: Product, attrs: tuple[str, ...], options: dict[str, str],
                      upper: float) -> str:
    attr_text = " and ".join(attrs)
    option_text = ", and ".join(f"{k}: {v}" for k, v in options.items())
    template = rng.choice((
        "i need {type} that is {attrs}",
        "i am looking for {type} that is {attrs}",
        "find me {attrs} {type}",
        "i want to buy {type}, {attrs}",
    ))
    text = template.format(type=p.query, attrs=attr_text)
    if option_text:
        text += f", with {option_text}"
    return f"{text}, and price lower than {upper:.2f} dollars"


# ---------------------------------------------------------------------------------------
# Reward, as WebShop computes it


def _ratio(a: str, b: str) -> float:
    return 100.0 * difflib.SequenceMatcher(None, a, b).ratio() if (a or b) else 100.0


def token_set_ratio(a: str, b: str) -> float:
    """thefuzz's ``token_set_ratio`` (0-100) with difflib in place of Levenshtein."""
    ta, tb = set(_tokens(a)), set(_tokens(b))
    inter = " ".join(sorted(ta & tb))
    da = " ".join(sorted(ta - tb))
    db = " ".join(sorted(tb - ta))
    t1 = f"{inter} {da}".strip()
    t2 = f"{inter} {db}".strip()
    if inter and (not da or not db):
        return 100.0
    return max(_ratio(inter, t1), _ratio(inter, t2), _ratio(t1, t2))


def _text_of(p: Product) -> tuple[str, str, str]:
    return p.title.lower(), " ".join(p.features).lower(), p.description.lower()


def type_reward(p: Product, goal: Goal) -> dict[str, Any]:
    query_match = p.query == goal.query
    cats_p = {x.strip() for x in p.product_category.split("›")}
    cats_g = {x.strip() for x in goal.product_category.split("›")}
    category_match = len(cats_p & cats_g) >= 2
    inter = len(p.nouns & goal.nouns)
    title_score = inter / len(goal.nouns) if goal.nouns else 0.2
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {"r_type": r_type, "query_match": query_match, "category_match": category_match,
            "title_score": title_score}


def attribute_matches(p: Product, goal: Goal) -> int:
    texts = _text_of(p)
    n = 0
    for g in goal.attributes:
        if any(token_set_ratio(a, g) > 85 for a in p.attributes) or any(g in t for t in texts):
            n += 1
    return n


def option_matches(p: Product, goal: Goal, chosen: dict[str, str]) -> int:
    wanted = [v.lower() for v in goal.goal_options.values()]
    texts = _text_of(p)
    n = 0
    for key, value in chosen.items():
        v = value.lower()
        if key.lower() in EXACT_MATCH_OPTS:
            matched = v in wanted
        else:
            matched = any(token_set_ratio(g, v) > 85 for g in wanted)
        if matched or any(v in t for t in texts):
            n += 1
    return n


def webshop_reward(p: Product, goal: Goal, chosen: dict[str, str]) -> tuple[float, dict[str, Any]]:
    """WebShop's ``get_reward`` for buying ``p`` with options ``chosen`` (see module doc)."""
    t = type_reward(p, goal)
    r_price = p.price <= goal.price_upper
    n_att = attribute_matches(p, goal)
    n_opt = option_matches(p, goal, chosen)
    denom = len(goal.attributes) + len(goal.goal_options) + 1
    total = (n_att + n_opt + int(r_price)) / denom * t["r_type"]
    info = {**t, "r_att": n_att / len(goal.attributes), "r_price": r_price,
            "r_option": n_opt / len(goal.goal_options) if goal.goal_options else None}
    return total, info


def best_options(p: Product, goal: Goal) -> dict[str, str]:
    """For each option type of ``p``, the goal's value where ``p`` offers it."""
    out = {}
    for key, values in p.options.items():
        want = goal.goal_options.get(key)
        if want is not None and want in values:
            out[key] = want
    return out


# ---------------------------------------------------------------------------------------
# Splits


@cache
def _split_ids(dedupe: bool = True) -> dict[str, tuple[str, ...]]:
    """Goals by split: every fifth goal of the kept categories is ``seen``. A goal that makes an
    earlier goal's request (goals 54 and 66, two products for one request; 61 and 67) joins that
    goal's split; ``dedupe=False`` gives the lists of
    before that rule, which only the tiny model's corpus reads (its tokenizer was trained on them)."""
    cat = catalogue()
    train: list[str] = []
    seen: list[str] = []
    unseen: list[str] = []
    k = 0
    first: dict[tuple[Any, ...], list[str]] = {}  # a goal of the same request as an earlier one joins its split
    for g in cat.goals:
        tid = f"shop-{g.index}"
        if g.category in HELD_OUT_CATEGORIES:
            unseen.append(tid)
        else:
            key = (g.instruction_text, g.attributes, tuple(sorted(g.goal_options.items())), g.price_upper)
            here = seen if k % 5 == 4 else train
            (first.setdefault(key, here) if dedupe else here).append(tid)
            k += 1
    return {"train": tuple(train), "seen": tuple(seen), "unseen": tuple(unseen)}


def parse_task(task_id: object) -> Goal:
    goals = catalogue().goals
    m = re.fullmatch(r"shop-(0|[1-9][0-9]*)", task_id) if isinstance(task_id, str) else None
    if m is None or int(m.group(1)) >= len(goals):
        raise TurnRLError(f"shop: unknown task id {task_id!r}; expected 'shop-<n>' with 0 <= n < {len(goals)}")
    return goals[int(m.group(1))]


# ---------------------------------------------------------------------------------------
# The environment

INSTRUCTION = """\
You are web shopping. Find and buy the product the instruction asks for.
On the search page, search with search[<keywords>]. On other pages, click a button or an \
option shown in the observation with click[<text>], e.g. click[Next >], click[B0ABC12345], \
click[large], click[Buy Now]. Select every option the instruction asks for before buying. \
Buying ends the episode with a reward in [0, 1] for how well the product matches the \
instruction (type, attributes, options and price).
Respond in exactly this format:
Thought: <one short sentence>
Action: <search[...] or click[...]>"""

SEP = " [SEP] "


@dataclass
class _Page:
    kind: str  # search | results | item | sub
    keywords: str = ""
    results: list[Product] = field(default_factory=list)
    page: int = 1
    asin: str = ""
    sub: str = ""


class Shop(TextEnv):
    """The in-process WebShop-like store (see module doc)."""

    name = "shop"
    max_turns = 15

    def __init__(self, *, max_turns: int = 15) -> None:
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 3:
            raise TurnRLError(f"shop: max_turns must be an integer >= 3 (got {max_turns!r})")
        self.max_turns = max_turns
        self.cat = catalogue()
        self._goal: Goal | None = None
        self._task_id = ""
        self._page = _Page("search")
        self._history: list[_Page] = []
        self._chosen: dict[str, str] = {}
        self._turns = 0
        self._searches = 0
        self._done = False

    # -- contract ------------------------------------------------------------------------

    @property
    def instruction(self) -> str:
        text = INSTRUCTION
        if self._goal is not None:
            text += f"\nInstruction: {self._goal.instruction_text}"
        return text

    def task_ids(self, split: str) -> list[str]:
        ids = _split_ids()
        if split not in ids:
            raise TurnRLError(f"shop: unknown split {split!r}; choose from: train, seen, unseen")
        return list(ids[split])

    def corpus_task_ids(self, split: str) -> list[str]:
        """The tasks whose text trained the tiny model's tokenizer: the splits of before 29 Nov 2026."""
        self.task_ids(split)  # the split's check
        return list(_split_ids(dedupe=False)[split])

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        task_id = self.choose_task(seed, options)
        self._goal = parse_task(task_id)
        self._task_id = task_id
        self._page = _Page("search")
        self._history = []
        self._chosen = {}
        self._turns = 0
        self._searches = 0
        self._done = False
        return self._render(), self._info()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.running(self._goal, over=self._done)
        self._turns += 1
        text = action.strip() if isinstance(action, str) else ""
        m = re.fullmatch(r"(search|click)\[(.*)\]", text, re.DOTALL | re.IGNORECASE)
        if m and re.search(r"\]\s*(?:search|click)\[", m.group(2), re.IGNORECASE):
            m = None  # two commands in one ("search[a] click[b]"): no search for "a] click[b"
        kind, arg = (m.group(1).lower(), m.group(2).strip()) if m else ("", "")
        error = None
        if kind == "search" and self._page.kind == "search" and arg:
            self._searches += 1
            self._go(_Page("results", keywords=arg, results=self.cat.search(arg)))
        elif kind == "click":
            target = self._clickables().get(" ".join(arg.split()).lower())
            if target is None:
                error = f"there is no {arg!r} to click on this page"
            else:
                bought = self._click(target)
                if bought is not None:
                    return bought
        else:
            error = ("search[...] only works on the search page" if kind == "search" and arg
                     else "write search[<keywords>] or click[<button>]")
        truncated = self._turns >= self.max_turns
        obs = self._render()
        if error:
            obs = f"Invalid action {text!r}: {error}.{SEP}{obs}"
        info = self._info(invalid=error is not None)
        if truncated:
            self._done = True
            info.update(won=False, success=False, valid_actions=[])
        return obs, 0.0, False, truncated, info

    def valid_actions(self) -> list[str] | None:
        if self._goal is None or self._done:
            return []
        if self._page.kind == "search":
            return None  # free-text search
        return [f"click[{label}]" for label in self._labels()]

    def expert(self, rng: random.Random) -> ExpertStep:
        if self._goal is None or self._done:
            raise TurnRLError("shop: no expert move: the episode is not running (call reset())")
        goal, page = self._goal, self._page
        if page.kind == "search":
            if self._searches == 0:
                query = " ".join((goal.query, *goal.attributes))
                return ExpertStep(f"search[{query}]", f"I need {goal.query} ({', '.join(goal.attributes)}); "
                                  "I will search for that.")
            target = self.cat.by_asin[goal.asin]
            return ExpertStep(f"search[{target.title}]", "The first search had nothing that fits; "
                              "I will search a more specific title.")
        if page.kind == "results":
            shown = self._shown()
            for p in shown:
                if self._fits(p):
                    return ExpertStep(f"click[{p.asin}]", f"{p.asin} is {goal.query} ({', '.join(goal.attributes)}) "
                                      f"at ${p.price:.2f}, under ${goal.price_upper:.2f}; I will open it.")
            if page.page * PAGE_SIZE < len(page.results):
                return ExpertStep("click[Next >]", "Nothing on this page fits every requirement; next page.")
            return ExpertStep("click[Back to Search]", "No result fits; I will search again.")
        if page.kind == "sub":
            return ExpertStep("click[< Prev]", "I will go back to the item page.")
        product = self.cat.by_asin[page.asin]
        if not self._fits(product):
            return ExpertStep("click[< Prev]", "This item does not fit the instruction; back to the results.")
        for key, value in best_options(product, goal).items():
            if self._chosen.get(key) != value:
                return ExpertStep(f"click[{value}]", f"The instruction asks for {key}: {value}.")
        return ExpertStep("click[Buy Now]", "The item and its options match every requirement; I will buy it.")

    # -- internals -----------------------------------------------------------------------

    def _fits(self, p: Product) -> bool:
        assert self._goal is not None
        return webshop_reward(p, self._goal, best_options(p, self._goal))[0] >= 1.0

    def _go(self, page: _Page) -> None:
        self._history.append(self._page)
        self._page = page
        if page.kind == "results" or page.kind == "search":
            self._chosen = {}

    def _shown(self) -> list[Product]:
        page = self._page
        return page.results[(page.page - 1) * PAGE_SIZE : page.page * PAGE_SIZE]

    def _labels(self) -> list[str]:
        page = self._page
        if page.kind == "results":
            labels = ["Back to Search"]
            if page.page > 1:
                labels.append("< Prev")
            if page.page * PAGE_SIZE < len(page.results):
                labels.append("Next >")
            return labels + [p.asin for p in self._shown()]
        if page.kind == "item":
            product = self.cat.by_asin[page.asin]
            values = list(dict.fromkeys(v for vs in product.options.values() for v in vs))
            return ["Back to Search", "< Prev", *values, "Description", "Features", "Reviews", "Buy Now"]
        if page.kind == "sub":
            return ["Back to Search", "< Prev"]
        return []

    def _clickables(self) -> dict[str, str]:
        return {" ".join(label.split()).lower(): label for label in self._labels()}

    def _click(self, label: str) -> tuple[str, float, bool, bool, dict] | None:
        page = self._page
        if label == "Back to Search":
            self._go(_Page("search"))
        elif label == "Next >":
            self._page = _Page("results", page.keywords, page.results, page.page + 1)
        elif label == "< Prev" and page.kind == "results":
            self._page = _Page("results", page.keywords, page.results, page.page - 1)
        elif label == "< Prev":  # item -> results, sub-page -> item
            prev = self._history.pop() if self._history else _Page("search")
            self._page = prev
            if prev.kind != "item":
                self._chosen = {}
        elif page.kind == "results":
            self._go(_Page("item", page.keywords, page.results, page.page, asin=label))
            self._chosen = {}
        elif label in ("Description", "Features", "Reviews"):
            self._go(_Page("sub", page.keywords, page.results, page.page, asin=page.asin, sub=label))
        elif label == "Buy Now":
            return self._buy()
        else:  # an option value: select it under its option type(s)
            product = self.cat.by_asin[page.asin]
            for key, values in product.options.items():
                if label in values:
                    self._chosen[key] = label
        return None

    def _buy(self) -> tuple[str, float, bool, bool, dict]:
        assert self._goal is not None
        product = self.cat.by_asin[self._page.asin]
        reward, parts = webshop_reward(product, self._goal, self._chosen)
        self._done = True
        info = self._info()
        info.update(valid_actions=[], won=reward >= 1.0, success=reward >= 1.0, score=round(reward, 4),
                    purchased=product.asin, options=dict(self._chosen), reward_info=parts)
        obs = f"Thank you for shopping with us!{SEP}Your score (min 0.0, max 1.0){SEP}{reward:.4g}"
        return obs, float(reward), True, False, info

    def _render(self) -> str:
        assert self._goal is not None
        page = self._page
        if page.kind == "search":
            return f"WebShop{SEP}Instruction:{SEP}{self._goal.instruction_text}{SEP}Search"
        parts = ["Back to Search"]
        if page.kind == "results":
            if page.page > 1:
                parts.append("< Prev")
            parts.append(f"Page {page.page} (Total results: {len(page.results)})")
            if page.page * PAGE_SIZE < len(page.results):
                parts.append("Next >")
            for p in self._shown():
                parts += [p.asin, p.title, f"${p.price:.2f}"]
            if not page.results:
                parts.append("No results.")
            return SEP.join(parts)
        product = self.cat.by_asin[page.asin]
        parts.append("< Prev")
        if page.kind == "sub":
            body = {"Description": product.description, "Features": SEP.join(product.features),
                    "Reviews": "No reviews yet."}[page.sub]
            return SEP.join([*parts, body])
        for key, values in product.options.items():
            parts += [key, *values]
        parts += [product.title, f"Price: ${product.price:.2f}", "Rating: N.A.", "Description", "Features",
                  "Reviews", "Buy Now"]
        text = SEP.join(parts)
        if self._chosen:
            text = " ".join(f"You have clicked {v}." for v in self._chosen.values()) + "\n" + text
        return text

    def _info(self, *, invalid: bool = False) -> dict[str, Any]:
        info: dict[str, Any] = {"task_id": self._task_id, "page": self._page.kind, "turn": self._turns,
                                "invalid": invalid}
        acts = self.valid_actions()
        if acts is not None:
            info["valid_actions"] = acts
        return info


register("shop", Shop)
