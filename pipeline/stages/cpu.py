"""The CPU build (target ``cpu``): load -> export -> lower for ONNX Runtime -> package -> golden
-> manifest, into a staging folder that is published only when complete.

ONNX Runtime runs the lowered graphs as they are; where ``engine.cpu_backend`` resolves to
``native`` (:func:`choose_cpu_backend`), the native stage (``native.py``) adds the host CPU
kernels' weights and library beside them, and the runtime runs those.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from trtpipe.pipeline.artifact.identity import rebuild_command
from trtpipe.pipeline.model.step_bytes import decode_step_bytes
from trtpipe.pipeline.recipe import Recipe, build_fields, build_hash, recipe_hash
from trtpipe.pipeline.stages.errors import BuildError
from trtpipe.pipeline.stages.export import export_graphs
from trtpipe.pipeline.stages.golden.stage import GOLDEN_FILE, write_golden
from trtpipe.pipeline.stages.load import PreparedModel, load_model, prepare_model
from trtpipe.pipeline.stages.lower_ort import check_cpu_precisions, lower_ort
from trtpipe.pipeline.stages.native import native_support, write_native
from trtpipe.pipeline.stages.package import (
    DATA_FILE,
    SharedInitializers,
    publish_artifact,
    staging_dir,
    write_graphs_shared,
)
from trtpipe.plugins.core.versions import TRTPIPE_VERSION
from trtpipe.runtime.artifact.manifest import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    GraphEntry,
    Limits,
    Manifest,
    atomic_write_text,
    sha256_file,
)

TOKENIZER_FILE = "tokenizer.json"


def ort_decode_graph(recipe: Recipe) -> str:
    """The graph ONNX Runtime runs decode steps through (``engine.ort_sessions``): ``prefill``
    (one session) for ``one``, or for ``auto`` when both phases share a precision and a MatMulNBits
    accuracy level (the same graph would serve both); else ``decode``."""
    sessions = recipe.engine.ort_sessions
    same = recipe.precision.prefill == recipe.precision.decode and recipe.engine.accuracy_level(
        "prefill"
    ) == recipe.engine.accuracy_level("decode")
    return "prefill" if sessions == "one" or (sessions == "auto" and same) else "decode"


def graph_weight_read_bytes(model: Any) -> int:
    """Initializer bytes one run of ``model`` (an ``onnx.ModelProto``, initializers inline or
    external) reads: every initializer but those only ``Gather``-ed (an embedding table of which a
    step reads a few rows). The decode figure (``build_info.decode_weight_read_bytes``) is what
    the runtime's decode-bandwidth line divides by TPOT."""
    from onnx import numpy_helper

    consumers: dict[str, set[str]] = {}
    for n in model.graph.node:
        for x in n.input:
            consumers.setdefault(x, set()).add(n.op_type)
    total = 0
    for t in model.graph.initializer:
        if consumers.get(t.name, set()) == {"Gather"}:
            continue
        ext = {e.key: e.value for e in t.external_data}
        total += int(ext["length"]) if "length" in ext else numpy_helper.to_array(t).nbytes
    return total


