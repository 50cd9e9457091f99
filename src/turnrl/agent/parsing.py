"""Parse an agent's reply into an action.

Replies follow ReAct, ``Thought: ...`` then ``Action: ...``; the RLFT format
``ACTION=X`` (seed 004) is read too. The parser takes the **last** action written that is
valid: a model that corrects itself ("Action: 9", then on a later line "Action: 4") acts on
its last valid choice (each ``Action:`` starts its own line). Where the env cannot enumerate
its actions, the last action written is taken.
``Action:`` takes the rest of its line. ``ACTION=`` takes one word (or ``word[...]``) where
the env lists its actions, so "ACTION=blue, the best so far" acts on blue, or else the rest of
its line where that is a listed action ("ACTION=go to shelf 1" in a household game); where the
env lists none, the rest of the line (free-text commands).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

_REACT = re.compile(r"^[ \t]*Action[ \t]*:[ \t]*(.*?)[ \t]*$", re.MULTILINE | re.IGNORECASE)
#: ``ACTION=X`` where the env lists its actions: X is one word (or ``search[...]``), so that
#: "ACTION=blue, the best so far" acts on blue. Upper case only, unlike ``Action:``: the bandits'
#: history lines read ``Step=3 Action=blue Reward=0.5``, and a reply that quotes one must not act on it
_RLFT_WORD = re.compile(r"ACTION[ \t]*=[ \t]*([^\s,.;\[]+(?:\[[^\]]*\])?)")
#: ... and where it cannot (free-text commands such as ScienceWorld's), a ``word[...]`` command or
#: else the rest of the line, as after ``Action:``: "ACTION=go to shelf 1" is not "go"
_RLFT_LINE = re.compile(r"ACTION[ \t]*=[ \t]*(?:([^\s,.;\[]+\[[^\]]*\])|(.*?)[ \t]*$)", re.MULTILINE)


@dataclass(frozen=True)
class ParsedAction:
    """``action`` is the canonical valid action (or the raw text where none is valid)."""

    action: str | None
    valid: bool
    candidates: tuple[str, ...] = ()


def _bare(raw: str) -> str:
    """An action as written, less quotes around it and a sentence's period: ``4``, ```4```, ``"4".``
    and ```4`.`` are ``4``, as is ``'4`` (a lone quote at one end); quotes inside it stay, with or
    without the period (``go to "desk 1".`` and ``go to "desk 1"`` are ``go to "desk 1"``)."""
    value = raw.strip()
    if value.endswith("."):
        value = value[:-1].rstrip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "`'\"":  # a quoted value
        value = value[1:-1].strip()
    else:
        for q in "`'\"":
            if value.count(q) == 1 and (value[0] == q or value[-1] == q):  # a lone quote at one end
                value = value.strip(q).strip()
    return value.rstrip(".")


def _matches(text: str, pats: Sequence[re.Pattern[str]]) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for pat in pats:
        for m in pat.finditer(text):
            value = _bare(next(g for g in m.groups() if g is not None))
            if value:
                found.append((m.start(), value))
    found.sort()
    return found


def _candidates(text: str, free_text: bool = False) -> list[tuple[int, str]]:
    return _matches(text, (_REACT, _RLFT_LINE if free_text else _RLFT_WORD))


_SPACE = re.compile(r"\s+")
_BRACKET_SPACE = re.compile(r"\s*([\[\]])\s*")


def _key(action: str) -> str:
    """What a written action is matched on: lower case, runs of whitespace as one space and none
    next to a bracket, and no ``?``/``!``/``.`` at its end, as the envs read a command:
    "Is it a dog" is "Is it a dog?", and "click[ Buy Now ]" is "click[Buy Now]"."""
    key = _BRACKET_SPACE.sub(r"\1", _SPACE.sub(" ", action.strip().lower()))
    return key.rstrip("?!.").rstrip()


def _listed_as(valid_actions: Sequence[str]) -> Callable[[str], str | None]:
    """The listed action a written one names: the one of its lower-case text, else the one of its
    :func:`_key` where no other listed action has that key (two actions that differ only in case,
    space or end punctuation are told apart only as written)."""
    exact = {a.strip().lower(): a for a in valid_actions}
    by_key: dict[str, set[str]] = {}
    for a in valid_actions:
        by_key.setdefault(_key(a), set()).add(a)
    keyed = {k: next(iter(v)) for k, v in by_key.items() if len(v) == 1}
    return lambda written: exact.get(written.lower(), keyed.get(_key(written)))


def parse_action(text: str, valid_actions: Sequence[str] | None = None) -> ParsedAction:
    """The last valid action in ``text``; ``valid=False`` with the last candidate (or None)."""
    found = _candidates(text, free_text=valid_actions is None)
    cands = [c for _, c in found]
    if valid_actions is None:
        return ParsedAction(cands[-1] if cands else None, bool(cands), tuple(cands))
    listed_as = _listed_as(valid_actions)
    # the written actions that are listed, in order; an ``ACTION=`` line that is listed as a whole
    # ("ACTION=go to shelf 1") goes after its first word
    listed = [(pos, 0, a) for pos, c in found if (a := listed_as(c)) is not None]
    listed += [(pos, 1, a) for pos, c in _matches(text, (_RLFT_LINE,)) if (a := listed_as(c)) is not None]
    if listed:
        return ParsedAction(max(listed)[2], True, tuple(cands))
    return ParsedAction(cands[-1] if cands else None, False, tuple(cands))
