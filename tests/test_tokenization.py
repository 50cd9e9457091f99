"""Template-agnostic masks: the masked tokens are exactly the assistant contents plus their
end-of-turn marker, on five template styles, with no per-template arithmetic in the code."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from turnrl.agent.prompting import agent_view
from turnrl.data.schema import Message
from turnrl.errors import TurnRLError
from turnrl.tokenization import ChatFormat

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}"
    "{% set sys = '<<SYS>>\\n' + messages[0]['content'] + '\\n<</SYS>>\\n\\n' %}{% set msgs = messages[1:] %}"
    "{% else %}{% set sys = '' %}{% set msgs = messages %}{% endif %}"
    "{% for m in msgs %}{% if m['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + (sys if loop.first else '') + m['content'] + ' [/INST]' }}"
    "{% else %}{{ ' ' + m['content'] + ' ' + eos_token }}{% endif %}{% endfor %}"
)
GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for m in messages %}{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "<start_of_turn>{{ role }}\n{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
MISTRAL = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ raise_exception('Conversation roles must alternate user/assistant') }}"
    "{% elif m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)
# DeepSeek-Coder: a newline between the content and the end-of-turn token
DEEPSEEK_CODER = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}\n"
    "{% elif m['role'] == 'user' %}{{ '### Instruction:\\n' + m['content'] + '\\n' }}"
    "{% else %}{{ '### Response:\\n' + m['content'] + '\\n<|EOT|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '### Response:' }}{% endif %}"
)

# Mistral-7B-Instruct-v0.3 / Nemo (no tools): the system message is written into the LAST user
# message only, and only when that message ends the conversation
MISTRAL_V03 = (
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}"
    "{{ bos_token }}{%- for message in loop_messages %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('After the optional system message, conversation roles must alternate') }}{%- endif %}"
    "{%- if message['role'] == 'user' %}{%- if loop.last and system_message is defined %}"
    "{{ '[INST] ' + system_message + '\\n\\n' + message['content'] + '[/INST]' }}"
    "{%- else %}{{ '[INST] ' + message['content'] + '[/INST]' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' %}{{ ' ' + message['content'] + eos_token }}"
    "{%- else %}{{ raise_exception('Only user and assistant roles are supported') }}{%- endif %}{%- endfor %}"
)
# Qwen3 (no tools), as published: the last assistant turn after the last user query gets an empty
# <think> block, which earlier turns lose once later turns exist
QWEN3 = """{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""

# name -> (template, special tokens to add, eos, bos, expected end-of-turn marker)
STYLES = {
    "chatml": (CHATML, ["<|im_start|>", "<|im_end|>"], "<|im_end|>", None, "<|im_end|>"),
    "llama3": (LLAMA3, ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
               "<|eot_id|>", "<|begin_of_text|>", "<|eot_id|>"),
    "llama2": (LLAMA2, ["<s>", "</s>"], "</s>", "<s>", "</s>"),
    "gemma": (GEMMA, ["<bos>", "<start_of_turn>", "<end_of_turn>", "<eos>"], "<eos>", "<bos>", "<end_of_turn>"),
    "mistral": (MISTRAL, ["<s>", "</s>"], "</s>", "<s>", "</s>"),
    "deepseek_coder": (DEEPSEEK_CODER, ["<|begin_of_sentence|>", "<|EOT|>"], "<|EOT|>", "<|begin_of_sentence|>",
                       "<|EOT|>"),
    "none": (None, ["</s>"], "</s>", None, "</s>"),
}
# templates that do not render a past turn as its sampling prompt had it (not in STYLES)
OTHER_STYLES = {
    "mistral_v03": (MISTRAL_V03, ["<s>", "</s>"], "</s>", "<s>", "</s>"),
    "qwen3": (QWEN3, ["<|im_start|>", "<|im_end|>", "<think>", "</think>"], "<|im_end|>", None, "<|im_end|>"),
}

MESSAGES = [
    Message("system", "You play tic-tac-toe. Answer with Thought and Action."),
    Message("user", "Board:\n0 1 2\n3 4 5\n6 7 8\nYou play X."),
    Message("assistant", "Thought: The center is strongest.\nAction: 4"),
    # an observation that contains the next action's text must not confuse the locator
    Message("user", "Opponent played 0.\nBoard:\nO 1 2\n3 X 5\n6 7 8\nThought: Action: 8"),
    Message("assistant", "Thought: Action: 8"),
    Message("user", "Opponent played 2."),
    Message("assistant", "Thought: I must block the opponent's line at 1.\nAction: 1"),
]


def styled(tokenizer, style: str):
    template, specials, eos, bos, _ = {**STYLES, **OTHER_STYLES}[style]
    tok = copy.deepcopy(tokenizer)
    tok.add_special_tokens({"additional_special_tokens": specials})
    tok.eos_token = eos
    tok.bos_token = bos
    tok.chat_template = template
    return tok


@pytest.mark.parametrize("style", sorted(STYLES))
def test_masked_tokens_are_assistant_contents_plus_end_of_turn(tiny_tokenizer, style: str) -> None:
    tok = styled(tiny_tokenizer, style)
    chat = ChatFormat(tok)
    expected_eot = STYLES[style][4]
    assert chat.eot_text.strip() == expected_eot
    enc = chat.encode(MESSAGES)
    assert enc is not None
    assistants = [m.content for m in MESSAGES if m.role == "assistant"]
    assert enc.num_turns == len(assistants)
    for turn, content in enumerate(assistants):
        ids = [i for i, t in zip(enc.input_ids, enc.turn_index, strict=True) if t == turn]
        text = tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        # with the space the template writes before a reply, where the tokenizer reads it with the reply
        assert text == chat.reply_lead + content + chat.eot_text, (style, turn, text)
        assert text.endswith(expected_eot)
    # mask and turn index agree; nothing outside assistant turns is trained on
    assert [m == 1 for m in enc.action_mask] == [t >= 0 for t in enc.turn_index]
    # the stop tokens at generation include the end-of-turn token
    assert tok.convert_tokens_to_ids(expected_eot) in chat.stop_token_ids
    # everything decodes back to the template's own rendering (nothing dropped or added)
    full = tok.decode(enc.input_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    # the template rendered whole (the system message folded where the template needs it), not
    # through segments(), which encode itself uses
    rendered = chat._apply([{"role": m.role, "content": m.content} for m in MESSAGES], add_generation_prompt=False)
    assert full == rendered
    for m in MESSAGES:
        assert m.content.strip() in full


@pytest.mark.parametrize("style", sorted(STYLES))
def test_prompt_is_a_prefix_of_the_training_sequence(tiny_tokenizer, style: str) -> None:
    """What the model saw before turn t is exactly what precedes turn t in training."""
    tok = styled(tiny_tokenizer, style)
    chat = ChatFormat(tok)
    assert chat.prefix_consistent
    enc = chat.encode(MESSAGES)
    assert enc is not None
    a_idx = [i for i, m in enumerate(MESSAGES) if m.role == "assistant"]
    for turn, i in enumerate(a_idx):
        prompt = chat.prompt_ids(MESSAGES[:i])
        start = enc.turn_index.index(turn)
        assert enc.input_ids[:start] == prompt, (style, turn)


def test_truncation_never_cuts_an_action(tiny_tokenizer) -> None:
    chat = ChatFormat(tiny_tokenizer)
    full = chat.encode(MESSAGES)
    assert full is not None
    ends = [max(i for i, t in enumerate(full.turn_index) if t == k) + 1 for k in range(3)]
    # a budget that ends in the middle of turn 2 keeps turns 0 and 1 whole
    cut = chat.encode(MESSAGES, max_length=ends[2] - 2)
    assert cut is not None and cut.num_turns == 2 and cut.dropped_turns == 1
    assert len(cut) == ends[1] and cut.input_ids == full.input_ids[: ends[1]]
    # a budget smaller than the first turn: no example at all
    assert chat.encode(MESSAGES, max_length=ends[0] - 1) is None


def test_trainable_turns_and_offset(tiny_tokenizer) -> None:
    chat = ChatFormat(tiny_tokenizer)
    enc = chat.encode(MESSAGES, trainable_turns=[1], turn_offset=5)
    assert enc is not None
    assert set(enc.turn_index) == {-1, 6}
    text = tiny_tokenizer.decode([i for i, m in zip(enc.input_ids, enc.action_mask, strict=True) if m])
    assert text == "Thought: Action: 8" + chat.eot_text


def test_sampled_token_ids_are_used_verbatim(tiny_tokenizer) -> None:
    """Sampled ids that decode to the content are trained on as sampled, even when a plain
    re-encoding of the text would tokenize differently."""
    chat = ChatFormat(tiny_tokenizer)
    content = "Thought: ok\nAction: 4"
    odd = [tid for ch in content for tid in tiny_tokenizer(ch, add_special_tokens=False)["input_ids"]]
    assert odd != chat.tokenize_text(content)  # a character-by-character tokenization
    msgs = [MESSAGES[0], MESSAGES[1], Message("assistant", content, token_ids=odd + chat.stop_token_ids[:1])]
    enc = chat.encode(msgs)
    assert enc is not None
    assert [i for i, m in zip(enc.input_ids, enc.action_mask, strict=True) if m] == odd + chat.stop_token_ids[:1]
    assert enc.reencoded_turns == 0
    # ids that do not match the content are not trusted
    msgs[2] = Message("assistant", content, token_ids=chat.tokenize_text("Action: 5"))
    enc = chat.encode(msgs)
    assert enc is not None and enc.reencoded_turns == 1


@pytest.mark.parametrize("style", sorted(STYLES))
def test_replies_sampled_as_trained_are_trained_as_sampled(tiny_tokenizer, style: str) -> None:
    """A model that writes each turn as it was trained (content, then the end-of-turn marker,
    Llama-2's leading space or DeepSeek-Coder's newline included) and is cut at its stop token
    as the rollout cuts it: the sequence trained on holds those sampled ids, none re-encoded."""
    tok = styled(tiny_tokenizer, style)
    chat = ChatFormat(tok)
    stops = set(chat.stop_token_ids)
    rollout: list[Message] = []
    sampled: list[int] = []
    for m in MESSAGES:
        if m.role != "assistant":
            rollout.append(m)
            continue
        enc = chat.encode([*rollout, Message("assistant", m.content)])
        assert enc is not None
        last = max(enc.turn_index)
        ids = [i for i, t in zip(enc.input_ids, enc.turn_index, strict=True) if t == last]
        assert ids[-1] in stops and not stops & set(ids[:-1])
        # the rollout's content: the decoded reply up to its stop token
        text = tok.decode(ids[:-1], skip_special_tokens=False)
        rollout.append(Message("assistant", text, token_ids=ids))
        sampled += ids
    enc = chat.encode(rollout)
    assert enc is not None and enc.reencoded_turns == 0, style
    assert [i for i, m in zip(enc.input_ids, enc.action_mask, strict=True) if m] == sampled


@pytest.mark.parametrize("style", sorted(STYLES))
def test_a_reply_cut_at_max_new_tokens_trains_no_end_of_turn_marker_it_never_wrote(tiny_tokenizer, style: str) -> None:
    """A reply that ran into ``max_new_tokens`` (``cut``) has sampled ids without the marker: they are its
    action; the template's marker after it is context (mask 0), so the sequence is the same, and
    the next turn's context is still its prompt."""
    tok = styled(tiny_tokenizer, style)
    chat = ChatFormat(tok)
    a_idx = [i for i, m in enumerate(MESSAGES) if m.role == "assistant"]
    first = a_idx[0]
    written = chat.tokenize_text(chat.reply_lead + MESSAGES[first].content)  # the reply's ids, no stop token: cut
    msgs = list(MESSAGES)
    msgs[first] = Message("assistant", MESSAGES[first].content, token_ids=written, cut=True)
    cut, whole = chat.encode(msgs), chat.encode(MESSAGES)
    assert cut is not None and whole is not None
    assert cut.input_ids == whole.input_ids and cut.reencoded_turns == 0  # the same sequence
    assert [i for i, t in zip(cut.input_ids, cut.turn_index, strict=True) if t == 0] == written
    start = cut.turn_index.index(0) + len(written)
    marker = chat.tokenize_text(chat.eot_text)
    assert marker and cut.input_ids[start:start + len(marker)] == marker
    assert cut.action_mask[start:start + len(marker)] == [0] * len(marker)
    assert whole.action_mask[start:start + len(marker)] == [1] * len(marker)  # a finished reply's marker is trained
    assert [m for m, t in zip(cut.action_mask, cut.turn_index, strict=True) if t > 0] == \
        [m for m, t in zip(whole.action_mask, whole.turn_index, strict=True) if t > 0]  # later turns as before
    turn1 = cut.turn_index.index(1)
    assert cut.input_ids[:turn1] == chat.prompt_ids(msgs[:a_idx[1]])


def test_qwen3_template_never_trains_a_turn_on_another_context_than_its_prompt(tiny_tokenizer) -> None:
    """Qwen3 renders the last assistant turn with an empty <think> block that earlier turns lose
    once later turns exist: one sequence of the whole conversation would train turns 0 and 1
    on a context they were not sampled from. It is refused; one sequence per turn is exact."""
    tok = styled(tiny_tokenizer, "qwen3")
    chat = ChatFormat(tok)
    with pytest.raises(TurnRLError, match="renders a past assistant turn differently.*turn 0"):
        chat.encode(MESSAGES)
    assert not chat.prefix_consistent and chat.eot_text.strip() == "<|im_end|>"
    # only the last turn trains: its context is its prompt, the sequence is accepted
    enc = chat.encode(MESSAGES, trainable_turns=[2])
    assert enc is not None and enc.num_turns == 1
    start = enc.turn_index.index(2)
    assert enc.input_ids[:start] == chat.prompt_ids(MESSAGES[:-1])
    for turn in range(3):
        view, local = agent_view(MESSAGES, turn, 10)
        enc = chat.encode(view, trainable_turns=[local])
        assert enc is not None and enc.num_turns == 1
        start = enc.turn_index.index(local)
        assert enc.input_ids[:start] == chat.prompt_ids(view[:-1])
        assert tok.decode(chat.prompt_ids(view[:-1])).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_system_message_a_template_leaves_out_is_folded(tiny_tokenizer) -> None:
    """Mistral-v0.3 writes the system message only into a final user message, which is never
    final here (an assistant turn follows): it is folded into the first user message instead."""
    tok = styled(tiny_tokenizer, "mistral_v03")
    chat = ChatFormat(tok)
    system = MESSAGES[0].content
    prompt = tok.decode(chat.prompt_ids(MESSAGES[:2]))
    assert prompt.startswith("<s>[INST] " + system + "\n\n" + MESSAGES[1].content)
    enc = chat.encode(MESSAGES)
    assert enc is not None
    assert tok.decode(enc.input_ids).count(system) == 1
    a_idx = [i for i, m in enumerate(MESSAGES) if m.role == "assistant"]
    for turn, i in enumerate(a_idx):
        assert enc.input_ids[: enc.turn_index.index(turn)] == chat.prompt_ids(MESSAGES[:i])


# meta-llama/Llama-2-7b-chat-hf's chat template: takes a system message, raises when roles do not alternate
LLAMA2_HF = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)


def test_a_template_error_does_not_fold_the_system_message_for_good(tiny_tokenizer) -> None:
    """Only a template that rejects the system role folds it into the first user message; another
    error (roles that do not alternate) leaves later conversations rendered as before."""
    tok = styled(tiny_tokenizer, "llama2")
    tok.chat_template = LLAMA2_HF
    chat = ChatFormat(tok)
    before = chat.encode(MESSAGES)
    bad = [MESSAGES[0], MESSAGES[1], Message("user", "an extra observation"), *MESSAGES[2:]]
    with pytest.raises(TurnRLError, match="roles must alternate"):
        chat.encode(bad)
    after = chat.encode(MESSAGES)
    assert before is not None and after is not None and before.input_ids == after.input_ids
    assert "<<SYS>>" in tok.decode(after.input_ids)


@pytest.mark.parametrize("style", ["llama2", "deepseek_coder"])
def test_a_stop_token_sampled_without_the_markers_whitespace_is_trained_as_sampled(tiny_tokenizer, style: str) -> None:
    """Llama-2's end-of-turn marker is " </s>": a model that stops with "</s>" right after its
    content is trained on exactly those ids, not on a whitespace token it never sampled."""
    tok = styled(tiny_tokenizer, style)
    chat = ChatFormat(tok)
    content = "Thought: ok\nAction: 4"
    assert chat.eot_text[:1].isspace()
    sampled = [*chat.tokenize_text(content), chat.tokenize_text(chat.eot_text.strip())[-1]]
    enc = chat.encode([*MESSAGES[:2], Message("assistant", content, token_ids=sampled)])
    assert enc is not None and enc.reencoded_turns == 0
    assert [i for i, m in zip(enc.input_ids, enc.action_mask, strict=True) if m] == sampled


@pytest.fixture(scope="module")
def metaspace_tokenizer():
    """transformers' LlamaTokenizer (the class Llama-2, Mistral and TinyLlama checkpoints load as) on a
    small vocabulary trained here: SentencePiece-style Metaspace, which writes a prefix space into the
    first word of any text it tokenizes on its own."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaTokenizer

    bpe = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)
    corpus = [m.content for m in MESSAGES] * 20 + ["[INST] [/INST] <<SYS>> <</SYS>>"] * 20
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=[chr(i) for i in range(32, 127)] + ["\u2581", "\n"]))
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split()) for m in model["merges"]]
    return LlamaTokenizer(vocab=model["vocab"], merges=merges)


PHI3 = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


@pytest.mark.parametrize("template", ["llama2", "phi3"])
def test_a_prefix_space_tokenizer_gets_no_space_at_piece_boundaries(metaspace_tokenizer, template: str) -> None:
    """Tokenized piece by piece, a Metaspace tokenizer would start every piece with a space (" Thought"
    after "[/INST] ", "\\n Thought" after "<|assistant|>\\n"): the sequence must decode to the template's
    rendering, and for Llama-2 be the very ids of tokenizing that rendering whole."""
    tok = copy.deepcopy(metaspace_tokenizer)
    if template == "phi3":
        tok.add_special_tokens({"additional_special_tokens": ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]})
    tok.chat_template = LLAMA2 if template == "llama2" else PHI3
    assert tok.convert_ids_to_tokens(tok("Thought", add_special_tokens=False)["input_ids"])[0].startswith("\u2581")
    chat = ChatFormat(tok)
    enc = chat.encode(MESSAGES)
    assert enc is not None and chat.prefix_consistent
    rendered = chat._apply([{"role": m.role, "content": m.content} for m in MESSAGES], False)
    assert tok.decode(enc.input_ids, skip_special_tokens=False) == rendered
    if template == "llama2":
        assert enc.input_ids == tok(rendered, add_special_tokens=False)["input_ids"]
        assert tok.convert_ids_to_tokens(chat.prompt_ids(MESSAGES[:2]))[-1] == "\u2581[/INST]"
    # each agent turn's masked tokens decode to its content (and the end-of-turn marker)
    for turn, msg in enumerate(m for m in MESSAGES if m.role == "assistant"):
        ids = [i for i, t in zip(enc.input_ids, enc.turn_index, strict=True) if t == turn]
        assert tok.decode(ids, skip_special_tokens=False).strip().startswith(msg.content.strip())


def _bytelevel_tokenizer() -> Any:
    """A GPT-2-style tokenizer trained here, whose vocabulary writes a space into the next word's
    token (``ĠThought``), unlike the tiny model's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    corpus = [m.content for m in MESSAGES] * 20 + ["Assistant: Thought: Agent: Thought: User: "] * 20
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>")


DEEPSEEK_LLM = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{ 'User: ' + m['content'] + '\n\n' }}"
                "{% elif m['role'] == 'assistant' %}{{ 'Assistant: ' + m['content'] + eos_token }}"
                "{% else %}{{ m['content'] + '\n\n' }}{% endif %}{% endfor %}"
                "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")


