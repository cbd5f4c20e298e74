"""Compile stage, TensorRT (on the target GPU): plans from a build spec, then the manifest.

Checks the machine against the spec's target (SM, platform, TensorRT), picks the lowering this
TensorRT can run (plugins need :data:`~trtpipe.plugins.core.versions.TRT_PLUGINS_REQUIREMENT`),
registers the plugins (AOT Triton kernels), builds one plan per :class:`PlanSpec` with polygraphy
(strongly typed network, profiles in order, workspace pool limit, builder optimization level,
timing cache) and publishes the artifact atomically.

Precision is carried by the graph's types (fp16/bf16 activations from the cast pass, INT4
weights as plugin inputs or blockwise ``DequantizeLinear``), so no precision flags are set.
"""

from __future__ import annotations

import platform
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from trtpipe.pipeline.stages.errors import BuildError
from trtpipe.pipeline.stages.package import publish_artifact, staging_dir
from trtpipe.pipeline.stages.records import BuildResult
from trtpipe.pipeline.stages.tensorrt.env import TrtEnvironment, missing_for_target, probe_environment
from trtpipe.pipeline.stages.tensorrt.profiles import PlanSpec
from trtpipe.pipeline.stages.tensorrt.spec import BuildSpec, LoweringVariants, finish_command, load_spec, read_spec_json
from trtpipe.plugins.core.versions import (
    TRT_PLUGINS_MIN_VERSION,
    TRT_PLUGINS_REQUIREMENT,
    TRTPIPE_VERSION,
    trt_has_python_plugins,
)
from trtpipe.runtime.artifact.manifest import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    GraphEntry,
    Limits,
    Manifest,
    atomic_write_text,
    load_manifest,
    sha256_file,
)

_PLUGINS_MIN = ".".join(map(str, TRT_PLUGINS_MIN_VERSION))  # "10.7"


def choose_lowering(v: LoweringVariants, trt_version: str) -> str:
    """ "plugins" or "plugin_free" for this TensorRT version, following the recipe.

    Raises :class:`BuildError` when the recipe's choice cannot work with this TensorRT."""
    if v.plugin_free:
        return "plugin_free"
    if trt_has_python_plugins(trt_version):
        return "plugins"
    if v.target == "orin" and v.orin_trt_lt_10_7 == "plugin_free":
        if "plugin_free" in v.variants:
            return "plugin_free"
        reason = v.variant_errors.get("plugin_free", "no plugin-free graphs in the spec")
        raise BuildError(
            f"TensorRT {trt_version} (< {_PLUGINS_MIN}, JetPack 6) has no Python plugins and the recipe "
            f"asks for the plugin-free lowering, which failed: {reason}"
        )
    key = "engine.orin_trt_lt_10_7: plugin_free" if v.target == "orin" else "engine.plugin_free: true"
    raise BuildError(
        f"TensorRT {trt_version} is older than {_PLUGINS_MIN} and has no Python plugins (tensorrt.plugin "
        f"with aot_impl), which this recipe uses. Fix: upgrade TensorRT (JetPack 7 on Orin), or set {key} "
        "in the recipe and rebuild the spec."
    )


def build_plan_polygraphy(
    graph: Path, plan: PlanSpec, *, workspace_mib: int, opt_level: int, timing_cache: Path
) -> tuple[bytes, float]:
    """One plan with polygraphy: strongly typed network, ``plan``'s profiles in order, workspace
    pool limit, builder optimization level, timing cache loaded and saved back.
    Returns (plan bytes, seconds). Raises :class:`BuildError` when TensorRT returns no plan."""
    import tensorrt as trt
    from polygraphy.backend.trt import CreateConfig, EngineBytesFromNetwork, NetworkFromOnnxPath

    t0 = time.perf_counter()
    timing_cache.parent.mkdir(parents=True, exist_ok=True)
    cache = str(timing_cache) if timing_cache.is_file() else None
    net = NetworkFromOnnxPath(str(graph), strongly_typed=True)
    cfg = CreateConfig(
        profiles=[p.to_polygraphy() for p in plan.profiles],
        memory_pool_limits={trt.MemoryPoolType.WORKSPACE: workspace_mib << 20},
        builder_optimization_level=opt_level,
        load_timing_cache=cache,
    )
    engine = EngineBytesFromNetwork(net, config=cfg, save_timing_cache=str(timing_cache))()
    if engine is None:
        raise BuildError(f"TensorRT failed to build {graph.name} (see the TensorRT log above)")
    return bytes(engine), time.perf_counter() - t0


