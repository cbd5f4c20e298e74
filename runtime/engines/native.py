"""The native CPU engine: the host CPU kernels (``plugins/cpu/csrc``, compiled for the artifact's
ISA at build) run the whole Llama forward of a step in one C call over the shared KV pool.

``prefill(batch) -> logits [S, V] float32`` (last token of each sequence) and
``decode(batch) -> logits [S, V]`` take the ONNX Runtime engine's batches: one forward serves any
mix of prompt chunks and 1-token decode rows, so a mixed step runs as one call
(``fuses_mixed_steps``). Activations enter each GEMM as int8 in one or two levels per phase
and site (attention projections, MLP, LM head: ``runtime_options.native.activation_levels``; two
keep ~15 bits: ``csrc/tp.h``). Weights are memory-mapped from ``native.bin`` and read in place (no
prepacked copy).

Threads: OpenMP (libgomp); a decode step has ~150 parallel regions, so how waiting threads wait
decides what a shared CPU costs. Unless the environment sets ``OMP_WAIT_POLICY`` or
``GOMP_SPINCOUNT``, the engine sets ``GOMP_SPINCOUNT=2000`` (spin briefly, then sleep). Measured on
a 2-core Zen 4, 64 tokens of "Tell me a story." (TPOT medians): quiet, libgomp's default 5.7 ms,
spin 2000 6.45 ms, ``OMP_WAIT_POLICY=PASSIVE`` 14.9 ms (a sleeping thread wakes ~50 us late per
region); with both cores also running other processes, default 30.9 ms, spin 2000 16.6 ms,
PASSIVE 11.6 ms (ONNX Runtime ~27-40 ms). A longer spin (200000) measured better in between
(2026-12-03, 133-token prompts, 64 tokens, 3 interleaved rounds): quiet TPOT 0.87x of spin 2000 at
the same TTFT; beside a process using 0.3 of a core TTFT 0.8x and TPOT 0.68x; beside one using a
whole core TPOT 0.69x but TTFT 1.16x (p90 1.3-1.8x); `trtpipe serve` driven by vLLM's benchmark client
at 0.58-2.3 req/s gave no difference beyond run-to-run noise, so 2000 stays. The environment is
read when the library loads.

Raises :class:`ArtifactError` when the CPU lacks the ISA the library was built for (it would die
with SIGILL), or the library or weights cannot be loaded.
"""

from __future__ import annotations

import ctypes as C
import os
import time
import weakref
from collections.abc import Sequence

import numpy as np

from trtpipe.plugins.core.errors import OpError
from trtpipe.plugins.core.kv_codec import KV_DTYPES
from trtpipe.plugins.cpu import library as L
from trtpipe.plugins.cpu.isa import missing_flags
from trtpipe.runtime.artifact.manifest import Manifest
from trtpipe.runtime.artifact.runtime_options import ActivationLevels
from trtpipe.runtime.engines.base import EngineCapabilities
from trtpipe.runtime.engines.native_model import NativeModel
from trtpipe.runtime.engines.native_step import StepLimits, explain_step, step_arrays, step_arrays_rows
from trtpipe.runtime.engines.native_weights import NativeWeights
from trtpipe.runtime.errors import ArtifactError
from trtpipe.runtime.kv.pool import KVPool
from trtpipe.runtime.sched.batch import DecodeBatch, PrefillBatch


def _inside(manifest: Manifest, rel: str):
    """``rel`` under the artifact folder (checked on the path as written: the artifact's own files
    may be symlinks); an ArtifactError for a path that leaves it."""
    from pathlib import Path

    root = Path(os.path.normpath(manifest.path(".")))
    p = Path(os.path.normpath(manifest.path(rel)))
    if root not in p.parents:
        raise ArtifactError(
            f"artifact {manifest.root}: runtime_options.native names {rel!r}, outside the artifact folder. "
            f"Fix: `{manifest.rebuild_command}`."
        )
    return p