@pytest.mark.parametrize("template", ["deepseek_llm", "none"])
def test_a_byte_level_tokenizer_reads_the_space_before_a_reply_with_the_reply(template: str) -> None:
    """A GPT-2-style tokenizer writes a space into the next word's token (``ĠThought``). Under a
    template that writes ``"Assistant: "`` before the reply (DeepSeek-LLM; the fallback for base models
    writes ``"Agent: "``), the prompt must end at the colon, not in a lone space token, and the reply
    start with ``ĠThought``, as the template's own tokenizing of the whole text has it. A sampled reply
    (which then starts with the space) is trained as sampled."""
    tok = _bytelevel_tokenizer()
    tok.chat_template = DEEPSEEK_LLM if template == "deepseek_llm" else None
    assert "ĠThought" in tok.get_vocab()
    chat = ChatFormat(tok)
    assert chat.reply_lead == " "
    prompt = chat.prompt_ids(MESSAGES[:2])
    assert tok.convert_ids_to_tokens(prompt)[-1] == ":"
    assert tok.decode(prompt).endswith("Assistant:" if template == "deepseek_llm" else "Agent:")
    rendered = chat._apply([{"role": m.role, "content": m.content} for m in MESSAGES], False)
    enc = chat.encode(MESSAGES)
    assert enc is not None and enc.input_ids == tok(rendered, add_special_tokens=False)["input_ids"]
    # a reply sampled after that prompt starts with the space; its content does not
    sampled = chat.tokenize_text(" " + MESSAGES[2].content) + [tok.eos_token_id]
    assert tok.convert_ids_to_tokens(sampled)[0] == "ĠThought"
    content = chat.reply_text(sampled, finished=True)
    assert content == MESSAGES[2].content
    convo = [*MESSAGES[:2], Message("assistant", content, token_ids=sampled)]
    enc = chat.encode(convo)
    assert enc is not None and enc.reencoded_turns == 0
    assert [i for i, m in zip(enc.input_ids, enc.action_mask, strict=True) if m] == sampled
    assert enc.input_ids[: len(prompt) + len(sampled)] == prompt + sampled  # (the fallback adds a newline)


