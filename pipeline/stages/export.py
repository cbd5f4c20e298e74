"""Export stage: prepared model -> torch references -> raw prefill/decode ONNX graphs (docs/graphs.md).

One torch reference per weight precision (fp32 or int4; fp16/bf16 phases export fp32 and are
cast when lowered) over the weights the load stage prepared, exported per phase by
:func:`export_phase`: ``torch.onnx.export(dynamo=True)`` with ``custom_translation_table`` turns
each ``trtpipe::paged_attention`` / ``trtpipe::int4_gemm`` call into one ``trtpipe`` node
(TOOLCHAIN.md). Dynamic axes: ``T`` (tokens), ``S`` (sequences), ``MB`` (max blocks per
sequence), ``NB`` (pool blocks). The raw graphs are loaded into memory and their files removed:
lowering works on the in-memory graphs.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import torch
from torch import nn

from trtpipe.pipeline.model.reference import ReferenceModel, paged_refusal
from trtpipe.pipeline.recipe import Recipe
from trtpipe.pipeline.stages.load import PreparedModel
from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.core.kv_codec import kv_has_scales
from trtpipe.plugins.ops.paged_attention.kv_pool_types import scale_name
from trtpipe.plugins.ops.torch_ops import onnx_translation_table

PREFILL_INPUTS = [
    "input_ids",
    "positions",
    "slot_mapping",
    "block_tables",
    "context_lens",
    "query_start_loc",
    "last_token_indices",
]
DECODE_INPUTS = ["input_ids", "positions", "slot_mapping", "block_tables", "context_lens"]
ONNX_OPSET = 21
IR_VERSION = 10  # what this ONNX Runtime accepts (TOOLCHAIN.md)


def kv_names(num_layers: int, kv_dtype: str = "fp32") -> tuple[list[str], list[str]]:
    """Graph input and output names of the per-layer pool: past_key.i/past_value.i and present_*;
    an int8 pool's scales after them, past_key_scale.i/past_value_scale.i and present_*_scale.i
    (:func:`~trtpipe.plugins.ops.paged_attention.kv_pool_types.scale_name`)."""
    past, present = [], []
    for i in range(num_layers):
        past += [f"past_key.{i}", f"past_value.{i}"]
        present += [f"present_key.{i}", f"present_value.{i}"]
    if kv_has_scales(kv_dtype):
        past += [scale_name(n) for n in past]
        present += [scale_name(n) for n in present]
    return past, present


class _Prefill(nn.Module):
    def __init__(self, ref: ReferenceModel):
        super().__init__()
        self.ref = ref

    def forward(
        self, input_ids, positions, slot_mapping, block_tables, context_lens, query_start_loc, last_token_indices, *kv
    ):
        packed = (input_ids, positions, slot_mapping, block_tables, context_lens, query_start_loc)
        logits, caches = self.ref.forward_paged(*packed, last_token_indices, list(kv))
        return (logits, *caches)


class _Decode(nn.Module):
    def __init__(self, ref: ReferenceModel):
        super().__init__()
        self.ref = ref

    def forward(self, input_ids, positions, slot_mapping, block_tables, context_lens, *kv):
        S = input_ids.shape[0]
        qsl = torch.arange(S + 1, dtype=torch.int64)
        last = torch.arange(S, dtype=torch.int64)
        logits, caches = self.ref.forward_paged(
            input_ids, positions, slot_mapping, block_tables, context_lens, qsl, last, list(kv)
        )
        return (logits, *caches)


@dataclass(frozen=True)
class ExportResult:
    path: Path
    seconds: float
    graph_bytes: int
    data_bytes: int


def _dummy(ref: ReferenceModel, phase: str, block_size: int):
    c = ref.config
    NB = 8  # pool blocks; block tables below are [S=2, MB=3]
    kv = []
    for i in range(c.num_layers):
        shape = (c.layer_num_kv_heads[i], NB, block_size, c.head_dim)  # head-major pool
        kv += [torch.zeros(shape), torch.zeros(shape)]
    i64 = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    bt = i64([[1, 2, 0], [3, 0, 0]])
    if phase == "prefill":
        args = (
            i64([1, 2, 3, 4, 5]),
            i64([0, 1, 2, 0, 1]),
            i64([block_size, block_size + 1, block_size + 2, 3 * block_size, 3 * block_size + 1]),
            bt,
            i64([3, 2]),
            i64([0, 3, 5]),
            i64([2, 4]),
        )
    else:
        args = (i64([1, 2]), i64([3, 2]), i64([block_size + 3, 3 * block_size + 2]), bt, i64([4, 3]))
    return args, kv


def _phase_module(ref: ReferenceModel, phase: str, num_kv: int) -> tuple[nn.Module, list[str], tuple]:
    """(module, input names without the KV, dynamic shapes) of one phase; ``num_kv`` KV tensors.

    Raises ValueError for a phase other than "prefill" or "decode"."""
    T = torch.export.Dim("num_tokens", min=1, max=1 << 16)
    S = torch.export.Dim("num_seqs", min=1, max=1024)
    MB = torch.export.Dim("max_blocks", min=1, max=1 << 14)
    NB = torch.export.Dim("num_blocks", min=2, max=1 << 22)
    kv_ds = tuple({1: NB} for _ in range(num_kv))  # [KVH_i, NB, BS, D]
    if phase == "prefill":
        return _Prefill(ref), PREFILL_INPUTS, ({0: T}, {0: T}, {0: T}, {0: S, 1: MB}, {0: S}, {0: S + 1}, {0: S}, kv_ds)
    if phase == "decode":
        return _Decode(ref), DECODE_INPUTS, ({0: S}, {0: S}, {0: S}, {0: S, 1: MB}, {0: S}, kv_ds)
    raise ValueError(f"phase must be 'prefill' or 'decode', got {phase!r}")


def _save_atomic(model: onnx.ModelProto, out_path: Path) -> Path:
    """Write ``model`` to ``out_path`` with its weights in ``out_path.data``; returns the data path.

    Graph + data go into a private temp folder, then both move into place (data first, graph
    last: its presence means a complete export). onnx appends to an existing data file, so the
    temp folder also keeps a stale file from growing."""
    data_name = out_path.name + ".data"
    tmp_dir = out_path.parent / f".export-{out_path.stem}-{os.getpid()}"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    tmp_dir.mkdir()
    try:
        onnx.save_model(
            model,
            str(tmp_dir / out_path.name),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=data_name,
            size_threshold=1024,
        )
        os.replace(tmp_dir / data_name, out_path.parent / data_name)
        os.replace(tmp_dir / out_path.name, out_path)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return out_path.parent / data_name


# onnxscript's default rewrite rules that torch.onnx's optimize step runs, minus these: on our
# reference's graphs they never match, and SlicesSplit alone took 17.7 of the step's 25 s per
# SmolLM2 graph (measured 2026-12-02: step 24.5 -> 4.2 s, the optimized graphs byte-identical).
_SKIPPED_REWRITE_RULES = frozenset({"SlicesSplit"})


@contextlib.contextmanager
def _without_unused_rewrite_rules():
    """onnxscript's ``rewriter._DEFAULT_REWRITE_RULES`` (read by ``optimize_ir`` when it runs)
    without :data:`_SKIPPED_REWRITE_RULES` for the block; restored after. An onnxscript without
    that attribute runs its own rules unchanged (the export is then only slower)."""
    from onnxscript import rewriter

    rules = getattr(rewriter, "_DEFAULT_REWRITE_RULES", None)
    if rules is None:
        yield
        return
    rewriter._DEFAULT_REWRITE_RULES = tuple(r for r in rules if getattr(r, "name", None) not in _SKIPPED_REWRITE_RULES)
    try:
        yield
    finally:
        rewriter._DEFAULT_REWRITE_RULES = rules


def export_phase(ref: ReferenceModel, phase: str, out_path: Path, block_size: int) -> ExportResult:
    """Export one phase ("prefill" or "decode") to ``out_path`` (+ ``out_path.data``).

    The write is atomic: the graph is written under a temporary name in the same folder and
    renamed at the end, so a failed export leaves any previous file intact. Raises
    :class:`~trtpipe.plugins.core.errors.OpError` before tracing for a model the paged op cannot
    run (:func:`~trtpipe.pipeline.model.reference.paged_refusal`, e.g. Gemma 2's attention soft-cap).
    """
    t0 = time.perf_counter()
    c = ref.config
    why = paged_refusal(c)
    if why:  # torch.export would bury the same refusal in its own error
        raise OpError(why)
    args, kv = _dummy(ref, phase, block_size)
    past, present = kv_names(c.num_layers)
    module, names, ds = _phase_module(ref, phase, len(kv))
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    quiet = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(quiet), torch.no_grad(), _without_unused_rewrite_rules():
        warnings.simplefilter("ignore")
        logging.getLogger("torch.onnx").setLevel(logging.ERROR)
        prog = torch.onnx.export(
            module.eval(),
            (*args, *kv),
            dynamic_shapes=ds,
            dynamo=True,
            opset_version=ONNX_OPSET,
            input_names=names + past,
            output_names=["logits"] + present,
            custom_translation_table=onnx_translation_table(),
            optimize=True,
            verify=False,
        )
    model = prog.model_proto
    model.ir_version = IR_VERSION
    model.graph.name = f"{c.name or c.architecture}-{phase}"
    data_path = _save_atomic(model, out_path)
    return ExportResult(out_path, time.perf_counter() - t0, out_path.stat().st_size, data_path.stat().st_size)


PHASES = ("prefill", "decode")


@dataclass(frozen=True)
class ExportedGraphs:
    """Raw exported graphs (``trtpipe`` custom ops, fp32 activations) and the references behind them."""

    graphs: dict[str, Any]  # phase -> onnx.ModelProto (weights in memory)
    references: dict[str, Any]  # weight precision ("fp32" | "int4") -> ReferenceModel
    timings_s: dict[str, float]  # export_<phase>_s


def reference_for(recipe: Recipe, model: PreparedModel, weight_precision: str) -> Any:
    """The torch reference of ``model`` over its weights at ``weight_precision`` ("fp32" or
    "int4": prepared by the load stage, :meth:`PreparedModel.weights_at`), RoPE table up to
    ``max_seq_len``, the recipe's window override."""
    from trtpipe.pipeline.model.reference import build_reference_model

    return build_reference_model(
        model.loaded,
        weights=model.weights_at(weight_precision),
        rope_table_len=recipe.max_seq_len,
        sliding_window=recipe.sliding_window,
    )


def export_graphs(
    recipe: Recipe,
    model: PreparedModel,
    phases: tuple[str, ...],
    work_dir: Path,
    *,
    weight_precision: Callable[[str], str],
    log: Callable[[str], None] = print,
) -> ExportedGraphs:
    """Export each of ``phases`` from the reference at ``weight_precision(phase precision)``,
    writing and removing ``<phase>.raw.onnx`` (+ ``.data``) under ``work_dir``."""
    import onnx

    refs: dict[str, Any] = {}
    graphs: dict[str, Any] = {}
    timings: dict[str, float] = {}
    for phase in phases:
        prec = getattr(recipe.precision, phase)
        wp = weight_precision(prec)
        if wp not in refs:
            refs[wp] = reference_for(recipe, model, wp)
        log(f"exporting {phase} ({prec}) ...")
        res = export_phase(refs[wp], phase, work_dir / f"{phase}.raw.onnx", recipe.kv_cache.block_size)
        timings[f"export_{phase}_s"] = res.seconds
        t = time.perf_counter()
        graphs[phase] = onnx.load(str(res.path))
        timings[f"read_{phase}_s"] = time.perf_counter() - t
        res.path.unlink()
        (work_dir / (res.path.name + ".data")).unlink(missing_ok=True)
    return ExportedGraphs(graphs, refs, timings)
