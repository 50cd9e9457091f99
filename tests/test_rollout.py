"""Rollout: token-exact round trip, lock-step batching, determinism, invalid actions, resume."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from turnrl.agent.parsing import ParsedAction, parse_action
from turnrl.agent.prompting import PromptConfig, agent_view
from turnrl.collect import run_policy
from turnrl.data.io import read_trajectories
from turnrl.data.schema import Message
from turnrl.rollout import ExpertPolicy, HFEngine, ModelPolicy, RandomPolicy, Reply, Request, SamplingConfig
from turnrl.tokenization import ChatFormat


class RecordingEngine(HFEngine):
    """An HF engine that remembers every prompt it was given."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.prompts: list[list[int]] = []

    def generate(self, prompts, sampling, seeds=None):
        self.prompts.extend(list(p) for p in prompts)
        return super().generate(prompts, sampling, seeds)


def model_policy(model, tokenizer, **sampling):
    chat = ChatFormat(tokenizer)
    engine = RecordingEngine(model, tokenizer, chat.stop_token_ids)
    return ModelPolicy(engine, chat, SamplingConfig(**sampling)), engine, chat


def test_engine_generates_under_its_autocast(tiny_model, tiny_tokenizer) -> None:
    """``autocast`` (a trainer's ``accelerator.autocast``) is entered around every
    ``generate``: under a bf16 one the first token's log-prob moves off float32's."""
    import contextlib

    import torch

    chat = ChatFormat(tiny_tokenizer)
    prompts = [chat.tokenize_text("X to move. Board: 0 1 2 3 4 5 6 7 8.")] * 2
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=3)
    entered = []

    @contextlib.contextmanager
    def bf16():
        entered.append(1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            yield

    plain = HFEngine(tiny_model, tiny_tokenizer, chat.stop_token_ids).generate(prompts, sampling)
    engine = HFEngine(tiny_model, tiny_tokenizer, chat.stop_token_ids, autocast=bf16)
    half = engine.generate(prompts, sampling)
    engine.generate(prompts[:1], sampling)
    assert len(entered) == 2
    first = [(a.logprobs[0], b.logprobs[0]) for a, b in zip(plain, half, strict=True)]
    assert all(x != y and x == pytest.approx(y, abs=0.2) for x, y in first), first


def test_engine_ignores_the_models_own_generation_settings(tiny_model, tiny_tokenizer) -> None:
    """A hub model's ``generation_config`` (a repetition penalty, n-gram blocking) does not change what
    the engine samples: greedy stays greedy."""
    import copy

    chat = ChatFormat(tiny_tokenizer)
    prompts = [chat.tokenize_text("X to move. Board: 0 1 2 3 4 5 6 7 8.")]
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=12)
    plain = HFEngine(tiny_model, tiny_tokenizer, chat.stop_token_ids).generate(prompts, sampling)
    saved = copy.deepcopy(tiny_model.generation_config)
    try:
        tiny_model.generation_config.repetition_penalty = 5.0
        tiny_model.generation_config.no_repeat_ngram_size = 1
        again = HFEngine(tiny_model, tiny_tokenizer, chat.stop_token_ids).generate(prompts, sampling)
        # a forced end of turn at the last step made a cut reply look finished; a sequence bias and a
        # minimum length reshaped the scores greedy and sampled decoding read
        tiny_model.generation_config = copy.deepcopy(saved)
        tiny_model.generation_config.forced_eos_token_id = chat.stop_token_ids[0]
        tiny_model.generation_config.min_length = 10_000
        tiny_model.generation_config.sequence_bias = {(plain[0].token_ids[0],): -100.0}
        forced = HFEngine(tiny_model, tiny_tokenizer, chat.stop_token_ids).generate(prompts, sampling)
    finally:
        tiny_model.generation_config = saved
    assert [g.token_ids for g in again] == [g.token_ids for g in plain]
    assert [(g.token_ids, g.finished) for g in forced] == [(g.token_ids, g.finished) for g in plain]


def test_a_model_saved_without_its_cache_samples_as_one_with_it(tiny_model, tiny_tokenizer) -> None:
    """A checkpoint saved with ``use_cache=false`` (gradient checkpointing elsewhere) reloads with
    ``generation_config.use_cache`` off: generate then reran the whole sequence on top of the shared
    prefix's cache every step, sampling other tokens with log-probs off by 0.05."""
    import copy

    chat = ChatFormat(tiny_tokenizer)
    a = chat.tokenize_text("X to move. Board: 0 1 2 3 4 5 6 7 8.")
    prompts = [a, a[:6], a]  # repeated prompts: the shared-prefix path
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=8)
    plain = HFEngine(tiny_model, tiny_tokenizer, chat.stop_token_ids).generate(prompts, sampling, seeds=[1, 2, 3])
    saved = copy.deepcopy(tiny_model.generation_config)
    try:
        tiny_model.generation_config.use_cache = False
        tiny_model.generation_config.guidance_scale = 3.0
        off = HFEngine(tiny_model, tiny_tokenizer, chat.stop_token_ids).generate(prompts, sampling, seeds=[1, 2, 3])
    finally:
        tiny_model.generation_config = saved
    assert [g.token_ids for g in off] == [g.token_ids for g in plain]
    assert [x for g in off for x in g.logprobs] == pytest.approx([x for g in plain for x in g.logprobs], abs=1e-5)


