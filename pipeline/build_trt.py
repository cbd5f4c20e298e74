"""``trtpipe build`` for GPU targets (orin, a100, h200): TensorRT plans through polygraphy.

Two halves, joined by a self-contained *build spec* folder, so that the heavy, torch-bound half
runs anywhere and the TensorRT half runs on the target::

    build_gpu_target (any machine: torch, onnx)            build_from_spec (the target GPU: tensorrt)
    ─────────────────────────────────────────────          ──────────────────────────────────────────
    load model -> export -> lower for TensorRT              check GPU == target SM, TensorRT version
      (plugins | plugin-free) -> cast fp16/bf16             pick lowering (plugins need TRT >= 10.7)
    profiles from the recipe, checked against the           register plugins (AOT Triton kernels)
      graphs and each other                                 polygraphy: profiles, pools, opt level,
    golden outputs, tokenizer                                 timing cache -> prefill/decode plans
    artifacts/<recipe>/<target>.spec/build_spec.json  ───►  artifacts/<recipe>/<target>/manifest.json

Where TensorRT or the target GPU is missing (this development machine, CI), the first half
writes the spec and stops with :class:`BuildNeedsTarget`, naming what is missing and the command
that finishes on the target. Nothing here ever writes a plan that TensorRT did not build.

Engine layouts (``engine.layout``): ``split`` builds the prefill graph and the decode graph into
two plans (weights used by both graphs are held twice; the build reports how many bytes) and
``dual_profile`` builds the prefill graph once with two optimization profiles (0 = prefill,
1 = decode: T = S, one token per sequence), run through two execution contexts.

Precision is carried by the graph's types (fp16/bf16 activations from the cast pass, INT4
weights as plugin inputs or blockwise ``DequantizeLinear``), so networks are built strongly
typed and no precision flags are set.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from trtpipe.pipeline.build import (TRTPIPE_VERSION, BuildError, BuildResult, _write_graphs_shared, publish_artifact,
                                    load_model)
from trtpipe.pipeline.golden import golden_for_build
from trtpipe.pipeline.variant_agreement import has_asymmetric_int4
from trtpipe.pipeline.recipe import Recipe, check_recipe_against_model, plan_kv_num_blocks, recipe_hash
from trtpipe.runtime.manifest import (FORMAT_VERSION, MANIFEST_NAME, GraphEntry, KVLayout, Manifest,
                                      atomic_write_text, load_manifest, sha256_file)

SPEC_NAME = "build_spec.json"
SPEC_VERSION = 1
DATA_FILE = "weights.data"
TIMING_CACHE_DIR = ".trt_timing_cache"  # beside the recipe folders: reused by every build of a target
MIN_TRT_FOR_PLUGINS = (10, 7)  # tensorrt.plugin with aot_impl (== trt_plugins.MIN_TRT_VERSION)


@dataclass(frozen=True)
class TargetInfo:
    """A GPU target: SM, CPU platform, and the default builder workspace limit."""

    sm: int
    platform: str
    workspace_mib: int
    description: str


TARGETS: dict[str, TargetInfo] = {
    "orin": TargetInfo(87, "aarch64", 2048, "Jetson AGX Orin (sm_87, unified LPDDR5)"),
    "a100": TargetInfo(80, "x86_64", 8192, "A100 (sm_80)"),
    "h200": TargetInfo(90, "x86_64", 16384, "H200 (sm_90)"),
}


class BuildNeedsTarget(BuildError):
    """The spec is written but this machine cannot build the plans (no TensorRT or no matching
    GPU). The message names what is missing and the command that finishes on the target."""

    def __init__(self, message: str, spec_path: Path):
        super().__init__(message)
        self.spec_path = spec_path


# ============================================================================================
# optimization profiles
# ============================================================================================

# dim_param names the exporter gives (pipeline/export.py) -> profile dimension
_DIM_NAMES = {"num_tokens": "T", "num_seqs": "S", "num_seqs + 1": "S+1", "max_blocks": "MB", "num_blocks": "NB"}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def profile_dims(recipe: Recipe, num_blocks: int, profile: str) -> dict[str, tuple[int, int, int]]:
    """(min, opt, max) of each dynamic dimension for one optimization profile.

    ``profile``: "prefill" (T = tokens, S = sequences, MB up to ceil(max_seq_len / block_size)) or
    "decode" (T = S = batch, MB from the decode context range). NB (the pool) is fixed."""
    p = recipe.resolved_profiles()
    bs = recipe.kv_cache.block_size
    mb_max = _cdiv(recipe.max_seq_len, bs)
    if profile == "prefill":
        t, s = p.prefill.tokens, p.prefill.sequences
        T = (t.min, t.opt, t.max)
        S = (s.min, s.opt, s.max)
        MB = (1, min(mb_max, max(1, _cdiv(t.opt, bs))), mb_max)
    elif profile == "decode":
        b, c = p.decode.batch, p.decode.context
        T = S = (b.min, b.opt, b.max)
        MB = (_cdiv(c.min, bs), _cdiv(c.opt, bs), _cdiv(c.max, bs))
    else:
        raise ValueError(f"profile must be 'prefill' or 'decode', got {profile!r}")
    return {"T": T, "S": S, "S+1": tuple(x + 1 for x in S), "MB": MB, "NB": (num_blocks,) * 3}


def input_shapes(inputs: list[tuple[str, list]], dims: dict[str, tuple[int, int, int]], *,
                 where: str) -> dict[str, list[list[int]]]:
    """Per graph input ``[min, opt, max]`` shapes from its dims (ints or dim_param names).

    Raises :class:`BuildError` for a dynamic dim the profile does not cover."""
    out = {}
    for name, shape in inputs:
        lo, opt, hi = [], [], []
        for d in shape:
            if isinstance(d, int) and d > 0:
                lo.append(d), opt.append(d), hi.append(d)
                continue
            key = _DIM_NAMES.get(str(d))
            if key is None:
                raise BuildError(f"{where}: input {name} has a dynamic dimension {d!r} that no optimization profile "
                                 f"covers (known: {sorted(_DIM_NAMES)}). Fix: re-export the graphs with this trtpipe.")
            a, b, c = dims[key]
            lo.append(a), opt.append(b), hi.append(c)
        out[name] = [lo, opt, hi]
    return out


@dataclass(frozen=True)
class EnginePlan:
    """One plan to build: its graph file and optimization profiles (phase -> input shapes)."""

    name: str  # "prefill" | "decode" | "engine"
    graph: str  # file in the spec folder
    profiles: tuple[tuple[str, dict[str, list[list[int]]]], ...]  # (("prefill", shapes), ("decode", shapes))


def check_profiles(plans: list[EnginePlan], graph_dtypes: dict[str, dict[str, int]], recipe: Recipe) -> None:
    """Check, before TensorRT does, that the profiles are usable and agree on shared dimensions.

    Checked (every problem reported at once, each naming the recipe key to change):
    - the scheduler's smallest batches fit: prefill tokens/sequences and decode batch ``min`` = 1;
    - within a profile, inputs sharing a dimension get the same range (T, S, S+1, MB);
    - across all profiles (both graphs, or both profiles of one plan): the KV pool inputs have
      the same shapes and dtypes, and the block-table width reaches the same maximum
      (both phases read the block tables of the same sequences).
    Raises :class:`BuildError`.
    """
    problems: list[str] = []
    rp = recipe.resolved_profiles()
    for key, value in (("profiles.prefill.tokens.min", rp.prefill.tokens.min),
                       ("profiles.prefill.sequences.min", rp.prefill.sequences.min),
                       ("profiles.decode.batch.min", rp.decode.batch.min)):
        if value != 1:
            problems.append(f"{key} = {value}: expected 1 (the scheduler sends a single token or sequence when only "
                            f"one is ready). Fix: set {key.rsplit('.', 1)[0]}.min: 1")
    pools: dict[str, tuple[str, list[list[int]]]] = {}
    widths: dict[str, int] = {}
    for plan in plans:
        for phase, shapes in plan.profiles:
            where = f"{plan.name} plan, {phase} profile"
            for name in ("input_ids", "positions", "slot_mapping"):
                if name in shapes and shapes[name] != shapes["input_ids"]:
                    problems.append(f"{where}: {name} {shapes[name]} differs from input_ids {shapes['input_ids']} "
                                    "(both are one entry per token)")
            for name, s in shapes.items():
                if name.startswith("past_"):
                    prev = pools.get(name)
                    if prev is not None and prev[1] != s:
                        problems.append(f"{where}: KV pool input {name} has shapes {s} but {prev[0]} has {prev[1]}; "
                                        "both engines must bind the same pool. Fix: rebuild the spec (one "
                                        "kv_cache setting feeds both graphs).")
                    pools.setdefault(name, (where, s))
            if "block_tables" in shapes:
                widths[where] = shapes["block_tables"][2][1]
    if len(set(widths.values())) > 1:
        desc = ", ".join(f"{w}: {v} blocks" for w, v in widths.items())
        bs = recipe.kv_cache.block_size
        problems.append(
            f"the profiles disagree on the block-table width (max blocks per sequence): {desc}. Both phases read the "
            f"block tables of the same sequences, up to max_seq_len {recipe.max_seq_len} / block_size {bs} = "
            f"{_cdiv(recipe.max_seq_len, bs)} blocks. Fix: set profiles.decode.context.max to {recipe.max_seq_len} "
            "(= max_seq_len).")
    dts = {g: {n: t for n, t in d.items() if n.startswith("past_")} for g, d in graph_dtypes.items()}
    if len({json.dumps(d, sort_keys=True) for d in dts.values()}) > 1:
        problems.append(f"the graphs disagree on the KV pool dtype ({ {g: sorted(set(d.values())) for g, d in dts.items()} }"
                        " as ONNX type ids). Fix: set kv_cache.dtype to the activation dtype of both phases.")
    if problems:
        raise BuildError("optimization profiles of recipe " + recipe.name + " cannot work:\n  - "
                         + "\n  - ".join(problems))


# ============================================================================================
# the TensorRT environment of this machine
# ============================================================================================


@dataclass(frozen=True)
class TrtEnvironment:
    """What this machine offers for a TensorRT build."""

    trt_version: str | None  # enterprise TensorRT, None when `import tensorrt` fails
    trt_error: str | None
    gpu_sm: int | None
    gpu_name: str | None
    cuda_runtime: str | None
    platform: str
    triton_version: str | None


def probe_environment() -> TrtEnvironment:
    """Import-probe TensorRT and query GPU 0 (ctypes CUDA runtime); never raises."""
    from trtpipe.runtime.cuda_device import cuda_device_info

    version = err = None
    try:
        import tensorrt as trt

        version = trt.__version__
    except Exception as e:  # ImportError, or OSError for a stub package without its libraries
        err = f"{type(e).__name__}: {e}"
    try:
        import triton

        tv = triton.__version__
    except Exception:
        tv = None
    dev = cuda_device_info()
    return TrtEnvironment(version, err, dev.sm if dev else None, dev.name if dev else None,
                          dev.runtime_version if dev else None, platform.machine(), tv)


def _missing(env: TrtEnvironment, target: str) -> list[str]:
    t = TARGETS[target]
    out = []
    if env.trt_version is None:
        out.append("the TensorRT Python package `tensorrt` is not importable here"
                   + (f" ({env.trt_error.splitlines()[0][:160]})" if env.trt_error else ""))
    if env.gpu_sm is None:
        out.append(f"no NVIDIA GPU is visible (target {target} needs an sm_{t.sm} GPU: TensorRT tunes the plans on it)")
    elif env.gpu_sm != t.sm:
        out.append(f"the GPU here is sm_{env.gpu_sm} ({env.gpu_name}), target {target} is sm_{t.sm}; plans are not "
                   "portable across GPU architectures")
    if env.platform != t.platform:
        out.append(f"this machine is {env.platform}, target {target} is {t.platform}")
    return out


# ============================================================================================
# first half: export, lower, spec
# ============================================================================================


def _io(model) -> tuple[list[tuple[str, list]], dict[str, int]]:
    ins, types = [], {}
    for vi in model.graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in vi.type.tensor_type.shape.dim]
        ins.append((vi.name, dims))
        types[vi.name] = vi.type.tensor_type.elem_type
    return ins, types


def _initializer_bytes(model) -> dict[str, tuple[str, int]]:
    """name -> (sha256 of the bytes, size) of a graph's initializers."""
    from onnx import numpy_helper

    out = {}
    for t in model.graph.initializer:
        raw = t.raw_data or numpy_helper.to_array(t).tobytes()
        out[t.name] = (hashlib.sha256(raw).hexdigest(), len(raw))
    return out


