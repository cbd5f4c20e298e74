"""TensorRT engines: the prefill and decode plans over one device-resident paged KV pool.

Deploy side: needs ``tensorrt`` (or only its runtime) and the CUDA runtime library; never torch,
never the builder. CUDA is reached through ``ctypes`` on ``libcudart`` (:mod:`trtpipe.runtime.engines.cuda_device`: malloc,
memcpy, streams, device attributes), so an Orin needs nothing beyond JetPack. The plugin ABI hash
lives with the ops' ABI (:func:`trtpipe.plugins.ops.abi.plugin_abi_hash`).

Fingerprint: :func:`check_trt_fingerprint` compares what the artifact was built for (TensorRT
flavor and version, SM, CUDA major version, platform, plugin ABI hash) with what this process
runs, and refuses a mismatch naming each difference and the rebuild command. Engines are not
portable across TensorRT versions or GPU architectures (DESIGN.md "Targets").

Layouts (``manifest.options.layout``):

* ``split``: ``prefill.plan`` and ``decode.plan``, one execution context each.
* ``dual_profile``: one ``engine.plan`` (the prefill graph) with optimization profile 0 for
  prefill and 1 for decode, two execution contexts on the one engine (weights held once).
  Decode batches are fed as one-token prefill chunks (``query_start_loc = arange(S+1)``).

KV pool (per layer K and V, ``[kv_heads_l, num_blocks, block_size, head_dim]``, device memory):
with plugins, ``PagedKVWrite`` writes in place and ``past_*``/``present_*`` are bound to the
same buffer. Plugin-free graphs write the pool through ``ScatterND``, which produces a new
tensor, so the engine keeps two pools and swaps them after every step (ping-pong)::

    step n:   past = pool[a]  ->  present = pool[b]      then a, b = b, a

The host :class:`~trtpipe.runtime.kv.pool.KVPool` the caller passes is not used for storage
(its arrays are never touched, so the OS never backs them with pages).
"""

from __future__ import annotations

import ctypes
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from trtpipe.plugins.core.dtypes import dtype as dtype_record
from trtpipe.plugins.ops.abi import plugin_abi_hash
from trtpipe.runtime.artifact.manifest import Manifest
from trtpipe.runtime.engines.base import EngineCapabilities
from trtpipe.runtime.engines.cuda_device import (
    CudaError,
    DeviceBuffer,
    check_cuda,
    cuda_device_info,
    load_cudart,
    memcpy_dtoh,
    memcpy_htod,
)
from trtpipe.runtime.errors import ArtifactError

if TYPE_CHECKING:
    from trtpipe.runtime.kv.pool import KVPool
    from trtpipe.runtime.sched.batch import DecodeBatch, PrefillBatch

__all__ = [
    "TrtEngine",
    "TrtRuntimeFacts",
    "check_trt_fingerprint",
    "current_trt_facts",
    # re-exported for callers of the engine module (homes: runtime/engines/cuda_device.py, plugins/ops/abi.py)
    "CudaError",
    "cuda_device_info",
    "plugin_abi_hash",
]

# ============================================================================================
# fingerprint
# ============================================================================================


@dataclass(frozen=True)
class TrtRuntimeFacts:
    """What this process runs, compared with the manifest (built by :func:`current_trt_facts`;
    tests build it by hand)."""

    flavor: str | None  # "tensorrt" | None (not importable)
    version: str | None
    sm: int | None
    cuda_runtime: str | None
    platform: str
    plugin_abi_hash: str


def current_trt_facts() -> TrtRuntimeFacts:
    flavor = version = None
    try:
        import tensorrt as trt  # noqa: F401

        flavor, version = "tensorrt", trt.__version__
    except Exception:
        pass
    dev = cuda_device_info()
    return TrtRuntimeFacts(
        flavor,
        version,
        dev.sm if dev else None,
        dev.runtime_version if dev else None,
        platform.machine(),
        plugin_abi_hash(),
    )


