"""TensorRT plugins (plugins/ops/trt_plugins.py) without a GPU.

- AOT: each plugin's wrapper kernel compiles to PTX for sm_80, sm_87, sm_90, with exactly the
  parameters TensorRT passes to an AOT plugin kernel: inputs, extra scalars, outputs (Triton's
  hidden scratch pointers stripped, after checking they are unused).
- Numerics: the wrapper kernels run under ``TRITON_INTERPRET=1`` (a subprocess, like
  tests/plugins/test_triton_kernels.py) against the NumPy reference.
- Registration: through the pure-Python ``tensorrt.plugin`` package. Enterprise TensorRT does
  not install here, so the package is imported from ``tensorrt-lean``'s bindings behind a small
  ``tensorrt`` stand-in module (two type-only names the lean bindings lack are filled in); it
  checks plugin ids, attributes, output counts, aliasing, dtypes and that ``aot_impl`` returns
  a PTX kernel. A real ``tensorrt`` is used instead where it imports.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types

import numpy as np
import pytest

triton = pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from trtpipe.plugins.core.errors import OpError  # noqa: E402
from trtpipe.plugins.lowering.trt import PLUGIN_ATTRIBUTES  # noqa: E402
from trtpipe.plugins.ops import trt_plugins as TP  # noqa: E402
from trtpipe.plugins.ops.int4_gemm import pack as P  # noqa: E402
from trtpipe.plugins.ops.int4_gemm import reference as I4  # noqa: E402
from trtpipe.plugins.ops.paged_attention import reference as PA  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
compiled = pytest.mark.skipif(INTERPRET, reason="AOT compilation needs JIT (non-interpreted) kernels")

SMOL = dict(num_heads=9, num_kv_heads=3, head_size=64, scale=0.0, block_size=16)
CASES = [
    ("PagedKVWrite", dict(num_kv_heads=3, head_size=64, block_size=16), 1),
    ("PagedAttention", {**SMOL, "sliding_window": 0, "decode": 1}, 1),
    ("PagedAttention", {**SMOL, "sliding_window": 4096, "decode": 0}, 2),
    ("Int4Gemm", dict(K=576, N=1536, group_size=64, bits=4), 1),
    ("Int4Gemm", dict(K=1536, N=576, group_size=32, bits=4), 4),
]
# TensorRT's launch order: inputs, extra scalar args, outputs
ABI = {
    "PagedKVWrite": (5, 1, 2),  # extra: NB
    "PagedAttention.decode": (6, 2, 1),  # extras: MB, NB
    "PagedAttention.prefill": (6, 3, 1),  # extras: S, MB, NB
    "Int4Gemm": (4, 1, 1),
}


def _entry_params(ptx: str, name: str) -> list[str]:
    head = ptx[ptx.index(f".entry {name}(") :]
    head = head[: head.index(")")]
    return re.findall(r"\.param \.(\w+)(?: \.ptr)?[^,]*?(\w+_param_\d+)", head)


@compiled
@pytest.mark.parametrize("cc", [80, 87, 90])
@pytest.mark.parametrize("plugin,attrs,tactic", CASES)
def test_plugin_kernels_compile_with_tensorrt_abi(cc, plugin, attrs, tactic):
    name, ptx, k = TP.compile_plugin_kernel(plugin, attrs, "fp16", cc=cc, tactic=tactic)
    key = plugin if plugin != "PagedAttention" else f"PagedAttention.{'decode' if attrs['decode'] else 'prefill'}"
    n_in, n_extra, n_out = ABI[key]
    params = _entry_params(ptx, name)
    assert len(params) == n_in + n_extra + n_out, params
    assert f".target sm_{cc}" in ptx
    assert k.metadata.num_warps in (4, 8)
    # extras are 32-bit scalars (TensorRT passes SymInt32), pointers are 64-bit
    kinds = [p[0] for p in params]
    assert kinds[n_in : n_in + n_extra] == ["u32"] * n_extra or kinds[n_in : n_in + n_extra] == ["s32"] * n_extra, kinds


def test_strip_unused_params_checks_the_body():
    ptx = (
        ".visible .entry k(\n\t.param .u64 k_param_0,\n\t.param .u64 k_param_1,\n\t.param .u64 k_param_2\n)\n"
        "{\n\tld.param.b64 %rd1, [k_param_0];\n}\n"
    )
    out = TP.strip_unused_params(ptx, "k", 1)
    assert "k_param_1" not in out and "k_param_2" not in out and "[k_param_0]" in out
    with pytest.raises(OpError, match="hidden parameter 0"):
        TP.strip_unused_params(ptx, "k", 0)


def test_kernel_config_rejects_bad_attributes():
    with pytest.raises(OpError, match="multiple"):
        TP.kernel_config("PagedAttention", {**SMOL, "num_kv_heads": 2, "decode": 0}, "fp16")
    with pytest.raises(OpError, match="group_size"):
        TP.kernel_config("Int4Gemm", dict(K=100, N=8, group_size=32, bits=4), "fp16")
    with pytest.raises(OpError, match="unknown plugin"):
        TP.kernel_config("Nope", {}, "fp16")


def test_trt_version_gate():
    assert not TP.trt_version_supports_plugins("10.3.0.30")  # JetPack 6
    assert TP.trt_version_supports_plugins("10.7.0.23")
    assert TP.trt_version_supports_plugins("11.4.0.106")
    assert not TP.trt_version_supports_plugins("garbage")


# ----------------------------------------------------------------------------------------------
# numerics under the Triton interpreter
# ----------------------------------------------------------------------------------------------


@compiled
def test_plugin_kernels_under_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", TRITON_DEFAULT_FP_FUSION="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-k", "test_interp_", __file__]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1], proc.stdout[-2000:]


H, KVH, D, BS, NB = 6, 2, 32, 8, 12


def _step(rng, chunks):
    """Packed step: per sequence (cached, new) tokens; fresh random blocks per sequence; caches
    head-major [KVH, NB, BS, D]."""
    kc = rng.standard_normal((KVH, NB, BS, D)).astype(np.float32)
    vc = rng.standard_normal((KVH, NB, BS, D)).astype(np.float32)
    free = list(range(1, NB))
    S = len(chunks)
    MB = max(-(-(c + n) // BS) for c, n in chunks)
    bt = np.zeros((S, MB), np.int64)
    cl, qsl, slots = np.zeros(S, np.int64), np.zeros(S + 1, np.int64), []
    for s, (cached, new) in enumerate(chunks):
        nb = -(-(cached + new) // BS)
        bt[s, :nb] = [free.pop(0) for _ in range(nb)]
        cl[s], qsl[s + 1] = cached + new, qsl[s] + new
        slots += [int(bt[s, p // BS] * BS + p % BS) for p in range(cached, cached + new)]
    T = int(qsl[-1])
    q = rng.standard_normal((T, H * D)).astype(np.float32)
    k = rng.standard_normal((T, KVH * D)).astype(np.float32)
    v = rng.standard_normal((T, KVH * D)).astype(np.float32)
    return q, k, v, kc, vc, np.array(slots, np.int64), bt, cl, qsl


def _t(x):
    return torch.from_numpy(np.ascontiguousarray(x).copy())


def _write_then_attend(args, window, decode):
    q, k, v, kc, vc, sm, bt, cl, qsl = args
    T, S, MB = q.shape[0], bt.shape[0], bt.shape[1]
    tk, tv = _t(kc), _t(vc)
    fn, _, c, _ = TP.kernel_config("PagedKVWrite", dict(num_kv_heads=KVH, head_size=D, block_size=BS), "fp32")
    fn[(T,)](_t(k), _t(v), tk, tv, _t(sm), NB, tk, tv, **c)  # outputs alias the inputs
    attrs = dict(
        num_heads=H, num_kv_heads=KVH, head_size=D, scale=0.0, block_size=BS, sliding_window=window, decode=int(decode)
    )
    fn, _, c, _ = TP.kernel_config("PagedAttention", attrs, "fp32", tactic=1)
    out = torch.zeros(T, H * D)
    if decode:
        fn[(S, KVH)](_t(q), tk, tv, _t(bt), _t(cl), _t(qsl), MB, NB, out, **c)
    else:
        fn[(T // c["BLOCK_Q"] + S, KVH)](_t(q), tk, tv, _t(bt), _t(cl), _t(qsl), S, MB, NB, out, **c)
    return out.numpy(), tk.numpy(), tv.numpy()


@pytest.mark.parametrize("window", [0, 5])
def interp_prefill_plugin_matches_reference(window):
    args = _step(np.random.default_rng(window), [(9, 4), (0, 3), (3, 1)])
    out, k_out, v_out = _write_then_attend(args, window, decode=False)
    ref = PA.paged_attention(*args, num_heads=H, num_kv_heads=KVH, head_size=D, block_size=BS, sliding_window=window)
    np.testing.assert_allclose(out, ref[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(k_out, ref[1])
    np.testing.assert_array_equal(v_out, ref[2])


@pytest.mark.parametrize("window", [0, 6])
def interp_decode_plugin_matches_reference(window):
    args = _step(np.random.default_rng(10 + window), [(20, 1), (0, 1), (7, 1)])
    out, k_out, _ = _write_then_attend(args, window, decode=True)
    ref = PA.paged_attention(*args, num_heads=H, num_kv_heads=KVH, head_size=D, block_size=BS, sliding_window=window)
    np.testing.assert_allclose(out, ref[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(k_out, ref[1])


@pytest.mark.parametrize("tactic", sorted(TP.INT4_TACTICS))
def interp_int4_plugin_matches_reference(tactic):
    rng = np.random.default_rng(tactic)
    K, N, G, M = 128, 80, 32, 5
    packed, scales, zp = P.quantize_rtn(rng.standard_normal((N, K)).astype(np.float32), G, symmetric=False)
    zf = P.unpack_zero_points_uint8(zp, N, K // G).astype(np.float32)
    a = rng.standard_normal((M, K)).astype(np.float32)
    fn, _, c, _ = TP.kernel_config("Int4Gemm", dict(K=K, N=N, group_size=G, bits=4), "fp32", tactic)
    y = torch.zeros(M, N)
    fn[(-(-M // c["BLOCK_M"]), -(-N // c["BLOCK_N"]))](_t(a), _t(packed), _t(scales), _t(zf), M, y, **c)
    ref = I4.int4_gemm(a, packed, scales, zp, K=K, N=N, group_size=G)
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-4)


if INTERPRET:  # collect the numerical tests only where the kernels run in the interpreter
    for _name, _fn in list(globals().items()):
        if _name.startswith("interp_") and callable(_fn):
            globals()["test_" + _name] = _fn


# ----------------------------------------------------------------------------------------------
# registration through tensorrt.plugin
# ----------------------------------------------------------------------------------------------


def _tensorrt_plugin_module():
    """(tensorrt, tensorrt.plugin): TensorRT's own, or the lean bindings' behind a stand-in that
    the ``registered`` fixture removes from ``sys.modules`` afterwards (torch.export probes
    ``tensorrt`` and would find it)."""
    try:
        import tensorrt as trt  # noqa: F401
        import tensorrt.plugin as trtp

        return trt, trtp
    except Exception:
        pass
    lean = pytest.importorskip("tensorrt_lean", reason="neither tensorrt nor tensorrt-lean-cu12 is installed")
    import importlib.machinery

    shim = types.ModuleType("tensorrt")
    shim.__spec__ = importlib.machinery.ModuleSpec("tensorrt", None)
    shim.__dict__.update({k: getattr(lean, k) for k in dir(lean) if not k.startswith("__")})
    shim.__version__ = lean.__version__

    class TensorFormat:  # annotation-only names missing from the lean bindings
        LINEAR = "LINEAR"

    class ITensor:
        pass

    shim.TensorFormat = getattr(lean, "TensorFormat", TensorFormat)
    shim.ITensor = getattr(lean, "ITensor", ITensor)
    saved = {k: sys.modules.get(k) for k in ("tensorrt", "tensorrt.plugin")}
    sys.modules["tensorrt"] = shim
    try:
        import tensorrt_lean_bindings.plugin as trtp
    except Exception as e:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
        pytest.skip(f"tensorrt.plugin does not import over the lean bindings: {e}")
    sys.modules["tensorrt.plugin"] = trtp
    shim.plugin = trtp
    return shim, trtp


@pytest.fixture(scope="module")
def registered():
    saved = {k: sys.modules.get(k) for k in ("tensorrt", "tensorrt.plugin")}
    trt, trtp = _tensorrt_plugin_module()
    descs = TP.register_plugins(trtp, cc=80)
    assert TP.register_plugins(trtp) is descs  # idempotent
    yield trt, trtp, descs
    for k, v in saved.items():  # drop the stand-in
        if v is None:
            sys.modules.pop(k, None)
        else:
            sys.modules[k] = v


def _registry(trtp):
    return sys.modules[trtp.__name__ + "._lib"].QDP_REGISTRY


def test_registered_plugins_and_attributes(registered):
    trt, trtp, descs = registered
    reg = _registry(trtp)
    assert set(descs) == {f"trtpipe::{n}" for n in PLUGIN_ATTRIBUTES}
    outputs = {"PagedKVWrite": 2, "PagedAttention": 1, "Int4Gemm": 1}
    inputs = {"PagedKVWrite": 5, "PagedAttention": 6, "Int4Gemm": 4}
    for name, attrs in PLUGIN_ATTRIBUTES.items():
        d = reg[f"trtpipe::{name}"]
        assert tuple(d.input_attrs) == attrs, name  # what the lowering puts on the nodes
        assert d.num_outputs == outputs[name] and len(d.input_tensor_names) == inputs[name]
        assert d.aot_impl_func is not None and d.autotune_func is not None
        creator = trt.get_plugin_registry().get_creator(name, "1", "trtpipe")
        assert creator is not None and creator.plugin_namespace == "trtpipe" and creator.plugin_version == "1"
        assert [f.name for f in creator.field_names] == list(attrs)
    assert reg["trtpipe::PagedAttention"].input_attrs["scale"] is float


def test_registry_holds_the_descriptions(registered):
    """What tensorrt.plugin parsed from the built signatures is each plugin's description."""
    from trtpipe.plugins.ops.abi import PLUGINS

    trt, trtp, descs = registered
    reg = _registry(trtp)
    for name, plugin in PLUGINS.items():
        d = reg[f"trtpipe::{name}"]
        assert list(d.input_tensor_names) == list(plugin.inputs), name
        assert dict(d.input_attrs) == {a.name: a.py_type for a in plugin.attributes}, name
        assert d.num_outputs == len(plugin.outputs), name