@pytest.mark.parametrize("kind", ["byte_level", "metaspace"])  # Phi-3's own is a SentencePiece tokenizer
def test_a_marker_that_takes_the_whitespace_after_it_leaves_no_newline_token(kind: str, request) -> None:
    """Phi-3's added tokens take the whitespace on their right (``rstrip``): tokenizing the whole text,
    ``<|end|>\n<|user|>`` has no newline token. The context after an agent turn's marker, tokenized as a
    piece of its own, kept one after every turn."""
    from tokenizers import AddedToken

    tok = _bytelevel_tokenizer() if kind == "byte_level" else copy.deepcopy(request.getfixturevalue("metaspace_tokenizer"))
    tok.add_special_tokens({"additional_special_tokens": [
        AddedToken(t, rstrip=True, special=True, normalized=False)
        for t in ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")]})
    tok.eos_token = "<|end|>"
    tok.chat_template = PHI3
    chat = ChatFormat(tok)
    enc = chat.encode(MESSAGES)
    rendered = chat._apply([{"role": m.role, "content": m.content} for m in MESSAGES], False)
    assert enc is not None and enc.input_ids == tok(rendered, add_special_tokens=False)["input_ids"]
    for k, m in enumerate(MESSAGES):  # every turn's prompt is what precedes it in training
        if m.role == "assistant":
            prompt = chat.prompt_ids(MESSAGES[:k])
            assert enc.input_ids[: len(prompt)] == prompt and enc.action_mask[len(prompt)] == 1
