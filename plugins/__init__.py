"""trtpipe.plugins: the custom ops of the ONNX domain ``trtpipe`` (version 1).

Each op has an ONNX schema (``schema``), a NumPy reference that defines its meaning
(``reference``), an ONNX Runtime lowering (``ort_lowering``), Triton kernels (``triton_kernels``)
and a TensorRT plugin registration (``trt_plugins``). This package imports nothing from
``trtpipe.pipeline`` or ``trtpipe.runtime``; heavy modules (torch, triton, tensorrt) are imported
lazily inside the modules that need them.
"""

OP_DOMAIN = "trtpipe"
OP_VERSION = 1
PLUGIN_VERSION = "1"