def duplicated_weight_bytes(models: dict[str, Any]) -> int:
    """Bytes of initializers (same name and bytes) that the prefill and decode graphs both hold:
    what the split layout stores twice on the GPU."""
    if "prefill" not in models or "decode" not in models:
        return 0
    a, b = _initializer_bytes(models["prefill"]), _initializer_bytes(models["decode"])
    return sum(size for name, (digest, size) in a.items() if b.get(name, (None,))[0] == digest)


def _recipe_text(recipe: Recipe) -> str:
    p = Path(recipe.origin)
    if p.is_file():
        return p.read_text(encoding="utf-8")
    import yaml

    return yaml.safe_dump(recipe.model_dump(mode="json", by_alias=True), sort_keys=False)


def spec_dir_for(final_dir: Path) -> Path:
    """``artifacts/<recipe>/<target>.spec`` beside the artifact folder."""
    return final_dir.with_name(final_dir.name + ".spec")


def _lower(model, recipe: Recipe, phase: str, plugin_free: bool, decode_graph: bool):
    from trtpipe.plugins.trt_lowering import lower_for_trt

    return lower_for_trt(model, dtype=recipe.activation_dtype(phase), plugin_free=plugin_free, decode=decode_graph,
                         kv_dtype=recipe.kv_dtype,
                         asymmetric_int4=recipe.engine.plugin_free_int4 if plugin_free else "refuse")


