"""``trtpipe build``: recipe -> artifact directory with manifest (CPU: ONNX Runtime graphs).

Chain: load model -> check recipe against it -> torch reference per phase precision -> export
prefill/decode -> lower for the backend -> write graphs with one shared, deduplicated weights file
-> golden outputs from the reference -> tokenizer -> manifest (last).

Atomicity: everything is written into ``<target>.tmp-<pid>`` beside the final directory, which
is swapped in only when complete; a failed or interrupted build leaves the previous artifact
intact. Rebuilding with unchanged inputs (recipe hash, model file hash, trtpipe version, op ABI
hash) is skipped unless ``force``.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


from trtpipe.pipeline.golden import GOLDEN_PROMPTS, golden_for_build, reference_greedy  # noqa: F401 (re-exported)
from trtpipe.pipeline.recipe import Recipe, build_hash, check_recipe_against_model, plan_kv_num_blocks, recipe_hash
from trtpipe.plugins.errors import TrtpipeError
from trtpipe.runtime.manifest import (FORMAT_VERSION, MANIFEST_NAME, GraphEntry, KVLayout, Manifest,
                                      atomic_write_text, load_manifest, sha256_file)
from trtpipe.runtime.model_config import ModelConfig

TRTPIPE_VERSION = "0.1.0"
DATA_FILE = "weights.data"
DATA_ALIGN_BYTES = 4096  # page-aligned tensors: mmap-friendly
class BuildError(TrtpipeError):
    """The build could not finish (the previous artifact, if any, is left intact)."""


@dataclass(frozen=True)
class BuildResult:
    artifact_dir: Path
    skipped: bool
    seconds: float
    manifest: Manifest
    timings_s: dict[str, float]


def ort_decode_graph(recipe: Recipe) -> str:
    """The graph ONNX Runtime runs decode steps through (``engine.ort_sessions``): ``prefill``
    (one session) for ``one``, or for ``auto`` when both phases share a precision; else ``decode``."""
    sessions = recipe.engine.ort_sessions
    same = recipe.precision.prefill == recipe.precision.decode
    return "prefill" if sessions == "one" or (sessions == "auto" and same) else "decode"


def rebuild_command(recipe: Recipe, artifact_root: str | Path = "artifacts") -> str:
    """``trtpipe build ... --force`` that rebuilds ``recipe`` into ``artifact_root``: a shipped
    recipe by name, any other by its absolute path; ``--artifacts`` unless it is ./artifacts."""
    from trtpipe.pipeline.recipe import RECIPES_DIR

    origin = Path(recipe.origin)
    target = recipe.name
    if origin.is_file() and origin.resolve().parent != RECIPES_DIR.resolve():
        target = str(origin.resolve())
    cmd = f"trtpipe build {target}"
    if Path(artifact_root).resolve() != Path("artifacts").resolve():
        cmd += f" --artifacts {Path(artifact_root).resolve()}"
    return cmd + " --force"


def artifact_dir_for(recipe: Recipe, root: str | Path = "artifacts") -> Path:
    """``<root>/<recipe name>/<target>``."""
    return Path(root) / recipe.name / recipe.target


def load_model(recipe: Recipe):
    """Load the recipe's model (GGUF or Hugging Face folder) -> LoadedModel."""
    src = recipe.resolve_source()
    if src.kind == "gguf":
        from trtpipe.pipeline.gguf_loader import load_gguf

        return load_gguf(src.path)
    if src.kind == "hf":
        from trtpipe.pipeline.hf_loader import load_hf_folder

        return load_hf_folder(src.path)
    raise BuildError(f"recipe {recipe.name}: model.source is not set (a planning recipe); nothing to build. "
                     "Fix: use `trtpipe estimate` for planning recipes, or set model.source.")


