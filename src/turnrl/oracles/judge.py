"""An LLM judge as preference oracle, through any causal LM directory or hub id.

The judge sees the task and two attempts, labelled A and B, and is asked which is better.
Instead of generating and parsing a verdict, the probability is read off the next-token
distribution right after the prompt (and the answer prefix ``Answer:``):

.. math::  p_{AB} = \\frac{e^{\\ell_A}}{e^{\\ell_A} + e^{\\ell_B}}

with :math:`\\ell_A, \\ell_B` the logits of the tokens ``A`` and ``B`` as the model would write
them after ``Answer:`` (the first token ``"Answer: A"`` adds to ``"Answer:"``). Each
query is asked in both orders and ``P(i, j) = (p_{ij} + 1 - p_{ji}) / 2``, which cancels a
judge's position bias (:func:`~turnrl.oracles.preference_matrices` does the averaging, as the
oracle is not symmetric by construction). :func:`parse_verdict` reads a generated verdict
for users who prefer sampling.

On the embedded tiny model (which never learned to judge) this runs end to end and returns
probabilities near 1/2; it is meant for instruction-tuned hub models on a GPU.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from turnrl.errors import TurnRLError
from turnrl.oracles import Oracle, Query, render_task, render_trajectory
from turnrl.tokenization import ChatFormat

JUDGE_SYSTEM = ("You are a strict judge of agents solving multi-turn tasks. You compare two attempts at the "
                "same task and say which attempt achieved the task better.")
JUDGE_USER = ("Task:\n{task}\n\nAttempt A:\n{a}\n\nAttempt B:\n{b}\n\n"
              "Which attempt is better? Answer with one letter, A or B.")
ANSWER_PREFIX = "Answer:"

_VERDICT = re.compile(r"\b([AB])\b")


def parse_verdict(text: str) -> float | None:
    """1.0 for a verdict of ``A``, 0.0 for ``B`` (the first standalone letter), else None."""
    m = _VERDICT.search(text)
    if m is None:
        return None
    return 1.0 if m.group(1) == "A" else 0.0


class JudgeOracle(Oracle):
    """The ``judge`` oracle (see the module docstring)."""

    name = "judge"
    symmetric = False

    def __init__(self, model: str | Path, *, batch_size: int = 16, max_tokens: int = 1024,
                 device: str | None = None, final_observation: bool = True):
        from turnrl.devices import default_device
        from turnrl.models.loading import load_model, load_tokenizer

        self.tok = load_tokenizer(str(model))
        self.model = load_model(str(model), device=default_device(device))
        self.model.eval()
        self.chat = ChatFormat(self.tok)
        self.batch_size = max(1, batch_size)
        self.max_tokens = max_tokens
        self.final_observation = final_observation
        self.answer_ids = _answer_prefix_ids(self.chat)
        self.token_a, self.token_b = self._letter_ids()
        self.part_budget = _part_budget(self.chat, self.answer_ids, max_tokens)

    def _letter_ids(self) -> tuple[int, int]:
        """The ids of the tokens ``A`` and ``B`` as the model would write them after ``Answer:``.

        Each is the first token that encoding ``"Answer: A"`` adds to the encoding of
        ``"Answer:"``: encoding ``" A"`` alone is no good on SentencePiece tokenizers (Llama-2,
        Mistral), which prepend a ``▁`` and split it into ``["▁", "▁A"]``, the same first token
        for both letters and every probability 1/2. An error if the letters are not two
        distinct tokens that decode to them."""
        a, b = self._letter_id("A"), self._letter_id("B")
        if a is None or b is None or a == b:
            raise TurnRLError(f"the judge's tokenizer does not write the verdict letters A and B as two distinct "
                              f"tokens after {ANSWER_PREFIX!r}; use another judge model")
        return a, b

    def _letter_id(self, letter: str) -> int | None:
        base = list(self.tok(ANSWER_PREFIX, add_special_tokens=False)["input_ids"])
        for sep in (" ", ""):
            ids = list(self.tok(ANSWER_PREFIX + sep + letter, add_special_tokens=False)["input_ids"])
            n = 0
            while n < min(len(base), len(ids)) and base[n] == ids[n]:
                n += 1
            if n < len(ids) and str(self.tok.decode([ids[n]], skip_special_tokens=False)).strip() == letter:
                return int(ids[n])
        return None

    def _clip(self, text: str, budget: int) -> str:
        ids = self.tok(text, add_special_tokens=False)["input_ids"]
        if len(ids) <= budget:
            return text
        return "..." + str(self.tok.decode(ids[-budget:]))

    def prompt(self, task_id: str, a: Any, b: Any) -> list[int]:
        """Token ids of the judge prompt for ``(a, b)``, ending right before the verdict: the task and
        each attempt are cut from the left to a third of what ``max_tokens`` leaves after the fixed
        prompt (give or take the few tokens a cut's re-tokenization moves)."""
        budget = self.part_budget
        return self._assemble(self._clip(render_task(a), budget),
                              self._clip(render_trajectory(a, final_observation=self.final_observation), budget),
                              self._clip(render_trajectory(b, final_observation=self.final_observation), budget))

    def _assemble(self, task: str, a: str, b: str) -> list[int]:
        return _assemble(self.chat, self.answer_ids, task, a, b)

    @torch.no_grad()
    def probs(self, queries: Sequence[Query]) -> list[float]:
        prompts = [self.prompt(t, a, b) for t, a, b in queries]
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        out = [0.5] * len(prompts)
        dev = next(self.model.parameters()).device
        pad = self.tok.pad_token_id or 0
        for s in range(0, len(order), self.batch_size):
            idx = order[s : s + self.batch_size]
            width = max(len(prompts[i]) for i in idx)
            ids = torch.full((len(idx), width), pad, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for r, i in enumerate(idx):
                ids[r, : len(prompts[i])] = torch.tensor(prompts[i])
                mask[r, : len(prompts[i])] = 1
            logits = self.model(input_ids=ids.to(dev), attention_mask=mask.to(dev)).logits
            last = mask.sum(1).to(dev) - 1
            final = logits[torch.arange(len(idx), device=dev), last].float()
            two = torch.stack([final[:, self.token_a], final[:, self.token_b]], dim=-1)
            p = torch.softmax(two, dim=-1)[:, 0].double().cpu().tolist()
            for i, v in zip(idx, p, strict=True):
                out[i] = float(v)
        return out


def _answer_prefix_ids(chat: ChatFormat) -> list[int]:
    """``Answer:`` where the reply starts: after the space the template writes before a reply, where the
    prompt leaves it to the reply (:attr:`ChatFormat.reply_lead`), as the whole text tokenizes."""
    return chat.tokenize_text(chat.reply_lead + ANSWER_PREFIX)


def _assemble(chat: ChatFormat, answer_ids: list[int], task: str, a: str, b: str) -> list[int]:
    user = JUDGE_USER.format(task=task, a=a, b=b)
    ids = chat.prompt_ids([{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}])
    return ids + answer_ids


def _part_budget(chat: ChatFormat, answer_ids: list[int], max_tokens: int) -> int:
    """The tokens each of the task and the two attempts may take: a third of what ``max_tokens``
    leaves after what every prompt holds besides them; an error when that is under 16."""
    fixed = len(_assemble(chat, answer_ids, "", "", ""))
    budget = (max_tokens - fixed) // 3
    if budget < 16:
        raise TurnRLError(f"judge max_tokens={max_tokens}: the judge's fixed prompt takes {fixed} tokens, leaving "
                          f"fewer than 16 for each of the task and the two attempts; use at least {fixed + 48}")
    return budget


def check_max_tokens(model: str | Path, max_tokens: int) -> None:
    """The error :class:`JudgeOracle` would raise for a ``max_tokens`` too small for its fixed prompt,
    from the judge's tokenizer alone: ``turnrl sppo`` checks it before any stage."""
    from turnrl.models.loading import load_tokenizer

    chat = ChatFormat(load_tokenizer(str(model)))
    _part_budget(chat, _answer_prefix_ids(chat), max_tokens)
