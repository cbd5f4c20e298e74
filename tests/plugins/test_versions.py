"""plugins/core/versions.py: the one home of the TensorRT plugin requirement; plugins/ops/abi.py: the plugin ABI hash."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

import trtpipe.plugins as plugins_pkg
from trtpipe.plugins.core import versions as V
from trtpipe.plugins.ops import abi as A
from trtpipe.plugins.ops.abi import op_schema_canonical_text


def test_trt_plugin_requirement_is_10_7():
    assert V.TRT_PLUGINS_MIN_VERSION == (10, 7) and V.TRT_PLUGINS_REQUIREMENT == "TensorRT >= 10.7"
    assert not V.trt_has_python_plugins("10.3.0.30")  # JetPack 6
    assert V.trt_has_python_plugins("10.7.0.23") and V.trt_has_python_plugins("11.0")
    with pytest.raises(ValueError, match="'garbage'"):
        V.version_tuple("garbage")


def test_every_abi_source_exists():
    """A renamed source would otherwise hash as ``<missing>`` and silently stop guarding plans."""
    root = Path(plugins_pkg.__file__).parent
    assert [n for n in A.PLUGIN_ABI_SOURCES if not (root / n).is_file()] == []


def test_plugin_abi_hash_covers_schemas_and_sources(tmp_path, monkeypatch):
    root = Path(plugins_pkg.__file__).parent
    h = hashlib.sha256(op_schema_canonical_text().encode())
    for name in A.PLUGIN_ABI_SOURCES:
        h.update(name.encode() + (root / name).read_bytes())
    assert A.plugin_abi_hash() == h.hexdigest()
    # one byte more in a kernel source is another ABI
    copy = tmp_path / "plugins"
    shutil.copytree(root, copy)
    kernels = "ops/paged_attention/triton_kernels.py"
    (copy / kernels).write_bytes((root / kernels).read_bytes() + b"\n")
    monkeypatch.setattr(A, "__file__", str(copy / "ops" / "abi.py"))
    assert A.plugin_abi_hash() != h.hexdigest()


def test_engine_module_reexports_the_one_home():
    from trtpipe.runtime.engines import cuda_device
    from trtpipe.runtime.engines import trt as engine_trt

    assert engine_trt.plugin_abi_hash is A.plugin_abi_hash
    assert engine_trt.cuda_device_info is cuda_device.cuda_device_info
    assert engine_trt.CudaError is cuda_device.CudaError