def _plugin_free_agreement_min(recipe: Recipe) -> float | None:
    c = recipe.validation.correctness
    return c.plugin_free_teacher_forced_agreement_min if c is not None else None


PLUGIN_FREE_INT4_WEIGHTS = {
    "requantize_symmetric": "int4 symmetric, re-quantized (least-squares scale per block) from the dequantized weights",
    "dequantize_float": "the dequantized INT4 weights stored in the activation dtype (float MatMul)",
}


def gate_requantized_variant(recipe: Recipe, ref_int4: Any, golden: dict, *,
                             log: Callable[[str], None] = print) -> tuple[dict, str | None]:
    """Measure the plugin-free variant's changed weights (``engine.plugin_free_int4``) against the
    golden outputs (teacher-forced, torch reference on the CPU:
    :mod:`trtpipe.pipeline.variant_agreement`) and gate them on
    ``validate.correctness.plugin_free_teacher_forced_agreement_min``.
    Returns (record for the spec, refusal reason or None)."""
    from trtpipe.pipeline.variant_agreement import requantized_reference, teacher_forced_agreement_dense

    c = recipe.validation.correctness
    mode = recipe.engine.plugin_free_int4
    minimum = _plugin_free_agreement_min(recipe)
    t = time.perf_counter()
    log(f"measuring the plugin-free variant's weights ({mode}): teacher-forced on {c.num_sequences} golden "
        f"sequences x {c.num_tokens} tokens (torch reference, fp32 activations, CPU) ...")
    ref = requantized_reference(ref_int4, mode, weight_dtype=recipe.activation_dtype("prefill"))
    a = teacher_forced_agreement_dense(ref, golden, c.num_sequences, c.num_tokens)
    record = {"agreement": round(a.value, 6), "agreeing_tokens": f"{a.agree}/{a.total}", "minimum": minimum,
              "weights": PLUGIN_FREE_INT4_WEIGHTS[mode],
              "method": "teacher-forced argmax vs the fp32 golden outputs; torch reference with the same weights, "
                        "fp32 activations, on the build machine's CPU (not TensorRT)",
              "seconds": round(time.perf_counter() - t, 1)}
    log(f"  plugin-free weights ({mode}): agreement {a.value:.4f} ({a.agree}/{a.total}) vs min {minimum}")
    if minimum is not None and a.value < minimum:
        other = "dequantize_float" if mode == "requantize_symmetric" else "a higher-precision phase"
        return record, (f"its weights ({PLUGIN_FREE_INT4_WEIGHTS[mode]}; engine.plugin_free_int4: {mode}) agree with "
                        f"the fp32 reference on {a.agree}/{a.total} = {a.value:.4f} teacher-forced tokens, below "
                        f"validate.correctness.plugin_free_teacher_forced_agreement_min = {minimum}. Fix: use {other}, "
                        "upgrade to TensorRT >= 10.7 (JetPack 7) for the plugins, or lower the minimum if this "
                        "agreement is acceptable.")
    return record, None


