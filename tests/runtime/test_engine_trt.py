"""TensorRT runtime (runtime/engines/trt.py) without a GPU: the fingerprint refusals, the plugin
ABI hash, the CUDA probe, and that the module stays light (no torch, onnx or triton).
Running plans needs a GPU: see bench/gpu_check.sh and docs/tensorrt.md."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from trtpipe.plugins.ops.abi import plugin_abi_hash
from trtpipe.runtime.artifact.manifest import FORMAT_VERSION, GraphEntry, KVLayout, Limits, Manifest
from trtpipe.runtime.artifact.model_config import ModelConfig
from trtpipe.runtime.engines.cuda_device import cuda_device_info
from trtpipe.runtime.engines.trt import TrtEngine, TrtRuntimeFacts, check_trt_fingerprint
from trtpipe.runtime.errors import ArtifactError


def _manifest(**backend) -> Manifest:
    cfg = ModelConfig(
        architecture="llama",
        num_layers=1,
        hidden_size=64,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=100,
        max_position_embeddings=256,
        rope_theta=1e4,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    )
    b = {
        "name": "trt",
        "flavor": "tensorrt",
        "version": "10.13.0.35",
        "cuda_runtime": "12.9",
        "lowering": "plugins",
        "plugin_abi_hash": plugin_abi_hash(),
        **backend,
    }
    return Manifest(
        format_version=FORMAT_VERSION,
        trtpipe_version="0.1.0",
        recipe_name="smollm2-135m-a100",
        recipe_hash="r" * 64,
        inputs_hash="i" * 64,
        backend=b,
        target={"name": "a100", "sm": 80, "platform": "x86_64"},
        op_abi_hash="o" * 64,
        plugin_versions={"PagedKVWrite": "1", "PagedAttention": "1", "Int4Gemm": "1"},
        model=cfg,
        kv=KVLayout(16, 9, "float16", (2,), 16, 0),
        graphs={
            "prefill": GraphEntry("prefill.plan", "fp16", ("input_ids",), ("logits",)),
            "decode": GraphEntry("decode.plan", "int4", ("input_ids",), ("logits",)),
        },
        files={},
        limits=Limits(128, 4, 64),
        runtime_options={"layout": "split", "kv_in_place": True},
        root=Path("/artifacts/x/a100"),
    )


FACTS = TrtRuntimeFacts("tensorrt", "10.13.0.35", 80, "12.9", "x86_64", plugin_abi_hash())


def test_matching_fingerprint_passes():
    check_trt_fingerprint(_manifest(), FACTS)
    check_trt_fingerprint(_manifest(), dataclasses.replace(FACTS, cuda_runtime="12.4"))  # same CUDA major


@pytest.mark.parametrize(
    "change,expect",
    [
        (dict(version="10.7.0.23"), "TensorRT 10.13.0.35 (installed: 10.7.0.23)"),
        (dict(sm=90), "GPU sm_80 (this machine: sm_90)"),
        (dict(sm=None), "no CUDA device visible"),
        (dict(cuda_runtime="13.0"), "CUDA 12.9 (this machine: 13.0"),
        (dict(platform="aarch64"), "platform x86_64 (this machine: aarch64)"),
        (dict(plugin_abi_hash="0" * 64), "plugin ABI hash"),
        (dict(flavor="tensorrt-rtx"), "builder flavor tensorrt"),
    ],
)
def test_each_mismatch_is_named_with_the_rebuild_command(change, expect):
    with pytest.raises(ArtifactError) as e:
        check_trt_fingerprint(_manifest(), dataclasses.replace(FACTS, **change))
    assert expect in str(e.value) and "trtpipe build smollm2-135m-a100 --force" in str(e.value)


def test_several_mismatches_are_reported_together():
    with pytest.raises(ArtifactError) as e:
        check_trt_fingerprint(_manifest(), dataclasses.replace(FACTS, version="10.3.0.30", sm=87, platform="aarch64"))
    msg = str(e.value)
    assert "TensorRT 10.13.0.35" in msg and "sm_87" in msg and "aarch64" in msg


def test_plugin_free_artifact_ignores_plugin_sources():
    m = dataclasses.replace(_manifest(lowering="plugin_free"), plugin_versions={})
    check_trt_fingerprint(m, dataclasses.replace(FACTS, plugin_abi_hash="0" * 64))


def test_missing_tensorrt_names_the_package():
    with pytest.raises(ArtifactError, match="`tensorrt` is not importable"):
        TrtEngine(_manifest(), None, facts=dataclasses.replace(FACTS, flavor=None, version=None))


def test_plugin_abi_hash_is_stable_hex():
    h = plugin_abi_hash()
    assert h == plugin_abi_hash() and len(h) == 64 and int(h, 16) >= 0


def test_no_gpu_here_means_no_device_info():
    info = cuda_device_info()
    if info is not None:
        pytest.skip(f"a GPU is visible ({info.name}, sm_{info.sm})")
    assert info is None


def test_runtime_module_stays_light():
    code = (
        "import sys, trtpipe.runtime.engines.trt as e; e.plugin_abi_hash(); "
        "print(sorted(m for m in ('torch', 'onnx', 'triton', 'tensorrt') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