def _register_plugins(spec: BuildSpec, env: TrtEnvironment) -> dict[str, str]:
    """Register the trtpipe plugins for the spec's SM; returns the versions of those its graphs use."""
    if env.triton_version is None:
        raise BuildError(
            "the plugin lowering compiles Triton kernels at build time, but `triton` is not "
            "installed. Fix: `pip install triton` (or set engine.plugin_free: true)."
        )
    from trtpipe.plugins.ops.trt_plugins import PLUGIN_VERSIONS, register_plugins

    try:
        import tensorrt.plugin as trtp  # noqa: F401
    except Exception as e:
        raise BuildError(
            f"TensorRT {env.trt_version}: `tensorrt.plugin` does not import ({e}). Fix: install a "
            f"{TRT_PLUGINS_REQUIREMENT} Python package, or use the plugin-free lowering."
        ) from e
    register_plugins(trtp, cc=spec.target.sm)
    used = {op for g in spec.graphs.values() if g.lowering == "plugins" for op in g.custom_nodes}
    return {k: v for k, v in PLUGIN_VERSIONS.items() if k in used}


def _build_plans(
    spec: BuildSpec, sdir: Path, tmp: Path, lowering: str, cache: Path, trt_version: str, log: Callable[[str], None]
) -> tuple[dict[str, dict], dict[str, float]]:
    """Build the plans of one lowering into ``tmp``. Returns (phase -> plan file, profile index,
    shapes) and the seconds per plan."""
    sfx = spec.lowering.suffix(lowering)
    profile_index: dict[str, dict] = {}
    timings: dict[str, float] = {}
    for p in spec.plans:
        if (sfx and not p.name.endswith(sfx)) or (not sfx and "." in p.name):
            continue  # the other lowering's plans
        base = p.name[: -len(sfx)] if sfx else p.name
        log(f"building {base}.plan ({lowering}, {len(p.profiles)} profile(s)) with TensorRT {trt_version} ...")
        plan, secs = build_plan_polygraphy(
            sdir / p.graph,
            p,
            workspace_mib=spec.builder.workspace_mib,
            opt_level=spec.builder.optimization_level,
            timing_cache=cache,
        )
        (tmp / f"{base}.plan").write_bytes(plan)
        timings[f"build_{base}_s"] = secs
        for i, prof in enumerate(p.profiles):
            profile_index[prof.phase] = {"plan": f"{base}.plan", "profile_index": i, "shapes": prof.shapes()}
    return profile_index, timings


def _trt_backend(spec: BuildSpec, env: TrtEnvironment, lowering: str, decode_graph: str) -> dict:
    """The manifest's ``backend`` record: TensorRT version, CUDA runtime, lowering, plugin ABI."""
    from trtpipe.plugins.ops.abi import plugin_abi_hash

    return {
        "name": "trt",
        "flavor": "tensorrt",
        "version": env.trt_version,
        "cuda_runtime": env.cuda_runtime,
        "lowering": lowering,
        "plugin_abi_hash": plugin_abi_hash(),
        "triton": env.triton_version if lowering == "plugins" else None,
        "int4_weights": spec.graphs[decode_graph].int4_weights or "as_exported",
    }


def _trt_build_info(
    spec: BuildSpec, spec_path: Path, tmp: Path, plan_files: set[str], cache: Path, timings: dict[str, float]
) -> dict:
    """The manifest's ``build_info`` record: timings (s), builder settings, sizes (bytes), host."""
    return {
        "timings_s": {**spec.timings_s, **timings},
        "builder": spec.builder.to_json(),
        "timing_cache": str(cache),
        "spec": str(spec_path),
        "host": platform.node(),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "weights_bytes": spec.weights_bytes,
        "duplicated_weights_bytes": spec.duplicated_weights_bytes,
        "plan_bytes": {f: (tmp / f).stat().st_size for f in plan_files},
    }


