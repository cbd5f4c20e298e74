"""The :class:`Recipe` model: one YAML file per deployment, validated once at the edge.

A recipe states the model, the target, the precision of each phase (prefill and decode), the
paged KV cache, the scheduler limits, the TensorRT optimization profiles, the engine layout, and
the validate workload with its latency budgets. Everything downstream (export, lowering, build,
runtime limits, validate) reads the frozen :class:`Recipe`, never the YAML. Its sections live in
:mod:`~trtpipe.pipeline.recipe.schema_build`, :mod:`~trtpipe.pipeline.recipe.schema_runtime` and
:mod:`~trtpipe.pipeline.recipe.schema_validate`; the checks across sections in
:mod:`~trtpipe.pipeline.recipe.checks`.

Units are in the names: ``*_ms`` milliseconds, ``*_mib`` MiB (2**20 bytes), ``*_per_s`` per second,
``*_tokens`` / ``max_seq_len`` / ``max_num_tokens`` tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, PrivateAttr, model_validator

from trtpipe.pipeline.recipe.base import KVDtype, Name, Phase, Spec, Target
from trtpipe.pipeline.recipe.errors import Issue, fail
from trtpipe.pipeline.recipe.model_source import ModelSource, resolve_model_source
from trtpipe.pipeline.recipe.schema_build import (
    DecodeProfile,
    EngineSpec,
    KVCacheSpec,
    ModelSpec,
    PrecisionSpec,
    PrefillProfile,
    ProfilesSpec,
    Range,
)
from trtpipe.pipeline.recipe.schema_runtime import RuntimeSpec
from trtpipe.pipeline.recipe.schema_validate import ValidateSpec
from trtpipe.plugins.core.dtypes import activation_dtype, kv_cache_dtype
from trtpipe.runtime.kv.planning import blocks_for_tokens


class Recipe(Spec):
    """A validated deployment recipe. Build it with :func:`load_recipe` or :func:`parse_recipe`.

    Limits: ``max_seq_len`` tokens per sequence (prompt + output), ``max_batch_size`` running
    sequences per decode step, ``max_num_tokens`` tokens per prefill step (chunked prefill packs
    up to this many). ``sliding_window``: None keeps the model's window, 0 turns it off, n > 0
    sets an n-token window on every layer (an approximation for full-attention models).
    """

    name: Name = Field(examples=["smollm2-135m-cpu"])
    description: str = ""
    model: ModelSpec
    target: Target = Field(examples=["cpu"])
    precision: PrecisionSpec
    kv_cache: KVCacheSpec = Field(default_factory=KVCacheSpec)
    sliding_window: int | None = Field(None, ge=0, examples=[1024])
    max_seq_len: int = Field(2048, ge=1, examples=[2048])
    max_batch_size: int = Field(8, ge=1, examples=[8])
    max_num_tokens: int = Field(512, ge=1, examples=[512])
    profiles: ProfilesSpec | None = None
    engine: EngineSpec = Field(default_factory=EngineSpec)
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    # "validate" would shadow BaseModel.validate; the YAML key stays "validate".
    validation: ValidateSpec = Field(default_factory=ValidateSpec, alias="validate")

    _origin: str = PrivateAttr(default="<recipe>")

    @model_validator(mode="before")
    @classmethod
    def _moved_runtime_keys(cls, data: Any) -> Any:
        """Name the keys that moved into ``runtime:`` (where a recipe written before it has them)."""
        if not isinstance(data, dict):
            return data
        issues = []
        if "scheduler" in data:
            issues.append(
                Issue(
                    ("scheduler",),
                    data["scheduler"],
                    "the scheduler settings under runtime: (runtime settings, not part of the build hash)",
                    "move it: `runtime: {scheduler: {...}}`",
                )
            )
        kv = data.get("kv_cache")
        if isinstance(kv, dict) and "prefix_caching" in kv:
            issues.append(
                Issue(
                    ("kv_cache", "prefix_caching"),
                    kv["prefix_caching"],
                    "prefix caching under runtime: (a runtime setting, not part of the build hash)",
                    f"move it: `runtime: {{prefix_caching: {str(kv['prefix_caching']).lower()}}}`",
                )
            )
        if issues:
            raise fail(*issues)
        return data

    _base_dir: Path | None = PrivateAttr(default=None)

    # -- where it came from ------------------------------------------------------------------
    @property
    def origin(self) -> str:
        """The recipe file (as given to :func:`load_recipe`), or ``<recipe>``; used in errors."""
        return self._origin

    @property
    def file_stem(self) -> str | None:
        """The recipe file's name without ``.yaml`` (None: not read from a file)."""
        p = Path(self._origin)
        return p.stem if p.suffix in (".yaml", ".yml") else None

    @property
    def named_as_file(self) -> bool:
        """True unless the recipe file is named otherwise than its ``name:`` (a copy of another
        recipe that kept its name, e.g. tight.yaml with ``name: smollm2-135m-cpu``): such a file
        maps to that recipe's artifact and keeps its own validate reports beside it."""
        return self.file_stem in (None, self.name)

    @property
    def base_dir(self) -> Path | None:
        """The recipe file's folder: relative paths in the recipe are resolved against it."""
        return self._base_dir

    def resolve_source(self) -> ModelSource:
        """Resolve ``model.source`` (:func:`resolve_model_source`); RecipeError if missing."""
        return resolve_model_source(self.model.source, self._base_dir, origin=self._origin)

    def resolve_path(self, path: str) -> Path:
        """A path written in the recipe: absolute as is; relative against the recipe's folder
        if it exists there, else the CWD, else (for messages) the recipe's folder."""
        p = Path(path).expanduser()
        if p.is_absolute():
            return p
        bases = [b for b in (self._base_dir, Path.cwd()) if b is not None]
        for base in bases:
            if (base / p).exists():
                return (base / p).resolve()
        return (bases[0] / p).resolve()

    # -- derived settings --------------------------------------------------------------------
    @property
    def uses_int4(self) -> bool:
        """True when either phase runs INT4 weights."""
        return "int4" in (self.precision.prefill, self.precision.decode)

    def activation_dtype(self, phase: Phase) -> KVDtype:
        """Activation dtype of a phase: its precision, or for ``int4`` (weight-only) fp32 on
        the cpu target and fp16 on GPU targets."""
        return activation_dtype(getattr(self.precision, phase), self.target)  # type: ignore[return-value]

    @property
    def kv_dtype(self) -> KVDtype:
        """KV pool dtype: ``kv_cache.dtype`` or, when unset, the decode activation dtype."""
        return kv_cache_dtype(self.kv_cache.dtype, self.precision.decode, self.target)  # type: ignore[return-value]

    @property
    def max_blocks_per_seq(self) -> int:
        """Block-table width MB = ceil(max_seq_len / block_size)."""
        return blocks_for_tokens(self.max_seq_len, self.kv_cache.block_size)

    def resolved_profiles(self) -> ProfilesSpec:
        """The optimization profiles to build: the recipe's, with a phase left out derived
        from the limits (min 1, max = the limit, opt = a typical size)."""
        given = self.profiles or ProfilesSpec()
        prefill = given.prefill or PrefillProfile(
            tokens=Range(min=1, opt=min(self.max_num_tokens, 512), max=self.max_num_tokens),
            sequences=Range(min=1, opt=1, max=min(self.max_batch_size, self.max_num_tokens)),
        )
        decode = given.decode or DecodeProfile(
            batch=Range(min=1, opt=max(1, self.max_batch_size // 2), max=self.max_batch_size),
            context=Range(min=1, opt=min(self.max_seq_len, 1024), max=self.max_seq_len),
        )
        return ProfilesSpec(prefill=prefill, decode=decode)
