"""OpenAI request bodies -> one validated :class:`GenerationRequest`; errors as OpenAI error JSON.

Follows the OpenAI API reference (``/v1/completions``, ``/v1/chat/completions``) and vLLM's
extensions (``top_k``, ``ignore_eos``, ``return_token_ids``, ``cache_salt``,
``repetition_penalty``, ``min_tokens``, ``stop_token_ids``, ``guided_json``,
``structured_outputs``) and trtpipe's ``speculative`` (false: plain decoding for this request
under ``serve --speculative``). Every field is checked here, once, at the edge; a bad one raises
:class:`ServeError` whose message names the field, the value, what was expected and the fix, and
whose body is OpenAI's error shape::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature", "code": null}}

One module per piece: :mod:`.body` (UTF-8 JSON object), :mod:`.fields` (which fields are
supported, refused, or unknown and ignored), :mod:`.sampling`, :mod:`.structured`
(``response_format``), :mod:`.messages` (roles, content parts), :mod:`.parse` (the two
endpoints), :mod:`.request` (the validated record).
"""

from trtpipe.runtime.serve.errors import ServeError, bad_field
from trtpipe.runtime.serve.protocol.body import parse_json_body
from trtpipe.runtime.serve.protocol.parse import parse_add_special_tokens, parse_chat, parse_completion
from trtpipe.runtime.serve.protocol.request import GenerationRequest, max_new_tokens

__all__ = [
    "ServeError",
    "GenerationRequest",
    "bad_field",
    "max_new_tokens",
    "parse_add_special_tokens",
    "parse_json_body",
    "parse_completion",
    "parse_chat",
]
