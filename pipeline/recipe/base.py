"""What every recipe section shares: the strict pydantic base class, the literal value sets
(targets, precisions, KV dtypes, phases) and the small value checks used by several sections."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict

from trtpipe.pipeline.recipe.errors import Issue, fail
from trtpipe.pipeline.targets import TARGET_FAMILIES
from trtpipe.plugins.core.kv_codec import KV_DTYPES

Target = Literal[TARGET_FAMILIES]  # type: ignore[valid-type]  # the target table's rows (pipeline/targets.py)
Precision = Literal["fp32", "fp16", "bf16", "int4"]
KVDtype = Literal[KV_DTYPES]  # type: ignore[valid-type]  # fp32 | fp16 | bf16 | int8 (plugins/core/kv_codec.py)
Phase = Literal["prefill", "decode"]


def is_pow2(n: int) -> bool:
    """True for 1, 2, 4, 8, ..."""
    return n > 0 and n & (n - 1) == 0


def nearest_pow2(n: int) -> tuple[int, int]:
    """The powers of two around ``n``: ``(2**floor(log2 n), 2**(floor(log2 n) + 1))``."""
    lo = 1 << max(0, n.bit_length() - 1)
    return lo, lo * 2


class Spec(BaseModel):
    # strict: YAML already types its scalars; "16" or true for an integer is a mistake, not a
    # value to coerce.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def check_name(v: str) -> str:
    """A recipe or scenario name (it becomes a folder name); raises :func:`fail` otherwise."""
    ok = bool(v) and (v[0].isalnum() and all(c.isalnum() or c in "._-" for c in v))
    if not ok:
        raise fail(
            Issue(
                (),
                v,
                "a non-empty name of letters, digits, '.', '_' or '-' (it becomes a folder name)",
                "e.g. `smollm2-135m-cpu`",
            )
        )
    return v


# A recipe or scenario name, checked by :func:`check_name` wherever a schema declares one.
Name = Annotated[str, AfterValidator(check_name)]