def _threads(num_threads: int | None, manifest: Manifest) -> int:
    if num_threads:
        return num_threads
    if manifest.options.intra_op_num_threads:
        return manifest.options.intra_op_num_threads
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class NativeEngine:
    """See the module docstring."""

    def __init__(self, manifest: Manifest, pool: KVPool, num_threads: int | None = None):
        nat = manifest.options.native
        if nat is None:
            raise ArtifactError(
                f"artifact {manifest.root} has no native engine (built with engine.cpu_backend: ort, or on a "
                "machine or model the native engine cannot take: its build log says which). Fix: run it with "
                "--engine ort (or auto), or set engine.cpu_backend: native in the recipe and rebuild."
            )
        lacks = missing_flags(nat.isa)
        if lacks:
            raise ArtifactError(
                f"artifact {manifest.root} was lowered for {nat.isa}, and this CPU lacks {', '.join(lacks)}. "
                f"Fix: rebuild for this host (`{manifest.rebuild_command}` with engine.cpu_isa: host), "
                "or run it with --engine ort."
            )
        if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
            os.environ["GOMP_SPINCOUNT"] = "2000"  # see the module docstring
        lib_path, weights_path = (_inside(manifest, f) for f in (nat.library, nat.weights_file))
        try:
            self.lib = L.load(lib_path)
        except OpError as e:
            raise ArtifactError(f"{e}. Fix: `{manifest.rebuild_command}`.") from e
        built_for = self.lib.tp_isa().decode()
        if built_for != nat.isa:
            raise ArtifactError(
                f"artifact {manifest.root}: the manifest says its kernels are for {nat.isa}, the library is built "
                f"for {built_for}: the manifest was edited or damaged. Fix: `{manifest.rebuild_command}`."
            )
        if L.act_form(self.lib) != nat.activation_form:
            raise ArtifactError(
                f"artifact {manifest.root}: the manifest says its kernels hold two-level activations as "
                f"{nat.activation_form}, the library as {L.act_form(self.lib)}: the manifest was edited or damaged. "
                f"Fix: `{manifest.rebuild_command}`."
            )
        self.manifest, self.pool, self.isa = manifest, pool, nat.isa
        self.threads = _threads(num_threads, manifest)
        self.lib.tp_set_threads(self.threads)
        self.levels = dict(nat.activation_levels)
        self.weights = NativeWeights(weights_path, nat.tensors, manifest.rebuild_command)
        self._max_positions = max(manifest.limits.max_seq_len, 1)
        self._model = NativeModel(manifest, self.weights, pool, self._max_positions)
        self.model = self._model.struct
        self._limits = StepLimits(manifest.model.vocab_size, self._max_positions, manifest.kv.num_blocks,
                                  manifest.kv.block_size)  # fmt: skip
        ws = self.lib.tp_workspace_new()
        if not ws:
            raise ArtifactError("native engine: out of memory for its workspace")
        self._ws = C.c_void_p(ws)  # this engine's scratch: never shared with another engine
        weakref.finalize(self, self.lib.tp_workspace_free, self._ws)
        self.last_step_s = 0.0

    @property
    def capabilities(self) -> EngineCapabilities:
        """One forward takes any mix of rows (fuses mixed steps); blocks are copied in the host pool;
        the kernels read every KV dtype; logits at chosen rows (speculative verify: tp_forward_rows,
        in every library of this ABI)."""
        return EngineCapabilities("native", True, True, True, KV_DTYPES)

    def _run(
        self, feeds: dict[str, np.ndarray], levels: ActivationLevels, logit_indices: np.ndarray | None = None
    ) -> np.ndarray:
        """Logits of one step; the arrays checked at the boundary (:mod:`.native_step`): a bad step
        raises :class:`StepError` naming the field and leaves the pool untouched."""
        t0 = time.perf_counter()
        a, T, S, MB = step_arrays(feeds)
        step = L.Step(
            T, S, MB,
            *(L.ptr(a[k], L._i64p) for k in (
                "input_ids", "positions", "slot_mapping", "block_tables", "context_lens",
                "query_start_loc", "last_token_indices",
            )),
            levels.attention, levels.mlp, levels.head,
        )  # fmt: skip
        V = self.manifest.model.vocab_size
        if logit_indices is None:
            logits = np.empty((S, V), np.float32)
            rc = self.lib.tp_forward(C.byref(self.model), C.byref(step), self._ws, L.ptr(logits, L._f32p))
        else:  # speculative verify: logits at the given rows (PrefillBatch.logit_indices)
            rows = a["logit_indices"] = step_arrays_rows(logit_indices)
            logits = np.empty((len(rows), V), np.float32)
            rc = self.lib.tp_forward_rows(
                C.byref(self.model), C.byref(step), self._ws, len(rows), L.ptr(rows, L._i64p), L.ptr(logits, L._f32p)
            )
        if rc == L.NOMEM:
            raise ArtifactError(f"native engine: {L.FORWARD_ERRORS[rc]} (step of {T} tokens)")
        if rc:
            raise explain_step(a, T, S, self._limits, (levels.attention, levels.mlp, levels.head))
        self.last_step_s = time.perf_counter() - t0
        return logits

    def prefill(self, batch: PrefillBatch) -> np.ndarray:
        """Logits ``[L, V]``: the last token of each row, or ``batch.logit_indices``' rows."""
        return self._run(batch.feeds(), self.levels["prefill"], batch.logit_indices)

    def decode(self, batch: DecodeBatch) -> np.ndarray:
        feeds = batch.feeds()
        n = len(feeds["input_ids"])
        feeds["query_start_loc"] = np.arange(n + 1, dtype=np.int64)
        feeds["last_token_indices"] = np.arange(n, dtype=np.int64)
        return self._run(feeds, self.levels["decode"])

    def copy_blocks(self, copies: Sequence[tuple[int, int]]) -> None:
        """Copy-on-write before a step: the kernels read and write the host pool in place."""
        self.pool.copy_blocks(copies)