def test_a_prompt_longer_than_learned_positions_is_one_line(tiny_tokenizer) -> None:
    """A model with learned position embeddings (GPT-2's ``n_positions``) raised an IndexError deep in
    torch for a prompt and reply past its table."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from turnrl.errors import TurnRLError

    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tiny_tokenizer), n_positions=32, n_embd=16, n_layer=1,
                                       n_head=2)).eval()
    chat = ChatFormat(tiny_tokenizer)
    engine = HFEngine(model, tiny_tokenizer, chat.stop_token_ids)
    with pytest.raises(TurnRLError, match=r"^a prompt and its reply need 34 positions, and the model has 32"):
        engine.generate([list(range(5, 35))], SamplingConfig(temperature=0.0, max_new_tokens=4))
    assert len(engine.generate([list(range(5, 25))], SamplingConfig(temperature=0.0, max_new_tokens=4))) == 1



@pytest.mark.parametrize("max_new_tokens", [6, 40])
def test_rollout_tokenize_round_trip_is_token_exact(tiny_model, tiny_tokenizer, max_new_tokens: int) -> None:
    """The tokens trained on are the tokens sampled, and each turn's context is the prompt
    the model was given (also when generation ran out before its end-of-turn token)."""
    import torch

    torch.manual_seed(0)
    policy, engine, chat = model_policy(tiny_model, tiny_tokenizer, temperature=1.0, max_new_tokens=max_new_tokens)
    trajs = run_policy(policy, "tictactoe", split="train", episodes=6, num_envs=3, seed=0)
    prompts = {tuple(p) for p in engine.prompts}
    checked = 0
    for t in trajs:
        enc = chat.encode(t.messages)
        assert enc is not None and enc.reencoded_turns == 0
        turns = [m for m in t.messages if m.role == "assistant"]
        for k, msg in enumerate(turns):
            assert msg.token_ids is not None and msg.logprobs is not None
            assert len(msg.token_ids) == len(msg.logprobs)
            trained = [i for i, ti in zip(enc.input_ids, enc.turn_index, strict=True) if ti == k]
            # a reply cut at max_new_tokens trains its sampled ids alone: the template's marker after it is context
            assert msg.cut is (None if msg.token_ids[-1] in chat.stop_token_ids else True)
            assert trained == msg.token_ids
            start = enc.turn_index.index(k)
            assert tuple(enc.input_ids[:start]) in prompts
            checked += 1
    assert checked >= 6


def test_logprobs_match_a_training_forward(tiny_model, tiny_tokenizer) -> None:
    """Recorded log-probs equal the log-probs a packed training forward computes."""
    import torch

    from turnrl.train.forward import pack, token_logps

    torch.manual_seed(1)
    policy, _, chat = model_policy(tiny_model, tiny_tokenizer, temperature=1.0, max_new_tokens=24)
    trajs = run_policy(policy, "tictactoe", split="train", episodes=2, num_envs=2)
    encs = [chat.encode(t.messages) for t in trajs]
    recorded = []
    for t in trajs:
        for m in t.messages:
            if m.role == "assistant":
                assert m.token_ids is not None and m.logprobs is not None
                recorded.extend(m.logprobs)  # a cut reply's marker is context: only sampled tokens are trained
    with torch.no_grad():
        logps = token_logps(tiny_model.eval(), pack(encs)).tolist()  # type: ignore[arg-type]
    # pack() orders kept positions by sequence; recorded is in the same order
    pairs = [(a, b) for a, b in zip(recorded, logps, strict=True) if a is not None]
    assert max(abs(a - b) for a, b in pairs) < 1e-3


def test_one_generate_call_per_step(tiny_model, tiny_tokenizer) -> None:
    policy, engine, _ = model_policy(tiny_model, tiny_tokenizer, temperature=1.0, max_new_tokens=8)
    trajs = run_policy(policy, "tictactoe", split="train", episodes=8, num_envs=8)
    assert engine.calls == max(t.num_turns for t in trajs)
    assert len(engine.prompts) == sum(t.num_turns for t in trajs)


# transformers >= 5.24 takes the KV cache as ``cache`` and deprecates ``past_key_values``
# (removed from ``forward`` in 5.40): the engine must pass it under the name the model takes
@pytest.mark.filterwarnings("error:.*past_key_values.*:FutureWarning")
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_shared_prefill_samples_exactly_what_separate_prefills_do(tiny_model, tiny_tokenizer,
                                                                   temperature: float) -> None:
    """Copies of one prompt (k samples of a state, adjacent or not) are prefilled once; the
    samples, their log-probs and the random draws are those of prefilling every copy."""
    import torch

    chat = ChatFormat(tiny_tokenizer)
    long, short = chat.tokenize_text("X to move. Board: 0 1 2 3 4 5 6 7 8. " * 4), chat.tokenize_text("O won")
    prompts = [long] * 3 + [short] * 2 + [chat.tokenize_text("A")] + [long]  # 3 distinct prompts of 7
    sampling = SamplingConfig(temperature=temperature, max_new_tokens=10)
    outs = []
    for share in (True, False):
        engine = HFEngine(tiny_model, tiny_tokenizer, chat.stop_token_ids, share_prefix=share)
        torch.manual_seed(3)
        outs.append(engine.generate(prompts, sampling))
        assert engine.shared_rows == (4 if share else 0)
    for shared, alone in zip(*outs, strict=True):
        assert shared.token_ids == alone.token_ids and shared.finished == alone.finished
        assert shared.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    if temperature > 0:  # the copies of one prompt are sampled independently
        assert len({tuple(g.token_ids) for g in outs[0][:3]}) > 1


def _small_model(kind: str, vocab: int):
    """A small random model of another architecture than the tiny Llama: learned positions (GPT-2), every
    layer windowed (Mistral), a windowed layer then a full one (Gemma-3), a recurrent layer then a full one
    (Qwen3-Next), rotary frequencies that change past 32 positions (Llama, dynamic scaling)."""
    import torch
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        GPT2Config,
        GPT2LMHeadModel,
        MistralConfig,
        MistralForCausalLM,
    )

    torch.manual_seed(0)
    if kind == "gpt2":
        return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=256, n_embd=32, n_layer=2, n_head=2)).eval()
    size = {"vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2}
    if kind == "mistral":
        return MistralForCausalLM(MistralConfig(**size, sliding_window=8)).eval()
    if kind == "qwen3next":
        transformers = pytest.importorskip("transformers")
        if not hasattr(transformers, "Qwen3NextConfig"):  # from transformers 4.57
            pytest.skip("this transformers has no Qwen3-Next")
        from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

        return Qwen3NextForCausalLM(Qwen3NextConfig(
            **size, head_dim=8, layer_types=["linear_attention", "full_attention"], linear_num_value_heads=2,
            linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8, num_experts=2,
            num_experts_per_tok=1, moe_intermediate_size=16, shared_expert_intermediate_size=16)).eval()
    if kind == "dynamic-rope":
        from transformers import LlamaConfig, LlamaForCausalLM

        model = LlamaForCausalLM(LlamaConfig(**size, max_position_embeddings=32,
                                             rope_scaling={"rope_type": "dynamic", "factor": 4.0})).eval()
        with torch.no_grad():  # sharper logits, so that the rotation's change shows in the samples
            model.lm_head.weight.mul_(20)
        return model
    return Gemma3ForCausalLM(Gemma3TextConfig(**size, head_dim=8, sliding_window=8,
                                              layer_types=["sliding_attention", "full_attention"])).eval()


def _two_turns(engine: HFEngine, prompts: list[list[int]], sampling: SamplingConfig) -> tuple[list, list]:
    """Two calls in one :meth:`HFEngine.keep_turns` scope: then each first row's prompt and reply with an
    observation (one of them sent twice, as copies), a new prompt, and a prompt that shares only its first
    token with the first call's."""
    with engine.keep_turns():
        first = engine.generate(prompts, sampling, seeds=list(range(len(prompts))))
        nxt = [p + g.token_ids + [5, 6, 7][: 1 + i] for i, (p, g) in enumerate(zip(prompts, first, strict=True))]
        nxt = [nxt[0], [9, 8, 7, 6, 5], nxt[1], nxt[1], prompts[0][:1] + [11, 12], *nxt[2:]]
        second = engine.generate(nxt, sampling, seeds=list(range(10, 10 + len(nxt))))
    assert engine._kept is None  # freed on leaving the scope
    return first, second