def check_trt_fingerprint(manifest: Manifest, facts: TrtRuntimeFacts) -> None:
    """Refuse an artifact built for another TensorRT, GPU, CUDA major version, platform or
    plugin ABI. Raises :class:`ArtifactError` listing every difference and the rebuild command."""
    b, t = manifest.backend, manifest.target
    rebuild = (
        f"rebuild on this machine: `{manifest.rebuild_command}` (or finish a build spec "
        "here with `trtpipe build <spec>/recipe.yaml --from-spec <spec>/build_spec.json`)"
    )
    if facts.flavor is None:
        raise ArtifactError(
            f"artifact {manifest.root} holds TensorRT {b.get('version')} plans, but the Python package "
            "`tensorrt` is not importable here. Fix: install TensorRT "
            f"{b.get('version')} (JetPack on Orin; `pip install tensorrt-cu12=={b.get('version')}` "
            "on x86-64), or use a cpu artifact."
        )
    diffs = []
    if b.get("flavor") != facts.flavor:
        diffs.append(f"builder flavor {b.get('flavor')} (this runtime: {facts.flavor})")
    if b.get("version") != facts.version:
        diffs.append(f"TensorRT {b.get('version')} (installed: {facts.version})")
    if facts.sm is None:
        diffs.append(f"GPU sm_{t.get('sm')} (this machine: no CUDA device visible)")
    elif t.get("sm") != facts.sm:
        diffs.append(f"GPU sm_{t.get('sm')} (this machine: sm_{facts.sm})")
    want_cuda = str(b.get("cuda_runtime") or "")
    if want_cuda and facts.cuda_runtime and want_cuda.split(".")[0] != facts.cuda_runtime.split(".")[0]:
        diffs.append(f"CUDA {want_cuda} (this machine: {facts.cuda_runtime}; plans need the same CUDA major version)")
    if t.get("platform") and t.get("platform") != facts.platform:
        diffs.append(f"platform {t.get('platform')} (this machine: {facts.platform})")
    if manifest.plugin_versions and b.get("plugin_abi_hash") and b.get("plugin_abi_hash") != facts.plugin_abi_hash:
        built = str(b.get("plugin_abi_hash"))[:12]
        diffs.append(f"plugin ABI hash {built} (this trtpipe: {facts.plugin_abi_hash[:12]})")
    if diffs:
        raise ArtifactError(
            f"artifact {manifest.root} was built for a different TensorRT runtime: "
            + "; ".join(diffs)
            + f". Fix: {rebuild}."
        )


# ============================================================================================
# engine
# ============================================================================================


class _Context:
    """One execution context (one plan, one optimization profile) with its I/O bindings."""

    def __init__(self, cuda_engine: Any, profile_index: int, stream: int, trt: Any):
        self.engine = engine = cuda_engine  # a tensorrt.ICudaEngine (one plan)
        self.ctx = engine.create_execution_context()
        if self.ctx is None:
            raise CudaError("TensorRT could not create an execution context (out of device memory?)")
        self.profile_index = profile_index
        if engine.num_optimization_profiles > 1:
            self.ctx.set_optimization_profile_async(profile_index, stream)
        self.inputs = [
            engine.get_tensor_name(i)
            for i in range(engine.num_io_tensors)
            if engine.get_tensor_mode(engine.get_tensor_name(i)) == trt.TensorIOMode.INPUT
        ]
        self.outputs = [
            engine.get_tensor_name(i)
            for i in range(engine.num_io_tensors)
            if engine.get_tensor_mode(engine.get_tensor_name(i)) == trt.TensorIOMode.OUTPUT
        ]

    def profile_range(self, name: str) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        lo, opt, hi = self.engine.get_tensor_profile_shape(name, self.profile_index)
        return tuple(lo), tuple(opt), tuple(hi)