def inputs_hash(recipe: Recipe, model_path: Path) -> str:
    """sha256 over what determines the artifact: recipe, model file(s), versions, op ABI."""
    from trtpipe.plugins.schema import op_schema_abi_hash

    h = hashlib.sha256()
    h.update(build_hash(recipe).encode())  # budgets/description edits do not force a rebuild
    files = [model_path] if model_path.is_file() else sorted(p for p in model_path.iterdir() if p.is_file())
    for f in files:
        st = f.stat()
        # size + mtime + name keep this fast for 100 MB+ files; the manifest holds real hashes
        h.update(f"{f.name}:{st.st_size}:{int(st.st_mtime)}".encode())
    h.update(TRTPIPE_VERSION.encode())
    h.update(op_schema_abi_hash().encode())
    try:
        import onnxruntime

        h.update(onnxruntime.__version__.encode())
    except ImportError:
        pass
    return h.hexdigest()


def _write_graphs_shared(models: dict[str, "object"], out_dir: Path) -> dict:
    """Save ONNX graphs with all large initializers in one ``weights.data`` (deduplicated).

    An initializer with the same name and bytes in several graphs is stored once and listed in
    the returned ``shared`` dict (name -> (dtype, shape, offset, length)) so the runtime can
    hand one buffer to every session. Same name, different bytes: later graphs get it renamed.
    """
    import onnx
    from onnx import numpy_helper

    seen: dict[str, tuple[str, int, int]] = {}  # name -> (digest, offset, length)
    users: dict[str, set[str]] = {}
    offset = 0
    data_path = out_dir / DATA_FILE
    with open(data_path, "wb") as f:
        for phase, model in models.items():
            g = model.graph
            renames: dict[str, str] = {}
            for t in g.initializer:
                raw = numpy_helper.to_array(t).tobytes() if not t.raw_data else t.raw_data
                if len(raw) < 1024:
                    continue
                digest = hashlib.sha256(raw).hexdigest()
                if t.name in seen and seen[t.name][0] != digest:
                    new = f"{phase}/{t.name}"
                    renames[t.name] = new
                    t.name = new
                if t.name not in seen:
                    pad = (-offset) % DATA_ALIGN_BYTES
                    f.write(b"\0" * pad)
                    offset += pad
                    f.write(raw)
                    seen[t.name] = (digest, offset, len(raw))
                    offset += len(raw)
                users.setdefault(t.name, set()).add(phase)
                _, off, ln = seen[t.name]
                t.ClearField("raw_data")
                del t.float_data[:], t.int32_data[:], t.int64_data[:]
                t.data_location = onnx.TensorProto.EXTERNAL
                del t.external_data[:]
                for k, v in (("location", DATA_FILE), ("offset", str(off)), ("length", str(ln))):
                    e = t.external_data.add()
                    e.key, e.value = k, v
            if renames:
                for n in g.node:
                    for i, x in enumerate(n.input):
                        if x in renames:
                            n.input[i] = renames[x]
            onnx.save_model(model, str(out_dir / f"{phase}.onnx"))
    shared = {}
    dtypes = {1: "float32", 10: "float16", 2: "uint8", 7: "int64"}
    for phase, model in models.items():
        for t in model.graph.initializer:
            if len(users.get(t.name, ())) > 1 and t.name not in shared and t.data_type in dtypes:
                _, off, ln = seen[t.name]
                shared[t.name] = (dtypes[t.data_type], list(t.dims), off, ln)
    return shared


def publish_artifact(tmp: Path, final: Path, log: Callable[[str], None] | None = None) -> Path | None:
    """Swap a complete temp artifact folder in: final -> .old, tmp -> final, drop .old.

    Two renames on one filesystem: a reader sees the old artifact or the new one, never a mix.
    The previous artifact's validate reports are kept (:func:`keep_previous_reports`); returns
    where they went (None when there were none) and says so through ``log``.
    """
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    if final.exists():
        os.replace(final, old)
    kept = keep_previous_reports(old, tmp) if old.exists() else None
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    if kept is not None:
        kept = final / kept.relative_to(tmp)
        if log is not None:
            log(f"kept the previous artifact's validate reports in {kept}")
    return kept


