"""One validated generation request (:class:`GenerationRequest`), in runtime terms, and how many
tokens it may generate once its prompt is tokenized (:func:`max_new_tokens`)."""

from __future__ import annotations

from dataclasses import dataclass

from trtpipe.runtime.sample.params import SamplingParams
from trtpipe.runtime.sample.structured import StructuredOutput
from trtpipe.runtime.serve.errors import ServeError


@dataclass(frozen=True)
class GenerationRequest:
    """One validated generation request (completions or chat), in runtime terms.

    ``prompt`` is text (already chat-templated for chat) or token ids; ``max_tokens`` None means
    "up to max_seq_len" (resolved once the prompt is tokenized).
    """

    kind: str  # "completion" | "chat"
    model: str
    prompt: str | tuple[int, ...]
    messages: tuple[dict, ...] | None
    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: tuple[str, ...]
    ignore_eos: bool
    stream: bool
    include_usage: bool
    return_token_ids: bool
    cache_salt: str | None = None  # vLLM's field: only requests with the same salt share prefix-cache blocks
    max_tokens_param: str | None = None  # the field the client set max_tokens with; None: OpenAI's default
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    n: int = 1
    logprobs: int | None = None  # top alternatives per token; None = no logprobs
    echo: bool = False  # completions: the prompt text first
    structured: StructuredOutput | None = None
    ignored_fields: tuple[str, ...] = ()  # unknown extension fields (counted on /metrics)
    speculative: bool = True  # false: this request opts out of speculative decoding

    def sampling_params(self, max_new_tokens: int, index: int = 0) -> SamplingParams:
        """The runtime's parameters for choice ``index`` (its seed is ``seed + index``, as vLLM's
        parallel sampling: choice i reproduces a single request with seed + i)."""
        return SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            seed=None if self.seed is None else self.seed + index,
            stop=self.stop,
            stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            logit_bias=self.logit_bias,
            min_tokens=min(self.min_tokens, max_new_tokens),
            logprobs=self.logprobs,
            prompt_logprobs=self.logprobs if self.echo else None,
            structured=self.structured,
            speculative=self.speculative,
        )  # checked with the prompt by new_request, the one place requests are checked


def max_new_tokens(req: GenerationRequest, num_prompt_tokens: int, max_seq_len: int, prompt_field: str) -> int:
    """``max_tokens``, or when unset everything up to max_seq_len (chat) or OpenAI's default 16
    capped to what fits (completions, as vLLM does). A client's max_tokens that does not fit
    beside the prompt is a 400 ``context_length_exceeded`` naming the field, the value and the
    most that fits (vLLM's and OpenAI's refusal). A prompt that leaves no room at all gets 1 here:
    ``new_request`` then refuses it with the runtime's one prompt-length rule."""
    room = max_seq_len - num_prompt_tokens
    if room < 1:
        return 1
    if req.max_tokens is None:
        return room
    if req.max_tokens <= room or req.max_tokens_param is None:
        return min(req.max_tokens, room)
    param = req.max_tokens_param
    drop = f", or drop {param} (chat then generates up to the context length)" if req.kind == "chat" else ""
    shorter = "shorter messages" if req.kind == "chat" else "a shorter prompt"
    raise ServeError(
        400,
        f"{param} = {req.max_tokens}: this model's maximum context length is {max_seq_len} tokens. However, "
        f"you requested {num_prompt_tokens + req.max_tokens} tokens ({num_prompt_tokens} in the {prompt_field}, "
        f"{req.max_tokens} in the completion); expected {param} <= {room}. Fix: send {param} <= {room}, "
        f"or {shorter}{drop}.",
        param=param,
        code="context_length_exceeded",
    )


__all__ = ["GenerationRequest", "max_new_tokens"]
