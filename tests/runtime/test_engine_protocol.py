"""The engine seam (runtime/engines/base.py): what the runtime does with each capability an
engine declares, on engines it can build without a model (stubs, and TrtEngine's methods on a
stand-in ``self``: no GPU here)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from trtpipe.runtime.engines import select
from trtpipe.runtime.engines.base import EngineCapabilities
from trtpipe.runtime.engines.trt import TrtEngine
from trtpipe.runtime.errors import ArtifactError


def test_capabilities_are_a_frozen_record():
    caps = EngineCapabilities("ort", True, True, True, ("fp16",))
    with pytest.raises(AttributeError):
        caps.copies_blocks = False
    assert caps == EngineCapabilities("ort", True, True, True, ("fp16",))


def test_tensorrt_refuses_block_copies_and_takes_none():
    stand_in = SimpleNamespace(manifest=SimpleNamespace(root="artifacts/x/a100"))
    TrtEngine.copy_blocks(stand_in, [])  # nothing to copy: no-op
    with pytest.raises(ArtifactError, match=r"copy KV blocks \[\(3, 7\)\].*copies_blocks is False"):
        TrtEngine.copy_blocks(stand_in, [(3, 7)])


class _Engine:
    last_step_s = 0.0

    def __init__(self, kv_dtypes):
        self.capabilities = EngineCapabilities("fake", False, False, False, kv_dtypes)

    def prefill(self, batch):
        return np.zeros((1, 4), np.float32)

    decode = prefill

    def copy_blocks(self, copies):
        pass


def test_load_engine_refuses_a_pool_dtype_the_engine_does_not_read(monkeypatch):
    manifest = SimpleNamespace(root="artifacts/x/cpu", rebuild_command="trtpipe build x --force")
    pool = SimpleNamespace(kv_dtype="int8")
    monkeypatch.setattr(select, "_load", lambda *a: _Engine(("fp32", "fp16")))
    with pytest.raises(ArtifactError, match="KV pool dtype int8, and the fake engine reads fp32, fp16"):
        select.load_engine(manifest, pool, None)
    monkeypatch.setattr(select, "_load", lambda *a: _Engine(("fp32", "int8")))
    assert select.load_engine(manifest, pool, None).capabilities.kv_dtypes == ("fp32", "int8")
