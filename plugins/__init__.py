"""trtpipe.plugins: the custom ops of the ONNX domain ``trtpipe`` (version 1).

Each op has an ONNX schema (``schema``), a NumPy reference that defines its meaning
(``reference``; INT4 layout in ``int4_pack``, GGUF blocks in ``gguf_blocks``, RoPE tables in
``rope``), lowerings over one shared node walk (``graph_rewrite``): ONNX Runtime
(``ort_lowering``, with the standard-op attention of ``paged_attention_onnx``) and TensorRT
(``trt_lowering`` with plugins, ``trt_plugin_free``, the ``float_cast`` pass), Triton kernels
(``triton_kernels``, launched on torch tensors by ``triton_launchers``) and a TensorRT plugin
registration (``trt_plugins``). Facts with one home: ``dtypes`` (dtype table) and ``versions``
(versions, the TensorRT plugin floor, the plugin ABI hash). This package imports nothing from
``trtpipe.pipeline`` or ``trtpipe.runtime``; heavy modules (torch, triton, tensorrt) are imported
lazily inside the modules that need them.
"""

OP_DOMAIN = "trtpipe"
OP_VERSION = 1
PLUGIN_VERSION = "1"
