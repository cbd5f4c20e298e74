"""The GGUF block types trtpipe reads, one record each: block geometry in the file and the kernel
form's group, code range and bytes per weight (pure data; sizes from ggml-common.h / gguf-py
``constants.GGML_QUANT_SIZES``).

    type  block  bytes  B/weight (GGUF)  group G  codes        offset  B/weight (kernel form)
    Q4_0     32     18  0.5625           32       -8..7        -0.0    1.25
    Q4_1     32     20  0.625            32        0..15       m       1.25
    Q5_0     32     22  0.6875           32      -16..15       -0.0    1.25
    Q5_1     32     24  0.75             32        0..31       m       1.25
    Q8_0     32     34  1.0625           32     -128..127      -0.0    1.25
    Q4_K    256    144  0.5625           32        0..15       -dmin*m 1.25
    Q5_K    256    176  0.6875           32        0..31       -dmin*m 1.25
    Q6_K    256    210  0.8203125        16      -32..31       -0.0    1.5

The kernel form (:class:`~trtpipe.plugins.core.gguf_blocks.kernel_form.KernelBlocks`) stores one
int8 code per weight and a float32 scale and offset per group: ``1 + 8 / G`` bytes per weight.
``packed_bytes_per_weight`` is the same information with codes at their bit width and the offset
left out where it is always -0.0 (what a packed C layout of the form would take).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GgufBlockType", "GGUF_BLOCK_TYPES", "FLOAT_BYTES", "gguf_nbytes"]


@dataclass(frozen=True)
class GgufBlockType:
    """One GGUF block type: ``block_size`` weights in ``block_bytes`` bytes in the file; in the
    kernel form, groups of ``group_size`` weights with int8 codes in ``code_min..code_max``
    (``code_bits`` bits of information) and, when ``has_offset``, a per-group offset (else the
    offset is -0.0: the add is the identity)."""

    name: str
    block_size: int
    block_bytes: int
    group_size: int
    code_bits: int
    code_min: int
    code_max: int
    has_offset: bool

    @property
    def gguf_bytes_per_weight(self) -> float:
        """Bytes per weight as stored in the GGUF file (``block_bytes / block_size``)."""
        return self.block_bytes / self.block_size

    @property
    def kernel_bytes_per_weight(self) -> float:
        """Bytes per weight of the kernel form: 1 B int8 code + 4 B scale + 4 B offset per group."""
        return 1.0 + 8.0 / self.group_size

    @property
    def packed_bytes_per_weight(self) -> float:
        """Codes at ``code_bits`` bits, a float32 scale per group, a float32 offset per group
        only when ``has_offset``."""
        return self.code_bits / 8 + (4.0 + 4.0 * self.has_offset) / self.group_size


def _t(name: str, block: int, nbytes: int, group: int, bits: int, signed: bool, offset: bool) -> GgufBlockType:
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    return GgufBlockType(name, block, nbytes, group, bits, lo, hi, offset)


GGUF_BLOCK_TYPES: dict[str, GgufBlockType] = {
    t.name: t
    for t in (
        _t("Q4_0", 32, 18, 32, 4, True, False),
        _t("Q4_1", 32, 20, 32, 4, False, True),
        _t("Q5_0", 32, 22, 32, 5, True, False),
        _t("Q5_1", 32, 24, 32, 5, False, True),
        _t("Q8_0", 32, 34, 32, 8, True, False),
        _t("Q4_K", 256, 144, 32, 4, False, True),
        _t("Q5_K", 256, 176, 32, 5, False, True),
        _t("Q6_K", 256, 210, 16, 6, True, False),
    )
}

FLOAT_BYTES = {"F32": 4, "F16": 2, "BF16": 2}  # bytes per weight of GGUF float types


def gguf_nbytes(qtype: str, shape: tuple[int, ...]) -> int:
    """Bytes a tensor of GGUF type ``qtype`` and logical ``shape`` (rows last axis = K) takes
    in the file. Raises KeyError for an unknown type, ValueError when the last axis is not a
    whole number of blocks."""
    n = 1
    for s in shape:
        n *= int(s)
    if qtype in FLOAT_BYTES:
        return n * FLOAT_BYTES[qtype]
    t = GGUF_BLOCK_TYPES[qtype]
    if not shape or int(shape[-1]) % t.block_size:
        raise ValueError(f"shape {shape}: the last axis must be a multiple of {t.name}'s block of {t.block_size}")
    return n // t.block_size * t.block_bytes