def _trt_manifest(
    spec: BuildSpec,
    spec_path: Path,
    env: TrtEnvironment,
    lowering: str,
    tmp: Path,
    profile_index: dict[str, dict],
    plugin_versions: dict[str, str],
    cache: Path,
    timings: dict[str, float],
) -> Manifest:
    sfx = spec.lowering.suffix(lowering)
    run_graph = {ph: ("prefill" if spec.layout == "dual_profile" else ph) + sfx for ph in ("prefill", "decode")}
    graphs = {
        ph: GraphEntry(
            profile_index[ph]["plan"], spec.graphs[g].precision, spec.graphs[g].inputs, spec.graphs[g].outputs
        )
        for ph, g in run_graph.items()
    }
    plan_files = {e.file for e in graphs.values()}
    return Manifest(
        format_version=FORMAT_VERSION,
        trtpipe_version=TRTPIPE_VERSION,
        recipe_name=spec.recipe["name"],
        recipe_hash=spec.recipe["hash"],
        inputs_hash=spec.inputs_hash,
        backend=_trt_backend(spec, env, lowering, run_graph["decode"]),
        target={"name": spec.target.name, "sm": env.gpu_sm, "platform": env.platform, "gpu": env.gpu_name},
        op_abi_hash=spec.op_abi_hash,
        plugin_versions=plugin_versions,
        model=spec.model,
        kv=spec.kv,
        graphs=graphs,
        files={p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()},
        limits=Limits.from_dict(spec.limits),
        runtime_options={
            "layout": spec.layout,
            "profiles": profile_index,
            "kv_in_place": lowering == "plugins",
            "graph_sha256": {k: g.sha256 for k, g in spec.graphs.items()},
        },
        build_info=_trt_build_info(spec, spec_path, tmp, plan_files, cache, timings),
    )


def build_from_spec(
    spec_path: str | Path, *, log: Callable[[str], None] = print, env: TrtEnvironment | None = None
) -> BuildResult:
    """Build the plans of a spec on this machine and write the artifact (atomically).

    Refuses (:class:`BuildError`) when TensorRT is missing, the GPU is not the target's SM, the
    platform differs, or the recipe's lowering cannot run on this TensorRT.
    """
    spec_path = Path(spec_path).resolve()
    tname = read_spec_json(spec_path)["target"]["name"]
    env = env or probe_environment()
    missing = missing_for_target(env, tname)
    if missing:
        raise BuildError(
            f"cannot build the {tname} plans here: "
            + "; ".join(missing)
            + f". Fix: run this on the target with TensorRT installed:\n  {finish_command(spec_path)}"
        )
    spec = load_spec(spec_path)
    sdir = spec_path.parent
    t_start = time.perf_counter()
    lowering = choose_lowering(spec.lowering, env.trt_version)
    plugin_versions = _register_plugins(spec, env) if lowering == "plugins" else {}
    final = (sdir / spec.artifact_dir).resolve()
    cache = (sdir / spec.timing_cache_dir).resolve() / f"{tname}-sm{env.gpu_sm}-trt{env.trt_version}-{lowering}.cache"
    with staging_dir(final) as tmp:
        profile_index, timings = _build_plans(spec, sdir, tmp, lowering, cache, env.trt_version, log)
        for f in ("tokenizer.json", "golden.json", "recipe.yaml"):
            shutil.copy2(sdir / f, tmp / f)
        manifest = _trt_manifest(spec, spec_path, env, lowering, tmp, profile_index, plugin_versions, cache, timings)
        atomic_write_text(tmp / MANIFEST_NAME, manifest.to_json())
        publish_artifact(tmp, final, log)
    if spec.layout == "split" and spec.duplicated_weights_bytes:
        log(f"layout split: {spec.duplicated_weights_bytes / 2**20:.1f} MiB of weights held twice (one copy per plan)")
    m = load_manifest(final, verify_hashes=False)
    log(f"built {final}")
    return BuildResult(final, False, time.perf_counter() - t_start, m, timings)
