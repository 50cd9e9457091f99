"""Twenty questions and guess-my-city (ArCHer, seed 003; LMRL-Gym's two dialogue games).

The answerer is a rule-based oracle over an attribute table written in this file (no
language model): it answers the questions it recognizes from the table, tells a wrong
guess apart from a right one, and says so when it cannot parse a question.

Rules (both games). The oracle holds a secret (an object, or a city). Each agent turn is
one question. A correct guess ends the episode with reward 0 and ``success``; every other
turn (a question, a wrong guess, a question the oracle does not understand) gives -1.
After ``max_turns`` (20) turns without a correct guess the game is over (terminated,
``success=False``), so an episode's return is ``-(turns - 1)`` on success and -20 on
failure, as in ArCHer / LMRL-Gym.

Questions. The instruction lists the questions the oracle understands (and, by default,
the candidate secrets); ``info["valid_actions"]`` lists the same questions plus one guess
per candidate (``Is it a dog?``, ``Is it Paris?``), so a policy's reply is matched to them
case-insensitively. With ``free_text=True`` no list is given and any text is stepped: the
oracle then matches it itself, exactly (after lower-casing and dropping punctuation) or
loosely (the question whose content words all occur in the text). It asks for one question
at a time when two such questions have equally many content words, when the text holds another
listed question's words too, or when it joins or negates ("or", "and", "not") where the matched
question does not: whatever the answers, so that a refusal tells nothing about the secret.

- ``twenty_questions``: 96 everyday objects in 12 categories, 72 yes/no questions
  (``Is it an animal?``, ``Does it have wheels?``...).
- ``guess_my_city``: 68 cities on six continents, yes/no questions (continent, country,
  language, capital, coast, population thresholds, hemisphere, climate, name) and open
  questions (``What country is the city in?`` -> ``It is in France.``) that an agent may
  use to do better than the expert.

Splits. Twenty questions: categories are split in-distribution (9) and held out (3:
vehicles, musical instruments, sea creatures); of each in-distribution category every
fourth object is a ``seen`` task and the rest are ``train`` tasks; ``unseen`` tasks are the
held-out categories' objects, and their candidate list is all 96 objects (train and seen
tasks list the 72 in-distribution objects). Guess-my-city: the same with continents,
Africa and Oceania held out. A task id names the secret: ``20q-dog``, ``city-new-york``.

Expert. It keeps the candidates consistent with every answer so far and asks the listed
yes/no question that splits them most evenly (ties broken with the caller's ``rng``); with
one or two candidates left it guesses one. The attribute table gives every object (and
every city) a distinct answer pattern, so the expert always wins, in about log2(N) + 1
turns.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from turnrl.envs import register
from turnrl.envs.base import ExpertStep, TextEnv
from turnrl.errors import TurnRLError, did_you_mean

# ---------------------------------------------------------------------------------------
# Shared machinery


@dataclass(frozen=True, eq=False)
class Item:
    """A possible secret: a name, a group (category or continent) and its facts."""

    name: str
    group: str
    attrs: frozenset[str]
    values: dict[str, str] = field(default_factory=dict)
    #: how a guess names it ("a dog", "a pair of scissors", "Paris")
    phrase: str = ""
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class Question:
    """A question the oracle understands. ``answer`` maps an item to the reply text and
    ``yes`` (for yes/no questions) to the truth value used by the expert."""

    text: str
    answer: Callable[[Item], str]
    yes: Callable[[Item], bool] | None = None
    aliases: tuple[str, ...] = ()


_STOP = frozenset(
    "is it a an the does do can you of in on to be are its it's there that this your object city "
    "thing secret please used usually mostly most for with by".split()
)


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9]+", " ", text.lower().replace("'", "")).split())


def _stem(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


#: words that make a question compound or negated ("not in Europe", "in Asia or Africa"): free text
#: with them is refused, since no listed question's answer answers it
_COMPOUND = frozenset("not no nor neither either never or and but isnt doesnt dont cant arent wasnt".split())


#: words that qualify no question ("Is it some kind of animal?"): free text may add them to a listed
#: question's; any other word it adds (a "sea" animal, "three" wheels) asks another question, refused
_FILLER = frozenset(_stem(w) for w in "some kind sort type really actually generally typically usually normally "
                    "commonly often maybe perhaps possibly at all ever something someone somewhere color colour".split())


def _content(text: str) -> frozenset[str]:
    return frozenset(_stem(w) for w in _norm(text).split() if w not in _STOP)


_GUESS_PREFIX = re.compile(
    r"^(?:guess|i guess|my guess is|i think it is|i think its|is it|it is|its|is this|is the (?:object|city|secret(?: object| city)?)"
    r"|is your (?:object|city)|the answer is|answer)\s+"
)
_ARTICLE = re.compile(r"^(?:a pair of|a|an|the)\s+")


class QAGame(TextEnv):
    """A question-answering guessing game over an attribute table (see module doc)."""

    max_turns = 20
    #: set by subclasses
    items: tuple[Item, ...] = ()
    questions: tuple[Question, ...] = ()
    held_out: tuple[str, ...] = ()
    id_prefix = ""
    noun = "object"

    def __init__(self, *, free_text: bool = False, show_candidates: bool = True) -> None:
        for key, val in (("free_text", free_text), ("show_candidates", show_candidates)):
            if not isinstance(val, bool):
                raise TurnRLError(f"{self.name}: {key} must be true or false (got {val!r})")
        self.free_text = free_text
        self.show_candidates = show_candidates
        self._by_id = {self.task_id_of(it): it for it in self.items}
        self._exact: dict[str, Question] = {}
        for q in self.questions:
            for t in (q.text, *q.aliases):
                self._exact.setdefault(_norm(t), q)
        self._loose = [(q, _content(q.text)) for q in self.questions]
        # the words of each listed question: a compound word ("or") that the question matched loosely uses
        # itself ("Do you eat or drink with it?") is its own, any other makes the text two questions in one
        self._words = {q.text: {w for t in (q.text, *q.aliases) for w in _norm(t).split()} for q in self.questions}
        # compound words that no listed question uses: a text with one is refused before any matching
        self._compound = _COMPOUND - set().union(*self._words.values())
        # the content words free text may use for each listed question: its own and its aliases'
        self._own = {q.text: frozenset().union(*(_content(t) for t in (q.text, *q.aliases))) for q in self.questions}
        self._names: dict[str, Item] = {}
        for it in self.items:
            for n in (it.name, *it.aliases):
                self._names[_norm(n)] = it
        ind = [it for it in self.items if it.group not in self.held_out]
        self._pool = {"in": tuple(ind), "all": self.items}
        train: list[str] = []
        seen: list[str] = []
        for group in dict.fromkeys(it.group for it in ind):
            members = [it for it in ind if it.group == group]
            for k, it in enumerate(members):
                (seen if k % 4 == 3 else train).append(self.task_id_of(it))
        self._splits = {
            "train": tuple(train),
            "seen": tuple(seen),
            "unseen": tuple(self.task_id_of(it) for it in self.items if it.group in self.held_out),
        }
        self._secret: Item | None = None
        self._task_id = ""
        self._candidates: tuple[Item, ...] = ()
        self._alive: list[Item] = []
        self._turns = 0
        self._done = False

    # -- contract ------------------------------------------------------------------------

    def task_id_of(self, item: Item) -> str:
        return f"{self.id_prefix}-{_norm(item.name).replace(' ', '-')}"

    def task_ids(self, split: str) -> list[str]:
        if split not in self._splits:
            raise TurnRLError(f"{self.name}: unknown split {split!r}; choose from: train, seen, unseen")
        return list(self._splits[split])

    @property
    def instruction(self) -> str:
        return self._instruction(self._candidates or self._pool["in"])

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        task_id = self.choose_task(seed, options)
        if task_id not in self._by_id:
            raise TurnRLError(
                f"{self.name}: unknown task id {task_id!r}{did_you_mean(str(task_id), self._by_id)}; "
                f"expected '{self.id_prefix}-<name>', e.g. {self.task_ids('train')[0]!r}"
            )
        secret = self._by_id[task_id]
        self._secret = secret
        self._task_id = task_id
        self._candidates = self._pool["all" if secret.group in self.held_out else "in"]
        self._alive = list(self._candidates)
        self._turns = 0
        self._done = False
        obs = f"I am thinking of {_article(self.noun)}. Ask your first question. You have {self.max_turns} questions."
        return obs, self._info()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        secret = self.running(self._secret, over=self._done)
        self._turns += 1
        text = action.strip() if isinstance(action, str) else ""
        kind, reply, target = self._interpret(text)
        if kind == "guess" and target is secret:
            self._done = True
            info = self._info(kind="guess", question=text)
            info.update(won=True, success=True, outcome="win", questions=self._turns)
            found = f"{self._turns} question{'' if self._turns == 1 else 's'}"
            return f"Yes! It is {secret.phrase}. You found it in {found}.", 0.0, True, False, info
        invalid = kind == "unknown"
        if kind == "guess" and target is not None:
            self._alive = [it for it in self._alive if it is not target]
        elif isinstance(target, Question):
            said = target.answer(secret)
            self._alive = [it for it in self._alive if target.answer(it) == said]
        left = self.max_turns - self._turns
        info = self._info(kind=kind, question=text, invalid=invalid)
        if left <= 0:
            self._done = True
            info.update(won=False, success=False, outcome="out_of_questions", questions=self._turns,
                        valid_actions=[])
            return f"{reply} No questions left: it was {secret.phrase}.", -1.0, True, False, info
        return f"{reply} {left} question{'s' if left != 1 else ''} left.", -1.0, False, False, info

    def valid_actions(self) -> list[str] | None:
        if self.free_text:
            return None
        if self._secret is None or self._done:
            return []
        return [q.text for q in self.questions] + [self.guess_text(it) for it in self._candidates]

    def expert(self, rng: random.Random) -> ExpertStep:
        if self._secret is None or self._done:
            raise TurnRLError(f"{self.name}: no expert move: the episode is not running (call reset())")
        alive = self._alive or list(self._candidates)
        n = len(alive)
        if n <= 2:
            pick = alive[0] if n == 1 else rng.choice(alive)
            if n == 1:
                thought = f"Only {pick.name} fits every answer, so I guess it."
            else:
                thought = f"Only {alive[0].name} and {alive[1].name} are left; I guess {pick.name}."
            return ExpertStep(self.guess_text(pick), thought)
        best: list[tuple[Question, int]] = []
        best_split = 0
        for q in self.questions:
            if q.yes is None:
                continue
            yes = sum(1 for it in alive if q.yes(it))
            score = min(yes, n - yes)
            if score > best_split:
                best, best_split = [(q, yes)], score
            elif score == best_split and score > 0:
                best.append((q, yes))
        if not best:  # no question tells them apart: guess one
            pick = rng.choice(alive)
            return ExpertStep(self.guess_text(pick), f"No question separates the {n} left; I guess {pick.name}.")
        q, yes = rng.choice(best)
        return ExpertStep(q.text, f"{n} {self.noun_plural} are still possible; this splits them {yes} to {n - yes}.")

    # -- internals -----------------------------------------------------------------------

    @property
    def noun_plural(self) -> str:
        return "cities" if self.noun == "city" else self.noun + "s"

    def guess_text(self, item: Item) -> str:
        return f"Is it {item.phrase}?"

    def _interpret(self, text: str) -> tuple[str, str, Item | Question | None]:
        """``(kind, reply, target)``: kind is guess / question / unknown."""
        norm = _norm(text)
        guess = self._guess(norm)
        if guess is not None:
            if guess is self._secret:
                return "guess", "Yes!", guess
            return "guess", f"No, it is not {guess.phrase}.", guess
        q = self._exact.get(norm)
        if q is None and norm:
            joins = _COMPOUND & set(norm.split())
            if joins & self._compound:  # "not", "and", "or": no listed question's answer
                return "unknown", "Please ask one question at a time.", None  # answers these
            words = _content(text)
            hits = [(q2, c) for q2, c in self._loose if c and c <= words]
            if hits:
                top = max(len(c) for _, c in hits)
                tied = [q2 for q2, c in hits if len(c) == top]
                # two questions in one (another listed question's words, none shared with this one's: "in
                # the United States on the coast"), or ambiguous by its words alone: whether the parts'
                # answers agree for this secret must not decide it, or the refusal would tell about it
                top_words = next(c for q2, c in hits if q2 is tied[0])
                if len(tied) > 1 or any(not c & top_words for _, c in hits):
                    return "unknown", "Please ask one question at a time.", None
                if joins - self._words[tied[0].text]:  # "a pet or a farm animal": not the question's own "or"
                    return "unknown", "Please ask one question at a time.", None
                if words - self._own[tied[0].text] - _FILLER:  # "a sea animal", "three wheels": another question
                    return ("unknown", f"I can't answer that; ask one of the listed questions or guess the "
                            f"{self.noun}.", None)
                q = tied[0]
        if q is None:
            return "unknown", f"I can't answer that; ask one of the listed questions or guess the {self.noun}.", None
        assert self._secret is not None
        return "question", q.answer(self._secret), q

    def _guess(self, norm: str) -> Item | None:
        rest = norm
        m = _GUESS_PREFIX.match(rest + " ")
        if m:
            rest = rest[m.end():].strip()
        rest = _ARTICLE.sub("", rest)
        if rest in self._names:
            return self._names[rest]
        # a name qualified by its own country or continent: "Cape Town, South Africa", "Paris in France"
        for name, item in self._names.items():
            if rest.startswith(name + " "):
                where = rest[len(name) + 1:].removeprefix("in ")
                places = {_norm(item.values[k]).removeprefix("the ") for k in ("country", "continent") if k in item.values}
                if where.removeprefix("the ") in places:
                    return item
        return None

    def _instruction(self, candidates: Sequence[Item]) -> str:
        raise NotImplementedError

    def _info(self, *, kind: str | None = None, question: str | None = None, invalid: bool = False) -> dict[str, Any]:
        info: dict[str, Any] = {
            "task_id": self._task_id,
            "turn": self._turns,
            "questions_left": self.max_turns - self._turns,
            "candidates": len(self._alive),
        }
        acts = self.valid_actions()
        if acts is not None:
            info["valid_actions"] = acts
            if not self.show_candidates and acts:  # what an invalid reply is told: not one guess per candidate
                info["shown_actions"] = [q.text for q in self.questions] + [f"Is it a <{self.noun}>?"]
        if kind is not None:
            info.update(kind=kind, question=question, invalid=invalid)
        return info

    def _format_help(self) -> str:
        return (
            "Respond in exactly this format:\n"
            "Thought: <one short sentence>\n"
            "Action: <your question>"
        )


def _yn(pred: Callable[[Item], bool]) -> Callable[[Item], str]:
    return lambda it: "Yes." if pred(it) else "No."


def _attr_q(text: str, key: str, *aliases: str) -> Question:
    pred: Callable[[Item], bool] = lambda it: key in it.attrs  # noqa: E731
    return Question(text, _yn(pred), pred, aliases)


# ---------------------------------------------------------------------------------------
# Twenty questions: objects and their attributes

_ATTRIBUTES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("animal", "Is it an animal?", ()),
    ("mammal", "Is it a mammal?", ()),
    ("bird", "Is it a bird?", ()),
    ("fish", "Is it a fish?", ()),
    ("fly", "Can it fly?", ()),
    ("four_legs", "Does it have four legs?", ()),
    ("many_limbs", "Does it have more than four arms or legs?", ()),
    ("pet", "Is it commonly kept as a pet?", ("is it a pet",)),
    ("farm", "Is it a farm animal?", ()),
    ("wild", "Does it live in the wild?", ("is it a wild animal",)),
    ("africa", "Does it live in Africa?", ()),
    ("sea", "Does it live in the sea?", ("does it live in the ocean",)),
    ("meat", "Does it eat meat?", ()),
    ("climb", "Can it climb trees?", ()),
    ("horns", "Does it have horns?", ()),
    ("wool", "Do people get wool from it?", ()),
    ("long_neck", "Does it have a long neck?", ()),
    ("stripes", "Does it have stripes?", ()),
    ("night", "Is it active mainly at night?", ()),
    ("shell", "Does it have a hard shell?", ()),
    ("plant", "Does it come from a plant?", ("is it a plant",)),
    ("fruit", "Is it a fruit?", ()),
    ("vegetable", "Is it a vegetable?", ()),
    ("sweet", "Does it taste sweet?", ("is it sweet",)),
    ("tree", "Does it grow on a tree?", ()),
    ("underground", "Does it grow underground?", ()),
    ("pit", "Does it have a single hard pit inside?", ("does it have a pit", "does it have a stone")),
    ("peel", "Do you peel it before eating it?", ()),
    ("red", "Is it usually red?", ("is it red",)),
    ("green", "Is it usually green?", ("is it green",)),
    ("yellow", "Is it usually yellow?", ("is it yellow",)),
    ("orange", "Is it usually orange?", ("is it orange in color", "is it orange coloured")),
    ("round", "Is it round?", ()),
    ("big", "Is it bigger than a person?", ("is it big", "is it large")),
    ("handheld", "Can you hold it in one hand?", ("is it small",)),
    ("electric", "Does it need electricity to work?", ("is it electric", "does it use electricity")),
    ("engine", "Does it have an engine?", ()),
    ("wheels", "Does it have wheels?", ()),
    ("doors", "Does it have doors?", ()),
    ("metal", "Is it made mostly of metal?", ("is it made of metal",)),
    ("wood", "Is it made mostly of wood?", ("is it made of wood",)),
    ("cloth", "Is it made of cloth?", ("is it made of fabric",)),
    ("leather", "Is it usually made of leather?", ()),
    ("furniture", "Is it a piece of furniture?", ("is it furniture",)),
    ("sit", "Can you sit on it?", ()),
    ("sleep", "Do people sleep on it?", ()),
    ("drawers", "Does it have drawers?", ()),
    ("kitchen", "Is it found in a kitchen?", ("is it used in the kitchen",)),
    ("eat_with", "Do you eat or drink with it?", ()),
    ("cook", "Is it used for cooking?", ()),
    ("sharp", "Does it have a sharp edge or point?", ("is it sharp",)),
    ("cut", "Is it used to cut things?", ()),
    ("turn", "Is it used to turn screws or bolts?", ()),
    ("dig", "Is it used for digging?", ()),
    ("tool", "Is it a tool?", ()),
    ("wear", "Do you wear it?", ("is it clothing", "is it something you wear")),
    ("feet", "Do you wear it on your feet?", ()),
    ("head", "Do you wear it on your head?", ()),
    ("hands", "Do you wear it on your hands?", ()),
    ("warm", "Do you wear it to keep warm?", ()),
    ("sleeves", "Does it have sleeves?", ()),
    ("vehicle", "Is it a vehicle?", ()),
    ("many_people", "Can it carry more than twenty people?", ()),
    ("rails", "Does it run on rails?", ()),
    ("on_water", "Does it travel on water?", ()),
    ("music", "Is it a musical instrument?", ("is it an instrument",)),
    ("strings", "Does it have strings?", ()),
    ("blow", "Do you blow into it to play it?", ()),
    ("keys", "Does it have keys you press?", ()),
    ("bow", "Do you play it with a bow?", ()),
    ("hit", "Do you hit it to play it?", ()),
    ("brass", "Is it a brass instrument?", ()),
)

# name | category | true attributes (every other attribute is false)
_OBJECTS = """
dog | mammals | animal mammal four_legs pet meat
cat | mammals | animal mammal four_legs pet meat climb
cow | mammals | animal mammal four_legs farm big horns
horse | mammals | animal mammal four_legs farm big sit
pig | mammals | animal mammal four_legs farm
rabbit | mammals | animal mammal four_legs pet
goat | mammals | animal mammal four_legs farm horns
sheep | mammals | animal mammal four_legs farm wool
lion | wild animals | animal mammal four_legs meat wild africa
wolf | wild animals | animal mammal four_legs meat wild night
bear | wild animals | animal mammal four_legs meat wild big climb
elephant | wild animals | animal mammal four_legs wild africa big
giraffe | wild animals | animal mammal four_legs wild africa big long_neck
zebra | wild animals | animal mammal four_legs wild africa stripes
monkey | wild animals | animal mammal wild africa climb
kangaroo | wild animals | animal mammal wild
eagle | birds | animal bird fly meat wild
owl | birds | animal bird fly meat wild night
chicken | birds | animal bird farm
duck | birds | animal bird farm fly
penguin | birds | animal bird meat wild
parrot | birds | animal bird fly pet
ostrich | birds | animal bird wild africa long_neck big
swan | birds | animal bird fly wild long_neck
apple | fruits | plant fruit sweet tree red round handheld
cherry | fruits | plant fruit sweet tree red round handheld pit
banana | fruits | plant fruit sweet tree yellow peel handheld
lemon | fruits | plant fruit tree yellow handheld
orange | fruits | plant fruit sweet tree orange round peel handheld
strawberry | fruits | plant fruit sweet red handheld
grape | fruits | plant fruit sweet green round handheld
watermelon | fruits | plant fruit sweet green round
carrot | vegetables | plant vegetable underground orange handheld
potato | vegetables | plant vegetable underground handheld
onion | vegetables | plant vegetable underground round peel handheld
broccoli | vegetables | plant vegetable green handheld
lettuce | vegetables | plant vegetable green round
corn | vegetables | plant vegetable yellow sweet
pumpkin | vegetables | plant vegetable orange round
pea | vegetables | plant vegetable green round handheld
chair | furniture | furniture four_legs wood sit
table | furniture | furniture four_legs wood
desk | furniture | furniture four_legs wood drawers
bed | furniture | furniture big sit sleep
sofa | furniture | furniture big sit cloth
bookshelf | furniture | furniture big wood
wardrobe | furniture | furniture big wood doors
lamp | furniture | furniture electric
spoon | kitchen items | kitchen eat_with metal handheld
fork | kitchen items | kitchen eat_with metal handheld sharp
knife | kitchen items | kitchen eat_with metal handheld sharp cut
plate | kitchen items | kitchen eat_with round
cup | kitchen items | kitchen eat_with handheld
pan | kitchen items | kitchen metal cook
kettle | kitchen items | kitchen metal cook electric
refrigerator | kitchen items | kitchen electric big doors
hammer | tools | tool metal handheld
saw | tools | tool metal sharp cut
screwdriver | tools | tool metal handheld sharp turn
wrench | tools | tool metal handheld turn
shovel | tools | tool dig
drill | tools | tool electric handheld turn
ladder | tools | tool big metal
scissors | tools | tool metal handheld sharp cut
shirt | clothing | wear cloth sleeves
jacket | clothing | wear cloth sleeves warm
shoe | clothing | wear feet leather
sock | clothing | wear feet cloth
hat | clothing | wear head warm
scarf | clothing | wear cloth warm
glove | clothing | wear cloth warm hands
belt | clothing | wear leather
car | vehicles | vehicle engine wheels metal doors sit big
bus | vehicles | vehicle engine wheels metal doors sit big many_people
train | vehicles | vehicle engine wheels metal doors sit big many_people rails
airplane | vehicles | vehicle engine wheels metal doors sit big many_people fly
helicopter | vehicles | vehicle engine metal doors sit big fly
boat | vehicles | vehicle engine sit big on_water
bicycle | vehicles | vehicle wheels metal sit
motorcycle | vehicles | vehicle engine wheels metal sit
guitar | musical instruments | music strings wood
violin | musical instruments | music strings wood bow
harp | musical instruments | music strings wood big
piano | musical instruments | music strings wood big keys
drum | musical instruments | music round hit
flute | musical instruments | music blow metal handheld
trumpet | musical instruments | music blow metal brass
saxophone | musical instruments | music blow metal brass keys
shark | sea creatures | animal fish sea meat wild big sharp
whale | sea creatures | animal mammal sea wild big
dolphin | sea creatures | animal mammal sea meat wild
octopus | sea creatures | animal sea meat wild many_limbs
crab | sea creatures | animal sea wild many_limbs shell
starfish | sea creatures | animal sea wild many_limbs
jellyfish | sea creatures | animal sea wild
seahorse | sea creatures | animal fish sea wild handheld
"""

_OBJECT_PHRASES = {"scissors": "a pair of scissors"}
_OBJECT_ALIASES = {
    "refrigerator": ("fridge",), "sofa": ("couch",), "airplane": ("plane", "aeroplane", "aircraft"),
    "bicycle": ("bike",), "motorcycle": ("motorbike",), "scissors": ("pair of scissors",),
    "seahorse": ("sea horse",), "bookshelf": ("bookcase",), "shoe": ("shoes",), "sock": ("socks",),
    "glove": ("gloves",),
}
_HELD_OUT_CATEGORIES = ("vehicles", "musical instruments", "sea creatures")


def _article(name: str) -> str:
    return ("an " if name[0] in "aeiou" else "a ") + name


def _parse_objects() -> tuple[Item, ...]:
    keys = {k for k, _, _ in _ATTRIBUTES}
    out = []
    for line in _OBJECTS.strip().splitlines():
        name, group, attrs = (part.strip() for part in line.split("|"))
        bad = set(attrs.split()) - keys
        assert not bad, f"{name}: unknown attributes {bad}"
        out.append(Item(name, group, frozenset(attrs.split()), phrase=_OBJECT_PHRASES.get(name, _article(name)),
                        aliases=_OBJECT_ALIASES.get(name, ())))
    return tuple(out)


class TwentyQuestions(QAGame):
    """Twenty questions over 96 everyday objects (see module doc)."""

    name = "twenty_questions"
    items = _parse_objects()
    questions = tuple(_attr_q(text, key, *aliases) for key, text, aliases in _ATTRIBUTES)
    held_out = _HELD_OUT_CATEGORIES
    id_prefix = "20q"
    noun = "object"

    def _instruction(self, candidates: Sequence[Item]) -> str:
        parts = [
            "You are playing twenty questions. I am thinking of an object; find out which one by asking "
            "yes/no questions, one per turn, and then guessing it."
        ]
        if self.show_candidates:
            parts.append("The object is one of: " + ", ".join(it.name for it in candidates) + ".")
        if not self.free_text:
            parts.append("You can ask these questions:\n" + "\n".join(q.text for q in self.questions))
        parts.append(
            'To guess, ask "Is it a <object>?", for example "Is it a dog?". Every question, a wrong guess '
            "included, gives reward -1; a correct guess ends the game with reward 0. You have 20 questions."
        )
        parts.append(self._format_help())
        return "\n".join(parts)


# ---------------------------------------------------------------------------------------
# Guess my city: cities and their facts

# name | continent | country | language | population (millions, metro area, rounded) | flags
_CITIES = """
London | Europe | the United Kingdom | English | 9.6 | capital
Manchester | Europe | the United Kingdom | English | 2.8 |
Dublin | Europe | Ireland | English | 1.5 | capital coastal
Paris | Europe | France | French | 11.2 | capital
Marseille | Europe | France | French | 1.9 | coastal
Berlin | Europe | Germany | German | 4.6 | capital
Munich | Europe | Germany | German | 3.0 |
Vienna | Europe | Austria | German | 2.0 | capital
Madrid | Europe | Spain | Spanish | 6.8 | capital
Barcelona | Europe | Spain | Spanish | 5.6 | coastal
Lisbon | Europe | Portugal | Portuguese | 2.9 | capital coastal
Rome | Europe | Italy | Italian | 4.3 | capital
Milan | Europe | Italy | Italian | 4.3 |
Amsterdam | Europe | the Netherlands | Dutch | 2.5 | capital
Athens | Europe | Greece | Greek | 3.6 | capital coastal
Stockholm | Europe | Sweden | Swedish | 2.4 | capital coastal
Warsaw | Europe | Poland | Polish | 3.1 | capital
Prague | Europe | the Czech Republic | Czech | 2.7 | capital
Moscow | Europe | Russia | Russian | 17.3 | capital
New York | North America | the United States | English | 19.5 | coastal
Los Angeles | North America | the United States | English | 12.8 | coastal
Chicago | North America | the United States | English | 9.3 |
Washington | North America | the United States | English | 6.3 | capital
Miami | North America | the United States | English | 6.1 | coastal tropical
San Francisco | North America | the United States | English | 4.6 | coastal
Boston | North America | the United States | English | 4.9 | coastal
Toronto | North America | Canada | English | 6.7 |
Vancouver | North America | Canada | English | 2.6 | coastal
Montreal | North America | Canada | French | 4.3 |
Mexico City | North America | Mexico | Spanish | 22.3 | capital
Havana | North America | Cuba | Spanish | 2.1 | capital coastal tropical
Tokyo | Asia | Japan | Japanese | 37.1 | capital coastal
Osaka | Asia | Japan | Japanese | 19.0 | coastal
Beijing | Asia | China | Chinese | 21.9 | capital
Shanghai | Asia | China | Chinese | 29.2 | coastal
Hong Kong | Asia | China | Chinese | 7.5 | coastal
Seoul | Asia | South Korea | Korean | 25.5 | capital
Mumbai | Asia | India | Hindi | 21.7 | coastal tropical
Delhi | Asia | India | Hindi | 32.9 | capital
Bangkok | Asia | Thailand | Thai | 11.1 | capital tropical
Singapore | Asia | Singapore | English | 6.0 | capital coastal tropical
Jakarta | Asia | Indonesia | Indonesian | 11.2 | capital coastal tropical south
Manila | Asia | the Philippines | Filipino | 14.7 | capital coastal tropical
Hanoi | Asia | Vietnam | Vietnamese | 5.3 | capital tropical
Dubai | Asia | the United Arab Emirates | Arabic | 3.6 | coastal
Sao Paulo | South America | Brazil | Portuguese | 22.6 | south
Rio de Janeiro | South America | Brazil | Portuguese | 13.7 | coastal tropical south
Buenos Aires | South America | Argentina | Spanish | 15.6 | capital coastal south
Lima | South America | Peru | Spanish | 11.2 | capital coastal south
Bogota | South America | Colombia | Spanish | 11.5 | capital
Santiago | South America | Chile | Spanish | 6.9 | capital south
Caracas | South America | Venezuela | Spanish | 2.9 | capital tropical
Cairo | Africa | Egypt | Arabic | 22.6 | capital
Lagos | Africa | Nigeria | English | 16.0 | coastal tropical
Nairobi | Africa | Kenya | Swahili | 5.3 | capital south
Cape Town | Africa | South Africa | English | 4.9 | coastal south
Johannesburg | Africa | South Africa | English | 6.2 | south
Casablanca | Africa | Morocco | Arabic | 4.3 | coastal
Addis Ababa | Africa | Ethiopia | Amharic | 5.7 | capital
Accra | Africa | Ghana | English | 2.6 | capital coastal tropical
Kinshasa | Africa | the Democratic Republic of the Congo | French | 17.0 | capital tropical south
Sydney | Oceania | Australia | English | 5.3 | coastal south
Melbourne | Oceania | Australia | English | 5.2 | coastal south
Brisbane | Oceania | Australia | English | 2.6 | coastal south
Perth | Oceania | Australia | English | 2.2 | coastal south
Canberra | Oceania | Australia | English | 0.5 | capital south
Auckland | Oceania | New Zealand | English | 1.7 | coastal south
Wellington | Oceania | New Zealand | English | 0.4 | capital coastal south
"""

_CITY_ALIASES = {
    "New York": ("new york city", "nyc"), "Los Angeles": ("la",), "Sao Paulo": ("são paulo",),
    "Bogota": ("bogotá",), "Washington": ("washington dc", "washington d c"), "Rio de Janeiro": ("rio",),
    "Montreal": ("montréal",), "Delhi": ("new delhi",),
}
_HELD_OUT_CONTINENTS = ("Africa", "Oceania")
CONTINENTS = ("Europe", "Asia", "Africa", "North America", "South America", "Oceania")


def _parse_cities() -> tuple[Item, ...]:
    out = []
    for line in _CITIES.strip().splitlines():
        name, continent, country, language, pop, flags = (part.strip() for part in line.split("|"))
        millions = float(pop)
        attrs = set(flags.split())
        for threshold in (1, 5, 10):
            if millions > threshold:
                attrs.add(f"over{threshold}m")
        if name[0].upper() <= "M":
            attrs.add("a_to_m")
        if " " in name:
            attrs.add("two_words")
        values = {"continent": continent, "country": country, "language": language, "population": pop}
        out.append(Item(name, continent, frozenset(attrs), values, phrase=name,
                        aliases=tuple(_norm(a) for a in _CITY_ALIASES.get(name, ()))))
    return tuple(out)


def _population_text(it: Item) -> str:
    m = float(it.values["population"])
    if m < 1:
        return "About half a million people live there." if m >= 0.45 else "Fewer than half a million people live there."
    return f"About {round(m)} million people live in the metropolitan area."


def _city_questions(cities: Sequence[Item]) -> tuple[Question, ...]:
    qs: list[Question] = []

    def value_q(text: str, key: str, value: str, *aliases: str) -> Question:
        pred: Callable[[Item], bool] = lambda it: it.values[key] == value  # noqa: E731
        return Question(text, _yn(pred), pred, aliases)

    for c in CONTINENTS:
        qs.append(value_q(f"Is the city in {c}?", "continent", c, f"is it in {c}"))
    countries = sorted({it.values["country"] for it in cities}, key=lambda s: s.removeprefix("the "))
    for c in countries:
        qs.append(value_q(f"Is the city in {c}?", "country", c, f"is it in {c}"))
    languages = sorted({it.values["language"] for it in cities})
    for lang in languages:
        qs.append(value_q(f"Do most people there speak {lang}?", "language", lang))
    qs += [
        _attr_q("Is it the capital of its country?", "capital", "is it a capital", "is it a capital city"),
        _attr_q("Is it on the coast?", "coastal", "is it by the sea", "is it a coastal city"),
        _attr_q("Do more than 1 million people live there?", "over1m"),
        _attr_q("Do more than 5 million people live there?", "over5m"),
        _attr_q("Do more than 10 million people live there?", "over10m"),
        _attr_q("Is it in the Southern Hemisphere?", "south"),
        _attr_q("Does it have a tropical climate?", "tropical", "is it tropical"),
        _attr_q("Does its name start with a letter from A to M?", "a_to_m"),
        _attr_q("Does its name have more than one word?", "two_words"),
        Question("What continent is the city in?", lambda it: f"It is in {it.values['continent']}.",
                 aliases=("which continent is it in", "what continent is it on")),
        Question("What country is the city in?", lambda it: f"It is in {it.values['country']}.",
                 aliases=("which country is it in",)),
        Question("What language do most people there speak?",
                 lambda it: f"Most people there speak {it.values['language']}.",
                 aliases=("what language do they speak",)),
        Question("How many people live there?", _population_text, aliases=("what is its population",)),
    ]
    return tuple(qs)


_CITY_ITEMS = _parse_cities()


class GuessMyCity(QAGame):
    """Guess-my-city over 68 cities, with yes/no and open questions (see module doc)."""

    name = "guess_my_city"
    items = _CITY_ITEMS
    questions = _city_questions(_CITY_ITEMS)
    held_out = _HELD_OUT_CONTINENTS
    id_prefix = "city"
    noun = "city"

    def _instruction(self, candidates: Sequence[Item]) -> str:
        parts = [
            "You are playing guess my city. I am thinking of a city; find out which one by asking "
            "questions, one per turn, and then guessing it."
        ]
        if self.show_candidates:
            parts.append("The city is one of: " + ", ".join(it.name for it in candidates) + ".")
        if not self.free_text:
            fixed = [q.text for q in self.questions if not q.text.startswith(("Is the city in ", "Do most people"))]
            parts.append(
                "You can ask these questions:\nIs the city in <continent or country>? (e.g. Is the city in Europe? "
                "Is the city in France?)\nDo most people there speak <language>? (e.g. Do most people there speak "
                "French?)\n" + "\n".join(fixed)
            )
        parts.append(
            'To guess, ask "Is it <city>?", for example "Is it Paris?". Every question, a wrong guess '
            "included, gives reward -1; a correct guess ends the game with reward 0. You have 20 questions."
        )
        parts.append(self._format_help())
        return "\n".join(parts)


register("twenty_questions", TwentyQuestions)
register("guess_my_city", GuessMyCity)
