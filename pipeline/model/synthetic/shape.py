"""The shape of a synthetic Llama model and the GGUF tensors it is made of.

Defaults are Llama-2-7B's exact shapes (HF ``meta-llama/Llama-2-7b-hf`` config.json: 32 layers,
hidden 4096, 32 heads, 32 KV heads, FFN 11008, vocab 32000, RoPE base 10000, RMSNorm eps 1e-5,
context 4096) and the tensor types llama.cpp's ``llama-quantize ... Q4_0`` gives it
(``llama_tensor_get_type``: every linear and ``token_embd`` Q4_0, ``output`` Q6_K, norms F32;
e.g. TheBloke's ``llama-2-7b.Q4_0.gguf``), which the native engine runs; ``embed_type`` /
``head_type`` Q8_0 give the layout of SmolLM2-style files.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtpipe.plugins.core.errors import TrtpipeError

# GGML types the generator writes: quantized by gguf-py (quants.quantize) or, for Q6_K, which
# gguf-py does not quantize, random blocks (tensors.py)
LINEAR_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "F16")
EMBED_TYPES = ("Q4_0", "Q8_0", "Q6_K", "F16")
BLOCK_ELEMENTS = {"Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q8_0": 32, "Q6_K": 256, "F16": 1, "F32": 1}


class SyntheticShapeError(TrtpipeError, ValueError):
    """A synthetic model's shape or tensor types cannot be written."""


@dataclass(frozen=True)
class TensorSpec:
    """One GGUF tensor: ``rows`` x ``cols`` in Hugging Face order (``[out_features,
    in_features]``; a norm is one row), stored as ``qtype``; ``index`` seeds its values."""

    name: str  # llama.cpp's name, e.g. "blk.3.ffn_up.weight"
    rows: int
    cols: int
    qtype: str  # "F32" | one of LINEAR_TYPES | EMBED_TYPES
    kind: str  # "norm" | "linear" | "embed" | "head"
    index: int  # position in the file; with the seed, picks the tensor's random stream


@dataclass(frozen=True)
class SyntheticShape:
    """A Llama-architecture model's facts (defaults: Llama-2-7B) and its tensors' GGML types."""

    num_layers: int = 32
    hidden_size: int = 4096
    num_heads: int = 32
    num_kv_heads: int = 32
    intermediate_size: int = 11008
    vocab_size: int = 32000
    context_length: int = 4096
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    linear_type: str = "Q4_0"
    embed_type: str = "Q4_0"  # token_embd
    head_type: str = "Q6_K"  # output (the LM head; never tied here, as in Llama 2)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def check(self) -> SyntheticShape:
        """Returns self; raises :class:`SyntheticShapeError` naming the field that cannot be written."""

        def bad(field: str, value: object, expected: str, fix: str) -> SyntheticShapeError:
            return SyntheticShapeError(f"synthetic model {field} = {value!r}; expected {expected}. Fix: {fix}.")

        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise bad("num_heads/num_kv_heads", (self.num_heads, self.num_kv_heads),
                      "heads dividing hidden_size and KV heads dividing heads", "pick divisors")  # fmt: skip
        if self.head_dim % 2:
            raise bad("head_dim", self.head_dim, "an even head_dim (RoPE rotates pairs)", "change num_heads")
        for field, value, allowed in (("linear_type", self.linear_type, LINEAR_TYPES),
                                      ("embed_type", self.embed_type, EMBED_TYPES),
                                      ("head_type", self.head_type, EMBED_TYPES)):  # fmt: skip
            if value not in allowed:
                raise bad(field, value, f"one of {list(allowed)}", f"use one of {list(allowed)}")
        for field, qtype in (("linear_type", self.linear_type), ("embed_type", self.embed_type),
                             ("head_type", self.head_type)):  # fmt: skip
            block = BLOCK_ELEMENTS[qtype]
            cols = [self.hidden_size] + ([self.intermediate_size] if field == "linear_type" else [])
            if any(c % block for c in cols):
                raise bad("hidden_size/intermediate_size", cols, f"multiples of {qtype}'s block of {block}",
                          f"pick multiples of {block} or another {field}")  # fmt: skip
        return self

    def tensors(self) -> list[TensorSpec]:
        """Every tensor in file order (llama.cpp's: token_embd, the layers, output_norm, output)."""
        h, f, kv = self.hidden_size, self.intermediate_size, self.num_kv_heads * self.head_dim
        plan: list[tuple[str, int, int, str, str]] = [
            ("token_embd.weight", self.vocab_size, h, self.embed_type, "embed")
        ]
        for i in range(self.num_layers):
            lin = self.linear_type
            plan += [
                (f"blk.{i}.attn_norm.weight", 1, h, "F32", "norm"),
                (f"blk.{i}.attn_q.weight", h, h, lin, "linear"),
                (f"blk.{i}.attn_k.weight", kv, h, lin, "linear"),
                (f"blk.{i}.attn_v.weight", kv, h, lin, "linear"),
                (f"blk.{i}.attn_output.weight", h, h, lin, "linear"),
                (f"blk.{i}.ffn_norm.weight", 1, h, "F32", "norm"),
                (f"blk.{i}.ffn_gate.weight", f, h, lin, "linear"),
                (f"blk.{i}.ffn_up.weight", f, h, lin, "linear"),
                (f"blk.{i}.ffn_down.weight", h, f, lin, "linear"),
            ]
        plan += [
            ("output_norm.weight", 1, h, "F32", "norm"),
            ("output.weight", self.vocab_size, h, self.head_type, "head"),
        ]
        return [TensorSpec(n, r, c, q, k, i) for i, (n, r, c, q, k) in enumerate(plan)]

    def num_parameters(self) -> int:
        return sum(t.rows * t.cols for t in self.tensors())


LLAMA2_7B = SyntheticShape()
