"""The GPU build's first half (any machine: torch, onnx) and the dispatcher to the second.

::

    write_build_spec (any machine)                          build_from_spec (the target GPU: compile.py)
    ─────────────────────────────────────────               ─────────────────────────────────────────────
    load -> export -> lower for TensorRT (variants)          check GPU == target SM, TensorRT version
    profiles (profiles.py), checked                          pick lowering, register plugins
    golden, plugin-free accuracy gate (variant_gate.py)      polygraphy: one plan per PlanSpec
    <target>.spec/build_spec.json (spec.py)  ──────────────► <target>/manifest.json

Where TensorRT or the target GPU is missing, :func:`build_gpu_target` writes the spec and stops
with :class:`BuildNeedsTarget`, naming what is missing and the command that finishes on the target.
Nothing here ever writes a plan that TensorRT did not build.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trtpipe.pipeline.recipe import Recipe, recipe_hash
from trtpipe.pipeline.stages.errors import BuildError, BuildNeedsTarget
from trtpipe.pipeline.stages.export import ExportedGraphs, export_graphs
from trtpipe.pipeline.stages.golden.stage import write_golden
from trtpipe.pipeline.stages.load import PreparedModel, load_model, prepare_model
from trtpipe.pipeline.stages.package import DATA_FILE, SharedInitializers, publish_dir, staging_dir, write_graphs_shared
from trtpipe.pipeline.stages.records import BuildResult
from trtpipe.pipeline.stages.tensorrt.compile import build_from_spec
from trtpipe.pipeline.stages.tensorrt.env import missing_for_target, probe_environment
from trtpipe.pipeline.stages.tensorrt.lower import TrtGraphs, drop_variant, duplicated_weight_bytes, lower_trt
from trtpipe.pipeline.stages.tensorrt.profiles import PlanSpec, check_profiles, profile_for
from trtpipe.pipeline.stages.tensorrt.spec import (
    SPEC_NAME,
    BuilderSettings,
    BuildSpec,
    LoweringVariants,
    SpecTarget,
    finish_command,
    finish_requirements,
    spec_dir_for,
    variants_summary,
)
from trtpipe.pipeline.stages.tensorrt.variant_gate import gate_requantized_variant, plugin_free_agreement_min
from trtpipe.pipeline.targets import GPU_BUILD_TARGETS
from trtpipe.plugins.core.versions import TRTPIPE_VERSION
from trtpipe.runtime.artifact.manifest import atomic_write_text, sha256_file

TIMING_CACHE_DIR = ".trt_timing_cache"  # beside the recipe folders: reused by every build of a target


def plans_for(recipe: Recipe, graphs: TrtGraphs, num_blocks: int) -> list[PlanSpec]:
    """One plan per graph (layout ``split``), or one ``engine`` plan per variant with a prefill and
    a decode profile over the prefill graph (layout ``dual_profile``)."""
    plans: list[PlanSpec] = []
    for variant in graphs.variants:
        if variant in graphs.variant_errors:
            continue
        sfx = "" if variant == graphs.variants[0] else f".{variant}"
        if recipe.engine.layout == "dual_profile":
            g = graphs.graphs[f"prefill{sfx}"]
            profs = tuple(
                profile_for(recipe, num_blocks, ph, g.input_dims, where=f"engine{sfx}.{ph}")
                for ph in ("prefill", "decode")
            )
            plans.append(PlanSpec(f"engine{sfx}", g.spec.file, profs))
            continue
        for ph in ("prefill", "decode"):
            g = graphs.graphs[f"{ph}{sfx}"]
            plans.append(
                PlanSpec(
                    f"{ph}{sfx}", g.spec.file, (profile_for(recipe, num_blocks, ph, g.input_dims, where=f"{ph}{sfx}"),)
                )
            )
    return plans


def _check_fp32_kv(recipe: Recipe) -> None:
    for phase in ("prefill", "decode"):
        if getattr(recipe.precision, phase) == "fp32" and recipe.kv_dtype != "fp32":
            raise BuildError(
                f"precision.{phase} = fp32 with kv_cache.dtype = {recipe.kv_dtype}: the TensorRT graphs "
                "read and write the pool in the activation dtype. Fix: set kv_cache.dtype: fp32 or "
                f"precision.{phase}: fp16."
            )


def _gate_plugin_free(
    recipe: Recipe,
    exported: ExportedGraphs,
    graphs: TrtGraphs,
    golden: dict,
    plans: list[PlanSpec],
    log: Callable[[str], None],
) -> tuple[list[PlanSpec], dict, dict]:
    """Measure and gate a plugin-free variant whose INT4 weights were changed; returns the plans
    kept, the variant notes and the agreement records. A refused second variant is dropped."""
    from trtpipe.pipeline.stages.tensorrt.variant_gate import has_asymmetric_int4

    ref_int4 = exported.references.get("int4")
    if (
        "plugin_free" not in graphs.variants
        or "plugin_free" in graphs.variant_errors
        or recipe.engine.plugin_free_int4 == "refuse"
        or ref_int4 is None
        or not has_asymmetric_int4(ref_int4)
    ):
        return plans, {}, {}
    t = time.perf_counter()
    record, refusal = gate_requantized_variant(recipe, ref_int4, golden, log=log)
    graphs.timings_s["plugin_free_agreement_s"] = time.perf_counter() - t
    if refusal is not None:
        if graphs.variants == ("plugin_free",):
            raise BuildError(f"the plugin-free lowering of recipe {recipe.name}: {refusal}")
        graphs.variant_errors["plugin_free"] = refusal
        log(f"  plugin_free variant not available: {refusal}")
        drop_variant(graphs, "plugin_free")
        return [p for p in plans if not p.name.endswith(".plugin_free")], {}, {"plugin_free": record}
    for k, g in graphs.graphs.items():
        if g.spec.lowering == "plugin_free":
            graphs.graphs[k] = replace(g, spec=replace(g.spec, int4_weights=recipe.engine.plugin_free_int4))
    note = (
        f"{record['weights']}; teacher-forced agreement {record['agreement']:.4f} ({record['agreeing_tokens']}) "
        f">= {record['minimum']} on the CPU reference"
    )
    return plans, {"plugin_free": note}, {"plugin_free": record}


def _recipe_text(recipe: Recipe) -> str:
    p = Path(recipe.origin)
    if p.is_file():
        return p.read_text(encoding="utf-8")
    import yaml

    return yaml.safe_dump(recipe.model_dump(mode="json", by_alias=True), sort_keys=False)


@dataclass(frozen=True)
class _Written:
    """What writing the spec folder produced, beside the graphs and plans."""

    variant_notes: dict[str, str]
    variant_agreement: dict[str, dict]
    shared: SharedInitializers
    duplicated_weights_bytes: int
    timings_s: dict[str, Any]


def _make_spec(
    recipe: Recipe,
    model: PreparedModel,
    graphs: TrtGraphs,
    plans: list[PlanSpec],
    final_dir: Path,
    inputs_hash: str,
    tmp: Path,
    written: _Written,
) -> BuildSpec:
    from trtpipe.plugins.ops.abi import op_schema_abi_hash, plugin_abi_hash

    t, eng = GPU_BUILD_TARGETS[recipe.target], recipe.engine
    variants = LoweringVariants(
        recipe.target,
        eng.plugin_free,
        eng.orin_trt_lt_10_7 if recipe.target == "orin" else None,
        tuple(v for v in graphs.variants if v not in graphs.variant_errors),
        graphs.variant_errors,
        written.variant_notes,
        written.variant_agreement,
        eng.plugin_free_int4,
        plugin_free_agreement_min(recipe),
    )
    return BuildSpec(
        TRTPIPE_VERSION,
        {"name": recipe.name, "hash": recipe_hash(recipe), "file": "recipe.yaml"},
        inputs_hash,
        f"../{final_dir.name}",
        f"../../{TIMING_CACHE_DIR}",
        SpecTarget(recipe.target, t.sm, t.platform, t.description),
        eng.layout,
        variants,
        BuilderSettings(eng.builder_optimization_level, eng.workspace_mib or t.workspace_mib),
        {k: replace(g.spec, sha256=sha256_file(tmp / g.spec.file)) for k, g in graphs.graphs.items()},
        tuple(plans),
        model.kv,
        model.config,
        {
            "max_seq_len": recipe.max_seq_len,
            "max_batch_size": recipe.max_batch_size,
            "max_num_tokens": recipe.max_num_tokens,
        },
        op_schema_abi_hash(),
        plugin_abi_hash(),
        written.shared,
        (tmp / DATA_FILE).stat().st_size,
        written.duplicated_weights_bytes,
        written.timings_s,
        str(model.loaded.source_path),
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        platform.node(),
    )


def write_build_spec(recipe: Recipe, final_dir: Path, inputs_hash: str, *, log: Callable[[str], None] = print) -> Path:
    """Load, export, lower, check profiles, record golden outputs and write the spec folder
    (atomically). Returns the spec file path. Raises :class:`BuildError` / :class:`RecipeError`
    (e.g. asymmetric INT4 with ``engine.plugin_free``, inconsistent profiles) before publishing."""
    spec_dir = spec_dir_for(final_dir)
    dual = recipe.engine.layout == "dual_profile"
    with staging_dir(spec_dir) as tmp:
        t = time.perf_counter()
        model = prepare_model(recipe, load_model(recipe), time.perf_counter() - t)
        _check_fp32_kv(recipe)
        exported = export_graphs(
            recipe,
            model,
            ("prefill",) if dual else ("prefill", "decode"),
            tmp,
            weight_precision=lambda p: "int4" if p == "int4" else "fp32",
            log=log,
        )
        graphs = lower_trt(recipe, exported, log=log)
        plans = plans_for(recipe, graphs, model.kv.num_blocks)
        check_profiles(
            [p for p in plans if "." not in p.name],
            {k: g.input_types for k, g in graphs.graphs.items() if "." not in k},
            recipe,
        )
        golden, golden_s = write_golden(recipe, model, exported, final_dir.parents[1], tmp, log=log)
        plans, notes, agreement = _gate_plugin_free(recipe, exported, graphs, golden, plans, log)
        t = time.perf_counter()
        dup = 0 if dual else duplicated_weight_bytes({k: g.model for k, g in graphs.graphs.items() if "." not in k})
        shared = write_graphs_shared({k: g.model for k, g in graphs.graphs.items()}, tmp)
        timings = {
            "load_s": model.load_s,
            **exported.timings_s,
            **graphs.timings_s,
            "golden_s": golden_s,
            "write_s": time.perf_counter() - t,
        }
        (tmp / "tokenizer.json").write_text(model.loaded.tokenizer_json or "", encoding="utf-8")
        (tmp / "recipe.yaml").write_text(_recipe_text(recipe), encoding="utf-8")
        spec = _make_spec(
            recipe, model, graphs, plans, final_dir, inputs_hash, tmp, _Written(notes, agreement, shared, dup, timings)
        )
        atomic_write_text(tmp / SPEC_NAME, json.dumps(spec.to_json(), indent=2))
        publish_dir(tmp, spec_dir)
    if dup and not dual:
        log(
            f"layout split: {dup / 2**20:.1f} MiB of weights are used by both graphs and held twice on the GPU "
            "(one copy per plan); layout dual_profile holds them once"
        )
    return spec_dir / SPEC_NAME


def _spec_is_current(spec_path: Path, recipe: Recipe, inputs_hash: str) -> bool:
    try:
        old = json.loads(spec_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    # the variant gate is in validate (not in the build hash): a changed minimum re-gates
    return old.get("inputs_hash") == inputs_hash and old.get("plugin_free_agreement_min") == plugin_free_agreement_min(
        recipe
    )


def build_gpu_target(
    recipe: Recipe, final_dir: Path, inputs_hash: str, *, force: bool = False, log: Callable[[str], None] = print
) -> BuildResult:
    """Write the spec (or reuse one with the same inputs hash unless ``force``), then build the
    plans here if this machine is the target. Raises :class:`BuildNeedsTarget` (spec written,
    plans not built: the message says why and how to finish), :class:`BuildError` or :class:`RecipeError`."""
    final_dir = Path(final_dir)
    spec_path = spec_dir_for(final_dir) / SPEC_NAME
    if not force and spec_path.is_file() and _spec_is_current(spec_path, recipe, inputs_hash):
        log(f"build spec up to date: {spec_path} (use --force to re-export)")
    else:
        spec_path = write_build_spec(recipe, final_dir, inputs_hash, log=log)
        log(f"wrote build spec {spec_path}")
    missing = missing_for_target(probe_environment(), recipe.target)
    if missing:
        files = ", ".join(sorted(p.name for p in spec_path.parent.iterdir()))
        t = GPU_BUILD_TARGETS[recipe.target]
        variants = LoweringVariants.from_json(json.loads(spec_path.read_text(encoding="utf-8")))
        raise BuildNeedsTarget(
            f"TensorRT plans for target {recipe.target} ({t.description}) cannot be built on this machine: "
            + "; ".join(missing)
            + ".\n"
            f"Exported and lowered graphs, golden outputs and the build spec are in {spec_path.parent} ({files}).\n"
            + variants_summary(variants)
            + "\n"
            f"Finish on the target ({finish_requirements(variants)}; see docs/tensorrt.md):\n"
            f"  {finish_command(spec_path)}",
            spec_path,
        )
    return build_from_spec(spec_path, log=log)
