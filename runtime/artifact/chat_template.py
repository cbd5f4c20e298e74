"""Render a model's chat template (Jinja2) into a prompt string, as transformers does.

Chat templates ship with the model (GGUF ``tokenizer.chat_template``, tokenizer_config.json) and
are untrusted code, so they run in Jinja2's ``ImmutableSandboxedEnvironment``. The environment
copies transformers ``utils/chat_template_utils.py`` (``_compile_jinja_template`` and
``render_jinja_template``) so that the same template gives the same string:

* ``trim_blocks=True, lstrip_blocks=True`` and the ``loopcontrols`` extension;
* ``tojson`` without HTML escaping (``json.dumps(x, ensure_ascii=False, ...)``);
* globals ``raise_exception(message)``, ``strftime_now(format)``, a safe ``dict`` and a
  ``namespace`` that rejects underscore attributes;
* a ``{% generation %}...{% endgeneration %}`` tag that renders its body (transformers uses it to
  find assistant tokens for training masks; here it only has to parse);
* variables ``messages``, ``tools``, ``documents``, ``add_generation_prompt``, ``bos_token``,
  ``eos_token`` and any extra keyword arguments.

Errors: a template that does not compile, or that tries what the sandbox forbids, raises
:class:`ArtifactError` (the model's template is broken); a template that rejects the conversation (``raise_exception``, e.g. roles that do not
alternate) or fails while rendering raises :class:`RequestError`.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from trtpipe.runtime.errors import ArtifactError, RequestError


class _TemplateRejected(jinja2.exceptions.TemplateError):
    """Raised by the template's own ``raise_exception(...)``."""


def _raise_exception(message: str) -> None:
    raise _TemplateRejected(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes <, >, & and ' for HTML; a prompt must not change them.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:  # noqa: A002 - the name templates call it with
    return datetime.now().strftime(format)


class _TemplateDict:
    """``dict(...)`` for templates, without exposing the ``dict`` type itself (sandbox hardening,
    as in transformers)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """``namespace(...)`` that refuses underscore-prefixed attributes (CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # same signature trick as jinja2's Namespace
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot set underscore-prefixed namespace attributes, got {name!r}"
            )


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}body{% endgeneration %}`` renders ``body`` unchanged."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Any) -> str:
        return caller()


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    try:
        return env.from_string(template)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ArtifactError(
            f"chat_template: Jinja syntax error at line {exc.lineno}: {exc.message}; expected a "
            "Hugging Face chat template. Fix: correct the template in the model (or recipe) and "
            "rebuild the artifact."
        ) from None


def _check_messages(messages: Any) -> list[dict]:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise RequestError(
            f"messages: got {type(messages).__name__} {messages!r:.80}; expected a non-empty list "
            "of {'role': ..., 'content': ...} dicts."
        )
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(
                f"messages[{index}] = {message!r:.80}; expected a dict with a string 'role' "
                "('system', 'user', 'assistant', ...) and its 'content'."
            )
    return list(messages)


def render_chat(
    template: str,
    messages: list[dict],
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    **template_vars: Any,
) -> str:
    """The prompt text for ``messages`` under the chat ``template``.

    Matches ``transformers`` ``tokenizer.apply_chat_template(messages, tokenize=False,
    add_generation_prompt=...)`` when given the tokenizer's ``bos_token`` / ``eos_token`` texts.
    ``add_generation_prompt`` appends the assistant header so the model answers next.
    ``template_vars`` reach the template as variables (``tools=[...]``, ``documents=[...]``,
    ``enable_thinking=False``, ...). Tokenize the result with ``add_special_tokens=False``
    (the template writes BOS itself when the model wants it).
    """
    if not isinstance(template, str) or not template:
        raise ArtifactError(
            "chat_template is empty or missing; expected the model's Jinja chat template. Fix: "
            "build from a model that has one, or set one in the recipe; or send a plain prompt."
        )
    compiled = _compile(template)
    variables = {"tools": None, "documents": None, **template_vars}
    try:
        return compiled.render(
            messages=_check_messages(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            **variables,
        )
    except _TemplateRejected as exc:
        raise RequestError(f"messages: the model's chat template rejected the conversation: {exc.message}") from None
    except jinja2.exceptions.SecurityError as exc:
        raise ArtifactError(
            f"chat_template: the template tried an operation the sandbox forbids ({exc}); "
            "expected a template that only formats messages. Fix: correct the model's template."
        ) from None
    except (jinja2.exceptions.TemplateError, TypeError, ValueError, LookupError, AttributeError) as exc:
        # TypeError & co: the template did Python operations on message data it did not expect
        # (e.g. str + None for a message without content).
        raise RequestError(
            f"messages: rendering the chat template failed ({type(exc).__name__}: {exc}); "
            "expected messages in the shape this model's template reads."
        ) from None


def default_chat_messages(prompt: str) -> list[dict[str, str]]:
    """A one-turn conversation: ``[{"role": "user", "content": prompt}]``."""
    return [{"role": "user", "content": prompt}]


def encode_prompt(
    tokenizer: Any, chat_template: str | None, prompt: Any, chat: bool = False, *, add_special_tokens: bool = True
) -> list[int]:
    """Token ids of ``prompt``: text (str, or UTF-8 bytes) or, with ``chat``, a conversation
    (``[{"role": ..., "content": ...}]``, or text sent as one user turn) under ``chat_template``,
    ending with the assistant header (the model answers next).

    Raises :class:`RequestError` for invalid UTF-8, empty text, a model without a chat template
    (with ``chat``), or a conversation the template rejects.
    """
    if isinstance(prompt, bytes):
        try:
            prompt = prompt.decode("utf-8")
        except UnicodeDecodeError as e:
            raise RequestError(
                f"prompt is not valid UTF-8 ({e.reason} at byte {e.start}). Fix: send UTF-8 text."
            ) from None
    if isinstance(prompt, str) or not chat:
        if not isinstance(prompt, str) or not prompt.strip():
            raise RequestError(f"prompt = {prompt!r}: expected non-empty text. Fix: send a prompt.")
        if not chat:
            return tokenizer.encode(prompt, add_special_tokens=True)
        prompt = default_chat_messages(prompt)
    if not chat_template:
        raise RequestError(
            "messages: this model has no chat template in its metadata (a pretrained base model such as Gemma 3 "
            "270M continues text; it takes no chat turns); expected a model with one for chat. Fix: send a "
            "plain-text prompt instead (/v1/completions, or `trtpipe generate` without --chat).",
            field="messages",
        )
    try:
        text = render_chat(chat_template, list(prompt))
    except RequestError as e:  # the conversation (a broken template is an ArtifactError)
        raise RequestError(str(e), field="messages") from None
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)