def _desc(trt, trtp, shape, dtype):
    return trtp.TensorDesc(trtp.ShapeExprs.from_tuple(shape), dtype)


def test_output_descriptors_alias_and_dtypes(registered):
    trt, trtp, descs = registered
    f16, i64 = trt.float16, trt.int64
    k, kc, sm = _desc(trt, trtp, (5, 192), f16), _desc(trt, trtp, (3, 8, 16, 64), f16), _desc(trt, trtp, (5,), i64)
    kc_out, vc_out = descs["trtpipe::PagedKVWrite"](k, k, kc, kc, sm, 3, 64, 16)
    assert kc_out.get_aliased() is kc and vc_out.get_aliased() is kc  # written in place
    q, bt = _desc(trt, trtp, (5, 576), f16), _desc(trt, trtp, (2, 3), i64)
    o = descs["trtpipe::PagedAttention"](q, kc, kc, bt, sm, sm, 9, 3, 64, 0.0, 16, 0, 0)
    assert o.dtype == f16 and len(o.shape_expr) == 2 and o.get_aliased() is None
    a = _desc(trt, trtp, (2, 5, 576), f16)
    (y,) = descs["trtpipe::Int4Gemm"](
        a,
        _desc(trt, trtp, (1536, 9, 32), trt.uint8),
        _desc(trt, trtp, (1536, 9), f16),
        _desc(trt, trtp, (1536, 9), f16),
        576,
        1536,
        64,
        4,
    )
    assert y.dtype == f16 and len(y.shape_expr) == 3


