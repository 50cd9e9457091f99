"""Policies the sampler can run: scripted ones (expert, random) and models.

All go through the same sampler path: given the active episodes of a step, a policy
returns each one's reply text (and, for models, the sampled token ids and log-probs).
"""

from __future__ import annotations

import difflib
import os
import random
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from turnrl.agent.prompting import agent_view, format_turn
from turnrl.data.schema import Message
from turnrl.envs.base import TextEnv
from turnrl.errors import TurnRLError
from turnrl.rollout.engine import Engine, SamplingConfig
from turnrl.tokenization import ChatFormat


@dataclass
class Request:
    """One active episode asking for its next turn."""

    env: TextEnv
    messages: list[Message]
    turn: int
    valid_actions: list[str] | None
    rng: random.Random
    #: the episode's key, unique within a collection (the sampler's ``"<seed>/<index>"`` of its
    #: planned episode): a model policy keys the turn's random stream by it (:meth:`ModelPolicy.seeds`)
    key: str | None = None


@dataclass
class Reply:
    content: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    meta: dict[str, Any] = field(default_factory=dict)


class Policy(Protocol):
    name: str

    def act(self, requests: Sequence[Request]) -> list[Reply]: ...


class ExpertPolicy:
    """The env's expert, with its templated rationale (thought cloning)."""

    name = "expert"

    def act(self, requests: Sequence[Request]) -> list[Reply]:
        out = []
        for r in requests:
            step = r.env.expert(r.rng)
            out.append(Reply(format_turn(step.thought, step.action)))
        return out


class RandomPolicy:
    """A uniformly random valid action where the env lists them. On a state that lists none (the
    shop's search page, whose next page lists clicks) it plays the expert's action; an env that
    lists none on two turns running takes free-text commands, and there a "random" policy would
    be the expert under another name: it is refused (:meth:`check_env` before any episode, and
    :meth:`act` on the second such turn of an episode)."""

    name = "random"

    def __init__(self) -> None:
        self._unlisted: dict[Any, int] = {}  # an episode's last turn without a list

    @staticmethod
    def _refuse(env: Any) -> TurnRLError:
        name = getattr(env, "name", None) or type(env).__name__
        return TurnRLError(f"policy random: env {name} lists no actions on two turns running (free-text commands): "
                           "there is nothing to draw from, and filling in the expert's actions would report the "
                           "expert as random; use a model or the expert")

    def check_env(self, env: Any, seed: int = 0) -> None:
        """One line before any episode where ``env`` lists no actions on its first two turns."""
        env.reset(seed=seed)
        if env.valid_actions() is not None:
            return
        _, _, terminated, truncated, _ = env.step(env.expert(random.Random(seed)).action)
        if not (terminated or truncated) and env.valid_actions() is None:
            raise self._refuse(env)

    def act(self, requests: Sequence[Request]) -> list[Reply]:
        out = []
        for r in requests:
            episode = r.key if r.key is not None else id(r.env)
            if r.valid_actions:
                self._unlisted.pop(episode, None)
                action = r.rng.choice(r.valid_actions)
            else:
                if self._unlisted.get(episode) == r.turn - 1:
                    raise self._refuse(r.env)
                self._unlisted[episode] = r.turn
                action = r.env.expert(r.rng).action  # no action list here: nothing else to draw from
            out.append(Reply(format_turn(f"I pick {action} at random.", action)))
        return out


