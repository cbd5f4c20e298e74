"""trtpipe.plugins: the custom ops of the ONNX domain ``trtpipe`` (version 1).

One folder per op under ``ops/`` (``ops/paged_attention/``, ``ops/int4_gemm/``), each built from
one description of the op's inputs and attributes (``ops/<op>/spec.py``, an
:class:`~trtpipe.plugins.ops.spec.OpSpec`): its ONNX shape inference (``schema``), the NumPy
reference that defines its meaning (``reference``), the torch op and the exporter's translation
(``torch_op``, ``onnx_script``), a lowering per backend (``lower_*``), Triton kernels and
launchers (``triton_kernels``, ``triton_launch``) and its TensorRT plugin (``trt_kernels``,
``trt_plugin``). At the ``ops/`` level: the description record (``spec``), the ops' ABI
(``abi``: schemas, the op and plugin ABI hashes) and what the ops' torch, exporter and TensorRT
sides share. Beside it: ``core/`` (errors, the dtype table, input checks, versions, RoPE),
``graph/`` (the node-rewrite walk, the float cast pass), ``lowering/`` (the graph walks that hand
each node to its op: ONNX Runtime, TensorRT with plugins, TensorRT plugin-free) and ``triton/``
(AOT compilation). Folders import one way: lowering/ and triton/ import ops/, ops/ imports graph/
and core/, graph/ imports core/.

This package imports nothing from ``trtpipe.pipeline`` or ``trtpipe.runtime``; heavy modules
(torch, triton, tensorrt, onnxscript) are imported only by the modules that need them, which
are imported lazily.
"""

OP_DOMAIN = "trtpipe"
OP_VERSION = 1
PLUGIN_VERSION = "1"
