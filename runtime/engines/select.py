"""Which engine runs an artifact: its backend's (ONNX Runtime or TensorRT), or on cpu artifacts
the native engine where the artifact has one; each backend is imported only when chosen."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trtpipe.runtime.artifact.manifest import Manifest
from trtpipe.runtime.errors import ArtifactError, RequestError
from trtpipe.runtime.kv.pool import KVPool

if TYPE_CHECKING:
    from trtpipe.runtime.engines.base import Engine

ENGINES = ("auto", "native", "ort")


def load_engine(m: Manifest, pool: KVPool, num_threads: int | None, engine: str = "auto") -> Engine:
    """The engines of the artifact's backend over ``pool`` (their backend imported only here).
    ``engine`` (cpu artifacts): ``auto`` = the native engine where the artifact has one, else
    ONNX Runtime; ``native`` / ``ort`` force one. Raises :class:`ArtifactError` for ``native``
    on an artifact without it or an engine that cannot read the pool's KV dtype
    (``capabilities.kv_dtypes``), :class:`RequestError` for an unknown name or for native / ort on
    a TensorRT artifact."""
    loaded = _load(m, pool, num_threads, engine)
    caps = loaded.capabilities
    if pool.kv_dtype not in caps.kv_dtypes:
        raise ArtifactError(
            f"artifact {m.root}: KV pool dtype {pool.kv_dtype}, and the {caps.backend} engine reads "
            f"{', '.join(caps.kv_dtypes)}. Fix: `{m.rebuild_command}` with a kv_cache.dtype it reads."
        )
    return loaded


def _load(m: Manifest, pool: KVPool, num_threads: int | None, engine: str) -> Engine:
    if engine not in ENGINES:
        raise RequestError(f"engine={engine!r}: expected one of {', '.join(ENGINES)}. Fix: use auto.")
    if m.options.backend == "ort":
        if engine == "native" or (engine == "auto" and m.options.native is not None):
            from trtpipe.runtime.engines.native import NativeEngine

            return NativeEngine(m, pool, num_threads=num_threads)
        from trtpipe.runtime.engines.ort import OrtEngine

        return OrtEngine(m, pool, num_threads=num_threads)
    if engine != "auto":
        raise RequestError(
            f"engine={engine!r}: this artifact is a {m.options.backend} build (target {m.target.get('name')}); "
            "native and ort run cpu artifacts only. Fix: use auto (or leave --engine out)."
        )
    from trtpipe.runtime.engines.trt import TrtEngine

    return TrtEngine(m, pool)


__all__ = ["ENGINES", "load_engine"]
