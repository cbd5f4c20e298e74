"""Every backend's parameter list equals the op's one description (plugins/ops/<op>/spec.py):
ONNX schema, NumPy reference, torch custom op, the torch exporter's translation, Triton launchers,
TensorRT plugin registration (built signatures and, where tensorrt.plugin imports, the registry),
the plugins' wrapper kernels and the AOT kernels' signatures. The op ABI hash is pinned: it is
recorded in artifacts' manifests, so a change to it must be deliberate."""

from __future__ import annotations

import inspect

import pytest

from trtpipe.plugins.ops import abi
from trtpipe.plugins.ops.int4_gemm import reference as int4_reference
from trtpipe.plugins.ops.int4_gemm.spec import INT4_GEMM
from trtpipe.plugins.ops.paged_attention import reference as attention_reference
from trtpipe.plugins.ops.paged_attention.spec import PAGED_ATTENTION

SPECS = {"PagedAttention": PAGED_ATTENTION, "Int4Gemm": INT4_GEMM}
REFERENCES = {"PagedAttention": attention_reference.paged_attention, "Int4Gemm": int4_reference.int4_gemm}
# the op ABI hash artifacts' manifests record: changing it makes every built artifact a mismatch
OP_ABI_HASH = "5393dcec7a618cd65dde6ffa1e07e2fe110ffeaef9bf6960e72f829a5fa9c526"


def _params(sig: inspect.Signature) -> list[tuple[str, str, object]]:
    """``(name, kind, default)`` of each parameter, annotations left out."""
    return [(p.name, p.kind.name, p.default) for p in sig.parameters.values()]


def test_op_abi_hash_is_pinned():
    assert abi.op_schema_abi_hash() == OP_ABI_HASH
    assert list(abi.OP_SPECS) == ["PagedAttention", "Int4Gemm"]


def test_the_contract_by_hand():
    """The descriptions themselves, spelled out once here (docs/contracts.md)."""
    assert [t.arg_name for t in PAGED_ATTENTION.inputs] == [
        "query",
        "key",
        "value",
        "key_cache",
        "value_cache",
        "slot_mapping",
        "block_tables",
        "context_lens",
        "query_start_loc",
        "key_scale",  # optional: an int8 pool's scales
        "value_scale",
    ]
    assert [t.name for t in PAGED_ATTENTION.outputs if t.optional] == ["key_scale_out", "value_scale_out"]
    assert [(a.name, a.default) for a in PAGED_ATTENTION.arguments] == [
        ("num_heads", None),
        ("num_kv_heads", None),
        ("head_size", None),
        ("scale", 0.0),
        ("block_size", None),
        ("sliding_window", 0),
    ]
    assert [(t.name, t.arg_name, t.optional) for t in INT4_GEMM.inputs] == [
        ("A", "a", False),
        ("B", "b_packed", False),
        ("scales", "scales", False),
        ("zero_points", "zero_points", True),
    ]
    assert [(a.name, a.default) for a in INT4_GEMM.arguments] == [
        ("K", None),
        ("N", None),
        ("group_size", None),
        ("bits", 4),
    ]
    for spec in SPECS.values():
        assert [a.name for a in spec.attributes if not a.argument] == ["plugin_namespace", "plugin_version"]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_onnx_schema_equals_the_description(name):
    onnx = pytest.importorskip("onnx")
    spec = SPECS[name]
    abi.register_schemas()
    s = onnx.defs.get_schema(name, 1, "trtpipe")
    assert [(i.name, i.type_str, i.option == onnx.defs.OpSchema.FormalParameterOption.Optional) for i in s.inputs] == [
        (t.name, t.type, t.optional) for t in spec.inputs
    ]
    assert [(o.name, o.type_str) for o in s.outputs] == [(t.name, t.type) for t in spec.outputs]
    assert {c.type_param_str: sorted(c.allowed_type_strs) for c in s.type_constraints} == {
        c.name: sorted(c.types) for c in spec.type_constraints
    }
    assert sorted(s.attributes) == sorted(a.name for a in spec.attributes)
    for a in spec.attributes:
        assert s.attributes[a.name].required == (a.default is None), a.name


@pytest.mark.parametrize("name", sorted(SPECS))
def test_reference_signature_equals_the_description(name):
    spec = SPECS[name]
    assert _params(inspect.signature(REFERENCES[name])) == _params(spec.python_signature("call"))
    call = _params(spec.python_signature("call"))
    assert [n for n, kind, _ in call if kind == "KEYWORD_ONLY"] == [a.name for a in spec.arguments]
    with pytest.raises(TypeError, match="missing a required argument"):
        REFERENCES[name]()


@pytest.mark.parametrize("name", sorted(SPECS))
def test_torch_op_schema_equals_the_description(name):
    torch = pytest.importorskip("torch")
    import trtpipe.plugins.ops.torch_ops  # noqa: F401  (registers torch.ops.trtpipe.*)

    spec = SPECS[name]
    schema = getattr(torch.ops.trtpipe, spec.torch_name).default._schema
    assert str(schema) == f"trtpipe::{spec.torch_name}{spec.torch_schema()}".replace("=0.0", "=0.")
    positional = spec.python_signature("positional").parameters.values()
    assert [a.name for a in schema.arguments] == [p.name for p in positional]
    assert len(schema.returns) == len([t for t in spec.outputs if not t.optional])  # optional: lowered graphs only