class ModelPolicy:
    """A language model: every active episode's prompt goes into one engine call."""

    def __init__(self, engine: Engine, chat: ChatFormat, sampling: SamplingConfig, *, history: int | None = None,
                 name: str = "model", fingerprint: str | None = None, seed: int | None = None,
                 legacy_fingerprint: str | None = None):
        self.engine = engine
        self.chat = chat
        self.sampling = sampling
        self.history = history
        self.name = name
        #: the model's :func:`~turnrl.models.loading.model_fingerprint` (episodes record it, so that a
        #: resumed collection can tell a retrained model saved at the same path); None: unknown
        self.fingerprint = fingerprint
        #: the same weights' fingerprint as computed before 29 Nov 2026 (a resume accepts episodes
        #: that record it)
        self.legacy_fingerprint = legacy_fingerprint
        #: the salt of every sampling seed (:meth:`seeds`); None: drawn from torch's global generator
        #: at the first sampled turn, so a pipeline that seeds torch before a stage gets the same salt
        #: when the stage is rerun to resume
        self.seed = seed

    def prompts(self, requests: Sequence[Request]) -> list[list[int]]:
        out = []
        for r in requests:
            view, _ = agent_view(r.messages, r.turn, self.history)
            out.append(self.chat.prompt_ids(view))
        return out

    def seeds(self, requests: Sequence[Request]) -> list[int] | None:
        """Each request's sampling seed, a hash of (salt, episode key, turn): an episode's sample
        does not depend on which other episodes share its steps, or on whether its collection was
        resumed. A request repeated in one call (CHAI's k candidates, self-consistency's votes) is
        k samples: its j-th copy adds j to the hash (the first keeps the plain one). None when
        decoding greedily. A request without a key gets a seed from torch's global generator."""
        if self.sampling.temperature <= 0:
            return None
        import torch

        if self.seed is None:
            self.seed = int(torch.randint(0, 2**62, ()).item())
        copies: dict[tuple[str, int], int] = {}
        out = []
        for r in requests:
            if r.key is None:
                out.append(int(torch.randint(0, 2**62, ()).item()))
                continue
            j = copies[(r.key, r.turn)] = copies.get((r.key, r.turn), -1) + 1
            out.append(random.Random(f"{self.seed}/{r.key}/{r.turn}" + (f"/{j}" if j else "")).randrange(2**62))
        return out

    def act(self, requests: Sequence[Request]) -> list[Reply]:
        gens = self.engine.generate(self.prompts(requests), self.sampling, seeds=self.seeds(requests))
        return [Reply(self.chat.reply_text(g.token_ids, g.finished), list(g.token_ids), list(g.logprobs),
                      {"finished": g.finished}) for g in gens]


def keeping_turns(policy: Any) -> AbstractContextManager[Any]:
    """The :meth:`~turnrl.rollout.engine.HFEngine.keep_turns` scope of the engine ``policy`` samples with,
    found through the wrappers' ``inner`` (the bandit aids, epsilon-greedy) or ``base`` (CHAI); a scope
    that does nothing for a policy without one (scripted, vLLM: its own prefix cache)."""
    for _ in range(16):  # wrappers of wrappers, never a cycle
        keep = getattr(getattr(policy, "engine", None), "keep_turns", None)
        if keep is not None:
            return keep()
        policy = getattr(policy, "inner", None) or getattr(policy, "base", None)
        if policy is None:
            break
    return nullcontext()