@pytest.mark.parametrize("kind", ["tiny", "gpt2", "mistral", "gemma3", "qwen3next", "dynamic-rope"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_turn_reuses_the_last_calls_cache_and_samples_what_a_full_prefill_does(
        tiny_model, tiny_tokenizer, kind: str, temperature: float) -> None:
    """Inside ``keep_turns`` a prompt that extends a row of the last call (its prompt and sampled reply)
    takes that prefix's KV cache instead of running it again: the samples and log-probs are those of a
    full prefill, for continuing rows, copies, new prompts and partial matches alike. A model whose cache
    drops columns (a sliding window), holds a recurrent state (whose rows the shared prefill cannot select
    either) or rotates keys by the sequence's length keeps nothing and runs every prompt whole."""
    chat = ChatFormat(tiny_tokenizer)
    model = tiny_model if kind == "tiny" else _small_model(kind, len(tiny_tokenizer))
    base = chat.tokenize_text("X to move. Board: 0 1 2 3 4 5 6 7 8.")
    prompts = [base + [40 + i] * (3 * i) for i in range(3)]  # rows of different lengths: different padding
    sampling = SamplingConfig(temperature=temperature, max_new_tokens=12)
    outs = {}
    for reuse in (True, False):  # turnrl's engine against plain generate calls with transformers' own cache
        engine = HFEngine(model, tiny_tokenizer, chat.stop_token_ids, reuse_turns=reuse, preallocate=reuse)
        outs[reuse] = _two_turns(engine, prompts, sampling)
        if reuse:
            windowed = kind in ("mistral", "gemma3", "qwen3next", "dynamic-rope")
            assert (engine.reused_tokens == 0) == windowed
            # every prompt of the second call but its last token, up to the least reach over the rows
            assert windowed or engine.reused_tokens > len(prompts[0])
        else:
            assert engine.reused_tokens == 0
    for reused, full in zip(outs[True][1], outs[False][1], strict=True):
        assert reused.token_ids == full.token_ids and reused.finished == full.finished
        assert reused.logprobs == pytest.approx(full.logprobs, abs=1e-4)
    assert outs[True][0] == outs[False][0]  # the first call has nothing to reuse


def test_a_preallocated_cache_layer_holds_what_concatenation_does() -> None:
    """The engine's cache layer writes each update into a buffer with room to spare: its keys and values
    are those of transformers' concatenating layer through prefill, steps past the reserve (the buffer
    grows), a batch selection (copies go to a new buffer) and a crop (the next update overwrites)."""
    import torch
    from transformers.cache_utils import DynamicLayer

    from turnrl.rollout.engine import _growing_layer

    grow, plain = _growing_layer()(reserve=2), DynamicLayer()
    gen = torch.Generator().manual_seed(0)

    def both(n: int, batch: int = 3) -> None:
        k, v = torch.randn(batch, 2, n, 4, generator=gen), torch.randn(batch, 2, n, 4, generator=gen)
        got, want = grow.update(k, v), plain.update(k, v)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))

    both(5)  # prefill: a buffer of 5 + 2 columns
    first = grow.buffers
    both(1), both(1)
    assert grow.buffers is first  # written in place
    both(1)  # past the reserve: a larger buffer
    assert grow.buffers is not first and grow.get_seq_length() == 8
    room = grow.buffers[0].shape[-2]
    for layer in (grow, plain):
        layer.batch_select_indices(torch.tensor([2, 0, 2]))
    both(1)
    assert grow.buffers[0].shape[-2] == room  # copied into a buffer of the same room, not a doubled one
    for layer in (grow, plain):
        layer.crop(-3)
    both(2)
    assert grow.get_seq_length() == plain.get_seq_length() == 8
    assert torch.equal(grow.keys, plain.keys) and torch.equal(grow.values, plain.values)


def test_a_model_that_makes_its_own_cache_gets_none_from_the_engine(tiny_dir) -> None:
    """transformers 4.56 gives stateful models (Mamba, Jamba) a cache class of their own and refused the
    engine's DynamicCache: for a model that does not take the default cache the engine passes none, and
    prefills copies of a prompt one by one."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    class OwnCacheLlama(LlamaForCausalLM):
        @classmethod
        def _supports_default_dynamic_cache(cls) -> bool:
            return False

        def generate(self, *args, **kwargs):
            seen.append(sorted(k for k in kwargs if k in ("cache", "past_key_values")))
            return super().generate(*args, **kwargs)

    seen: list[list[str]] = []
    base = AutoModelForCausalLM.from_pretrained(tiny_dir)
    model = OwnCacheLlama(base.config)
    model.load_state_dict(base.state_dict())
    model.eval()
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    chat = ChatFormat(tok)
    prompt = chat.tokenize_text("X to move. Board: 0 1 2")
    engine = HFEngine(model, tok, chat.stop_token_ids)
    with engine.keep_turns():
        out = engine.generate([prompt, prompt], SamplingConfig(temperature=0.0, max_new_tokens=4))
        engine.generate([prompt + out[0].token_ids + [5]], SamplingConfig(temperature=0.0, max_new_tokens=4))
    assert seen == [[], []] and engine.shared_rows == 0 and engine.reused_tokens == 0
    assert out == HFEngine(base, tok, chat.stop_token_ids).generate([prompt, prompt], SamplingConfig(
        temperature=0.0, max_new_tokens=4))


def test_longest_prefix_by_hand() -> None:
    import numpy as np

    from turnrl.rollout.engine import _longest_prefix

    kept = np.array([[1, 2, 3, -1], [1, 2, 4, 5], [7, 8, -1, -1]])
    assert _longest_prefix(kept, [1, 2, 4, 5, 6]) == (1, 4)  # the whole row, and the prompt goes on
    assert _longest_prefix(kept, [1, 2, 3]) == (0, 3)
    assert _longest_prefix(kept, [1, 2, 9]) == (0, 2)  # a tie: the first row
    assert _longest_prefix(kept, [1]) == (0, 1)
    assert _longest_prefix(kept, [9, 9]) == (0, 0)
    assert _longest_prefix(kept, []) == (0, 0)
    assert _longest_prefix(kept[:, :0], [1, 2]) == (0, 0)


def test_outside_keep_turns_the_engine_keeps_nothing(tiny_model, tiny_tokenizer) -> None:
    chat = ChatFormat(tiny_tokenizer)
    engine = HFEngine(tiny_model, tiny_tokenizer, chat.stop_token_ids)
    prompt = chat.tokenize_text("X to move. Board: 0 1 2")
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=4)
    out = engine.generate([prompt], sampling)
    assert engine._kept is None
    engine.generate([prompt + out[0].token_ids + [5]], sampling)
    assert engine.reused_tokens == 0


def test_a_kept_cache_is_dropped_when_the_weights_or_adapters_change(tiny_tokenizer, tiny_dir) -> None:
    """PPO and ArCHer sample with the model they train: a cache kept across an optimizer step (or with
    a LoRA adapter switched off) would give the old weights' keys and values. The engine drops it when a
    parameter changes in place or an adapter is disabled, and samples what a fresh engine does."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    chat = ChatFormat(tiny_tokenizer)
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=6)
    prompt = chat.tokenize_text("X to move. Board: 0 1 2 3 4 5 6 7 8.")
    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    engine = HFEngine(model, tiny_tokenizer, chat.stop_token_ids)
    with engine.keep_turns():
        out = engine.generate([prompt], sampling)
        nxt = prompt + out[0].token_ids + [5, 6]
        with torch.no_grad():
            model.model.embed_tokens.weight.mul_(1.5)  # as an optimizer step does, in place
        after = engine.generate([nxt], sampling)
        assert engine.reused_tokens == 0
        engine.generate([nxt + after[0].token_ids + [7]], sampling)  # the same weights: reused
        assert engine.reused_tokens > len(nxt)
    assert after == HFEngine(model, tiny_tokenizer, chat.stop_token_ids).generate([nxt], sampling)

    lora = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_dir),
                          LoraConfig(r=4, lora_alpha=64, target_modules=["q_proj", "v_proj"],
                                     init_lora_weights=False)).eval()
    engine = HFEngine(lora, tiny_tokenizer, chat.stop_token_ids)
    with engine.keep_turns():
        out = engine.generate([prompt], sampling)
        nxt = prompt + out[0].token_ids + [5, 6]
        with lora.disable_adapter():
            plain = engine.generate([nxt], sampling)
            assert engine.reused_tokens == 0
            fresh = HFEngine(lora, tiny_tokenizer, chat.stop_token_ids).generate([nxt], sampling)
    assert plain[0].token_ids == fresh[0].token_ids
    assert plain[0].logprobs == pytest.approx(fresh[0].logprobs, abs=1e-5)


def test_a_rollout_reuses_each_turns_cache(tiny_model, tiny_tokenizer) -> None:
    """The sampler plays a rollout inside the engine's ``keep_turns`` (found through wrapping policies):
    each turn after the first runs only what its episode's last turn did not, and the episodes are those
    of full prefills."""
    from turnrl.bandits.aids import SelfConsistencyAid
    from turnrl.rollout.policies import keeping_turns

    chat = ChatFormat(tiny_tokenizer)
    trajs, reused = {}, {}
    for reuse in (True, False):
        engine = HFEngine(tiny_model, tiny_tokenizer, chat.stop_token_ids, reuse_turns=reuse)
        policy = ModelPolicy(engine, chat, SamplingConfig(temperature=1.0, max_new_tokens=16), seed=4)
        trajs[reuse] = run_policy(policy, "tictactoe", split="train", episodes=6, num_envs=4, seed=1)
        reused[reuse] = engine.reused_tokens
        with keeping_turns(SelfConsistencyAid(policy, k=2)):
            assert engine._keeping == 1
    assert reused[False] == 0
    # at least the earlier turns of every later turn (the system prompt and first board are hundreds)
    later = sum(t.num_turns - 1 for t in trajs[True])
    assert later > 0 and reused[True] > 100 * later
    for a, b in zip(trajs[True], trajs[False], strict=True):
        assert [m.token_ids for m in a.messages] == [m.token_ids for m in b.messages]
        assert ([lp for m in a.messages for lp in m.logprobs or []]
                == pytest.approx([lp for m in b.messages for lp in m.logprobs or []], abs=1e-4))


