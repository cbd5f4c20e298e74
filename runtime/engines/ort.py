"""ONNX Runtime engines (CPU execution provider): the prefill and decode graphs over one pool.

Each session gets one persistent ``IOBinding`` in which every layer's ``past_*`` input and
``present_*`` output are bound to the *same* ``OrtValue`` (a view of the runtime's numpy pool), so
the lowered ``ScatterND`` writes new K/V in place. Per step only the small index inputs are
re-bound. Initializers used by both graphs are memory-mapped once from ``weights.data`` and
handed to both sessions (``SessionOptions.add_initializer``), so the weights are not held twice.

ONNX Runtime *prepacks* constant weights when a session is created (MatMulNBits and MatMul copy
them into their kernel layouts) and then reads only the packed copies. Once both sessions exist
the mapped file pages are therefore dropped from this process (``madvise(MADV_DONTNEED)``; a
read-only file mapping, so any page still read, e.g. an embedding row, is faulted back in from
the file). Measured on SmolLM2 (exact Q4_1): resident memory after loading two sessions went from
480 to 357 MiB; with one session (``ort_decode_graph = prefill``, the default) it is 219 MiB.
"""

from __future__ import annotations

import mmap
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from trtpipe.plugins.core.dtypes import dtype
from trtpipe.runtime.artifact.manifest import Manifest
from trtpipe.runtime.engines.base import EngineCapabilities
from trtpipe.runtime.errors import ArtifactError
from trtpipe.runtime.kv.pool import KVPool
from trtpipe.runtime.sched.batch import DecodeBatch, PrefillBatch


class _Session:
    def __init__(self, ort, path: Path, so, pool: KVPool, providers: Sequence[str]):
        try:
            self.sess = ort.InferenceSession(str(path), so, providers=list(providers))
        except Exception as e:  # onnxruntime raises its own exception types
            raise ArtifactError(f"onnxruntime could not load {path}: {e}. Fix: rebuild the artifact.") from e
        got = self.sess.get_providers()
        if got[0] != providers[0]:
            raise ArtifactError(f"onnxruntime picked providers {got}, asked for {list(providers)}")
        self.binding = self.sess.io_binding()
        self.binding.bind_output("logits")  # first: get_outputs()[0] is the logits
        for i, arrays in enumerate(pool.ort_values()):  # (k, v) or, int8 pool, (k, v, k_scale, v_scale)
            for name, value in zip(("key", "value", "key_scale", "value_scale"), arrays):
                self.binding.bind_ortvalue_input(f"past_{name}.{i}", value)
                self.binding.bind_ortvalue_output(f"present_{name}.{i}", value)

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        b = self.binding
        for name, arr in feeds.items():
            b.bind_cpu_input(name, arr)
        # Re-bind logits every run: after a run the binding holds that run's [S, V] buffer, and a
        # later run with another S would be refused (ORT does not reallocate a bound output).
        b.bind_output("logits")
        self.sess.run_with_iobinding(b)
        # copy: the OrtValue's buffer is reused by the next run (logits are small: S x V)
        return np.array(b.get_outputs()[0].numpy(), copy=True)