def load_policy(spec: str, *, sampling: SamplingConfig | None = None, history: int | None = None,
                device: str | None = None, engine: str = "hf", engine_opts: dict[str, Any] | None = None) -> Policy:
    """``expert``, ``random``, a scripted bandit algorithm (``ucb``, ``ucb:c=2``, ``linucb``,
    ``thompson``, ``epsilon-greedy:eps=0.1``, ``greedy``), or a model directory / hub id / ``tiny``.

    Models generate with ``engine``: ``hf`` (transformers, any device) or ``vllm`` (GPU; the
    optional extra; ``engine_opts`` go to :class:`~turnrl.rollout.vllm_engine.VLLMEngine`).
    An unknown ``engine`` is an error whatever the policy (a scripted one uses none)."""
    from turnrl.rollout.vllm_engine import ENGINES

    if engine not in ENGINES:
        from turnrl.errors import unknown

        raise unknown("engine", engine, ENGINES)
    if spec == "expert":
        return ExpertPolicy()
    if spec == "random":
        return RandomPolicy()
    from turnrl.bandits.policies import load_scripted  # ucb, ucb:c=2, linucb, thompson, greedy, ...

    scripted = load_scripted(spec)
    if scripted is not None:
        return scripted
    _check_not_a_typo(spec)
    from turnrl.devices import default_device
    from turnrl.models.loading import load_model, load_tokenizer, model_fingerprints, resolve_model_path
    from turnrl.rollout.engine import HFEngine
    from turnrl.rollout.vllm_engine import VLLMEngine, import_vllm

    if engine == "vllm":
        if device is not None:  # only the hf engine reads it: vLLM would run on its own default GPU
            raise TurnRLError(f"device={device} is read by engine=hf only; engine=vllm places the model itself "
                              "(choose its GPUs with CUDA_VISIBLE_DEVICES)")
        import_vllm()  # a missing install fails before anything loads
    path = resolve_model_path(spec)
    # each fingerprint is taken once the model is loaded: a hub id is fingerprinted by its snapshot in
    # the hub cache, which loading it the first time makes (before, by its name: a resume then differed)
    if engine == "vllm":
        tok = load_tokenizer(spec)
        chat = ChatFormat(tok, extra_stop_ids=_path_eos(path))
        vengine = VLLMEngine(path, chat.stop_token_ids, **(engine_opts or {}))
        fingerprint, legacy = model_fingerprints(path)
        # the engine's seed salts the sampler's keyed seeds (without one, torch's global generator does)
        return ModelPolicy(vengine, chat, sampling or SamplingConfig(), history=history, name=spec,
                           fingerprint=fingerprint, seed=(engine_opts or {}).get("seed"), legacy_fingerprint=legacy)
    tok = load_tokenizer(spec)
    model = load_model(spec, device=default_device(device))
    fingerprint, legacy = model_fingerprints(path)
    chat = ChatFormat(tok, extra_stop_ids=_gen_eos(model))
    hf = HFEngine(model, tok, chat.stop_token_ids)
    return ModelPolicy(hf, chat, sampling or SamplingConfig(), history=history, name=spec, fingerprint=fingerprint,
                       legacy_fingerprint=legacy)


def _check_not_a_typo(spec: str) -> None:
    """A spec that is no path, no ``org/name`` id and close to a built-in policy name is a typo
    (``exper``): one line now instead of a minute of hub retries. Other plain names (``gpt2``)
    stay hub ids."""
    from turnrl.bandits.algorithms import ALGORITHMS, ALIASES
    from turnrl.models.loading import TINY

    if "/" in spec or os.sep in spec or Path(spec).expanduser().exists():
        return
    names = ["expert", "random", TINY, *ALGORITHMS, *ALIASES]
    head = spec.split(":", 1)[0].strip().lower()
    close = difflib.get_close_matches(head, names, n=1, cutoff=0.75)  # strict: "gpt2" stays a hub id
    if close and head not in names:
        raise TurnRLError(f"unknown policy '{spec}' (did you mean '{close[0]}'?); built-in: expert, random, "
                          f"{TINY}, {', '.join(sorted(set(ALGORITHMS) - {'random'}))}; or a model folder or hub id")


def _gen_eos(model: Any) -> list[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)


def training_chat(model_name: str, tok: Any) -> ChatFormat:
    """The chat format of a trainer that reads sampled replies of ``model_name``: its stop ids are
    the sampler's (the tokenizer's and the generation config's EOS ids), so a reply that stopped on
    any of them keeps its sampled ids instead of being re-encoded from its text."""
    from turnrl.models.loading import resolve_model_path

    return ChatFormat(tok, extra_stop_ids=_path_eos(resolve_model_path(model_name)))


def _path_eos(path: str) -> list[int]:
    """The generation config's end-of-sequence ids of a model directory / hub id (no weights loaded);
    without a ``generation_config.json``, the one transformers makes from ``config.json`` when it
    loads the model (the sampler's, :func:`_gen_eos`)."""
    from transformers import AutoConfig, GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(path).eos_token_id
    except (OSError, ValueError):
        try:
            eos = GenerationConfig.from_model_config(AutoConfig.from_pretrained(path)).eos_token_id
        except (OSError, ValueError):
            return []
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)