def build_cpu(
    recipe: Recipe,
    final: Path,
    inputs_hash: str,
    artifact_root: Path,
    *,
    golden: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Build the ONNX Runtime artifact of ``recipe`` and publish it at ``final``. Returns the
    timings (seconds per stage). Raises :class:`BuildError` / :class:`RecipeError`; on any error
    the previous artifact is left as it was."""
    check_cpu_precisions(recipe)
    with staging_dir(final) as tmp:
        t = time.perf_counter()
        loaded = load_model(recipe)
        load_s = time.perf_counter() - t
        log(f"loaded {recipe.resolve_source().path.name} in {load_s:.1f} s")
        if loaded.source_kind == "gguf":  # what the file's own blocks cost a decode step, by GGUF type
            log(decode_step_bytes(loaded).summary())
        model = prepare_model(recipe, loaded, load_s)
        exported = export_graphs(recipe, model, ("prefill", "decode"), tmp, weight_precision=lambda p: p, log=log)
        lowered = lower_ort(recipe, exported)
        # the lowered graphs are copies: drop the raw ones before the golden stage, which needs only
        # the references (issue 44: they held a second copy of every weight through the build)
        exported = replace(exported, graphs={})
        timings: dict[str, Any] = {"load_s": load_s, **exported.timings_s, **lowered.timings_s}
        t = time.perf_counter()
        shared = write_graphs_shared(lowered.graphs, tmp)
        timings["write_s"] = time.perf_counter() - t
        (tmp / TOKENIZER_FILE).write_text(loaded.tokenizer_json or "", encoding="utf-8")
        if golden:
            timings["golden_s"] = write_golden(recipe, model, exported, artifact_root, tmp, log=log)[1]
        native = None
        chosen = choose_cpu_backend(recipe, model, log)
        if chosen is not None:
            t = time.perf_counter()
            native = write_native(model, tmp, *chosen, log=log)
            native["activation_levels"] = recipe.engine.cpu_activation_levels.model_dump()
            timings["native_s"] = time.perf_counter() - t
        decode_graph = lowered.graphs[ort_decode_graph(recipe)]
        manifest = cpu_manifest(
            recipe, model, tmp, inputs_hash, shared, artifact_root, timings, golden=golden, decode_graph=decode_graph,
            native=native,
        )  # fmt: skip
        atomic_write_text(tmp / MANIFEST_NAME, manifest.to_json())
        publish_artifact(tmp, final, log)
    return timings


def choose_cpu_backend(
    recipe: Recipe, model: PreparedModel, log: Callable[[str], None] = print
) -> tuple[str, Path] | None:
    """The ISA and compiled library of the native engine, or None for ONNX Runtime only
    (``engine.cpu_backend``: ``auto`` falls back with the reason printed; ``native`` raises
    :class:`BuildError` with it). Compiling is part of the choice: a compiler that cannot build
    the kernels (no OpenMP, an old gcc) is a reason like any other."""
    from trtpipe.plugins.core.errors import OpError
    from trtpipe.plugins.cpu.compile import compile_library, compiler
    from trtpipe.plugins.cpu.isa import resolve_isa

    setting = recipe.engine.cpu_backend
    if setting == "ort":
        return None
    isa = resolve_isa(recipe.engine.cpu_isa)
    reason = native_support(recipe, model)
    if reason is None and isa is None:
        reason = "this build machine runs neither avx512_vnni nor avx2 (set engine.cpu_isa to the target's)"
    if reason is None and compiler() is None:
        reason = "no C compiler on the build machine (install gcc)"
    if reason is None and isa is not None:
        try:
            return isa, compile_library(isa)
        except OpError as e:
            reason = str(e)
    if setting == "native":
        raise BuildError(f"engine.cpu_backend = native: {reason}. Fix: set engine.cpu_backend: auto (or ort).")
    log(f"engine: ONNX Runtime (the native CPU engine cannot run this build: {reason})")
    return None


def cpu_manifest(
    recipe: Recipe,
    model: PreparedModel,
    out_dir: Path,
    inputs_hash: str,
    shared: SharedInitializers,
    artifact_root: Path,
    timings: dict[str, Any],
    *,
    golden: bool,
    decode_graph: Any,
    native: dict[str, Any] | None = None,
) -> Manifest:
    """The manifest of a CPU artifact whose files are all in ``out_dir`` (hashed here);
    ``decode_graph``: the lowered graph that runs decode steps (its weight bytes are recorded)."""
    import onnxruntime

    from trtpipe.pipeline.stages.export import DECODE_INPUTS, PREFILL_INPUTS, kv_names
    from trtpipe.plugins.ops.abi import op_schema_abi_hash

    files = {p.name: sha256_file(p) for p in sorted(out_dir.iterdir()) if p.is_file()}
    past, present = kv_names(model.config.num_layers, recipe.kv_dtype)
    outputs = tuple(["logits"] + present)
    return Manifest(
        format_version=FORMAT_VERSION,
        trtpipe_version=TRTPIPE_VERSION,
        recipe_name=recipe.name,
        recipe_hash=recipe_hash(recipe),
        inputs_hash=inputs_hash,
        backend={"name": "ort", "version": onnxruntime.__version__, "provider": "CPUExecutionProvider"},
        target={"name": "cpu", "platform": platform.machine(), "sm": None},
        op_abi_hash=op_schema_abi_hash(),
        plugin_versions={"PagedAttention": "1", "Int4Gemm": "1"},
        model=model.config,
        kv=model.kv,
        graphs={
            "prefill": GraphEntry("prefill.onnx", recipe.precision.prefill, tuple(PREFILL_INPUTS + past), outputs),
            "decode": GraphEntry("decode.onnx", recipe.precision.decode, tuple(DECODE_INPUTS + past), outputs),
        },
        files=files,
        golden_file=GOLDEN_FILE if golden else None,
        limits=Limits(recipe.max_seq_len, recipe.max_batch_size, recipe.max_num_tokens),
        runtime_options={
            "shared_data_file": DATA_FILE,
            "shared_initializers": shared,
            "intra_op_num_threads": getattr(recipe.engine, "intra_op_num_threads", None),
            "ort_decode_graph": ort_decode_graph(recipe),
            "ort_fused_steps": recipe.engine.ort_fused_steps,
            "native": native,
        },
        build_info=_build_info(recipe, out_dir, artifact_root, timings, decode_graph, native),
    )


def _build_info(
    recipe: Recipe,
    out_dir: Path,
    artifact_root: Path,
    timings: dict[str, Any],
    decode_graph: Any,
    native: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The manifest's ``build_info``: how, where and from what the artifact was built."""
    ort_read = graph_weight_read_bytes(decode_graph)
    return {
        "build_hash": build_hash(recipe),
        "build_fields": build_fields(recipe),  # names the changed settings on a mismatch
        "rebuild_command": rebuild_command(recipe, artifact_root),
        "timings_s": timings,
        "model_source": str(recipe.resolve_source().path),
        "host": platform.node(),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "weights_bytes": (out_dir / DATA_FILE).stat().st_size,
        # what one decode step reads: native.bin whole (the head is the tied embedding) for the
        # native engine, else the decode graph's initializers
        "decode_weight_read_bytes": (out_dir / native["weights_file"]).stat().st_size if native else ort_read,
        "decode_weight_read_bytes_ort": ort_read,
    }