def keep_previous_reports(old: Path, new: Path) -> Path | None:
    """Move ``old/validate/`` into ``new/validate/previous-<old build hash[:12]>/``.

    Reports the old artifact itself kept (``previous-*``) move up beside it, so history stays one
    level deep. Returns the new folder, or None when the old artifact had no reports.
    """
    src = old / "validate"
    if not src.is_dir() or not any(src.iterdir()):
        return None
    try:
        m = json.loads((old / MANIFEST_NAME).read_text(encoding="utf-8"))
        tag = (m.get("build_info") or {}).get("build_hash") or m["recipe"]["hash"]
    except (OSError, ValueError, KeyError, TypeError):
        tag = "unknown"
    dst_root = new / "validate"
    dst = dst_root / f"previous-{str(tag)[:12]}"
    dst.mkdir(parents=True, exist_ok=True)
    for p in sorted(src.iterdir()):
        target = dst_root / p.name if p.name.startswith("previous-") else dst / p.name
        if not target.exists():
            os.replace(p, target)
    return dst


def _remove_stale_temp_dirs(final: Path, log: Callable[[str], None]) -> None:
    """Delete ``.<target>.tmp-<pid>`` / ``.old-<pid>`` folders left by builds that were killed."""
    if not final.parent.is_dir():
        return
    for p in final.parent.glob(f".{final.name}.*-*"):
        pid = p.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # that build is still running
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        shutil.rmtree(p, ignore_errors=True)
        log(f"removed {p} (left by an interrupted build)")