@pytest.mark.parametrize("impl", ["static", "sliding_window"])
def test_a_models_cache_implementation_does_not_break_the_shared_prefill(tiny_model, tiny_tokenizer,
                                                                        impl: str) -> None:
    """A generation config that names a cache implementation (Gemma's sliding window) would make
    generate refuse the shared prefill's cache: the engine neutralises it, as other settings."""
    chat = ChatFormat(tiny_tokenizer)
    prompt = chat.tokenize_text("X to move. Board: 0 1 2")
    before = getattr(tiny_model.generation_config, "cache_implementation", None)
    tiny_model.generation_config.cache_implementation = impl
    try:
        engine = HFEngine(tiny_model, tiny_tokenizer, chat.stop_token_ids)
        out = engine.generate([prompt, prompt], SamplingConfig(temperature=0.0, max_new_tokens=4))
    finally:
        tiny_model.generation_config.cache_implementation = before
    assert engine.shared_rows == 1 and out[0].token_ids == out[1].token_ids


def test_draw_tokens_by_hand() -> None:
    """Inverse-CDF sampling: the first token whose cumulative probability exceeds the uniform."""
    import math

    import torch

    from turnrl.rollout.engine import draw_tokens

    scores = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.2)]] * 4)
    u = torch.tensor([0.1, 0.6, 0.85, 0.4999])
    assert draw_tokens(scores, u, 1.0).tolist() == [0, 1, 2, 0]
    # temperature 2: p ~ sqrt(0.5, 0.3, 0.2) = (0.4155, 0.3218, 0.2628)
    assert draw_tokens(scores, torch.tensor([0.41, 0.42, 0.73, 0.74]), 2.0).tolist() == [0, 1, 1, 2]
    # top-p 0.7: the nucleus is {0, 1} (0.5 before token 1 < 0.7; 0.8 before token 2), renormalized (0.625, 0.375)
    assert draw_tokens(scores, torch.tensor([0.6, 0.62, 0.7, 0.9999]), 1.0, 0.7).tolist() == [0, 0, 1, 1]
    # top-p 0.5: token 0's mass reaches it alone
    assert draw_tokens(scores, torch.tensor([0.0, 0.5, 0.9, 0.9999]), 1.0, 0.5).tolist() == [0, 0, 0, 0]
    # a token of probability 0 (-inf) is never drawn, and logits with nothing finite or a NaN are an error
    masked = torch.tensor([[0.0, float("-inf"), 0.0]])
    assert [draw_tokens(masked, torch.tensor([u]), 1.0).item() for u in (0.0, 0.4999, 0.5, 0.9999)] == [0, 0, 2, 2]
    for bad in (torch.tensor([[0.0, float("nan"), 1.0]]), torch.full((1, 3), float("-inf"))):
        with pytest.raises(ValueError, match="without a finite value or with NaN"):
            draw_tokens(bad, torch.tensor([0.5]), 1.0)


def test_draw_tokens_samples_the_softmax() -> None:
    import torch

    from turnrl.rollout.engine import draw_tokens

    logits = torch.tensor([1.0, -0.5, 0.3, 2.0, -3.0])
    n = 40_000
    toks = draw_tokens(logits.expand(n, -1), torch.rand(n, generator=torch.Generator().manual_seed(0)), 1.5)
    freq = torch.bincount(toks, minlength=5).float() / n
    assert freq.tolist() == pytest.approx(torch.softmax(logits / 1.5, -1).tolist(), abs=0.01)


def test_a_sampled_row_depends_on_its_prompt_and_seed_only(tiny_model, tiny_tokenizer) -> None:
    """Each row draws from its own seeded stream: a prompt sampled alone, or in another batch (other
    rows, other padding, copies sharing a prefill), gives the same tokens under the same seed."""
    chat = ChatFormat(tiny_tokenizer)
    a, b = chat.tokenize_text("X to move. Board: 0 1 2 3 4 5 6 7 8."), chat.tokenize_text("O won")
    c = chat.tokenize_text("X to move. Board: X 1 2 3 O 5 6 7 8. " * 3)
    engine = HFEngine(tiny_model, tiny_tokenizer, chat.stop_token_ids)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=12)
    batch = engine.generate([a, a, b, c], sampling, seeds=[1, 2, 3, 4])
    alone = [engine.generate([p], sampling, seeds=[s])[0] for p, s in ((a, 1), (a, 2), (b, 3), (c, 4))]
    for x, y in zip(batch, alone, strict=True):
        assert x.token_ids == y.token_ids
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
    others = engine.generate([a] * 6, sampling, seeds=[11, 12, 13, 14, 15, 16])
    assert len({tuple(g.token_ids) for g in [batch[0], *others]}) > 1  # other seeds, other samples
    with pytest.raises(ValueError, match="2 seeds for 1 prompts"):
        engine.generate([a], sampling, seeds=[1, 2])


def test_copies_of_one_request_in_a_call_are_independent_samples(tiny_model, tiny_tokenizer) -> None:
    """CHAI's k candidates and self-consistency's votes send one request k times in one call: each copy
    gets its own seed (the first keeps the request's plain one), and so its own sample."""
    import random as rnd

    from turnrl.bandits.aids import SelfConsistencyAid
    from turnrl.envs import make

    policy, engine, _ = model_policy(tiny_model, tiny_tokenizer, temperature=1.0, max_new_tokens=12)
    policy.seed = 3
    env = make("tictactoe")
    obs, info = env.reset(seed=1)
    req = Request(env, [Message("user", obs)], 0, info.get("valid_actions"), rnd.Random(0), key="9/0")
    seeds = policy.seeds([req] * 5)
    assert seeds is not None and len(set(seeds)) == 5 and seeds[0] == policy.seeds([req])[0]
    assert len({r.content for r in policy.act([req] * 5)}) > 1
    SelfConsistencyAid(policy, k=4).act([req])
    assert len({tuple(p) for p in engine.prompts[-4:]}) == 1  # one prompt, four copies ...
    votes = policy.act([req] * 4)
    assert len({r.content for r in votes}) > 1  # ... four samples


@pytest.mark.parametrize("salt", [7, None])
def test_a_sampled_collection_resumes_with_the_episodes_of_an_uninterrupted_run(
        tmp_path, tiny_model, tiny_tokenizer, salt: int | None) -> None:
    """Episodes sampled at temperature 1 are keyed by (salt, episode, turn): a collection killed after
    some episodes and resumed, with another number of environments, writes the same episodes as one
    run. Without a salt, the policy draws it from torch's global generator (seeded before each run,
    as the pipelines seed each sampled stage)."""
    import torch

    def collect(out, episodes: int, num_envs: int) -> list:
        torch.manual_seed(5)
        chat = ChatFormat(tiny_tokenizer)
        policy = ModelPolicy(HFEngine(tiny_model, tiny_tokenizer, chat.stop_token_ids), chat,
                             SamplingConfig(temperature=1.0, max_new_tokens=12), seed=salt)
        return run_policy(policy, "tictactoe", episodes=episodes, num_envs=num_envs, seed=2, out=out)

    whole = collect(tmp_path / "whole.jsonl", 10, 4)
    collect(tmp_path / "part.jsonl", 4, 2)  # killed after 4 episodes ...
    resumed = collect(tmp_path / "part.jsonl", 10, 3)  # ... and resumed with 3 environments
    def replies(ts: list) -> list:  # every message but its log-probs, which the batch's padding moves in the last bits
        return [[{k: v for k, v in m.items() if k != "logprobs"} for m in t.to_dict()["messages"]] for t in ts]

    assert replies(resumed) == replies(whole)
    logps = [[lp for m in t.messages for lp in m.logprobs or []] for t in resumed]
    assert logps == [pytest.approx([lp for m in t.messages for lp in m.logprobs or []], abs=1e-4) for t in whole]
    assert len({json.dumps(r) for r in replies(whole)}) > 1


