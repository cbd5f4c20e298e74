"""``trtpipe build``: recipe -> artifact directory with manifest. One module per stage, each with
its real code; the TensorRT half in ``tensorrt/``::

    stage        module                 record in -> record out
    ─────────    ────────────────────   ──────────────────────────────────────────────────────────
    load         load.py                Recipe -> PreparedModel (config with overrides, KV pool,
                                        linear weights repacked per precision: model/quantize.py)
    export       export.py              PreparedModel -> ExportedGraphs (raw prefill/decode ONNX, references)
    lower        lower_ort.py           ExportedGraphs -> OrtGraphs                 (target cpu)
                 tensorrt/lower.py      ExportedGraphs -> TrtGraphs (per variant)   (orin, a100, h200)
    profiles     tensorrt/profiles.py   TrtGraphs -> PlanSpec (OptimizationProfile objects, checked)
    golden       golden/                PreparedModel -> golden.json (cached by content: golden/cache.py)
    gate         tensorrt/variant_gate.py  the plugin-free variant's weights, teacher-forced on the CPU
    package      package.py             graphs -> *.onnx + one weights.data; staging folder, atomic publish
    spec         tensorrt/spec.py       BuildSpec (GraphSpec, PlanSpec, LoweringVariants) <-> build_spec.json
    compile      tensorrt/compile.py    BuildSpec -> TensorRT plans + manifest      (on the target GPU)
                 tensorrt/rtx_smoke.py  plugin-free graphs -> TensorRT-RTX AOT check (CPU; engines discarded)

    composed by  cpu.py           (load, export, lower_ort, package, golden, manifest) and
                 tensorrt/gpu.py  (load, export, lower, profiles, golden, gate, package, spec, then compile)

Where an artifact lives and what decides a rebuild: :mod:`trtpipe.pipeline.artifact.identity`.
Atomicity: everything is written into ``.<target>.tmp-<pid>`` beside the final directory, which
is swapped in only when complete; a failed or interrupted build leaves the previous artifact
intact. Rebuilding with unchanged inputs (recipe build hash, model file, trtpipe version, op ABI
hash, ONNX Runtime version: :func:`inputs_hash`) is skipped unless ``force``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from trtpipe.pipeline.artifact.identity import artifact_dir_for, inputs_hash, rebuild_command, root_file_problem
from trtpipe.pipeline.recipe import Recipe
from trtpipe.pipeline.stages.errors import BuildError, BuildNeedsTarget
from trtpipe.pipeline.stages.golden import GOLDEN_PROMPTS, golden_for_build, reference_greedy
from trtpipe.pipeline.stages.load import load_model
from trtpipe.pipeline.stages.package import (
    DATA_FILE,
    keep_previous_reports,
    publish_artifact,
    remove_stale_temp_dirs,
    write_graphs_shared,
)
from trtpipe.pipeline.stages.records import BuildResult
from trtpipe.plugins.core.errors import TrtpipeError
from trtpipe.plugins.core.versions import TRTPIPE_VERSION
from trtpipe.runtime.artifact.manifest import MANIFEST_NAME, load_manifest

_remove_stale_temp_dirs = remove_stale_temp_dirs  # the name tests and older callers use


def _up_to_date(final: Path, ih: str, log: Callable[[str], None]):
    """The manifest of ``final`` when it is intact and was built from inputs hash ``ih``, else None."""
    if not (final / MANIFEST_NAME).is_file():
        return None
    try:
        m = load_manifest(final, verify_hashes=True)  # a corrupted artifact is rebuilt
    except TrtpipeError as e:
        log(f"rebuilding: the existing artifact is not usable ({e})")
        return None
    return m if m.inputs_hash == ih else None


def _check_not_another_recipes_artifact(recipe: Recipe, final: Path, force: bool, log: Callable[[str], None]) -> None:
    """A recipe file named otherwise than its recipe (tight.yaml, ``name: smollm2-135m-cpu``)
    builds into that recipe's artifact folder: say so, and refuse to replace an artifact built
    from other settings there unless ``force`` (raises :class:`BuildError` naming them)."""
    from trtpipe.pipeline.recipe import build_fields, changed_fields

    file = Path(recipe.origin).name
    log(f"note: {file} is recipe {recipe.name} (its name:), so it builds into {final}")
    try:
        built = load_manifest(final, verify_hashes=False).build_info.get("build_fields")
    except TrtpipeError:
        return  # nothing usable there to lose
    changed = changed_fields(built, build_fields(recipe)) if built else []
    if changed and not force:
        raise BuildError(
            f"{file} is named {recipe.name!r}, so it would replace recipe {recipe.name}'s artifact at {final}, "
            f"built from other settings ({'; '.join(changed[:3])}). Fix: set `name: {recipe.file_stem}` in "
            f"{file} (its own artifact), or pass --force to replace {recipe.name}'s artifact."
        )


def build(
    recipe: Recipe,
    artifact_root: str | Path = "artifacts",
    *,
    force: bool = False,
    log: Callable[[str], None] = print,
    golden: bool = True,
) -> BuildResult:
    """Build the artifact for ``recipe`` (see the module docstring): ONNX Runtime graphs for target
    cpu (:mod:`.cpu`), a build spec and TensorRT plans for GPU targets (:mod:`.gpu`).
    Raises :class:`BuildError` (:class:`BuildNeedsTarget`: spec written, finish on the target) or
    :class:`RecipeError`."""
    problem = root_file_problem(artifact_root)
    if problem is not None:
        raise BuildError(problem[0].upper() + problem[1:] + ".")
    t_start = time.perf_counter()
    final = artifact_dir_for(recipe, artifact_root)
    ih = inputs_hash(recipe, recipe.resolve_source().path)
    remove_stale_temp_dirs(final, log)
    if not force and (m := _up_to_date(final, ih, log)) is not None:
        log(f"up to date: {final} (inputs unchanged; use --force to rebuild)")
        return BuildResult(final, True, time.perf_counter() - t_start, m, {})
    if not recipe.named_as_file:
        _check_not_another_recipes_artifact(recipe, final, force, log)
    if recipe.target != "cpu":
        from trtpipe.pipeline.stages.tensorrt.gpu import build_gpu_target

        return build_gpu_target(recipe, final, ih, force=force, log=log)
    from trtpipe.pipeline.stages.cpu import build_cpu

    timings = build_cpu(recipe, final, ih, Path(artifact_root), golden=golden, log=log)
    return BuildResult(final, False, time.perf_counter() - t_start, load_manifest(final, verify_hashes=False), timings)


def __getattr__(name: str):
    """GPU-build names, imported on first use (they pull the TensorRT-side modules)."""
    if name in ("build_from_spec", "choose_lowering"):
        from trtpipe.pipeline.stages.tensorrt import compile as compile_trt

        return getattr(compile_trt, name)
    if name in ("build_gpu_target", "write_build_spec"):
        from trtpipe.pipeline.stages.tensorrt import gpu

        return getattr(gpu, name)
    if name == "ort_decode_graph":
        from trtpipe.pipeline.stages.cpu import ort_decode_graph

        return ort_decode_graph
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DATA_FILE",
    "GOLDEN_PROMPTS",
    "TRTPIPE_VERSION",
    "BuildError",
    "BuildNeedsTarget",
    "BuildResult",
    "artifact_dir_for",
    "build",
    "build_from_spec",
    "build_gpu_target",
    "golden_for_build",
    "inputs_hash",
    "keep_previous_reports",
    "load_model",
    "ort_decode_graph",
    "publish_artifact",
    "rebuild_command",
    "reference_greedy",
    "write_build_spec",
    "write_graphs_shared",
]