@pytest.mark.parametrize("name", sorted(SPECS))
def test_exporter_translation_equals_the_description(name):
    pytest.importorskip("onnxscript")
    torch = pytest.importorskip("torch")
    from torch.onnx._internal.exporter import _schemas

    from trtpipe.plugins.ops.torch_ops import onnx_translation_table

    spec = SPECS[name]
    fn = onnx_translation_table()[getattr(torch.ops.trtpipe, spec.torch_name).default]
    assert _params(inspect.signature(fn)) == _params(spec.python_signature("positional"))
    sig = _schemas.op_signature_from_function(fn, "__traced", fn.__name__)  # what torch 2.13's exporter reads
    assert [p.name for p in sig.params] == [p for p in spec.python_signature("positional").parameters]
    assert len(sig.outputs) == len([t for t in spec.outputs if not t.optional])
    attrs = [p.name for p in sig.params if not hasattr(p, "type_constraint")]
    assert attrs == [a.name for a in spec.arguments]


def test_triton_launchers_equal_the_description():
    pytest.importorskip("triton")
    from trtpipe.plugins.ops.int4_gemm import triton_launch as int4_launch
    from trtpipe.plugins.ops.paged_attention import triton_launch as attention_launch

    for spec, fn, extra in (
        (PAGED_ATTENTION, attention_launch.paged_attention, ["max_query_len"]),
        (INT4_GEMM, int4_launch.int4_gemm, ["block_m", "block_n", "block_k", "input_precision"]),
    ):
        call = _params(spec.python_signature("call"))
        got = _params(inspect.signature(fn))
        assert got[: len(call)] == call and [p[0] for p in got[len(call) :]] == extra
    decode = _params(inspect.signature(attention_launch.paged_attention_decode))
    attrs = [p for p in _params(PAGED_ATTENTION.python_signature("call")) if p[1] == "KEYWORD_ONLY"]
    assert [p[0] for p in decode[5:7]] == ["key_scale", "value_scale"]  # an int8 pool's, default None
    assert decode[7:13] == attrs


def test_trt_plugin_signatures_equal_the_description():
    """The parameter lists the registration hands tensorrt.plugin (register, autotune, aot_impl),
    built from the plugin descriptions, over a stand-in module."""
    from trtpipe.plugins.ops.trt_registration import register_plugin

    class TensorDesc:
        pass

    seen: dict[str, inspect.Signature] = {}

    def deco(kind):
        def for_plugin(plugin_id):
            def record(fn):
                seen[f"{plugin_id}.{kind}"] = inspect.signature(fn)
                return fn

            return record

        return for_plugin

    trtp = type("trtp", (), {"TensorDesc": TensorDesc, "AutoTuneCombination": object, "KernelLaunchParams": object})
    trtp.SymExprs = object
    trtp.register, trtp.autotune, trtp.aot_impl = deco("register"), deco("autotune"), deco("aot_impl")
    for plugin in abi.PLUGINS.values():
        register_plugin(trtp, plugin, desc=lambda a: a, autotune=lambda a: a, aot_impl=lambda a: a)
        op = next(s for s in SPECS.values() if plugin in s.plugins)
        pid = f"trtpipe::{plugin.name}"
        reg = seen[f"{pid}.register"].parameters.values()
        assert [p.name for p in reg if p.annotation is TensorDesc] == list(plugin.inputs)
        assert all(t in [x.arg_name for x in op.inputs] for t in plugin.inputs)
        fields = [(p.name, p.annotation) for p in reg if p.annotation is not TensorDesc]
        assert fields == [(a.name, a.py_type) for a in plugin.attributes]
        assert [n for n, _ in fields] == list(abi.PLUGIN_ATTRIBUTES[plugin.name])
        assert all(a in op.attributes for a in plugin.attributes if a.name != "decode")
        aot = list(seen[f"{pid}.aot_impl"].parameters)
        assert aot == [*plugin.inputs, *plugin.attribute_names, "outputs", "tactic"]
        tune = list(seen[f"{pid}.autotune"].parameters)
        assert tune == [*plugin.inputs, *plugin.autotune_attributes, "outputs"]


def test_trt_wrapper_kernels_equal_the_description():
    """Triton reads a kernel's parameters from its source, so the plugins' wrapper kernels spell
    them out: (inputs, extras, outputs) as the plugin descriptions say, then the constexprs."""
    pytest.importorskip("triton")
    from trtpipe.plugins.ops.int4_gemm import trt_kernels as int4_kernels
    from trtpipe.plugins.ops.paged_attention import trt_kernels as attention_kernels
    from trtpipe.plugins.ops.trt_kernel_abi import wrapper_parameters

    for kernel, plugin, extras in (
        (attention_kernels.kv_write_plugin_kernel, attention_kernels.KV_WRITE, attention_kernels.KV_WRITE_EXTRAS),
        (
            attention_kernels.attention_decode_plugin_kernel,
            attention_kernels.ATTENTION,
            attention_kernels.DECODE_EXTRAS,
        ),
        (
            attention_kernels.attention_prefill_plugin_kernel,
            attention_kernels.ATTENTION,
            attention_kernels.PREFILL_EXTRAS,
        ),
        (int4_kernels.int4_gemm_plugin_kernel, int4_kernels.PLUGIN, int4_kernels.EXTRAS),
    ):
        runtime = [p.name for p in kernel.params if not p.is_constexpr]
        assert runtime == wrapper_parameters(plugin, extras), kernel.__name__


def test_aot_signatures_come_from_the_kernels():
    pytest.importorskip("triton")
    from trtpipe.plugins.triton import aot

    for name, (kernel, defaults) in aot.AOT_KERNELS.items():
        sig = aot.kernel_signature(kernel, "fp16")
        assert list(sig) == [p.name for p in kernel.params]
        assert sorted(k for k, v in sig.items() if v == "constexpr") == sorted(defaults), name
