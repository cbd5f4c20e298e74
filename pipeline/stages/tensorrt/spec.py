"""The build spec: the typed contract between the two halves of a GPU build.

The first half (any machine: torch, onnx) writes a spec folder beside the artifact
(``artifacts/<recipe>/<target>.spec/``): the lowered graphs, one shared ``weights.data``, golden
outputs, tokenizer, the recipe, and ``build_spec.json``, a :class:`BuildSpec`. The second half
(the target: TensorRT) reads it back with :func:`load_spec` and builds one plan per
:class:`PlanSpec`. JSON on disk (``spec_version`` 1) is what earlier trtpipe versions wrote.

Lowering variants: a spec carries the graphs of one lowering (``plugins`` or ``plugin_free``)
and, for an Orin that may run TensorRT < 10.7, those of the other one too, with suffix
``.plugin_free`` in graph and plan keys. :class:`LoweringVariants` says which made it and why
the others did not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtpipe.pipeline.stages.errors import BuildError
from trtpipe.pipeline.stages.tensorrt.profiles import PlanSpec
from trtpipe.plugins.core.versions import TRT_PLUGINS_MIN_VERSION, TRT_PLUGINS_REQUIREMENT
from trtpipe.runtime.artifact.manifest import KVLayout
from trtpipe.runtime.artifact.model_config import ModelConfig

SPEC_NAME = "build_spec.json"
SPEC_VERSION = 1


@dataclass(frozen=True)
class GraphSpec:
    """One lowered graph in the spec folder."""

    file: str  # "<key>.onnx"
    phase: str  # "prefill" | "decode"
    precision: str  # the recipe's phase precision: fp32 | fp16 | bf16 | int4
    dtype: str  # activation dtype: fp32 | fp16 | bf16
    lowering: str  # "plugins" | "plugin_free"
    decode_kernel: bool
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    custom_nodes: tuple[str, ...]  # trtpipe op types left for TensorRT plugins (empty: plugin-free)
    sha256: str = ""  # of the graph file, set once it is written
    int4_weights: str | None = None  # plugin-free INT4 mode when the weights were changed (None: as exported)

    def to_json(self) -> dict[str, Any]:
        d = {
            "file": self.file,
            "phase": self.phase,
            "precision": self.precision,
            "dtype": self.dtype,
            "lowering": self.lowering,
            "decode_kernel": self.decode_kernel,
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "custom_nodes": list(self.custom_nodes),
            "sha256": self.sha256,
        }
        return d if self.int4_weights is None else {**d, "int4_weights": self.int4_weights}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GraphSpec:
        return cls(
            d["file"],
            d["phase"],
            d["precision"],
            d["dtype"],
            d["lowering"],
            d["decode_kernel"],
            tuple(d["inputs"]),
            tuple(d["outputs"]),
            tuple(d["custom_nodes"]),
            d["sha256"],
            d.get("int4_weights"),
        )


@dataclass(frozen=True)
class LoweringVariants:
    """Which lowerings a spec carries, and the recipe settings that decide which one a target's
    TensorRT gets (:func:`trtpipe.pipeline.stages.tensorrt.compile.choose_lowering`)."""

    target: str
    plugin_free: bool  # engine.plugin_free
    orin_trt_lt_10_7: str | None  # engine.orin_trt_lt_10_7 on orin, else None
    variants: tuple[str, ...]  # in the spec, the first one unsuffixed
    variant_errors: dict[str, str] = field(default_factory=dict)  # variant -> why it is not in the spec
    variant_notes: dict[str, str] = field(default_factory=dict)  # variant -> what its weights are
    variant_agreement: dict[str, dict] = field(default_factory=dict)  # variant -> measured agreement record
    plugin_free_int4: str = "refuse"
    plugin_free_agreement_min: float | None = None

    def suffix(self, variant: str) -> str:
        """ "" for the spec's first variant, ``.<variant>`` for the other."""
        return "" if variant == self.variants[0] else f".{variant}"

    def to_json(self) -> dict[str, Any]:
        return {
            "plugin_free": self.plugin_free,
            "orin_trt_lt_10_7": self.orin_trt_lt_10_7,
            "variants": list(self.variants),
            "variant_errors": self.variant_errors,
            "variant_notes": self.variant_notes,
            "variant_agreement": self.variant_agreement,
            "plugin_free_int4": self.plugin_free_int4,
            "plugin_free_agreement_min": self.plugin_free_agreement_min,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LoweringVariants:
        """From a spec's JSON (the variant keys sit at its top level)."""
        return cls(
            d["target"]["name"],
            d["plugin_free"],
            d["orin_trt_lt_10_7"],
            tuple(d["variants"]),
            dict(d["variant_errors"]),
            dict(d.get("variant_notes", {})),
            dict(d.get("variant_agreement", {})),
            d.get("plugin_free_int4", "refuse"),
            d.get("plugin_free_agreement_min"),
        )


@dataclass(frozen=True)
class SpecTarget:
    """The target the plans are for (a row of :data:`trtpipe.pipeline.targets.BUILD_TARGETS`)."""

    name: str
    sm: int
    platform: str
    description: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "sm": self.sm, "platform": self.platform, "description": self.description}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SpecTarget:
        return cls(d["name"], d["sm"], d["platform"], d["description"])


