"""The embedded default model ``tiny`` (DESIGN 2.5).

A Llama-architecture causal LM of about two million parameters with a byte-level BPE
tokenizer trained with ``tokenizers`` on text from the built-in environments (their
instructions, observations and expert turns), a ChatML chat template, saved with
``save_pretrained`` and loaded through ``AutoModelForCausalLM`` / ``AutoTokenizer`` like
any hub model. The weights are randomly initialized: it is a model to train, not a model
that knows anything. Nothing is downloaded.
"""

from __future__ import annotations

import glob
import os
import random
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

from turnrl.errors import TurnRLError

#: ``tiny``'s cache folder, ``$TURNRL_HOME/<TINY_VERSION>``, built once per machine. Bump it whenever
#: the model a build gives changes (corpus, presets, template), or a machine that cached the earlier
#: model keeps loading it under the same name. The corpus is pinned by :data:`TINY_CORPUS_SHA256`
#: (a test fails when it changes). v2 (27 Nov 2026): the corpus changed between 22 and 24 Nov
#: without a bump, so a cache made before then held another model as ``tiny-v1``.
TINY_VERSION = "tiny-v2"
#: :func:`corpus_sha256` of the default corpus
TINY_CORPUS_SHA256 = "e948afb2d1bc55ec5ba19054f83410467112d5012287ad1e9ad0ea89c2217f05"

CHATML_TEMPLATE = (
    "{% for m in messages %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]

#: Size presets: (hidden, intermediate, layers, heads, vocab)
PRESETS: dict[str, tuple[int, int, int, int, int]] = {
    "tiny": (192, 512, 4, 4, 2048),
    "small": (256, 768, 6, 8, 4096),
}


#: The envs whose text trains the tiny tokenizer: the in-process built-ins, fixed so that the
#: tiny model is the same on every machine whatever optional extras (ScienceWorld, TextWorld)
#: are installed, and quick to build.
CORPUS_ENVS = ("tictactoe", "bandit", "contextual_bandit", "twenty_questions", "guess_my_city", "shop")


def env_corpus(episodes_per_split: int = 40, seed: int = 0, env_names: Sequence[str] = CORPUS_ENVS) -> Iterator[str]:
    """Text of the built-in environments: instructions, observations, expert turns."""
    from turnrl import envs
    from turnrl.envs import SPLITS

    rng = random.Random(seed)
    for name in env_names:
        try:
            env = envs.make(name)
        except TurnRLError:
            continue  # an env whose optional dependency is missing
        with env:
            for split in SPLITS:
                # an env whose splits changed after the tiny model was built lists the tasks of then
                ids = getattr(env, "corpus_task_ids", env.task_ids)(split)
                cap = getattr(env, "corpus_episodes_per_split", episodes_per_split)
                for k in range(min(episodes_per_split, cap, len(ids))):
                    obs, info = env.reset(seed=k, options={"task_id": ids[k]})
                    yield env.instruction
                    for _ in range(env.max_turns):
                        yield obs
                        step = env.expert(rng)
                        if rng.random() < 0.3 and info.get("valid_actions"):
                            step = type(step)(rng.choice(info["valid_actions"]), step.thought)
                        yield f"Thought: {step.thought}\nAction: {step.action}"
                        obs, _, term, trunc, info = env.step(step.action)
                        if term or trunc:
                            yield obs
                            break


def corpus_sha256(episodes_per_split: int = 40, seed: int = 0, env_names: Sequence[str] = CORPUS_ENVS) -> str:
    """SHA-256 of :func:`env_corpus` (texts separated by NUL): the tokenizer's training text."""
    import hashlib

    h = hashlib.sha256()
    for text in env_corpus(episodes_per_split, seed, env_names):
        h.update(text.encode())
        h.update(b"\0")
    return h.hexdigest()


def build_tiny(out: str | Path, *, preset: str = "tiny", seed: int = 0, episodes_per_split: int = 40,
               env_names: Sequence[str] = CORPUS_ENVS) -> Path:
    """Train the tokenizer on the text of ``env_names`` and write a randomly initialized model
    to ``out``. A tokenizer trained on one env's text only (the quickstart's tic-tac-toe
    specialist) spends its whole vocabulary there, which a model trained from scratch in
    minutes notices."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    if preset not in PRESETS:
        raise TurnRLError(f"unknown tiny preset '{preset}'; choose from: {', '.join(PRESETS)}")
    hidden, inter, layers, heads, vocab = PRESETS[preset]
    out = Path(out)
    _check_replaceable(out)
    unknown_envs = [n for n in env_names if n not in CORPUS_ENVS]
    if unknown_envs:
        raise TurnRLError(f"tiny corpus: unknown env {unknown_envs[0]!r}; choose from: {', '.join(CORPUS_ENVS)}")
    corpus = list(env_corpus(episodes_per_split, seed, env_names))
    corpus += [CHATML_TEMPLATE, "system user assistant Thought: Action: ACTION="]

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus, trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        additional_special_tokens=["<|endoftext|>", "<|im_start|>"],
        model_max_length=2048,
    )
    tok.chat_template = CHATML_TEMPLATE

    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.pad_token_id,
        initializer_range=0.02,
    )
    with torch.random.fork_rng(devices=[]):  # seeded here without moving the caller's random stream
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.generation_config = GenerationConfig(
        eos_token_id=[tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")],
        pad_token_id=tok.pad_token_id,
    )
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "TURNRL_TINY").write_text(f"{TINY_VERSION} preset={preset} seed={seed}\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    old = out.with_name(out.name + f".old-{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():  # renamed aside, then deleted: a kill while deleting leaves no half-deleted model at ``out``
        os.replace(out, old)
    os.replace(tmp, out)
    for aside in out.parent.glob(f"{glob.escape(out.name)}.old-*"):  # this one, and any a kill left behind
        shutil.rmtree(aside, ignore_errors=True)
    return out


def _check_replaceable(out: Path) -> None:
    """``out`` may be replaced by a new tiny model: absent, an empty folder, or an earlier tiny
    model (it holds the ``TURNRL_TINY`` marker). Anything else is a user's and is not deleted."""
    from turnrl.errors import check_output

    check_output(out, "tiny model folder", directory=True)
    if out.is_dir() and any(out.iterdir()) and not (out / "TURNRL_TINY").is_file():
        raise TurnRLError(f"{out}: not empty and not a tiny model; choose an empty or new folder "
                          "(an earlier tiny model there is replaced)")


def ensure_tiny() -> Path:
    """The cached default tiny model, built on first use."""
    from turnrl.models.loading import turnrl_home

    path = turnrl_home() / TINY_VERSION
    if not (path / "config.json").is_file():
        from filelock import FileLock

        path.parent.mkdir(parents=True, exist_ok=True)
        # processes that start at once (a study's workers, parallel test workers) build it once:
        # the others wait, then find it built
        with FileLock(str(path) + ".lock"):
            if not (path / "config.json").is_file():
                build_tiny(path)
    return path