class OrtEngine:
    """Prefill + decode sessions over one :class:`KVPool`.

    ``prefill(batch) -> logits [S, V] float32`` (last token of each sequence);
    ``decode(batch) -> logits [S, V] float32`` (through the decode graph, or the prefill graph
    when the manifest's ``runtime_options.ort_decode_graph`` is ``prefill``; the prefill graph
    takes any number of tokens per sequence, so one token each is a valid chunk). Wall time of
    the last call is in ``last_step_s``. ``capabilities``: mixed steps fuse where a step's prompt
    chunks and decode tokens can go through one ``prefill`` call (the recipe's
    ``engine.ort_fused_steps``: the prefill graph was lowered to send trailing 1-token rows through a
    decode attention path); blocks are copied in the host pool the graphs read in place; logits at
    every position (see ``prefill``); the graphs read the KV dtype they were lowered for.
    Raises :class:`ArtifactError` if a graph cannot be loaded.
    """

    def __init__(self, manifest: Manifest, pool: KVPool, num_threads: int | None = None):
        import onnxruntime as ort

        self.manifest = manifest
        self.pool = pool
        so = ort.SessionOptions()
        opts = manifest.options
        threads = num_threads or opts.intra_op_num_threads
        if threads:
            so.intra_op_num_threads = threads
        so.log_severity_level = 3
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._shared = self._load_shared(ort, manifest)
        for name, ov in self._shared.items():
            so.add_initializer(name, ov)
        providers = ["CPUExecutionProvider"]
        # "prefill": decode steps run through the prefill graph (one session, one prepacked copy
        # of the weights; the recipe's engine.ort_sessions); "decode": the decode graph's own session
        assert opts.ort_decode_graph is not None  # parsed at load for the ort backend: "prefill" | "decode"
        self.decode_graph: str = opts.ort_decode_graph
        self.capabilities = EngineCapabilities(
            backend="ort",
            fuses_mixed_steps=bool(opts.ort_fused_steps),
            copies_blocks=True,
            verifies_all_positions=True,  # see prefill
            kv_dtypes=(pool.kv_dtype,),
        )
        phases = ["prefill"] if self.decode_graph == "prefill" else list(manifest.graphs)
        if self.decode_graph == "prefill":
            # One session sees prefill and decode shapes in turn; with ORT's memory-pattern
            # planning on, decode steps after other requests slowed from 14 to 24 ms at 512
            # tokens of context (measured; steps of a first request were unaffected).
            so.enable_mem_pattern = False
        self.sessions = {
            ph: _Session(ort, manifest.path(manifest.graphs[ph].file), so, pool, providers) for ph in phases
        }
        self.release_mapped_weight_pages()
        self.last_step_s = 0.0

    def copy_blocks(self, copies: Sequence[tuple[int, int]]) -> None:
        """Copy-on-write before a step: the graphs read and write the host pool in place."""
        self.pool.copy_blocks(copies)

    def release_mapped_weight_pages(self) -> bool:
        """Drop the resident pages of the memory-mapped ``weights.data`` (see the module
        docstring); returns False where the platform has no ``madvise(MADV_DONTNEED)``."""
        if self._mmap is None or not hasattr(mmap, "MADV_DONTNEED"):
            return False
        self._mmap.madvise(mmap.MADV_DONTNEED)
        return True

    def _load_shared(self, ort, manifest: Manifest) -> dict:
        """Initializers shared by both graphs, memory-mapped (read-only) from the shared data file."""
        self._mmap = None
        shared = manifest.options.shared_initializers or {}
        data_file = manifest.options.shared_data_file
        if not shared or data_file is None:
            return {}
        with open(manifest.path(data_file), "rb") as f:
            self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        data = np.frombuffer(self._mmap, dtype=np.uint8)
        out = {}
        for name, init in shared.items():
            count = int(np.prod(init.shape)) if init.shape else 1
            arr = np.frombuffer(data, dtype=dtype(init.dtype).numpy, count=count, offset=init.offset_bytes).reshape(
                init.shape
            )
            out[name] = ort.OrtValue.ortvalue_from_numpy(arr)
        return out

    def prefill(self, batch: PrefillBatch) -> np.ndarray:
        """Logits ``[L, V]``: the last token of each row, or ``batch.logit_indices``' rows (the
        prefill graph gathers its logits rows with ``last_token_indices``, a Gather over the packed
        hidden states, docs/graphs.md: fed a longer list, it returns those rows, e.g. every position
        of a speculative verify chunk; nothing else in the graph reads it)."""
        t = time.perf_counter()
        feeds = batch.feeds()
        if batch.logit_indices is not None:
            feeds["last_token_indices"] = batch.logit_indices
        out = self.sessions["prefill"].run(feeds)
        self.last_step_s = time.perf_counter() - t
        return out

    def decode(self, batch: DecodeBatch) -> np.ndarray:
        t = time.perf_counter()
        feeds = batch.feeds()
        if self.decode_graph == "prefill":  # one token per sequence, as a prefill chunk of 1
            n = len(feeds["input_ids"])
            feeds["query_start_loc"] = np.arange(n + 1, dtype=np.int64)
            feeds["last_token_indices"] = np.arange(n, dtype=np.int64)
        out = self.sessions[self.decode_graph].run(feeds)
        self.last_step_s = time.perf_counter() - t
        return out
