"""What the agent is shown.

The conversation an agent acts in is a ``system`` message (the env's task instruction,
or a configured one, plus an optional in-context example) followed by alternating
``user`` observations and ``assistant`` turns. ``history`` limits how many earlier
exchanges the agent sees (None: all). Trajectories always store the full conversation;
:func:`agent_view` rebuilds, for any turn, exactly the context the agent had then, for the
sampler and for tokenization alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from turnrl.config import Config, Range
from turnrl.data.schema import Message


class PromptConfig(Config):
    """How prompts are built and invalid actions handled."""

    #: replaces the env's task instruction when set
    instruction: str | None = None
    #: an in-context example appended to the system message
    example: str | None = None
    #: earlier (observation, action) exchanges kept in the context; None keeps all
    history: int | None = None
    #: what happens when the agent writes no valid action: ``random`` executes a random
    #: valid action (plus ``invalid_penalty``), ``error`` returns an error observation and
    #: does not step the env, ``end`` ends the episode (plus ``invalid_penalty``). Where the env
    #: lists no actions (a shop's search page) and rejects one itself (``info["invalid"]``), the
    #: penalty applies too and ``end`` ends the episode; otherwise the env's own observation follows
    invalid_action: Literal["random", "error", "end"] = "random"
    invalid_penalty: float = 0.0

    value_ranges = {"history": Range(0)}


def system_message(instruction: str, cfg: PromptConfig) -> Message:
    text = cfg.instruction or instruction
    if cfg.example:
        text = f"{text}\n\nExample:\n{cfg.example}"
    return Message("system", text)


def format_turn(thought: str, action: str) -> str:
    """The ReAct form of one agent turn."""
    return f"Thought: {thought}\nAction: {action}"


def opens_with_acknowledgement(messages: Sequence[Message]) -> bool:
    """ETO's convention (:mod:`turnrl.data.eto`): the first user message is the task instruction and
    the first reply is "OK" (no action), which turnrl's sampler did not play (it records every
    reply's ``valid``), before the first observation. Never so for a trajectory turnrl played."""
    body = [m for m in messages if m.role != "system"]
    return (len(body) > 2 and body[0].role == "user" and body[1].role == "assistant" and body[1].action is None
            and body[1].valid is None and body[1].content.strip().rstrip(".!").lower() in ("ok", "okay")
            and any(m.role == "user" for m in body[2:]))


def agent_view(messages: Sequence[Message], turn: int, history: int | None) -> tuple[list[Message], int]:
    """The context for agent turn ``turn`` (0-based) and that turn's index in it.

    Returns ``(view, local_turn)``: the system message(s), the last ``history`` exchanges
    before turn ``turn``, the observation it answers, and (when it exists) the turn itself.
    An imported ETO trajectory's instruction exchange (:func:`opens_with_acknowledgement`) is
    kept with the system messages: the task instruction every later turn of it was written with.
    """
    head = [m for m in messages if m.role == "system"]
    body = [m for m in messages if m.role != "system"]
    # positions of the assistant messages in body
    a_pos = [i for i, m in enumerate(body) if m.role == "assistant"]
    end = a_pos[turn] + 1 if turn < len(a_pos) else len(body)
    pinned = int(history is not None and opens_with_acknowledgement(messages))  # turns kept with the head
    if history is None or turn <= pinned:
        return head + body[:end], turn
    first_kept = max(pinned, turn - history)
    # start right after the assistant turn before the first kept one
    start = a_pos[first_kept - 1] + 1 if first_kept > 0 else 0
    kept = body[: a_pos[0] + 1] if pinned else []  # ETO's instruction and its "OK"
    return head + kept + body[start:end], pinned + turn - first_kept