@compiled
def test_aot_impl_returns_ptx_for_the_target(registered):
    trt, trtp, descs = registered
    reg = _registry(trtp)
    f16, i64 = trt.float16, trt.int64
    a = _desc(trt, trtp, (5, 576), f16)
    y = _desc(trt, trtp, (5, 1536), f16)
    name, ptx, launch, extras = reg["trtpipe::Int4Gemm"].aot_impl_func(
        a,
        _desc(trt, trtp, (1536, 9, 32), trt.uint8),
        _desc(trt, trtp, (1536, 9), f16),
        _desc(trt, trtp, (1536, 9), f16),
        576,
        1536,
        64,
        4,
        (y,),
        3,
    )
    assert name == "int4_gemm_plugin_kernel" and ".target sm_80" in ptx and len(extras) == 1
    assert isinstance(launch, trtp.KernelLaunchParams)
    q, kc, bt, cl = (
        _desc(trt, trtp, (5, 576), f16),
        _desc(trt, trtp, (3, 8, 16, 64), f16),  # [KVH, NB, BS, D]
        _desc(trt, trtp, (2, 3), i64),
        _desc(trt, trtp, (2,), i64),
    )
    name, ptx, _, extras = reg["trtpipe::PagedAttention"].aot_impl_func(
        q, kc, kc, bt, cl, _desc(trt, trtp, (3,), i64), 9, 3, 64, 0.0, 16, 0, 1, (q,), 1
    )
    assert name == "attention_decode_plugin_kernel" and len(extras) == 2  # MB, NB
    combos = reg["trtpipe::Int4Gemm"].autotune_func(a, None, None, None, (y,))
    assert len(combos) == 1