class TrtEngine:
    """Prefill + decode TensorRT engines over one device KV pool (see the module docstring).

    ``prefill(batch) -> logits [S, V] float32``, ``decode(batch) -> logits [S, V] float32``;
    wall time of the last call in ``last_step_s``. Raises :class:`ArtifactError` for a
    fingerprint mismatch or an unloadable plan, :class:`CudaError` for CUDA failures.
    ``capabilities``: no fused mixed steps (decodes run in the decode plan; never run on a GPU
    here); no block copies (the device pool has no copy kernel: n > 1 choices share full blocks
    through the prefix cache); no logits at every position: speculative verify chunks are
    prefill-profile shapes (T = k + 1 tokens, S >= 1), but the plans' logits gather
    (last_token_indices) is sized [S] by that profile, so LLM refuses speculation on TensorRT
    (docs/tensorrt.md; untested, no GPU here); the plans read the manifest's KV dtype.
    """

    def __init__(self, manifest: Manifest, pool: KVPool | None = None, *, facts: TrtRuntimeFacts | None = None):
        check_trt_fingerprint(manifest, facts or current_trt_facts())
        self.capabilities = EngineCapabilities(
            backend="trt",
            fuses_mixed_steps=False,
            copies_blocks=False,
            verifies_all_positions=False,
            kv_dtypes=(dtype_record(manifest.kv.dtype).name,),
        )
        import tensorrt as trt

        self.trt = trt
        self.manifest = manifest
        opts = manifest.options  # typed and checked at load (runtime/artifact/runtime_options.py): no defaults here
        self.layout = opts.layout
        self.kv_in_place = bool(opts.kv_in_place)
        lib = load_cudart()
        self._stream = ctypes.c_void_p()
        check_cuda(lib.cudaStreamCreate(ctypes.byref(self._stream)), "cudaStreamCreate")
        self.runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self._engines: dict[str, Any] = {}
        self.contexts: dict[str, _Context] = {}
        for phase, g in manifest.graphs.items():
            plan = g.file
            if plan not in self._engines:
                data = manifest.path(plan).read_bytes()
                eng = self.runtime.deserialize_cuda_engine(data)
                if eng is None:
                    raise ArtifactError(
                        f"TensorRT could not load {manifest.path(plan)} (built with another TensorRT, "
                        f"GPU or plugin set?). Fix: `{manifest.rebuild_command}` here."
                    )
                self._engines[plan] = eng
            profile = int((opts.profiles or {}).get(phase, {}).get("profile_index", 0))
            self.contexts[phase] = _Context(self._engines[plan], profile, self.stream, trt)
        # device KV pool(s): [layer] -> (K buffer, V buffer)
        kv = manifest.kv
        item = dtype_record(kv.dtype).itemsize  # bytes per KV element ("float16" -> 2)
        n_pools = 1 if self.kv_in_place else 2
        self.pools = [
            [
                (
                    DeviceBuffer(int(np.prod(kv.layer_shape(i))) * item),
                    DeviceBuffer(int(np.prod(kv.layer_shape(i))) * item),
                )
                for i in range(len(kv.layer_num_kv_heads))
            ]
            for _ in range(n_pools)
        ]
        self._cur = 0
        lim = manifest.limits
        vocab = manifest.model.vocab_size
        self._max_rows = max(lim.max_batch_size, lim.max_num_tokens)
        self._logits = DeviceBuffer(self._max_rows * vocab * 4)
        self._index_bufs: dict[tuple[str, str], DeviceBuffer] = {}
        self.last_step_s = 0.0

    @property
    def stream(self) -> int:
        return int(self._stream.value or 0)

    def _index_buffer(self, phase: str, name: str, nbytes: int) -> DeviceBuffer:
        buf = self._index_bufs.get((phase, name))
        if buf is None or buf.nbytes < nbytes:
            buf = DeviceBuffer(max(nbytes, 1 << 16))
            self._index_bufs[(phase, name)] = buf
        return buf

    def _pad_block_tables(self, c: _Context, bt: np.ndarray) -> np.ndarray:
        """Pad block-table rows with the null block 0 up to the profile's minimum width."""
        lo = c.profile_range("block_tables")[0][1]
        if bt.shape[1] < lo:
            bt = np.pad(bt, ((0, 0), (0, lo - bt.shape[1])))
        return bt

    def _run(self, phase: str, feeds: dict[str, np.ndarray], num_seqs: int) -> np.ndarray:
        t0 = time.perf_counter()
        c = self.contexts[phase]
        ctx, stream = c.ctx, self.stream
        feeds = dict(feeds)
        if "query_start_loc" in c.inputs and "query_start_loc" not in feeds:  # dual_profile decode
            feeds["query_start_loc"] = np.arange(num_seqs + 1, dtype=np.int64)
            feeds["last_token_indices"] = np.arange(num_seqs, dtype=np.int64)
        feeds["block_tables"] = self._pad_block_tables(c, feeds["block_tables"])
        for name, arr in feeds.items():
            arr = np.ascontiguousarray(arr, np.int64)
            buf = self._index_buffer(phase, name, arr.nbytes)
            memcpy_htod(buf.address, arr, stream)
            ctx.set_input_shape(name, arr.shape)
            ctx.set_tensor_address(name, buf.address)
        past = self.pools[self._cur]
        present = self.pools[(self._cur + 1) % len(self.pools)]
        for i, ((pk, pv), (nk, nv)) in enumerate(zip(past, present)):
            shape = self.manifest.kv.layer_shape(i)
            ctx.set_input_shape(f"past_key.{i}", shape)
            ctx.set_input_shape(f"past_value.{i}", shape)
            ctx.set_tensor_address(f"past_key.{i}", pk.address)
            ctx.set_tensor_address(f"past_value.{i}", pv.address)
            ctx.set_tensor_address(f"present_key.{i}", nk.address)
            ctx.set_tensor_address(f"present_value.{i}", nv.address)
        ctx.set_tensor_address("logits", self._logits.address)
        if not ctx.execute_async_v3(stream):
            raise CudaError(f"TensorRT {phase} execution failed (see the TensorRT log above)")
        out = np.empty((num_seqs, self.manifest.model.vocab_size), np.float32)
        memcpy_dtoh(out, self._logits.address, stream)
        check_cuda(load_cudart().cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")
        if not self.kv_in_place:
            self._cur = (self._cur + 1) % len(self.pools)
        self.last_step_s = time.perf_counter() - t0
        return out

    def prefill(self, batch: PrefillBatch) -> np.ndarray:
        return self._run("prefill", batch.feeds(), len(batch.request_ids))

    def decode(self, batch: DecodeBatch) -> np.ndarray:
        return self._run("decode", batch.feeds(), len(batch.request_ids))

    def copy_blocks(self, copies: Sequence[tuple[int, int]]) -> None:
        """No copy kernel for the device pool (``capabilities.copies_blocks`` is False, so the
        scheduler never forks blocks): an empty list is a no-op, any copy raises :class:`ArtifactError`."""
        if copies:
            raise ArtifactError(
                f"TensorRT engine of {self.manifest.root}: asked to copy KV blocks {list(copies)[:4]}, but it has no "
                "block copy (capabilities.copies_blocks is False). Fix: this is a runtime bug; run with n = 1."
            )

    def close(self) -> None:
        for pools in self.pools:
            for k, v in pools:
                k.free()
                v.free()
        for b in self._index_bufs.values():
            b.free()
        self._logits.free()
        if self._stream.value:
            load_cudart().cudaStreamDestroy(self._stream)
            self._stream = ctypes.c_void_p()