def test_scripted_collections_do_not_depend_on_num_envs() -> None:
    a = run_policy(ExpertPolicy(), "tictactoe", split="train", episodes=20, num_envs=1, seed=3,
                   env_opts={"opponent": "noisy"})
    b = run_policy(ExpertPolicy(), "tictactoe", split="train", episodes=20, num_envs=7, seed=3,
                   env_opts={"opponent": "noisy"})
    assert [t.to_dict() for t in a] == [t.to_dict() for t in b]
    c = run_policy(ExpertPolicy(), "tictactoe", split="train", episodes=20, num_envs=7, seed=4,
                   env_opts={"opponent": "noisy"})
    assert [t.to_dict() for t in a] != [t.to_dict() for t in c]


def test_expert_never_loses_and_random_is_worse() -> None:
    for opp in ("minimax", "random"):
        trajs = run_policy(ExpertPolicy(), "tictactoe", split="train", episodes=100, env_opts={"opponent": opp})
        assert min(t.return_ for t in trajs) >= 0
    rand = run_policy(RandomPolicy(), "tictactoe", split="train", episodes=100, env_opts={"opponent": "minimax"})
    assert min(t.return_ for t in rand) == -1


class Babbler:
    """Writes an invalid action on its first turn, then acts like the expert."""

    name = "babbler"

    def act(self, requests: Sequence[Request]) -> list[Reply]:
        return [Reply("Thought: hmm\nAction: 42") if r.turn == 0 else ExpertPolicy().act([r])[0] for r in requests]


@pytest.mark.parametrize("mode", ["random", "error", "end"])
def test_invalid_action_policies(mode: str) -> None:
    cfg = PromptConfig(invalid_action=mode, invalid_penalty=-0.5)
    (t,) = run_policy(Babbler(), "tictactoe", split="train", episodes=1, prompt=cfg)
    first = t.messages[2]
    assert first.role == "assistant" and first.valid is False and first.note
    assert t.rewards[0] == -0.5  # in every mode: a first move of tic-tac-toe ends no game, so only the penalty
    if mode == "random":
        assert first.action in [str(i) for i in range(9)] and "random" in first.note
        assert t.messages[3].content.startswith("Opponent played")
    elif mode == "error":
        assert t.messages[3].content.startswith("Invalid action")
        assert t.rewards[0] == -0.5
    else:
        assert t.num_turns == 1 and t.terminated and not t.success and t.return_ == -0.5


class ShopBabbler:
    """Clicks on something the shop's search page does not have (the page lists no actions)."""

    name = "shop-babbler"

    def act(self, requests: Sequence[Request]) -> list[Reply]:
        return [Reply("Thought: hmm\nAction: click[nothing]") for _ in requests]


@pytest.mark.parametrize("mode", ["random", "error", "end"])
def test_an_action_the_env_rejects_follows_the_invalid_action_rule(mode: str) -> None:
    """Where the env lists no actions, its ``info["invalid"]`` gets the same penalty, and under ``end``
    ends the episode, as a reply the parser rejects."""
    cfg = PromptConfig(invalid_action=mode, invalid_penalty=-0.5)
    (t,) = run_policy(ShopBabbler(), "shop", split="train", episodes=1, prompt=cfg)
    first = t.messages[2]
    assert first.valid is False and "the env's" in first.note and t.rewards[0] == -0.5
    if mode == "end":
        assert t.num_turns == 1 and t.terminated and t.return_ == -0.5
    else:
        assert t.num_turns > 1 and t.messages[3].content.startswith("Invalid action 'click[nothing]'")


class BanditBabbler:
    """Writes an unknown label on turn 1, else pulls the arm ``turn % 3``."""

    name = "bandit-babbler"

    def act(self, requests: Sequence[Request]) -> list[Reply]:
        return [Reply("ACTION=purple" if r.turn == 1 else f"ACTION={r.valid_actions[r.turn % 3]}") for r in requests]


@pytest.mark.parametrize("mode", ["random", "error"])
def test_bandit_trajectories_carry_the_expected_value_of_each_reward(mode: str) -> None:
    """meta["expected_rewards"][t] is the executed arm's mean + the same penalty as rewards[t]; envs
    without expected rewards (tic-tac-toe) leave the key out."""
    from turnrl import envs

    opts = {"arms": 3, "horizon": 5, "context": 0}
    cfg = PromptConfig(invalid_action=mode, invalid_penalty=-0.5)
    (t,) = run_policy(BanditBabbler(), "bandit", split="train", episodes=1, prompt=cfg, env_opts=opts)
    inst = envs.make("bandit", **opts).instance(t.task_id)
    turns = [m for m in t.messages if m.role == "assistant"]
    assert turns[1].valid is False and len(t.meta["expected_rewards"]) == len(t.rewards) == 5
    labels, pulls = envs.make("bandit", **opts).labels, 0
    for turn, (m, r, e) in enumerate(zip(turns, t.rewards, t.meta["expected_rewards"], strict=True)):
        penalty = -0.5 if turn == 1 else 0.0
        if turn == 1 and mode == "error":  # nothing pulled: the penalty alone
            assert r == e == penalty
            continue
        arm = labels.index(m.action)
        assert r == pytest.approx(inst.rewards[pulls, arm] + penalty)
        assert e == pytest.approx(inst.mu[pulls, arm] + penalty) and e != r
        pulls += 1
    assert pulls == (5 if mode == "random" else 4)
    (game,) = run_policy(ExpertPolicy(), "tictactoe", split="train", episodes=1)
    assert "expected_rewards" not in game.meta


def test_collection_resumes_without_redoing_episodes(tmp_path) -> None:
    out = tmp_path / "c.jsonl"
    run_policy(ExpertPolicy(), "tictactoe", episodes=5, out=out)
    lines = out.read_text().splitlines()
    # simulate a kill during the write of the 6th episode: a partial line at the end
    out.write_text("\n".join(lines) + "\n" + lines[0][:50])

    class Counting(ExpertPolicy):  # how many episodes the resumed run plays (their first turns)
        started = 0

        def act(self, requests):  # type: ignore[no-untyped-def]
            Counting.started += sum(r.turn == 0 for r in requests)
            return super().act(requests)

    full = run_policy(Counting(), "tictactoe", episodes=12, out=out)
    assert Counting.started == 7  # the 5 finished episodes are not played again (the file would hide it)
    again = sorted(read_trajectories(out), key=lambda t: t.id)  # written in the order episodes end
    assert [t.id for t in again] == [t.id for t in full]
    assert len({t.id for t in again}) == 12
    ref = run_policy(ExpertPolicy(), "tictactoe", episodes=12)
    assert [json.dumps(t.to_dict()) for t in ref] == [json.dumps(t.to_dict()) for t in again]