def write_build_spec(recipe: Recipe, final_dir: Path, inputs_hash: str, *, log: Callable[[str], None] = print) -> Path:
    """Export, lower and write the build spec folder (atomically). Returns the spec file path.

    Raises :class:`BuildError` / :class:`RecipeError` (e.g. asymmetric INT4 with
    ``engine.plugin_free``, inconsistent profiles) before anything is written.
    """
    import dataclasses

    import onnx

    from trtpipe.pipeline.export import export_phase
    from trtpipe.pipeline.model import build_reference_model
    from trtpipe.plugins.errors import OpError
    from trtpipe.plugins.schema import op_schema_abi_hash
    from trtpipe.plugins.trt_lowering import custom_nodes
    from trtpipe.plugins.versions import plugin_abi_hash

    target = TARGETS[recipe.target]
    eng = recipe.engine
    timings: dict[str, float] = {}
    spec_dir = spec_dir_for(final_dir)
    tmp = spec_dir.with_name(f".{spec_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        t = time.perf_counter()
        loaded = load_model(recipe)
        timings["load_s"] = time.perf_counter() - t
        config = loaded.config
        check_recipe_against_model(recipe, config)
        if recipe.sliding_window is not None:
            config = dataclasses.replace(config, layer_sliding_window=(recipe.sliding_window,) * config.num_layers)
        windows = set(config.layer_sliding_window)
        if len(windows) > 1:
            raise BuildError(f"model {config.name}: layers use different sliding windows {sorted(windows)}; the KV "
                             "manager handles one window per pool. Fix: set sliding_window in the recipe.")
        num_blocks = plan_kv_num_blocks(recipe, config)
        for phase in ("prefill", "decode"):
            if getattr(recipe.precision, phase) == "fp32" and recipe.kv_dtype != "fp32":
                raise BuildError(f"precision.{phase} = fp32 with kv_cache.dtype = {recipe.kv_dtype}: the TensorRT graphs "
                                 "read and write the pool in the activation dtype. Fix: set kv_cache.dtype: fp32 or "
                                 f"precision.{phase}: fp16.")
        dual = eng.layout == "dual_profile"
        phases = ("prefill",) if dual else ("prefill", "decode")
        # orin with TensorRT < 10.7 may need the plugin-free variant: lower both when asked
        variants = ["plugin_free"] if eng.plugin_free else ["plugins"]
        if recipe.target == "orin" and not eng.plugin_free and eng.orin_trt_lt_10_7 == "plugin_free":
            variants.append("plugin_free")
        refs: dict[str, Any] = {}
        lowered: dict[str, Any] = {}
        variant_errors: dict[str, str] = {}
        graphs_meta: dict[str, dict] = {}
        int4 = recipe.precision.int4
        for phase in phases:
            prec = getattr(recipe.precision, phase)
            weight_prec = "int4" if prec == "int4" else "fp32"  # fp16/bf16: exported fp32, cast after lowering
            if weight_prec not in refs:
                refs[weight_prec] = build_reference_model(loaded, weight_prec, int4.group_size, int4.symmetric,
                                                          rope_table_len=recipe.max_seq_len,
                                                          sliding_window=recipe.sliding_window)
            log(f"exporting {phase} ({prec}) ...")
            res = export_phase(refs[weight_prec], phase, tmp / f"{phase}.raw.onnx", recipe.kv_cache.block_size)
            timings[f"export_{phase}_s"] = res.seconds
            raw = onnx.load(str(res.path))
            for variant in variants:
                key = phase if variant == variants[0] else f"{phase}.{variant}"
                t = time.perf_counter()
                try:
                    m = _lower(raw, recipe, phase, variant == "plugin_free", decode_graph=(phase == "decode"))
                except OpError as e:
                    if variant == variants[0]:
                        raise BuildError(f"lowering the {phase} graph for TensorRT ({variant}): {e}") from None
                    variant_errors[variant] = f"{phase}: {e}"
                    log(f"  {variant} variant of {phase} not available: {e}")
                    continue
                timings[f"lower_{key}_s"] = time.perf_counter() - t
                lowered[key] = m
                ins, types = _io(m)
                graphs_meta[key] = {"file": f"{key}.onnx", "phase": phase, "precision": prec,
                                    "dtype": recipe.activation_dtype(phase), "lowering": variant,
                                    "decode_kernel": phase == "decode", "inputs": [n for n, _ in ins],
                                    "outputs": [o.name for o in m.graph.output], "input_dims": ins,
                                    "input_types": types, "custom_nodes": sorted({op for op, _ in custom_nodes(m)})}
            res.path.unlink()
            (tmp / (res.path.name + ".data")).unlink(missing_ok=True)
        for k in list(variant_errors):  # a variant is usable only if every phase lowered
            for phase in phases:
                lowered.pop(f"{phase}.{k}", None)
                graphs_meta.pop(f"{phase}.{k}", None)

        # optimization profiles, checked before anything else is written
        plans: list[EnginePlan] = []
        for variant in variants:
            if variant in variant_errors:
                continue
            sfx = "" if variant == variants[0] else f".{variant}"
            if dual:
                g = graphs_meta[f"prefill{sfx}"]
                profs = tuple((ph, input_shapes(g["input_dims"], profile_dims(recipe, num_blocks, ph),
                                                where=f"engine{sfx}.{ph}")) for ph in ("prefill", "decode"))
                plans.append(EnginePlan(f"engine{sfx}", g["file"], profs))
            else:
                for ph in phases:
                    g = graphs_meta[f"{ph}{sfx}"]
                    plans.append(EnginePlan(f"{ph}{sfx}", g["file"], ((ph, input_shapes(
                        g["input_dims"], profile_dims(recipe, num_blocks, ph), where=f"{ph}{sfx}")),)))
        check_profiles([p for p in plans if "." not in p.name],
                       {k: v["input_types"] for k, v in graphs_meta.items() if "." not in k}, recipe)

        t = time.perf_counter()
        golden, _ = golden_for_build(
            loaded, recipe.sliding_window, recipe.validation.correctness.num_tokens,
            lambda: refs.get("fp32") or build_reference_model(loaded, "fp32", rope_table_len=recipe.max_seq_len,
                                                              sliding_window=recipe.sliding_window),
            final_dir.parents[1], log=log)
        (tmp / "golden.json").write_text(json.dumps(golden), encoding="utf-8")
        timings["golden_s"] = time.perf_counter() - t
        variant_agreement: dict[str, dict] = {}
        variant_notes: dict[str, str] = {}
        requantized = ("plugin_free" in variants and "plugin_free" not in variant_errors
                       and eng.plugin_free_int4 != "refuse" and "int4" in refs
                       and has_asymmetric_int4(refs["int4"]))
        if requantized:
            t = time.perf_counter()
            record, refusal = gate_requantized_variant(recipe, refs["int4"], golden, log=log)
            timings["plugin_free_agreement_s"] = time.perf_counter() - t
            variant_agreement["plugin_free"] = record
            if refusal is not None:
                if variants == ["plugin_free"]:
                    raise BuildError(f"the plugin-free lowering of recipe {recipe.name}: {refusal}")
                variant_errors["plugin_free"] = refusal
                log(f"  plugin_free variant not available: {refusal}")
                plans = [p for p in plans if not p.name.endswith(".plugin_free")]
                for k in [k for k in lowered if k.endswith(".plugin_free")]:
                    lowered.pop(k), graphs_meta.pop(k)
            else:
                variant_notes["plugin_free"] = (f"{record['weights']}; teacher-forced agreement "
                                                f"{record['agreement']:.4f} ({record['agreeing_tokens']}) >= "
                                                f"{record['minimum']} on the CPU reference")
                for k, meta in graphs_meta.items():
                    if meta["lowering"] == "plugin_free":
                        meta["int4_weights"] = eng.plugin_free_int4
        t = time.perf_counter()
        dup = 0 if dual else duplicated_weight_bytes({k: v for k, v in lowered.items() if "." not in k})
        shared = _write_graphs_shared(lowered, tmp)
        timings["write_s"] = time.perf_counter() - t
        (tmp / "tokenizer.json").write_text(loaded.tokenizer_json or "", encoding="utf-8")
        (tmp / "recipe.yaml").write_text(_recipe_text(recipe), encoding="utf-8")
        for meta in graphs_meta.values():
            meta["sha256"] = sha256_file(tmp / meta["file"])
        kv = KVLayout(block_size=recipe.kv_cache.block_size, num_blocks=num_blocks,
                      dtype={"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[recipe.kv_dtype],
                      layer_num_kv_heads=tuple(config.layer_num_kv_heads), head_dim=config.head_dim,
                      sliding_window=next(iter(windows)))
        spec = {
            "spec_version": SPEC_VERSION,
            "trtpipe_version": TRTPIPE_VERSION,
            "recipe": {"name": recipe.name, "hash": recipe_hash(recipe), "file": "recipe.yaml"},
            "inputs_hash": inputs_hash,
            "artifact_dir": f"../{final_dir.name}",
            "timing_cache_dir": f"../../{TIMING_CACHE_DIR}",
            "target": {"name": recipe.target, "sm": target.sm, "platform": target.platform,
                       "description": target.description},
            "layout": eng.layout,
            "plugin_free": eng.plugin_free,
            "orin_trt_lt_10_7": eng.orin_trt_lt_10_7 if recipe.target == "orin" else None,
            "variants": [v for v in variants if v not in variant_errors],
            "variant_errors": variant_errors,
            "variant_notes": variant_notes,
            "variant_agreement": variant_agreement,
            "plugin_free_int4": eng.plugin_free_int4,
            "plugin_free_agreement_min": _plugin_free_agreement_min(recipe),
            "builder": {"optimization_level": eng.builder_optimization_level,
                        "workspace_mib": eng.workspace_mib or target.workspace_mib,
                        "strongly_typed": True, "precision_flags": []},
            "graphs": {k: {kk: vv for kk, vv in v.items() if kk not in ("input_dims", "input_types")}
                       for k, v in graphs_meta.items()},
            "plans": [{"name": p.name, "graph": p.graph, "profiles": [{"phase": ph, "shapes": s} for ph, s in p.profiles]}
                      for p in plans],
            "kv": {**kv.__dict__, "layer_num_kv_heads": list(kv.layer_num_kv_heads)},
            "model": config.to_dict(),
            "limits": {"max_seq_len": recipe.max_seq_len, "max_batch_size": recipe.max_batch_size,
                       "max_num_tokens": recipe.max_num_tokens},
            "op_abi_hash": op_schema_abi_hash(),
            "plugin_abi_hash": plugin_abi_hash(),
            "shared_initializers": shared,
            "weights_bytes": (tmp / DATA_FILE).stat().st_size,
            "duplicated_weights_bytes": dup,
            "timings_s": timings,
            "model_source": str(loaded.source_path),
            "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "host": platform.node(),
        }
        atomic_write_text(tmp / SPEC_NAME, json.dumps(spec, indent=2))
        old = spec_dir.with_name(f".{spec_dir.name}.old-{os.getpid()}")
        if spec_dir.exists():
            os.replace(spec_dir, old)
        os.replace(tmp, spec_dir)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if dup and not dual:
        log(f"layout split: {dup / 2**20:.1f} MiB of weights are used by both graphs and held twice on the GPU "
            "(one copy per plan); layout dual_profile holds them once")
    return spec_dir / SPEC_NAME


def finish_command(spec_path: Path) -> str:
    """The command that finishes a build from its spec on the target."""
    d = spec_path.parent
    return f"trtpipe build {d / 'recipe.yaml'} --from-spec {spec_path}"


def variants_summary(spec: dict) -> str:
    """One line per lowering variant of a spec: built (with what it needs), or refused with its
    full reason (never cut: the console is where a user reads it)."""
    lines = []
    for v in spec.get("variants", []):
        need = ("TensorRT >= 10.7 (Python plugins)" if v == "plugins"
                else "any TensorRT 10.x, JetPack 6 included (no plugins)")
        note = spec.get("variant_notes", {}).get(v)
        lines.append(f"  variant {v}: in the spec; runs on {need}" + (f"; {note}" if note else ""))
    for v, reason in spec.get("variant_errors", {}).items():
        lines.append(f"  variant {v}: NOT in the spec: {reason}")
    return "Variants:\n" + "\n".join(lines)


def finish_requirements(spec: dict) -> str:
    """What the target needs to finish ``spec``: the plugin-free graphs on older TensorRT are
    offered only when the spec carries them."""
    plugins = f"TensorRT >= {'.'.join(map(str, MIN_TRT_FOR_PLUGINS))} with Python plugins"
    variants = spec.get("variants", [])
    if variants == ["plugin_free"]:
        return "TensorRT 10.x; the graphs are plugin-free"
    if "plugin_free" in variants:
        return plugins + ", or TensorRT < 10.7 (JetPack 6) with the plugin-free graphs"
    return plugins


def build_gpu_target(recipe: Recipe, final_dir: Path, inputs_hash: str, *, force: bool = False,
                     log: Callable[[str], None] = print) -> BuildResult:
    """Export + lower + spec, then build the plans here if this machine is the target.

    Reuses an existing spec with the same inputs hash unless ``force``. Raises
    :class:`BuildNeedsTarget` (spec written, plans not built: the message says why and how to
    finish), :class:`BuildError` or :class:`RecipeError`.
    """
    final_dir = Path(final_dir)
    spec_path = spec_dir_for(final_dir) / SPEC_NAME
    reuse = False
    if not force and spec_path.is_file():
        try:
            old = json.loads(spec_path.read_text(encoding="utf-8"))
            # the variant gate is in validate (not in the build hash): a changed minimum re-gates
            reuse = (old.get("inputs_hash") == inputs_hash
                     and old.get("plugin_free_agreement_min") == _plugin_free_agreement_min(recipe))
        except (OSError, ValueError):
            reuse = False
    if reuse:
        log(f"build spec up to date: {spec_path} (use --force to re-export)")
    else:
        spec_path = write_build_spec(recipe, final_dir, inputs_hash, log=log)
        log(f"wrote build spec {spec_path}")
    env = probe_environment()
    missing = _missing(env, recipe.target)
    if missing:
        files = ", ".join(sorted(p.name for p in spec_path.parent.iterdir()))
        t = TARGETS[recipe.target]
        spec = json.loads(spec_path.read_text(encoding="utf-8"))
        raise BuildNeedsTarget(
            f"TensorRT plans for target {recipe.target} ({t.description}) cannot be built on this machine: "
            + "; ".join(missing) + ".\n"
            f"Exported and lowered graphs, golden outputs and the build spec are in {spec_path.parent} ({files}).\n"
            + variants_summary(spec) + "\n"
            f"Finish on the target ({finish_requirements(spec)}; see docs/tensorrt.md):\n"
            f"  {finish_command(spec_path)}", spec_path)
    return build_from_spec(spec_path, log=log)


# ============================================================================================
# second half: plans from a spec (on the target)
# ============================================================================================


def _version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for x in v.split(".")[:3]:
        digits = "".join(ch for ch in x if ch.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


def choose_lowering(spec: dict, trt_version: str) -> str:
    """"plugins" or "plugin_free" for this TensorRT version, following the recipe.

    Raises :class:`BuildError` when the recipe's choice cannot work with this TensorRT."""
    has_plugins = _version_tuple(trt_version)[:2] >= MIN_TRT_FOR_PLUGINS
    variants = spec.get("variants", [])
    if spec.get("plugin_free"):
        return "plugin_free"
    if has_plugins:
        return "plugins"
    target = spec["target"]["name"]
    if target == "orin" and spec.get("orin_trt_lt_10_7") == "plugin_free":
        if "plugin_free" in variants:
            return "plugin_free"
        reason = spec.get("variant_errors", {}).get("plugin_free", "no plugin-free graphs in the spec")
        raise BuildError(f"TensorRT {trt_version} (< 10.7, JetPack 6) has no Python plugins and the recipe asks for the "
                         f"plugin-free lowering, which failed: {reason}")
    key = "engine.orin_trt_lt_10_7: plugin_free" if target == "orin" else "engine.plugin_free: true"
    raise BuildError(f"TensorRT {trt_version} is older than 10.7 and has no Python plugins (tensorrt.plugin with "
                     f"aot_impl), which this recipe uses. Fix: upgrade TensorRT (JetPack 7 on Orin), or set {key} in "
                     "the recipe and rebuild the spec.")


def _load_spec(spec_path: Path) -> dict:
    try:
        spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BuildError(f"cannot read build spec {spec_path}: {e}. Fix: rerun `trtpipe build RECIPE` to write it.") from e
    if spec.get("spec_version") != SPEC_VERSION:
        raise BuildError(f"build spec {spec_path} has version {spec.get('spec_version')}, this trtpipe reads "
                         f"{SPEC_VERSION}. Fix: rewrite it with this trtpipe (`trtpipe build RECIPE --force`).")
    return spec


def _build_plan_polygraphy(graph: Path, profiles: list[dict], *, workspace_mib: int, opt_level: int,
                           timing_cache: Path) -> tuple[bytes, float]:
    """One plan with polygraphy: strongly typed network, profiles in order, workspace pool limit,
    builder optimization level, timing cache loaded and saved back. Returns (plan bytes, seconds)."""
    import tensorrt as trt
    from polygraphy.backend.trt import CreateConfig, EngineBytesFromNetwork, NetworkFromOnnxPath, Profile

    t0 = time.perf_counter()
    profs = []
    for p in profiles:
        prof = Profile()
        for name, (lo, opt, hi) in p["shapes"].items():
            prof.add(name, lo, opt, hi)
        profs.append(prof)
    timing_cache.parent.mkdir(parents=True, exist_ok=True)
    cache = str(timing_cache) if timing_cache.is_file() else None
    net = NetworkFromOnnxPath(str(graph), strongly_typed=True)
    cfg = CreateConfig(profiles=profs, memory_pool_limits={trt.MemoryPoolType.WORKSPACE: workspace_mib << 20},
                       builder_optimization_level=opt_level, load_timing_cache=cache)
    plan = EngineBytesFromNetwork(net, config=cfg, save_timing_cache=str(timing_cache))()
    if plan is None:
        raise BuildError(f"TensorRT failed to build {graph.name} (see the TensorRT log above)")
    return bytes(plan), time.perf_counter() - t0


def build_from_spec(spec_path: str | Path, *, log: Callable[[str], None] = print,
                    env: TrtEnvironment | None = None) -> BuildResult:
    """Build the plans of a spec on this machine and write the artifact (atomically).

    Refuses (:class:`BuildError`) when TensorRT is missing, the GPU is not the target's SM, the
    platform differs, or the recipe's lowering cannot run on this TensorRT.
    """
    spec_path = Path(spec_path).resolve()
    spec = _load_spec(spec_path)
    sdir = spec_path.parent
    env = env or probe_environment()
    tname = spec["target"]["name"]
    missing = _missing(env, tname)
    if missing:
        raise BuildError(f"cannot build the {tname} plans here: " + "; ".join(missing)
                         + f". Fix: run this on the target with TensorRT installed:\n  {finish_command(spec_path)}")
    t_start = time.perf_counter()
    lowering = choose_lowering(spec, env.trt_version)
    sfx = "" if spec["variants"][0] == lowering else f".{lowering}"
    plugin_versions: dict[str, str] = {}
    if lowering == "plugins":
        if env.triton_version is None:
            raise BuildError("the plugin lowering compiles Triton kernels at build time, but `triton` is not "
                             "installed. Fix: `pip install triton` (or set engine.plugin_free: true).")
        from trtpipe.plugins.trt_plugins import PLUGIN_VERSIONS, register_plugins

        try:
            import tensorrt.plugin as trtp  # noqa: F401
        except Exception as e:
            raise BuildError(f"TensorRT {env.trt_version}: `tensorrt.plugin` does not import ({e}). Fix: install a "
                             "TensorRT >= 10.7 Python package, or use the plugin-free lowering.") from e
        register_plugins(trtp, cc=spec["target"]["sm"])
        used = set()
        for g in spec["graphs"].values():
            if g["lowering"] == "plugins":
                used.update(g["custom_nodes"])
        plugin_versions = {k: v for k, v in PLUGIN_VERSIONS.items() if k in used}
    final = (sdir / spec["artifact_dir"]).resolve()
    cache = (sdir / spec["timing_cache_dir"]).resolve() / (
        f"{tname}-sm{env.gpu_sm}-trt{env.trt_version}-{lowering}.cache")
    b = spec["builder"]
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    timings: dict[str, float] = {}
    try:
        plan_files: dict[str, str] = {}
        profile_index: dict[str, dict] = {}
        for p in spec["plans"]:
            name = p["name"]
            if (sfx and not name.endswith(sfx)) or (not sfx and "." in name):
                continue  # the other lowering's plans
            base = name[: -len(sfx)] if sfx else name
            log(f"building {base}.plan ({lowering}, {len(p['profiles'])} profile(s)) with TensorRT {env.trt_version} ...")
            plan, secs = _build_plan_polygraphy(sdir / p["graph"], p["profiles"], workspace_mib=b["workspace_mib"],
                                                opt_level=b["optimization_level"], timing_cache=cache)
            (tmp / f"{base}.plan").write_bytes(plan)
            timings[f"build_{base}_s"] = secs
            for i, prof in enumerate(p["profiles"]):
                plan_files[prof["phase"]] = f"{base}.plan"
                profile_index[prof["phase"]] = {"plan": f"{base}.plan", "profile_index": i, "shapes": prof["shapes"]}
        for f in ("tokenizer.json", "golden.json", "recipe.yaml"):
            shutil.copy2(sdir / f, tmp / f)
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        kv = dict(spec["kv"])
        kv["layer_num_kv_heads"] = tuple(kv["layer_num_kv_heads"])
        from trtpipe.plugins.versions import plugin_abi_hash
        from trtpipe.runtime.model_config import ModelConfig

        graphs = {}
        for phase in ("prefill", "decode"):  # dual_profile: both phases run the prefill graph's plan
            g = spec["graphs"][("prefill" if spec["layout"] == "dual_profile" else phase) + sfx]
            graphs[phase] = GraphEntry(plan_files[phase], g["precision"], tuple(g["inputs"]), tuple(g["outputs"]))
        manifest = Manifest(
            format_version=FORMAT_VERSION, trtpipe_version=TRTPIPE_VERSION, recipe_name=spec["recipe"]["name"],
            recipe_hash=spec["recipe"]["hash"], inputs_hash=spec["inputs_hash"],
            backend={"name": "trt", "flavor": "tensorrt", "version": env.trt_version,
                     "cuda_runtime": env.cuda_runtime, "lowering": lowering, "plugin_abi_hash": plugin_abi_hash(),
                     "triton": env.triton_version if lowering == "plugins" else None,
                     "int4_weights": spec["graphs"][("prefill" if spec["layout"] == "dual_profile" else "decode")
                                                    + sfx].get("int4_weights", "as_exported")},
            target={"name": tname, "sm": env.gpu_sm, "platform": env.platform, "gpu": env.gpu_name},
            op_abi_hash=spec["op_abi_hash"], plugin_versions=plugin_versions,
            model=ModelConfig.from_dict(spec["model"]), kv=KVLayout(**kv), graphs=graphs, files=files,
            limits=spec["limits"],
            runtime_options={"layout": spec["layout"], "profiles": profile_index,
                             "kv_in_place": lowering == "plugins",
                             "graph_sha256": {k: v["sha256"] for k, v in spec["graphs"].items()}},
            build_info={"timings_s": {**spec.get("timings_s", {}), **timings}, "builder": b,
                        "timing_cache": str(cache), "spec": str(spec_path), "host": platform.node(),
                        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        "weights_bytes": spec.get("weights_bytes"),
                        "duplicated_weights_bytes": spec.get("duplicated_weights_bytes", 0),
                        "plan_bytes": {f: (tmp / f).stat().st_size for f in set(plan_files.values())}},
        )
        atomic_write_text(tmp / MANIFEST_NAME, manifest.to_json())
        publish_artifact(tmp, final, log)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if spec["layout"] == "split" and spec.get("duplicated_weights_bytes"):
        log(f"layout split: {spec['duplicated_weights_bytes'] / 2**20:.1f} MiB of weights held twice (one copy per plan)")
    m = load_manifest(final, verify_hashes=False)
    log(f"built {final}")
    return BuildResult(final, False, time.perf_counter() - t_start, m, timings)


# ============================================================================================
# TensorRT-RTX smoke build (CPU, ahead of time): parser + builder check of plugin-free graphs
# ============================================================================================

RTX_SMS = (75, 80, 86, 89, 120)


@dataclass(frozen=True)
class SmokeResult:
    ok: bool
    seconds: float
    engine_bytes: int  # size of the RTX engine built in memory (discarded: not a TensorRT plan)
    log_tail: str


def rtx_smoke_build(graph: str | Path, profiles: list[dict[str, list[list[int]]]], *, sm: int = 80,
                    opt_level: int = 3, timeout_s: float = 900) -> SmokeResult:
    """Parse and build ``graph`` ahead of time for ``sm`` with TensorRT-RTX through polygraphy,
    with ``profiles`` (one ``{input: [min, opt, max]}`` per optimization profile)
    (``POLYGRAPHY_USE_TENSORRT_RTX=1``), in a subprocess: polygraphy picks its TensorRT module
    at import time, and a plugin node can abort the process. The engine bytes are discarded
    (an RTX engine is not a TensorRT plan). Raises :class:`BuildError` for an SM RTX cannot
    target."""
    if sm not in RTX_SMS:
        raise BuildError(f"TensorRT-RTX builds ahead of time for sm {list(RTX_SMS)}, not sm_{sm} "
                         "(no sm_87 Orin or sm_90 H200): use sm 80 for the smoke build")
    env = dict(os.environ, POLYGRAPHY_USE_TENSORRT_RTX="1")
    cmd = [sys.executable, "-m", "trtpipe.pipeline.build_trt", "rtx-smoke", str(graph), "--sm", str(sm),
           "--opt-level", str(opt_level), "--profiles", json.dumps(profiles)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    out = proc.stdout + proc.stderr
    nbytes = 0
    for line in out.splitlines():
        if line.startswith("RTX_SMOKE_OK "):
            nbytes = int(line.split()[1])
    return SmokeResult(proc.returncode == 0 and nbytes > 0, time.perf_counter() - t0, nbytes, out[-4000:])


def _rtx_smoke_main(graph: str, sm: int, opt_level: int, profiles: list[dict]) -> int:
    if os.environ.get("POLYGRAPHY_USE_TENSORRT_RTX", "0") == "0":
        print("set POLYGRAPHY_USE_TENSORRT_RTX=1", file=sys.stderr)
        return 2
    from polygraphy.backend.tensorrt_rtx import CreateConfigRTX
    from polygraphy.backend.trt import EngineBytesFromNetwork, NetworkFromOnnxPath, Profile

    profs = []
    for shapes in profiles:
        prof = Profile()
        for name, (lo, opt, hi) in shapes.items():
            prof.add(name, lo, opt, hi)
        profs.append(prof)
    major, minor = divmod(sm, 10)  # 80 -> (8, 0), 120 -> (12, 0)
    net = NetworkFromOnnxPath(graph, strongly_typed=True)
    cfg = CreateConfigRTX(profiles=profs, compute_capabilities=[(major, minor)], builder_optimization_level=opt_level)
    engine = EngineBytesFromNetwork(net, config=cfg)()
    if engine is None:
        return 1
    print(f"RTX_SMOKE_OK {engine.nbytes}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m trtpipe.pipeline.build_trt rtx-smoke GRAPH --profiles JSON [--sm 80]`` (used by
    :func:`rtx_smoke_build`) and ``... rtx-smoke-spec SPEC`` (every plugin-free plan of a spec)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m trtpipe.pipeline.build_trt")
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("rtx-smoke", help="build one graph with TensorRT-RTX (needs POLYGRAPHY_USE_TENSORRT_RTX=1)")
    a.add_argument("graph")
    a.add_argument("--profiles", required=True, help="JSON [{input: [[min], [opt], [max]]}, ...]")
    a.add_argument("--sm", type=int, default=80)
    a.add_argument("--opt-level", type=int, default=3)
    s = sub.add_parser("rtx-smoke-spec", help="smoke-build every plugin-free plan of a build spec for sm 80")
    s.add_argument("spec")
    s.add_argument("--sm", type=int, default=80)
    args = ap.parse_args(argv)
    if args.cmd == "rtx-smoke":
        return _rtx_smoke_main(args.graph, args.sm, args.opt_level, json.loads(args.profiles))
    spec_path = Path(args.spec).resolve()
    spec = _load_spec(spec_path)
    rc = 0
    for p in spec["plans"]:
        g = spec["graphs"][Path(p["graph"]).stem]
        if g["lowering"] != "plugin_free":
            print(f"{p['name']}: skipped ({g['lowering']} graphs need TensorRT >= 10.7; RTX has no Python plugins)")
            continue
        r = rtx_smoke_build(spec_path.parent / p["graph"], [prof["shapes"] for prof in p["profiles"]], sm=args.sm)
        phases = "+".join(prof["phase"] for prof in p["profiles"])
        print(f"{p['name']} [{phases} profile(s)]: {'OK' if r.ok else 'FAILED'} in {r.seconds:.1f} s "
              f"({r.engine_bytes / 2**20:.1f} MiB engine, discarded)")
        if not r.ok:
            print(r.log_tail)
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