@dataclass(frozen=True)
class BuilderSettings:
    """TensorRT builder settings. Networks are strongly typed (precision rides in the graph's types),
    so no precision flags are set."""

    optimization_level: int  # engine.builder_optimization_level
    workspace_mib: int  # engine.workspace_mib, or the target's default
    strongly_typed: bool = True
    precision_flags: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "optimization_level": self.optimization_level,
            "workspace_mib": self.workspace_mib,
            "strongly_typed": self.strongly_typed,
            "precision_flags": list(self.precision_flags),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BuilderSettings:
        return cls(d["optimization_level"], d["workspace_mib"], d["strongly_typed"], tuple(d["precision_flags"]))


@dataclass(frozen=True)
class BuildSpec:
    """Everything the target needs to build the plans and write the manifest (``build_spec.json``)."""

    trtpipe_version: str
    recipe: dict[str, str]  # name, hash, file (the recipe YAML in the spec folder)
    inputs_hash: str
    artifact_dir: str  # relative to the spec folder
    timing_cache_dir: str  # relative to the spec folder
    target: SpecTarget
    layout: str  # "split" | "dual_profile"
    lowering: LoweringVariants
    builder: BuilderSettings
    graphs: dict[str, GraphSpec]  # "<phase>[.<variant>]" -> graph
    plans: tuple[PlanSpec, ...]
    kv: KVLayout
    model: ModelConfig
    limits: dict[str, int]
    op_abi_hash: str
    plugin_abi_hash: str
    shared_initializers: dict[str, Any]
    weights_bytes: int
    duplicated_weights_bytes: int
    timings_s: dict[str, Any]
    model_source: str
    written_at: str
    host: str

    def to_json(self) -> dict[str, Any]:
        kv = {**self.kv.__dict__, "layer_num_kv_heads": list(self.kv.layer_num_kv_heads)}
        return {
            "spec_version": SPEC_VERSION,
            "trtpipe_version": self.trtpipe_version,
            "recipe": self.recipe,
            "inputs_hash": self.inputs_hash,
            "artifact_dir": self.artifact_dir,
            "timing_cache_dir": self.timing_cache_dir,
            "target": self.target.to_json(),
            "layout": self.layout,
            **self.lowering.to_json(),
            "builder": self.builder.to_json(),
            "graphs": {k: g.to_json() for k, g in self.graphs.items()},
            "plans": [p.to_json() for p in self.plans],
            "kv": kv,
            "model": self.model.to_dict(),
            "limits": self.limits,
            "op_abi_hash": self.op_abi_hash,
            "plugin_abi_hash": self.plugin_abi_hash,
            "shared_initializers": self.shared_initializers,
            "weights_bytes": self.weights_bytes,
            "duplicated_weights_bytes": self.duplicated_weights_bytes,
            "timings_s": self.timings_s,
            "model_source": self.model_source,
            "written_at": self.written_at,
            "host": self.host,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BuildSpec:
        """Raises KeyError naming a missing key (callers turn it into a :class:`BuildError`)."""
        kv = {**d["kv"], "layer_num_kv_heads": tuple(d["kv"]["layer_num_kv_heads"])}
        return cls(
            d["trtpipe_version"],
            d["recipe"],
            d["inputs_hash"],
            d["artifact_dir"],
            d["timing_cache_dir"],
            SpecTarget.from_json(d["target"]),
            d["layout"],
            LoweringVariants.from_json(d),
            BuilderSettings.from_json(d["builder"]),
            {k: GraphSpec.from_json(g) for k, g in d["graphs"].items()},
            tuple(PlanSpec.from_json(p) for p in d["plans"]),
            KVLayout(**kv),
            ModelConfig.from_dict(d["model"]),
            d["limits"],
            d["op_abi_hash"],
            d["plugin_abi_hash"],
            d["shared_initializers"],
            d["weights_bytes"],
            d.get("duplicated_weights_bytes", 0),
            d.get("timings_s", {}),
            d["model_source"],
            d["written_at"],
            d["host"],
        )


def spec_dir_for(final_dir: Path) -> Path:
    """``artifacts/<recipe>/<target>.spec`` beside the artifact folder."""
    return final_dir.with_name(final_dir.name + ".spec")


def read_spec_json(spec_path: Path) -> dict[str, Any]:
    """The raw JSON of a spec of this :data:`SPEC_VERSION`. Raises :class:`BuildError` (unreadable,
    other version), naming the command that rewrites it."""
    try:
        spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BuildError(
            f"cannot read build spec {spec_path}: {e}. Fix: rerun `trtpipe build RECIPE` to write it."
        ) from e
    if spec.get("spec_version") != SPEC_VERSION:
        raise BuildError(
            f"build spec {spec_path} has version {spec.get('spec_version')}, this trtpipe reads "
            f"{SPEC_VERSION}. Fix: rewrite it with this trtpipe (`trtpipe build RECIPE --force`)."
        )
    return spec


def load_spec(spec_path: Path) -> BuildSpec:
    """Read and type a spec. Raises :class:`BuildError` naming a missing key."""
    raw = read_spec_json(spec_path)
    try:
        return BuildSpec.from_json(raw)
    except KeyError as e:
        raise BuildError(
            f"build spec {spec_path} lacks {e}. Fix: rewrite it with this trtpipe (`trtpipe build RECIPE --force`)."
        ) from None


def finish_command(spec_path: Path) -> str:
    """The command that finishes a build from its spec on the target."""
    d = spec_path.parent
    return f"trtpipe build {d / 'recipe.yaml'} --from-spec {spec_path}"


def variants_summary(v: LoweringVariants) -> str:
    """One line per lowering variant of a spec: built (with what it needs), or refused with its
    full reason (never cut: the console is where a user reads it)."""
    lines = []
    for name in v.variants:
        need = (
            f"{TRT_PLUGINS_REQUIREMENT} (Python plugins)"
            if name == "plugins"
            else "any TensorRT 10.x, JetPack 6 included (no plugins)"
        )
        note = v.variant_notes.get(name)
        lines.append(f"  variant {name}: in the spec; runs on {need}" + (f"; {note}" if note else ""))
    for name, reason in v.variant_errors.items():
        lines.append(f"  variant {name}: NOT in the spec: {reason}")
    return "Variants:\n" + "\n".join(lines)


def finish_requirements(v: LoweringVariants) -> str:
    """What the target needs to finish a spec: the plugin-free graphs on older TensorRT are
    offered only when the spec carries them."""
    plugins = f"{TRT_PLUGINS_REQUIREMENT} with Python plugins"
    if v.variants == ("plugin_free",):
        return "TensorRT 10.x; the graphs are plugin-free"
    if "plugin_free" in v.variants:
        older = ".".join(map(str, TRT_PLUGINS_MIN_VERSION))
        return plugins + f", or TensorRT < {older} (JetPack 6) with the plugin-free graphs"
    return plugins
