"""Chat-template-agnostic tokenization of multi-turn conversations (DESIGN 2.3).

A conversation is rendered with the model's own chat template once, with every assistant
content replaced by a unique sentinel string. The sentinels cut the rendered text into
pieces: template and observation text (never trained on) and the agent's turns. Each agent
turn's segment is its content plus the end-of-turn marker that follows it in the rendered
text, when that marker is a special token (``<|im_end|>``, ``<|eot_id|>``,
``<end_of_turn>``, ``</s>``...), because the model must learn to emit it to stop. A reply cut at
``max_new_tokens`` (``Message.cut``) did not write its marker: there the marker is context. Nothing
here knows any template's token layout: the template itself says where things are.

Pieces are tokenized one by one, and agent turns that carry the token ids sampled during
rollout are spliced in as they were sampled, so the tokens trained on are exactly the
tokens generated (no decode / re-encode drift). The rollout builds its prompts with the
same function, so the context a model saw when it acted is the context it is trained with.
Templates for which that cannot hold in one sequence of a whole conversation (Qwen3 renders
past turns differently once later turns exist) are detected when a ``ChatFormat`` is built,
and such a sequence is refused (:attr:`ChatFormat.prefix_consistent`).

Truncation policy (``max_length``): a sequence is cut only between agent turns. The
longest prefix of the conversation that ends right after an agent turn's end-of-turn
marker and fits in ``max_length`` is kept; later turns are dropped (and reported in
``Encoded.dropped_turns``). A conversation whose first agent turn does not fit yields
``None``. An action is never cut in half.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from turnrl.data.schema import Message
from turnrl.errors import TurnRLError

#: Used when a tokenizer has no chat template (a base model): plain role-prefixed text.
FALLBACK_CHAT_TEMPLATE = (
    "{{ bos_token or '' }}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
    "{% elif m['role'] == 'user' %}Observation: {{ m['content'] }}\n"
    "{% else %}Agent: {{ m['content'] }}{{ eos_token or '' }}\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Agent: {% endif %}"
)

_SENTINEL = "\ue000TURNRL{}\ue001"
_SYSTEM_SENTINEL = "\ue000TURNRLSYSTEM\ue001"


@dataclass
class Segment:
    """A piece of rendered text: ``turn`` is the agent turn it belongs to, -1 for context."""

    text: str
    turn: int = -1
    #: index into the messages of the assistant message this segment renders
    message_index: int = -1
    #: the end-of-turn marker text at the end of an agent segment ('' if none)
    eot: str = ""


@dataclass
class Encoded:
    """One tokenized sequence."""

    input_ids: list[int]
    action_mask: list[int]
    turn_index: list[int]
    #: number of agent turns trained on in this sequence
    num_turns: int = 0
    dropped_turns: int = 0
    #: agent turns whose stored token ids did not decode to their content and were re-encoded
    reencoded_turns: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.input_ids)


def _as_dicts(messages: Sequence[Message | dict]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        if isinstance(m, Message):
            out.append({"role": m.role, "content": m.content})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out


class ChatFormat:
    """Renders and tokenizes conversations for one tokenizer, whatever its chat template.

    ``stop_token_ids`` are the ids that end an agent turn at generation: the end-of-turn
    tokens found after assistant contents in the template's own output, plus the
    tokenizer's (and generation config's) EOS ids.
    """

    def __init__(self, tokenizer: Any, *, extra_stop_ids: Sequence[int] = ()):
        self.tokenizer = tokenizer
        self.template: str | None = None if getattr(tokenizer, "chat_template", None) else FALLBACK_CHAT_TEMPLATE
        self._specials = sorted(
            {t for t in _special_token_strings(tokenizer) if t},
            key=len,
            reverse=True,
        )
        self._fold_system = False
        #: added tokens that take the whitespace after them (Phi-3's ``<|end|>``): tokenizing the whole
        #: text, ``<|end|>\n<|user|>`` has no newline token, so a piece after one starts past its whitespace
        self._rstrip = {str(t.content) for t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values()
                        if getattr(t, "rstrip", False)}
        self._cache: dict[str, list[int]] = {}
        #: a special token after which text tokenizes as it does mid-sequence: set for tokenizers
        #: that add a prefix space to text that starts an input (SentencePiece's Metaspace in
        #: Llama-2, Mistral, TinyLlama, Phi-3), whose pieces would each start with a space otherwise
        self._anchor: str | None = None
        anchor = self._find_anchor()
        if anchor is not None and self._raw(anchor + "Action")[1:] != self._raw("Action"):
            self._anchor = anchor
        #: False for templates that render a past turn differently once later turns exist
        #: (Qwen3 keeps its empty ``<think>`` block on the last assistant turn only): a turn's
        #: sampling prompt is then not what precedes it in a longer training sequence, and
        #: :meth:`encode` refuses such a sequence instead of training on the wrong context.
        self.prefix_consistent = True
        self._probe_system()
        #: whether the spaces a template puts before an agent turn go with the turn (:meth:`_pieces`), and
        #: those spaces (:meth:`reply_text` takes them off a decoded reply)
        self._move_lead = self._anchor is not None
        self.reply_lead = ""
        self._probe_lead()
        eot = self._probe_end_of_turn()
        #: the end-of-turn marker that follows agent turns in rendered text ('' if none)
        self.eot_text = eot
        ids: list[int] = self.tokenize_text(eot.strip()) if eot.strip() else []
        for tid in _as_list(getattr(tokenizer, "eos_token_id", None)) + list(extra_stop_ids):
            if tid not in ids:
                ids.append(tid)
        self.stop_token_ids = ids
        self.prefix_consistent = self._probe_prefix()

    # ------------------------------------------------------------------ rendering
    def _apply(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        msgs = messages
        if self._fold_system:
            msgs = _fold_system(messages)
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
        if self.template is not None:
            kwargs["chat_template"] = self.template
        try:
            text = self.tokenizer.apply_chat_template(msgs, **kwargs)
        except Exception as e:  # templates raise their own errors (e.g. "system role not supported")
            if not self._fold_system and msgs and msgs[0]["role"] == "system":
                try:  # folded for good only if folding is what the template wanted
                    text = self.tokenizer.apply_chat_template(_fold_system(messages), **kwargs)
                except Exception:
                    raise TurnRLError(f"the chat template failed to render the conversation: {e}") from None
                self._fold_system = True
            else:
                raise TurnRLError(f"the chat template failed to render the conversation: {e}") from None
        if not isinstance(text, str):  # some versions return a list for batched input
            text = text[0]
        return str(text)

    def _probe_system(self) -> None:
        """Fold the system message into the first user message when the template leaves it
        out of the conversations rendered here (Mistral-7B-Instruct-v0.3 and Nemo write it
        only into the last user message when that message ends the conversation, which it
        never does once an assistant turn follows)."""
        system = {"role": "system", "content": _SYSTEM_SENTINEL}
        probes = [
            [system, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}],
            [system, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},
             {"role": "user", "content": "v"}, {"role": "assistant", "content": "b"}],
        ]
        for msgs in probes:
            if _SYSTEM_SENTINEL in self._apply(msgs, add_generation_prompt=False):
                continue
            if self._fold_system:
                raise TurnRLError("the chat template does not render the system message, even folded into the first "
                                  "user message; the task instruction would be lost")
            self._fold_system = True
            self._probe_system()
            return

    def _probe_lead(self) -> None:
        """Move the spaces a template puts before an agent turn into the turn where that is how the
        tokenizer reads the whole text: a prefix-space tokenizer (:attr:`_anchor`), or a byte-level
        one that writes a space into the next word's token (GPT-2's ``ĠThought``) under a template
        that writes ``"Assistant: "`` before the reply (DeepSeek-LLM, Vicuna, the fallback for base
        models). Tokenized with the context, those spaces would end every prompt in a lone space
        token, and the reply would start with ``Th``, ``ought``: not what the model read in
        pretraining, nor what the template's own tokenizing gives."""
        before = ""
        fits: list[tuple[bool, bool]] = []  # per probe reply: whether moved / kept give the whole text's ids
        for reply in ("Thought: I take the center.", "Action: 4", "I take 4", "a", "ACTION=4", "OK"):
            probe = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                     {"role": "assistant", "content": reply}]
            segs = self.segments(probe)
            k = next(i for i, seg in enumerate(segs) if seg.turn >= 0)
            before = segs[k - 1].text if k else ""
            if len(before) == len(before.rstrip(" ")) or self._anchor is not None:
                break
            whole = self._first_piece("".join(seg.text for seg in segs))
            got = []
            for move in (True, False):
                self._move_lead = move
                ids = [i for _, piece, _ in self._pieces(segs[: k + 1], probe) for i in piece]
                got.append(ids == whole[: len(ids)])
            fits.append((got[0], got[1]))
        if fits:  # the whole text's ids on every probe, where keeping the spaces misses one at least
            self._move_lead = all(m for m, _ in fits) and not all(k for _, k in fits)
        if self._move_lead and len(before) != len(before.rstrip(" ")):
            self.reply_lead = before[len(before.rstrip(" ")):]

    def _probe_prefix(self) -> bool:
        """Whether each turn's sampling prompt (:meth:`prompt_ids`) is what precedes that turn
        in the rendering of a longer conversation, on a small probe conversation."""
        probe: list[dict[str, Any]] = [{"role": "system", "content": "s"}]
        for k in range(3):
            probe += [{"role": "user", "content": f"u{k}"}, {"role": "assistant", "content": f"a{k}"}]
        return self._context_mismatch(probe) is None

    def _context_mismatch(self, messages: Sequence[Message | dict], turns: set[int] | None = None,
                          max_length: int | None = None) -> int | None:
        """The first agent turn (among ``turns``, default all; only turns that end within
        ``max_length``) whose context in the training sequence of ``messages`` is not its
        sampling prompt, or None."""
        ids: list[int] = []
        for seg, piece, _ in self._pieces(self.segments(messages), messages):
            if (seg.turn >= 0 and (turns is None or seg.turn in turns)
                    and (max_length is None or len(ids) + len(piece) <= max_length)
                    and ids != self.prompt_ids(list(messages[: seg.message_index]))):
                return seg.turn
            ids.extend(piece)
        return None

    def _probe_end_of_turn(self) -> str:
        probe = [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": _SENTINEL.format(0)},
            {"role": "user", "content": "v"},
            {"role": "assistant", "content": _SENTINEL.format(1)},
        ]
        text = self._apply(probe, add_generation_prompt=False)
        s0 = _SENTINEL.format(0)
        if s0 not in text:
            raise TurnRLError("the chat template does not render assistant contents verbatim; cannot locate agent turns")
        return self._eot_after(text[text.index(s0) + len(s0) :])

    def _eot_after(self, rest: str) -> str:
        """The whitespace + special token right after an assistant content, or ''.

        The whitespace may be a newline: DeepSeek-Coder closes a turn with ``"\\n<|EOT|>"``."""
        stripped = rest.lstrip()
        lead = rest[: len(rest) - len(stripped)]
        for tok in self._specials:
            if stripped.startswith(tok):
                return lead + tok
        return ""

    def segments(self, messages: Sequence[Message | dict], *, add_generation_prompt: bool = False) -> list[Segment]:
        """Cut the rendered conversation into context and agent-turn segments."""
        dicts = _as_dicts(messages)
        sentinel_msgs = []
        assistant_indices: list[int] = []
        for i, m in enumerate(dicts):
            if m["role"] == "assistant":
                sentinel_msgs.append({"role": "assistant", "content": _SENTINEL.format(len(assistant_indices))})
                assistant_indices.append(i)
            else:
                sentinel_msgs.append(m)
        text = self._apply(sentinel_msgs, add_generation_prompt)
        segs: list[Segment] = []
        pos = 0
        for turn, msg_i in enumerate(assistant_indices):
            s = _SENTINEL.format(turn)
            at = text.find(s, pos)
            if at < 0:
                raise TurnRLError(f"the chat template dropped assistant turn {turn}; cannot locate agent turns")
            if at > pos:
                segs.append(Segment(text[pos:at]))
            eot = self._eot_after(text[at + len(s) :])
            segs.append(Segment(dicts[msg_i]["content"] + eot, turn=turn, message_index=msg_i, eot=eot))
            pos = at + len(s) + len(eot)
        if pos < len(text):
            segs.append(Segment(text[pos:]))
        return segs

    # ----------------------------------------------------------------- tokenizing
    def tokenize_text(self, text: str) -> list[int]:
        """Token ids of a piece of text that follows other text in a sequence, special-token
        strings included, nothing added (with a prefix-space tokenizer, no space is added either:
        the piece is tokenized after an anchor token, which is then dropped)."""
        cached = self._cache.get(text)
        if cached is None:
            cached = self._raw(self._anchor + text)[1:] if self._anchor is not None else self._raw(text)
            if len(self._cache) < 100_000:
                self._cache[text] = cached
        return list(cached)

    def _first_piece(self, text: str) -> list[int]:
        """Token ids of the piece that starts an input."""
        if self._anchor is None:
            return self.tokenize_text(text)
        key = "\x00first\x00" + text  # NULs: no piece of text is this key
        if key not in self._cache and len(self._cache) < 100_000:
            self._cache[key] = self._raw(text)
        return list(self._cache.get(key) or self._raw(text))

    def _raw(self, text: str) -> list[int]:
        """Token ids of ``text`` tokenized on its own (as the start of an input)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _find_anchor(self) -> str | None:
        """A special token that is one id and leaves the text after it as it is (no stripping)."""
        for tok in self._specials:
            ids = self._raw(tok)
            if len(ids) == 1:
                spaced, bare = self._raw(tok + " a"), self._raw(tok + "a")
                if spaced[:1] == ids and bare[:1] == ids and spaced != bare:  # the space after it is kept
                    return tok
        return None

    def reply_text(self, token_ids: Sequence[int], finished: bool) -> str:
        """The content of a sampled reply: its tokens less the stop token that ended it (where it
        ``finished``), decoded, less the spaces the template writes before an agent turn
        (:attr:`reply_lead`), which the model wrote itself where they go with the turn."""
        body = list(token_ids)
        if finished and body and body[-1] in self.stop_token_ids:
            body = body[:-1]
        text = str(self.tokenizer.decode(body, skip_special_tokens=False))
        return text[len(self.reply_lead):] if self.reply_lead and text.startswith(self.reply_lead) else text

    def agent_ids(self, content: str, eot: str, sampled: Sequence[int] | None, *,
                  lead: str = "") -> tuple[list[int], bool]:
        """Token ids of an agent turn: the sampled ids when they are faithful, else the
        re-encoded text (after ``lead``, the template's spaces before the turn, which the tokenizer
        writes into the turn's first token: :meth:`_probe_lead`). Returns ``(ids, reencoded)``."""
        eot_ids = self.tokenize_text(eot) if eot else []
        texts = (content, lead + content) if lead else (content,)
        if sampled:
            ids = list(sampled)
            body = ids
            if eot_ids and ids[-len(eot_ids) :] == eot_ids:
                body = ids[: -len(eot_ids)]
                # A marker that starts with whitespace (Llama-2's " </s>") is sampled whole, and the
                # rollout's content (the text before the stop token) then ends with that whitespace.
                if self.tokenizer.decode(ids[:-1], skip_special_tokens=False) in texts:
                    return ids, False
            elif body and body[-1] in self.stop_token_ids:
                body = body[:-1]
                # the marker's last token sampled without the marker's leading whitespace (Llama-2's
                # "</s>" for " </s>"): trained as sampled, not with a whitespace token it never sampled
                if eot_ids and ids[-1] == eot_ids[-1] and self.tokenizer.decode(body, skip_special_tokens=False) in texts:
                    return ids, False
            if self.tokenizer.decode(body, skip_special_tokens=False) in texts:
                return body + eot_ids, False
            return self.tokenize_text(lead + content) + eot_ids, True
        return self.tokenize_text(lead + content) + eot_ids, False

    def encode(
        self,
        messages: Sequence[Message | dict],
        *,
        trainable_turns: Sequence[int] | None = None,
        turn_offset: int = 0,
        add_generation_prompt: bool = False,
        max_length: int | None = None,
    ) -> Encoded | None:
        """Tokenize a conversation into ``input_ids``, ``action_mask`` and ``turn_index``.

        ``trainable_turns`` (indices among this conversation's assistant messages) limits
        which agent turns carry the mask (default all); ``turn_offset`` is added to the
        recorded turn index (for windowed views of longer trajectories). Returns None when
        even the first trainable turn does not fit in ``max_length``.

        With a template that is not :attr:`prefix_consistent`, a trainable turn whose context
        here differs from its sampling prompt (a turn followed by later turns, under Qwen3's
        template) is a :class:`TurnRLError`: train one sequence per turn (``history``).
        """
        segs = self.segments(messages, add_generation_prompt=add_generation_prompt)
        trainable = None if trainable_turns is None else set(trainable_turns)
        if not self.prefix_consistent:
            bad = self._context_mismatch(messages, trainable, max_length)
            if bad is not None:
                raise TurnRLError(
                    f"the chat template renders a past assistant turn differently once later turns exist (as "
                    f"Qwen3's does with its <think> block), so agent turn {bad + turn_offset}'s context in this "
                    f"sequence is not the prompt it was sampled from; train one sequence per turn (set `history`)")
        ids: list[int] = []
        mask: list[int] = []
        turns: list[int] = []
        cut = 0  # length of the longest prefix that ends after a trainable agent turn
        kept_turns = 0
        total_trainable = 0
        reencoded = 0
        for seg, piece, re in self._pieces(segs, messages):
            m, t = 0, -1
            if seg.turn >= 0:
                reencoded += int(re)
                train = trainable is None or seg.turn in trainable
                m, t = (1, seg.turn + turn_offset) if train else (0, -1)
                total_trainable += int(train)
            ids.extend(piece)
            mask.extend([m] * len(piece))
            turns.extend([t] * len(piece))
            if seg.turn >= 0 and m and (max_length is None or len(ids) <= max_length):
                cut = len(ids)
                kept_turns += 1
        if max_length is not None and len(ids) > max_length:
            if kept_turns == 0:
                return None
            ids, mask, turns = ids[:cut], mask[:cut], turns[:cut]
        return Encoded(
            input_ids=ids,
            action_mask=mask,
            turn_index=turns,
            num_turns=kept_turns if max_length is not None else total_trainable,
            dropped_turns=total_trainable - kept_turns if max_length is not None else 0,
            reencoded_turns=reencoded,
        )

    def prompt_ids(self, messages: Sequence[Message | dict]) -> list[int]:
        """The token ids a model is given to write the next agent turn.

        They are what precedes that turn in the training sequence of the conversation once
        the turn is added: the conversation is rendered with an open assistant turn and cut
        at its sentinel. So prompts match training for every template, also for templates
        whose generation prompt differs from their rendering of past turns (Llama-2 puts a
        space before assistant contents) or that have no generation prompt at all.
        """
        open_turn = [*messages, {"role": "assistant", "content": ""}]
        segs = self.segments(open_turn)
        last = max(i for i, s in enumerate(segs) if s.turn >= 0)
        ids: list[int] = []
        for seg, piece, _ in self._pieces(segs[: last + 1], open_turn):  # with the open turn, which is left
            if seg is not segs[last]:  # out: the pieces before it are cut as in the longer conversation
                ids.extend(piece)
        return ids

    def _pieces(
        self, segs: Sequence[Segment], messages: Sequence[Message | dict]
    ) -> Iterator[tuple[Segment, list[int], bool]]:
        """Token ids of each segment: ``(segment, ids, re-encoded?)``."""
        lead, after = "", ""  # after: the text that ends the piece before (an agent turn's marker)
        for k, seg in enumerate(segs):
            if seg.turn < 0:
                text, lead = seg.text, ""
                if after.strip() in self._rstrip:
                    text = text.lstrip()
                if self._move_lead and k + 1 < len(segs) and segs[k + 1].turn >= 0:
                    # the tokenizer writes the space before a word into the word's token ("▁Thought",
                    # "ĠThought"): the spaces a template puts before an agent turn go with the turn, so
                    # the prompt ends where the model's reply starts, as in the template's own tokenizing
                    stripped = text.rstrip(" ")
                    text, lead = stripped, text[len(stripped):]
                # the input's first piece is tokenized as an input starts (with a prefix space, if any)
                yield seg, self._first_piece(text) if k == 0 else self.tokenize_text(text), False
                after = seg.text
                continue
            msg = messages[seg.message_index]
            sampled = msg.token_ids if isinstance(msg, Message) else msg.get("token_ids")
            content = msg.content if isinstance(msg, Message) else msg["content"]
            piece, reencoded = self.agent_ids(content, seg.eot, sampled, lead=lead)
            lead = ""
            cut = msg.cut if isinstance(msg, Message) else msg.get("cut")
            eot_ids = self.tokenize_text(seg.eot) if cut and seg.eot else []
            if eot_ids and piece[-len(eot_ids):] == eot_ids:
                # a reply cut at max_new_tokens never wrote its end-of-turn marker: the template's
                # marker closes the turn in every later context, as context, not as the agent's action
                yield seg, piece[: -len(eot_ids)], reencoded
                yield Segment(seg.eot), eot_ids, False
            else:
                yield seg, piece, reencoded
            after = seg.eot


def _fold_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Merge a leading system message into the first user message (for templates that
    reject the system role)."""
    if not messages or messages[0]["role"] != "system":
        return messages
    system, rest = messages[0]["content"], list(messages[1:])
    for i, m in enumerate(rest):
        if m["role"] == "user":
            rest[i] = {"role": "user", "content": f"{system}\n\n{m['content']}"}
            return rest
    return [{"role": "user", "content": system}, *rest]


def _special_token_strings(tokenizer: Any) -> list[str]:
    out = set(getattr(tokenizer, "all_special_tokens", []) or [])
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    for tok in decoder.values():
        if getattr(tok, "special", False):
            out.add(str(tok.content) if hasattr(tok, "content") else str(tok))
    return [t for t in out if isinstance(t, str)]


def _as_list(x: Any) -> list[int]:
    if x is None:
        return []
    if isinstance(x, int):
        return [x]
    return [int(v) for v in x]