def test_finish_order_by_hand() -> None:
    """Two slots: a (3 turns) and b (1) start; b ends at step 1 and c takes its slot, ends at step 2;
    d takes it, and a and d end at step 3, in slot order."""
    from turnrl.rollout.sampler import finish_order

    assert finish_order(list("abcd"), {"a": 3, "b": 1, "c": 1, "d": 1}, 2) == list("bcad")
    assert finish_order(list("abc"), {"a": 2, "b": 2, "c": 2}, 8) == list("abc")


@pytest.mark.parametrize(("env", "num_envs"), [("shop", 4), ("twenty_questions", 3), ("tictactoe", 8)])
def test_a_resumed_collection_writes_the_file_of_an_uninterrupted_run(tmp_path, env: str, num_envs: int,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The file is written in the order episodes finish; a resumed collection's first part came from
    another schedule, so its file differed in order, and the pipelines that read it back (pairs, RFT and
    SFT data, SPPO's samples) then trained on batches in another order than an uninterrupted run's. It is
    now rewritten in the uninterrupted order: the same bytes."""
    from turnrl.rollout.policies import RandomPolicy

    whole, part = tmp_path / "whole.jsonl", tmp_path / "part.jsonl"
    plan = [t.id for t in run_policy(RandomPolicy(), env, episodes=30, num_envs=num_envs, out=whole)]
    written = 0

    def kill(n: int) -> None:
        nonlocal written
        written += n
        if written >= 7:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_policy(RandomPolicy(), env, episodes=30, num_envs=num_envs, out=part, progress=kill)
    assert 7 <= len(part.read_text().splitlines()) < 30
    if env == "tictactoe":  # the resume killed at its rewrite: every episode there, in the order of two runs
        import turnrl.collect as collect

        def killed(*_: object) -> None:
            raise KeyboardInterrupt

        monkeypatch.setattr(collect, "write_jsonl", killed)
        with pytest.raises(KeyboardInterrupt):
            run_policy(RandomPolicy(), env, episodes=30, num_envs=num_envs, out=part)
        assert len(part.read_text().splitlines()) == 30 and part.read_bytes() != whole.read_bytes()
        monkeypatch.undo()
    run_policy(RandomPolicy(), env, episodes=30, num_envs=num_envs, out=part)
    assert part.read_bytes() == whole.read_bytes()
    assert [json.loads(line)["id"] for line in whole.read_text().splitlines()] != plan  # finish order
    before = whole.stat().st_mtime_ns  # an uninterrupted file is in its order: never rewritten
    run_policy(RandomPolicy(), env, episodes=30, num_envs=num_envs, out=whole)
    assert whole.stat().st_mtime_ns == before


def test_collection_refuses_to_resume_another_split_or_other_sampling(tmp_path, tiny_model, tiny_tokenizer) -> None:
    """A file of train episodes is not resumed by a run of the seen split (its episodes would end up in
    SFT data), nor a model's greedy episodes by a run that samples at temperature 1."""
    from turnrl.errors import TurnRLError

    out = tmp_path / "c.jsonl"
    run_policy(ExpertPolicy(), "tictactoe", split="train", episodes=2, out=out)
    with pytest.raises(TurnRLError, match=r"holds episodes of the train split; this run plays seen"):
        run_policy(ExpertPolicy(), "tictactoe", split="seen", episodes=2, out=out)
    greedy, _, _ = model_policy(tiny_model, tiny_tokenizer, temperature=0.0, max_new_tokens=4)
    sampled, _, _ = model_policy(tiny_model, tiny_tokenizer, temperature=1.0, max_new_tokens=4)
    (first,) = run_policy(greedy, "tictactoe", episodes=1, out=tmp_path / "m.jsonl")
    assert first.meta["sampling"] == {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 4, "history": None}
    assert len(run_policy(greedy, "tictactoe", episodes=2, out=tmp_path / "m.jsonl")) == 2  # the same run: resumed
    with pytest.raises(TurnRLError, match=r"holds episodes sampled with other settings"):
        run_policy(sampled, "tictactoe", episodes=2, out=tmp_path / "m.jsonl")


def test_collection_refuses_to_resume_episodes_played_under_other_invalid_reply_rules(tmp_path) -> None:
    """What an invalid reply does changes an episode's rewards, so the rules are recorded with every
    episode and a resume under other rules is refused (it used to append, mixing both in one mean)."""
    from turnrl.agent.prompting import PromptConfig
    from turnrl.errors import TurnRLError

    out = tmp_path / "r.jsonl"
    lenient = PromptConfig(invalid_penalty=0.0)
    (t,) = run_policy(RandomPolicy(), "tictactoe", episodes=1, out=out, prompt=lenient)
    assert t.meta["invalid_rules"] == {"invalid_action": "random", "invalid_penalty": 0.0}
    assert len(run_policy(RandomPolicy(), "tictactoe", episodes=2, out=out, prompt=lenient)) == 2  # resumed
    for strict in (PromptConfig(invalid_penalty=-5.0), PromptConfig(invalid_action="end")):
        with pytest.raises(TurnRLError, match=r"r\.jsonl: holds episodes played with other invalid-reply rules"):
            run_policy(RandomPolicy(), "tictactoe", episodes=4, out=out, prompt=strict)
    assert len(out.read_text().splitlines()) == 2


def test_collection_refuses_to_resume_episodes_played_with_another_instruction_or_example(tmp_path) -> None:
    """``--instruction`` (and a config's ``example``) change the system message every turn is sampled
    under, so they are recorded with every episode and a resume under others is refused (it used to
    append, mixing both prompts in one file); the same prompt resumes, and a file written before the
    key existed still does."""
    import json

    from turnrl.agent.prompting import PromptConfig
    from turnrl.errors import TurnRLError

    out = tmp_path / "p.jsonl"
    mine = PromptConfig(instruction="Play X. Reply with Action: N.")
    (t,) = run_policy(RandomPolicy(), "tictactoe", episodes=1, out=out, prompt=mine)
    assert t.meta["prompt"] == {"instruction": "Play X. Reply with Action: N.", "example": None}
    assert t.messages[0].content == "Play X. Reply with Action: N."
    assert len(run_policy(RandomPolicy(), "tictactoe", episodes=2, out=out, prompt=mine)) == 2  # resumed
    for other, key in ((PromptConfig(), "instruction"), (PromptConfig(instruction="Play O."), "instruction"),
                       (mine.model_copy(update={"example": "Action: 4"}), "example")):
        with pytest.raises(TurnRLError, match=rf"p\.jsonl: holds episodes played with another {key} in the system"):
            run_policy(RandomPolicy(), "tictactoe", episodes=4, out=out, prompt=other)
    assert len(out.read_text().splitlines()) == 2
    old = tmp_path / "old.jsonl"  # written before episodes recorded their prompt: resumes as before
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    for row in rows:
        del row["meta"]["prompt"]
    old.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert len(run_policy(RandomPolicy(), "tictactoe", episodes=3, out=old)) == 3


def test_collection_refuses_to_resume_an_episode_of_another_expert_prefix(tmp_path) -> None:
    """An episode planned with another expert prefix (or replay) is another episode, though its id,
    task and seed are the same: a resume refuses it instead of reusing it."""
    from turnrl.errors import TurnRLError
    from turnrl.rollout.sampler import EpisodeSpec

    out = tmp_path / "p.jsonl"
    spec = EpisodeSpec(0, "train", "ttt-s0", 7, expert_turns=2)
    run_policy(RandomPolicy(), "tictactoe", specs=[spec], out=out)
    assert len(run_policy(RandomPolicy(), "tictactoe", specs=[spec], out=out)) == 1  # the same plan: resumed
    with pytest.raises(TurnRLError, match="was played with other settings"):
        run_policy(RandomPolicy(), "tictactoe", specs=[EpisodeSpec(0, "train", "ttt-s0", 7, expert_turns=1)], out=out)


def test_collection_resumes_episodes_that_record_the_earlier_form_of_the_fingerprint(tmp_path) -> None:
    """Episodes written before 29 Nov 2026 record the fingerprint's earlier form: a resume by the same
    weights accepts them (the form changed, the weights did not)."""
    import json as _json

    from turnrl.rollout import load_policy

    policy = load_policy("tiny", sampling=SamplingConfig(temperature=0.0, max_new_tokens=4))
    assert policy.legacy_fingerprint and policy.legacy_fingerprint != policy.fingerprint
    out = tmp_path / "m.jsonl"
    run_policy(policy, "tictactoe", episodes=1, out=out)
    record = _json.loads(out.read_text())
    record["meta"]["model_fingerprint"] = policy.legacy_fingerprint
    out.write_text(_json.dumps(record) + "\n")
    assert len(run_policy(policy, "tictactoe", episodes=2, out=out)) == 2


def test_collection_refuses_to_resume_episodes_of_other_weights(tmp_path, tiny_model, tiny_tokenizer) -> None:
    """A model retrained into the same folder is another policy: its episodes record the weights'
    fingerprint, and a resume by a model of another fingerprint is refused."""
    from turnrl.errors import TurnRLError
    from turnrl.models.loading import model_fingerprint, resolve_model_path
    from turnrl.rollout import load_policy

    loaded = load_policy("tiny", sampling=SamplingConfig(temperature=0.0, max_new_tokens=4))
    assert loaded.fingerprint == model_fingerprint(resolve_model_path("tiny"))
    first, _, _ = model_policy(tiny_model, tiny_tokenizer, temperature=0.0, max_new_tokens=4)
    first.fingerprint = "aaaa"
    (t,) = run_policy(first, "tictactoe", episodes=1, out=tmp_path / "m.jsonl")
    assert t.meta["model_fingerprint"] == "aaaa"
    assert len(run_policy(first, "tictactoe", episodes=2, out=tmp_path / "m.jsonl")) == 2  # the same weights
    retrained, _, _ = model_policy(tiny_model, tiny_tokenizer, temperature=0.0, max_new_tokens=4)
    retrained.fingerprint = "bbbb"
    with pytest.raises(TurnRLError, match=r"holds episodes of other weights at 'model' \(model fingerprint aaaa; "
                                          r"this model: bbbb\)"):
        run_policy(retrained, "tictactoe", episodes=3, out=tmp_path / "m.jsonl")


def test_parser_takes_the_last_valid_action() -> None:
    valid = ["1", "4", "7"]
    assert parse_action("Thought: x\nAction: 4", valid).action == "4"
    assert parse_action("Action: 9\nno wait\nAction: 7", valid).action == "7"
    assert parse_action("Action: 7\nAction: 9", valid).action == "7"
    assert parse_action("I choose ACTION=1", valid).action == "1"
    bad = parse_action("Thought: x\nAction: 9", valid)
    assert not bad.valid and bad.action == "9"
    assert parse_action("no action here", valid) == parse_action("", valid)
    assert parse_action("Action: search[red shoes]", None).action == "search[red shoes]"


def test_parser_reads_a_listed_action_as_the_envs_read_it() -> None:
    """The envs read a command without its end punctuation and with any spacing, so the parser does:
    a twenty-questions guess without its "?" is the guess, not an invalid reply that a random action
    replaces; two listed actions that differ only so are told apart as written."""
    questions = ["Is it an animal?", "Is it a dog?"]
    assert parse_action("Action: Is it a dog", questions) == ParsedAction("Is it a dog?", True, ("Is it a dog",))
    assert parse_action("Action: is it  a DOG ?", questions).action == "Is it a dog?"
    shop = ["click[Buy Now]", "click[< Prev]", "search"]
    assert parse_action("Action: click[ Buy Now ]", shop).action == "click[Buy Now]"
    assert parse_action("ACTION=click[ buy now ]", shop).action == "click[Buy Now]"
    assert not parse_action("Action: click[Buy]", shop).valid
    both = ["stop", "stop!"]
    assert parse_action("Action: stop!", both).action == "stop!" and parse_action("Action: Stop", both).action == "stop"
    assert not parse_action("Action: stop?", both).valid


def test_agent_view_windows_history() -> None:
    trajs = run_policy(ExpertPolicy(), "tictactoe", episodes=1)
    msgs = trajs[0].messages
    view, local = agent_view(msgs, 2, history=1)
    assert view[0].role == "system" and local == 1
    assert [m.role for m in view[1:]] == ["user", "assistant", "user", "assistant"]
    full, local = agent_view(msgs, 2, history=None)
    assert local == 2 and full == msgs[: 1 + 2 * 3]


def test_action_equals_form_keeps_bracketed_arguments_with_spaces() -> None:
    from turnrl.agent.parsing import parse_action

    assert parse_action("Thought: buy.\nACTION=click[Buy Now]", None).action == "click[Buy Now]"
    assert parse_action("ACTION=search[red shoes], done", None).action == "search[red shoes]"
    assert parse_action("ACTION=3.", None).action == "3"
    # where the env lists no actions (free-text commands) the rest of the line is the action, as after
    # "Action:"; where it lists them, one word, so that trailing words do not spoil a label
    assert parse_action("ACTION=go to shelf 1.\nbecause", None).action == "go to shelf 1"
    assert parse_action("Action: open door\nACTION=go to shelf 1", None).action == "go to shelf 1"
    assert parse_action("ACTION=blue, the best so far", ["blue", "red"]).candidates == ("blue",)
    # a bandit's history line quoted in a rationale is not an action: only the upper-case form acts
    quoted = parse_action("Step=2 Action=red Reward=0.10 was low.\nACTION=blue", ["blue", "red"])
    assert quoted.action == "blue" and quoted.candidates == ("blue",)
    assert parse_action("Step=2 Action=red Reward=0.10", ["blue", "red"]).action is None


def test_sampler_refuses_a_prompt_history_its_policy_does_not_show(tiny_model, tiny_tokenizer) -> None:
    """The policy builds each turn's context; a PromptConfig.history it does not use would be ignored."""
    from turnrl import envs
    from turnrl.errors import TurnRLError
    from turnrl.rollout import Sampler

    policy, _, _ = model_policy(tiny_model, tiny_tokenizer, temperature=0.0, max_new_tokens=4)
    with pytest.raises(TurnRLError, match=r"prompt.history=1 but the policy shows the agent history=None"):
        Sampler(lambda: envs.make("tictactoe"), policy, env_name="tictactoe", prompt=PromptConfig(history=1))
    policy.history = 1
    Sampler(lambda: envs.make("tictactoe"), policy, env_name="tictactoe", prompt=PromptConfig(history=1)).close()
    # a scripted policy has no context of its own to disagree with
    Sampler(lambda: envs.make("tictactoe"), ExpertPolicy(), env_name="tictactoe", prompt=PromptConfig(history=1)).close()


def test_replies_cut_by_max_new_tokens_are_marked(tmp_path, tiny_model, tiny_tokenizer) -> None:
    """A reply that ends without its end-of-turn token carries cut=True, through the file and into
    the evaluation record's cut_reply_rate; a finished one carries nothing."""
    from turnrl.evaluation import summarize

    policy, _, chat = model_policy(tiny_model, tiny_tokenizer, temperature=1.0, max_new_tokens=3)
    out = tmp_path / "c.jsonl"
    run_policy(policy, "tictactoe", episodes=6, out=out)
    trajs = read_trajectories(out)
    turns = [m for t in trajs for m in t.messages if m.role == "assistant"]
    stops = set(chat.stop_token_ids)
    for m in turns:
        assert m.token_ids
        ended = m.token_ids[-1] in stops
        assert m.cut is (None if ended else True)
    cut = sum(1 for m in turns if m.cut)
    assert cut > 0  # three tokens rarely close a turn of the untrained model
    record = summarize(trajs, policy="p", env="tictactoe", split="train")
    assert record["cut_reply_rate"] == round(cut / len(turns), 4)
    assert "cut" not in json.dumps([m.to_dict() for t in run_policy(ExpertPolicy(), "tictactoe", episodes=1)
                                    for m in t.messages])


def test_the_sampler_returns_specs_order_and_refuses_a_repeated_index() -> None:
    from turnrl import envs
    from turnrl.rollout.sampler import EpisodeSpec, Sampler

    specs = [EpisodeSpec(i, "train", f"ttt-s{i}", i) for i in (2, 0, 1)]
    sampler = Sampler(lambda: envs.make("tictactoe"), RandomPolicy(), env_name="tictactoe", num_envs=2)
    try:
        assert [t.task_id for t in sampler.run(specs)] == ["ttt-s2", "ttt-s0", "ttt-s1"]
        with pytest.raises(ValueError, match="episode index 0 appears twice"):
            sampler.run([EpisodeSpec(0, "train", "ttt-s0", 0), EpisodeSpec(0, "train", "ttt-s1", 1)])
    finally:
        sampler.close()


def test_an_action_in_backticks_before_a_period_is_read() -> None:
    assert parse_action("Thought: the centre.\nAction: `4`.", [str(i) for i in range(9)]).action == "4"


@pytest.mark.parametrize(("reply", "action"), [("Action: go to \"desk 1\".", 'go to "desk 1"'),
                                                ("Action: Is it called \"Big Ben\".", 'Is it called "Big Ben"'),
                                                ("Action: \"4\".", "4"),
                                                # without the period the closing quote was dropped
                                                ("Action: go to \"desk 1\"", 'go to "desk 1"'),
                                                ("Action: Is it called \"Big Ben\"", 'Is it called "Big Ben"'),
                                                ("Action: say 'hi'", "say 'hi'"),
                                                ("Action: \"4\"", "4"), ("Action: '4", "4"), ("Action: 4`.", "4")])
def test_quotes_inside_an_action_stay(reply: str, action: str) -> None:
    assert parse_action(reply).action == action


def test_random_invalid_rule_with_no_valid_action_to_draw_returns_an_error_observation_and_says_so() -> None:
    """An env listing no valid action now ([], not None) leaves ``random`` nothing to draw: the episode
    goes on with an error observation, and the note said "episode ended"."""
    from turnrl import envs
    from turnrl.rollout.sampler import EpisodeSpec, Sampler

    class NoMoves:
        def __init__(self) -> None:
            self.env = envs.make("tictactoe")
            self.name, self.instruction = self.env.name, self.env.instruction

        def reset(self, **kw):
            obs, info = self.env.reset(**kw)
            return obs, {**info, "valid_actions": []}

        def step(self, action: str):
            return self.env.step(action)

        def close(self) -> None:
            self.env.close()

        def __getattr__(self, name: str):  # everything else is the tic-tac-toe env's
            return getattr(self.env, name)

    class Four:
        name = "four"

        def act(self, requests):
            return [Reply("Thought: centre.\nAction: 4") for _ in requests]

    sampler = Sampler(NoMoves, Four(), env_name="tictactoe", prompt=PromptConfig(invalid_penalty=-1.0))
    try:
        (t,) = sampler.run([EpisodeSpec(0, "train", "ttt-s0", 0)])
    finally:
        sampler.close()
    first = next(m for m in t.messages if m.role == "assistant")
    assert first.note == "invalid action '4'; returned an error observation"
    assert t.rewards[0] == -1.0 and t.messages[3].content.startswith("Invalid action: '4'")


def test_error_observation_repeats_the_unchanged_state_so_an_agent_without_history_sees_the_board() -> None:
    """With ``invalid_action=error`` and ``history=0`` the agent sees only the last observation: the
    error observation used to say only "Invalid action ... Valid actions ...", without the board."""
    from turnrl.rollout.sampler import EpisodeSpec, Sampler

    seen: list[list[Message]] = []

    class OffBoardThenFirst:
        name = "off-board-then-first"

        def act(self, requests):
            out = []
            for r in requests:
                view, _ = agent_view(r.messages, r.turn, 0)
                seen.append(view)
                out.append(Reply("Action: 9" if r.turn == 0 else f"Action: {r.valid_actions[0]}"))
            return out

    from turnrl import envs

    sampler = Sampler(lambda: envs.make("tictactoe"), OffBoardThenFirst(), env_name="tictactoe",
                      prompt=PromptConfig(invalid_action="error", history=0))
    try:
        (t,) = sampler.run([EpisodeSpec(0, "train", "ttt-s0", 0)])
    finally:
        sampler.close()
    first_obs = t.messages[1].content
    assert "Board:" in first_obs
    error_obs = seen[1][-1].content  # what the agent saw at its second turn
    assert error_obs.startswith("Invalid action: '9'") and error_obs.endswith(first_obs)
    assert t.messages[2].note == "invalid action '9'; returned an error observation"
    assert all(m.role != "assistant" for m in seen[1])  # history 0: no earlier exchange in view


def test_an_action_line_listed_whole_is_read_after_action_equals() -> None:
    """``ACTION=`` takes one word where the env lists its actions; a listed action of several words
    ("go to shelf 1", a question) was rejected. Its whole line is now read when that is listed, and an
    invalid reply names the same candidate as before."""
    listed = ["go to shelf 1", "go to desk 2", "look", "Is it an animal?"]
    assert parse_action("Thought: the shelf.\nACTION=go to shelf 1", listed).action == "go to shelf 1"
    assert parse_action("ACTION=Is it an animal?", listed).action == "Is it an animal?"
    assert parse_action("ACTION=look, then decide", listed).action == "look"  # the word, as before
    assert parse_action("ACTION=go to shelf 1\nAction: go to desk 2", listed).action == "go to desk 2"  # the last
    bad = parse_action("ACTION=go to shelf 9", listed)
    assert (bad.action, bad.valid, bad.candidates) == ("go", False, ("go",))
    colors = ["blue", "green"]
    assert parse_action("ACTION=blue, the best so far", colors).action == "blue"
    assert parse_action("ACTION=blue\nACTION=green.", colors).action == "green"


def test_random_policy_refuses_an_env_of_free_text_commands(tmp_path) -> None:
    """Where an env lists no actions on two turns running (free-text twenty questions), "random" would
    play the expert's actions under its own name: refused before any episode (no file) and, for a
    sampler run directly, on the second such turn. The shop's search page alone is filled in."""
    from turnrl import envs
    from turnrl.errors import TurnRLError
    from turnrl.rollout import Sampler
    from turnrl.rollout.sampler import plan_episodes

    out = tmp_path / "r.jsonl"
    with pytest.raises(TurnRLError, match=r"^policy random: env twenty_questions lists no actions on two turns"):
        run_policy(RandomPolicy(), "twenty_questions", split="seen", episodes=2, env_opts={"free_text": True}, out=out)
    assert not out.exists()
    env = envs.make("twenty_questions", free_text=True)
    specs = plan_episodes(env, "seen", 2, 0)
    sampler = Sampler(lambda: envs.make("twenty_questions", free_text=True), RandomPolicy(),
                      env_name="twenty_questions", num_envs=2)
    try:
        with pytest.raises(TurnRLError, match="lists no actions on two turns running"):
            sampler.run(specs)
    finally:
        sampler.close()
    shop = run_policy(RandomPolicy(), "shop", split="seen", episodes=6)
    assert all(t.messages[2].content.endswith("]") for t in shop)  # its first turn: the expert's search
    listed = run_policy(RandomPolicy(), "twenty_questions", split="seen", episodes=6)
    assert sum(t.success for t in listed) < 6  # drawn from the list: not the expert, who always wins