def build(recipe: Recipe, artifact_root: str | Path = "artifacts", *, force: bool = False,
          log: Callable[[str], None] = print, golden: bool = True) -> BuildResult:
    """Build the artifact for ``recipe`` (see module docstring). GPU targets: see
    :mod:`trtpipe.pipeline.build_trt`. Raises :class:`BuildError` / :class:`RecipeError`."""
    t_start = time.perf_counter()
    final = artifact_dir_for(recipe, artifact_root)
    src = recipe.resolve_source()
    ih = inputs_hash(recipe, src.path)
    _remove_stale_temp_dirs(final, log)
    if not force and (final / MANIFEST_NAME).is_file():
        try:
            m = load_manifest(final, verify_hashes=True)  # a corrupted artifact is rebuilt
            if m.inputs_hash == ih:
                log(f"up to date: {final} (inputs unchanged; use --force to rebuild)")
                return BuildResult(final, True, time.perf_counter() - t_start, m, {})
        except TrtpipeError as e:
            log(f"rebuilding: the existing artifact is not usable ({e})")
    if recipe.target != "cpu":
        from trtpipe.pipeline.build_trt import build_gpu_target

        return build_gpu_target(recipe, final, ih, force=force, log=log)

    timings: dict[str, float] = {}
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        t = time.perf_counter()
        loaded = load_model(recipe)
        timings["load_s"] = time.perf_counter() - t
        log(f"loaded {src.path.name} in {timings['load_s']:.1f} s")
        config: ModelConfig = loaded.config
        check_recipe_against_model(recipe, config)
        window = recipe.sliding_window
        import dataclasses

        if window is not None:
            config = dataclasses.replace(config, layer_sliding_window=(window,) * config.num_layers)
        windows = set(config.layer_sliding_window)
        if len(windows) > 1:
            raise BuildError(f"model {config.name}: layers use different sliding windows {sorted(windows)}; "
                             "the KV manager handles one window per pool. Fix: set sliding_window in the recipe.")
        import onnx

        from trtpipe.pipeline.export import export_phase
        from trtpipe.pipeline.model import build_reference_model
        from trtpipe.pipeline.passes import optimize_for_ort
        from trtpipe.plugins.ort_lowering import lower_for_ort

        int4 = recipe.precision.int4
        refs = {}
        lowered = {}
        for phase in ("prefill", "decode"):
            prec = getattr(recipe.precision, phase)
            if prec not in ("fp32", "int4"):
                raise BuildError(f"precision.{phase} = {prec!r} is not supported on target cpu "
                                 "(ONNX Runtime CPU runs fp32 and int4 weight-only). Fix: use fp32 or int4.")
            if prec not in refs:
                refs[prec] = build_reference_model(loaded, prec, int4.group_size, int4.symmetric,
                                                   rope_table_len=recipe.max_seq_len, sliding_window=window)
            t = time.perf_counter()
            log(f"exporting {phase} ({prec}) ...")
            res = export_phase(refs[prec], phase, tmp / f"{phase}.raw.onnx", recipe.kv_cache.block_size)
            timings[f"export_{phase}_s"] = res.seconds
            t = time.perf_counter()
            model, fused = optimize_for_ort(onnx.load(str(res.path)))
            lowered[phase] = lower_for_ort(model, accuracy_level=recipe.engine.ort_accuracy_level,
                                           decode=phase == "decode",
                                           float_zero_points=recipe.engine.ort_float_zero_points)
            timings[f"fused_{phase}"] = fused
            timings[f"lower_{phase}_s"] = time.perf_counter() - t
            res.path.unlink()
            (tmp / (res.path.name + ".data")).unlink(missing_ok=True)
        t = time.perf_counter()
        shared = _write_graphs_shared(lowered, tmp)
        timings["write_s"] = time.perf_counter() - t
        (tmp / "tokenizer.json").write_text(loaded.tokenizer_json or "", encoding="utf-8")
        if golden:
            t = time.perf_counter()
            gold, _ = golden_for_build(
                loaded, window, recipe.validation.correctness.num_tokens,
                lambda: refs.get("fp32") or build_reference_model(loaded, "fp32", rope_table_len=recipe.max_seq_len,
                                                                  sliding_window=window),
                Path(artifact_root), log=log)
            (tmp / "golden.json").write_text(json.dumps(gold), encoding="utf-8")
            timings["golden_s"] = time.perf_counter() - t
        import onnxruntime

        from trtpipe.plugins.schema import op_schema_abi_hash

        kv = KVLayout(
            block_size=recipe.kv_cache.block_size,
            num_blocks=plan_kv_num_blocks(recipe, config),
            dtype={"fp32": "float32", "fp16": "float16"}.get(recipe.kv_dtype, "float32"),
            layer_num_kv_heads=tuple(config.layer_num_kv_heads),
            head_dim=config.head_dim,
            sliding_window=next(iter(windows)),
        )
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        from trtpipe.pipeline.export import DECODE_INPUTS, PREFILL_INPUTS, kv_names

        past, present = kv_names(config.num_layers)
        manifest = Manifest(
            format_version=FORMAT_VERSION,
            trtpipe_version=TRTPIPE_VERSION,
            recipe_name=recipe.name,
            recipe_hash=recipe_hash(recipe),
            inputs_hash=ih,
            backend={"name": "ort", "version": onnxruntime.__version__, "provider": "CPUExecutionProvider"},
            target={"name": "cpu", "platform": platform.machine(), "sm": None},
            op_abi_hash=op_schema_abi_hash(),
            plugin_versions={"PagedAttention": "1", "Int4Gemm": "1"},
            model=config,
            kv=kv,
            graphs={
                "prefill": GraphEntry("prefill.onnx", recipe.precision.prefill, tuple(PREFILL_INPUTS + past), tuple(["logits"] + present)),
                "decode": GraphEntry("decode.onnx", recipe.precision.decode, tuple(DECODE_INPUTS + past), tuple(["logits"] + present)),
            },
            files=files,
            golden_file="golden.json" if golden else None,
            limits={"max_seq_len": recipe.max_seq_len, "max_batch_size": recipe.max_batch_size,
                    "max_num_tokens": recipe.max_num_tokens},
            runtime_options={
                "shared_data_file": DATA_FILE,
                "shared_initializers": shared,
                "intra_op_num_threads": getattr(recipe.engine, "intra_op_num_threads", None),
                "ort_decode_graph": ort_decode_graph(recipe),
            },
            build_info={"build_hash": build_hash(recipe), "rebuild_command": rebuild_command(recipe, artifact_root),
                        "timings_s": timings, "model_source": str(src.path), "host": platform.node(),
                        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        "weights_bytes": (tmp / DATA_FILE).stat().st_size},
        )
        atomic_write_text(tmp / MANIFEST_NAME, manifest.to_json())
        publish_artifact(tmp, final, log)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    m = load_manifest(final, verify_hashes=False)
    return BuildResult(final, False, time.perf_counter() - t_start, m, timings)
